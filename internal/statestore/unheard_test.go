package statestore_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// relayReporting relays the whole outbox, reporting the given statuses as
// returned by the broker, and fails the test unless every message went.
func relayReporting(t *testing.T, b bundle, unheardFor time.Duration, unheard ...string) {
	t.Helper()
	n, err := b.store.RelayOutboxHeard(ctxFor(t), 100, unheardFor, func(_ context.Context, msgs []statestore.OutboxMessage) (int, []string, error) {
		return len(msgs), unheard, nil
	})
	if err != nil || n == 0 {
		t.Fatalf("relay: %d, %v", n, err)
	}
}

// eventsOf counts an order's status events in the outbox, by status.
func eventsOf(t *testing.T, b bundle, orderID, status string) int {
	t.Helper()
	return count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'status_event' AND body->>'status' = $2`, orderID, status)
}

// TestUnheardProgressEventsAreNotWritten: once the relay reports a
// progress status returned (no queue bound for it), orders without a
// reply_to get no event of that status until the mark ends or a listener
// says it hears them; orders with a reply_to, other statuses and events
// that end an order are written as before.
func TestUnheardProgressEventsAreNotWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)

	first := order(1, time.Minute, 1)
	insert(t, b, first)
	relayReporting(t, b, time.Hour, "received")

	quiet := order(1, time.Minute, 1)
	insert(t, b, quiet)
	if n := eventsOf(t, b, quiet.OrderID, "received"); n != 0 {
		t.Fatalf("%d received events written while received is unheard, want none", n)
	}
	asked := order(1, time.Minute, 1)
	asked.ReplyTo = "shop.status"
	insert(t, b, asked)
	if n := eventsOf(t, b, asked.OrderID, "received"); n != 1 {
		t.Fatalf("an order with a reply_to: %d received events, want 1", n)
	}

	// processing is heard: claiming writes it (and says so: the relay has
	// work), then the relay marks it.
	got, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(got) != 3 {
		t.Fatalf("claim: %d steps, %v; want 3", len(got), err)
	}
	for _, st := range got {
		if !st.Told {
			t.Fatalf("a claim that wrote the processing event of order %s says it did not", st.OrderID)
		}
	}
	if n := eventsOf(t, b, quiet.OrderID, "processing"); n != 1 {
		t.Fatalf("processing, not yet unheard: %d events, want 1", n)
	}
	relayReporting(t, b, time.Hour, "processing")
	later := order(1, time.Minute, 1)
	insert(t, b, later)
	steps, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(steps) != 1 {
		t.Fatalf("claim: %d steps, %v; want 1", len(steps), err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1`, later.OrderID); n != 0 {
		t.Fatalf("%d progress events written while unheard, want none", n)
	}
	if steps[0].Told {
		t.Fatal("a claim that wrote no event says it did: the relay would run for nothing")
	}
	// An order's end is always told.
	_, errs := b.store.ApplyReplies(ctx, []statestore.Reply{{OrderID: later.OrderID, Step: 1, Attempt: steps[0].Attempt, OK: true, Result: []byte(`{}`), Actor: "s"}})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if n := eventsOf(t, b, later.OrderID, "completed"); n != 1 {
		t.Fatalf("%d completed events, want 1", n)
	}
	// order_transition, the door of the other moves, skips alike.
	relayReporting(t, b, time.Hour, "compensating")
	for _, to := range []string{"compensating", "failed"} {
		if _, err := b.pool.Exec(ctx, `SELECT order_transition($1, $2, 1, 'test', 'test')`, quiet.OrderID, to); err != nil {
			t.Fatal(err)
		}
	}
	if c, f := eventsOf(t, b, quiet.OrderID, "compensating"), eventsOf(t, b, quiet.OrderID, "failed"); c != 0 || f != 1 {
		t.Fatalf("compensating (unheard) %d events, failed %d; want 0 and 1", c, f)
	}

	// A listener that binds every status clears the marks.
	if err := b.store.HearStatusEvents(ctx); err != nil {
		t.Fatal(err)
	}
	heard := order(1, time.Minute, 1)
	insert(t, b, heard)
	if n := eventsOf(t, b, heard.OrderID, "received"); n != 1 {
		t.Fatalf("after HearStatusEvents: %d received events, want 1", n)
	}

	// A mark ends by itself: events are written again once it has passed.
	relayReporting(t, b, 50*time.Millisecond, "received")
	deadline := time.Now().Add(10 * time.Second)
	for written := 0; written == 0; {
		if time.Now().After(deadline) {
			t.Fatal("received events still not written 10 s after a 50 ms mark")
		}
		o := order(1, time.Minute, 1)
		insert(t, b, o)
		written = eventsOf(t, b, o.OrderID, "received")
	}

	// 0 marks nothing.
	relayReporting(t, b, 0, "received")
	zero := order(1, time.Minute, 1)
	insert(t, b, zero)
	if n := eventsOf(t, b, zero.OrderID, "received"); n != 1 {
		t.Fatalf("after a relay that marks nothing: %d received events, want 1", n)
	}
}

// stepEventsOf are an order's step events in the outbox, as
// "step:event:state[:wait]", in the order they were written.
func stepEventsOf(t *testing.T, b bundle, orderID string) []string {
	t.Helper()
	return texts(t, b, `SELECT concat_ws(':', body->>'name', body->>'event', body->>'state', body->>'wait') FROM outbox
		WHERE order_id = $1 AND message_type = 'step_event' ORDER BY id`, orderID)
}

