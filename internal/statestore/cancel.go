package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CancelOrder is an operator ending an order that has not ended on its own
// (received, processing, or held in error): every step not yet processed
// is cancelled, so a reply still on its way finds it no longer processing
// and changes nothing, and the order becomes failed. It returns the steps
// it cancelled. Unknown ids give ErrNotFound; an order already completed
// or failed gives ErrInvalidState.
//
// Steps already processed are not undone here: undoing them is the
// compensation the workflow defines.
func (s *Store) CancelOrder(ctx context.Context, orderID, actor string) ([]int, error) {
	var cancelled []int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, orderID).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("order %s: %w", orderID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		switch status {
		case OrderReceived, OrderProcessing, OrderError:
		default:
			return fmt.Errorf("order %s is %s already; only an order that has not ended can be cancelled: %w", orderID, status, ErrInvalidState)
		}
		rows, err := tx.Query(ctx, `
			WITH old AS (
			    SELECT order_id, step, process_state, attempt FROM steps
			    WHERE order_id = $1 AND process_state IN ('waiting', 'pending', 'processing', 'error')
			    FOR UPDATE
			), upd AS (
			    UPDATE steps s SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, updated_at = now()
			    FROM old WHERE s.order_id = old.order_id AND s.step = old.step
			    RETURNING s.step
			), hist AS (
			    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
			    SELECT order_id, step, process_state, 'cancelled', attempt, $2, 'operator cancel' FROM old
			)
			SELECT step FROM upd ORDER BY step`, orderID, actor)
		if err != nil {
			return err
		}
		cancelled, err = pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `
			WITH upd AS (
			    UPDATE orders SET status = 'failed', updated_at = now() WHERE order_id = $1
			    RETURNING order_id, reply_to
			), hist AS (
			    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
			    SELECT order_id, NULL, $3, 'failed', $2, 'operator cancel' FROM upd
			)
			INSERT INTO outbox (message_type, order_id, reply_to, body)
			SELECT 'status_event', order_id, reply_to, status_event_body(order_id, 'failed', NULL) FROM upd`,
			orderID, actor, status)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cancel: %w", err)
	}
	return cancelled, nil
}
