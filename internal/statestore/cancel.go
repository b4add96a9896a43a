package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CancelOrder is an operator ending an order that has not ended on its own
// (received, processing, or held in error), whatever its failure policy:
// its unfinished actions are cancelled (a reply still on its way then
// changes nothing) and the compensations of every action that was
// attempted run, last first; the order becomes compensating, or failed at
// once when nothing was attempted. It returns the order's new status.
// Unknown ids give ErrNotFound; an order that has ended, is already being
// compensated, or whose compensation failed (resubmit that instead) gives
// ErrInvalidState.
func (s *Store) CancelOrder(ctx context.Context, orderID, actor string) (string, error) {
	var status string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, orderID).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("order %s: %w", orderID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		switch status {
		case OrderReceived, OrderProcessing:
		case OrderError:
			var failedCompensation bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM steps WHERE order_id = $1 AND kind = 'compensation' AND process_state = 'error')`,
				orderID).Scan(&failedCompensation); err != nil {
				return err
			}
			if failedCompensation {
				return fmt.Errorf("order %s: a compensation failed; fix the cause and resubmit it: %w", orderID, ErrInvalidState)
			}
		default:
			return fmt.Errorf("order %s is %s already; only an order that has not ended can be cancelled: %w", orderID, status, ErrInvalidState)
		}
		if err := tx.QueryRow(ctx, `SELECT begin_compensation($1, NULL, $2, 'operator cancel')`, orderID, actor).Scan(&status); err != nil {
			return err
		}
		return wake(ctx, tx)
	})
	if err != nil {
		return "", fmt.Errorf("cancel: %w", err)
	}
	return status, nil
}
