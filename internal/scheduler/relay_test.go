package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// startRelayLoop runs a relay's loop whose rounds only report on the
// returned channel.
func startRelayLoop(t *testing.T, linger time.Duration) (r *relay, wake, soon chan struct{}, rounds chan time.Time) {
	t.Helper()
	wake, soon = make(chan struct{}, 1), make(chan struct{}, 1)
	rounds = make(chan time.Time, 16)
	r = &relay{poll: time.Hour, wake: wake, soon: soon, linger: linger, metrics: newMetrics(prometheus.NewRegistry()),
		drain: func(context.Context) bool {
			rounds <- time.Now()
			return false
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	round(t, rounds) // the first look, at start
	return r, wake, soon, rounds
}

func round(t *testing.T, rounds <-chan time.Time) time.Time {
	t.Helper()
	select {
	case at := <-rounds:
		return at
	case <-time.After(10 * time.Second):
		t.Fatal("no relay round")
		return time.Time{}
	}
}

// A claim's events wait up to the linger for the reply's, and go in one
// round with them; a nudge of a reply or the supervisor relays at once.
func TestRelayLingersForAClaimsEvents(t *testing.T) {
	t.Parallel()
	const linger = 80 * time.Millisecond
	r, _, soon, rounds := startRelayLoop(t, linger)
	sent := time.Now()
	soon <- struct{}{}
	soon <- struct{}{} // a second claim within the linger waits with the first
	if waited := round(t, rounds).Sub(sent); waited < linger {
		t.Fatalf("a claim's events relayed after %v, want the linger of %v", waited, linger)
	}
	if n := testutil.ToFloat64(r.metrics.wakeups.WithLabelValues("relay", "claim")); n != 1 {
		t.Fatalf("%v rounds at the end of a linger, want 1", n)
	}

	// A reply's nudge during a linger relays at once, the waiting events
	// with it, and ends the linger.
	r2, wake, soon2, rounds2 := startRelayLoop(t, time.Hour)
	soon2 <- struct{}{}
	wake <- struct{}{}
	round(t, rounds2)
	if n := testutil.ToFloat64(r2.metrics.wakeups.WithLabelValues("relay", "notify")); n != 1 {
		t.Fatalf("%v rounds on a nudge, want 1", n)
	}
	// The loop takes the next nudge: the ended linger holds nothing up.
	wake <- struct{}{}
	round(t, rounds2)
	if n := testutil.ToFloat64(r2.metrics.wakeups.WithLabelValues("relay", "claim")); n != 0 {
		t.Fatalf("%v rounds at the end of a linger that a nudge ended, want 0", n)
	}
}
