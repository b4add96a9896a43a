package statestore_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"sas/internal/statestore"
)

// nsOrders inserts n one-step orders of kind in namespace ns, with key k
// ("" none).
func nsOrders(t *testing.T, b bundle, kind, ns, key string, n, maxPerKey int) []string {
	t.Helper()
	orders := make([]statestore.NewOrder, n)
	ids := make([]string, n)
	for i := range orders {
		o := order(1, time.Hour, 3)
		o.Steps[0].Agent = kind
		o.Namespace = ns
		if key != "" {
			o.Key = &statestore.ConcurrencyKey{Key: key, MaxPerKey: maxPerKey}
		}
		orders[i], ids[i] = o, o.OrderID
	}
	for start := 0; start < n; start += 1000 {
		if _, errs := b.store.InsertOrders(ctxFor(t), orders[start:min(start+1000, n)]); len(slices.DeleteFunc(errs, func(e error) bool { return e == nil })) > 0 {
			t.Fatal(errs)
		}
	}
	return ids
}

func addNamespaces(t *testing.T, b bundle, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := b.store.AddNamespace(ctxFor(t), n, "test"); err != nil {
			t.Fatal(err)
		}
	}
}

// claimedIn counts the claimed steps of each namespace.
func claimedIn(t *testing.T, b bundle, steps []statestore.ClaimedStep) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, st := range steps {
		own, _, err := b.store.OwnerOf(ctxFor(t), st.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		out[own.Namespace]++
	}
	return out
}

// A namespace's max_in_flight on a kind holds its steps alone: the kind's
// other namespaces (and the default) are claimed in the same claim, the
// namespace's next step is claimed once one of its own ends, and a reset
// hands its steps back to the regular claim.
func TestNamespaceLimitsHoldTheirStepsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "team-a", "team-b")
	if _, err := b.store.SetNamespaceLimits(ctx, "team-a", "nsvc", statestore.LimitChange{MaxInFlight: ptr(2)}, "ann"); err != nil {
		t.Fatal(err)
	}
	a := nsOrders(t, b, "nsvc", "team-a", "", 10, 0)
	nsOrders(t, b, "nsvc", "team-b", "", 5, 0)
	nsOrders(t, b, "nsvc", "", "", 3, 0)
	kinds, err := b.store.ManagedKinds(ctx)
	if limited, ok := kinds["nsvc"]; err != nil || !ok || limited {
		t.Fatalf("managed kinds %v (%v), want nsvc, by a namespace's limits alone", kinds, err)
	}
	// team-a's steps are keyed by it; team-b's (no limits) and the
	// default's are not.
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND fair_key = 'team-a' || E'\x1e' AND namespace = 'team-a'`, a); n != 10 {
		t.Fatalf("%d of team-a's 10 steps keyed by it", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE agent = 'nsvc' AND fair_key IS NULL`); n != 8 {
		t.Fatalf("%d unkeyed steps, want team-b's 5 and the default's 3", n)
	}
	first := claimLimited(t, b, "nsvc", 100)
	if got := claimedIn(t, b, first.Steps); got["team-a"] != 2 || got["team-b"] != 5 || got["default"] != 3 || first.Held != statestore.HeldNamespace {
		t.Fatalf("claimed %v (held %q), want team-a 2, team-b 5, default 3, held by a namespace", got, first.Held)
	}
	if again := claimLimited(t, b, "nsvc", 100); len(again.Steps) != 0 || again.Held != statestore.HeldNamespace {
		t.Fatalf("claimed %d more (held %q) with team-a at its limit", len(again.Steps), again.Held)
	}
	var ended statestore.ClaimedStep
	for _, st := range first.Steps {
		if slices.Contains(a, st.OrderID) {
			ended = st
		}
	}
	reply(t, b, ended, true, "")
	if next := claimLimited(t, b, "nsvc", 100); len(next.Steps) != 1 || claimedIn(t, b, next.Steps)["team-a"] != 1 {
		t.Fatalf("claimed %d after one of team-a's ended, want one of team-a's", len(next.Steps))
	}
	got, err := b.store.ListNamespaceLimits(ctx, "team-a")
	if err != nil || len(got) != 1 || got[0].InFlight != 2 || got[0].Waiting != 7 || *got[0].Limits.MaxInFlight != 2 ||
		got[0].SetBy != "operator:"+testRole(t, b)+" as ann" {
		t.Fatalf("team-a's limits %+v (%v), want 2 in flight, 7 waiting", got, err)
	}
	if n := count(t, b, `SELECT count(*) FROM operator_actions WHERE action = 'limits set' AND target = 'nsvc in team-a'
		AND detail = 'max_in_flight=2' AND claimed_by = 'ann'`); n != 1 {
		t.Fatalf("%d operator actions record the change", n)
	}
	// Reset: the kind's limits alone hold them; the regular claim takes
	// the rest.
	if err := b.store.ResetNamespaceLimits(ctx, "team-a", "nsvc", "ann"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.ResetNamespaceLimits(ctx, "team-a", "nsvc", "ann"); !errors.Is(err, statestore.ErrNoLimits) {
		t.Fatalf("a second reset: %v", err)
	}
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{"nsvc": 100}); err != nil || len(got) != 7 {
		t.Fatalf("the regular claim took %d (%v) after the reset, want team-a's 7", len(got), err)
	}
}

