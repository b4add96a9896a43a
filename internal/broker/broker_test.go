package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
)

type bundle struct {
	topo    broker.Topology
	reg     *prometheus.Registry
	metrics *broker.Metrics
	logger  *slog.Logger
}

func setup(t testing.TB, deliveryLimit int) bundle {
	t.Helper()
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: deliveryLimit, Inputs: []string{"in"}}
	testenv.Broker(t, topo)
	reg := prometheus.NewRegistry()
	return bundle{topo: topo, reg: reg, metrics: broker.NewMetrics(reg), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (b bundle) open(t testing.TB, url string) *broker.Conn {
	t.Helper()
	conn, err := broker.Open(ctxFor(t, 30*time.Second), url, t.Name(), b.topo, b.logger, b.metrics)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// gauge reads a metric's value from the registry (summing its series).
func (b bundle) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func rawChannel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func msg(id string) amqp.Publishing {
	p := amqp.Publishing{ContentType: "text/plain", MessageId: id, Body: []byte(id)}
	if strings.HasPrefix(id, "reject") {
		// A publisher's own namespace header: sas's dead letter must not
		// keep it (only the namespace sas found).
		p.Headers = amqp.Table{broker.HeaderNamespace: "forged"}
	}
	return p
}

// publishRetrying publishes until the broker confirms, as a caller riding
// out a connection loss would.
func publishRetrying(t *testing.T, pub *broker.Publisher, queue, id string) {
	t.Helper()
	ctx := ctxFor(t, 60*time.Second)
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := pub.Publish(attempt, "", queue, msg(id))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
}

func TestDeclareIsIdempotentAndRejectsClashes(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	b.open(t, testenv.AMQPURL())
	b.open(t, testenv.AMQPURL()) // declares again: nothing changes
	ch := rawChannel(t)
	for _, q := range []string{b.topo.Queue("in"), b.topo.DeadLetterQueue("in")} {
		if _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			t.Fatalf("queue %s missing: %v", q, err)
		}
	}
	// The queue is a quorum queue with the delivery limit: redeclaring it
	// as a classic queue or with another limit is refused.
	other := b.topo
	other.DeliveryLimit = 7
	_, err := broker.Open(ctxFor(t, 30*time.Second), testenv.AMQPURL(), "clash", other, b.logger, broker.NewMetrics(nil))
	if err == nil || !strings.Contains(err.Error(), "x-delivery-limit") {
		t.Fatalf("open with another delivery limit: %v, want a clear clash error", err)
	}
}

func TestPublishReportsReturnsPerMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	ctx := ctxFor(t, 60*time.Second)
	missing := b.topo.Prefix + "no-such-queue"
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for i := range 400 {
		wg.Go(func() {
			queue := b.topo.Queue("in")
			if i%2 == 1 {
				queue = missing
			}
			err := pub.Publish(ctx, "", queue, msg(fmt.Sprint("m-", i)))
			if (i%2 == 1) != errors.Is(err, broker.ErrReturned) || (i%2 == 0 && err != nil) {
				wrong.Add(1)
				t.Errorf("message %d to %s: %v", i, queue, err)
			}
		})
	}
	wg.Wait()
	if wrong.Load() > 0 {
		t.Fatalf("%d publishes got the other message's outcome", wrong.Load())
	}
	q, err := rawChannel(t).QueueDeclarePassive(b.topo.Queue("in"), true, false, false, false, nil)
	if err != nil || q.Messages != 200 {
		t.Fatalf("queue holds %d messages (%v), want 200", q.Messages, err)
	}
	if err := pub.Publish(ctx, "", b.topo.Queue("in"), amqp.Publishing{Body: []byte("x")}); err == nil {
		t.Fatal("a message without an id was published")
	}
}

