package scheduler

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/failpoint"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// replyStore is what the replier needs of the state store: applying a
// reply on its own, keeping an abandoned attempt's last answer, and
// holding open an attempt its service accepted.
type replyStore interface {
	ApplyReply(ctx context.Context, r statestore.Reply) (statestore.ApplyResult, error)
	NoteAnswer(ctx context.Context, orderID string, step, attempt int, answer string) (bool, error)
	HoldStep(ctx context.Context, h statestore.Hold) (time.Time, error)
	LowerRateOf(ctx context.Context, orderID string, step int, retryAfter time.Duration) (kind string, rate float64, lowered bool, err error)
}

// replier applies StepReplies from the shared replies queue.
type replier struct {
	store replyStore
	// applies gathers the replies handled at the same time into one
	// transaction (statestore.ApplyReplies).
	applies *batch.Batcher[statestore.Reply, statestore.ApplyResult]
	me      string
	workCtx context.Context
	logger  *slog.Logger
	metrics *metrics
	// wakeClaimer and wakeRelay nudge this scheduler's claimer (a step
	// became pending) and relay (status events were written).
	wakeClaimer, wakeRelay func()
	// publishHeld hands the relay a status event held for it to publish
	// (statestore.ApplyRepliesPublishing); false if it could not.
	publishHeld func(context.Context, statestore.OutboxMessage) bool
	// dispatch sends the requests of steps claimed with a reply, as the
	// claimer sends those it claims.
	dispatch func([]statestore.ClaimedStep, time.Time)
	tr       *tracing.Tracing
}

// handler is the replier's handler with its middleware: failpoints,
// the trace context, then the content type and the body decoded, a
// refused reply failing the attempt it names (failRefused).
func (r *replier) handler() broker.Handler {
	return broker.Chain(broker.Decoded(messages.DecodeStepReply, r.refused, r.handle), broker.Failpoints(), broker.Traced(r.tr))
}

