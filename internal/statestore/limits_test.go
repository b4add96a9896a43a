package statestore_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

func ptr[T any](v T) *T { return &v }

// limitedOrders inserts n one-step orders of kind, with key k ("" none),
// in the default namespace.
func limitedOrders(t *testing.T, b bundle, kind, key string, n, maxPerKey int) []string {
	t.Helper()
	return nsOrders(t, b, kind, "", key, n, maxPerKey)
}

func claimLimited(t *testing.T, b bundle, kind string, room int) statestore.LimitedClaim {
	t.Helper()
	c, err := b.store.ClaimLimited(ctxFor(t), "s", kind, room)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A kind's rate holds across claimers: however many claim at once and
// however often, no more steps are claimed than the burst plus the rate
// times the time since the first claim (on the database clock), the
// claimed steps are claimed once, and the steps left wait pending with
// no complete_by running.
func TestClaimLimitedHoldsTheRate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	limitedOrders(t, b, "pay", "", 400, 0)
	if err := b.store.SyncLimits(ctx, []string{"pay"}, map[string]statestore.Limits{"pay": {Rate: ptr(50.0), Burst: ptr(5)}}); err != nil {
		t.Fatal(err)
	}
	var start time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	claimed := map[string]int{}
	// When each claim came back: a bucket holds at most the burst, so
	// a machine too loaded to claim every tenth of a second (5 at 50/s)
	// rightly gets fewer steps than 50 a second.
	began := time.Now()
	var asked []time.Time
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				c, err := b.store.ClaimLimited(ctx, "s", "pay", 100)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				asked = append(asked, time.Now())
				for _, st := range c.Steps {
					claimed[st.OrderID]++
				}
				mu.Unlock()
				if c.Held == statestore.HeldRate && c.Retry <= 0 {
					t.Errorf("held by the rate with no retry hint: %+v", c)
					return
				}
			}
		})
	}
	wg.Wait()
	var elapsed float64
	if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)::float8`, start).Scan(&elapsed); err != nil {
		t.Fatal(err)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Fatalf("order %s claimed %d times", id, n)
		}
	}
	bound := 5 + 50*elapsed
	// The floor: what a bucket of 5 filling at 50/s held at the claims
	// as they came, each gap's tokens capped at the burst. It is loose:
	// a claim's moment in the database is not when it came back.
	slices.SortFunc(asked, func(x, y time.Time) int { return x.Compare(y) })
	floor, held, last := 0.0, 5.0, began // the bucket starts full
	for _, at := range asked {
		held = min(held+50*at.Sub(last).Seconds(), 5)
		floor, held, last = floor+held, 0, at // a claim takes all it holds
	}
	t.Logf("%d claimed in %.2f s at 50/s, burst 5 (bound %.0f; %d claims, whose gaps held %.0f)", len(claimed), elapsed, bound, len(asked), floor)
	if float64(len(claimed)) > bound || float64(len(claimed)) < 0.6*floor {
		t.Fatalf("%d claimed in %.2f s, want at least %.0f (0.6 of what the gaps between %d claims held at 50/s, burst 5) and at most %.0f",
			len(claimed), elapsed, 0.6*floor, len(asked), bound)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE process_state = 'pending' AND complete_by IS NULL AND attempt = 0`); n != 400-len(claimed) {
		t.Fatalf("%d steps wait pending without a deadline, want %d", n, 400-len(claimed))
	}
}

