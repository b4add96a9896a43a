package statestore_test

import (
	"errors"
	"slices"
	"testing"
	"time"

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
	if names, err := b.store.NamespaceNames(ctx); err != nil || !slices.Equal(names, []string{"default", "team-a"}) {
		t.Fatalf("namespaces %v %v", names, err)
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
