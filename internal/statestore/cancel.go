package statestore

import (
	"context"
	"fmt"
)

// CancelOrder is an operator ending an order that has not ended on its own
// (received, processing, or held in error), whatever its failure policy:
// its unfinished actions are cancelled (a reply still on its way then
// changes nothing) and the compensations of every action that was
// attempted run, last first; the order becomes compensating, or failed at
// once when nothing was attempted. It returns the order's new status.
// Unknown ids give ErrNotFound; an order that has ended, is already being
// compensated, or whose compensation failed (resubmit that instead) gives
// ErrInvalidState. The history records the login and claimed as Resubmit
// does.
func (s *Store) CancelOrder(ctx context.Context, orderID, claimed string) (string, error) {
	var status string
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT operator_cancel($1, $2)`, orderID, claimed).Scan(&status)
	}); err != nil {
		return "", fmt.Errorf("cancel: %w", operatorError(err))
	}
	return status, nil
}
