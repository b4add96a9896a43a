package lab

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// WALReading is where the database cluster's write-ahead log stood at one
// moment: two readings tell how much the cluster wrote in between, and
// whether a checkpoint came (after one, the first change to every page
// writes the whole page to the log again).
type WALReading struct {
	Bytes int64 // the log's insert position, in bytes from its start
	// Checkpoints the checkpointer has counted, timed and requested (a
	// timed one on an idle cluster is counted though it writes nothing).
	Checkpoints int64
	// Transactions committed and rolled back in every database of the
	// cluster, and the WAL's records, writes and flushes (fsyncs) from
	// pg_stat_wal. The server gathers these from its backends about
	// once a second, so two readings a second apart or less mean little.
	Transactions, Records, Writes, Flushes int64
}

// ReadWAL reads the cluster's WAL position, checkpoint count, transaction
// count and WAL activity. All are the whole cluster's, not this schema's.
// Before PostgreSQL 14 (no pg_stat_wal) the WAL activity reads 0.
func ReadWAL(ctx context.Context, pool *pgxpool.Pool) (WALReading, error) {
	var r WALReading
	// PostgreSQL 17 moved the checkpoint counts to pg_stat_checkpointer.
	var newer bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_stat_checkpointer') IS NOT NULL`).Scan(&newer); err != nil {
		return r, fmt.Errorf("read WAL position: %w", err)
	}
	q := `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`
	if newer {
		q = `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, num_timed + num_requested FROM pg_stat_checkpointer`
	}
	if err := pool.QueryRow(ctx, q).Scan(&r.Bytes, &r.Checkpoints); err != nil {
		return r, fmt.Errorf("read WAL position: %w", err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database`).Scan(&r.Transactions); err != nil {
		return r, fmt.Errorf("read transaction count: %w", err)
	}
	var hasWAL bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_stat_wal') IS NOT NULL`).Scan(&hasWAL); err != nil || !hasWAL {
		return r, err
	}
	if err := pool.QueryRow(ctx, `SELECT wal_records, wal_write, wal_sync FROM pg_stat_wal`).Scan(&r.Records, &r.Writes, &r.Flushes); err != nil {
		return r, fmt.Errorf("read WAL activity: %w", err)
	}
	return r, nil
}
