package statestore_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

// Orders and tokens belong to namespaces: a batch mixing namespaces
// writes each order's own, a list of some namespaces selects only
// theirs, and a token acts only in namespaces that exist.
func TestNamespacesOfOrdersAndTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); !errors.Is(err, statestore.ErrConflict) {
		t.Fatalf("a namespace added twice: %v", err)
	}
	for _, bad := range []string{"", "Team", "-a", "a-", "a_b", "a/b", string(make([]byte, 64))} {
		if _, err := b.store.AddNamespace(ctx, bad, "test"); !errors.Is(err, statestore.ErrInvalidData) {
			t.Errorf("namespace %q: %v", bad, err)
		}
	}
	if ns, err := b.store.Namespaces(ctx); err != nil || len(ns) != 2 || ns[0].Name != "default" || ns[1].Name != "team-a" {
		t.Fatalf("namespaces %+v %v", ns, err)
	}

	// One batch: default, team-a, default, team-a.
	var batch []statestore.NewOrder
	for i := range 4 {
		o := order(1, time.Hour, 3)
		if i%2 == 1 {
			o.Namespace = "team-a"
		}
		batch = append(batch, o)
	}
	if _, errs := b.store.InsertOrders(ctx, batch); errs != nil {
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, o := range batch {
		own, found, err := b.store.OwnerOf(ctx, o.OrderID)
		want := "default"
		if i%2 == 1 {
			want = "team-a"
		}
		if err != nil || !found || own.Namespace != want {
			t.Fatalf("order %d: namespace %q (found %v, %v), want %q", i, own.Namespace, found, err, want)
		}
		d, err := b.store.GetOrder(ctx, o.OrderID)
		if err != nil || d.Order.Namespace != want {
			t.Fatalf("order %d reads as in %q (%v), want %q", i, d.Order.Namespace, err, want)
		}
	}
	if _, found, err := b.store.OwnerOf(ctx, "00000000-0000-4000-8000-000000000000"); found || err != nil {
		t.Fatalf("an unknown order: found %v, %v", found, err)
	}
	count := func(ns []string) int {
		rows, _, err := b.store.OrderPage(ctx, statestore.OrderQuery{Limit: 500, Namespaces: ns})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range rows {
			for _, o := range batch {
				if r.OrderID == o.OrderID {
					n++
				}
			}
		}
		return n
	}
	if a, all, none := count([]string{"team-a"}), count(nil), count([]string{}); a != 2 || all != 4 || none != 0 {
		t.Fatalf("pages: team-a %d (want 2), every namespace %d (want 4), none %d (want 0)", a, all, none)
	}

	// Tokens.
	_, secret, err := b.store.CreateAPITokenIn(ctx, "team-a-app", statestore.TokenSubmitter, "test", []string{"team-a"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := b.store.APITokenOf(ctx, secret)
	if err != nil || !slices.Equal(tok.Namespaces, []string{"team-a"}) || !tok.In("team-a") || tok.In("default") {
		t.Fatalf("token %+v %v", tok, err)
	}
	_, secret, err = b.store.CreateAPIToken(ctx, "plain", statestore.TokenViewer, "test")
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := b.store.APITokenOf(ctx, secret); err != nil || !slices.Equal(tok.Namespaces, []string{"default"}) {
		t.Fatalf("a token made without namespaces: %+v %v", tok, err)
	}
	_, secret, err = b.store.CreateAPITokenIn(ctx, "everyone", statestore.TokenOperator, "test", []string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := b.store.APITokenOf(ctx, secret); err != nil || !tok.In("team-a") || !tok.In("anything") {
		t.Fatalf("a token of every namespace: %+v %v", tok, err)
	}
	if _, _, err := b.store.CreateAPITokenIn(ctx, "nowhere", statestore.TokenViewer, "test", []string{"team-b"}); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("a token of a namespace that does not exist: %v", err)
	}
	if _, _, err := b.store.CreateAPITokenIn(ctx, "bad", statestore.TokenViewer, "test", []string{"Team B"}); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("a token of a namespace that is not a name: %v", err)
	}
}

// A namespace's quotas hold on every write, however many writers race:
// in flight (a repeat of a written order takes nothing; an order that
// ends frees its place), the submit rate's bucket, and a payload's size.
// A refused order is not written. The default namespace takes none.
func TestNamespaceQuotasHoldOnEveryWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "quota-a", "test"); err != nil {
		t.Fatal(err)
	}
	one, two, three := 1, 2, 3
	rate := 2.0
	if err := b.store.SetNamespaceQuotas(ctx, "default", statestore.Quotas{MaxInFlight: &three}, "test"); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("quotas for the default namespace: %v", err)
	}
	if err := b.store.SetNamespaceQuotas(ctx, "nobody", statestore.Quotas{MaxInFlight: &three}, "test"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("quotas for an unknown namespace: %v", err)
	}
	if err := b.store.SetNamespaceQuotas(ctx, "quota-a", statestore.Quotas{MaxSubmitBurst: &two}, "test"); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("a burst without a rate: %v", err)
	}
	in := func(p string) statestore.NewOrder {
		o := order(1, time.Hour, 3)
		o.Namespace, o.Payload = "quota-a", []byte(p)
		return o
	}
	written := func(o statestore.NewOrder) bool {
		_, found, err := b.store.OwnerOf(ctx, o.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		return found
	}

	// In flight: 3, with 20 writers at once.
	if err := b.store.SetNamespaceQuotas(ctx, "quota-a", statestore.Quotas{MaxInFlight: &three}, "ann"); err != nil {
		t.Fatal(err)
	}
	orders := make([]statestore.NewOrder, 20)
	outcomes := make([]statestore.InsertOutcome, 20)
	refusals := make([]*statestore.QuotaRefusal, 20)
	errs := make([]error, 20)
	var wg sync.WaitGroup
	for i := range orders {
		orders[i] = in(`{}`)
		wg.Go(func() { outcomes[i], refusals[i], errs[i] = b.store.InsertOrderWithinQuota(ctx, orders[i]) })
	}
	wg.Wait()
	var kept []statestore.NewOrder
	for i := range orders {
		switch {
		case errs[i] != nil:
			t.Fatal(errs[i])
		case refusals[i] == nil && outcomes[i] == statestore.Inserted && written(orders[i]):
			kept = append(kept, orders[i])
		case refusals[i] != nil && refusals[i].Quota == statestore.QuotaInFlight && refusals[i].RetryAfter > 0 && !written(orders[i]):
		default:
			t.Fatalf("order %d: %v %+v, written %v", i, outcomes[i], refusals[i], written(orders[i]))
		}
	}
	if len(kept) != 3 {
		t.Fatalf("%d of 20 orders written at once under a quota of 3 in flight", len(kept))
	}
	if got, r, err := b.store.InsertOrderWithinQuota(ctx, kept[0]); err != nil || r != nil || got != statestore.Duplicate {
		t.Fatalf("a repeat of a written order at the quota: %v %+v %v, want a duplicate", got, r, err)
	}
	if _, err := b.store.CancelOrder(ctx, kept[0].OrderID, "test"); err != nil {
		t.Fatal(err)
	}
	if got, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r != nil || got != statestore.Inserted {
		t.Fatalf("an order once one ended: %v %+v %v", got, r, err)
	}
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r == nil || r.Quota != statestore.QuotaInFlight {
		t.Fatalf("past the quota again: %+v %v", r, err)
	}
	// The supervisor's reading: each namespace's orders in flight, and
	// its quota of them.
	stats, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l := stats.InFlightIn["quota-a"]; l.InFlight != 3 || l.MaxInFlight == nil || *l.MaxInFlight != 3 {
		t.Fatalf("quota-a's load %+v, want 3 in flight of 3", l)
	}
	if l, ok := stats.InFlightIn["default"]; !ok || l.InFlight != 0 || l.MaxInFlight != nil {
		t.Fatalf("default's load %+v (%v), want none of no quota", l, ok)
	}

	// The rate: 2 a second, a bucket of 1; in flight no more.
	if err := b.store.SetNamespaceQuotas(ctx, "quota-a", statestore.Quotas{MaxSubmitRate: &rate, MaxSubmitBurst: &one}, "ann"); err != nil {
		t.Fatal(err)
	}
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r != nil {
		t.Fatalf("the bucket's one: %+v %v", r, err)
	}
	late := in(`{}`)
	_, r, err := b.store.InsertOrderWithinQuota(ctx, late)
	if err != nil || r == nil || r.Quota != statestore.QuotaSubmitRate || r.RetryAfter <= 0 || r.RetryAfter > 500*time.Millisecond || written(late) {
		t.Fatalf("past the rate: %+v %v, written %v", r, err, written(late))
	}
	testenv.Eventually(t, 10*time.Second, "the bucket to fill again", func() bool {
		_, r, err := b.store.InsertOrderWithinQuota(ctx, late)
		return err == nil && r == nil
	})

	// A rate so low that the wait to the next one is years: told a day.
	slow := 1e-9
	if err := b.store.SetNamespaceQuotas(ctx, "quota-a", statestore.Quotas{MaxSubmitRate: &slow}, "ann"); err != nil {
		t.Fatal(err)
	}
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r != nil {
		t.Fatalf("the slow bucket's one: %+v %v", r, err)
	}
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r == nil || r.RetryAfter != 24*time.Hour {
		t.Fatalf("past a rate of one in 30 years: %+v %v, want a refusal that says a day", r, err)
	}

	// A payload's bytes.
	if err := b.store.SetNamespaceQuotas(ctx, "quota-a", statestore.Quotas{MaxPayloadBytes: &three}, "ann"); err != nil {
		t.Fatal(err)
	}
	big := in(`{"a":1}`)
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, big); err != nil || r == nil || r.Quota != statestore.QuotaPayloadBytes || r.RetryAfter != 0 || written(big) {
		t.Fatalf("a payload past the size: %+v %v", r, err)
	}
	if _, r, err := b.store.InsertOrderWithinQuota(ctx, in(`{}`)); err != nil || r != nil {
		t.Fatalf("a payload within it: %+v %v", r, err)
	}
	ns, err := b.store.Namespaces(ctx)
	if err != nil || len(ns) != 2 || ns[1].Name != "quota-a" || ns[1].MaxPayloadBytes == nil || *ns[1].MaxPayloadBytes != 3 ||
		ns[1].MaxInFlight != nil || ns[1].QuotasBy != "ann" || ns[1].QuotasAt == nil || ns[0].Quotas.Any() {
		t.Fatalf("namespaces %+v %v", ns, err)
	}
}

