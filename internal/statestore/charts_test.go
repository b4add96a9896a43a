package statestore_test

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

// TestOverviewSampleCountsEachMinute: the leader's sample writes, per
// minute the orders came in and per workflow, how many completed and
// failed and the completed ones' p50 and p95, and the steps pending now
// in this minute's row; a holder without the lease writes nothing.
func TestOverviewSampleCountsEachMinute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	var ids []string
	for range 6 {
		o := order(1, time.Minute, 1)
		insert(t, b, o)
		ids = append(ids, o.OrderID)
	}
	// Two minutes ago: four orders of w-a completed in 1, 2, 3 and 4 s and
	// one failed; one of w-b still pending.
	if _, err := b.pool.Exec(ctx, `UPDATE orders SET workflow = 'w-a', created_at = date_trunc('minute', now()) - interval '2 minutes' + interval '5 seconds'
		WHERE order_id = ANY($1::uuid[])`, ids[:5]); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids[:4] {
		testenv.Forge(t, b.pool, `UPDATE orders SET status = 'completed', updated_at = created_at + make_interval(secs => $2) WHERE order_id = $1`, id, i+1)
		testenv.Forge(t, b.pool, `UPDATE steps SET process_state = 'processed' WHERE order_id = $1`, id)
	}
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'failed', updated_at = created_at + interval '9 seconds' WHERE order_id = $1`, ids[4])
	testenv.Forge(t, b.pool, `UPDATE steps SET process_state = 'cancelled' WHERE order_id = $1`, ids[4])
	if _, err := b.pool.Exec(ctx, `UPDATE orders SET workflow = 'w-b' WHERE order_id = $1`, ids[5]); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.SampleOverview(ctx, "not-the-leader", statestore.SupervisorLease); err != nil || n != 0 {
		t.Fatalf("a sample without the lease: %d %v", n, err)
	}
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "leader", time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.SampleOverview(ctx, "leader", statestore.SupervisorLease); err != nil || n != 2 {
		t.Fatalf("the leader's sample: %d rows %v, want 2", n, err)
	}
	rows, now, err := b.store.OverviewMinutes(ctx, time.Hour)
	if err != nil || len(rows) != 2 {
		t.Fatalf("%+v %v", rows, err)
	}
	a, w := rows[0], rows[1]
	if a.Workflow != "w-a" || a.Completed != 4 || a.Failed != 1 || a.Pending != 0 || !a.Minute.Equal(now.Truncate(time.Minute).Add(-2*time.Minute)) {
		t.Fatalf("w-a's minute: %+v (now %v)", a, now)
	}
	if a.P50 == nil || *a.P50 != 2500*time.Millisecond || a.P95 == nil || *a.P95 != 3850*time.Millisecond {
		t.Fatalf("w-a's latency: p50 %v p95 %v, want 2.5s and 3.85s", a.P50, a.P95)
	}
	if w.Workflow != "w-b" || w.Pending != 1 || w.Completed != 0 || !w.Minute.Equal(now.Truncate(time.Minute)) {
		t.Fatalf("w-b's minute: %+v", w)
	}
	// Its step claimed: the next sample says none pending.
	if claimed, err := b.store.ClaimPending(ctx, "s", 10, ""); err != nil || len(claimed) != 1 || claimed[0].OrderID != ids[5] {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	if _, err := b.store.SampleOverview(ctx, "leader", statestore.SupervisorLease); err != nil {
		t.Fatal(err)
	}
	if rows, _, _ := b.store.OverviewMinutes(ctx, time.Hour); len(rows) != 2 || rows[1].Pending != 0 {
		t.Fatalf("after the claim: %+v", rows)
	}
}
