package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// staleTablesSQL picks the hot tables (those every order writes to, whose
// statistics decide the plans of the claim, reply, insert and relay
// statements) of this schema that hold at least $1 live rows and have
// never been analyzed or have grown tenfold since (by anyone, autovacuum
// included), were not analyzed within $2 seconds, and that this user may
// analyze (it owns them).
const staleTablesSQL = `
SELECT t.relname::text
FROM pg_stat_user_tables t
JOIN pg_class c ON c.oid = t.relid
WHERE t.schemaname = current_schema()
  AND t.relname IN ('orders', 'steps', 'transitions', 'outbox')
  AND t.n_live_tup >= $1::bigint
  AND (c.reltuples < 0 OR t.n_live_tup > 10 * c.reltuples)
  AND coalesce(greatest(t.last_analyze, t.last_autoanalyze), '-infinity') < now() - make_interval(secs => $2::float8)
  AND pg_has_role(c.relowner, 'USAGE')
ORDER BY 1`

// RefreshStats analyzes the hot tables whose planner statistics are stale
// (see staleTablesSQL) and returns their names.
//
// A statement's cached plan is made once, from the table's size at the
// time; a plan made while a table was nearly empty keeps choosing a
// sequential scan long after it has grown (a reply batch then reads every
// step row), until an ANALYZE of the table invalidates it. Later growth
// needs no new plan: the planner scales the analyzed density by the
// table's current size. Autovacuum analyzes a new table within a minute
// or so; this catches a fresh schema under load sooner, and a database
// where autovacuum is off. Past the first, an ANALYZE follows only each
// tenfold growth, so the cost stays small.
func (s *Store) RefreshStats(ctx context.Context, minRows int64, minAge time.Duration) ([]string, error) {
	rows, err := s.pool.Query(ctx, staleTablesSQL, minRows, minAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("find stale statistics: %w", err)
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find stale statistics: %w", err)
	}
	var done []string
	for _, table := range stale {
		if _, err := s.pool.Exec(ctx, "ANALYZE "+pgx.Identifier{table}.Sanitize()); err != nil {
			return done, fmt.Errorf("analyze %s: %w", table, err)
		}
		done = append(done, table)
	}
	return done, nil
}

// deadTablesSQL picks the tables of this schema whose dead rows pass $1,
// that no vacuum (sas's or autovacuum's) has seen within $2 seconds, and
// that this user may vacuum (it owns them): the tables every order
// updates or deletes from.
const deadTablesSQL = `
SELECT t.relname::text
FROM pg_stat_user_tables t
JOIN pg_class c ON c.oid = t.relid
WHERE t.schemaname = current_schema()
  AND t.relname IN ('orders', 'steps', 'outbox', 'signals', 'order_payloads')
  AND t.n_dead_tup >= $1::bigint
  AND coalesce(greatest(t.last_vacuum, t.last_autovacuum), '-infinity') < now() - make_interval(secs => $2::float8)
  AND pg_has_role(c.relowner, 'USAGE')
ORDER BY 1`

// VacuumDead vacuums the tables whose dead rows pass minDead (see
// deadTablesSQL), their indexes' dead entries too, and returns their
// names.
//
// Every order leaves dead rows behind: a step's row is written anew at
// each change of state, a published event is deleted. Until a vacuum
// removes their entries, the indexes that serve the hot scans (pending
// steps by age, processing steps by deadline, the outbox by id) keep a
// prefix of dead entries older than any live one, which every claim,
// sweep and relay walks: with a million orders behind it, a claim cost
// ten times what it costs on a new schema, whatever the plan. Autovacuum
// keeps it short; where autovacuum is off or behind, this does, so that
// a claim's cost follows the dead rows of the last interval, not the
// table's history. Its own vacuums skip a table that another vacuum
// holds.
func (s *Store) VacuumDead(ctx context.Context, minDead int64, minAge time.Duration) ([]string, error) {
	rows, err := s.pool.Query(ctx, deadTablesSQL, minDead, minAge.Seconds())
	if err != nil {
		return nil, fmt.Errorf("find tables with dead rows: %w", err)
	}
	dead, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find tables with dead rows: %w", err)
	}
	var done []string
	for _, table := range dead {
		if _, err := s.pool.Exec(ctx, "VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) "+pgx.Identifier{table}.Sanitize()); err != nil {
			return done, fmt.Errorf("vacuum %s: %w", table, err)
		}
		done = append(done, table)
	}
	return done, nil
}

// Autovacuum reports whether the server runs autovacuum.
func (s *Store) Autovacuum(ctx context.Context) (bool, error) {
	var on string
	if err := s.pool.QueryRow(ctx, "SELECT current_setting('autovacuum')").Scan(&on); err != nil {
		return false, fmt.Errorf("read autovacuum setting: %w", err)
	}
	return on == "on", nil
}
