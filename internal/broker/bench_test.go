package broker_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
)

// The broker's share of an order, one message per op, against the real
// RabbitMQ. An order's every hop (its submission, each step's request and
// reply) is one message through a quorum queue; its status events are
// publishes to the status exchange, where nobody may be listening. Run
// with a fixed count for comparable figures:
//
//	go test -run '^$' -bench . -benchtime 20000x -count 5 ./internal/broker
//
// Besides the wall time, each reports rabbitmq-cpu-ns/op, the CPU time of
// every RabbitMQ process per op, and client-cpu-ns/op, this process's (the
// publisher's and the consumer's together).

// confirmWindow is how many publishes await their confirms at once, as in
// a claim's requests or a relay round.
const confirmWindow = 256

// publishAll publishes n messages to exchange/key with at most
// confirmWindow awaiting their confirms, and returns how many were
// confirmed, and how many returned as unroutable.
func publishAll(ctx context.Context, b *testing.B, pub *broker.Publisher, exchange, key string, n int) (confirmed, returned int) {
	b.Helper()
	window := make(chan *broker.Pending, confirmWindow)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for p := range window {
			switch err := p.Wait(ctx); {
			case err == nil:
				confirmed++
			case errors.Is(err, broker.ErrReturned):
				returned++
			default:
				b.Error(err)
			}
		}
	}()
	for i := range n {
		p, err := pub.Start(ctx, exchange, key, amqp.Publishing{
			ContentType: "application/json",
			MessageId:   "bench-" + strconv.Itoa(i),
			Body:        []byte(benchBody),
		})
		if err != nil {
			b.Error(err)
			break
		}
		window <- p
	}
	close(window)
	<-done
	return confirmed, returned
}

// benchPublisher sets up a benchmark's queues and a publisher on a
// connection of its own, closed when the benchmark ends.
func benchPublisher(b *testing.B) (bundle, *broker.Conn, *broker.Publisher) {
	b.Helper()
	bd := setup(b, 5)
	conn := bd.open(b, testenv.AMQPURL())
	pub := broker.NewPublisher(conn, bd.metrics)
	b.Cleanup(func() { _ = pub.Close() })
	return bd, conn, pub
}

// benchBody is about the size of a step request.
const benchBody = `{"schema_version":1,"order_id":"0b0e4a4e-3d4b-4f51-9d7e-5b8e0c2f6a11","step":1,"name":"reserve","agent":"inventory","attempt":1,"idempotency_key":"0b0e4a4e-3d4b-4f51-9d7e-5b8e0c2f6a11/1/reserve","complete_by":"2026-11-22T10:00:00.123456Z","payload":{"customer":"c-1","items":[{"sku":"sku-1","qty":2}],"amount":1999,"currency":"EUR","priority":0}}`

// BenchmarkMessage: one message published (persistent, mandatory,
// confirmed) to a queue and consumed by a Consumer with prefetch 64 that
// acknowledges in groups, as the services do. quorum: a durable quorum
// queue, as every queue of the topology is; classic: a durable classic
// queue, for comparison only.
func BenchmarkMessage(b *testing.B) {
	for _, kind := range []string{amqp.QueueTypeQuorum, amqp.QueueTypeClassic} {
		b.Run(kind, func(b *testing.B) { benchMessage(b, kind) })
	}
}

// benchQueue returns the name of the input queue of kind: the
// topology's quorum queue "in", or a durable queue of another kind made
// for the benchmark and deleted after it.
func benchQueue(b *testing.B, bd bundle, kind string) string {
	if kind == amqp.QueueTypeQuorum {
		return "in"
	}
	if _, err := rawChannel(b).QueueDeclare(bd.topo.Queue(kind), true, false, false, false, amqp.Table{amqp.QueueTypeArg: kind}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = rawChannel(b).QueueDelete(bd.topo.Queue(kind), false, false, false) })
	return kind
}

func benchMessage(b *testing.B, kind string) {
	bd, conn, pub := benchPublisher(b)
	input := benchQueue(b, bd, kind)
	ctx, cancel := context.WithCancel(ctxFor(b, 10*time.Minute))
	defer cancel()
	var got atomic.Int64
	all := make(chan struct{})
	target := int64(b.N)
	stopped := consume(ctx, b, bd, conn, pub, input, func() {
		if got.Add(1) == target {
			close(all)
		}
	})

	stop := testenv.MeasureCPU(b, "rabbitmq", "beam.smp")
	if confirmed, _ := publishAll(ctx, b, pub, "", bd.topo.Queue(input), b.N); confirmed != b.N {
		b.Fatalf("%d of %d publishes confirmed", confirmed, b.N)
	}
	select {
	case <-all:
	case <-ctx.Done():
		b.Fatalf("consumed %d of %d", got.Load(), b.N)
	}
	stop()
	cancel()
	if err := <-stopped; err != nil {
		b.Fatal(err)
	}
}

