package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Resubmit is an operator's action on an order held in error: the step in
// error (or the given step, which must be in error) goes back to pending
// with failure_count 0, and the order back to processing (or, when the
// step is a compensation, compensating). It returns the steps it reset. Unknown ids give ErrNotFound; an order or step not in
// error gives ErrInvalidState.
func (s *Store) Resubmit(ctx context.Context, orderID string, step int, actor string) ([]int, error) {
	var reset []int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, orderID).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("order %s: %w", orderID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if status != OrderError {
			return fmt.Errorf("order %s is %s, only an order in error can be resubmitted: %w", orderID, status, ErrInvalidState)
		}
		if step > 0 {
			var state string
			err := tx.QueryRow(ctx, `SELECT process_state FROM steps WHERE order_id = $1 AND step = $2`, orderID, step).Scan(&state)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("order %s step %d: %w", orderID, step, ErrNotFound)
			}
			if err != nil {
				return err
			}
			if state != StepError {
				return fmt.Errorf("order %s step %d is %s, only a step in error can be resubmitted: %w", orderID, step, state, ErrInvalidState)
			}
		}
		rows, err := tx.Query(ctx, `
			WITH reset AS (
			    UPDATE steps
			    SET process_state = 'pending', failure_count = 0, locked_by = NULL, complete_by = NULL,
			        available_at = now(), updated_at = now()
			    WHERE order_id = $1 AND process_state = 'error' AND ($2 = 0 OR step = $2)
			    RETURNING order_id, step, attempt, kind
			), hist AS (
			    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
			    SELECT order_id, step, 'error', 'pending', attempt, $3, 'operator resubmit'
			    FROM reset
			)
			SELECT step, kind FROM reset ORDER BY step`, orderID, step, actor)
		if err != nil {
			return err
		}
		to := OrderProcessing
		reset, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (int, error) {
			var n int
			var kind string
			err := row.Scan(&n, &kind)
			if kind == KindCompensation {
				to = OrderCompensating
			}
			return n, err
		})
		if err != nil {
			return err
		}
		if len(reset) == 0 {
			return fmt.Errorf("order %s has no step in error: %w", orderID, ErrInvalidState)
		}
		if _, err = tx.Exec(ctx, `SELECT order_transition($1, $2, NULL, $3, 'operator resubmit')`, orderID, to, actor); err != nil {
			return err
		}
		return wake(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("resubmit: %w", err)
	}
	return reset, nil
}
