package statestore_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

// TestOrderPageWalksEveryOrderOnce: following the cursor from the first
// page visits every order exactly once, newest first, even when many
// share one created_at (an insert batch), and with each filter.
func TestOrderPageWalksEveryOrderOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	var ids []string
	for range 23 {
		o := order(1, time.Minute, 1)
		insert(t, b, o)
		ids = append(ids, o.OrderID)
	}
	// Ten share one instant, so the page boundary falls inside a tie.
	if _, err := b.pool.Exec(ctx, `UPDATE orders SET created_at = '2026-01-01T00:00:00Z' WHERE order_id = ANY($1::uuid[])`, ids[5:15]); err != nil {
		t.Fatal(err)
	}
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'error' WHERE order_id = ANY($1::uuid[])`, ids[:4])
	walk := func(q statestore.OrderQuery) []statestore.OrderRow {
		t.Helper()
		var all []statestore.OrderRow
		for pages := 0; ; pages++ {
			rows, next, err := b.store.OrderPage(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) > q.Limit {
				t.Fatalf("a page of %d rows, limit %d", len(rows), q.Limit)
			}
			all = append(all, rows...)
			if next == nil {
				return all
			}
			if pages > 50 {
				t.Fatal("the cursor never ends")
			}
			q.After = next
		}
	}
	all := walk(statestore.OrderQuery{Limit: 4})
	if len(all) != 23 {
		t.Fatalf("walked %d orders, want 23", len(all))
	}
	seen := map[string]bool{}
	for i, o := range all {
		if seen[o.OrderID] {
			t.Fatalf("order %s listed twice", o.OrderID)
		}
		seen[o.OrderID] = true
		if i > 0 {
			prev := all[i-1]
			if o.CreatedAt.After(prev.CreatedAt) || (o.CreatedAt.Equal(prev.CreatedAt) && o.OrderID > prev.OrderID) {
				t.Fatalf("not newest first at %d: %v %s after %v %s", i, o.CreatedAt, o.OrderID, prev.CreatedAt, prev.OrderID)
			}
		}
	}
	if got := walk(statestore.OrderQuery{Status: "error", Limit: 3}); len(got) != 4 {
		t.Fatalf("status filter walked %d, want 4", len(got))
	}
	// An id prefix is a range of the primary key.
	prefix := strings.ReplaceAll(ids[7], "-", "")[:5]
	lo, hi := prefix+strings.Repeat("0", 27), prefix+strings.Repeat("f", 27)
	uuid := func(h string) string { return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:] }
	got := walk(statestore.OrderQuery{IDLow: uuid(lo), IDHigh: uuid(hi), Limit: 10})
	if !slices.ContainsFunc(got, func(o statestore.OrderRow) bool { return o.OrderID == ids[7] }) {
		t.Fatalf("prefix %s does not find %s", prefix, ids[7])
	}
	for _, o := range got {
		if !strings.HasPrefix(strings.ReplaceAll(o.OrderID, "-", ""), prefix) {
			t.Fatalf("prefix %s finds %s", prefix, o.OrderID)
		}
	}
	// A time range.
	tie := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := walk(statestore.OrderQuery{From: tie, To: tie.Add(time.Second), Limit: 7}); len(got) != 10 {
		t.Fatalf("time range walked %d, want 10", len(got))
	}
	if _, _, err := b.store.OrderPage(ctx, statestore.OrderQuery{Limit: 0}); err == nil {
		t.Fatal("a limit of 0 is accepted")
	}
}

// TestOverviewCountsTheLiveAndTheRecent: the overview's counts, latency
// and leader come from the store as it is.
func TestOverviewCountsTheLiveAndTheRecent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	var ids []string
	for range 5 {
		o := order(1, time.Minute, 1)
		insert(t, b, o)
		ids = append(ids, o.OrderID)
	}
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'completed', updated_at = created_at + interval '200 milliseconds' WHERE order_id = ANY($1::uuid[])`, ids[:3])
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'error' WHERE order_id = $1`, ids[3])
	// One order from long ago: not in the recent window.
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'completed', created_at = now() - interval '1 day' WHERE order_id = $1`, ids[4])
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	ov, err := b.store.ReadOverview(ctx, 5*time.Minute, statestore.SupervisorLease)
	if err != nil {
		t.Fatal(err)
	}
	if ov.Live["error"] != 1 || ov.Live["received"] != 0 || ov.Recent["completed"] != 3 || ov.Recent["error"] != 1 {
		t.Fatalf("live %v recent %v", ov.Live, ov.Recent)
	}
	if ov.LatencyP50 != 200*time.Millisecond || ov.LatencyP95 != 200*time.Millisecond {
		t.Fatalf("latency p50 %v p95 %v, want 200ms", ov.LatencyP50, ov.LatencyP95)
	}
	if ov.Leader != "sup-1" || ov.CompletedPerSecond != 3.0/300 {
		t.Fatalf("leader %q, %v completed/s", ov.Leader, ov.CompletedPerSecond)
	}
}