// TestStepEventsAreWrittenWhileHeard: step events are written by the
// door of steps only once a listener said it hears them (HearStepEvents;
// hearing every status is not enough), one for each move that tells one:
// claimed, processed, awaiting with its signal, compensated for a
// compensation, failed with why; once the broker returns one they are
// not written until the mark passes.
func TestStepEventsAreWrittenWhileHeard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	quiet := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, quiet)
	if err := b.store.HearStatusEvents(ctx); err != nil {
		t.Fatal(err)
	}
	reply(t, b, claimAll(t, b, quiet.OrderID)["score"], true, "")
	if got := stepEventsOf(t, b, quiet.OrderID); len(got) != 0 {
		t.Fatalf("step events written before anyone asked: %v", got)
	}

	if err := b.store.HearStepEvents(ctx); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"score":7}`)
	want := []string{"score:claimed:processing", "score:processed:processed", "approval:awaiting:awaiting:approved"}
	if got := stepEventsOf(t, b, o.OrderID); !slices.Equal(got, want) {
		t.Fatalf("step events %v, want %v", got, want)
	}
	// The wait began with no claim: attempt 0.
	var body []byte
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE order_id = $1 AND message_type = 'step_event' ORDER BY id DESC LIMIT 1`,
		o.OrderID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	ev, err := messages.DecodeStepEvent(body)
	if err != nil || ev.OrderID != o.OrderID || ev.Kind != "action" || ev.Attempt != 0 || !strings.Contains(ev.Reason, "approved") {
		t.Fatalf("the awaiting event %s: %+v %v", body, ev, err)
	}
	// A cancel undoes score: its compensation's end is told as compensated,
	// the wait's as cancelled.
	if _, err := b.store.CancelOrder(ctx, o.OrderID, "ann"); err != nil {
		t.Fatal(err)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["unscore"], true, "")
	got := stepEventsOf(t, b, o.OrderID)
	if !slices.Contains(got, "approval:cancelled:cancelled") || !slices.Contains(got, "unscore:compensated:processed") {
		t.Fatalf("after the cancel: %v", got)
	}

	// Returned by the broker: not written while the mark lasts.
	relayReporting(t, b, time.Hour, "step")
	later := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, later)
	reply(t, b, claimAll(t, b, later.OrderID)["score"], true, "")
	if got := stepEventsOf(t, b, later.OrderID); len(got) != 0 {
		t.Fatalf("step events written while unheard: %v", got)
	}
	// Asked for again: written again.
	if err := b.store.HearStepEvents(ctx); err != nil {
		t.Fatal(err)
	}
	again := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, again)
	claimAll(t, b, again.OrderID)
	if got := stepEventsOf(t, b, again.OrderID); !slices.Equal(got, []string{"score:claimed:processing"}) {
		t.Fatalf("after hearing them again: %v", got)
	}
}

// TestHearingWaitsForTheWritersInFlight: a listener clears a mark
// (HearStepEvents, HearStatusEvents) and then reads the store, and must
// see every move that wrote no event for want of it. A transaction that
// moved a step (or an order) has read the mark and written no event; as
// long as it is open, clearing the mark waits (in await_writers, seen in
// pg_stat_activity under this test's own application_name), and returns
// once it committed. Other writers go on meanwhile.
func TestHearingWaitsForTheWritersInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	listener, app := storeNamed(t, b, "hear-", nil)
	o := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	other := order(1, time.Minute, 1)
	for _, c := range []struct {
		table, move string
		hear        func(context.Context) error
	}{
		{"steps", `UPDATE steps SET process_state = 'error', moves = moves + 1, moved_by = 't', moved_why = 'a writer in flight'
			WHERE order_id = $1 AND process_state = 'pending'`, listener.HearStepEvents},
		{"orders", `SELECT order_transition($1, 'processing', 0, 't', 'a writer in flight')`, listener.HearStatusEvents},
	} {
		func() {
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// A failed check leaves no writer holding its locks.
			defer func() { _ = tx.Rollback(ctx) }()
			if tag, err := tx.Exec(ctx, c.move, o.OrderID); err != nil || tag.RowsAffected() == 0 {
				t.Fatalf("%s: the writer's move: %v %v", c.table, tag, err)
			}
			if c.table == "steps" {
				var events int
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE message_type = 'step_event'`).Scan(&events); err != nil || events != 0 {
					t.Fatalf("the writer wrote %d step events (%v) before anyone heard them", events, err)
				}
			}
			heard := make(chan error, 1)
			go func() { heard <- c.hear(ctx) }()
			testenv.Eventually(t, 10*time.Second, "clearing the mark to wait for the "+c.table+" writer", func() bool {
				select {
				case err := <-heard:
					t.Fatalf("%s: the mark was cleared (%v) while a writer that read it was in flight", c.table, err)
				default:
				}
				return count(t, b, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
					AND query LIKE '%await_writers%'`, app) > 0
			})
			// Writers that come meanwhile are not held back.
			if c.table == "orders" {
				insert(t, b, other)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-heard:
				if err != nil {
					t.Fatalf("%s: clearing the mark: %v", c.table, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: clearing the mark did not end after the writer committed", c.table)
			}
		}()
	}
	if got := texts(t, b, `SELECT unheard_until::text FROM status_routes WHERE status = 'step'`); !slices.Equal(got, []string{"-infinity"}) {
		t.Fatalf("the step mark after hearing: %v", got)
	}
}
