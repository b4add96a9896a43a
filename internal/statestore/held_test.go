package statestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// relayAll relays the whole outbox and returns what it handed out.
func relayAll(t *testing.T, b bundle) []statestore.OutboxMessage {
	t.Helper()
	var all []statestore.OutboxMessage
	_, err := b.store.RelayOutbox(ctxFor(t), 1000, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
		all = append(all, msgs...)
		return len(msgs), nil
	})
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	return all
}

// endHeld runs a single-step order to its last reply, applied by
// ApplyRepliesPublishing with hold after the outbox was emptied, or not
// when keep is true (its earlier events then wait in the outbox).
func endHeld(t *testing.T, b bundle, hold time.Duration, keep bool) (statestore.NewOrder, statestore.ApplyResult) {
	t.Helper()
	o := order(1, time.Minute, 1)
	insert(t, b, o)
	c := claimOf(t, b, o.OrderID)
	if !keep {
		relayAll(t, b)
	}
	res, errs := b.store.ApplyRepliesPublishing(ctxFor(t), []statestore.Reply{{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true,
		Result: []byte(`{"ok":1}`), Actor: "s"}}, nil, hold)
	if errs[0] != nil || res[0].OrderStatus != statestore.OrderCompleted {
		t.Fatalf("the last reply: %+v, %v", res[0], errs[0])
	}
	return o, res[0]
}

// An order's end applied by ApplyRepliesPublishing on an empty outbox is
// held for its writer: handed back to publish, passed over by every relay
// (and so is what was written after it) until the writer forgets it, or
// until its hold passes. When the outbox is not empty, or through
// ApplyRepliesClaiming, it is the relay's at once, in its order.
func TestAnEndIsHeldForItsWriter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)

	o, res := endHeld(t, b, time.Minute, false)
	ev := res.Event
	if ev == nil {
		t.Fatal("the order's end was not held for its writer, with the outbox empty")
	}
	body, err := messages.DecodeStatusEvent(ev.Body)
	if err != nil || body.OrderID != o.OrderID || body.Status != messages.StatusCompleted || ev.OrderID != o.OrderID ||
		ev.Type != statestore.OutboxStatusEvent || ev.MessageID == "" || !sameJSON(t, body.Results, []byte(`{"step1":{"ok":1}}`)) {
		t.Fatalf("the held event: %+v (%+v, %v)", ev, body, err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE id = $1 AND message_id = $2 AND held_until > now()`, ev.ID, ev.MessageID); n != 1 {
		t.Fatalf("the held event is %d held rows of the outbox, want 1", n)
	}
	// What comes after it waits for it.
	later := order(1, time.Minute, 1)
	insert(t, b, later)
	handed := 0
	_, err = b.store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
		handed += len(msgs)
		return len(msgs), nil
	})
	if !errors.Is(err, statestore.ErrRelayBusy) || handed != 0 {
		t.Fatalf("a relay with a held event first: handed %d, %v; want none, busy", handed, err)
	}
	more, err := b.store.ForgetPublished(ctx, []int64{ev.ID})
	if err != nil || !more {
		t.Fatalf("forget: more %v, %v; want more (the later order's event)", more, err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE id = $1`, ev.ID); n != 0 {
		t.Fatal("the forgotten event is still in the outbox")
	}
	if got := relayAll(t, b); len(got) == 0 || got[0].OrderID != later.OrderID {
		t.Fatalf("after the forget the relay handed %+v, want the later order's events", got)
	}
	if more, err := b.store.ForgetPublished(ctx, []int64{ev.ID}); err != nil || more {
		t.Fatalf("forget again, the outbox empty: more %v, %v", more, err)
	}

	// An outbox not empty: the end is the relay's, after the events
	// before it.
	o, res = endHeld(t, b, time.Minute, true)
	if res.Event != nil {
		t.Fatalf("an end held though the outbox held events: %+v", res.Event)
	}
	got := relayAll(t, b)
	if len(got) == 0 || got[len(got)-1].OrderID != o.OrderID || !endsWith(got[len(got)-1], messages.StatusCompleted) {
		t.Fatalf("the relay handed %+v, want the order's completed event last", got)
	}

	// Not asked to hold: the relay's.
	o2 := order(1, time.Minute, 1)
	insert(t, b, o2)
	c := claimOf(t, b, o2.OrderID)
	relayAll(t, b)
	if res, errs := b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{{OrderID: o2.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"}},
		nil); errs[0] != nil || res[0].Event != nil || res[0].OrderStatus != statestore.OrderCompleted {
		t.Fatalf("ApplyRepliesClaiming: %+v, %v; want completed, nothing held", res[0], errs[0])
	}
	if got := relayAll(t, b); len(got) != 1 || !endsWith(got[0], messages.StatusCompleted) {
		t.Fatalf("the relay handed %+v, want the completed event", got)
	}

	// A writer that never forgets: the relay takes the event once its
	// hold has passed.
	o3, res := endHeld(t, b, 300*time.Millisecond, false)
	if res.Event == nil {
		t.Fatal("not held")
	}
	var late []statestore.OutboxMessage
	testenv.Eventually(t, 10*time.Second, "the relay to take the event whose hold passed", func() bool {
		_, err := b.store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
			late = append(late, msgs...)
			return len(msgs), nil
		})
		return err == nil && len(late) > 0
	})
	if len(late) != 1 || late[0].ID != res.Event.ID || late[0].OrderID != o3.OrderID {
		t.Fatalf("after the hold the relay handed %+v, want the held event %d", late, res.Event.ID)
	}
}

func endsWith(m statestore.OutboxMessage, status string) bool {
	ev, err := messages.DecodeStatusEvent(m.Body)
	return err == nil && ev.Status == status
}
