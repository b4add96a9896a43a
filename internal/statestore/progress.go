package statestore

import (
	"context"
	"fmt"
	"time"
)

// Progress is how a set of orders is doing.
type Progress struct {
	ByStatus map[string]int
	// P50 and P99 of the time from an order's creation to its last change,
	// over the orders that ended (completed, failed, error).
	P50, P99 time.Duration
	// Alerts raised for these orders.
	Alerts int
}

// Now returns the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return t, fmt.Errorf("read the database clock: %w", err)
	}
	return t, nil
}

// ProgressOf reports on the orders ids names (those a run submitted): not
// on the child orders their sub-processes start, nor on orders a schedule
// or another client started meanwhile.
func (s *Store) ProgressOf(ctx context.Context, ids []string) (Progress, error) {
	p := Progress{ByStatus: map[string]int{}}
	rows, err := s.pool.Query(ctx, `SELECT status, count(*) FROM orders WHERE order_id = ANY($1::uuid[]) GROUP BY status`, ids)
	if err != nil {
		return p, fmt.Errorf("progress: %w", err)
	}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			rows.Close()
			return p, fmt.Errorf("progress: %w", err)
		}
		p.ByStatus[st] = n
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("progress: %w", err)
	}
	var p50, p99 float64
	err = s.pool.QueryRow(ctx, `
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)), 0),
		       (SELECT count(*) FROM alerts WHERE order_id = ANY($1::uuid[]))
		FROM orders WHERE order_id = ANY($1::uuid[]) AND status IN ('completed', 'failed', 'error')`, ids).Scan(&p50, &p99, &p.Alerts)
	if err != nil {
		return p, fmt.Errorf("progress latencies: %w", err)
	}
	p.P50 = time.Duration(p50 * float64(time.Second))
	p.P99 = time.Duration(p99 * float64(time.Second))
	return p, nil
}

// Unfinished counts orders that have not ended (received, processing,
// compensating) and outbox messages not yet published.
func (s *Store) Unfinished(ctx context.Context) (orders, outbox int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM orders o WHERE o.status NOT IN ('completed', 'failed', 'error')
		   -- an order awaiting a child held in error waits for an operator as the child does
		   AND NOT EXISTS (SELECT 1 FROM orders c WHERE c.parent_order = o.order_id AND c.status = 'error')),
		(SELECT count(*) FROM outbox)`).Scan(&orders, &outbox)
	if err != nil {
		return 0, 0, fmt.Errorf("unfinished: %w", err)
	}
	return orders, outbox, nil
}
