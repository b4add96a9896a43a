package statestore_test

import (
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// TestSchedulesStartOneOrderPerTick: without the lease nothing starts;
// with it a due schedule's round writes its orders and moves its ticks on
// in one transaction; a round done again for the same tick (a leader that
// died before it knew it had committed) writes no second order.
func TestSchedulesStartOneOrderPerTick(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	reg, err := workflow.Parse("s.yaml", []byte(`
workflows:
  - name: tick
    steps:
      - {action: a, agent: x}
schedules:
  - {name: often, cron: "@every 1s", workflow: tick, overlap: allow, catch_up: all}
`))
	if err != nil {
		t.Fatal(err)
	}
	sc := reg.Schedules()[0]
	wf, _ := reg.Lookup("tick")
	now, err := b.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	due := now.Add(-3 * time.Second).Truncate(time.Second)
	if err := b.store.SyncSchedules(ctx, []statestore.ScheduleDef{{Name: sc.Name, Workflow: sc.Workflow, Cron: sc.Cron, Timezone: sc.Timezone,
		Payload: sc.Payload, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Version: sc.Version(), FirstTick: due}}); err != nil {
		t.Fatal(err)
	}
	plan := func(now time.Time, d statestore.ScheduleRow) statestore.ScheduleRound {
		var r statestore.ScheduleRound
		for tk := d.NextTick; !tk.After(now); tk = sc.Next(tk) {
			id := messages.DerivedID("schedule:often:" + tk.UTC().Format(time.RFC3339Nano))
			r.Starts = append(r.Starts, statestore.ScheduleStart{Tick: tk, Order: statestore.NewOrder{OrderID: id, Workflow: "tick",
				Payload: sc.Payload, PayloadHash: statestore.DerivedHash("tick", sc.Payload), FailurePolicy: wf.Policy,
				Steps: statestore.StepsOf(wf, 0), Actor: "test"},
				Version: statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: "test"}})
			last := tk
			r.LastTick, r.NextTick = &last, sc.Next(tk)
		}
		return r
	}
	if fired, err := b.store.FireSchedules(ctx, "sup-1", statestore.SupervisorLease, plan); err != nil || len(fired) != 0 {
		t.Fatalf("without the lease: %+v %v", fired, err)
	}
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	fired, err := b.store.FireSchedules(ctx, "sup-1", statestore.SupervisorLease, plan)
	if err != nil || len(fired) != 1 || len(fired[0].Started) < 3 {
		t.Fatalf("with the lease: %+v %v", fired, err)
	}
	orders := count(t, b, `SELECT count(*) FROM orders WHERE workflow = 'tick'`)
	// The same ticks again, as a leader that did not know it committed.
	if _, err := b.pool.Exec(ctx, `UPDATE schedules SET next_tick = $1`, due); err != nil {
		t.Fatal(err)
	}
	again, err := b.store.FireSchedules(ctx, "sup-1", statestore.SupervisorLease, plan)
	if err != nil || len(again) != 1 {
		t.Fatalf("again: %+v %v", again, err)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE workflow = 'tick'`); n != orders+len(again[0].Started) || len(again[0].Started) > 1 {
		t.Fatalf("the same ticks again started %d orders (%d before, %d now)", len(again[0].Started), orders, n)
	}
	rows, err := b.store.Schedules(ctx)
	if err != nil || len(rows) != 1 || rows[0].LastOrder == "" || rows[0].LastOrderStatus != statestore.OrderReceived || !rows[0].NextTick.After(now) {
		t.Fatalf("schedules %+v %v", rows, err)
	}
}

// TestSchedulesStartOrdersInTheirNamespace: a schedule's orders are
// written in its namespace; while that namespace does not exist, its
// ticks start nothing and say why.
func TestSchedulesStartOrdersInTheirNamespace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	reg, err := workflow.Parse("s.yaml", []byte(`
workflows:
  - name: tick
    steps:
      - {action: a, agent: x}
schedules:
  - {name: teams, cron: "@every 1h", workflow: tick, namespace: team-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	sc := reg.Schedules()[0]
	wf, _ := reg.Lookup("tick")
	now, err := b.store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.SyncSchedules(ctx, []statestore.ScheduleDef{{Name: sc.Name, Workflow: sc.Workflow, Cron: sc.Cron, Timezone: sc.Timezone,
		Payload: sc.Payload, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Version: sc.Version(), FirstTick: now.Add(-time.Second)}}); err != nil {
		t.Fatal(err)
	}
	// As the supervisor's role, which must read the namespaces.
	supervisor := storeAs(t, b, "sas_supervisor")
	if _, err := supervisor.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	id := messages.NewID()
	plan := func(now time.Time, d statestore.ScheduleRow) statestore.ScheduleRound {
		last := d.NextTick
		return statestore.ScheduleRound{LastTick: &last, NextTick: now.Add(time.Hour), Starts: []statestore.ScheduleStart{{Tick: last,
			Order: statestore.NewOrder{OrderID: id, Workflow: "tick", Payload: sc.Payload, PayloadHash: statestore.DerivedHash("tick", sc.Payload),
				FailurePolicy: wf.Policy, Steps: statestore.StepsOf(wf, 0), Actor: "test", Namespace: sc.Namespace},
			Version: statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: "test"}}}}
	}
	fired, err := supervisor.FireSchedules(ctx, "sup-1", statestore.SupervisorLease, plan)
	if err != nil || len(fired) != 1 || len(fired[0].Started) != 0 || fired[0].NoNamespace != "team-a" || fired[0].Skipped != 1 {
		t.Fatalf("a namespace that does not exist: %+v %v", fired, err)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE order_id = $1`, id); n != 0 {
		t.Fatalf("an order was written in a namespace that does not exist")
	}
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE schedules SET next_tick = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	fired, err = supervisor.FireSchedules(ctx, "sup-1", statestore.SupervisorLease, plan)
	if err != nil || len(fired) != 1 || len(fired[0].Started) != 1 || fired[0].NoNamespace != "" {
		t.Fatalf("in team-a: %+v %v", fired, err)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE order_id = $1 AND namespace = 'team-a'`, id); n != 1 {
		t.Fatalf("the schedule's order is not in team-a")
	}
}
