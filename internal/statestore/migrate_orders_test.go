package statestore_test

import (
	"strings"
	"testing"
	"time"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

const versions = `
workflows:
  - name: fixme
    steps:
      - {action: reserve, agent: x, compensation: {action: release}}
      - {action: charge, agent: x, delay: 1h, compensation: {action: refund}}
      - {action: ship, agent: x}
`

const fixed = `
workflows:
  - name: fixme
    steps:
      - {action: reserve, agent: x, compensation: {action: release}}
      - {action: charge, agent: x, delay: 1h, compensation: {action: refund}}
      - {action: notify, agent: x}
      - {action: ship, agent: y}
`

func lookup(t *testing.T, file string) workflow.Workflow {
	t.Helper()
	reg, err := workflow.Parse("w.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("fixme")
	return wf
}

// TestARunningOrderMovesToAFixedVersion: an order whose first step ran
// and whose second waits on its delay moves to a version that adds a
// step and changes one not begun: what ran keeps its state, result and
// key, the delay its due time, the history records the move, the order
// is pinned to the new version, and it runs the new steps. An order
// whose begun step the new version changes stays, with why; an ended one
// too.
func TestARunningOrderMovesToAFixedVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	v1, v2 := lookup(t, versions), lookup(t, fixed)
	o := graphOrder(t, versions, "fixme", `{}`, statestore.PolicyCompensate)
	o.WorkflowVersion = v1.Version()
	if err := b.store.StoreWorkflowVersions(ctx, []statestore.WorkflowVersion{{Name: "fixme", Version: v1.Version(), Definition: v1.Definition(), CreatedBy: "t"}}); err != nil {
		t.Fatal(err)
	}
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)["reserve"]
	reply(t, b, first, true, `{"held": 1}`)
	_, before := stepsByName(t, b, o.OrderID)
	if before["charge"].ProcessState != statestore.StepDelayed {
		t.Fatalf("charge is %s, want delayed", before["charge"].ProcessState)
	}

	dry, err := b.store.MigrateOrder(ctx, o.OrderID, v2, false, "ops")
	if err != nil || !dry.CanMove || dry.Moved || strings.Join(dry.Added, ",") != "notify" {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	// A version that does not run in the order's namespace takes it not.
	elsewhere := v2
	elsewhere.Namespaces = []string{"team-a"}
	if v, err := b.store.MigrateOrder(ctx, o.OrderID, elsewhere, true, "ops"); err != nil || v.CanMove || v.Moved ||
		!strings.Contains(v.Why, "does not run in namespace default") {
		t.Fatalf("a version of another namespace: %+v %v", v, err)
	}
	if _, after := stepsByName(t, b, o.OrderID); len(after) != len(before) {
		t.Fatal("a dry run changed the order")
	}
	v, err := b.store.MigrateOrder(ctx, o.OrderID, v2, true, "ops")
	if err != nil || !v.Moved {
		t.Fatalf("move: %+v %v", v, err)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil || d.Order.WorkflowVersion != v2.Version() {
		t.Fatalf("the order runs version %s (%v), want %s", d.Order.WorkflowVersion, err, v2.Version())
	}
	status, after := stepsByName(t, b, o.OrderID)
	if after["reserve"].ProcessState != statestore.StepProcessed || string(after["reserve"].Result) != `{"held": 1}` ||
		after["reserve"].IdempotencyKey != before["reserve"].IdempotencyKey {
		t.Fatalf("reserve after the move: %+v", after["reserve"])
	}
	if after["charge"].ProcessState != statestore.StepDelayed || after["charge"].DueAt == nil || !after["charge"].DueAt.Equal(*before["charge"].DueAt) {
		t.Fatalf("charge after the move: %+v", after["charge"])
	}
	if after["notify"].Step != 3 || after["ship"].Agent != "y" || after["ship"].Step != 4 || after["notify"].ProcessState != statestore.StepWaiting {
		t.Fatalf("the new steps: notify %+v, ship %+v", after["notify"], after["ship"])
	}
	if status != statestore.OrderProcessing {
		t.Fatalf("the order is %s", status)
	}
	var moved bool
	for _, h := range d.History {
		moved = moved || h.Step == nil && strings.Contains(h.Reason, "migrated from version "+v1.Version()+" to "+v2.Version())
	}
	if !moved {
		t.Fatal("the history does not record the move")
	}
	if again, err := b.store.MigrateOrder(ctx, o.OrderID, v2, true, "ops"); err != nil || again.CanMove || !strings.Contains(again.Why, "already") {
		t.Fatalf("moved twice: %+v %v", again, err)
	}

	// A version that changes a step the order began: it stays.
	changed := lookup(t, strings.Replace(versions, "{action: reserve, agent: x,", "{action: reserve, agent: z,", 1))
	v, err = b.store.MigrateOrder(ctx, o.OrderID, changed, true, "ops")
	if err != nil || v.CanMove || !strings.Contains(v.Why, "step reserve has begun") {
		t.Fatalf("a move that changes a begun step: %+v %v", v, err)
	}
	// It runs on: the delay's time brought to now, the new steps run.
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET due_at = clock_timestamp() WHERE order_id = $1 AND name = 'charge'`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	waitDue(t, b)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	fireAll(t, b, "sup-1")
	var ran []string
	for range 4 {
		for name, c := range claimAll(t, b, o.OrderID) {
			ran = append(ran, name)
			reply(t, b, c, true, "")
		}
	}
	if strings.Join(ran, ",") != "charge,notify,ship" {
		t.Fatalf("after the move it ran %v, want charge, notify, ship", ran)
	}
	if status, _ := stepsByName(t, b, o.OrderID); status != statestore.OrderCompleted {
		t.Fatalf("the moved order ended %s", status)
	}
}

// TestMigrateOrdersAnswersEachInItsPlace: a bulk move of many orders,
// a few at a time, answers each order's verdict at its id's place;
// an order that cannot move says why among those that moved; an id the
// store does not hold is an error.
func TestMigrateOrdersAnswersEachInItsPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	v1, v2 := lookup(t, versions), lookup(t, fixed)
	if err := b.store.StoreWorkflowVersions(ctx, []statestore.WorkflowVersion{{Name: "fixme", Version: v1.Version(), Definition: v1.Definition(), CreatedBy: "t"}}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 24 {
		o := graphOrder(t, versions, "fixme", `{}`, statestore.PolicyCompensate)
		o.WorkflowVersion = v1.Version()
		insert(t, b, o)
		ids = append(ids, o.OrderID)
	}
	ended := ids[7]
	if _, err := b.store.CancelOrder(ctx, ended, "ops"); err != nil {
		t.Fatal(err)
	}
	verdicts, err := b.store.MigrateOrders(ctx, ids, v2, true, "ops")
	if err != nil || len(verdicts) != len(ids) {
		t.Fatalf("%d verdicts for %d orders: %v", len(verdicts), len(ids), err)
	}
	for i, v := range verdicts {
		switch {
		case v.OrderID != ids[i]:
			t.Fatalf("verdict %d is of order %s, want %s", i, v.OrderID, ids[i])
		case ids[i] == ended && (v.Moved || v.Why == ""):
			t.Fatalf("the cancelled order: %+v", v)
		case ids[i] != ended && !v.Moved:
			t.Fatalf("order %d did not move: %+v", i, v)
		}
	}
	var pinned int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND workflow_version = $2`, ids, v2.Version()).Scan(&pinned); err != nil || pinned != len(ids)-1 {
		t.Fatalf("%d orders pinned to the new version (%v), want %d", pinned, err, len(ids)-1)
	}
	if _, err := b.store.MigrateOrders(ctx, []string{ids[0], "00000000-0000-4000-8000-000000000001"}, v2, true, "ops"); err == nil {
		t.Fatal("an order the store does not hold gave no error")
	}
}
