package partition_test

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

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
