package statestore_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/statestore"
)

// TestMergedPagesWalkEveryStoreInOrder: paging through three stores'
// orders by the merged page's cursor, each store read after that cursor
// at most a page at a time, gives every order once, newest first by
// (created_at, order_id), ties of created_at across stores included.
func TestMergedPagesWalkEveryStoreInOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	base := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	stores := make([][]statestore.OrderRow, 3)
	var all []statestore.OrderRow
	for i := range 500 {
		o := statestore.OrderRow{OrderID: fmt.Sprintf("%08x-0000-4000-8000-%012d", rng.Uint32(), i),
			CreatedAt: base.Add(time.Duration(rng.IntN(200)) * time.Millisecond)} // many ties
		k := rng.IntN(3)
		if i%50 == 0 {
			k = 0 // one store holds more than the others
		}
		stores[k] = append(stores[k], o)
		all = append(all, o)
	}
	newest := func(x, y statestore.OrderRow) int {
		if c := y.CreatedAt.Compare(x.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(y.OrderID, x.OrderID)
	}
	for _, s := range stores {
		slices.SortFunc(s, newest)
	}
	slices.SortFunc(all, newest)
	// page is what one store's OrderPage answers after cursor c.
	page := func(s []statestore.OrderRow, c *statestore.OrderCursor, limit int) ([]statestore.OrderRow, bool) {
		i := 0
		if c != nil {
			i = slices.IndexFunc(s, func(o statestore.OrderRow) bool {
				return o.CreatedAt.Before(c.CreatedAt) || o.CreatedAt.Equal(c.CreatedAt) && o.OrderID < c.OrderID
			})
			if i < 0 {
				i = len(s)
			}
		}
		rows := s[i:min(len(s), i+limit)]
		return rows, i+limit < len(s)
	}
	for _, limit := range []int{1, 7, 50, 499, 500, 501} {
		var got []statestore.OrderRow
		var c *statestore.OrderCursor
		for pages := 0; ; pages++ {
			if pages > 600 {
				t.Fatalf("limit %d: no end after 600 pages", limit)
			}
			var ps [][]statestore.OrderRow
			more := false
			for _, s := range stores {
				rows, m := page(s, c, limit)
				ps, more = append(ps, rows), more || m
			}
			rows, next := statestore.MergeOrderPages(ps, more, limit)
			if len(rows) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(rows))
			}
			got = append(got, rows...)
			if next == nil {
				break
			}
			c = next
		}
		if len(got) != len(all) {
			t.Fatalf("limit %d: %d orders, want %d", limit, len(got), len(all))
		}
		for i := range all {
			if got[i].OrderID != all[i].OrderID {
				t.Fatalf("limit %d: order %d is %s, want %s", limit, i, got[i].OrderID, all[i].OrderID)
			}
		}
	}
}

// TestAQuotasShareNeverPassesTheWhole: three partitions' shares of a
// namespace's quotas add up to at most them; the payload's bound is each
// partition's whole; one partition's share is the whole.
func TestAQuotasShareNeverPassesTheWhole(t *testing.T) {
	t.Parallel()
	inFlight, rate, burst, payload := 31, 30.0, 5, 4096
	q := statestore.Quotas{MaxInFlight: &inFlight, MaxSubmitRate: &rate, MaxSubmitBurst: &burst, MaxPayloadBytes: &payload}
	if got := q.Share(1); got.MaxInFlight != q.MaxInFlight {
		t.Fatal("one partition's share is not the whole")
	}
	s := q.Share(3)
	if *s.MaxInFlight != 10 || *s.MaxSubmitRate != 10 || *s.MaxSubmitBurst != 1 || *s.MaxPayloadBytes != 4096 || *q.MaxInFlight != 31 {
		t.Fatalf("a third: %d %v %d %d (the whole left %d)", *s.MaxInFlight, *s.MaxSubmitRate, *s.MaxSubmitBurst, *s.MaxPayloadBytes, *q.MaxInFlight)
	}
	if n := (statestore.Quotas{}).Share(3); n.Any() {
		t.Fatalf("no quotas shared: %+v", n)
	}
}
