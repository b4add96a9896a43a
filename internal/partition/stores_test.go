package partition_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/statestore"
)

// TestTheOverviewOfEveryPartition: two partitions' stores read as one
// overview: live and recent orders and pending steps summed, the oldest
// pending step the oldest of either, each partition's leader named.
func TestTheOverviewOfEveryPartition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stores partition.Stores
	for i, name := range []string{"p1", "p2"} {
		_, pool := testenv.Database(t)
		st := statestore.New(pool)
		stores.Parts = append(stores.Parts, partition.Store{Name: name, Store: st})
		for range 2 + i { // two orders in p1, three in p2
			id := messages.NewID()
			h := sha256.Sum256([]byte(id))
			o := statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{}`), PayloadHash: h[:], Actor: "test",
				FailurePolicy: statestore.PolicyHold, Steps: []statestore.NewStep{{Name: "a", Agent: "agent", Timeout: time.Minute, MaxFailures: 3}}}
			if got, err := st.InsertOrder(ctx, o); err != nil || got != statestore.Inserted {
				t.Fatalf("insert: %v %v", got, err)
			}
		}
	}
	if _, err := stores.Parts[1].Store.AcquireLease(ctx, statestore.SupervisorLease, "supervisor-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	one, err := stores.Parts[1].Store.ReadOverview(ctx, 5*time.Minute, statestore.SupervisorLease)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := stores.ReadOverview(ctx, 5*time.Minute, statestore.SupervisorLease)
	if err != nil {
		t.Fatal(err)
	}
	if ov.Live[statestore.OrderReceived] != 5 || ov.Recent[statestore.OrderReceived] != 5 || ov.Steps.ByState["pending"] != 5 {
		t.Fatalf("summed: live %v, recent %v, steps %v; want 5 received orders and 5 pending steps", ov.Live, ov.Recent, ov.Steps.ByState)
	}
	if ov.Steps.OldestPending < one.Steps.OldestPending {
		t.Fatalf("oldest pending %v, under one partition's %v", ov.Steps.OldestPending, one.Steps.OldestPending)
	}
	if ov.Leader != "p1: none; p2: supervisor-b" || !strings.Contains(ov.Leader, "supervisor-b") {
		t.Fatalf("leader %q", ov.Leader)
	}
}

// noBroker binds nothing: a move's store side alone.
type noBroker struct{}

func (noBroker) ExchangeBind(string, string, string, bool, amqp.Table) error   { return nil }
func (noBroker) ExchangeUnbind(string, string, string, bool, amqp.Table) error { return nil }

// A bucket moved on again takes along the ids its first owner wrote: an
// order written in p1 before the bucket went to p2 and then to p3 is a
// duplicate in p3, never a second order.
func TestABucketMovedTwiceKeepsItsFirstIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := partition.Parse([]byte("exchange: x\nbuckets: 4\npartitions:\n" +
		"  - {name: p1, queue_prefix: a., database_url_env: SAS_A_URL}\n" +
		"  - {name: p2, queue_prefix: b., database_url_env: SAS_B_URL, added: true}\n" +
		"  - {name: p3, queue_prefix: c., database_url_env: SAS_C_URL, added: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var parts []partition.Store
	for _, name := range []string{"p1", "p2", "p3"} {
		_, pool := testenv.Database(t)
		parts = append(parts, partition.Store{Name: name, Store: statestore.New(pool)})
	}
	stores := partition.NewStores(&l, parts)
	newOrder := func() statestore.NewOrder {
		for {
			id := messages.NewID()
			if l.BucketOf(id) != 2 {
				continue
			}
			h := sha256.Sum256([]byte(id))
			return statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{}`), PayloadHash: h[:], Actor: "test",
				FailurePolicy: statestore.PolicyHold, Steps: []statestore.NewStep{{Name: "a", Agent: "agent", Timeout: time.Minute, MaxFailures: 3}}}
		}
	}
	first := newOrder()
	if got, err := parts[0].Store.InsertOrder(ctx, first); err != nil || got != statestore.Inserted {
		t.Fatalf("p1 writes bucket 2's order: %v %v", got, err)
	}
	for _, to := range []string{"p2", "p3"} {
		if m, err := stores.Move(ctx, noBroker{}, 2, to, "test", false, nil); err != nil || m.State == "copying" {
			t.Fatalf("move bucket 2 to %s: %+v %v", to, m, err)
		}
	}
	if _, err := parts[0].Store.InsertOrder(ctx, first); err == nil {
		t.Fatal("p1 writes the moved bucket's order again")
	}
	if got, err := parts[2].Store.InsertOrder(ctx, first); err != nil || got != statestore.Duplicate {
		t.Fatalf("p3 writes p1's order again: %v %v, want a duplicate", got, err)
	}
	if got, err := parts[2].Store.InsertOrder(ctx, newOrder()); err != nil || got != statestore.Inserted {
		t.Fatalf("p3 writes a new order of bucket 2: %v %v", got, err)
	}
	if i := stores.Index(ctx, first.OrderID); i != 0 {
		t.Fatalf("p1's order found in partition %d", i)
	}
}
