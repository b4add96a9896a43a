package lab

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FillReport says what Fill wrote and how long it took.
type FillReport struct {
	Orders   int
	Filled   time.Duration // the inserts
	Vacuumed time.Duration // VACUUM (ANALYZE), as autovacuum would have
	Size     string        // orders, steps, history and alerts, on disk
}

// Fill writes n orders of the demo workflow as they look once run, for
// benchmarks of a store that has been in use: six steps each (three
// actions processed, three compensations waiting), ten history rows,
// spread over the last 30 days, newest densest; most completed, some
// failed, one in 200 held in error with an alert, and the newest live
// ones in flight (no step of theirs is pending: nothing claims them). Then
// it vacuums and analyzes the tables, as autovacuum would have. The
// orders' ids are md5('o' || i): Fill into a fresh schema only.
func Fill(ctx context.Context, pool *pgxpool.Pool, n, live int) (FillReport, error) {
	r := FillReport{Orders: n}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return r, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		return r, err
	}
	const chunk = 100000
	began := time.Now()
	for lo := 1; lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		for _, stmt := range []string{
			`INSERT INTO orders (order_id, workflow, workflow_version, priority, payload_hash, status, created_at, updated_at, failure_policy, payload)
			SELECT md5('o' || i)::uuid,
			       CASE WHEN i % 10 = 0 THEN 'single' WHEN i % 10 = 1 THEN 'order_hold' ELSE 'order' END,
			       'aaaaaaaaaaaaaaaa', 0, sha256(i::text::bytea),
			       CASE WHEN i > $3::int - $4::int THEN 'processing' WHEN i % 200 = 1 THEN 'error' WHEN i % 50 = 7 THEN 'failed' ELSE 'completed' END,
			       now() - (($3 - i)::float8 / $3) ^ 2 * interval '30 days',
			       now() - (($3 - i)::float8 / $3) ^ 2 * interval '30 days' + interval '180 milliseconds',
			       'compensate',
			       jsonb_build_object('customer', 'customer ' || (i % 997), 'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (i % 31), 'qty', 1 + i % 4)),
			                          'amount', 100 + i % 10000, 'currency', 'EUR')
			FROM generate_series($1::int, $2::int) i`,
			`INSERT INTO steps (order_id, step, name, kind, agent, process_state, timeout, max_failures, attempt, idempotency_key,
			                    result, compensates, created_at, updated_at)
			SELECT md5('o' || i)::uuid, st, (ARRAY['reserve_inventory','charge_payment','create_shipment','cancel_shipment','refund_payment','release_inventory'])[st],
			       CASE WHEN st <= 3 THEN 'action' ELSE 'compensation' END,
			       (ARRAY['inventory','payment','shipping','shipping','payment','inventory'])[st],
			       CASE WHEN st <= 3 THEN 'processed' ELSE 'waiting' END, interval '10 seconds', 5, CASE WHEN st <= 3 THEN 1 ELSE 0 END,
			       md5('o' || i)::uuid::text || '/' || st,
			       CASE WHEN st <= 3 THEN jsonb_build_object('confirmation', 'c-' || i || '-' || st) END,
			       CASE WHEN st > 3 THEN 7 - st END, now(), now()
			FROM generate_series($1::int, $2::int) i, generate_series(1, 6) st`,
			`INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason, at)
			SELECT md5('o' || i)::uuid, h.step, h.f, h.t, h.a, h.actor, h.reason, now()
			FROM generate_series($1::int, $2::int) i,
			     (VALUES (NULL::int, NULL::text, 'received', 0, 'submitter', 'submitted'),
			             (1, NULL, 'pending', 0, 'submitter', 'submitted'),
			             (1, 'pending', 'processing', 1, 'scheduler', 'claimed'),
			             (1, 'processing', 'processed', 1, 'scheduler', 'agent replied ok'),
			             (2, 'waiting', 'pending', 0, 'scheduler', 'previous step processed'),
			             (2, 'pending', 'processing', 1, 'scheduler', 'claimed'),
			             (2, 'processing', 'processed', 1, 'scheduler', 'agent replied ok'),
			             (3, 'pending', 'processing', 1, 'scheduler', 'claimed'),
			             (3, 'processing', 'processed', 1, 'scheduler', 'agent replied ok'),
			             (NULL, 'processing', 'completed', 0, 'scheduler', 'every step processed')) h(step, f, t, a, actor, reason)`,
			`INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_by)
			SELECT md5('a' || i)::uuid, md5('o' || i)::uuid, 2, 'agent replied failed: charge_payment answered 400', 1, 'scheduler'
			FROM generate_series($1::int, $2::int) i WHERE i % 200 = 1`,
		} {
			args := []any{lo, hi}
			if strings.Contains(stmt, "$4") {
				args = append(args, n, live)
			}
			if _, err := conn.Exec(ctx, stmt, args...); err != nil {
				return r, fmt.Errorf("fill %d..%d: %w", lo, hi, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO workflow_versions (name, version, definition, created_by)
		VALUES ('order', 'aaaaaaaaaaaaaaaa', '{"name":"order","policy":"compensate","steps":[]}', 'fill'),
		       ('single', 'aaaaaaaaaaaaaaaa', '{"name":"single","policy":"compensate","steps":[]}', 'fill'),
		       ('order_hold', 'aaaaaaaaaaaaaaaa', '{"name":"order_hold","policy":"hold","steps":[]}', 'fill')
		ON CONFLICT DO NOTHING`); err != nil {
		return r, fmt.Errorf("fill: workflow versions: %w", err)
	}
	r.Filled = time.Since(began)
	if _, err := conn.Exec(ctx, `VACUUM (ANALYZE) orders, steps, transitions, alerts`); err != nil {
		return r, fmt.Errorf("fill: vacuum: %w", err)
	}
	r.Vacuumed = time.Since(began) - r.Filled
	if err := conn.QueryRow(ctx, `SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c
		WHERE c.relname IN ('orders', 'steps', 'transitions', 'alerts') AND c.relnamespace = current_schema()::regnamespace`).Scan(&r.Size); err != nil {
		return r, fmt.Errorf("fill: size: %w", err)
	}
	return r, nil
}
