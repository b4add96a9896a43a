package statestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"sas/internal/statestore"
	"sas/internal/testenv"
)

// The hot operations of the state store, one order or step per op, against
// the real PostgreSQL. Run with a fixed count for comparable figures:
//
//	go test -run '^$' -bench . -benchtime 2000x -count 5 ./internal/statestore | tee new.txt
//	benchstat old.txt new.txt

func benchStore(b *testing.B) (bundle, context.Context) {
	b.Helper()
	url, pool := testenv.Database(b)
	return bundle{url: url, pool: pool, store: statestore.New(pool)}, context.Background()
}

// fill inserts n one-step orders with the given step timeout.
func fill(b *testing.B, bd bundle, n int, timeout time.Duration) {
	b.Helper()
	for range n {
		if _, err := bd.store.InsertOrder(context.Background(), order(1, timeout, 1000)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInsertOrder: one three-step order with its rows, history and
// event per op.
func BenchmarkInsertOrder(b *testing.B) {
	bd, ctx := benchStore(b)
	orders := make([]statestore.NewOrder, b.N)
	for i := range orders {
		orders[i] = order(3, time.Minute, 5)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := bd.store.InsertOrder(ctx, orders[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimPending: steps claimed in batches of 100; per op, one step.
func BenchmarkClaimPending(b *testing.B) {
	bd, ctx := benchStore(b)
	fill(b, bd, b.N, time.Hour)
	b.ResetTimer()
	for claimed := 0; claimed < b.N; {
		got, err := bd.store.ClaimPending(ctx, "bench", 100, "agent")
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("only %d of %d steps claimed", claimed, b.N)
		}
		claimed += len(got)
	}
}

// BenchmarkApplyReply: one fenced ok reply per op, ending its order.
func BenchmarkApplyReply(b *testing.B) {
	bd, ctx := benchStore(b)
	fill(b, bd, b.N, time.Hour)
	var steps []statestore.ClaimedStep
	for len(steps) < b.N {
		got, err := bd.store.ClaimPending(ctx, "bench", 500, "agent")
		if err != nil {
			b.Fatal(err)
		}
		steps = append(steps, got...)
	}
	b.ResetTimer()
	for _, s := range steps {
		if _, err := bd.store.ApplyReply(ctx, statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Result: []byte(`{}`), Actor: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyReplies: as BenchmarkApplyReply, the replies applied 64 to
// a transaction (as a busy scheduler does); per op, one reply.
func BenchmarkApplyReplies(b *testing.B) {
	bd, ctx := benchStore(b)
	fill(b, bd, b.N, time.Hour)
	var replies []statestore.Reply
	for len(replies) < b.N {
		got, err := bd.store.ClaimPending(ctx, "bench", 500, "agent")
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range got {
			replies = append(replies, statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Result: []byte(`{}`), Actor: "bench"})
		}
	}
	b.ResetTimer()
	for len(replies) > 0 {
		n := min(64, len(replies))
		if _, errs := bd.store.ApplyReplies(ctx, replies[:n]); errors.Join(errs...) != nil {
			b.Fatal(errors.Join(errs...))
		}
		replies = replies[n:]
	}
}

// BenchmarkInsertOrders: as BenchmarkInsertOrder, 64 orders to a
// transaction (as a busy submitter does); per op, one order.
func BenchmarkInsertOrders(b *testing.B) {
	bd, ctx := benchStore(b)
	orders := make([]statestore.NewOrder, b.N)
	for i := range orders {
		orders[i] = order(3, time.Minute, 5)
	}
	b.ResetTimer()
	for len(orders) > 0 {
		n := min(64, len(orders))
		if _, errs := bd.store.InsertOrders(ctx, orders[:n]); errors.Join(errs...) != nil {
			b.Fatal(errors.Join(errs...))
		}
		orders = orders[n:]
	}
}

// BenchmarkSweepExpired: expired steps reset in batches of 500; per op,
// one step.
func BenchmarkSweepExpired(b *testing.B) {
	bd, ctx := benchStore(b)
	fill(b, bd, b.N, time.Millisecond)
	for claimed := 0; claimed < b.N; {
		got, err := bd.store.ClaimPending(ctx, "bench", 500, "agent")
		if err != nil {
			b.Fatal(err)
		}
		claimed += len(got)
	}
	testenv.Eventually(b, time.Minute, "every step to expire", func() bool {
		var n int
		_ = bd.pool.QueryRow(ctx, `SELECT count(*) FROM steps WHERE process_state = 'processing' AND complete_by >= now()`).Scan(&n)
		return n == 0
	})
	b.ResetTimer()
	for swept := 0; swept < b.N; {
		got, err := bd.store.SweepExpired(ctx, statestore.SweepParams{Actor: "bench", Limit: 500, BackoffBase: time.Second, BackoffMax: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("only %d of %d steps swept", swept, b.N)
		}
		swept += len(got)
	}
}