func TestConsumerAcksRequeuesAndDeadLetters(t *testing.T) {
	t.Parallel()
	const limit = 2
	b := setup(t, limit)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	var mu sync.Mutex
	seen := map[string]int{}
	handler := func(ctx context.Context, d broker.Message) error {
		mu.Lock()
		seen[d.ID]++
		n := seen[d.ID]
		mu.Unlock()
		switch d.ID {
		case "retry-once":
			if n == 1 {
				return errors.New("transient")
			}
		case "reject":
			return broker.Reject("bad_thing", "it was bad")
		case "reject-in-team-a":
			return broker.InNamespace(broker.Reject("bad_thing", "it was bad"), "team-a")
		case "poison":
			return errors.New("always fails")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 4, Workers: 2}, handler, b.logger, b.metrics)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	for _, id := range []string{"ok", "retry-once", "reject", "reject-in-team-a", "poison"} {
		publishRetrying(t, pub, b.topo.Queue("in"), id)
	}

	ch := rawChannel(t)
	dead := map[string]amqp.Delivery{}
	testenv.Eventually(t, 30*time.Second, "the rejects and poison in the dead-letter queue", func() bool {
		d, ok, err := ch.Get(b.topo.DeadLetterQueue("in"), true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			dead[d.MessageId] = d
		}
		return len(dead) == 3
	})
	if r := dead["reject"]; r.Headers[broker.HeaderErrorReason] != "bad_thing" || r.Headers[broker.HeaderErrorDetail] != "it was bad" ||
		r.Headers[broker.HeaderOriginalQueue] != b.topo.Queue("in") || string(r.Body) != "reject" {
		t.Fatalf("rejected message dead-lettered as %+v", r)
	}
	if ns, has := dead["reject"].Headers[broker.HeaderNamespace]; has {
		t.Fatalf("a rejection of no namespace kept its publisher's %s %v", broker.HeaderNamespace, ns)
	}
	if ns := dead["reject-in-team-a"].Headers[broker.HeaderNamespace]; ns != "team-a" {
		t.Fatalf("a rejection in team-a dead-lettered with %s %v", broker.HeaderNamespace, ns)
	}
	// The poison message was requeued until the broker's delivery limit
	// dead-lettered it.
	if reason := dead["poison"].Headers["x-first-death-reason"]; reason != "delivery_limit" {
		t.Fatalf("poison message dead-lettered with %v, want the broker's delivery_limit", dead["poison"].Headers)
	}
	mu.Lock()
	got := fmt.Sprint(seen["ok"], seen["retry-once"], seen["reject"], seen["poison"] > limit)
	mu.Unlock()
	if got != "1 2 1 true" {
		t.Fatalf("deliveries ok, retry-once, reject, poison>limit = %s; want 1 2 1 true", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	q, err := ch.QueueDeclarePassive(b.topo.Queue("in"), true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("input left with %d messages (%v)", q.Messages, err)
	}
}

func TestConsumerHonoursPrefetch(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	for i := range 10 {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	release := make(chan struct{})
	var inFlight, handled atomic.Int64
	handler := func(ctx context.Context, d broker.Message) error {
		inFlight.Add(1)
		<-release
		inFlight.Add(-1)
		handled.Add(1)
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	defer cancel()
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 2, Workers: 8}, handler, b.logger, b.metrics)
	go func() { _ = consumer.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, "two deliveries in hand", func() bool { return inFlight.Load() == 2 })
	ch := rawChannel(t)
	testenv.Eventually(t, 10*time.Second, "eight messages still ready on the broker", func() bool {
		q, err := ch.QueueDeclarePassive(b.topo.Queue("in"), true, false, false, false, nil)
		return err == nil && q.Messages == 8
	})
	if n := inFlight.Load(); n != 2 {
		t.Fatalf("%d deliveries in hand with prefetch 2", n)
	}
	close(release)
	testenv.Eventually(t, 30*time.Second, "all ten handled", func() bool { return handled.Load() == 10 })
}

// TestConsumerGroupsAcks: deliveries handled together are acknowledged
// by few frames, and a handler that takes long holds back no other
// delivery's ack (with the prefetch window full of held acks the
// consumer would stop).
func TestConsumerGroupsAcks(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	release := make(chan struct{})
	var handled atomic.Int64
	handler := func(ctx context.Context, d broker.Message) error {
		if d.ID == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		handled.Add(1)
		return nil
	}
	// A backlog, as under load.
	const n = 400
	for i := range n {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 16, Workers: 8}, handler, b.logger, b.metrics)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, "every delivery handled", func() bool { return handled.Load() == n })
	testenv.Eventually(t, 10*time.Second, "every delivery acknowledged", func() bool {
		return b.metric(t, "sas_broker_consumed_total") == n
	})
	frames := b.metric(t, "sas_broker_ack_frames_total")
	if frames < 1 || frames > n/2 {
		t.Fatalf("%v ack frames for %d deliveries, want them grouped", frames, n)
	}
	t.Logf("%v ack frames for %d deliveries", frames, n)

	// One slow delivery, then more than the prefetch window of others.
	publishRetrying(t, pub, b.topo.Queue("in"), "slow")
	for i := range 50 {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint("after-", i))
	}
	testenv.Eventually(t, 30*time.Second, "the others handled while the slow one is in hand", func() bool {
		return handled.Load() == n+50
	})
	close(release)
	ch := rawChannel(t)
	testenv.Eventually(t, 30*time.Second, "the queue empty, nothing unacknowledged", func() bool {
		q, err := ch.QueueDeclarePassive(b.topo.Queue("in"), true, false, false, false, nil)
		return err == nil && q.Messages == 0 && handled.Load() == n+51
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
}

// TestRecoversFromConnectionLossAndOutage cuts the connection, then takes
// the broker away for a while and brings it back (with a queue deleted in
// the meantime): publishing and consuming resume on their own, the topology
// is declared again, and every confirmed message is consumed.
func TestRecoversFromConnectionLossAndOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	url, proxy := testenv.Proxied(t, testenv.AMQPURL())
	conn := b.open(t, url)
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	var mu sync.Mutex
	consumed := map[string]bool{}
	handler := func(ctx context.Context, d broker.Message) error {
		mu.Lock()
		consumed[d.ID] = true
		mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 2*time.Minute))
	defer cancel()
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 10, Workers: 2}, handler, b.logger, b.metrics)
	go func() { _ = consumer.Run(ctx) }()
	allConsumed := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for i := range n {
				if !consumed[fmt.Sprint(i)] {
					return false
				}
			}
			return true
		}
	}

	for i := range 50 {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	testenv.Eventually(t, 30*time.Second, "first 50 consumed", allConsumed(50))

	proxy.Sever()
	for i := 50; i < 100; i++ {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	testenv.Eventually(t, 30*time.Second, "100 consumed after a cut", allConsumed(100))

	proxy.SetDown(true)
	testenv.Eventually(t, 10*time.Second, "the connection to be seen as lost", func() bool { return !conn.Connected() })
	// While the broker is "away", the input queue disappears: the
	// reconnect must declare it again.
	if _, err := rawChannel(t).QueueDelete(b.topo.Queue("in"), false, false, false); err != nil {
		t.Fatal(err)
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := 100; i < 150; i++ {
			publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
		}
	}()
	proxy.SetDown(false)
	<-published
	testenv.Eventually(t, 60*time.Second, "150 consumed after an outage", allConsumed(150))
	if n := b.metric(t, "sas_broker_reconnects_total"); n < 2 {
		t.Fatalf("%v reconnects, want at least 2", n)
	}
	if !conn.Connected() || b.metric(t, "sas_broker_connected") != 1 {
		t.Fatal("not connected at the end")
	}
}

// TestConsumerComesBackAfterQueueDeleted deletes the input queue under a
// live connection: the broker cancels the consumer, which declares the
// queue again and consumes what is published next.
func TestConsumerComesBackAfterQueueDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	var got atomic.Int64
	handler := func(ctx context.Context, d broker.Message) error {
		got.Add(1)
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	defer cancel()
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 4, Workers: 1}, handler, b.logger, b.metrics)
	go func() { _ = consumer.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, "consumer subscribed", consumer.Running)
	if _, err := rawChannel(t).QueueDelete(b.topo.Queue("in"), false, false, false); err != nil {
		t.Fatal(err)
	}
	// Published mandatory, a message is returned until the queue is back;
	// publishRetrying keeps trying.
	publishRetrying(t, pub, b.topo.Queue("in"), "after-delete")
	testenv.Eventually(t, 30*time.Second, "the message consumed from the declared-again queue", func() bool { return got.Load() == 1 })
}

