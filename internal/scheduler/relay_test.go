package scheduler

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// roundsStore is an outboxStore that records when each relay round came
// and says it relayed the number of messages given for that round.
type roundsStore struct {
	mu     sync.Mutex
	rounds []time.Time
	work   map[int]int // round index: messages relayed
}

func (s *roundsStore) RelayOutboxHeard(context.Context, int, time.Duration,
	func(context.Context, []statestore.OutboxMessage) (int, []string, error)) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.work[len(s.rounds)]
	s.rounds = append(s.rounds, time.Now())
	return n, nil
}

func (s *roundsStore) gaps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(s.rounds); i++ {
		g = append(g, s.rounds[i].Sub(s.rounds[i-1]))
	}
	return g
}

// A relay that keeps finding the outbox empty looks less and less often,
// up to relayIdleLongest poll intervals apart; a nudge brings a round at
// once, and finding work brings the wait back to one interval.
func TestRelayAtRestLooksLessOften(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	store := &roundsStore{work: map[int]int{7: 3}}
	wake := make(chan struct{}, 1)
	r := &relay{store: store, batch: 100, poll: poll, wake: wake, logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics: newMetrics(prometheus.NewRegistry())}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Rounds 0-6 find nothing: the waits grow to the longest.
	testenv.Eventually(t, 30*time.Second, "seven empty rounds", func() bool { return len(store.gaps()) >= 6 })
	g := store.gaps()
	if g[5] < (relayIdleLongest-1)*poll {
		t.Fatalf("the relay at rest still looks every %v (waits %v), want up to %v apart", g[5], g[:6], relayIdleLongest*poll)
	}
	// Round 7 finds work: the next wait is one interval again.
	testenv.Eventually(t, 30*time.Second, "a round after the one that found work", func() bool { return len(store.gaps()) >= 8 })
	if g := store.gaps(); g[7] >= relayIdleLongest*poll/2 {
		t.Fatalf("after a round that found work the relay waited %v, want about %v", g[7], poll)
	}
	// A nudge brings a round at once, however long the wait.
	testenv.Eventually(t, 30*time.Second, "the waits to grow again", func() bool {
		g := store.gaps()
		return g[len(g)-1] >= (relayIdleLongest-1)*poll
	})
	before := len(store.gaps())
	start := time.Now()
	wake <- struct{}{}
	testenv.Eventually(t, 30*time.Second, "a round after the nudge", func() bool { return len(store.gaps()) > before })
	if took := time.Since(start); took >= relayIdleLongest*poll/2 {
		t.Fatalf("the nudged round came %v after the nudge, want at once", took)
	}
}

// TestStepEventsGoToTheStatusExchangeByEvent: a step event is published
// on the status exchange under step.EVENT, and counts as a progress
// event ("step"): returned, it is not written for a while; a status
// event keeps its one-word key, and also goes to its order's reply_to.
func TestStepEventsGoToTheStatusExchangeByEvent(t *testing.T) {
	t.Parallel()
	r := &relay{topo: broker.Topology{Prefix: "t."}}
	step := `{"schema_version":1,"order_id":"0b0e1c5e-2c59-4a3e-9d4c-6f2b8f1b2a10","step":2,"name":"approval","kind":"action",` +
		`"event":"awaiting","state":"awaiting","attempt":1,"wait":"approved","at":"2026-11-27T10:00:00Z"}`
	ts, err := r.targets(statestore.OutboxMessage{Type: statestore.OutboxStepEvent, ReplyTo: "shop.status", Body: []byte(step)})
	if err != nil || len(ts) != 1 || ts[0].exchange != "t.status" || ts[0].key != "step.awaiting" || ts[0].progress != "step" ||
		ts[0].msgType != messages.TypeStepEvent {
		t.Fatalf("a step event's targets: %+v %v", ts, err)
	}
	status := `{"schema_version":1,"order_id":"0b0e1c5e-2c59-4a3e-9d4c-6f2b8f1b2a10","status":"processing","step":1,"at":"2026-11-27T10:00:00Z"}`
	ts, err = r.targets(statestore.OutboxMessage{Type: statestore.OutboxStatusEvent, ReplyTo: "shop.status", Body: []byte(status)})
	if err != nil || len(ts) != 2 || ts[0].key != "processing" || ts[1].key != "shop.status" {
		t.Fatalf("a status event's targets: %+v %v", ts, err)
	}
	if _, err := r.targets(statestore.OutboxMessage{Type: statestore.OutboxStepEvent, Body: []byte(`{"schema_version":1}`)}); err == nil {
		t.Fatal("a step event that does not decode was given targets")
	}
}
