package statestore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

const bounded = `
workflows:
  - name: bounded
    deadline: 2h
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, compensation: {action: undo_b}}
      - {action: c, agent: x, compensation: {action: undo_c}}
`

// boundedOrder is an order of the bounded workflow with the workflow's
// deadline (as the submitter writes it) and the given on_deadline.
func boundedOrder(t *testing.T, how string) statestore.NewOrder {
	t.Helper()
	o := graphOrder(t, bounded, "bounded", `{}`, statestore.PolicyCompensate)
	o.Deadline, o.OnDeadline = 2*time.Hour, how
	return o
}

// passDeadline brings the order's deadline to now, as if its two hours
// had passed, and fires the due deadlines as the lease holder would.
func passDeadline(t *testing.T, b bundle, orderID string) []statestore.FiredDeadline {
	t.Helper()
	ctx := ctxFor(t)
	if _, err := b.pool.Exec(ctx, `UPDATE order_deadlines SET due_at = clock_timestamp() WHERE order_id = $1`, orderID); err != nil {
		t.Fatal(err)
	}
	return passDeadlineNow(t, b)
}

// fencedOut says whether an ok reply for c is refused as stale.
func fencedOut(t *testing.T, b bundle, c statestore.ClaimedStep) bool {
	t.Helper()
	_, err := b.store.ApplyReply(ctxFor(t), statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"})
	var stale *statestore.StaleReplyError
	if err != nil && !errors.As(err, &stale) {
		t.Fatal(err)
	}
	return err != nil
}

// TestADeadlineFencesStepsInFlightAndCompensates: an order whose deadline
// passes while a step is in flight has that step fenced out (its reply,
// when it comes, changes nothing) and is undone, the step in flight
// compensated as one that ran, each action once; the ending event's
// reason is deadline. A second firing finds nothing to fire.
func TestADeadlineFencesStepsInFlightAndCompensates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := boundedOrder(t, statestore.PolicyCompensate)
	insert(t, b, o)
	if d, ok, err := b.store.NextTimer(ctxFor(t)); err != nil || !ok || d < time.Hour || d > 2*time.Hour {
		t.Fatalf("next timer in %v (%v, %v), want the deadline's two hours", d, ok, err)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["a"], true, `{"a":1}`)
	inFlight := claimAll(t, b, o.OrderID)["b"]
	if inFlight.Name != "b" {
		t.Fatal("b was not claimed after a")
	}
	fired := passDeadline(t, b, o.OrderID)
	if len(fired) != 1 || !fired[0].Applied || fired[0].OnDeadline != "compensate" || fired[0].Workflow != "bounded" {
		t.Fatalf("fired %+v, want the order's deadline applied (compensate)", fired)
	}
	if !fencedOut(t, b, inFlight) {
		t.Fatal("the reply of a step fenced out by the deadline was applied")
	}
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderCompensating || st["b"] != statestore.StepCancelled || st["c"] != statestore.StepCancelled {
		t.Fatalf("after the deadline: order %s, steps %v; want compensating with b and c cancelled", status, st)
	}
	// The compensations run, the last action's first, each once.
	var undone []string
	for range 3 {
		for name, c := range claimAll(t, b, o.OrderID) {
			undone = append(undone, name)
			reply(t, b, c, true, "")
		}
	}
	if strings.Join(undone, ",") != "undo_b,undo_a" {
		t.Fatalf("compensations run: %v, want undo_b then undo_a, once each", undone)
	}
	status, st = stepStates(t, b, o.OrderID)
	if status != statestore.OrderFailed || st["undo_c"] != statestore.StepCancelled {
		t.Fatalf("at the end: order %s, steps %v; want failed, undo_c cancelled (c never ran)", status, st)
	}
	ev := endingEvent(t, b, o.OrderID, statestore.OrderFailed)
	if ev.Reason != messages.EndDeadline || !strings.Contains(ev.Detail, "deadline of 2 h") || strings.Join(ev.Undone, ",") != "a,b" {
		t.Fatalf("ending event %v, want reason deadline with its length", ev)
	}
	d, err := b.store.GetOrder(ctxFor(t), o.OrderID)
	if err != nil || d.Deadline == nil || d.Deadline.Outcome != "compensate" ||
		!strings.Contains(d.Deadline.Describe(), "2h, due ") || !strings.Contains(d.Deadline.Describe(), "followed on_deadline compensate") {
		t.Fatalf("the order's deadline as shown: %+v (%v)", d.Deadline, err)
	}
	if again := passDeadline(t, b, o.OrderID); len(again) != 0 {
		t.Fatalf("a deadline fired twice: %+v", again)
	}
}

