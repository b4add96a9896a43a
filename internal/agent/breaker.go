package agent

import (
	"sync"
	"time"
)

// Circuit states, as the sas_agent_circuit_state gauge reports them.
const (
	circuitClosed   = 0
	circuitHalfOpen = 1
	circuitOpen     = 2
)

// breaker is a circuit breaker for one remote endpoint. Closed, it lets
// every call through and counts consecutive failures; at threshold it
// opens and refuses calls for openFor; then it lets one probe through
// (half-open): a success closes it, a failure opens it again.
type breaker struct {
	threshold int
	openFor   time.Duration
	now       func() time.Time
	onChange  func(state int)

	mu       sync.Mutex
	state    int
	failures int
	openedAt time.Time
	probing  bool
}

func newBreaker(threshold int, openFor time.Duration, now func() time.Time, onChange func(int)) *breaker {
	b := &breaker{threshold: max(threshold, 1), openFor: openFor, now: now, onChange: onChange}
	onChange(circuitClosed)
	return b
}

// allow reports whether a call may go out now. Every allowed call must be
// followed by record.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case circuitClosed:
		return true
	case circuitOpen:
		if b.now().Sub(b.openedAt) < b.openFor {
			return false
		}
		b.set(circuitHalfOpen)
		fallthrough
	default: // half-open: one probe at a time
		if b.probing {
			return false
		}
		b.probing = true
		return true
	}
}

// record reports an allowed call's outcome: ok means the endpoint is
// healthy (it answered, even with a permanent refusal).
func (b *breaker) record(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	wasProbe := b.state == circuitHalfOpen
	if wasProbe {
		b.probing = false
	}
	switch {
	case ok:
		b.failures = 0
		if b.state != circuitClosed {
			b.set(circuitClosed)
		}
	case wasProbe:
		b.openedAt = b.now()
		b.set(circuitOpen)
	default:
		b.failures++
		if b.state == circuitClosed && b.failures >= b.threshold {
			b.openedAt = b.now()
			b.set(circuitOpen)
		}
	}
}

func (b *breaker) set(state int) {
	b.state = state
	b.onChange(state)
}