// max_in_flight bounds the kind's processing steps; a step that ends
// makes room for one more.
func TestClaimLimitedHoldsMaxInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	limitedOrders(t, b, "inv", "", 10, 0)
	if err := b.store.SyncLimits(ctx, []string{"inv"}, map[string]statestore.Limits{"inv": {MaxInFlight: ptr(3)}}); err != nil {
		t.Fatal(err)
	}
	if kinds, err := b.store.ManagedKinds(ctx); err != nil || !kinds["inv"] {
		t.Fatalf("managed kinds %v (%v), want inv held by its own limits", kinds, err)
	}
	first := claimLimited(t, b, "inv", 100)
	if len(first.Steps) != 3 || first.Held != statestore.HeldInFlight {
		t.Fatalf("claimed %d (held %q), want 3 held by max_in_flight", len(first.Steps), first.Held)
	}
	if again := claimLimited(t, b, "inv", 100); len(again.Steps) != 0 || again.Held != statestore.HeldInFlight {
		t.Fatalf("claimed %d more (held %q) with 3 in flight", len(again.Steps), again.Held)
	}
	reply(t, b, first.Steps[0], true, "")
	if next := claimLimited(t, b, "inv", 100); len(next.Steps) != 1 {
		t.Fatalf("claimed %d after one ended, want 1", len(next.Steps))
	}
	// Raised by an operator: claims obey it at once, and it is recorded.
	if _, err := b.store.SetLimits(ctx, "inv", statestore.LimitChange{MaxInFlight: ptr(5)}, "ann"); err != nil {
		t.Fatal(err)
	}
	if next := claimLimited(t, b, "inv", 100); len(next.Steps) != 2 {
		t.Fatalf("claimed %d after max_in_flight was raised to 5, want 2", len(next.Steps))
	}
	// The bound a claim keeps instead of counting is never below the
	// steps processing: here exact, a claim after a count.
	if n := count(t, b, `SELECT in_flight_bound FROM agent_limits WHERE agent = 'inv'`); n != 5 {
		t.Fatalf("in_flight_bound %d with 5 processing", n)
	}
	if n := count(t, b, `SELECT count(*) FROM operator_actions WHERE action = 'limits set' AND target = 'inv' AND detail = 'max_in_flight=5'
		AND claimed_by = 'ann'`); n != 1 {
		t.Fatalf("%d operator actions record the change", n)
	}
	kl, err := b.store.ResetLimits(ctx, "inv", "ann")
	if err != nil || kl.Effective.MaxInFlight == nil || *kl.Effective.MaxInFlight != 3 || kl.SetBy != "" || kl.InFlight != 5 {
		t.Fatalf("reset: %+v %v", kl, err)
	}
}

// Keys are served round robin: a key with a long backlog and a key with a
// few steps both progress from the first claim, and max_per_key bounds
// each key's steps in flight.
func TestClaimLimitedServesKeysRoundRobin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	limitedOrders(t, b, "svc", "big", 2000, 0)
	var small []string
	for i := range 10 {
		small = append(small, limitedOrders(t, b, "svc", fmt.Sprintf("small-%d", i), 2, 0)...)
	}
	limitedOrders(t, b, "svc", "", 5, 0) // unkeyed orders take a turn too
	kinds, err := b.store.ManagedKinds(ctx)
	if limited, ok := kinds["svc"]; err != nil || !ok || limited {
		t.Fatalf("managed kinds %v (%v), want svc, by its keys alone", kinds, err)
	}
	// The regular claim leaves keyed steps alone.
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{"svc": 100}); err != nil || len(got) != 5 {
		t.Fatalf("a regular claim took %d steps (%v), want the 5 unkeyed ones", len(got), err)
	}
	got := claimLimited(t, b, "svc", 11).Steps
	keys := map[string]int{}
	for _, st := range got {
		keys[keyOf(t, b, st)]++
	}
	if len(got) != 11 || len(keys) != 11 {
		t.Fatalf("a claim of 11 served keys %v, want each of the 11 keys once", keys)
	}
	// The next round serves each again: the small keys are done in two.
	for range 3 {
		claimLimited(t, b, "svc", 11)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND process_state = 'pending'`, small); n != 0 {
		t.Fatalf("%d steps of the small keys still pending after 4 rounds", n)
	}
	// max_per_key: at most 3 of a key's steps in flight.
	capped := limitedOrders(t, b, "cap", "k", 10, 3)
	if got := claimLimited(t, b, "cap", 100); len(got.Steps) != 3 {
		t.Fatalf("claimed %d of a key whose max_per_key is 3", len(got.Steps))
	}
	if got := claimLimited(t, b, "cap", 100); len(got.Steps) != 0 {
		t.Fatalf("claimed %d more of a key with 3 in flight", len(got.Steps))
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND process_state = 'processing'`, capped); n != 3 {
		t.Fatalf("%d in flight", n)
	}
}

