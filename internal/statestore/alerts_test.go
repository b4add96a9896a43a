package statestore_test

import (
	"errors"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// TestAlertsAreKeptAndAcknowledged: an alert is a row that every reader
// sees until an operator acknowledges it, as the database login that did,
// and after; a failed reply's alert counts that failure.
func TestAlertsAreKeptAndAcknowledged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(2, time.Hour, 3)
	insert(t, b, o)
	claimed, err := b.store.ClaimPending(ctx, "s", 1, "")
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: false, Error: "400 card declined", Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // reading consumes nothing
		open, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: true})
		if err != nil || len(open) != 1 {
			t.Fatalf("open alerts: %+v %v", open, err)
		}
		a := open[0]
		if a.OrderID != o.OrderID || a.Step == nil || *a.Step != 1 || a.FailureCount != 1 || a.RaisedBy != "s" || a.AckedAt != nil {
			t.Fatalf("alert %+v", a)
		}
	}
	if n, err := b.store.OpenAlerts(ctx); err != nil || n != 1 {
		t.Fatalf("open alerts count %d %v", n, err)
	}
	if got := count(t, b, `SELECT count(*) FROM outbox WHERE message_type = 'operator_alert' AND order_id = $1
		AND message_id = (SELECT message_id FROM alerts WHERE order_id = $1)`, o.OrderID); got != 1 {
		t.Fatalf("the alert's outbox message: %d", got)
	}
	all, err := b.store.ListAlerts(ctx, statestore.AlertFilter{})
	if err != nil || len(all) != 1 {
		t.Fatal(all, err)
	}
	var login string
	if err := b.pool.QueryRow(ctx, `SELECT session_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	a, already, err := b.store.AckAlert(ctx, all[0].ID, "alice", nil)
	if err != nil || already || a.AckedAt == nil || a.AckedBy != login || a.AckedAs != "alice" {
		t.Fatalf("ack: %+v %v %v", a, already, err)
	}
	again, already, err := b.store.AckAlert(ctx, all[0].ID, "mallory", nil)
	if err != nil || !already || again.AckedAs != "alice" || !again.AckedAt.Equal(*a.AckedAt) {
		t.Fatalf("second ack: %+v %v %v", again, already, err)
	}
	if open, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: true}); err != nil || len(open) != 0 {
		t.Fatalf("open alerts after the ack: %+v %v", open, err)
	}
	if all, err := b.store.ListAlerts(ctx, statestore.AlertFilter{Since: time.Hour}); err != nil || len(all) != 1 || all[0].AckedBy != login {
		t.Fatalf("alerts of the last hour: %+v %v", all, err)
	}
	if _, _, err := b.store.AckAlert(ctx, all[0].ID+1000, "alice", nil); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("ack of an unknown alert: %v", err)
	}

	// The supervisor's alert says how many times the step ran out of time.
	o2 := order(1, 10*time.Millisecond, 1)
	insert(t, b, o2)
	if _, err := b.store.ClaimPending(ctx, "s", 1, ""); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, b, o2.OrderID)
	if _, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "sup", Limit: 10}); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OrderID: o2.OrderID})
	if err != nil || len(got) != 1 || got[0].FailureCount != 1 || got[0].RaisedBy != "sup" {
		t.Fatalf("the sweep's alert: %+v %v", got, err)
	}
	after, err := b.store.ListAlerts(ctx, statestore.AlertFilter{AfterID: all[0].ID, Oldest: true})
	if err != nil || len(after) != 1 || after[0].ID != got[0].ID {
		t.Fatalf("alerts after %d: %+v %v", all[0].ID, after, err)
	}
}

// TestPurgeEnded: only orders that ended (completed, failed) before the
// cut-off go, with every row they own; nothing held in error, nothing in
// flight, nothing recent, nothing another transaction holds.
func TestPurgeEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	mk := func(status string, ago time.Duration) statestore.NewOrder {
		o := order(2, time.Hour, 3)
		insert(t, b, o)
		testenv.Forge(t, b.pool, `UPDATE orders SET status = $2, created_at = now() - make_interval(secs => $3::float8),
			updated_at = now() - make_interval(secs => $3::float8) WHERE order_id = $1`, o.OrderID, status, ago.Seconds())
		return o
	}
	oldDone, oldFailed := mk(statestore.OrderCompleted, 2*time.Hour), mk(statestore.OrderFailed, 2*time.Hour)
	oldError, oldBusy := mk(statestore.OrderError, 2*time.Hour), mk(statestore.OrderProcessing, 2*time.Hour)
	newDone := mk(statestore.OrderCompleted, time.Minute)
	heldDone := mk(statestore.OrderCompleted, 2*time.Hour)
	if _, err := b.pool.Exec(ctx, `INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_by)
		VALUES (gen_random_uuid(), $1, 1, 'test', 1, 'test')`, oldFailed.OrderID); err != nil {
		t.Fatal(err)
	}
	h := holdOrder(t, b, heldDone.OrderID)
	history := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[])`, []string{oldDone.OrderID, oldFailed.OrderID})

	if _, err := b.store.PurgeEnded(ctx, time.Hour, []string{statestore.OrderError}, 10); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("purge of orders in error: %v, want refused", err)
	}
	if _, err := b.store.PurgeEnded(ctx, -time.Hour, nil, 10); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("purge with a negative age: %v, want refused", err)
	}
	p, err := b.store.PurgeEnded(ctx, time.Hour, []string{statestore.OrderFailed}, 10)
	if err != nil || p.Orders != 1 {
		t.Fatalf("purge of failed orders: %+v %v", p, err)
	}
	p2, err := b.store.PurgeEnded(ctx, time.Hour, nil, 10)
	if err != nil || p2.Orders != 1 {
		t.Fatalf("purge of ended orders: %+v %v", p2, err)
	}
	p.Add(p2)
	if p.Steps != 4 || p.Transitions != int64(history) || p.Alerts != 1 {
		t.Fatalf("purged %+v, want 2 orders' 4 steps, %d history rows, 1 alert", p, history)
	}
	for _, o := range []statestore.NewOrder{oldDone, oldFailed} {
		if n := count(t, b, `SELECT (SELECT count(*) FROM orders WHERE order_id = $1) + (SELECT count(*) FROM steps WHERE order_id = $1)
			+ (SELECT count(*) FROM transitions WHERE order_id = $1) + (SELECT count(*) FROM alerts WHERE order_id = $1)`, o.OrderID); n != 0 {
			t.Errorf("order %s left %d rows", o.OrderID, n)
		}
	}
	for _, o := range []statestore.NewOrder{oldError, oldBusy, newDone, heldDone} {
		if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1`, o.OrderID); n != 2 {
			t.Errorf("order %s lost rows: %d steps left", o.OrderID, n)
		}
	}
	h.release()
	if p, err := b.store.PurgeEnded(ctx, time.Hour, nil, 10); err != nil || p.Orders != 1 {
		t.Fatalf("purge once the held order is free: %+v %v", p, err)
	}
}

// TestAlertResolvedWhenItsOrderEnds: an order held in error raises an
// alert; resubmitted, it completes, and the alert is no longer open: it
// reads as resolved, saying how, in every listing and count, without
// anyone acknowledging it. The held order's failed step counts as a step
// in error (it needs an operator) until then; the failed step of an
// order that was undone and ended does not.
func TestAlertResolvedWhenItsOrderEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	held, undone := sagaOrder(statestore.PolicyHold), sagaOrder(statestore.PolicyCompensate)
	insert(t, b, held)
	run(t, b, held.OrderID, false)
	insert(t, b, undone)
	run(t, b, undone.OrderID, false)
	run(t, b, undone.OrderID, true) // its compensation: the order is undone
	if st, _ := states(t, b, undone.OrderID); st != statestore.OrderFailed {
		t.Fatalf("the undone order is %s", st)
	}
	stats, err := b.store.Stats(ctx)
	if err != nil || stats.ByState[statestore.StepError] != 1 || stats.OpenAlerts != 1 {
		t.Fatalf("with one order held: %+v %v", stats, err)
	}
	if _, err := b.store.Resubmit(ctx, held.OrderID, 0, "operator:bob"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		run(t, b, held.OrderID, true)
	}
	if st, _ := states(t, b, held.OrderID); st != statestore.OrderCompleted {
		t.Fatalf("the resubmitted order is %s", st)
	}
	all, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OrderID: held.OrderID})
	if err != nil || len(all) != 1 || all[0].Open() || all[0].ResolvedAt == nil || all[0].Resolution != "the order completed" || all[0].AckedAt != nil {
		t.Fatalf("the alert after its order completed: %+v %v", all, err)
	}
	open, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: true})
	if err != nil || len(open) != 0 {
		t.Fatalf("open alerts: %+v %v", open, err)
	}
	stats, err = b.store.Stats(ctx)
	if n, _ := b.store.OpenAlerts(ctx); err != nil || n != 0 || stats.OpenAlerts != 0 || stats.ByState[statestore.StepError] != 0 {
		t.Fatalf("after: open alerts %d, stats %+v %v", n, stats, err)
	}
}

// TestAlertsBelongToTheirOrdersNamespace: an alert is its order's
// namespace's: a list of some namespaces shows only theirs, an
// acknowledgement within namespaces cannot reach another's (it is not
// found, and stays open), and the open alerts are counted by namespace,
// with every namespace of the deployment.
func TestAlertsBelongToTheirOrdersNamespace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := b.store.AddNamespace(ctx, ns, "test"); err != nil {
			t.Fatal(err)
		}
	}
	inA, inDefault := order(1, time.Hour, 3), order(1, time.Hour, 3)
	inA.Namespace = "team-a"
	insert(t, b, inA)
	insert(t, b, inDefault)
	claimed, err := b.store.ClaimPending(ctx, "s", 2, "")
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	for _, o := range []statestore.NewOrder{inA, inDefault} {
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: false, Error: "400 no", Actor: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	alertOf := map[string]statestore.Alert{}
	for _, ns := range []string{"team-a", "default"} {
		got, err := b.store.ListAlerts(ctx, statestore.AlertFilter{Namespaces: []string{ns}})
		if err != nil || len(got) != 1 || got[0].Namespace != ns {
			t.Fatalf("alerts of %s: %+v %v", ns, got, err)
		}
		alertOf[ns] = got[0]
	}
	if alertOf["team-a"].OrderID != inA.OrderID || alertOf["default"].OrderID != inDefault.OrderID {
		t.Fatalf("alerts by namespace %+v", alertOf)
	}
	// The message on the alerts exchange names team-a's; default's is as
	// it was before namespaces.
	for ns, a := range alertOf {
		var body []byte
		if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE message_id = $1`, a.MessageID).Scan(&body); err != nil {
			t.Fatal(err)
		}
		msg, err := messages.DecodeOperatorAlert(body)
		if want := map[string]string{"team-a": "team-a"}[ns]; err != nil || msg.Namespace != want {
			t.Fatalf("the alert message of %s's order names namespace %q (%v), want %q: %s", ns, msg.Namespace, err, want, body)
		}
	}
	if got, err := b.store.ListAlerts(ctx, statestore.AlertFilter{Namespaces: []string{"team-b"}}); err != nil || len(got) != 0 {
		t.Fatalf("team-b sees alerts %+v %v", got, err)
	}
	if got, err := b.store.ListAlerts(ctx, statestore.AlertFilter{}); err != nil || len(got) != 2 {
		t.Fatalf("every namespace's alerts %+v %v", got, err)
	}
	if _, _, err := b.store.AckAlert(ctx, alertOf["default"].ID, "mallory", []string{"team-a"}); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("team-a acknowledged default's alert: %v", err)
	}
	if a, _, err := b.store.AckAlert(ctx, alertOf["team-a"].ID, "ann", []string{"team-a"}); err != nil || a.AckedAs != "ann" || a.Namespace != "team-a" {
		t.Fatalf("team-a's own alert: %+v %v", a, err)
	}
	open, err := b.store.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: true})
	if err != nil || len(open) != 1 || open[0].ID != alertOf["default"].ID {
		t.Fatalf("open after the acks: %+v %v", open, err)
	}
	stats, err := b.store.Stats(ctx)
	if err != nil || stats.OpenAlerts != 1 || len(stats.OpenAlertsIn) != 3 ||
		stats.OpenAlertsIn["default"] != 1 || stats.OpenAlertsIn["team-a"] != 0 || stats.OpenAlertsIn["team-b"] != 0 {
		t.Fatalf("open alerts counted %d, by namespace %v (%v)", stats.OpenAlerts, stats.OpenAlertsIn, err)
	}
	if ns, found, err := b.store.NamespaceOf(ctx, inA.OrderID); err != nil || !found || ns != "team-a" {
		t.Fatalf("namespace of team-a's order: %q %v %v", ns, found, err)
	}
	if _, found, err := b.store.NamespaceOf(ctx, "00000000-0000-4000-8000-000000000000"); err != nil || found {
		t.Fatalf("namespace of an unknown order: found %v, %v", found, err)
	}
}
