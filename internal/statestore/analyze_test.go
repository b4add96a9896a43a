package statestore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/statestore"
)

func TestRefreshStatsAnalyzesStaleTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	// One connection, so that its statistics can be flushed on demand.
	pool, err := statestore.Connect(ctx, b.url, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := statestore.New(pool)
	insertN := func(n int) {
		t.Helper()
		orders := make([]statestore.NewOrder, n)
		for i := range orders {
			orders[i] = order(2, time.Minute, 3)
		}
		if _, errs := store.InsertOrders(ctx, orders); errs[0] != nil {
			t.Fatal(errs[0])
		}
		waitLiveSteps(ctx, t, pool, 2*n)
	}

	if got, err := store.RefreshStats(ctx, 100, 0); err != nil || len(got) != 0 {
		t.Fatalf("empty schema: analyzed %v (%v), want none", got, err)
	}
	// 200 orders: 400 steps, 600 history entries, 200 status events. None
	// of the four tables was ever analyzed.
	insertN(200)
	all := []string{"orders", "outbox", "steps", "transitions"}
	if got, err := store.RefreshStats(ctx, 100, 0); err != nil || !slices.Equal(got, all) {
		t.Fatalf("analyzed %v (%v), want %v", got, err, all)
	}
	var reltuples float64
	if err := pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'steps'::regclass`).Scan(&reltuples); err != nil {
		t.Fatal(err)
	}
	if reltuples != 400 {
		t.Fatalf("planner sees %v step rows, want 400", reltuples)
	}
	// Doubled: not yet stale.
	insertN(200)
	if got, err := store.RefreshStats(ctx, 100, 0); err != nil || len(got) != 0 {
		t.Fatalf("after doubling: analyzed %v (%v), want none", got, err)
	}
	// Grown past tenfold: stale again, unless analyzed a moment ago.
	insertN(1800)
	if got, err := store.RefreshStats(ctx, 100, time.Hour); err != nil || len(got) != 0 {
		t.Fatalf("analyzed within the hour: analyzed %v (%v), want none", got, err)
	}
	if got, err := store.RefreshStats(ctx, 100, 0); err != nil || !slices.Equal(got, all) {
		t.Fatalf("after tenfold growth: analyzed %v (%v), want %v", got, err, all)
	}
}

// waitLiveSteps flushes this connection's statistics until the steps
// table's live row count reads at least n.
func waitLiveSteps(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		var live int
		if err := pool.QueryRow(ctx, `SELECT n_live_tup FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname = 'steps'`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("steps has %d live rows in the statistics, want %d", live, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