func keyOf(t *testing.T, b bundle, st statestore.ClaimedStep) string {
	t.Helper()
	var k *string
	if err := b.pool.QueryRow(ctxFor(t), `SELECT fair_key FROM steps WHERE order_id = $1 AND step = $2`, st.OrderID, st.Step).Scan(&k); err != nil {
		t.Fatal(err)
	}
	if k == nil {
		return "(none)"
	}
	return *k
}

// A service's 429 halves the kind's rate, not below its floor, at most
// once a second; a kind without a rate is left alone.
func TestLowerRateHalvesDownToTheFloor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if err := b.store.SyncLimits(ctx, []string{"pay", "inv"}, map[string]statestore.Limits{
		"pay": {Rate: ptr(100.0), MinRate: ptr(30.0)}, "inv": {MaxInFlight: ptr(2)}}); err != nil {
		t.Fatal(err)
	}
	rate, lowered, err := b.store.LowerRate(ctx, "pay", 2*time.Second)
	if err != nil || !lowered || rate != 50 {
		t.Fatalf("first 429: rate %v lowered %v (%v), want 50", rate, lowered, err)
	}
	if _, lowered, _ := b.store.LowerRate(ctx, "pay", 2*time.Second); lowered {
		t.Fatal("lowered twice within a second")
	}
	testenv.Eventually(t, 5*time.Second, "a second to pass", func() bool {
		rate, lowered, err = b.store.LowerRate(ctx, "pay", 2*time.Second)
		return err == nil && lowered
	})
	if rate != 30 {
		t.Fatalf("second 429: rate %v, want the floor 30 (not 25)", rate)
	}
	if _, lowered, _ := b.store.LowerRate(ctx, "inv", time.Second); lowered {
		t.Fatal("a kind without a rate was lowered")
	}
	// By a step of the kind, as a throttled reply names it.
	o := order(1, time.Hour, 3)
	o.Steps[0].Agent = "inv"
	insert(t, b, o)
	if kind, _, lowered, err := b.store.LowerRateOf(ctx, o.OrderID, 1, time.Second); err != nil || kind != "inv" || lowered {
		t.Fatalf("by its step: kind %q lowered %v (%v), want inv, not lowered", kind, lowered, err)
	}
	if kind, _, lowered, err := b.store.LowerRateOf(ctx, o.OrderID, 9, time.Second); err != nil || kind != "" || lowered {
		t.Fatalf("by no step: kind %q lowered %v (%v)", kind, lowered, err)
	}
	all, err := b.store.ListLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if k.Agent == "pay" && (k.Effective.Rate == nil || *k.Effective.Rate != 30 || k.LoweredUntil == nil || k.LoweredCount != 2) {
			t.Fatalf("pay's limits while lowered: %+v", k)
		}
	}
}