func TestWithCAFile(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	dir := t.TempDir()
	bad := dir + "/bad.pem"
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir + "/missing.pem", bad} {
		if _, err := broker.Open(ctxFor(t, 5*time.Second), testenv.AMQPURL(), "ca", b.topo, b.logger, broker.NewMetrics(nil), broker.WithCAFile(path)); err == nil {
			t.Errorf("Open accepted CA file %s", path)
		}
	}
	// An empty path changes nothing.
	conn, err := broker.Open(ctxFor(t, 30*time.Second), testenv.AMQPURL(), "ca", b.topo, b.logger, broker.NewMetrics(nil), broker.WithCAFile(""))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// TestPublishThroughASlowNetwork: with 100 ms added each way, confirmed
// publishing still works (it just takes longer).
func TestPublishThroughASlowNetwork(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	url, proxy := testenv.Proxied(t, testenv.AMQPURL())
	conn := b.open(t, url)
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	proxy.SetLatency(100 * time.Millisecond)
	start := time.Now()
	publishRetrying(t, pub, b.topo.Queue("in"), "slow")
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("publish through 100 ms each way took only %v: the latency is not applied", took)
	}
}

// TestSeveralURLsAreTriedInTurn: with a list of nodes, the connection
// skips one that does not answer, and when the node it uses goes away it
// reconnects to another and goes on publishing and consuming.
func TestSeveralURLsAreTriedInTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	first, proxyA := testenv.Proxied(t, testenv.AMQPURL())
	second, proxyB := testenv.Proxied(t, testenv.AMQPURL())
	proxyA.SetDown(true)
	// A node that refuses, then two that answer: the first of those is used.
	conn := b.open(t, "amqp://guest:guest@127.0.0.1:1/, "+first+","+second)
	if !conn.Connected() {
		t.Fatal("not connected")
	}
	proxyA.SetDown(false)
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	var mu sync.Mutex
	consumed := map[string]bool{}
	ctx, cancel := context.WithCancel(ctxFor(t, 2*time.Minute))
	defer cancel()
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 10, Workers: 2}, func(ctx context.Context, d broker.Message) error {
		mu.Lock()
		consumed[d.ID] = true
		mu.Unlock()
		return nil
	}, b.logger, b.metrics)
	go func() { _ = consumer.Run(ctx) }()
	all := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(consumed) == n
		}
	}
	for i := range 20 {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	testenv.Eventually(t, 30*time.Second, "20 consumed", all(20))
	// It is on the second node (the first was down when it connected);
	// that one goes down for good: it moves to the first.
	if n := proxyB.Sever(); n == 0 {
		t.Fatal("the connection is not on the second node")
	}
	proxyB.SetDown(true)
	for i := 20; i < 40; i++ {
		publishRetrying(t, pub, b.topo.Queue("in"), fmt.Sprint(i))
	}
	testenv.Eventually(t, 60*time.Second, "40 consumed through the other node", all(40))
	if n := proxyA.Sever(); n == 0 {
		t.Fatal("the connection did not move to the first node")
	}
}

