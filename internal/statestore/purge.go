package statestore

import (
	"context"
	"fmt"
	"time"
)

// Purged counts the rows one purge deleted, by table.
type Purged struct {
	Orders, Steps, Transitions, Alerts int64
}

// Add adds o's counts to p.
func (p *Purged) Add(o Purged) {
	p.Orders += o.Orders
	p.Steps += o.Steps
	p.Transitions += o.Transitions
	p.Alerts += o.Alerts
}

// EndedStatuses are the statuses of orders that ended and may be purged.
// An order held in error has not ended: an operator decides on it first.
func EndedStatuses() []string { return []string{OrderCompleted, OrderFailed} }

// PurgeEnded deletes up to limit orders that ended (statuses: a subset of
// EndedStatuses; nil for both) more than olderThan ago on the database
// clock, with their steps, history and alerts, in one transaction, and
// says how many rows of each table went. Orders whose rows another
// transaction holds are left for the next call. Call it until it deletes
// fewer than limit orders.
func (s *Store) PurgeEnded(ctx context.Context, olderThan time.Duration, statuses []string, limit int) (Purged, error) {
	if statuses == nil {
		statuses = EndedStatuses()
	}
	if limit <= 0 {
		return Purged{}, fmt.Errorf("purge: need a positive batch size")
	}
	var p Purged
	err := s.pool.QueryRow(ctx, `SELECT orders_deleted, steps_deleted, transitions_deleted, alerts_deleted
		FROM purge_ended_orders(make_interval(secs => $1::float8), $2, $3)`, olderThan.Seconds(), statuses, limit).
		Scan(&p.Orders, &p.Steps, &p.Transitions, &p.Alerts)
	if err != nil {
		return Purged{}, fmt.Errorf("purge ended orders: %w", operatorError(err))
	}
	return p, nil
}

// CountEnded counts the orders PurgeEnded would delete now: ended
// (statuses: a subset of EndedStatuses; nil for both) more than
// olderThan ago on the database clock.
func (s *Store) CountEnded(ctx context.Context, olderThan time.Duration, statuses []string) (int64, error) {
	if statuses == nil {
		statuses = EndedStatuses()
	}
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM orders
		WHERE status = ANY($2) AND created_at < now() - make_interval(secs => $1::float8)
		  AND updated_at < now() - make_interval(secs => $1::float8)`, olderThan.Seconds(), statuses).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count ended orders: %w", err)
	}
	return n, nil
}