// TestADeadlineHoldsOrFails: on_deadline hold holds the order in error
// (its step in flight held in error too, an operator alerted) for a
// resubmit that puts the step back to work; on_deadline fail fails it
// with nothing undone.
func TestADeadlineHoldsOrFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)

	held := boundedOrder(t, statestore.PolicyHold)
	insert(t, b, held)
	inFlight := claimAll(t, b, held.OrderID)["a"]
	if fired := passDeadline(t, b, held.OrderID); len(fired) != 1 || !fired[0].Applied {
		t.Fatalf("fired %+v", fired)
	}
	if !fencedOut(t, b, inFlight) {
		t.Fatal("a reply fenced out by the deadline was applied")
	}
	status, st := stepStates(t, b, held.OrderID)
	if status != statestore.OrderError || st["a"] != statestore.StepError {
		t.Fatalf("held: order %s, steps %v; want error with a in error", status, st)
	}
	if n := count(t, b, `SELECT count(*) FROM alerts WHERE order_id = $1 AND reason LIKE 'deadline passed%'`, held.OrderID); n != 1 {
		t.Fatalf("%d alerts of the deadline, want 1", n)
	}
	if ev := endingEvent(t, b, held.OrderID, statestore.OrderError); ev.Reason != messages.EndDeadline {
		t.Fatalf("held event %v, want reason deadline", ev)
	}
	if _, err := b.store.Resubmit(ctx, held.OrderID, 0, "test"); err != nil {
		t.Fatal(err)
	}
	if names(claimAll(t, b, held.OrderID)) != "a" {
		t.Fatal("a resubmit after the deadline did not put a back to work")
	}

	failed := boundedOrder(t, "fail")
	insert(t, b, failed)
	reply(t, b, claimAll(t, b, failed.OrderID)["a"], true, "")
	if fired := passDeadline(t, b, failed.OrderID); len(fired) != 1 || !fired[0].Applied {
		t.Fatalf("fired %+v", fired)
	}
	status, st = stepStates(t, b, failed.OrderID)
	if status != statestore.OrderFailed || st["undo_a"] != statestore.StepCancelled || st["b"] != statestore.StepCancelled {
		t.Fatalf("failed: order %s, steps %v; want failed, nothing undone", status, st)
	}
	if ev := endingEvent(t, b, failed.OrderID, statestore.OrderFailed); ev.Reason != messages.EndDeadline || len(ev.Undone) != 0 {
		t.Fatalf("failed event %v, want reason deadline", ev)
	}
}

// TestADeadlineRacingTheLastReply: the last step's reply and the deadline
// at the same moment; exactly one of them acts: the order completed (the
// deadline found it ended) or it was undone (the reply was fenced out),
// never both, and nothing is undone of a completed order.
func TestADeadlineRacingTheLastReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	wins := map[string]int{}
	for range 12 {
		o := boundedOrder(t, statestore.PolicyCompensate)
		insert(t, b, o)
		for _, name := range []string{"a", "b"} {
			reply(t, b, claimAll(t, b, o.OrderID)[name], true, "")
		}
		last := claimAll(t, b, o.OrderID)["c"]
		if _, err := b.pool.Exec(ctx, `UPDATE order_deadlines SET due_at = clock_timestamp() WHERE order_id = $1`, o.OrderID); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var applied bool
		var fired []statestore.FiredDeadline
		var replyErr, fireErr error
		wg.Go(func() {
			_, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: last.OrderID, Step: last.Step, Attempt: last.Attempt, OK: true, Actor: "s"})
			var stale *statestore.StaleReplyError
			if applied = err == nil; errors.As(err, &stale) {
				err = nil
			}
			replyErr = err
		})
		wg.Go(func() {
			fired, fireErr = b.store.FireDeadlines(context.WithoutCancel(ctx), "sup-1", statestore.SupervisorLease, 100)
		})
		wg.Wait()
		if replyErr != nil || fireErr != nil {
			t.Fatalf("reply: %v; deadline: %v", replyErr, fireErr)
		}
		deadlineActed := len(fired) == 1 && fired[0].Applied
		if applied == deadlineActed {
			t.Fatalf("reply applied %v, deadline applied %v (%+v): want exactly one", applied, deadlineActed, fired)
		}
		status, _ := stepStates(t, b, o.OrderID)
		switch {
		case applied && status != statestore.OrderCompleted:
			t.Fatalf("the reply won but the order is %s", status)
		case deadlineActed && status != statestore.OrderCompensating:
			t.Fatalf("the deadline won but the order is %s", status)
		}
		if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND kind = 'compensation' AND process_state = 'pending'`, o.OrderID); applied && n != 0 {
			t.Fatalf("a completed order has %d compensations pending", n)
		}
		wins[status]++
	}
	t.Logf("outcomes: %v", wins)
}

// TestAnOrdersOwnDeadlineAndNone: an order's own deadline replaces its
// workflow's and counts from its start; an order with none writes no
// deadline.
func TestAnOrdersOwnDeadlineAndNone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := boundedOrder(t, statestore.PolicyCompensate)
	o.Deadline = 90 * time.Minute
	start := time.Now().Add(24 * time.Hour)
	o.StartAt = &start
	insert(t, b, o)
	var ms int64
	var in time.Duration
	var secs float64
	if err := b.pool.QueryRow(ctxFor(t), `SELECT deadline_ms, extract(epoch FROM due_at - clock_timestamp()) FROM order_deadlines WHERE order_id = $1`,
		o.OrderID).Scan(&ms, &secs); err != nil {
		t.Fatal(err)
	}
	in = time.Duration(secs * float64(time.Second))
	if ms != 90*60*1000 || in < 25*time.Hour || in > 25*time.Hour+31*time.Minute {
		t.Fatalf("deadline of %d ms due in %v, want 90 min from the start a day away", ms, in)
	}
	plain := graphOrder(t, bounded, "bounded", `{}`, statestore.PolicyCompensate)
	insert(t, b, plain)
	if n := count(t, b, `SELECT count(*) FROM order_deadlines WHERE order_id = $1`, plain.OrderID); n != 0 {
		t.Fatalf("an order without a deadline wrote %d", n)
	}
}