// TestConsoleRoleReadsAndActsOnlyThroughFunctions: the console's role
// reads, resubmits, cancels, acknowledges and records its dead-letter
// actions, each with the console user's name, and writes no table itself.
func TestConsoleRoleReadsAndActsOnlyThroughFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	console := storeAs(t, b, statestore.RoleConsole)
	o := order(2, time.Minute, 1)
	insert(t, b, o)
	if _, err := console.GetOrder(ctx, o.OrderID); err != nil {
		t.Fatalf("console reads an order: %v", err)
	}
	if _, _, err := console.OrderPage(ctx, statestore.OrderQuery{Limit: 10}); err != nil {
		t.Fatalf("console lists orders: %v", err)
	}
	if _, err := console.ReadOverview(ctx, time.Minute, statestore.SupervisorLease); err != nil {
		t.Fatalf("console reads the overview: %v", err)
	}
	if _, err := console.WorkflowVersions(ctx); err != nil {
		t.Fatalf("console reads workflow versions: %v", err)
	}
	if status, err := console.CancelOrder(ctx, o.OrderID, "console:alice"); err != nil || status == "" {
		t.Fatalf("console cancels: %q %v", status, err)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND claimed_by = 'console:alice' AND reason = 'operator cancel'`, o.OrderID); n == 0 {
		t.Fatal("the cancel is not recorded with the console user")
	}
	if err := console.RecordOperatorAction(ctx, "dead letter discard", "submit/m-1", "1 message(s)", "console:alice"); err != nil {
		t.Fatalf("console records an action: %v", err)
	}
	acts, err := console.OperatorActions(ctx, 10)
	if err != nil || len(acts) != 1 || acts[0].ClaimedBy != "console:alice" || acts[0].DBUser == "" {
		t.Fatalf("operator actions %+v %v", acts, err)
	}
	if _, err := console.InsertOrder(ctx, order(1, time.Minute, 1)); !denied(err) {
		t.Fatalf("console inserts an order: %v, want permission denied", err)
	}
	for _, stmt := range []string{
		`UPDATE orders SET status = 'completed'`,
		`UPDATE steps SET process_state = 'pending'`,
		`INSERT INTO transitions (order_id, to_state, actor) VALUES (gen_random_uuid(), 'x', 'operator:someone-else')`,
		`INSERT INTO operator_actions (claimed_by, action, target) VALUES ('console:mallory', 'x', 'y')`,
		`UPDATE operator_actions SET claimed_by = 'someone-else'`,
		`UPDATE alerts SET acked_by = 'someone-else'`,
		`SELECT count(*) FROM outbox`,
		`DELETE FROM orders`,
		`SELECT purge_ended_orders(interval '1 hour', ARRAY['completed'], 10)`,
	} {
		if _, err := asRole(t, b, statestore.RoleConsole, stmt); !denied(err) {
			t.Errorf("console may %s: %v", stmt, err)
		}
	}
}
