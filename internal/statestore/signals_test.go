package statestore_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

const loan = `
workflows:
  - name: loan
    policy: compensate
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - id: approval
        wait: {signal: approved, timeout: 1h, schema: {type: object, required: [by]}}
      - {action: open_account, agent: core, needs: [approval]}
      - {action: cooling_off, delay: 100ms, needs: [open_account]}
  - name: quick
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: approval, wait: {signal: approved, timeout: 200ms}}
      - {id: optional_ok, wait: {signal: nice, timeout: 200ms, on_timeout: skip}, needs: []}
  - name: gated
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: approval, wait: {signal: approved, timeout: 1h}, when: "true"}
`

func signal(t *testing.T, b bundle, orderID, id, name, payload string) statestore.SignalOutcome {
	t.Helper()
	sig := statestore.Signal{OrderID: orderID, ID: id, Name: name, Actor: "test"}
	if payload != "" {
		sig.Payload = []byte(payload)
	}
	out, err := b.store.ApplySignal(ctxFor(t), sig)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAWaitEndsWithItsSignal: a wait step awaits its signal once its
// needs ended, with no claim; a payload that breaks its schema, an
// unknown name or order, are refused with a reason; the signal ends the
// step (its payload the result) and the order goes on; the same id again
// changes nothing; a timer alone ends with its delay, where it fires (no
// claim); an ended order refuses signals.
func TestAWaitEndsWithItsSignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value": 550}`)
	if _, st := stepStates(t, b, o.OrderID); st["approval"] != statestore.StepAwaiting {
		t.Fatalf("approval is %s, want awaiting as soon as score ended", st["approval"])
	}
	if _, claimed := claimAll(t, b, o.OrderID)["approval"]; claimed {
		t.Fatal("a wait step was claimed")
	}
	waitStep := count(t, b, `SELECT step FROM steps WHERE order_id = $1 AND name = 'approval'`, o.OrderID)
	for _, c := range []struct{ id, name, payload, want string }{
		{"s0", "approved", `{"who": "ann"}`, statestore.SignalInvalidPayload},
		{"s0", "rejected", `{"by": "ann"}`, statestore.SignalNoSuchWait},
	} {
		if out := signal(t, b, o.OrderID, c.id, c.name, c.payload); out.Outcome != c.want || out.Detail == "" {
			t.Fatalf("signal %s %s: %+v, want %s with a reason", c.name, c.payload, out, c.want)
		}
	}
	if out := signal(t, b, messages.NewID(), "s0", "approved", `{"by": "ann"}`); out.Outcome != statestore.SignalUnknownOrder {
		t.Fatalf("a signal for no order: %+v", out)
	}
	if out := signal(t, b, o.OrderID, "s1", "approved", `{"by": "ann"}`); out.Outcome != statestore.SignalApplied || out.Step != waitStep {
		t.Fatalf("the signal: %+v", out)
	}
	if out := signal(t, b, o.OrderID, "s1", "approved", `{"by": "bob"}`); out.Outcome != statestore.SignalDuplicate {
		t.Fatalf("the same signal again: %+v", out)
	}
	if out := signal(t, b, o.OrderID, "s2", "approved", `{"by": "bob"}`); out.Outcome != statestore.SignalWaitEnded {
		t.Fatalf("another signal once the wait ended: %+v", out)
	}
	open := claimAll(t, b, o.OrderID)["open_account"]
	if string(open.Results) != `{"score": {"value": 550}, "approval": {"by": "ann"}}` &&
		string(open.Results) != `{"approval": {"by": "ann"}, "score": {"value": 550}}` {
		t.Fatalf("open_account sees %s: want the signal's payload as approval's result", open.Results)
	}
	reply(t, b, open, true, "")
	waitDue(t, b)
	if fired := fireAll(t, b, "sup-1"); len(fired) != 1 {
		t.Fatalf("fired %v, want the cooling_off timer", fired)
	}
	if status, st := stepStates(t, b, o.OrderID); status != statestore.OrderCompleted || st["cooling_off"] != statestore.StepProcessed {
		t.Fatalf("order %s, steps %v: the timer alone ends where it fires, and the order with it", status, st)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions t JOIN steps s ON s.order_id = t.order_id AND s.step = t.step
		WHERE t.order_id = $1 AND s.name IN ('approval', 'cooling_off') AND t.to_state IN ('pending', 'processing')`, o.OrderID); n != 0 {
		t.Fatalf("the wait or the timer went through %d claims' states", n)
	}
	if out := signal(t, b, o.OrderID, "s3", "approved", `{"by": "ann"}`); out.Outcome != statestore.SignalOrderEnded {
		t.Fatalf("a signal for an ended order: %+v", out)
	}
}

// TestASignalBeforeItsWaitIsKept: a signal that comes before its wait
// began is kept, and ends the wait the moment it begins.
func TestASignalBeforeItsWaitIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	if out := signal(t, b, o.OrderID, "early", "approved", `{"by": "ann"}`); out.Outcome != statestore.SignalKept {
		t.Fatalf("an early signal: %+v", out)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, "")
	if _, st := stepStates(t, b, o.OrderID); st["approval"] != statestore.StepProcessed || st["open_account"] != statestore.StepPending {
		t.Fatalf("steps %v: the kept signal ends the wait as it begins", st)
	}
}

// TestAWaitTimesOut: past its timeout a wait fails for good (the policy
// undoes what was done), or with on_timeout skip is skipped.
func TestAWaitTimesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, loan, "quick", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	reply(t, b, first["score"], true, "")
	if _, st := stepStates(t, b, o.OrderID); st["approval"] != statestore.StepAwaiting || st["optional_ok"] != statestore.StepAwaiting {
		t.Fatalf("steps %v: both waits await, with no claim", st)
	}
	waitDue(t, b)
	testenv.Eventually(t, 5*time.Second, "both waits to time out", func() bool {
		fireAll(t, b, "sup-1")
		_, st := stepStates(t, b, o.OrderID)
		return st["approval"] == statestore.StepError && st["optional_ok"] == statestore.StepSkipped
	})
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderCompensating || st["unscore"] != statestore.StepPending {
		t.Fatalf("order %s, steps %v: the timed-out wait fails the order, which undoes score", status, st)
	}
}

// TestATimedOutWaitEndsItsOrderTimedOut: an order a wait's timeout
// failed ends with reason timed_out (not refused), its detail saying the
// timeout as a person writes it.
func TestATimedOutWaitEndsItsOrderTimedOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, loan, "quick", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, "")
	waitDue(t, b)
	testenv.Eventually(t, 5*time.Second, "the wait to time out", func() bool {
		fireAll(t, b, "sup-1")
		_, st := stepStates(t, b, o.OrderID)
		return st["approval"] == statestore.StepError
	})
	reply(t, b, claimAll(t, b, o.OrderID)["unscore"], true, "")
	ev := endingEvent(t, b, o.OrderID, messages.StatusFailed)
	if ev.Reason != messages.EndTimedOut || ev.FailedStep != "approval" || !strings.Contains(ev.Detail, "no signal approved came within its timeout of 200 ms") {
		t.Fatalf("the failed event: %+v", ev)
	}
	var texts []string
	if err := b.pool.QueryRow(ctx, `SELECT array_agg(duration_text(ms) ORDER BY ms) FROM unnest('{200,1000,1500,20000,90000,600000,7200000,5400000}'::bigint[]) ms`).
		Scan(&texts); err != nil {
		t.Fatal(err)
	}
	if want := []string{"200 ms", "1 s", "1.5 s", "20 s", "90 s", "10 min", "90 min", "2 h"}; !slices.Equal(texts, want) {
		t.Fatalf("durations %v, want %v", texts, want)
	}
}

// TestAWaitClaimedAsTheOrderIsUndoneNeverBegins: an order cancelled
// between a wait step's claim (a wait with a when is claimed, to read it)
// and its wait cancels the wait, and ends.
func TestAWaitClaimedAsTheOrderIsUndoneNeverBegins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, loan, "gated", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, "")
	wait := claimAll(t, b, o.OrderID)["approval"]
	if wait.Step == 0 {
		t.Fatal("the wait with a when was not claimed")
	}
	if _, err := b.store.CancelOrder(ctx, o.OrderID, "operator"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.AwaitStep(ctx, wait, "s"); err != nil {
		t.Fatal(err)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["unscore"], true, "")
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderFailed || st["approval"] != statestore.StepCancelled {
		t.Fatalf("order %s, steps %v: the wait never begins and the order ends undone", status, st)
	}
}
