package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// relay publishes the outbox: status events to the status exchange (routing
// key: the new status) and to the order's reply_to queue, operator alerts
// to the alerts exchange. A message is marked published only after the
// broker confirmed it, so every one is published at least once; its
// message_id stays the same on a second try, for consumers to spot repeats.
type relay struct {
	store *statestore.Store
	pub   *broker.Publisher
	topo  broker.Topology
	batch int
	poll  time.Duration
	// unheardFor is how long a progress status the broker returned (no
	// queue bound for it) is not written for orders without a reply_to;
	// 0 writes every event.
	unheardFor time.Duration
	wake       <-chan struct{}
	logger     *slog.Logger
	metrics    *metrics
	tr         *tracing.Tracing
}

// busyRecheck is how soon a relay that found another one at work looks
// again: that one may have read the outbox before this one's nudge.
const busyRecheck = 25 * time.Millisecond

func (r *relay) run(ctx context.Context) error {
	ticker := time.NewTicker(r.poll)
	defer ticker.Stop()
	for {
		var recheck <-chan time.Time
		if busy := r.drain(ctx); busy {
			recheck = time.After(busyRecheck)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
			r.metrics.wakeups.WithLabelValues("relay", "notify").Inc()
		case <-ticker.C:
			r.metrics.wakeups.WithLabelValues("relay", "poll").Inc()
		case <-recheck:
			r.metrics.wakeups.WithLabelValues("relay", "busy").Inc()
		}
	}
}

// drain relays until the outbox is empty; it reports whether another
// scheduler's relay held the outbox.
func (r *relay) drain(ctx context.Context) (busy bool) {
	for ctx.Err() == nil {
		n, err := r.store.RelayOutboxHeard(ctx, r.batch, r.unheardFor, r.publish)
		switch {
		case errors.Is(err, statestore.ErrRelayBusy):
			return true // another scheduler is relaying
		case err != nil:
			if ctx.Err() == nil {
				r.metrics.relayErrors.Inc()
				r.logger.Warn("relaying the outbox failed; will try again", "err", err, "published", n)
			}
			return false
		case n < r.batch:
			return false
		}
	}
	return false
}

// sent is one publish of an outbox message.
type sent struct {
	index   int
	target  target
	pending *broker.Pending
}

// publish starts every message's publishes in order, then waits for their
// confirms, and returns how many messages from the start were all
// confirmed. A publish no queue was bound for counts as done: nobody was
// listening; the statuses of such progress events are returned, for the
// store to stop writing them a while.
func (r *relay) publish(ctx context.Context, msgs []statestore.OutboxMessage) (int, []string, error) {
	var all []sent
	// Each message of an order with a trace is a span of that trace, its
	// context in the message's headers, so a listener joins it.
	var spans []trace.Span
	if r.tr.On() {
		spans = make([]trace.Span, len(msgs))
	}
	defer func() {
		for _, s := range spans {
			if s != nil {
				s.End()
			}
		}
	}()
	done := len(msgs)
	var firstErr error
	fail := func(i int, err error) {
		if i < done {
			done = i
		}
		if firstErr == nil {
			firstErr = err
		}
	}
start:
	for i, m := range msgs {
		targets, err := r.targets(m)
		if err != nil {
			// A body the database built should always decode; skip it
			// rather than block every later message behind it.
			r.logger.Error("outbox message is invalid; skipped", "outbox_id", m.ID, "err", err)
			continue
		}
		var headers amqp.Table
		if r.tr.On() && m.Traceparent != "" {
			var sctx context.Context
			sctx, spans[i] = r.tr.Start(r.tr.Resume(ctx, m.Traceparent), "publish "+m.Type, trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(attribute.String("sas.order_id", m.OrderID), attribute.String("sas.message_id", m.MessageID)))
			headers = r.tr.InjectAMQP(sctx, nil)
		}
		for _, t := range targets {
			p, err := r.pub.Start(ctx, t.exchange, t.key, amqp.Publishing{
				ContentType:   messages.ContentType,
				Type:          t.msgType,
				MessageId:     m.MessageID,
				CorrelationId: m.CorrelationID,
				Headers:       headers,
				Body:          m.Body,
			})
			if err != nil {
				fail(i, err)
				break start
			}
			all = append(all, sent{index: i, target: t, pending: p})
		}
	}
	var unheard []string
	for _, s := range all {
		err := s.pending.Wait(ctx)
		switch {
		case err == nil:
		case errors.Is(err, broker.ErrReturned):
			r.metrics.unroutable.WithLabelValues(s.target.name).Inc()
			if s.target.progress != "" && !slices.Contains(unheard, s.target.progress) {
				unheard = append(unheard, s.target.progress)
			}
		default:
			fail(s.index, err)
		}
	}
	for _, m := range msgs[:done] {
		r.metrics.outbox.WithLabelValues(m.Type).Inc()
	}
	return done, unheard, firstErr
}

type target struct {
	name, exchange, key, msgType string
	// progress is the status of a progress event published to the status
	// exchange, which the store may stop writing when nobody hears it.
	progress string
}

func (r *relay) targets(m statestore.OutboxMessage) ([]target, error) {
	switch m.Type {
	case statestore.OutboxStatusEvent:
		ev, err := messages.DecodeStatusEvent(m.Body)
		if err != nil {
			return nil, err
		}
		var ts []target
		// A rejected submit is news to its sender only: the order does not
		// exist.
		if ev.Status != messages.StatusRejected {
			t := target{name: "status_exchange", exchange: r.topo.StatusExchange(), key: ev.Status, msgType: messages.TypeStatusEvent}
			switch ev.Status {
			case messages.StatusReceived, messages.StatusProcessing, messages.StatusCompensating:
				t.progress = ev.Status
			}
			ts = append(ts, t)
		}
		if m.ReplyTo != "" {
			ts = append(ts, target{name: "reply_to", key: m.ReplyTo, msgType: messages.TypeStatusEvent})
		}
		return ts, nil
	case statestore.OutboxOperatorAlert:
		if _, err := messages.DecodeOperatorAlert(m.Body); err != nil {
			return nil, err
		}
		return []target{{name: "alerts", exchange: r.topo.AlertsExchange(), msgType: messages.TypeOperatorAlert}}, nil
	}
	return nil, errors.New("unknown outbox message type " + m.Type)
}
