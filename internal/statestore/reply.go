package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/failpoint"
)

// Reply is an agent's answer for one attempt of a step.
type Reply struct {
	OrderID string
	Step    int
	Attempt int
	// OK is true for outcome ok; false means failed for good (the agent
	// saw a permanent fault).
	OK     bool
	Result []byte // JSON, for OK replies; nil otherwise
	Error  string // the reason, for failed replies
	// Actor is who applies the reply (the scheduler's id).
	Actor string
	// The agent's clock readings, if it sent them (see migration 0006):
	// they are stored with the step for the latency breakdown only.
	AgentStartedAt, AgentSentAt *time.Time
	AgentCallMicros             int64
}

// ApplyResult says what an applied reply changed.
type ApplyResult struct {
	// StepState is the step's new state: processed or error.
	StepState string
	// StepName is the step's name (e.g. charge_payment).
	StepName string
	// NextStep is the step made pending by this reply, or 0.
	NextStep int
	// OrderStatus is the order's status after the reply if it changed it
	// (completed, compensating, failed, error), or "" (for a failed reply,
	// the status it has after the policy was applied).
	OrderStatus string
	// StepTook is the time from the step's claim to this reply, and
	// OrderTook, when the reply ended the order, the time from its
	// submission (both on the database clock).
	StepTook  time.Duration
	OrderTook time.Duration
}

// orderEnded reports whether status is one an order ends in.
func orderEnded(status string) bool {
	return status == OrderCompleted || status == OrderFailed || status == OrderError
}

// Kinds of stale reply, few and fixed (they label a metric).
const (
	StaleUnknownStep   = "unknown_step"   // no such order or step
	StaleSuperseded    = "superseded"     // a later attempt owns the step
	StaleNotProcessing = "not_processing" // the step already left processing (e.g. a duplicate reply)
	StaleLate          = "late"           // complete_by had passed
	StaleRace          = "race"           // the step changed while the reply was applied
)

// StaleReplyError says why a reply was not applied. It wraps ErrStale.
type StaleReplyError struct {
	OrderID string
	Step    int
	Attempt int
	Kind    string // one of the Stale constants
	Reason  string // a sentence for logs
}

func (e *StaleReplyError) Error() string {
	return fmt.Sprintf("stale reply for order %s step %d attempt %d: %s", e.OrderID, e.Step, e.Attempt, e.Reason)
}

func (e *StaleReplyError) Unwrap() error { return ErrStale }

// applyReplySQL applies one reply in one round trip (the apply_reply
// function of migration 0008): the fenced update, its history, and the
// order moving on or reacting to a failure.
const applyReplySQL = `SELECT applied, step_state, step_name, took_s, next_step, order_status, order_took_s
FROM apply_reply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

func (r Reply) args() []any {
	// The fault suite's negative control turns the fence off.
	fenced := !failpoint.Broken("unfenced-replies")
	return []any{r.OrderID, r.Step, r.Attempt, r.OK, r.Result, r.Error, r.Actor,
		r.AgentStartedAt, r.AgentSentAt, r.AgentCallMicros, fenced}
}

func scanApplied(row pgx.Row) (ApplyResult, bool, error) {
	var res ApplyResult
	var applied bool
	var took, orderTook float64
	err := row.Scan(&applied, &res.StepState, &res.StepName, &took, &res.NextStep, &res.OrderStatus, &orderTook)
	res.StepTook = time.Duration(took * float64(time.Second))
	res.OrderTook = time.Duration(orderTook * float64(time.Second))
	return res, applied, err
}

// ApplyReply applies an agent's reply, fenced by attempt, state and
// complete_by, and in the same transaction moves the order on (the next
// step, or the order's end) or reacts to the failure (the order's failure
// policy; see the step_failed function). A reply that is not for the
// current attempt, or comes after the step left processing or after
// complete_by, changes nothing and returns a *StaleReplyError
// (errors.Is(err, ErrStale)).
func (s *Store) ApplyReply(ctx context.Context, r Reply) (ApplyResult, error) {
	res, applied, err := scanApplied(s.pool.QueryRow(ctx, applyReplySQL, r.args()...))
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
	}
	if !applied {
		return ApplyResult{}, s.staleReason(ctx, r)
	}
	return res, nil
}

// ApplyReplies applies many replies in one transaction and one round trip,
// each as ApplyReply would; results and errors are by index. If the
// transaction fails as a whole (a database error, a deadlock between
// concurrent batches), every reply is applied again on its own, so one
// reply's trouble never holds up the others.
func (s *Store) ApplyReplies(ctx context.Context, rs []Reply) ([]ApplyResult, []error) {
	results := make([]ApplyResult, len(rs))
	errs := make([]error, len(rs))
	applied := make([]bool, len(rs))
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		for _, r := range rs {
			batch.Queue(applyReplySQL, r.args()...)
		}
		br := tx.SendBatch(ctx, batch)
		for i := range rs {
			var err error
			results[i], applied[i], err = scanApplied(br.QueryRow())
			if err != nil {
				br.Close()
				return err
			}
		}
		return br.Close()
	})
	if err != nil {
		if len(rs) == 1 || ctx.Err() != nil {
			for i, r := range rs {
				results[i], errs[i] = ApplyResult{}, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
			}
			return results, errs
		}
		for i, r := range rs {
			results[i], errs[i] = s.ApplyReply(ctx, r)
		}
		return results, errs
	}
	for i, r := range rs {
		if !applied[i] {
			results[i], errs[i] = ApplyResult{}, s.staleReason(ctx, r)
		}
	}
	return results, errs
}

// staleReason explains a reply that matched no row. It only informs: the
// decision was made by the fenced update.
func (s *Store) staleReason(ctx context.Context, r Reply) error {
	stale := &StaleReplyError{OrderID: r.OrderID, Step: r.Step, Attempt: r.Attempt}
	var attempt int
	var state string
	var inTime bool
	err := s.pool.QueryRow(ctx,
		`SELECT attempt, process_state, coalesce(complete_by >= now(), false) FROM steps WHERE order_id = $1 AND step = $2`,
		r.OrderID, r.Step).Scan(&attempt, &state, &inTime)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		stale.Kind, stale.Reason = StaleUnknownStep, "no such step"
	case err != nil:
		stale.Kind, stale.Reason = StaleRace, "unknown ("+err.Error()+")"
	case attempt != r.Attempt:
		stale.Kind, stale.Reason = StaleSuperseded, fmt.Sprintf("attempt superseded (current attempt %d)", attempt)
	case state != StepProcessing:
		stale.Kind, stale.Reason = StaleNotProcessing, "step is "+state
	case !inTime:
		stale.Kind, stale.Reason = StaleLate, "complete_by has passed"
	default:
		stale.Kind, stale.Reason = StaleRace, "step changed concurrently"
	}
	return stale
}