func testRole(t *testing.T, b bundle) string {
	t.Helper()
	var r string
	if err := b.pool.QueryRow(ctxFor(t), `SELECT session_user`).Scan(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// Limits set on a namespace whose steps are already pending key them, a
// namespace's rate holds with a hint of the next token, and the rules
// hold: no limits for the default namespace, none of a namespace that
// does not exist, no min_rate, the kind's rule.
func TestNamespaceLimitsKeyStepsWrittenBefore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "team-r")
	nsOrders(t, b, "rsvc", "team-r", "", 10, 0)
	nsOrders(t, b, "rsvc", "", "", 2, 0)
	if _, err := b.store.SetNamespaceLimits(ctx, "team-r", "rsvc", statestore.LimitChange{Rate: ptr(2.0), Burst: ptr(3)}, ""); err != nil {
		t.Fatal(err)
	}
	c := claimLimited(t, b, "rsvc", 100)
	if got := claimedIn(t, b, c.Steps); got["team-r"] != 3 || got["default"] != 2 || c.Held != statestore.HeldNamespace || c.Retry <= 0 {
		t.Fatalf("claimed %v (held %q, retry %v), want the burst of 3 and the default's 2, held with a retry", got, c.Held, c.Retry)
	}
	for _, bad := range []struct {
		ns string
		c  statestore.LimitChange
	}{
		{"default", statestore.LimitChange{MaxInFlight: ptr(1)}},
		{"team-none", statestore.LimitChange{MaxInFlight: ptr(1)}},
		{"team-r", statestore.LimitChange{MinRate: ptr(1.0)}},
		{"team-r", statestore.LimitChange{ClearRate: true}}, // a burst with no rate
		{"team-r", statestore.LimitChange{MaxInFlight: ptr(0)}},
	} {
		if _, err := b.store.SetNamespaceLimits(ctx, bad.ns, "rsvc", bad.c, ""); !errors.Is(err, statestore.ErrInvalidData) {
			t.Errorf("limits %+v in %s: %v, want refused", bad.c, bad.ns, err)
		}
	}
	if got, err := b.store.ListNamespaceLimits(ctx, ""); err != nil || len(got) != 1 || *got[0].Limits.Rate != 2 || *got[0].Limits.Burst != 3 {
		t.Fatalf("limits after refused changes %+v %v", got, err)
	}
}

