package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/messages"
)

// A virtual clock lets a schema's time be skipped forward: `sasctl
// workflows test` runs a process's cases through the store's own
// functions, and a timer of 14 days fires as soon as nothing else can
// happen. The schema gets its own now() and clock_timestamp(), which read
// a moment kept in a one-row table and stand still until AdvanceClock
// moves it (so a case's times are exact, whatever the machine's speed),
// and every name is looked up in the schema before pg_catalog: the
// connections' search_path is "schema, pg_catalog", so the functions'
// bodies, the store's statements and the tables' defaults (bound when the
// migrations made them) all read the virtual clock. Only a schema made
// for it has one; a production schema never does.

// virtualClockSQL makes the clock in the current schema, before its
// migrations run: it starts at the database's time, to the second.
const virtualClockSQL = `
CREATE TABLE virtual_clock (
    only_row boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    at       timestamptz NOT NULL DEFAULT date_trunc('second', pg_catalog.now())
);
INSERT INTO virtual_clock DEFAULT VALUES;
CREATE FUNCTION now() RETURNS timestamptz LANGUAGE sql STABLE
    AS $$ SELECT at FROM virtual_clock $$;
CREATE FUNCTION clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE
    AS $$ SELECT at FROM virtual_clock $$;
`

// VirtualSearchPath is the search_path of a virtual-clock schema's
// connections: its own names, then the built-in ones.
func VirtualSearchPath(schema string) string {
	return pgx.Identifier{schema}.Sanitize() + ", pg_catalog"
}

// CreateVirtualClock makes the schema the pool's search_path names (see
// VirtualSearchPath), with a virtual clock, and migrates it.
func CreateVirtualClock(ctx context.Context, pool *pgxpool.Pool, schema string, migrations []Migration) error {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	var current string
	if err := pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
		return err
	}
	if current != schema {
		return fmt.Errorf("the connections' search_path starts with %q, not the schema %q", current, schema)
	}
	if _, err := pool.Exec(ctx, virtualClockSQL); err != nil {
		return fmt.Errorf("make the virtual clock: %w", err)
	}
	if _, err := Migrate(ctx, pool, migrations); err != nil {
		return err
	}
	// The SECURITY DEFINER functions pin their search_path to the schema
	// (pg_catalog first, implicitly): put pg_catalog after it, so that
	// they too read the schema's clock.
	_, err := pool.Exec(ctx, `DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace AND p.proconfig IS NOT NULL LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_catalog, pg_temp', f, current_schema());
    END LOOP;
END $$`)
	if err != nil {
		return fmt.Errorf("pin the functions to the virtual clock: %w", err)
	}
	return nil
}

// AdvanceClock moves a virtual-clock schema's time forward by d.
func (s *Store) AdvanceClock(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	tag, err := s.pool.Exec(ctx, `UPDATE virtual_clock SET at = at + make_interval(secs => $1::float8 / 1e6)`, d.Microseconds())
	if err != nil {
		return fmt.Errorf("advance the virtual clock: %w", classify(err))
	}
	if tag.RowsAffected() != 1 {
		return errors.New("advance the virtual clock: the schema has none")
	}
	return nil
}

// NextDue is the earliest moment something of the store falls due
// without anyone's word: a delayed step's timer, a wait's timeout, a
// step's complete_by or its backoff after a reset, an order's deadline.
// ok is false when nothing waits.
func (s *Store) NextDue(ctx context.Context) (at time.Time, ok bool, err error) {
	var next *time.Time
	err = s.pool.QueryRow(ctx, `SELECT least(
    clock_timestamp() + make_interval(secs => next_timer()),
    (SELECT min(s.complete_by) FROM steps s WHERE s.process_state = 'processing'),
    (SELECT min(s.available_at) FROM steps s JOIN orders o ON o.order_id = s.order_id
      WHERE s.process_state = 'pending' AND o.status IN ('received', 'processing', 'compensating')
        AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id)))`).Scan(&next)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read what falls due next: %w", classify(err))
	}
	if next == nil {
		return time.Time{}, false, nil
	}
	return *next, true, nil
}

// EndingEvent is the status event that ends an order (completed, failed
// or error), as the outbox had it (status_event_body, made again from the
// order as it is now); ok false while the order runs.
func (s *Store) EndingEvent(ctx context.Context, orderID string) (ev messages.StatusEvent, ok bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT status_event_body(order_id, status, NULL) FROM orders
WHERE order_id = $1 AND status IN ('completed', 'failed', 'error')`, orderID).Scan(&ev)
	if errors.Is(err, pgx.ErrNoRows) {
		return messages.StatusEvent{}, false, nil
	}
	if err != nil {
		return messages.StatusEvent{}, false, fmt.Errorf("the ending event of order %s: %w", orderID, classify(err))
	}
	return ev, true, nil
}

// OrderStatus is an order's status alone.
func (s *Store) OrderStatus(ctx context.Context, orderID string) (string, error) {
	var status string
	if err := s.pool.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, orderID).Scan(&status); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", ErrNotFound
		}
		return "", fmt.Errorf("read the status of order %s: %w", orderID, classify(err))
	}
	return status, nil
}