// The services' pools never compile plans (JIT): a claim behind a large
// backlog spent a second of CPU compiling a millisecond's statement.
func TestPoolsRunWithoutJIT(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := statestore.Open(statestore.Options{URL: b.url, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var jit string
	if err := pool.QueryRow(ctxFor(t), `SHOW jit`).Scan(&jit); err != nil || jit != "off" {
		t.Fatalf("jit = %q (%v), want off", jit, err)
	}
}

// With room to spare under max_in_flight, claims count the kind's
// processing steps at most once a second and keep a bound instead (the
// count plus the claims since); a step claimed elsewhere (a scheduler
// that has not yet learnt the kind is limited) is counted within the
// second, and near the limit every claim counts.
func TestInFlightBoundHoldsWithoutCounting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	limitedOrders(t, b, "inv", "", 40, 0)
	if err := b.store.SyncLimits(ctx, []string{"inv"}, map[string]statestore.Limits{"inv": {MaxInFlight: ptr(12)}}); err != nil {
		t.Fatal(err)
	}
	first := claimLimited(t, b, "inv", 2)
	var counted time.Time
	if err := b.pool.QueryRow(ctx, `SELECT counted_at FROM agent_limits WHERE agent = 'inv'`).Scan(&counted); err != nil {
		t.Fatal(err)
	}
	claimLimited(t, b, "inv", 2)
	var again time.Time
	if err := b.pool.QueryRow(ctx, `SELECT counted_at FROM agent_limits WHERE agent = 'inv'`).Scan(&again); err != nil || !again.Equal(counted) {
		t.Fatalf("counted again at %v (first %v, %v) with room to spare", again, counted, err)
	}
	// Claimed by the plain claim, out of the bound's sight.
	if got, err := b.store.ClaimKinds(ctx, "stale", map[string]int{"inv": 6}); err != nil || len(got) != 6 {
		t.Fatalf("plain claim: %d %v", len(got), err)
	}
	reply(t, b, first.Steps[0], true, "") // 9 processing now
	// Near the limit every claim counts: 12 - 9 = 3, not 12 - 4.
	if got := claimLimited(t, b, "inv", 10); len(got.Steps) != 3 || got.Held != statestore.HeldInFlight {
		t.Fatalf("claimed %d (held %q) with 9 processing of 12", len(got.Steps), got.Held)
	}
}

// A keyed order's steps that call an agent carry its key; the steps sas
// performs itself (a wait, a timer, a sub-process: no agent) do not, and
// are claimed as any other order's.
func TestOnlyAgentStepsCarryTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := order(2, time.Hour, 3)
	o.Steps[1].Agent = ""
	o.Key = &statestore.ConcurrencyKey{Key: "t-1", MaxPerKey: 2}
	insert(t, b, o)
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 1 AND fair_key = 't-1' AND fair_max = 2`, o.OrderID); n != 1 {
		t.Fatal("the agent's step does not carry the key")
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 2 AND fair_key IS NULL AND fair_max IS NULL`, o.OrderID); n != 1 {
		t.Fatal("a step with no agent carries the key")
	}
}

// The key "" (a payload the key's expression failed on) is a key like any
// other: served from the first claim, alone or among others.
func TestTheEmptyKeyIsServed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		o := order(1, time.Hour, 3)
		o.Steps[0].Agent = "svc"
		o.Key = &statestore.ConcurrencyKey{Key: ""}
		insert(t, b, o)
	}
	if got := claimLimited(t, b, "svc", 10); len(got.Steps) != 3 {
		t.Fatalf("claimed %d of 3 steps keyed \"\"", len(got.Steps))
	}
	limitedOrders(t, b, "svc", "a", 2, 0)
	for range 2 {
		o := order(1, time.Hour, 3)
		o.Steps[0].Agent = "svc"
		o.Key = &statestore.ConcurrencyKey{Key: ""}
		insert(t, b, o)
	}
	if got := claimLimited(t, b, "svc", 10); len(got.Steps) != 4 {
		t.Fatalf("claimed %d of 4 steps keyed \"\" and \"a\"", len(got.Steps))
	}
}

