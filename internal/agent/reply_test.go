package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/tracing"
)

// TestRepliesAreTransientOnClassicQueues: on classic queues a reply goes
// transient unless SAS_STEP_MESSAGES says persistent (its scheduler sends
// the step again when a broker restart lost it); on quorum queues it is
// persistent whatever the setting.
func TestRepliesAreTransientOnClassicQueues(t *testing.T) {
	for _, tc := range []struct {
		queueType, setting string
		want               uint8
	}{
		{broker.QueueClassic, "", amqp.Transient},
		{broker.QueueClassic, service.StepsTransient, amqp.Transient},
		{broker.QueueClassic, service.StepsPersistent, amqp.Persistent},
		{broker.QueueQuorum, service.StepsTransient, amqp.Persistent},
	} {
		t.Run(tc.queueType+"/"+tc.setting, func(t *testing.T) {
			prefix := testenv.Prefix(t)
			topo := broker.Topology{Prefix: prefix, DeliveryLimit: 10, QueueType: tc.queueType, Inputs: []string{messages.RepliesQueue}}
			testenv.Broker(t, topo)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			bm := broker.NewMetrics(nil)
			conn, err := broker.Open(ctx, testenv.AMQPURL(), "reply-test", topo, slog.New(slog.DiscardHandler), bm)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			pub := broker.NewPublisher(conn, bm)
			defer pub.Close()
			a := &agent{cfg: Config{Common: service.Common{QueueType: tc.queueType, StepMessages: tc.setting}},
				topo: topo, pub: pub, now: time.Now, tr: tracing.Off()}
			reply := messages.StepReply{SchemaVersion: messages.SchemaVersion, OrderID: messages.NewID(), Step: 1, Attempt: 1,
				Outcome: messages.OutcomeOK, Result: []byte(`{"ok":true}`)}
			if err := a.sendReply(ctx, reply); err != nil {
				t.Fatal(err)
			}
			raw, err := amqp.Dial(testenv.AMQPURL())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			ch, err := raw.Channel()
			if err != nil {
				t.Fatal(err)
			}
			d, ok, err := ch.Get(topo.Queue(messages.RepliesQueue), true)
			if err != nil || !ok {
				t.Fatalf("get the reply: %v %v", ok, err)
			}
			if d.DeliveryMode != tc.want {
				t.Fatalf("the reply's delivery mode is %d, want %d", d.DeliveryMode, tc.want)
			}
		})
	}
}
