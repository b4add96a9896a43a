package scheduler

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// roundsStore is an outboxStore that records when each relay round came
// and says it relayed the number of messages given for that round.
type roundsStore struct {
	mu     sync.Mutex
	rounds []time.Time
	work   map[int]int // round index: messages relayed
	// forgotten is each ForgetPublished's ids; more what it answers.
	forgotten [][]int64
	more      bool
}

func (s *roundsStore) ForgetPublished(_ context.Context, ids []int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgotten = append(s.forgotten, ids)
	return s.more, nil
}

func (s *roundsStore) state() (rounds int, forgotten []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ids := range s.forgotten {
		forgotten = append(forgotten, ids...)
	}
	return len(s.rounds), forgotten
}

func (s *roundsStore) RelayOutboxHeard(context.Context, int, time.Duration,
	func(context.Context, []statestore.OutboxMessage) (int, []string, error)) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.work[len(s.rounds)]
	s.rounds = append(s.rounds, time.Now())
	return n, nil
}

// running runs r until the returned stop is called, which waits for it.
func running(t *testing.T, r *relay) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
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
	defer running(t, r)()
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

// heldEvent is an order's completed event as a reply holds it.
func heldEvent(id int64) statestore.OutboxMessage {
	order := messages.NewID()
	return statestore.OutboxMessage{ID: id, MessageID: messages.NewID(), Type: statestore.OutboxStatusEvent, OrderID: order,
		Body: []byte(`{"schema_version":1,"order_id":"` + order + `","status":"completed","at":"2026-12-01T10:00:00Z"}`)}
}

// statusListener is a queue bound to topo's status exchange for completed
// events, and its deliveries; it goes when the test ends.
func statusListener(t *testing.T, topo broker.Topology) <-chan amqp.Delivery {
	t.Helper()
	ac, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ac.Close() })
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		err = ch.QueueBind(q.Name, messages.StatusCompleted, topo.StatusExchange(), false, nil)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(q.Name, "", true, true, false, false, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return deliveries
}

// relayOnABroker is a relay over store that publishes to a broker
// topology of the test's own, its held events under a context that ends
// with the test, and a queue bound for completed events.
func relayOnABroker(t *testing.T, store outboxStore, handers <-chan struct{}) (*relay, <-chan amqp.Delivery) {
	t.Helper()
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: 10}
	testenv.Broker(t, topo)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	conn, err := broker.Open(ctx, testenv.AMQPURL(), "relay-test", topo, logger, broker.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := &relay{store: store, pub: broker.NewPublisher(conn, broker.NewMetrics(prometheus.NewRegistry())), topo: topo, batch: 100,
		poll: time.Hour, wake: make(chan struct{}, 1), held: make(chan statestore.OutboxMessage, heldQueue), handersDone: handers, work: ctx,
		logger: logger, metrics: newMetrics(prometheus.NewRegistry()), tr: tracing.Off()}
	return r, statusListener(t, topo)
}

// Status events a reply held for this scheduler are published by its
// relay and then forgotten, with no relay round of their own (no read of
// the outbox); a round follows only when forgetting them says messages
// waited behind them.
func TestHeldEventsArePublishedWithoutARound(t *testing.T) {
	t.Parallel()
	store := &roundsStore{work: map[int]int{}}
	r, deliveries := relayOnABroker(t, store, nil)
	ctx := r.work
	defer running(t, r)()
	testenv.Eventually(t, 10*time.Second, "the relay's first look", func() bool { n, _ := store.state(); return n == 1 })

	heard := func(want statestore.OutboxMessage) {
		t.Helper()
		select {
		case d := <-deliveries:
			if d.MessageId != want.MessageID || string(d.Body) != string(want.Body) {
				t.Fatalf("delivered %s %s, want %s %s", d.MessageId, d.Body, want.MessageID, want.Body)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("held event %d never published", want.ID)
		}
	}
	first, second := heldEvent(7), heldEvent(8)
	if !r.hand(ctx, first) || !r.hand(ctx, second) {
		t.Fatal("the relay took no held event")
	}
	heard(first)
	heard(second)
	testenv.Eventually(t, 10*time.Second, "both events forgotten", func() bool { _, f := store.state(); return len(f) == 2 })
	if rounds, forgotten := store.state(); rounds != 1 || forgotten[0] != 7 || forgotten[1] != 8 {
		t.Fatalf("after publishing held events: %d relay rounds, forgotten %v; want still 1 round, 7 and 8 forgotten", rounds, forgotten)
	}

	// Messages waited behind a held event: a round follows its forget.
	store.mu.Lock()
	store.more = true
	store.mu.Unlock()
	third := heldEvent(9)
	r.hand(ctx, third)
	heard(third)
	testenv.Eventually(t, 10*time.Second, "a relay round after a forget that found more", func() bool { n, _ := store.state(); return n == 2 })
}

// A relay told to stop publishes the events the replies still in hand
// hand it, until they are done, and relays what waited behind them; it
// leaves none to wait out its hold for another scheduler's relay.
func TestAStoppingRelayPublishesTheEndsStillHanded(t *testing.T) {
	t.Parallel()
	store := &roundsStore{work: map[int]int{}, more: true}
	handers := make(chan struct{})
	r, deliveries := relayOnABroker(t, store, handers)
	ctx := r.work
	// Told to stop before it began: it looks at no outbox, and waits for
	// what the replies in hand hand it.
	relayCtx, stopRelay := context.WithCancel(ctx)
	stopRelay()
	done := make(chan error, 1)
	go func() { done <- r.run(relayCtx) }()
	for i, late := range []statestore.OutboxMessage{heldEvent(11), heldEvent(12)} {
		if !r.hand(ctx, late) {
			t.Fatal("the stopping relay took no held event")
		}
		select {
		case d := <-deliveries:
			if d.MessageId != late.MessageID {
				t.Fatalf("delivered %s, want %s", d.MessageId, late.MessageID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d handed to a stopping relay was not published", late.ID)
		}
		testenv.Eventually(t, 10*time.Second, "the event forgotten", func() bool { _, f := store.state(); return len(f) == i+1 })
	}
	close(handers)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relay did not stop once its handers were done")
	}
	if rounds, forgotten := store.state(); len(forgotten) != 2 || forgotten[0] != 11 || forgotten[1] != 12 || rounds != 1 {
		t.Fatalf("after stopping: %d relay rounds, forgotten %v; want 11 and 12 forgotten and one round for what waited behind them", rounds, forgotten)
	}
}
