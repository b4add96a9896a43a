package statestore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"sas/internal/messages"
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

// tokenKey is the store's key of the steps' tokens.
func tokenKey(t *testing.T, b bundle) steptoken.Key {
	t.Helper()
	secret, err := b.store.StepTokenKey(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	key, err := steptoken.NewKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// TestCallbacksAreFencedAndAppliedOnce: a callback ends its attempt as
// the attempt's reply, once by its id; one of an attempt that no longer
// runs (superseded, or the step ended) changes nothing and keeps nothing;
// a token the store's key did not make changes nothing.
func TestCallbacksAreFencedAndAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	key := tokenKey(t, b)
	o := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	c := claimAll(t, b, o.OrderID)["a"]
	before := snapshot(t, b, o.OrderID)
	staleTok := key.Mint(steptoken.Ref{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt + 1})
	out, err := b.store.Callback(ctx, statestore.Callback{Token: staleTok, Name: "complete", SignalID: "cb-0", Result: []byte(`{"n":0}`), Actor: "callback"})
	if err != nil || out.Outcome != statestore.CallbackStaleToken || !strings.Contains(out.Detail, "attempt superseded") {
		t.Fatalf("a callback of another attempt: %+v %v", out, err)
	}
	other, _ := steptoken.NewKey(strings.Repeat("x", 64))
	for _, tok := range []string{other.Mint(steptoken.Ref{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt}), "st1.nothing", ""} {
		out, err := b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "complete", Actor: "callback"})
		if err != nil || out.Outcome != statestore.CallbackInvalidToken || out.OrderID != "" {
			t.Fatalf("a token of another key %q: %+v %v", tok, out, err)
		}
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a stale or foreign callback changed the order:\nbefore %s\nafter  %s", before, after)
	}
	if n := count(t, b, `SELECT count(*) FROM signals WHERE order_id = $1`, o.OrderID); n != 0 {
		t.Fatalf("a stale callback was kept (%d signals)", n)
	}
	tok := key.Mint(steptoken.Ref{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt})
	cur := statestore.Callback{Token: tok, Name: "complete", SignalID: "cb-1", Result: []byte(`{"n":1}`), Actor: "callback"}
	out, err = b.store.Callback(ctx, cur)
	if err != nil || out.Outcome != statestore.SignalApplied || out.OrderID != o.OrderID || out.Step != 1 || out.Attempt != c.Attempt {
		t.Fatalf("the callback: %+v %v", out, err)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 1 AND process_state = 'processed' AND result = '{"n":1}'`, o.OrderID); n != 1 {
		t.Fatal("the callback did not complete the step with its result")
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 2 AND process_state = 'pending'`, o.OrderID); n != 1 {
		t.Fatal("the order did not move on to step 2")
	}
	before = snapshot(t, b, o.OrderID)
	if out, err := b.store.Callback(ctx, cur); err != nil || out.Outcome != statestore.SignalDuplicate {
		t.Fatalf("the same callback again: %+v %v", out, err)
	}
	out, err = b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "fail", SignalID: "cb-2", Error: "too late", Actor: "callback"})
	if err != nil || out.Outcome != statestore.CallbackStaleToken || !strings.Contains(out.Detail, "step is processed") {
		t.Fatalf("a second callback of an ended attempt: %+v %v", out, err)
	}
	if out, err := b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "heartbeat", Actor: "callback"}); err != nil || out.Outcome != statestore.CallbackStaleToken {
		t.Fatalf("a heartbeat of an ended attempt: %+v %v", out, err)
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a repeated or late callback changed the order:\nbefore %s\nafter  %s", before, after)
	}
	// An attempt whose time ran out takes no callback, though the
	// supervisor has not reset it yet.
	o2 := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
	insert(t, b, o2)
	c2 := claimAll(t, b, o2.OrderID)["a"]
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET complete_by = clock_timestamp() - interval '1 second' WHERE order_id = $1 AND step = 1`, o2.OrderID); err != nil {
		t.Fatal(err)
	}
	before = snapshot(t, b, o2.OrderID)
	late := key.Mint(steptoken.Ref{OrderID: o2.OrderID, Step: 1, Attempt: c2.Attempt})
	for _, name := range []string{"complete", "fail", "heartbeat"} {
		out, err := b.store.Callback(ctx, statestore.Callback{Token: late, Name: name, Error: map[bool]string{true: "late"}[name == "fail"], Actor: "callback"})
		if err != nil || out.Outcome != statestore.CallbackStaleToken || !strings.Contains(out.Detail, "complete_by has passed") {
			t.Fatalf("a %s after complete_by: %+v %v", name, out, err)
		}
	}
	if after := snapshot(t, b, o2.OrderID); after != before {
		t.Fatalf("a callback after complete_by changed the order:\nbefore %s\nafter  %s", before, after)
	}
}

// TestCallbackHeartbeatsAndFailures: a heartbeat holds the running
// attempt open as a 202 does, and a fail ends it as a failed reply, with
// its reason.
func TestCallbackHeartbeatsAndFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	key := tokenKey(t, b)
	o := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	c := claimAll(t, b, o.OrderID)["a"]
	tok := key.Mint(steptoken.Ref{OrderID: o.OrderID, Step: 1, Attempt: c.Attempt})
	out, err := b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "heartbeat", Actor: "callback"})
	if err != nil || out.Outcome != statestore.SignalApplied || out.CompleteBy.IsZero() {
		t.Fatalf("a heartbeat: %+v %v", out, err)
	}
	if cb, _ := completeBy(t, b, o.OrderID, 1); !cb.Equal(out.CompleteBy) {
		t.Fatalf("complete_by %v, the heartbeat said %v", cb, out.CompleteBy)
	}
	out, err = b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "fail", Error: "the card was declined", Actor: "callback:svc"})
	if err != nil || out.Outcome != statestore.SignalApplied {
		t.Fatalf("a fail: %+v %v", out, err)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 1 AND process_state = 'error' AND last_error = 'the card was declined'`,
		o.OrderID); n != 1 {
		t.Fatal("the fail did not end the attempt as failed, with its reason")
	}
	if _, err := b.store.Callback(ctx, statestore.Callback{Token: tok, Name: "finish", Actor: "callback"}); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("a callback named finish: %v", err)
	}
}