// TestClassicQueueCountsRedeliveries: a classic queue has no delivery
// limit of its own; the consumer counts a message's deliveries without an
// ack in the message and dead-letters it at the limit with reason
// delivery_limit, as RabbitMQ does a quorum queue's. Other messages go
// through as on a quorum queue.
func TestClassicQueueCountsRedeliveries(t *testing.T) {
	t.Parallel()
	const limit = 3
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: limit, QueueType: broker.QueueClassic, Inputs: []string{"in"}}
	testenv.Broker(t, topo)
	reg := prometheus.NewRegistry()
	b := bundle{topo: topo, reg: reg, metrics: broker.NewMetrics(reg), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	var mu sync.Mutex
	seen := map[string]int{}
	handler := func(ctx context.Context, d broker.Message) error {
		mu.Lock()
		seen[d.ID]++
		n := seen[d.ID]
		mu.Unlock()
		if d.ID == "poison" || d.ID == "retry-once" && n == 1 {
			return errors.New("fails")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 4, Workers: 2}, handler, b.logger, b.metrics)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	for _, id := range []string{"ok", "retry-once", "poison"} {
		publishRetrying(t, pub, b.topo.Queue("in"), id)
	}
	ch := rawChannel(t)
	var dead amqp.Delivery
	testenv.Eventually(t, 30*time.Second, "poison in the dead-letter queue", func() bool {
		d, ok, err := ch.Get(b.topo.DeadLetterQueue("in"), true)
		if err != nil {
			t.Fatal(err)
		}
		dead = d
		return ok
	})
	if dead.MessageId != "poison" || dead.Headers[broker.HeaderErrorReason] != broker.ReasonDeliveryLimit || string(dead.Body) != "poison" {
		t.Fatalf("dead-lettered %s with %v, want poison with reason %s", dead.MessageId, dead.Headers, broker.ReasonDeliveryLimit)
	}
	testenv.Eventually(t, 10*time.Second, "ok and retry-once handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["ok"] == 1 && seen["retry-once"] == 2
	})
	mu.Lock()
	poison := seen["poison"]
	mu.Unlock()
	if poison != limit {
		t.Fatalf("poison handled %d times, want the limit, %d", poison, limit)
	}
	// Counted once the dead-letter's publish is confirmed, a moment after
	// the message is in the queue.
	testenv.Eventually(t, 10*time.Second, "the dead letter counted", func() bool { return b.metric(t, "sas_dead_lettered_total") == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consumer: %v", err)
	}
	q, err := ch.QueueDeclarePassive(b.topo.Queue("in"), true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("input left with %d messages (%v)", q.Messages, err)
	}
}

