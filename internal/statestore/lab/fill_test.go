package lab_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/testenv"
	"sas/internal/statestore/lab"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctxFor(t), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestFillWritesOrdersAsTheyLookOnceRun: Fill's orders have their steps,
// history and alerts, in the mix it promises, and the tables are
// vacuumed and analyzed after.
func TestFillWritesOrdersAsTheyLookOnceRun(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	r, err := lab.Fill(ctxFor(t), pool, 1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	if r.Orders != 1000 || r.Size == "" {
		t.Fatalf("report %+v", r)
	}
	for sql, want := range map[string]int{
		`SELECT count(*) FROM orders`:                                      1000,
		`SELECT count(*) FROM orders WHERE status = 'processing'`:          10,
		`SELECT count(*) FROM orders WHERE status = 'error'`:               5,
		`SELECT count(*) FROM alerts`:                                      5,
		`SELECT count(*) FROM steps`:                                       6000,
		`SELECT count(*) FROM steps WHERE process_state = 'pending'`:       0,
		`SELECT count(*) FROM transitions`:                                 10000,
		`SELECT count(*) FROM workflow_versions WHERE created_by = 'fill'`: 3,
	} {
		if got := count(t, pool, sql); got != want {
			t.Errorf("%s: %d, want %d", sql, got, want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = current_schema()
		AND relname IN ('orders', 'steps', 'transitions', 'alerts') AND last_vacuum IS NOT NULL AND last_analyze IS NOT NULL`); n != 4 {
		t.Errorf("%d of 4 tables vacuumed and analyzed", n)
	}
}
