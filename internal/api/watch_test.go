package api

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// The API's status queue is bound only while a request here follows an
// order (and for the linger after the last): with nobody following, the
// status exchange routes nothing to this API, so progress events nobody
// hears stop being written; a follower waits until the queue is bound
// (and the store told that every status is heard again), then gets its
// order's events. Step events are bound, and heard, likewise only while a
// request follows an order's steps, and go only to such followers.
func TestHubBindsOnlyWhileFollowed(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: 10}
	testenv.Broker(t, topo)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := broker.Open(ctx, testenv.AMQPURL(), "api-hub-test", topo, logger, broker.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	var heard, heardSteps atomic.Int32
	h := newHub(logger, topo.StatusExchange(), func(context.Context) error { heard.Add(1); return nil }, func(context.Context) error { heardSteps.Add(1); return nil })
	h.linger = 200 * time.Millisecond
	var wg sync.WaitGroup
	wg.Go(func() { h.run(ctx, conn) })
	defer func() {
		cancel()
		wg.Wait()
		conn.Close()
	}()

	// routed publishes an event for id, mandatory and confirmed, and says
	// whether the exchange routed it anywhere (the broker returns an
	// unroutable one before it confirms it).
	ac, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 16))
	publish := func(key, typ string, m messages.Message) bool {
		t.Helper()
		body, err := messages.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topo.StatusExchange(), key, true, false,
			amqp.Publishing{ContentType: messages.ContentType, Type: typ, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
		select {
		case <-returns:
			return false
		default:
			return true
		}
	}
	routed := func(id string) bool {
		t.Helper()
		return publish("completed", messages.TypeStatusEvent, messages.StatusEvent{SchemaVersion: messages.SchemaVersion, OrderID: id,
			Status: messages.StatusCompleted, At: time.Now()})
	}
	stepRouted := func(id string) bool {
		t.Helper()
		return publish("step.awaiting", messages.TypeStepEvent, messages.StepEvent{SchemaVersion: messages.SchemaVersion, OrderID: id,
			Step: 2, Name: "approval", Kind: "action", Event: messages.StepAwaiting, State: "awaiting", Wait: "approved", At: time.Now()})
	}

	id := messages.NewID()
	if routed(id) || heard.Load() != 0 {
		t.Fatalf("with nobody following, an event was routed to the API (heard %d)", heard.Load())
	}
	f, stop, ready := h.follow(id, false)
	if err := await(ctx, ready, 10*time.Second); err != nil {
		t.Fatalf("the follower's wait for the binding: %v", err)
	}
	if heard.Load() != 1 {
		t.Fatalf("the store was told %d times that every status is heard, want once", heard.Load())
	}
	if !routed(id) {
		t.Fatal("with a follower, an event was not routed to the API")
	}
	select {
	case ev := <-f.events:
		if ev.OrderID != id || ev.Status != messages.StatusCompleted {
			t.Fatalf("the follower got %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower got no event")
	}
	// A second follower of another order finds it bound already.
	_, stop2, ready2 := h.follow(messages.NewID(), false)
	select {
	case <-ready2[0]:
	default:
		t.Fatal("a second follower waits for a binding that is there")
	}
	stop2()
	// Step events are routed here only while someone follows steps.
	if stepRouted(id) || heardSteps.Load() != 0 {
		t.Fatalf("with nobody following steps, a step event was routed to the API (heard %d)", heardSteps.Load())
	}
	fs, stopSteps, readySteps := h.follow(id, true)
	if err := await(ctx, readySteps, 10*time.Second); err != nil || heardSteps.Load() != 1 {
		t.Fatalf("the steps follower's wait for the binding: %v (heard %d)", err, heardSteps.Load())
	}
	if !stepRouted(id) {
		t.Fatal("with a steps follower, a step event was not routed to the API")
	}
	select {
	case ev := <-fs.steps:
		if ev.OrderID != id || ev.Event != messages.StepAwaiting || ev.Wait != "approved" {
			t.Fatalf("the steps follower got %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the steps follower got no step event")
	}
	if f.steps != nil {
		t.Fatal("a follower of statuses only has a channel of step events")
	}
	stopSteps()
	testenv.Eventually(t, 10*time.Second, "the steps binding to go once nobody follows steps", func() bool { return !stepRouted(id) })
	if !routed(id) {
		t.Fatal("the status binding went with the steps binding while a follower of statuses remains")
	}
	select {
	case <-f.events:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower of statuses got no event once the steps binding went")
	}
	stop()
	testenv.Eventually(t, 10*time.Second, "the binding to go once nobody follows", func() bool { return !routed(id) })
	// Following again binds again.
	_, stop3, ready3 := h.follow(id, false)
	defer stop3()
	if err := await(ctx, ready3, 10*time.Second); err != nil || !routed(id) || heard.Load() != 2 {
		t.Fatalf("following again: %v, heard %d", err, heard.Load())
	}
}