// TestExistingQueuesKeepTheirType: RabbitMQ cannot change a queue's type,
// and the queue may hold messages; a service started with the other
// SAS_QUEUE_TYPE uses the queues as they are, and counts redeliveries
// only where it must.
func TestExistingQueuesKeepTheirType(t *testing.T) {
	t.Parallel()
	b := setup(t, 5) // quorum queues
	b.open(t, testenv.AMQPURL())
	classic := b.topo
	classic.QueueType = broker.QueueClassic
	conn, err := broker.Open(ctxFor(t, 30*time.Second), testenv.AMQPURL(), "classic", classic, b.logger, broker.NewMetrics(nil))
	if err != nil {
		t.Fatalf("open with SAS_QUEUE_TYPE classic over quorum queues: %v", err)
	}
	defer conn.Close()
	if got := conn.Topology().QueueType; got != broker.QueueQuorum {
		t.Fatalf("topology type %q, want the existing queues' quorum", got)
	}
	if err := broker.CheckQueueType("stream"); err == nil || !strings.Contains(err.Error(), "SAS_QUEUE_TYPE") {
		t.Fatalf("CheckQueueType(stream) = %v, want an error naming SAS_QUEUE_TYPE", err)
	}
}

// TestCopiesKeepWhereAMessageCameFrom: a handler learns the exchange a
// message was published to and its user-id, as RabbitMQ verified them,
// and not what its headers claim; a dead letter requeued by sas (a copy
// sas publishes through the default exchange, without the user-id)
// still says where its original came from and who sent it.
func TestCopiesKeepWhereAMessageCameFrom(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: 5, Inputs: []string{"in"}, Entrances: []string{"in"}}
	testenv.Broker(t, topo)
	b := bundle{topo: topo, reg: prometheus.NewRegistry(), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b.metrics = broker.NewMetrics(b.reg)
	conn := b.open(t, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, b.metrics)
	defer pub.Close()
	type seen struct{ via, user string }
	var mu sync.Mutex
	got := map[string][]seen{}
	handler := func(_ context.Context, m broker.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got[m.ID] = append(got[m.ID], seen{m.Via, m.UserID})
		if m.ID == "from-app" && len(got[m.ID]) == 1 {
			return broker.Reject("bad_thing", "refused once")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(ctxFor(t, 60*time.Second))
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: "in", Prefetch: 4, Workers: 1}, handler, b.logger, b.metrics)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	ch := rawChannel(t)
	forged := amqp.Table{broker.HeaderVia: "", broker.HeaderUserID: "platform"}
	if err := ch.PublishWithContext(ctx, topo.Queue("in"), "", false, false,
		amqp.Publishing{MessageId: "from-app", UserId: "guest", Headers: forged, Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", topo.Queue("in"), false, false, amqp.Publishing{MessageId: "from-sas", Body: []byte("s")}); err != nil {
		t.Fatal(err)
	}
	entrance := seen{topo.Queue("in"), "guest"}
	testenv.Eventually(t, 30*time.Second, "both handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["from-app"]) == 1 && len(got["from-sas"]) == 1
	})
	var requeued []broker.DeadLetter
	testenv.Eventually(t, 30*time.Second, "the refused one requeued from its dead-letter queue", func() bool {
		s, _, err := conn.ScanDLQ(ctx, pub, topo.DeadLetterQueue("in"), 0, func(broker.DeadLetter) broker.DLQAction { return broker.Requeue })
		if err != nil {
			t.Fatal(err)
		}
		requeued = append(requeued, s...)
		return len(requeued) > 0
	})
	testenv.Eventually(t, 30*time.Second, "the requeued copy handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got["from-app"]) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if got["from-app"][0] != entrance || got["from-sas"][0] != (seen{}) {
		t.Fatalf("first deliveries seen as %+v (app) and %+v (sas's own), want %+v and none", got["from-app"][0], got["from-sas"][0], entrance)
	}
	if got["from-app"][1] != entrance {
		t.Fatalf("the requeued copy seen as %+v, want its original's %+v", got["from-app"][1], entrance)
	}
}