// handle applies one reply. A stale or late reply is acked and counted:
// the fence in the state store already made sure it changed nothing.
func (r *replier) handle(ctx context.Context, _ broker.Message, rep messages.StepReply) error {
	// The apply is a span of the order's trace, a child of the agent's
	// reply when its message carries the trace context; it runs under
	// workCtx, so SIGTERM lets it finish.
	actx, span := r.tr.Start(tracing.RemoteParent(r.workCtx, ctx), "apply reply", trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	if r.tr.On() {
		span.SetAttributes(tracing.StepAttrs(rep.OrderID, rep.Step, rep.Attempt, attribute.String("sas.outcome", rep.Outcome))...)
	}
	log := r.logger.With(append([]any{"order_id", rep.OrderID, "step", rep.Step, "attempt", rep.Attempt}, tracing.LogAttrs(actx)...)...)
	switch rep.Outcome {
	case messages.OutcomeAbandoned:
		return r.noteAnswer(rep, log)
	case messages.OutcomeAccepted:
		return r.hold(ctx, rep, log)
	case messages.OutcomeThrottled:
		return r.lowerRate(rep, log)
	}
	applyStart := time.Now()
	var res statestore.ApplyResult
	reply := statestore.Reply{
		OrderID: rep.OrderID, Step: rep.Step, Attempt: rep.Attempt,
		OK: rep.Outcome == messages.OutcomeOK, Result: rep.Result, Error: rep.Error, LastAnswer: rep.LastAnswer, Actor: r.me,
		AgentStartedAt: rep.StartedAt, AgentSentAt: rep.SentAt, AgentCallMicros: rep.CallMicros,
	}
	// A reply whose rows another transaction holds is tried again on its
	// own, off the batch writer, so that waiting for it holds up no other
	// reply.
	alone := false
	err := service.Retry(ctx, func() error {
		var err error
		if alone {
			res, err = r.store.ApplyReply(r.workCtx, reply)
		} else {
			res, err = r.applies.Do(r.workCtx, reply)
		}
		alone = alone || statestore.IsLockTimeout(err)
		return err
	}, func(err error) bool {
		return errors.Is(err, statestore.ErrStale) || r.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		r.metrics.dbRetries.Inc()
		log.Warn("applying reply failed, retrying", "err", err, "retry_in", wait)
	})
	var stale *statestore.StaleReplyError
	switch {
	case errors.As(err, &stale):
		r.metrics.replies.WithLabelValues("stale").Inc()
		r.metrics.stale.WithLabelValues(stale.Kind).Inc()
		span.SetAttributes(attribute.String("sas.stale", stale.Kind))
		log.Info("stale reply ignored", "kind", stale.Kind, "reason", stale.Reason)
		return nil
	case err != nil:
		return err // shutting down: back to the queue
	}
	if (res.NextStep > 0 && res.Claimed == nil) || res.OrderStatus == statestore.OrderCompensating {
		r.wakeClaimer()
	}
	switch {
	case res.Event != nil:
		// The order's end was held for this scheduler to tell: its
		// relay publishes it, with no round of its own. If that cannot
		// be, a relay takes it once its hold has passed.
		failpoint.StopHere(ctx, "scheduler-stop-before-telling-end")
		if !r.publishHeld(r.workCtx, *res.Event) {
			log.Info("status event left to a relay once its hold passes", "order_status", res.OrderStatus)
		}
	case res.OrderStatus != "":
		r.wakeRelay()
	}
	if res.Claimed != nil {
		r.metrics.claimed.Inc()
		r.metrics.claimedByReply.Inc()
		failpoint.Inject("scheduler-after-claim")
		if r.tr.On() {
			res.Claimed.Traceparent = r.tr.Traceparent(actx)
		}
		r.dispatch([]statestore.ClaimedStep{*res.Claimed}, applyStart)
	}
	if r.tr.On() {
		span.SetAttributes(attribute.String("sas.step_name", res.StepName), attribute.String("sas.step_state", res.StepState))
		if res.OrderStatus != "" {
			span.AddEvent("order " + res.OrderStatus)
		}
	}
	r.metrics.replies.WithLabelValues(res.StepState).Inc()
	// The latency histograms carry the trace as their exemplar.
	tracing.Observe(actx, r.metrics.stepDuration.WithLabelValues(res.StepName, rep.Outcome), res.StepTook.Seconds())
	if res.OrderTook > 0 {
		// The namespace label takes only the namespaces operators made.
		ns := cmp.Or(res.OrderNamespace, statestore.DefaultNamespace)
		r.metrics.ordersFinished.WithLabelValues(res.OrderStatus, ns).Inc()
		tracing.Observe(actx, r.metrics.orderDuration.WithLabelValues(res.OrderStatus, ns), res.OrderTook.Seconds())
	}
	log.Debug("reply applied", "step_state", res.StepState, "next_step", res.NextStep, "order_status", res.OrderStatus)
	return nil
}

// noteAnswer keeps the last answer of an attempt its agent gave up on
// before complete_by. It changes nothing else, and is worth no retry: at
// worst the step shows "complete_by passed" without the service's words.
func (r *replier) noteAnswer(rep messages.StepReply, log *slog.Logger) error {
	kept, err := r.store.NoteAnswer(r.workCtx, rep.OrderID, rep.Step, rep.Attempt, rep.LastAnswer)
	switch {
	case err != nil:
		log.Warn("could not keep the service's last answer", "err", err)
	case kept:
		r.metrics.replies.WithLabelValues("abandoned").Inc()
		log.Debug("service's last answer kept", "last_answer", rep.LastAnswer)
	default:
		r.metrics.replies.WithLabelValues("stale").Inc()
	}
	return nil
}

// lowerRate lowers, for a while, the rate of the agent kind whose service
// answered a step 429 with a Retry-After (statestore.LowerRate): the
// limit every scheduler's claims obey, so the service is asked less
// often by every replica. A kind without a rate is left as it is; the
// agent itself waits out the Retry-After before its next try.
func (r *replier) lowerRate(rep messages.StepReply, log *slog.Logger) error {
	after := time.Duration(rep.RetryAfterMS) * time.Millisecond
	kind, rate, lowered, err := r.store.LowerRateOf(r.workCtx, rep.OrderID, rep.Step, after)
	switch {
	case err != nil:
		log.Warn("could not lower the rate after a 429", "err", err)
	case lowered:
		r.metrics.limitLowered.WithLabelValues(kind).Inc()
		log.Info("a service answered 429: its kind's rate lowered for a while", "kind", kind, "rate", rate, "retry_after", after.String())
	}
	r.metrics.replies.WithLabelValues("throttled").Inc()
	return nil
}

// hold holds open an attempt whose service answered 202 Accepted: the
// step waits for the service's callback (the signaler applies it) until
// its new complete_by. A hold that came after the callback, or for an
// attempt no longer the step's, changes nothing.
func (r *replier) hold(ctx context.Context, rep messages.StepReply, log *slog.Logger) error {
	h := statestore.Hold{OrderID: rep.OrderID, Step: rep.Step, Attempt: rep.Attempt,
		For: time.Duration(rep.HoldMS) * time.Millisecond, Answer: rep.LastAnswer, Actor: r.me}
	if h.Answer == "" {
		h.Answer = "202 Accepted"
	}
	var until time.Time
	err := service.Retry(ctx, func() error {
		var err error
		until, err = r.store.HoldStep(r.workCtx, h)
		return err
	}, func(err error) bool {
		return errors.Is(err, statestore.ErrStale) || r.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		r.metrics.dbRetries.Inc()
		log.Warn("holding an accepted step failed, retrying", "err", err, "retry_in", wait)
	})
	switch {
	case errors.Is(err, statestore.ErrStale):
		r.metrics.replies.WithLabelValues("stale").Inc()
		log.Debug("accepted reply for an attempt that no longer runs", "err", err)
		return nil
	case err != nil:
		return err // shutting down: back to the queue
	}
	r.metrics.replies.WithLabelValues("accepted").Inc()
	log.Debug("service accepted the step; waiting for its callback", "complete_by", until)
	return nil
}

// failRefused fails, for good and with the refusal's reason, the attempt
// a refused reply names, if it still runs: the order learns at once why
// instead of its step running out its time. The reply itself is
// dead-lettered all the same. The fence decides, as for any reply: a
// stale or forged attempt changes nothing.
func (r *replier) failRefused(body []byte, refusal error) {
	orderID, step, attempt, ok := messages.StepRefOf(body)
	if !ok {
		return
	}
	reason := messages.BoundText("the agent's reply could not be read: "+refusal.Error(), messages.MaxReasonBytes)
	res, err := r.store.ApplyReply(r.workCtx, statestore.Reply{OrderID: orderID, Step: step, Attempt: attempt, Error: reason, Actor: r.me})
	log := r.logger.With("order_id", orderID, "step", step, "attempt", attempt)
	switch {
	case errors.Is(err, statestore.ErrStale):
		log.Info("refused reply names no running attempt", "err", err)
	case err != nil:
		log.Warn("could not fail the step of a refused reply; it will run out its time", "err", err)
	default:
		log.Warn("step failed: its reply could not be read", "reason", reason, "order_status", res.OrderStatus)
		r.metrics.replies.WithLabelValues(res.StepState).Inc()
		r.wakeClaimer()
		r.wakeRelay()
	}
}

// refused dead-letters a reply that could not be read, after failing the
// attempt it names, if its body still names one.
func (r *replier) refused(_ context.Context, m broker.Message, err error) error {
	if messages.CheckContentType(m.ContentType) == nil {
		r.failRefused(m.Body, err)
	}
	r.metrics.replies.WithLabelValues("rejected").Inc()
	return broker.RejectFor(err, messages.ReasonInvalidValue)
}
