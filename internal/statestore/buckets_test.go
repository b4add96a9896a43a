package statestore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"sas/internal/statestore"
)

// A partition's store writes a submitted order only while it owns the
// order's bucket: a bucket fenced away refuses (naming its owner), one
// moving in holds its orders, and once moved in an id its earlier owner
// wrote is a duplicate (or a conflict), never a second order. A fence
// waits for the writes of its bucket in flight.
func TestFencedWritesFollowTheBucketsOwner(t *testing.T) {
	t.Parallel()
	p1, p2 := setup(t), setup(t)
	ctx := ctxFor(t)
	buckets := map[string]int{}
	bucketOf := func(id string) int { return buckets[id] }
	p1.store.FenceAs("p1", bucketOf)
	p2.store.FenceAs("p2", bucketOf)
	inBucket := func(b int) statestore.NewOrder {
		o := order(1, time.Hour, 3)
		buckets[o.OrderID] = b
		return o
	}

	// Bucket 7's first order, written in p1 (its owner by the layout).
	first := inBucket(7)
	if got, err := p1.store.InsertOrder(ctx, first); err != nil || got != statestore.Inserted {
		t.Fatalf("first order: %v %v", got, err)
	}

	// A write in flight holds the fence lock shared: the fence waits
	// for it.
	tx, err := p1.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended('sas.fence.' || current_schema(), 0))`); err != nil {
		t.Fatal(err)
	}
	fenced := make(chan error, 1)
	go func() { fenced <- p1.store.FenceBucket(ctx, 7, "p2") }()
	waitFor(t, "the fence to wait for the write in flight", func() bool {
		var n int
		_ = p1.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
			AND datname = current_database() AND query LIKE '%sas.fence.%' AND pid <> pg_backend_pid()`).Scan(&n)
		return n == 1
	})
	select {
	case err := <-fenced:
		t.Fatalf("the fence returned while a write held its bucket: %v", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-fenced; err != nil {
		t.Fatal(err)
	}

	// Fenced: p1 writes no order of bucket 7, and says whose it is; an
	// order of another bucket in the same batch is written.
	late, other := inBucket(7), inBucket(8)
	outcomes, errs := p1.store.InsertOrders(ctx, []statestore.NewOrder{late, other})
	var away *statestore.ElsewhereError
	if !errors.As(errs[0], &away) || away.Owner != "p2" || away.OrderID != late.OrderID {
		t.Fatalf("bucket 7's order in p1 after the fence: %v %v", outcomes[0], errs[0])
	}
	if errs[1] != nil || outcomes[1] != statestore.Inserted {
		t.Fatalf("bucket 8's order: %v %v", outcomes[1], errs[1])
	}
	if _, err := p1.store.InsertOrder(ctx, late); !errors.As(err, &away) {
		t.Fatalf("alone: %v", err)
	}

	// Moving into p2: held there until the ids are copied.
	if err := p2.store.SetBucketOwner(ctx, 7, "p2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.store.InsertOrder(ctx, late); !errors.Is(err, statestore.ErrMoving) {
		t.Fatalf("while moving in: %v", err)
	}
	ids, err := p1.store.OrderIDs(ctx, "", 100)
	if err != nil || len(ids) != 2 {
		t.Fatalf("p1's ids %v %v", ids, err)
	}
	if err := p2.store.CopyMovedOrders(ctx, "p1", ids); err != nil {
		t.Fatal(err)
	}
	if err := p2.store.CopyMovedOrders(ctx, "p1", ids); err != nil {
		t.Fatalf("copied again: %v", err)
	}
	if err := p2.store.SetBucketOwner(ctx, 7, "p2", false); err != nil {
		t.Fatal(err)
	}

	// Moved: the first order retried is a duplicate in p2, with another
	// payload a conflict, and a new one is written.
	if got, err := p2.store.InsertOrder(ctx, first); err != nil || got != statestore.Duplicate {
		t.Fatalf("the first order retried in p2: %v %v", got, err)
	}
	changed := first
	h := sha256.Sum256([]byte("another"))
	changed.PayloadHash = h[:]
	if _, err := p2.store.InsertOrder(ctx, changed); !errors.Is(err, statestore.ErrConflict) {
		t.Fatalf("the first order's id with another payload: %v", err)
	}
	outcomes, errs = p2.store.InsertOrders(ctx, []statestore.NewOrder{first, late})
	if errs[0] != nil || outcomes[0] != statestore.Duplicate || errs[1] != nil || outcomes[1] != statestore.Inserted {
		t.Fatalf("a batch in p2: %v %v", outcomes, errs)
	}
	var n int
	if err := p2.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = $1`, first.OrderID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the first order written in p2 too: %d %v", n, err)
	}
	owners, err := p1.store.BucketOwners(ctx)
	if err != nil || owners[7].Owner != "p2" || !owners[7].Moving || len(owners) != 1 {
		t.Fatalf("p1's owners %+v %v", owners, err)
	}

	// Moves are recorded one at a time per bucket.
	m, err := p1.store.StartMove(ctx, 7, "p1", "p2", "test")
	if err != nil || m.State != "copying" {
		t.Fatalf("start %+v %v", m, err)
	}
	if open, found, err := p1.store.OpenMove(ctx, 7); err != nil || !found || open.ID != m.ID {
		t.Fatalf("open %+v %v %v", open, found, err)
	}
	if _, err := p1.store.StartMove(ctx, 7, "p1", "p3", "test"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("another move of the bucket: %v", err)
	}
	if running, err := p1.store.RunningOrderIDs(ctx, "", 10); err != nil || len(running) != 2 {
		t.Fatalf("running %v %v", running, err)
	}
	if err := p1.store.UpdateMove(ctx, m.ID, "done", 2, 0); err != nil {
		t.Fatal(err)
	}
	if _, found, err := p1.store.OpenMove(ctx, 7); err != nil || found {
		t.Fatalf("a move done is open: %v %v", found, err)
	}
	moves, err := p1.store.Moves(ctx, 10)
	if err != nil || len(moves) != 1 || moves[0].State != "done" || moves[0].Copied != 2 || moves[0].EndedAt == nil {
		t.Fatalf("moves %+v %v", moves, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// The roles that move buckets and write orders may do their part of a
// move: an operator records and fences it and copies the ids; the
// submitter's and the API's fenced writes read who owns a bucket and the
// copied ids.
func TestRolesMoveBuckets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	operator := storeAs(t, b, "sas_operator")
	m, err := operator.StartMove(ctx, 3, "p1", "p2", "test")
	if err != nil {
		t.Fatalf("operator records a move: %v", err)
	}
	if err := operator.SetBucketOwner(ctx, 4, "p2", true); err != nil {
		t.Fatalf("operator sets an owner: %v", err)
	}
	if err := operator.FenceBucket(ctx, 3, "p2"); err != nil {
		t.Fatalf("operator fences: %v", err)
	}
	if _, err := operator.OrderIDs(ctx, "", 10); err != nil {
		t.Fatalf("operator reads order ids: %v", err)
	}
	if _, err := operator.RunningOrderIDs(ctx, "", 10); err != nil {
		t.Fatalf("operator reads running order ids: %v", err)
	}
	h := sha256.Sum256([]byte("x"))
	moved := order(1, time.Hour, 3)
	if err := operator.CopyMovedOrders(ctx, "p1", []statestore.OrderID{{OrderID: moved.OrderID, PayloadHash: h[:]}}); err != nil {
		t.Fatalf("operator copies ids: %v", err)
	}
	if err := operator.SetBucketOwner(ctx, 3, "p2", false); err != nil {
		t.Fatalf("operator sets a bucket moved: %v", err)
	}
	if err := operator.UpdateMove(ctx, m.ID, "done", 1, 0); err != nil {
		t.Fatalf("operator records the move done: %v", err)
	}
	for _, role := range []string{"sas_submitter", "sas_api"} {
		st := storeAs(t, b, role)
		st.FenceAs("p2", func(string) int { return 3 })
		if got, err := st.InsertOrder(ctx, order(1, time.Hour, 3)); err != nil || got != statestore.Inserted {
			t.Fatalf("%s writes an order of a bucket moved to it: %v %v", role, got, err)
		}
		if _, err := st.InsertOrder(ctx, moved); !errors.Is(err, statestore.ErrConflict) {
			t.Fatalf("%s writes a copied id again: %v, want a conflict (its hash differs)", role, err)
		}
		if _, err := st.BucketOwners(ctx); err != nil {
			t.Fatalf("%s reads the owners: %v", role, err)
		}
	}
}
