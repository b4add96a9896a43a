package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/failpoint"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
)

// replier applies StepReplies from the shared replies queue.
type replier struct {
	store *statestore.Store
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
	// dispatch sends the requests of steps claimed with a reply, as the
	// claimer sends those it claims.
	dispatch func([]statestore.ClaimedStep)
}

// handle applies one reply. A stale or late reply is acked and counted:
// the fence in the state store already made sure it changed nothing.
func (r *replier) handle(ctx context.Context, d amqp.Delivery) error {
	failpoint.Panic("panic-on-message", d.MessageId)
	if err := messages.CheckContentType(d.ContentType); err != nil {
		return r.reject(err)
	}
	rep, err := messages.DecodeStepReply(d.Body)
	if err != nil {
		return r.reject(err)
	}
	log := r.logger.With("order_id", rep.OrderID, "step", rep.Step, "attempt", rep.Attempt)
	var res statestore.ApplyResult
	reply := statestore.Reply{
		OrderID: rep.OrderID, Step: rep.Step, Attempt: rep.Attempt,
		OK: rep.Outcome == messages.OutcomeOK, Result: rep.Result, Error: rep.Error, Actor: r.me,
		AgentStartedAt: rep.StartedAt, AgentSentAt: rep.SentAt, AgentCallMicros: rep.CallMicros,
	}
	// A reply whose rows another transaction holds is tried again on its
	// own, off the batch writer, so that waiting for it holds up no other
	// reply.
	alone := false
	err = service.Retry(ctx, func() error {
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
		log.Info("stale reply ignored", "kind", stale.Kind, "reason", stale.Reason)
		return nil
	case err != nil:
		return err // shutting down: back to the queue
	}
	if (res.NextStep > 0 && res.Claimed == nil) || res.OrderStatus == statestore.OrderCompensating {
		r.wakeClaimer()
	}
	if res.OrderStatus != "" {
		r.wakeRelay()
	}
	if res.Claimed != nil {
		r.metrics.claimed.Inc()
		r.metrics.claimedByReply.Inc()
		failpoint.Inject("scheduler-after-claim")
		r.dispatch([]statestore.ClaimedStep{*res.Claimed})
	}
	r.metrics.replies.WithLabelValues(res.StepState).Inc()
	r.metrics.stepDuration.WithLabelValues(res.StepName, rep.Outcome).Observe(res.StepTook.Seconds())
	if res.OrderTook > 0 {
		r.metrics.ordersFinished.WithLabelValues(res.OrderStatus).Inc()
		r.metrics.orderDuration.WithLabelValues(res.OrderStatus).Observe(res.OrderTook.Seconds())
	}
	log.Debug("reply applied", "step_state", res.StepState, "next_step", res.NextStep, "order_status", res.OrderStatus)
	return nil
}

func (r *replier) reject(err error) error {
	r.metrics.replies.WithLabelValues("rejected").Inc()
	return broker.RejectFor(err, messages.ReasonInvalidValue)
}
