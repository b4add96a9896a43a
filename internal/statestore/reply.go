package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
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
	// NextStep is the step made pending by this reply, or 0.
	NextStep int
	// OrderStatus is the order's new status if the reply ended it
	// (completed or error), or "".
	OrderStatus string
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

// applyReplySQL applies a reply only if it is for the current attempt, the
// step is still processing and its complete_by has not passed on the
// database clock. In the same statement it makes the next step pending, or
// ends the order (completed after its last step, error on a failed reply),
// and writes the history, the status event and, on error, an operator
// alert.
const applyReplySQL = `
WITH cur AS (
    UPDATE steps
    SET process_state = CASE WHEN $4 THEN 'processed' ELSE 'error' END,
        result = $5,
        last_error = NULLIF($6, ''),
        updated_at = now()
    WHERE order_id = $1 AND step = $2 AND attempt = $3
      AND process_state = 'processing' AND complete_by >= now()
    RETURNING order_id, step, attempt, process_state, failure_count
), cur_hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT order_id, step, 'processing', process_state, attempt, $7,
           CASE WHEN process_state = 'processed' THEN 'agent replied ok' ELSE 'agent replied failed: ' || $6 END
    FROM cur
), nxt AS (
    UPDATE steps s
    SET process_state = 'pending', available_at = now(), updated_at = now()
    FROM cur
    WHERE cur.process_state = 'processed'
      AND s.order_id = cur.order_id AND s.step = cur.step + 1
      AND s.kind = 'action' AND s.process_state = 'waiting'
    RETURNING s.order_id, s.step
), nxt_hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    SELECT order_id, step, 'waiting', 'pending', $7, 'previous step processed'
    FROM nxt
), ended AS (
    UPDATE orders o
    SET status = CASE WHEN cur.process_state = 'error' THEN 'error' ELSE 'completed' END,
        updated_at = now()
    FROM cur
    WHERE o.order_id = cur.order_id
      AND o.status IN ('received', 'processing')
      AND (cur.process_state = 'error'
           OR NOT EXISTS (SELECT 1 FROM steps w
                          WHERE w.order_id = cur.order_id AND w.kind = 'action' AND w.step > cur.step))
    RETURNING o.order_id, o.status, o.reply_to, cur.step, cur.failure_count
), ended_hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    SELECT order_id, NULL, 'processing', status, $7,
           CASE WHEN status = 'completed' THEN 'last step processed' ELSE 'step ' || step || ' failed' END
    FROM ended
), ended_ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    SELECT 'status_event', order_id, reply_to,
           status_event_body(ended.order_id, ended.status, CASE WHEN ended.status = 'error' THEN ended.step END)
    FROM ended
), alert AS (
    INSERT INTO outbox (message_type, order_id, body)
    SELECT 'operator_alert', order_id,
           operator_alert_body(ended.order_id, ended.step, 'agent replied failed: ' || $6, ended.failure_count)
    FROM ended
    WHERE status = 'error'
)
SELECT cur.process_state,
       coalesce((SELECT step FROM nxt), 0),
       coalesce((SELECT status FROM ended), '')
FROM cur`

// ApplyReply applies an agent's reply, fenced by attempt, state and
// complete_by. A reply that is not for the current attempt, or that comes
// after the step left processing or after complete_by, changes nothing and
// returns a *StaleReplyError (errors.Is(err, ErrStale)).
func (s *Store) ApplyReply(ctx context.Context, r Reply) (ApplyResult, error) {
	var res ApplyResult
	err := s.pool.QueryRow(ctx, applyReplySQL, r.OrderID, r.Step, r.Attempt, r.OK, r.Result, r.Error, r.Actor).
		Scan(&res.StepState, &res.NextStep, &res.OrderStatus)
	if err == nil {
		return res, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
	}
	return res, s.staleReason(ctx, r)
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
