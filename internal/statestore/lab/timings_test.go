package lab_test

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore/lab"
)

// TestTimingsReadOneNamespaceOrEvery: the timings of a window are of
// every order placed in it, or of one namespace's when asked; asked for
// none, they are read from a store older than namespaces too (the base
// of an A/B).
func TestTimingsReadOneNamespaceOrEvery(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	ctx := ctxFor(t)
	if _, err := lab.Fill(ctx, pool, 100, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE orders SET placed_at = created_at`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE orders SET namespace = 'team-a' WHERE order_id IN (SELECT order_id FROM orders ORDER BY order_id LIMIT 10)`); err != nil {
		t.Fatal(err)
	}
	from, to := time.Now().AddDate(-10, 0, 0), time.Now().Add(time.Hour)
	for ns, want := range map[string]int{"": 100, "team-a": 10, "team-b": 0} {
		tm, err := lab.ReadTimings(ctx, pool, from, to, ns)
		if err != nil || tm.Placed != want {
			t.Errorf("namespace %q: %d placed, want %d (%v)", ns, tm.Placed, want, err)
		}
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE orders DROP COLUMN namespace`); err != nil {
		t.Fatal(err)
	}
	if tm, err := lab.ReadTimings(ctx, pool, from, to, ""); err != nil || tm.Placed != 100 {
		t.Fatalf("a store without namespaces: %d placed (%v)", tm.Placed, err)
	}
}
