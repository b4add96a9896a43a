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
	store outboxStore
	pub   *broker.Publisher
	topo  broker.Topology
	batch int
	poll  time.Duration
	// unheardFor is how long a progress status the broker returned (no
	// queue bound for it) is not written for orders without a reply_to;
	// 0 writes every event.
	unheardFor time.Duration
	wake       <-chan struct{}
	// held brings the status events this scheduler's replies held for
	// it (statestore.ApplyRepliesPublishing): the relay publishes them
	// and forgets them, with no round of its own.
	held chan statestore.OutboxMessage
	// handersDone is closed once nothing hands held events any more (the
	// replies' consumer has finished the deliveries in hand): a relay
	// that was told to stop publishes what it is handed until then, while
	// work lasts. Nil: it publishes what waits, and stops.
	handersDone <-chan struct{}
	// work ends when the shutdown's time is up: held events are work in
	// hand, published under it.
	work    context.Context
	logger  *slog.Logger
	metrics *metrics
	tr      *tracing.Tracing
}

// outboxStore is what the relay needs of the store.
type outboxStore interface {
	RelayOutboxHeard(ctx context.Context, limit int, unheardFor time.Duration,
		publish func(context.Context, []statestore.OutboxMessage) (int, []string, error)) (int, error)
	ForgetPublished(ctx context.Context, ids []int64) (bool, error)
}

// heldFor is how long a reply holds the status event of the order it
// ended for its scheduler to publish: past it, a relay takes the event
// (its scheduler stopped, or could not publish it). A relay takes nothing
// after a held event either, so this is also how long a scheduler that
// died between its reply's commit and the publish holds up every event
// and alert behind it. It should outlast a publish's confirm; one that
// does not is published twice, under the same message_id.
const heldFor = 3 * time.Second

// heldQueue is how many held events may wait for the relay; a replier
// that finds it full waits.
const heldQueue = 1024

// hand gives the relay an event held for it to publish; false if ctx
// ended first (the event is then a relay's once its hold has passed).
func (r *relay) hand(ctx context.Context, m statestore.OutboxMessage) bool {
	select {
	case r.held <- m:
		return true
	case <-ctx.Done():
		return false
	}
}

// busyRecheck is how soon a relay that found another one at work looks
// again: that one may have read the outbox before this one's nudge.
const busyRecheck = 25 * time.Millisecond

// relayIdleLongest is how many poll intervals a relay that keeps finding
// the outbox empty waits at most between looks: its wait doubles from one
// interval at each empty look, and is one again as soon as it is nudged
// or finds work. Whatever writes the outbox nudges a relay (a claim that
// wrote events, an applied reply, a signal) or notifies sas_outbox (the
// supervisor, operators, a refused submit, an order whose first step
// waits); the poll only bounds how late a message whose nudge was lost
// goes out. At rest a relay then costs a transaction every few seconds,
// not two a second.
const relayIdleLongest = 8

func (r *relay) run(ctx context.Context) error {
	idle := r.poll
	poll := time.NewTimer(idle)
	defer poll.Stop()
	var recheck <-chan time.Time
	look := true // whether to look at the outbox before waiting again
	for {
		if look {
			recheck = nil
			busy, found := r.drain(ctx)
			if busy {
				recheck = time.After(busyRecheck)
			}
			if found {
				idle = r.poll
			}
			poll.Reset(idle)
		}
		look = true
		select {
		case <-ctx.Done():
			r.finish()
			return nil
		case m := <-r.held:
			// Held events need no look at the outbox, unless forgetting
			// them found messages that waited behind them.
			r.metrics.wakeups.WithLabelValues("relay", "held").Inc()
			look = r.publishHeld(r.work, m)
		case <-r.wake:
			r.metrics.wakeups.WithLabelValues("relay", "notify").Inc()
			idle = r.poll
		case <-poll.C:
			r.metrics.wakeups.WithLabelValues("relay", "poll").Inc()
			idle = min(2*idle, relayIdleLongest*r.poll)
		case <-recheck:
			r.metrics.wakeups.WithLabelValues("relay", "busy").Inc()
		}
	}
}

// finish publishes the events held for this relay that the replies in
// hand as the scheduler stops still hand it, so that a scheduler taken
// down does not leave its last orders' ends to wait out their hold for
// another relay; then, if messages waited behind them, it relays those.
func (r *relay) finish() {
	more := false
	publish := func(m statestore.OutboxMessage) {
		r.metrics.wakeups.WithLabelValues("relay", "held").Inc()
		more = r.publishHeld(r.work, m) || more
	}
	handing := r.handersDone
	for handing != nil {
		select {
		case m := <-r.held:
			publish(m)
		case <-handing:
			handing = nil
		case <-r.work.Done():
			return
		}
	}
	for {
		select {
		case m := <-r.held:
			publish(m)
		default:
			if more {
				r.drain(r.work)
			}
			return
		}
	}
}

// publishHeld publishes first and the other held events waiting, then
// forgets those the broker confirmed; it reports whether the outbox has
// messages for a relay round (written after a held event, they waited for
// it). An event not confirmed stays held until its hold passes, and is then
// a relay's.
func (r *relay) publishHeld(ctx context.Context, first statestore.OutboxMessage) bool {
	msgs := []statestore.OutboxMessage{first}
collect:
	for len(msgs) < r.batch {
		select {
		case m := <-r.held:
			msgs = append(msgs, m)
		default:
			break collect
		}
	}
	n, _, err := r.publish(ctx, msgs)
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		r.metrics.relayErrors.Inc()
		r.logger.Warn("publishing held status events failed; a relay takes them once their hold passes",
			"err", err, "published", n, "held_for", heldFor.String())
	}
	if n == 0 {
		return false
	}
	ids := make([]int64, n)
	for i, m := range msgs[:n] {
		ids[i] = m.ID
	}
	more, err := r.store.ForgetPublished(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			r.metrics.relayErrors.Inc()
			r.logger.Warn("forgetting published status events failed; a relay publishes them again once their hold passes", "err", err)
		}
		return false
	}
	return more
}

// drain relays until the outbox is empty; it reports whether another
// scheduler's relay held the outbox, and whether it found anything to
// relay (or failed: a store that failed is looked at again soon).
func (r *relay) drain(ctx context.Context) (busy, found bool) {
	for ctx.Err() == nil {
		n, err := r.store.RelayOutboxHeard(ctx, r.batch, r.unheardFor, r.publish)
		switch {
		case errors.Is(err, statestore.ErrRelayBusy):
			return true, true // another scheduler is relaying
		case err != nil:
			if ctx.Err() == nil {
				r.metrics.relayErrors.Inc()
				r.logger.Warn("relaying the outbox failed; will try again", "err", err, "published", n)
			}
			return false, true
		case n < r.batch:
			return false, found || n > 0
		}
		found = true
	}
	return false, found
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
	case statestore.OutboxStepEvent:
		ev, err := messages.DecodeStepEvent(m.Body)
		if err != nil {
			return nil, err
		}
		return []target{{name: "status_exchange", exchange: r.topo.StatusExchange(), key: messages.StepEventKey(ev.Event),
			msgType: messages.TypeStepEvent, progress: "step"}}, nil
	case statestore.OutboxOperatorAlert:
		if _, err := messages.DecodeOperatorAlert(m.Body); err != nil {
			return nil, err
		}
		return []target{{name: "alerts", exchange: r.topo.AlertsExchange(), msgType: messages.TypeOperatorAlert}}, nil
	}
	return nil, errors.New("unknown outbox message type " + m.Type)
}