// TestTheSubmitterWritesWithinQuotas: the submitter's role reads the
// namespaces and writes an order within its namespace's quotas, as the
// API's does.
func TestTheSubmitterWritesWithinQuotas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "quota-s", "test"); err != nil {
		t.Fatal(err)
	}
	one := 1
	if err := b.store.SetNamespaceQuotas(ctx, "quota-s", statestore.Quotas{MaxInFlight: &one}, "test"); err != nil {
		t.Fatal(err)
	}
	submitter := storeAs(t, b, "sas_submitter")
	if ns, err := submitter.Namespaces(ctx); err != nil || len(ns) != 2 {
		t.Fatalf("the submitter reading the namespaces: %+v %v", ns, err)
	}
	for i, want := range []string{"", statestore.QuotaInFlight} {
		o := order(1, time.Hour, 3)
		o.Namespace = "quota-s"
		got, refused, err := submitter.InsertOrderWithinQuota(ctx, o)
		if err != nil || (refused == nil) != (want == "") || refused != nil && refused.Quota != want || want == "" && got != statestore.Inserted {
			t.Fatalf("order %d: %v %+v %v, want refused by %q", i, got, refused, err, want)
		}
	}
}

// TestRepliesSayTheNamespaceOfTheOrderTheyEnd: a reply that ends an
// order says its namespace, through the batched statement of ok replies
// and through apply_reply (a failed reply); one that does not end it
// says none.
func TestRepliesSayTheNamespaceOfTheOrderTheyEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	done, held, going := order(1, time.Hour, 1), order(1, time.Hour, 1), order(2, time.Hour, 1)
	for _, o := range []*statestore.NewOrder{&done, &held, &going} {
		o.Namespace = "team-a"
		insert(t, b, *o)
	}
	if claimed, err := b.store.ClaimPending(ctx, "s", 3, ""); err != nil || len(claimed) != 3 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	res, errs := b.store.ApplyReplies(ctx, []statestore.Reply{
		{OrderID: done.OrderID, Step: 1, Attempt: 1, OK: true, Result: []byte(`{}`), Actor: "s"},
		{OrderID: going.OrderID, Step: 1, Attempt: 1, OK: true, Result: []byte(`{}`), Actor: "s"},
		{OrderID: held.OrderID, Step: 1, Attempt: 1, OK: false, Error: "400 no", Actor: "s"},
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
	if res[0].OrderStatus != statestore.OrderCompleted || res[0].OrderNamespace != "team-a" {
		t.Errorf("the batched reply that ended its order: %q in %q", res[0].OrderStatus, res[0].OrderNamespace)
	}
	if res[1].OrderStatus != "" || res[1].OrderNamespace != "" {
		t.Errorf("a reply that moved its order on: %q in %q", res[1].OrderStatus, res[1].OrderNamespace)
	}
	if res[2].OrderStatus != statestore.OrderError || res[2].OrderNamespace != "team-a" {
		t.Errorf("the failed reply that held its order: %q in %q", res[2].OrderStatus, res[2].OrderNamespace)
	}
}
