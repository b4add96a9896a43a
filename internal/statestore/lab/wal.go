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
}

// ReadWAL reads the cluster's WAL position and checkpoint count. Both are
// the whole cluster's, not this schema's.
func ReadWAL(ctx context.Context, pool *pgxpool.Pool) (WALReading, error) {
	var r WALReading
	// PostgreSQL 17 moved the checkpoint counts to pg_stat_checkpointer.
	var newer bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_stat_checkpointer') IS NOT NULL`).Scan(&newer); err != nil {
		return r, fmt.Errorf("read WAL position: %w", err)
	}
	q := `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`
	if newer {
		q = `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, num_timed + num_requested FROM pg_stat_checkpointer`
	}
	if err := pool.QueryRow(ctx, q).Scan(&r.Bytes, &r.Checkpoints); err != nil {
		return r, fmt.Errorf("read WAL position: %w", err)
	}
	return r, nil
}
