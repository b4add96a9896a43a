package broker

import (
	"time"
)

// acknowledger is the part of an AMQP channel the acker uses (an
// *amqp.Channel in production).
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// settlement is a worker's verdict on one delivery.
type settlement struct {
	tag     uint64
	requeue bool // nack with requeue; otherwise ack
}

// An ack waits for more to group with until ackLinger has passed since the
// frame before it, unless half the prefetch window is waiting; an ack
// behind a delivery still in a worker's hands waits up to ackHold for it
// to be settled.
const (
	ackLinger = 2 * time.Millisecond
	ackHold   = 5 * time.Millisecond
)

// acker sends a subscription's acks, grouped: every settled delivery up to
// the first one still in a worker's hands is acknowledged by one frame
// (basic.ack with multiple set). For RabbitMQ a grouped ack is one
// settlement of the quorum queue's log instead of one per message; a
// measured consume-and-ack cost about 65 µs of broker CPU per message
// acknowledged one by one and about 30 µs in groups of 16
// (docs/BENCHMARKS.md).
//
// Acks are sent once ackLinger has passed since the last frame, or when
// half the prefetch window waits: under load a frame every ackLinger
// covers what settled meanwhile, and an ack that comes alone, longer than
// ackLinger after the frame before it, goes at once. A linger at low load
// would group nothing (the next delivery is further off than that) and
// cost the process a wake-up of its own for every ack.
//
// An ack behind a delivery that is still being handled waits at most
// ackHold, then goes alone: a slow handler never holds back the others'
// acks, which would fill the prefetch window and stop the deliveries. A
// nack goes at once, alone. A multiple ack never covers a delivery that is
// not yet settled, and its tag is always one not yet acknowledged.
type acker struct {
	ch    acknowledger
	group int    // this many waiting acks are sent without lingering
	next  uint64 // the lowest tag not yet passed by the grouped acks
	// Settled tags at or above next: when the ack arrived for an ack not
	// yet sent, the zero time for a delivery already settled alone.
	held map[uint64]time.Time
	// sentAt is when the last frame went (the zero time before any).
	sentAt time.Time
	now    func() time.Time
	frame  func()      // counts every frame sent
	fail   func(error) // reports a failed send (the channel is gone)
	wake   <-chan time.Time
	timer  *time.Timer
}

func newAcker(ch acknowledger, prefetch int, frame func(), fail func(error)) *acker {
	return &acker{ch: ch, group: max(prefetch/2, 1), next: 1, held: map[uint64]time.Time{},
		now: time.Now, frame: frame, fail: fail}
}

// run settles what arrives on in until it is closed, then sends every
// ack it still holds.
func (a *acker) run(in <-chan settlement) {
	defer func() {
		if a.timer != nil {
			a.timer.Stop()
		}
	}()
	for {
		select {
		case s, ok := <-in:
			// Take whatever else is ready too, so that one frame covers it.
			if !ok || !a.takeReady(s, in) {
				a.flush(true)
				return
			}
		case <-a.wake:
		}
		a.flush(false)
	}
}

// takeReady adds s and every settlement already waiting on in; false
// when in is closed.
func (a *acker) takeReady(s settlement, in <-chan settlement) bool {
	a.add(s)
	for {
		select {
		case s, ok := <-in:
			if !ok {
				return false
			}
			a.add(s)
		default:
			return true
		}
	}
}

func (a *acker) add(s settlement) {
	if s.requeue {
		a.send(func() error { return a.ch.Nack(s.tag, false, true) })
		a.held[s.tag] = time.Time{}
		return
	}
	a.held[s.tag] = a.now()
}

// flush, once ackLinger has passed since the last frame or enough acks
// are waiting (or when final), acknowledges the settled run from next with
// one frame and sends alone every ack that has waited ackHold (all of
// them when final); then it arms the timer for the next one due.
func (a *acker) flush(final bool) {
	now := a.now()
	waiting := 0
	for _, at := range a.held {
		if !at.IsZero() {
			waiting++
		}
	}
	if since := now.Sub(a.sentAt); !final && waiting > 0 && waiting < a.group && since < ackLinger {
		a.arm(ackLinger - since)
		return
	}
	var last uint64
	for {
		at, ok := a.held[a.next]
		if !ok {
			break
		}
		if !at.IsZero() {
			last = a.next
		}
		delete(a.held, a.next)
		a.next++
	}
	if last != 0 {
		a.send(func() error { return a.ch.Ack(last, true) })
	}
	var due time.Time
	for tag, at := range a.held {
		if at.IsZero() {
			continue
		}
		if final || now.Sub(at) >= ackHold {
			a.send(func() error { return a.ch.Ack(tag, false) })
			a.held[tag] = time.Time{}
			continue
		}
		if due.IsZero() || at.Before(due) {
			due = at
		}
	}
	a.wake = nil
	if !due.IsZero() {
		a.arm(ackHold - now.Sub(due))
	}
}

// arm makes run wake after wait.
func (a *acker) arm(wait time.Duration) {
	if a.timer == nil {
		a.timer = time.NewTimer(wait)
	} else {
		a.timer.Reset(wait)
	}
	a.wake = a.timer.C
}

func (a *acker) send(f func() error) {
	a.frame()
	a.sentAt = a.now()
	if err := f(); err != nil {
		a.fail(err)
	}
}
