package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SweepParams configures one sweep of expired steps.
type SweepParams struct {
	// Actor is who sweeps (the supervisor's id), recorded in the history.
	Actor string
	// Limit caps the steps handled in one statement.
	Limit int
	// BackoffBase and BackoffMax shape the delay before a reset step may be
	// claimed again: BackoffBase * 2^(failure_count-1), at most BackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Lease, when set, fences the sweep: it changes nothing unless Actor
	// holds this lease unexpired on the database clock, so a leader that
	// was paused past its lease cannot sweep when it resumes.
	Lease string
}

// SweptStep is one expired step the sweep handled.
type SweptStep struct {
	OrderID      string
	Step         int
	Attempt      int
	FailureCount int
	// NewState is pending (reset for another attempt), error (the
	// failure threshold was reached) or, for a branch of a graph whose
	// order no longer runs, cancelled.
	NewState string
	// OrderStatus is, for a step now in error, its order's status after
	// the failure policy: error (held, alert raised), compensating or
	// failed.
	OrderStatus string
	// Traceparent is the order's trace context (W3C), "" when it has
	// none.
	Traceparent string
	// LastAnswer is the step's service's last answer, when one was noted.
	LastAnswer string
	// halted: an action of a graph whose order no longer runs.
	halted bool
}

// sweepSQL finds processing steps whose complete_by has passed on the
// database clock and, in one statement, increments failure_count and either
// resets them to pending with a backoff or, at the threshold, marks them
// error (SweepExpired then applies the order's failure policy).
//
// Two concurrent sweeps never count one expiry twice: rows are picked with
// FOR UPDATE SKIP LOCKED, and when a row was changed by a sweep that
// committed after this one's snapshot, the UPDATE re-checks its WHERE clause
// against the new version, which is no longer processing.
//
// A step's order row is locked with it (a step at its threshold moves its
// order), also skipping what is locked: an order held by a stuck
// transaction is left for a later sweep instead of holding this one up.
const sweepSQL = `
WITH expired AS (
    SELECT s.order_id, s.step
    FROM steps s JOIN orders o ON o.order_id = s.order_id
    WHERE s.process_state = 'processing' AND s.complete_by < now()
      AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id))
      AND ($5::text = '' OR EXISTS (SELECT 1 FROM leases
                                  WHERE name = $5 AND holder = $1 AND expires_at > now()))
    ORDER BY s.complete_by
    LIMIT $2
    FOR UPDATE OF s, o SKIP LOCKED
), swept AS (
    UPDATE steps s
    SET failure_count = s.failure_count + 1,
        process_state = CASE WHEN s.failure_count + 1 >= s.max_failures THEN 'error' ELSE 'pending' END,
        locked_by = NULL,
        complete_by = NULL,
        available_at = now() + make_interval(secs => least(
            coalesce(extract(epoch FROM s.backoff_max)::float8, $4::float8),
            coalesce(extract(epoch FROM s.backoff_base)::float8, $3::float8) * power(2, s.failure_count))),
        last_error = 'complete_by passed at attempt ' || s.attempt,
        updated_at = now(),
        moves = s.moves + 1, moved_by = $1,
        moved_why = 'complete_by passed; failure ' || (s.failure_count + 1) || ' of ' || s.max_failures
    FROM expired
    WHERE s.order_id = expired.order_id AND s.step = expired.step
      AND s.process_state = 'processing' AND s.complete_by < now()
    RETURNING s.order_id, s.step, s.attempt, s.failure_count, s.max_failures, s.process_state, s.last_answer,
              s.needs IS NOT NULL AND s.kind = 'action' AS graph_action
)
SELECT sw.order_id::text, sw.step, sw.attempt, sw.failure_count, sw.process_state, coalesce(o.traceparent, ''),
       coalesce(sw.last_answer, ''), sw.graph_action AND o.status NOT IN ('received', 'processing')
FROM swept sw JOIN orders o ON o.order_id = sw.order_id ORDER BY sw.order_id, sw.step`

// SweepExpired handles up to p.Limit expired steps and returns them. In
// the same transaction, a step that reached its threshold gets its order's
// failure policy applied (see the step_failed function).
func (s *Store) SweepExpired(ctx context.Context, p SweepParams) ([]SweptStep, error) {
	if p.Actor == "" || p.Limit <= 0 {
		return nil, fmt.Errorf("sweep expired: need an actor and a positive limit")
	}
	var swept []SweptStep
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sweepSQL, p.Actor, p.Limit, p.BackoffBase.Seconds(), p.BackoffMax.Seconds(), p.Lease)
		if err != nil {
			return err
		}
		swept, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (SweptStep, error) {
			var st SweptStep
			err := row.Scan(&st.OrderID, &st.Step, &st.Attempt, &st.FailureCount, &st.NewState, &st.Traceparent, &st.LastAnswer, &st.halted)
			return st, err
		})
		if err != nil {
			return err
		}
		for i, st := range swept {
			if st.halted && st.NewState == StepPending {
				// A branch of a graph whose order no longer runs is not
				// tried again: it is cancelled, and its compensation may
				// run (step_halted).
				if err := tx.QueryRow(ctx, `SELECT step_halted($1, $2, $3)`, st.OrderID, st.Step, p.Actor).Scan(&swept[i].OrderStatus); err != nil {
					return err
				}
				swept[i].NewState = StepCancelled
				continue
			}
			if st.NewState != StepError {
				continue
			}
			reason := fmt.Sprintf("failure threshold reached: complete_by passed %d times", st.FailureCount)
			if st.LastAnswer != "" {
				reason += "; the service's last answer: " + st.LastAnswer
			}
			if err := tx.QueryRow(ctx, `SELECT step_failed($1, $2, $3, $4, $5)`, st.OrderID, st.Step, p.Actor, reason, st.FailureCount).
				Scan(&swept[i].OrderStatus); err != nil {
				return err
			}
		}
		if len(swept) == 0 {
			return nil
		}
		return wake(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("sweep expired: %w", err)
	}
	return swept, nil
}