// An operator who claims no name (sasctl without --as or $USER) is
// recorded by the database login: the change is not refused.
func TestAChangeWithoutAClaimedNameIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.store.SetLimits(ctxFor(t), "pay", statestore.LimitChange{Rate: ptr(5.0)}, ""); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM operator_actions WHERE action = 'limits set' AND claimed_by = session_user`); n != 1 {
		t.Fatalf("%d changes recorded by the database login", n)
	}
}

// An operator's change is held to the rule a workflows file's limits are
// (workflow.Limits.Check), once merged with the limits it changes: a
// floor above the rate, a burst without a rate, limits of nothing, a
// kind that is no name are refused with the rule's words, and nothing
// changes; the database's own words never reach the operator.
func TestSetLimitsHoldsTheFileRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if err := b.store.SyncLimits(ctx, []string{"pay"}, map[string]statestore.Limits{"pay": {Rate: ptr(10.0)}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		desc   string
		kind   string
		change statestore.LimitChange
		want   string
	}{
		{"a floor above the rate in force", "pay", statestore.LimitChange{MinRate: ptr(50.0)}, "min_rate (50/s) is above rate (10/s)"},
		{"a floor above the rate given", "pay", statestore.LimitChange{Rate: ptr(5.0), MinRate: ptr(6.0)}, "above rate"},
		{"a burst once the rate is gone", "pay", statestore.LimitChange{ClearRate: true, Burst: ptr(3), MaxInFlight: ptr(4)}, "needs a rate"},
		{"nothing limited", "pay", statestore.LimitChange{ClearRate: true}, "limit nothing"},
		{"a rate out of range", "pay", statestore.LimitChange{Rate: ptr(-1.0)}, "a positive number"},
		{"a max in flight out of range", "pay", statestore.LimitChange{MaxInFlight: ptr(0)}, "from 1 to"},
		{"a kind that is no name", "Pay Ments", statestore.LimitChange{Rate: ptr(5.0)}, "is not a name"},
		{"a kind of 101 characters", strings.Repeat("k", 101), statestore.LimitChange{Rate: ptr(5.0)}, "is not a name"},
		{"a kind holding a NUL", "pay\x00", statestore.LimitChange{Rate: ptr(5.0)}, "is not a name"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			_, err := b.store.SetLimits(ctx, c.kind, c.change, "ann")
			if !errors.Is(err, statestore.ErrInvalidData) || !strings.Contains(err.Error(), c.want) ||
				strings.Contains(err.Error(), "constraint") || strings.Contains(err.Error(), "SQLSTATE") {
				t.Fatalf("%v, want ErrInvalidData saying %q in the rule's words", err, c.want)
			}
		})
	}
	if n := count(t, b, `SELECT count(*) FROM agent_limits WHERE set_by IS NOT NULL`); n != 0 {
		t.Fatalf("%d kinds changed by refused changes", n)
	}
	if n := count(t, b, `SELECT count(*) FROM operator_actions`); n != 0 {
		t.Fatalf("%d refused changes recorded", n)
	}
	// Within the rule: taken.
	k, err := b.store.SetLimits(ctx, "pay", statestore.LimitChange{Rate: ptr(100.0), MinRate: ptr(50.0)}, "ann")
	if err != nil || *k.Effective.Rate != 100 || *k.Effective.MinRate != 50 {
		t.Fatalf("a good change: %+v %v", k, err)
	}
}

// A service's 429 never lowers a rate for more than an hour, however
// long its Retry-After, and never raises it above what an operator set;
// an operator's set or reset ends a lowering.
func TestALoweringIsBoundedAndTheOperatorsWordIsLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if err := b.store.SyncLimits(ctx, []string{"pay"}, map[string]statestore.Limits{"pay": {Rate: ptr(100.0)}}); err != nil {
		t.Fatal(err)
	}
	// Decades: the agent bounds what it reads, and the store bounds what
	// it is given.
	if _, lowered, err := b.store.LowerRate(ctx, "pay", 30*365*24*time.Hour); err != nil || !lowered {
		t.Fatalf("lower: %v %v", lowered, err)
	}
	var left float64
	if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM lowered_until - now()) FROM agent_limits WHERE agent = 'pay'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > 3601 || left < 3500 {
		t.Fatalf("lowered for %.0f s by a Retry-After of decades, want at most an hour", left)
	}
	k, err := b.store.ResetLimits(ctx, "pay", "ann")
	if err != nil || k.LoweredUntil != nil || *k.Effective.Rate != 100 {
		t.Fatalf("after a reset: %+v %v; want the file's rate, not lowered", k, err)
	}
	// A floor set above half the rate: a 429 lowers to the floor, never
	// above the rate.
	if _, err := b.store.SetLimits(ctx, "pay", statestore.LimitChange{Rate: ptr(8.0), MinRate: ptr(8.0)}, "ann"); err != nil {
		t.Fatal(err)
	}
	rate, _, err := b.store.LowerRate(ctx, "pay", time.Second)
	if err != nil || rate > 8 {
		t.Fatalf("lowered to %v (%v), above the rate 8", rate, err)
	}
	k, err = b.store.SetLimits(ctx, "pay", statestore.LimitChange{Rate: ptr(20.0)}, "ann")
	if err != nil || k.LoweredUntil != nil || *k.Effective.Rate != 20 {
		t.Fatalf("after a set: %+v %v; want the operator's rate, not lowered", k, err)
	}
}