// consume runs a Consumer of input with prefetch 64 that acknowledges in
// groups, as the services do, calling got for each delivery, until ctx
// ends; it returns once the consumer is subscribed, and Run's result
// comes on the channel.
func consume(ctx context.Context, b *testing.B, bd bundle, conn *broker.Conn, pub *broker.Publisher, input string, got func()) <-chan error {
	b.Helper()
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: input, Prefetch: 64, Workers: 16},
		func(context.Context, broker.Message) error {
			got()
			return nil
		}, bd.logger, bd.metrics)
	stopped := make(chan error, 1)
	go func() { stopped <- consumer.Run(ctx) }()
	testenv.Eventually(b, 30*time.Second, "consumer subscribed", consumer.Running)
	return stopped
}

// BenchmarkUnroutedPublish: one status event published (persistent,
// mandatory, confirmed) to the status exchange with no queue bound for its
// routing key, as most status events are when only terminal ones are
// listened for: the broker returns it before confirming it.
func BenchmarkUnroutedPublish(b *testing.B) {
	bd, _, pub := benchPublisher(b)
	ctx := ctxFor(b, 10*time.Minute)

	stop := testenv.MeasureCPU(b, "rabbitmq", "beam.smp")
	_, returned := publishAll(ctx, b, pub, bd.topo.StatusExchange(), "processing", b.N)
	stop()
	if returned != b.N {
		b.Fatalf("%d of %d publishes returned", returned, b.N)
	}
}

// BenchmarkAtLowRate: the broker's share of an order at low load, each
// message alone at testenv.LowRate a second, the broker idle in between.
// message: one message published (persistent, mandatory, confirmed) to a
// quorum queue and consumed and acknowledged (a lone ack goes after the
// consumer's 5 ms grouping wait), as each of an order's submission,
// requests and replies is; message-classic: the same through a durable
// classic queue, for comparison only. unrouted: one status event
// published to the status exchange with no queue bound for it.
//
//	go test -run '^$' -bench AtLowRate -benchtime 300x ./internal/broker
func BenchmarkAtLowRate(b *testing.B) {
	b.Run("message", func(b *testing.B) { messageAtLowRate(b, amqp.QueueTypeQuorum) })
	b.Run("message-classic", func(b *testing.B) { messageAtLowRate(b, amqp.QueueTypeClassic) })
	b.Run("unrouted", func(b *testing.B) {
		bd, _, pub := benchPublisher(b)
		ctx := ctxFor(b, 10*time.Minute)
		stop := testenv.MeasureCPU(b, "rabbitmq", "beam.smp")
		testenv.Paced(b, testenv.LowRate, func(i int) {
			p, err := pub.Start(ctx, bd.topo.StatusExchange(), "processing", amqp.Publishing{
				ContentType: "application/json",
				MessageId:   "bench-" + strconv.Itoa(i),
				Body:        []byte(benchBody),
			})
			if err == nil {
				err = p.Wait(ctx)
			}
			if !errors.Is(err, broker.ErrReturned) {
				b.Fatalf("publish %d: %v; want it returned", i, err)
			}
		})
		stop()
	})
}

// messageAtLowRate is BenchmarkMessage one message at a time, at
// testenv.LowRate: each published, confirmed and consumed before the next.
func messageAtLowRate(b *testing.B, kind string) {
	bd, conn, pub := benchPublisher(b)
	input := benchQueue(b, bd, kind)
	ctx, cancel := context.WithCancel(ctxFor(b, 10*time.Minute))
	defer cancel()
	consumed := make(chan struct{}, 1)
	stopped := consume(ctx, b, bd, conn, pub, input, func() { consumed <- struct{}{} })

	stop := testenv.MeasureCPU(b, "rabbitmq", "beam.smp")
	testenv.Paced(b, testenv.LowRate, func(i int) {
		p, err := pub.Start(ctx, "", bd.topo.Queue(input), amqp.Publishing{
			ContentType: "application/json",
			MessageId:   "bench-" + strconv.Itoa(i),
			Body:        []byte(benchBody),
		})
		if err == nil {
			err = p.Wait(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		select {
		case <-consumed:
		case <-ctx.Done():
			b.Fatalf("message %d not consumed", i)
		}
	})
	stop()
	cancel()
	if err := <-stopped; err != nil {
		b.Fatal(err)
	}
}
