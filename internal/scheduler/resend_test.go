package scheduler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/harness/testenv"
)

// sentSteps is a sentStore that releases what it is told to, once failing.
type sentSteps struct {
	mu     sync.Mutex
	actors []string
	n      []int
	fail   bool
}

func (s *sentSteps) ReleaseSent(_ context.Context, actor, _ string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		s.fail = false
		return 0, errors.New("the database went away")
	}
	s.actors = append(s.actors, actor)
	n := s.n[0]
	s.n = s.n[1:]
	return n, nil
}

func (s *sentSteps) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.actors...)
}

// TestAReconnectPutsBackTheStepsSent: each time the broker connection
// comes back, the resender releases the steps this scheduler sent (a
// failure of the store is tried again) and wakes the claimer when it
// released any; it ends with its context.
func TestAReconnectPutsBackTheStepsSent(t *testing.T) {
	store := &sentSteps{n: []int{3, 0}, fail: true}
	restored := make(chan struct{}, 1)
	woken := make(chan struct{}, 4)
	m := newMetrics(prometheus.NewRegistry())
	r := &resender{store: store, me: "s1", restored: restored, wakeClaimer: func() { woken <- struct{}{} },
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: m}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()

	restored <- struct{}{}
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the claimer was not woken after 3 steps were put back")
	}
	if got := testutil.ToFloat64(m.resent); got != 3 {
		t.Fatalf("resent %v, want 3", got)
	}
	restored <- struct{}{}
	testenv.Eventually(t, 10*time.Second, "the second release", func() bool { return len(store.calls()) == 2 })
	if c := store.calls(); c[0] != "s1" || c[1] != "s1" {
		t.Fatalf("released for %v, want this scheduler's own", c)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(woken) != 0 {
		t.Fatal("the claimer was woken for a release of nothing")
	}
}
