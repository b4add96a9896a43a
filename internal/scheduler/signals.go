package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/secrets"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/tracing"
)

// signalStore is what the signaler needs of the state store.
type signalStore interface {
	ApplySignal(ctx context.Context, sig statestore.Signal) (statestore.SignalOutcome, error)
	OrdersByKeyIn(ctx context.Context, workflow string, where map[string]any, limit int, namespaces []string) ([]string, error)
	NamespaceOf(ctx context.Context, orderID string) (string, bool, error)
	Callback(ctx context.Context, c statestore.Callback) (statestore.CallbackOutcome, error)
	service.Teller
}

// signaler applies the signals of the signals queue: each ends the wait
// step of its order that awaits it, or is kept until that wait begins, or
// is refused: dead-lettered with the reason and, when it names a
// reply_to, a status event "rejected" sent there.
type signaler struct {
	store       signalStore
	me          string
	workCtx     context.Context
	logger      *slog.Logger
	metrics     *metrics
	tr          *tracing.Tracing
	wakeClaimer func()
	wakeRelay   func()
	// tokens reads the step tokens of callbacks.
	tokens steptoken.Key
	// redact hides credentials (and the scheduler's own secrets), in any
	// encoding, in what a service's callback says before it is kept: a
	// callback comes from the service itself, not through an agent.
	redact *secrets.Redactor
	// grants are the namespaces each broker login may signal in
	// (SAS_SUBMITTER_NAMESPACES); exists says whether a namespace does.
	grants intake.BrokerGrants
	exists func(ctx context.Context, ns string) (bool, error)
}

// The reasons a callback is refused for (x-error-reason).
const (
	// ReasonInvalidToken: the token is not one sas made, or not for the
	// order the signal names.
	ReasonInvalidToken = "invalid_token"
	// ReasonStaleToken: the token's attempt is not the step's running one
	// (a later attempt runs, or the step ended): nothing changed.
	ReasonStaleToken = "stale_token"
)

func (g *signaler) handler() broker.Handler {
	return broker.Chain(broker.Decoded(messages.DecodeSignal, g.unreadable, g.handle), broker.Failpoints(), broker.Traced(g.tr))
}

// handle applies a signal in the namespace it acts in (its header's,
// granted to its publisher's login, else default): it reaches only that
// namespace's orders, and a refusal is that namespace's dead letter. A
// callback's step token is its own credential.
func (g *signaler) handle(ctx context.Context, m broker.Message, sig messages.Signal) error {
	if sig.Token != "" {
		return g.callback(ctx, m, sig)
	}
	ns, reason, detail, err := g.namespaceOf(ctx, m)
	if err != nil {
		return err // the namespaces could not be read: back to the queue
	}
	if reason != "" {
		g.metrics.signals.WithLabelValues("refused").Inc()
		g.logger.Info("signal refused", "reason", reason, "detail", detail)
		return g.refuse(sig.OrderID, sig.ReplyTo, messages.CorrelationID(m.CorrelationID), reason, detail)
	}
	if sig.ByKey() {
		return broker.InNamespace(g.byKey(ctx, m, sig, ns), ns)
	}
	return g.apply(ctx, m, sig, ns)
}

// namespaceOf is the namespace a signal acts in. An application's (one
// that came through the signals queue's exchange) acts in the namespace
// its header names when its login was granted it, else in default. One
// of sas's own publishers (through the default exchange: the API, the
// console, sasctl, which checked the order's namespace against their
// caller's) acts in any ("").
func (g *signaler) namespaceOf(ctx context.Context, m broker.Message) (ns, reason, detail string, err error) {
	if m.Via == "" {
		return "", "", "", nil
	}
	return g.grants.Resolve(ctx, m.Headers, m.UserID, "signal orders of", g.exists)
}

// MaxSignalledByKey bounds the orders one signal by business key with
// all reaches.
const MaxSignalledByKey = 1000

