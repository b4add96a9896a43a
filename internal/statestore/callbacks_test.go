package statestore_test

import (
	"errors"
	"testing"
	"time"

	"sas/internal/statestore"
	"sas/internal/steptoken"
)

const accepting = `
workflows:
  - name: slow
    steps:
      - {action: a, agent: x, timeout: 1s, max_duration: 3s}
      - {action: b, agent: x}
`

// completeBy reads a step's complete_by and the database clock.
func completeBy(t *testing.T, b bundle, orderID string, step int) (time.Time, time.Time) {
	t.Helper()
	var cb, now time.Time
	if err := b.pool.QueryRow(ctxFor(t), `SELECT complete_by, clock_timestamp() FROM steps WHERE order_id = $1 AND step = $2`,
		orderID, step).Scan(&cb, &now); err != nil {
		t.Fatal(err)
	}
	return cb, now
}

// TestHoldsPushCompleteByOutToMaxDuration: a 202 and each heartbeat push
// the attempt's complete_by out (by the step's timeout, or as long as the
// service asked), never in, never past its claim plus max_duration; the
// first hold goes into the history once; a hold of another attempt, or of
// a step that ended, changes nothing.
func TestHoldsPushCompleteByOutToMaxDuration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	// The file's timeout (the test's rows say an hour).
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET timeout = interval '1 second' WHERE order_id = $1`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	c := claimAll(t, b, o.OrderID)["a"]
	claimedBy, _ := completeBy(t, b, o.OrderID, 1)
	claimedAt := claimedBy.Add(-time.Second)

	if _, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt + 1, Actor: "s"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("a hold of another attempt: %v", err)
	}
	until, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt, For: 2 * time.Second,
		Answer: "202 Accepted: queued", Actor: "s"})
	if err != nil {
		t.Fatal(err)
	}
	cb, now := completeBy(t, b, o.OrderID, 1)
	if !cb.Equal(until) || cb.Sub(now) < 1900*time.Millisecond || cb.Sub(now) > 2100*time.Millisecond {
		t.Fatalf("after a 202 asking 2s: complete_by %v from now (returned %v)", cb.Sub(now), until)
	}
	// A heartbeat asking the step's timeout (1s) does not bring it in.
	if _, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt, Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	if again, _ := completeBy(t, b, o.OrderID, 1); again.Before(cb) {
		t.Fatalf("a heartbeat brought complete_by in: %v → %v", cb, again)
	}
	// Asked for an hour: held to the claim plus max_duration (3s).
	if _, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt, For: time.Hour, Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	capped, _ := completeBy(t, b, o.OrderID, 1)
	if d := capped.Sub(claimedAt); d < 2900*time.Millisecond || d > 3100*time.Millisecond {
		t.Fatalf("held %v past the claim, want max_duration 3s", d)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 1 AND reason LIKE '%accepted the call (202 Accepted: queued)%'`,
		o.OrderID); n != 1 {
		t.Fatalf("%d history rows of the hold, want 1", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 1 AND last_answer = '202 Accepted: queued'`, o.OrderID); n != 1 {
		t.Fatal("the 202's answer is not the step's last answer")
	}
	// The step's reply ends it; a hold after it changes nothing.
	reply(t, b, c, true, `{"done":true}`)
	before := snapshot(t, b, o.OrderID)
	if _, err := b.store.HoldStep(ctx, statestore.Hold{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt, Actor: "s"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("a hold after the step ended: %v", err)
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a late hold changed the order:\nbefore %s\nafter  %s", before, after)
	}
}

// TestCallbacksAreFencedAndAppliedOnce: a callback ends its attempt as
// the attempt's reply, once by its id; one of an attempt that no longer
// runs (superseded, or the step ended) changes nothing and keeps nothing.
func TestCallbacksAreFencedAndAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	c := claimAll(t, b, o.OrderID)["a"]
	stale := statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt + 1, OK: true, Result: []byte(`{"n":0}`), Actor: "callback"}
	before := snapshot(t, b, o.OrderID)
	if _, _, err := b.store.ApplyCallback(ctx, "cb-0", "complete", stale); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("a callback of another attempt: %v", err)
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a stale callback changed the order:\nbefore %s\nafter  %s", before, after)
	}
	if n := count(t, b, `SELECT count(*) FROM signals WHERE order_id = $1`, o.OrderID); n != 0 {
		t.Fatalf("a stale callback was kept (%d signals)", n)
	}
	cur := statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt, OK: true, Result: []byte(`{"n":1}`), Actor: "callback"}
	res, dup, err := b.store.ApplyCallback(ctx, "cb-1", "complete", cur)
	if err != nil || dup || res.StepState != statestore.StepProcessed || res.NextStep != 2 {
		t.Fatalf("the callback: %+v dup %v %v", res, dup, err)
	}
	before = snapshot(t, b, o.OrderID)
	if _, dup, err := b.store.ApplyCallback(ctx, "cb-1", "complete", cur); err != nil || !dup {
		t.Fatalf("the same callback again: dup %v %v", dup, err)
	}
	if _, _, err := b.store.ApplyCallback(ctx, "cb-2", "fail", statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt,
		Error: "too late", Actor: "callback"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("a second callback of an ended attempt: %v", err)
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a repeated or late callback changed the order:\nbefore %s\nafter  %s", before, after)
	}
}

// TestTheTokenKeyIsMadeOnce: the migration made a key a token can be
// minted with, and it stays the same.
func TestTheTokenKeyIsMadeOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k1, err := b.store.StepTokenKey(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := b.store.StepTokenKey(ctxFor(t))
	if _, err := steptoken.NewKey(k1); err != nil || k1 != k2 {
		t.Fatalf("key of %d bytes (%v), read twice the same: %v", len(k1), err, k1 == k2)
	}
	other := setup(t)
	if k3, _ := other.store.StepTokenKey(ctxFor(t)); k3 == k1 {
		t.Fatal("two databases have the same key")
	}
}