// A namespace's concurrency keys are its own: the same key in two
// namespaces and the default is three keys, each with its max_per_key.
func TestNamespacesKeysAreTheirOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addNamespaces(t, b, "team-x", "team-y")
	for _, ns := range []string{"team-x", "team-y", ""} {
		nsOrders(t, b, "ksvc", ns, "k", 3, 1)
	}
	if c := claimLimited(t, b, "ksvc", 100); len(c.Steps) != 3 || len(claimedIn(t, b, c.Steps)) != 3 {
		t.Fatalf("claimed %d of key k (max_per_key 1) in three namespaces, want one of each", len(c.Steps))
	}
	keys, err := b.store.KeysInUse(ctxFor(t), 10)
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys in use %+v %v", keys, err)
	}
	for _, k := range keys {
		if k.Key != "k" || k.Waiting != 2 || k.InFlight != 1 {
			t.Fatalf("key %+v, want k with 2 waiting and 1 in flight in its namespace", k)
		}
	}
}

// A namespace at its limit with many keys does not hold the kind's round
// up: its keys are passed over, and another namespace's step is claimed
// within a few claims however many keys the first has.
func TestANamespaceAtItsLimitIsPassedOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "team-m", "team-n")
	if _, err := b.store.SetNamespaceLimits(ctx, "team-m", "msvc", statestore.LimitChange{MaxInFlight: ptr(1)}, ""); err != nil {
		t.Fatal(err)
	}
	for i := range 600 {
		nsOrders(t, b, "msvc", "team-m", fmt.Sprintf("k%03d", i), 1, 0)
	}
	other := nsOrders(t, b, "msvc", "team-n", "z", 1, 0)
	for i := range 5 {
		c := claimLimited(t, b, "msvc", 10)
		if got := claimedIn(t, b, c.Steps); got["team-m"] > 1 || i > 0 && got["team-m"] > 0 {
			t.Fatalf("claim %d took %v: team-m is limited to one in flight", i, got)
		}
		if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND process_state = 'processing'`, other); n == 1 {
			return
		}
	}
	t.Fatal("team-n's step was not claimed in 5 claims while team-m, at its limit, has 600 keys pending")
}

// Each role does its part of a namespace's limits: an operator and the
// console set and reset them (the submitter and the API may not), the
// writers of orders key the steps by them, the scheduler claims under
// them and spends their tokens, the supervisor reads them.
func TestNamespaceLimitsByRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "team-z")
	for _, role := range []string{"sas_submitter", "sas_api", "sas_scheduler"} {
		if _, err := storeAs(t, b, role).SetNamespaceLimits(ctx, "team-z", "zsvc", statestore.LimitChange{MaxInFlight: ptr(1)}, ""); !denied(errors.Unwrap(err)) {
			t.Fatalf("%s sets a namespace's limits: %v, want permission denied", role, err)
		}
	}
	for _, role := range []string{"sas_console", "sas_operator"} {
		if _, err := storeAs(t, b, role).SetNamespaceLimits(ctx, "team-z", "zsvc", statestore.LimitChange{Rate: ptr(100.0)}, ""); err != nil {
			t.Fatalf("%s sets a namespace's limits: %v", role, err)
		}
	}
	for _, role := range []string{"sas_submitter", "sas_api", "sas_scheduler"} {
		o := order(1, time.Hour, 3)
		o.Steps[0].Agent, o.Namespace = "zsvc", "team-z"
		if got, err := storeAs(t, b, role).InsertOrder(ctx, o); err != nil || got != statestore.Inserted {
			t.Fatalf("%s writes an order of team-z: %v %v", role, got, err)
		}
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE agent = 'zsvc' AND fair_key = 'team-z' || E'\x1e'`); n != 3 {
		t.Fatalf("%d of 3 steps keyed by team-z", n)
	}
	if c, err := storeAs(t, b, "sas_scheduler").ClaimLimited(ctx, "s", "zsvc", 10); err != nil || len(c.Steps) != 3 {
		t.Fatalf("the scheduler claims under team-z's limits: %+v %v", c, err)
	}
	if got, err := storeAs(t, b, "sas_supervisor").ListNamespaceLimits(ctx, ""); err != nil || len(got) != 1 || got[0].InFlight != 3 {
		t.Fatalf("the supervisor reads them: %+v %v", got, err)
	}
	if err := storeAs(t, b, "sas_console").ResetNamespaceLimits(ctx, "team-z", "zsvc", "alice"); err != nil {
		t.Fatal(err)
	}
	// The schedulers keep the file's; nobody else does.
	file := map[string]map[string]statestore.Limits{"zsvc": {"team-z": {MaxInFlight: ptr(2)}}}
	if _, err := storeAs(t, b, "sas_scheduler").SyncNamespaceLimits(ctx, []string{"zsvc"}, file); err != nil {
		t.Fatalf("the scheduler keeps the file's: %v", err)
	}
	for _, role := range []string{"sas_operator", "sas_api", "sas_submitter"} {
		if _, err := storeAs(t, b, role).SyncNamespaceLimits(ctx, []string{"zsvc"}, nil); !denied(errors.Unwrap(err)) {
			t.Fatalf("%s syncs the file's namespace limits: %v, want permission denied", role, err)
		}
	}
}

