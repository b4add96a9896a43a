package statestore_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// endingEvent is the status event that ended orderID (its last one with
// status), decoded as an application reads it.
func endingEvent(t *testing.T, b bundle, orderID, status string) messages.StatusEvent {
	t.Helper()
	var body string
	if err := b.pool.QueryRow(ctxFor(t), `SELECT body::text FROM outbox WHERE order_id = $1 AND message_type = 'status_event'
		AND body->>'status' = $2 ORDER BY id DESC LIMIT 1`, orderID, status).Scan(&body); err != nil {
		t.Fatalf("the %s event of order %s: %v", status, orderID, err)
	}
	ev, err := messages.DecodeStatusEvent([]byte(body))
	if err != nil {
		t.Fatalf("the %s event %s: %v", status, body, err)
	}
	return ev
}

// claimOf claims until orderID's pending step is claimed.
func claimOf(t *testing.T, b bundle, orderID string) statestore.ClaimedStep {
	t.Helper()
	claimed, err := b.store.ClaimPending(ctxFor(t), "s", 50, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.OrderID == orderID {
			return c
		}
	}
	t.Fatalf("nothing of order %s to claim", orderID)
	return statestore.ClaimedStep{}
}

// TestEndingEventSaysWhy: the event that ends an order failed or in
// error names the step that failed, says why (refused, timed_out or
// cancelled) with the step's last error and its service's last answer,
// and names the actions that were undone, through every path that ends
// an order: a failed reply, the batched reply of the last compensation,
// the supervisor's threshold, an operator's cancel.
func TestEndingEventSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const answer = `402 Payment Required: {"error":"card declined"}`

	t.Run("refused, compensated", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyCompensate)
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true,
			Result: []byte(`{"reservation":"r-1"}`), Actor: "s"}); err != nil {
			t.Fatal(err)
		}
		c = claimOf(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt,
			Error: "charge_payment answered 402: card declined", LastAnswer: answer, Actor: "s"}); err != nil {
			t.Fatal(err)
		}
		// The compensations, the last through the batched statement.
		for {
			c = claimOf(t, b, o.OrderID)
			res, errs := b.store.ApplyReplies(ctx, []statestore.Reply{{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"}})
			if errs[0] != nil {
				t.Fatal(errs[0])
			}
			if res[0].OrderStatus == statestore.OrderFailed {
				break
			}
		}
		ev := endingEvent(t, b, o.OrderID, messages.StatusFailed)
		if ev.Reason != messages.EndRefused || ev.FailedStep != "charge_payment" || ev.Step == nil || *ev.Step != 2 ||
			!strings.Contains(ev.Detail, "card declined") || !strings.Contains(ev.Detail, answer) ||
			!slices.Equal(ev.Undone, []string{"reserve_inventory", "charge_payment"}) || !strings.Contains(string(ev.Results), "r-1") {
			t.Fatalf("the failed event: %+v (results %s)", ev, ev.Results)
		}
	})

	t.Run("refused, held", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyHold)
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt,
			Error: "reserve_inventory answered 409: out of stock", Actor: "s"}); err != nil {
			t.Fatal(err)
		}
		ev := endingEvent(t, b, o.OrderID, messages.StatusError)
		if ev.Reason != messages.EndRefused || ev.FailedStep != "reserve_inventory" || !strings.Contains(ev.Detail, "out of stock") || ev.Undone != nil {
			t.Fatalf("the error event: %+v", ev)
		}
	})

	t.Run("timed out, with the service's last answer", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyHold)
		for i := range o.Steps {
			o.Steps[i].Timeout, o.Steps[i].MaxFailures = 50*time.Millisecond, 1
		}
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		const down = `503 Service Unavailable: {"error":"mail relay down"}`
		if kept, err := b.store.NoteAnswer(ctx, o.OrderID, c.Step, c.Attempt, down); err != nil || !kept {
			t.Fatalf("note the answer: %v %v", kept, err)
		}
		if kept, _ := b.store.NoteAnswer(ctx, o.OrderID, c.Step, c.Attempt+1, "stale"); kept {
			t.Fatal("an answer for another attempt was kept")
		}
		waitExpired(t, b, o.OrderID)
		if _, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "supervisor:t", Limit: 100, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		ev := endingEvent(t, b, o.OrderID, messages.StatusError)
		if ev.Reason != messages.EndTimedOut || ev.FailedStep != "reserve_inventory" || !strings.Contains(ev.Detail, "complete_by passed") ||
			!strings.Contains(ev.Detail, "mail relay down") {
			t.Fatalf("the error event: %+v", ev)
		}
		d, err := b.store.GetOrder(ctx, o.OrderID)
		if err != nil || d.Steps[0].LastAnswer != down {
			t.Fatalf("the step's last answer: %q %v", d.Steps[0].LastAnswer, err)
		}
		if n := count(t, b, `SELECT count(*) FROM alerts WHERE order_id = $1 AND reason LIKE '%mail relay down%'`, o.OrderID); n != 1 {
			t.Fatalf("%d alerts quote the service's last answer, want 1", n)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyCompensate)
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.CancelOrder(ctx, o.OrderID, "console:alice"); err != nil {
			t.Fatal(err)
		}
		c = claimOf(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"}); err != nil {
			t.Fatal(err)
		}
		ev := endingEvent(t, b, o.OrderID, messages.StatusFailed)
		if ev.Reason != messages.EndCancelled || !strings.Contains(ev.Detail, "console:alice") || ev.FailedStep != "" ||
			!slices.Equal(ev.Undone, []string{"reserve_inventory"}) {
			raw, _ := json.Marshal(ev)
			t.Fatalf("the failed event: %s", raw)
		}
	})
}