// byKey applies a signal that names its order by business key: to the
// one running order of its workflow whose search attributes have its
// values, or to each with all; none, or several without all, is refused
// with why (no_match, ambiguous). Each order gets it under the id
// SIGNAL_ID:ORDER_ID, so that a repeat is applied once to each.
func (g *signaler) byKey(ctx context.Context, m broker.Message, sig messages.Signal, ns string) error {
	corr := messages.CorrelationID(m.CorrelationID)
	limit := 2
	if sig.All {
		limit = MaxSignalledByKey
	}
	var ids []string
	err := service.Retry(ctx, func() error {
		var err error
		ids, err = g.store.OrdersByKeyIn(g.workCtx, sig.Workflow, sig.Where, limit, namespaceList(ns))
		return err
	}, func(err error) bool {
		return errors.Is(err, statestore.ErrInvalidData) || g.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		g.metrics.dbRetries.Inc()
		g.logger.Warn("finding a signal's orders by key failed, retrying", "err", err, "retry_in", wait)
	})
	switch {
	case errors.Is(err, statestore.ErrInvalidData):
		g.metrics.signals.WithLabelValues("refused").Inc()
		return g.refuse("", sig.ReplyTo, corr, messages.ReasonInvalidValue, err.Error())
	case err != nil:
		return err // shutting down: back to the queue
	case len(ids) == 0:
		g.metrics.signals.WithLabelValues("refused").Inc()
		return g.refuse("", sig.ReplyTo, corr, statestore.SignalNoMatch,
			"no running order of workflow "+sig.Workflow+" has those search attribute values")
	case len(ids) > 1 && !sig.All:
		g.metrics.signals.WithLabelValues("refused").Inc()
		return g.refuse("", sig.ReplyTo, corr, statestore.SignalAmbiguous,
			"several running orders of workflow "+sig.Workflow+" have those search attribute values; name one by order_id, or send all: true")
	}
	var first error
	for _, id := range ids {
		one := sig
		one.OrderID, one.SignalID, one.Workflow, one.Where, one.All = id, sig.SignalID+":"+id, "", nil, false
		if err := g.apply(ctx, m, one, ns); err != nil && first == nil {
			first = err
		}
	}
	if len(ids) == 1 {
		return first
	}
	var rej *broker.Rejection
	if errors.As(first, &rej) {
		return nil // each refusal was told to the reply_to; the others were applied
	}
	return first
}

// namespaceList is ns as a filter: nil for any.
func namespaceList(ns string) []string {
	if ns == "" {
		return nil
	}
	return []string{ns}
}

// apply applies a signal to the order it names, when that order is in
// namespace ns ("": any): one of another is unknown, as one that does not
// exist. A refusal is the order's namespace's dead letter.
func (g *signaler) apply(ctx context.Context, m broker.Message, sig messages.Signal, ns string) error {
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
		if ns != "" {
			own, found, err := g.store.NamespaceOf(g.workCtx, sig.OrderID)
			if err != nil {
				return err
			}
			if !found || own != ns {
				out = statestore.SignalOutcome{Outcome: statestore.SignalUnknownOrder, Detail: "order " + sig.OrderID + " does not exist"}
				return nil
			}
		}
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
		// The dead letter of one of sas's own publishers' signals is its
		// order's namespace's: read only for a refusal.
		stamp := ns
		if stamp == "" {
			if own, found, err := g.store.NamespaceOf(g.workCtx, sig.OrderID); err == nil && found {
				stamp = own
			}
		}
		return broker.InNamespace(g.refuse(sig.OrderID, sig.ReplyTo, messages.CorrelationID(m.CorrelationID), out.Outcome, out.Detail), stamp)
	}
	if out.Outcome == statestore.SignalApplied {
		g.wakeClaimer()
		g.wakeRelay()
	}
	log.Debug("signal", "outcome", out.Outcome, "step", out.Step, "order_status", out.OrderStatus)
	return nil
}