// The workflows file's namespaces' limits, as a scheduler keeps them:
// they key the namespace's steps and hold; an operator's replace them
// until reset, which goes back to the file's; a file that drops them
// leaves an operator's and unkeys the steps of what is gone; a namespace
// not made yet is named.
func TestTheFilesNamespaceLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "team-f")
	ids := nsOrders(t, b, "fsvc", "team-f", "", 6, 0)
	file := map[string]map[string]statestore.Limits{"fsvc": {"team-f": {MaxInFlight: ptr(1)}, "team-later": {Rate: ptr(5.0)}}}
	missing, err := b.store.SyncNamespaceLimits(ctx, []string{"fsvc"}, file)
	if err != nil || len(missing) != 1 || missing[0] != "team-later" {
		t.Fatalf("sync: missing %v (%v), want team-later", missing, err)
	}
	if c := claimLimited(t, b, "fsvc", 10); len(c.Steps) != 1 {
		t.Fatalf("claimed %d under the file's max_in_flight of 1 for team-f", len(c.Steps))
	}
	if _, err := b.store.SetNamespaceLimits(ctx, "team-f", "fsvc", statestore.LimitChange{MaxInFlight: ptr(3)}, "ann"); err != nil {
		t.Fatal(err)
	}
	if c := claimLimited(t, b, "fsvc", 10); len(c.Steps) != 2 {
		t.Fatalf("claimed %d more under the operator's 3, want 2", len(c.Steps))
	}
	if err := b.store.ResetNamespaceLimits(ctx, "team-f", "fsvc", "ann"); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.ListNamespaceLimits(ctx, "team-f")
	if err != nil || len(got) != 1 || got[0].SetBy != "" || *got[0].Limits.MaxInFlight != 1 || *got[0].File.MaxInFlight != 1 {
		t.Fatalf("after the reset %+v (%v), want the file's again", got, err)
	}
	if err := b.store.ResetNamespaceLimits(ctx, "team-f", "fsvc", "ann"); !errors.Is(err, statestore.ErrNoLimits) {
		t.Fatalf("a reset of the file's own: %v, want ErrNoLimits", err)
	}
	// An operator's, then a file without any: the operator's stay, and the
	// steps stay keyed; syncing twice changes nothing more.
	if _, err := b.store.SetNamespaceLimits(ctx, "team-f", "fsvc", statestore.LimitChange{MaxInFlight: ptr(4)}, ""); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.store.SyncNamespaceLimits(ctx, []string{"fsvc"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := b.store.ListNamespaceLimits(ctx, ""); err != nil || len(got) != 1 || *got[0].Limits.MaxInFlight != 4 || got[0].File.Any() {
		t.Fatalf("after a file without them %+v (%v), want the operator's alone", got, err)
	}
	// Its reset leaves none: the steps are unkeyed, the regular claim's.
	if err := b.store.ResetNamespaceLimits(ctx, "team-f", "fsvc", ""); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND fair_key IS NOT NULL`, ids); n != 0 {
		t.Fatalf("%d steps still keyed with no limits left", n)
	}
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{"fsvc": 10}); err != nil || len(got) != 3 {
		t.Fatalf("the regular claim took %d (%v), want the 3 left", len(got), err)
	}
}

// A namespace's orders in flight are counted once a second, or when the
// bound (the last count plus the admissions since) leaves no room; an
// order written without an admission (sas's own: a child, a schedule's)
// clears the bound, so the quota is never passed.
func TestTheInFlightQuotaCountsOnlyWhenItMust(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "quota-b")
	three := 3
	if err := b.store.SetNamespaceQuotas(ctx, "quota-b", statestore.Quotas{MaxInFlight: &three}, "test"); err != nil {
		t.Fatal(err)
	}
	admit := func() *statestore.QuotaRefusal {
		t.Helper()
		o := order(1, time.Hour, 3)
		o.Namespace = "quota-b"
		_, refused, err := b.store.InsertOrderWithinQuota(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return refused
	}
	bound := func() (n *int, at *time.Time) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT in_flight_bound, counted_at FROM namespaces WHERE name = 'quota-b'`).Scan(&n, &at); err != nil {
			t.Fatal(err)
		}
		return n, at
	}
	if r := admit(); r != nil {
		t.Fatalf("the first order refused: %+v", r)
	}
	_, first := bound()
	if r := admit(); r != nil {
		t.Fatalf("the second order refused: %+v", r)
	}
	if n, at := bound(); n == nil || *n != 2 || first == nil || at == nil || !at.Equal(*first) {
		t.Fatalf("after two admissions the bound is %v counted at %v, want 2 as counted at the first (%v)", n, at, first)
	}
	// sas writes one itself: the bound no longer holds.
	own := order(1, time.Hour, 3)
	own.Namespace = "quota-b"
	if _, err := b.store.InsertOrder(ctx, own); err != nil {
		t.Fatal(err)
	}
	if n, _ := bound(); n != nil {
		t.Fatalf("the bound %d stands after an order written without an admission", *n)
	}
	if r := admit(); r == nil || r.Quota != "in_flight" {
		t.Fatalf("a fourth order in flight: %+v, want refused by the in-flight quota of 3", r)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE namespace = 'quota-b'`); n != 3 {
		t.Fatalf("%d orders in quota-b, want 3", n)
	}
}

// A submit the rate quota refuses as it reads is not written at all (no
// insert rolled back: the history's identity does not move), and a
// repeat of an order already written is still a duplicate.
func TestASubmitPastTheRateIsNotWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	addNamespaces(t, b, "quota-r")
	rate, burst := 0.001, 1
	if err := b.store.SetNamespaceQuotas(ctx, "quota-r", statestore.Quotas{MaxSubmitRate: &rate, MaxSubmitBurst: &burst}, "test"); err != nil {
		t.Fatal(err)
	}
	first := order(1, time.Hour, 3)
	first.Namespace = "quota-r"
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, first); err != nil || r != nil {
		t.Fatalf("the first order: %+v %v", r, err)
	}
	// The identity of the history's rows, which a rolled-back insert
	// moves on too.
	seq := func() int {
		return count(t, b, `SELECT last_value::int FROM pg_sequences WHERE schemaname || '.' || sequencename = pg_get_serial_sequence('transitions', 'id')`)
	}
	last := seq()
	second := order(1, time.Hour, 3)
	second.Namespace = "quota-r"
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, second); err != nil || r == nil || r.Quota != "submit_rate" || r.RetryAfter <= 0 {
		t.Fatalf("the second order: %+v %v, want refused by the submit rate with a retry", r, err)
	}
	if after := seq(); after != last {
		t.Fatalf("the history's identity moved from %d to %d: the refused order was written and rolled back", last, after)
	}
	if got, r, err := b.store.InsertOrderWithinQuota(ctx, first); err != nil || r != nil || got != statestore.Duplicate {
		t.Fatalf("a repeat of the first order past the rate: %v %+v %v, want a duplicate", got, r, err)
	}
}