// TestTheStoreReadsTokensAsTheSchedulersMintThem: the store's reading of
// a token (step_token_read) agrees with steptoken's: every minted token
// reads as its order, step and attempt; any changed character, another
// key's token or a made-up text reads as none.
func TestTheStoreReadsTokensAsTheSchedulersMintThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	key := tokenKey(t, b)
	read := func(tok string) (string, int, int, bool) {
		var id *string
		var step, attempt *int
		if err := b.pool.QueryRow(ctx, `SELECT order_id::text, step, attempt FROM step_token_read($1)`, tok).Scan(&id, &step, &attempt); err != nil {
			t.Fatal(err)
		}
		if id == nil {
			return "", 0, 0, false
		}
		return *id, *step, *attempt, true
	}
	for _, ref := range []steptoken.Ref{{OrderID: messages.NewID(), Step: 1, Attempt: 1}, {OrderID: messages.NewID(), Step: 2147483647, Attempt: 2147483647},
		{OrderID: messages.NewID(), Step: 37, Attempt: 4}} {
		tok := key.Mint(ref)
		id, step, attempt, ok := read(tok)
		if !ok || id != ref.OrderID || step != ref.Step || attempt != ref.Attempt {
			t.Fatalf("%s read as %s %d %d %v, want %+v", tok, id, step, attempt, ok, ref)
		}
		for i := range tok {
			for _, ch := range []byte{'0', 'A', '-', '.'} {
				if tok[i] == ch {
					continue
				}
				bad := tok[:i] + string(ch) + tok[i+1:]
				if _, err := key.Read(bad); err == nil {
					continue // the same token (a MAC's unused last bits)
				}
				if _, _, _, ok := read(bad); ok {
					t.Fatalf("a changed token %s read as one", bad)
				}
			}
		}
	}
	other, _ := steptoken.NewKey(strings.Repeat("y", 80))
	for _, tok := range []string{other.Mint(steptoken.Ref{OrderID: messages.NewID(), Step: 1, Attempt: 1}), "", "st1", "st1.a.b.c.d",
		strings.Repeat("s", 500), "st1." + messages.NewID() + ".0.1.AAAAAAAAAAAAAAAAAAAAAA", "st1.é" + messages.NewID()} {
		if _, _, _, ok := read(tok); ok {
			t.Fatalf("%q read as a token", tok)
		}
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
