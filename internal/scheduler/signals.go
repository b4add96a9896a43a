package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// signaler applies the signals of the signals queue: each ends the wait
// step of its order that awaits it, or is kept until that wait begins, or
// is refused: dead-lettered with the reason and, when it names a
// reply_to, a status event "rejected" sent there.
type signaler struct {
	store       *statestore.Store
	me          string
	workCtx     context.Context
	logger      *slog.Logger
	metrics     *metrics
	tr          *tracing.Tracing
	wakeClaimer func()
	wakeRelay   func()
}

func (g *signaler) handler() broker.Handler {
	return broker.Chain(broker.Decoded(messages.DecodeSignal, g.unreadable, g.handle), broker.Failpoints(), broker.Traced(g.tr))
}

func (g *signaler) handle(ctx context.Context, m broker.Message, sig messages.Signal) error {
	actx, span := g.tr.Start(tracing.RemoteParent(g.workCtx, ctx), "signal "+sig.Name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("sas.order_id", sig.OrderID), attribute.String("sas.signal_id", sig.SignalID)))
	defer span.End()
	log := g.logger.With(append([]any{"order_id", sig.OrderID, "signal", sig.Name, "signal_id", sig.SignalID}, tracing.LogAttrs(actx)...)...)
	actor := "signal"
	if sig.By != "" {
		actor = "signal:" + sig.By
	}
	var out statestore.SignalOutcome
	err := service.Retry(ctx, func() error {
		var err error
		out, err = g.store.ApplySignal(g.workCtx, statestore.Signal{OrderID: sig.OrderID, ID: sig.SignalID, Name: sig.Name,
			Payload: sig.Payload, Actor: actor})
		return err
	}, func(err error) bool {
		return errors.Is(err, statestore.ErrInvalidData) || g.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		g.metrics.dbRetries.Inc()
		log.Warn("applying a signal failed, retrying", "err", err, "retry_in", wait)
	})
	switch {
	case errors.Is(err, statestore.ErrInvalidData):
		out = statestore.SignalOutcome{Outcome: messages.ReasonInvalidValue, Detail: err.Error()}
	case err != nil:
		return err // shutting down: back to the queue
	}
	outcome := out.Outcome
	if out.Refused() {
		outcome = "refused"
	}
	g.metrics.signals.WithLabelValues(outcome).Inc()
	span.SetAttributes(attribute.String("sas.outcome", out.Outcome))
	if out.Refused() {
		log.Info("signal refused", "reason", out.Outcome, "detail", out.Detail)
		return g.refuse(sig.OrderID, sig.ReplyTo, messages.CorrelationID(m.CorrelationID), out.Outcome, out.Detail)
	}
	if out.Outcome == statestore.SignalApplied {
		g.wakeClaimer()
		g.wakeRelay()
	}
	log.Debug("signal", "outcome", out.Outcome, "step", out.Step, "order_status", out.OrderStatus)
	return nil
}

// refuse dead-letters a signal and tells its reply_to queue, if it named
// one (service.Refuse).
func (g *signaler) refuse(orderID, replyTo, corr, reason, detail string) error {
	return service.Refuse(g.workCtx, g.store, g.logger, orderID, replyTo, corr, reason, detail, g.wakeRelay)
}

// unreadable refuses a signal whose body could not be read as one, with
// the decoder's reason; if the body still names an order and a reply_to,
// that queue is told as for any refusal.
func (g *signaler) unreadable(_ context.Context, m broker.Message, err error) error {
	g.metrics.signals.WithLabelValues("refused").Inc()
	rej := broker.RejectFor(err, messages.ReasonInvalidValue).(*broker.Rejection)
	if orderID, replyTo, ok := messages.SubmitRefOf(m.Body); ok {
		return g.refuse(orderID, replyTo, messages.CorrelationID(m.CorrelationID), rej.Reason, rej.Detail)
	}
	return rej
}
