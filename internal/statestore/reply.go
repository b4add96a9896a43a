package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// applyReplySQL records a reply on its step, only if it is for the current
// attempt, the step is still processing and its complete_by has not passed
// on the database clock.
const applyReplySQL = `
WITH cur AS (
    UPDATE steps
    SET process_state = CASE WHEN $4 THEN 'processed' ELSE 'error' END,
        result = $5,
        last_error = NULLIF($6, ''),
        updated_at = now()
    WHERE order_id = $1 AND step = $2 AND attempt = $3
      AND process_state = 'processing' AND complete_by >= now()
    RETURNING order_id, step, attempt, process_state, failure_count, name,
              extract(epoch FROM now() - (complete_by - timeout)) AS took
), cur_hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT order_id, step, 'processing', process_state, attempt, $7,
           CASE WHEN process_state = 'processed' THEN 'agent replied ok' ELSE 'agent replied failed: ' || $6 END
    FROM cur
)
SELECT process_state, failure_count, name, took FROM cur`

// ApplyReply applies an agent's reply, fenced by attempt, state and
// complete_by, and in the same transaction moves the order on (the next
// step, or the order's end) or reacts to the failure (the order's failure
// policy; see the step_failed function). A reply that is not for the
// current attempt, or comes after the step left processing or after
// complete_by, changes nothing and returns a *StaleReplyError
// (errors.Is(err, ErrStale)).
func (s *Store) ApplyReply(ctx context.Context, r Reply) (ApplyResult, error) {
	var res ApplyResult
	applied := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var failures int
		var took float64
		sql := applyReplySQL
		if failpoint.Broken("unfenced-replies") {
			// Negative control for the fault suite: no fence at all
			// (attempt, state, deadline).
			sql = strings.Replace(sql, "AND attempt = $3\n      AND process_state = 'processing' AND complete_by >= now()",
				"AND $3::int > 0", 1)
		}
		err := tx.QueryRow(ctx, sql, r.OrderID, r.Step, r.Attempt, r.OK, r.Result, r.Error, r.Actor).
			Scan(&res.StepState, &failures, &res.StepName, &took)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		applied = true
		res.StepTook = time.Duration(took * float64(time.Second))
		if r.OK {
			err = tx.QueryRow(ctx, `SELECT next_step, order_status FROM step_processed($1, $2, $3)`, r.OrderID, r.Step, r.Actor).
				Scan(&res.NextStep, &res.OrderStatus)
		} else {
			err = tx.QueryRow(ctx, `SELECT step_failed($1, $2, $3, $4, $5)`, r.OrderID, r.Step, r.Actor, "agent replied failed: "+r.Error, failures).
				Scan(&res.OrderStatus)
		}
		if err != nil || !orderEnded(res.OrderStatus) {
			return err
		}
		var age float64
		err = tx.QueryRow(ctx, `SELECT extract(epoch FROM now() - created_at) FROM orders WHERE order_id = $1`, r.OrderID).Scan(&age)
		res.OrderTook = time.Duration(age * float64(time.Second))
		return err
	})
	if err != nil {
		return res, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
	}
	if !applied {
		return res, s.staleReason(ctx, r)
	}
	return res, nil
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