// callback applies a step's callback: the service that answered its call
// 202 Accepted completes or fails the step, or holds it open. The token
// names the attempt; the state store fences it as a reply.
func (g *signaler) callback(ctx context.Context, m broker.Message, sig messages.Signal) error {
	corr := messages.CorrelationID(m.CorrelationID)
	ref, err := g.tokens.Read(sig.Token)
	if err == nil && sig.OrderID != "" && sig.OrderID != ref.OrderID {
		err = errors.New("the token is for another order than the signal's order_id")
	}
	if err != nil {
		g.metrics.signals.WithLabelValues("refused").Inc()
		orderID := sig.OrderID
		if orderID == "" {
			// Only to say which order the refusal is of, when the token
			// names one ("" when it names none: the refusal is told
			// without one).
			orderID, _ = messages.CanonicalID(steptoken.OrderOf(sig.Token))
		}
		g.logger.Info("callback refused", "reason", ReasonInvalidToken, "order_id", orderID)
		return g.refuse(orderID, sig.ReplyTo, corr, ReasonInvalidToken, err.Error())
	}
	actx, span := g.tr.Start(tracing.RemoteParent(g.workCtx, ctx), "callback "+sig.Name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(tracing.StepAttrs(ref.OrderID, ref.Step, ref.Attempt)...))
	defer span.End()
	log := g.logger.With(append([]any{"order_id", ref.OrderID, "step", ref.Step, "attempt", ref.Attempt, "callback", sig.Name},
		tracing.LogAttrs(actx)...)...)
	actor := "callback"
	if sig.By != "" {
		actor = "callback:" + sig.By
	}
	cb := statestore.Callback{Token: sig.Token, Name: sig.Name, SignalID: sig.SignalID, Actor: actor}
	if sig.Name == messages.CallbackComplete && len(sig.Payload) > 0 && string(sig.Payload) != "null" {
		cb.Result = g.redact.JSON(sig.Payload)
	}
	if sig.Name == messages.CallbackFail {
		cb.Error = g.redact.String(sig.Error)
	}
	var out statestore.CallbackOutcome
	err = service.Retry(ctx, func() error {
		var err error
		out, err = g.store.Callback(g.workCtx, cb)
		return err
	}, func(err error) bool {
		return errors.Is(err, statestore.ErrInvalidData) || g.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		g.metrics.dbRetries.Inc()
		log.Warn("applying a callback failed, retrying", "err", err, "retry_in", wait)
	})
	switch {
	case errors.Is(err, statestore.ErrInvalidData):
		g.metrics.signals.WithLabelValues("refused").Inc()
		return g.refuse(ref.OrderID, sig.ReplyTo, corr, messages.ReasonInvalidValue, err.Error())
	case err != nil:
		return err // shutting down: back to the queue
	}
	switch out.Outcome {
	case statestore.CallbackStaleToken, statestore.CallbackInvalidToken:
		g.metrics.signals.WithLabelValues("refused").Inc()
		span.SetAttributes(attribute.String("sas.outcome", out.Outcome))
		log.Info("callback refused; nothing changed", "reason", out.Outcome, "detail", out.Detail)
		return g.refuse(ref.OrderID, sig.ReplyTo, corr, out.Outcome, out.Detail)
	}
	outcome := out.Outcome
	g.metrics.signals.WithLabelValues(outcome).Inc()
	span.SetAttributes(attribute.String("sas.outcome", outcome))
	if sig.Name != messages.CallbackHeartbeat && outcome == statestore.SignalApplied {
		g.wakeClaimer()
		g.wakeRelay()
	}
	log.Debug("callback", "outcome", outcome)
	return nil
}

// refuse dead-letters a signal and tells its reply_to queue, if it named
// one (service.Refuse).
func (g *signaler) refuse(orderID, replyTo, corr, reason, detail string) error {
	return service.Refuse(g.workCtx, g.store, g.logger, orderID, replyTo, corr, reason, detail, g.wakeRelay)
}

// unreadable refuses a signal or callback whose body could not be read as
// one, with the decoder's reason; if the body still names a reply_to,
// that queue is told as for any refusal (with the order its order_id or
// its token names, if any).
func (g *signaler) unreadable(ctx context.Context, m broker.Message, err error) error {
	g.metrics.signals.WithLabelValues("refused").Inc()
	rej := broker.RejectFor(err, messages.ReasonInvalidValue).(*broker.Rejection)
	// An application's unreadable signal in a namespace its login was
	// granted is that namespace's dead letter.
	if m.Via != "" {
		if ns, reason, _, nerr := g.namespaceOf(ctx, m); nerr == nil && reason == "" {
			rej.Namespace = ns
		}
	}
	if orderID, replyTo, ok := messages.RefusedRefOf(m.Body); ok {
		if orderID == "" {
			var ref struct {
				Token string `json:"token"`
			}
			if json.Unmarshal(m.Body, &ref) == nil {
				orderID, _ = messages.CanonicalID(steptoken.OrderOf(ref.Token))
			}
		}
		return broker.InNamespace(g.refuse(orderID, replyTo, messages.CorrelationID(m.CorrelationID), rej.Reason, rej.Detail), rej.Namespace)
	}
	return rej
}
