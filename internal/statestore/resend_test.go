package statestore_test

import (
	"errors"
	"testing"
	"time"

	"sas/internal/statestore"
)

// TestReleaseSentPutsBackWhatASchedulerSent: when its broker connection
// comes back, a scheduler whose step messages are transient hands back to
// pending the steps it had sent (ReleaseSent): its own, not another
// scheduler's, not one a service holds after a 202; the attempt's reply is
// then stale, no failure is counted, and the history says why.
func TestReleaseSentPutsBackWhatASchedulerSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	mine := []statestore.NewOrder{order(1, time.Hour, 3), order(1, time.Hour, 3), order(1, time.Hour, 3)}
	for _, o := range mine {
		insert(t, b, o)
	}
	sent, err := b.store.ClaimPending(ctx, "s1", 10, "")
	if err != nil || len(sent) != 3 {
		t.Fatalf("claim: %v %v", sent, err)
	}
	theirs := order(1, time.Hour, 3)
	insert(t, b, theirs)
	if other, err := b.store.ClaimPending(ctx, "s2", 10, ""); err != nil || len(other) != 1 {
		t.Fatalf("the other scheduler's claim: %v %v", other, err)
	}
	held := sent[2]
	if _, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: held.OrderID, Step: held.Step, Attempt: held.Attempt, Answer: "202 Accepted", Actor: "s1"}); err != nil {
		t.Fatal(err)
	}

	n, err := b.store.ReleaseSent(ctx, "s1", "broker connection lost")
	if err != nil || n != 2 {
		t.Fatalf("released %d steps (%v), want the 2 s1 sent that no service holds", n, err)
	}
	for _, c := range sent[:2] {
		if got := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = $2 AND process_state = 'pending'
			AND locked_by IS NULL AND attempt = $3 AND failure_count = 0`, c.OrderID, c.Step, c.Attempt); got != 1 {
			t.Fatalf("order %s: the step sent is not pending, unlocked, at its attempt with no failure counted", c.OrderID)
		}
		if got := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = $2 AND from_state = 'processing'
			AND to_state = 'pending' AND actor = 's1' AND reason = 'released: broker connection lost'`, c.OrderID, c.Step); got != 1 {
			t.Fatalf("order %s: %d history rows of the release, want 1", c.OrderID, got)
		}
	}
	if got := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND process_state = 'processing'`,
		[]string{held.OrderID, theirs.OrderID}); got != 2 {
		t.Fatalf("%d of the held step and the other scheduler's still processing, want both", got)
	}

	// The released attempt's reply (its request was not lost after all)
	// changes nothing; the step is claimed again as a new attempt.
	c := sent[0]
	before := snapshot(t, b, c.OrderID)
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true,
		Result: []byte(`{}`), Actor: "s1"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("the released attempt's reply: %v, want stale", err)
	}
	if after := snapshot(t, b, c.OrderID); after != before {
		t.Fatalf("the released attempt's reply changed the order:\nbefore %s\nafter  %s", before, after)
	}
	again, err := b.store.ClaimPending(ctx, "s1", 10, "")
	if err != nil || len(again) != 2 || again[0].Attempt != c.Attempt+1 {
		t.Fatalf("claimed again: %+v %v, want both released steps at their next attempt", again, err)
	}
	// The other scheduler's release is of its own step alone.
	if n, err := b.store.ReleaseSent(ctx, "s2", "broker connection lost"); err != nil || n != 1 {
		t.Fatalf("s2 released %d (%v), want its one step", n, err)
	}
}
