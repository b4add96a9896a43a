package statestore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/statestore/lab"
)

// The hot operations of the state store, one order or step per op, against
// the real PostgreSQL. Run with a fixed count for comparable figures:
//
//	go test -run '^$' -bench . -benchtime 2000x -count 5 ./internal/statestore | tee new.txt
//	benchstat old.txt new.txt
//
// Besides the wall time, each reports pg-cpu-ns/op: the CPU time every
// local PostgreSQL process spent per op; client-cpu-ns/op, this process's
// (the statements' client side: pgx, encoding the arguments, reading the
// rows); and wal-B/op, the write-ahead log the cluster wrote per op. The
// wall time also holds the commits' disk flushes; the CPU time says what
// the database did, and varied less from run to run on a shared machine;
// the WAL varies least (it counts whatever else writes to the cluster
// meanwhile, usually nothing).

func benchStore(b *testing.B) (bundle, context.Context) {
	b.Helper()
	url, pool := testenv.Database(b)
	return bundle{url: url, pool: pool, store: statestore.New(pool)}, context.Background()
}

// measurePG resets the timer and starts measuring PostgreSQL's CPU time,
// this process's and the WAL the cluster writes; the returned func reports
// them per op.
func measurePG(b *testing.B, bd bundle) func() {
	b.Helper()
	ctx := context.Background()
	wal0, err := lab.ReadWAL(ctx, bd.pool)
	if err != nil {
		b.Fatal(err)
	}
	stop := testenv.MeasureCPU(b, "pg", "postgres")
	return func() {
		stop()
		if b.N == 0 {
			return
		}
		if wal1, err := lab.ReadWAL(ctx, bd.pool); err == nil {
			b.ReportMetric(float64(wal1.Bytes-wal0.Bytes)/float64(b.N), "wal-B/op")
		}
	}
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

// claimed fills the store with n one-step orders and claims every step.
func claimed(b *testing.B, bd bundle, n int) []statestore.ClaimedStep {
	b.Helper()
	fill(b, bd, n, time.Hour)
	var steps []statestore.ClaimedStep
	for len(steps) < n {
		got, err := bd.store.ClaimPending(context.Background(), "bench", 500, "agent")
		if err != nil {
			b.Fatal(err)
		}
		steps = append(steps, got...)
	}
	return steps
}

// BenchmarkInsertOrder: one three-step order with its rows, history and
// event per op.
func BenchmarkInsertOrder(b *testing.B) {
	bd, ctx := benchStore(b)
	orders := make([]statestore.NewOrder, b.N)
	for i := range orders {
		orders[i] = order(3, time.Minute, 5)
	}
	defer measurePG(b, bd)()
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
	defer measurePG(b, bd)()
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
	steps := claimed(b, bd, b.N)
	defer measurePG(b, bd)()
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
	var replies []statestore.Reply
	for _, s := range claimed(b, bd, b.N) {
		replies = append(replies, statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Result: []byte(`{}`), Actor: "bench"})
	}
	defer measurePG(b, bd)()
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
	insertOrders(b, func() statestore.NewOrder { return order(3, time.Minute, 5) })
}

// BenchmarkInsertOrdersSingle: as BenchmarkInsertOrders, orders of the
// single workflow's shape: one action and its compensation (2 step rows,
// 3 history rows, a status event).
func BenchmarkInsertOrdersSingle(b *testing.B) {
	insertOrders(b, func() statestore.NewOrder {
		o := order(1, time.Minute, 5)
		o.Steps = append(o.Steps, statestore.NewStep{Name: "undo1", Agent: "agent", Kind: statestore.KindCompensation,
			Compensates: 1, Timeout: time.Minute, MaxFailures: 5})
		return o
	})
}

func insertOrders(b *testing.B, next func() statestore.NewOrder) {
	bd, ctx := benchStore(b)
	orders := make([]statestore.NewOrder, b.N)
	for i := range orders {
		orders[i] = next()
	}
	defer measurePG(b, bd)()
	for len(orders) > 0 {
		n := min(64, len(orders))
		if _, errs := bd.store.InsertOrders(ctx, orders[:n]); errors.Join(errs...) != nil {
			b.Fatal(errors.Join(errs...))
		}
		orders = orders[n:]
	}
}

// BenchmarkRelayOutbox: status events taken from the outbox and, once
// published, deleted, 100 to a round (as a scheduler's relay does, the
// broker left out); per op, one event.
func BenchmarkRelayOutbox(b *testing.B) {
	bd, ctx := benchStore(b)
	fill(b, bd, b.N, time.Hour) // each order writes one status event
	publish := func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) { return len(msgs), nil }
	defer measurePG(b, bd)()
	for relayed := 0; relayed < b.N; {
		n, err := bd.store.RelayOutbox(ctx, 100, publish)
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			b.Fatalf("the outbox ran dry after %d of %d events", relayed, b.N)
		}
		relayed += n
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
	defer measurePG(b, bd)()
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

// BenchmarkAtLowRate: the statements of a single-step order, each alone
// at testenv.LowRate a second, as a system at low load runs them: per op,
// one statement (its round trip, its executor's start, its commit). What
// each costs PostgreSQL here is what every order pays for it at low load,
// when no other order shares the statement.
//
//	go test -run '^$' -bench AtLowRate -benchtime 300x ./internal/statestore
func BenchmarkAtLowRate(b *testing.B) {
	single := func() statestore.NewOrder {
		o := order(1, time.Hour, 5)
		o.Steps = append(o.Steps, statestore.NewStep{Name: "undo1", Agent: "agent", Kind: statestore.KindCompensation,
			Compensates: 1, Timeout: time.Minute, MaxFailures: 5})
		return o
	}
	b.Run("round-trip", func(b *testing.B) {
		bd, ctx := benchStore(b)
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(int) {
			if _, err := bd.pool.Exec(ctx, `SELECT 1`); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("insert-order", func(b *testing.B) {
		bd, ctx := benchStore(b)
		orders := make([]statestore.NewOrder, b.N)
		for i := range orders {
			orders[i] = single()
		}
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(i int) {
			if _, err := bd.store.InsertOrder(ctx, orders[i]); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("claim", func(b *testing.B) {
		bd, ctx := benchStore(b)
		fill(b, bd, b.N, time.Hour)
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(int) {
			if got, err := bd.store.ClaimPending(ctx, "bench", 1, "agent"); err != nil || len(got) != 1 {
				b.Fatalf("claimed %d, %v; want 1", len(got), err)
			}
		})
	})
	b.Run("claim-nothing", func(b *testing.B) {
		bd, ctx := benchStore(b)
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(int) {
			if got, err := bd.store.ClaimPending(ctx, "bench", 100, "agent"); err != nil || len(got) != 0 {
				b.Fatalf("claimed %d, %v; want none", len(got), err)
			}
		})
	})
	b.Run("apply-reply", func(b *testing.B) {
		bd, ctx := benchStore(b)
		steps := claimed(b, bd, b.N)
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(i int) {
			s := steps[i]
			if _, err := bd.store.ApplyReply(ctx, statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Result: []byte(`{}`), Actor: "bench"}); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("relay-round", func(b *testing.B) {
		bd, ctx := benchStore(b)
		fill(b, bd, b.N, time.Hour) // each order writes one status event
		publish := func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) { return len(msgs), nil }
		defer measurePG(b, bd)()
		testenv.Paced(b, testenv.LowRate, func(int) {
			if n, err := bd.store.RelayOutbox(ctx, 1, publish); err != nil || n != 1 {
				b.Fatalf("relayed %d, %v; want 1", n, err)
			}
		})
	})
}

// BenchmarkFireDueTimers: b.N timers fall due at once (delayed steps of
// orders that start later, all due at the same moment on the database
// clock) and the leader fires them, 500 to a statement, as fast as it
// can; per op, one timer. Besides the costs it reports how late each
// fired on the database clock, p50 and p99: the lag the firing alone adds
// (the supervisor's poll, SAS_SUPERVISOR_TIMER_POLL, comes on top).
//
//	go test -run '^$' -bench FireDueTimers -benchtime 10000x ./internal/statestore
func BenchmarkFireDueTimers(b *testing.B) {
	bd, ctx := benchStore(b)
	later := time.Now().Add(time.Hour)
	orders := make([]statestore.NewOrder, b.N)
	for i := range orders {
		orders[i] = order(1, time.Minute, 5)
		orders[i].StartAt = &later
	}
	for len(orders) > 0 {
		n := min(64, len(orders))
		if _, errs := bd.store.InsertOrders(ctx, orders[:n]); errors.Join(errs...) != nil {
			b.Fatal(errors.Join(errs...))
		}
		orders = orders[n:]
	}
	var due time.Time
	if err := bd.pool.QueryRow(ctx, `UPDATE steps SET due_at = date_trunc('milliseconds', clock_timestamp()) + interval '500 milliseconds'
		WHERE process_state = 'delayed' RETURNING due_at`).Scan(&due); err != nil && !errors.Is(err, pgx.ErrTooManyRows) {
		b.Fatal(err)
	}
	if _, err := bd.store.AcquireLease(ctx, statestore.SupervisorLease, "bench", time.Hour); err != nil {
		b.Fatal(err)
	}
	for {
		d, ok, err := bd.store.NextTimer(ctx)
		if err != nil || !ok {
			b.Fatalf("next timer: %v %v", ok, err)
		}
		if d <= 0 {
			break
		}
		time.Sleep(d) // setup: until the timers are due
	}
	lags := make([]float64, 0, b.N)
	stop := measurePG(b, bd)
	for len(lags) < b.N {
		fired, err := bd.store.FireTimers(ctx, "bench", statestore.SupervisorLease, 500)
		if err != nil {
			b.Fatal(err)
		}
		if len(fired) == 0 {
			b.Fatalf("no timer left after %d of %d", len(lags), b.N)
		}
		for _, f := range fired {
			lags = append(lags, f.Late.Seconds()*1000)
		}
	}
	stop()
	slices.Sort(lags)
	b.ReportMetric(lags[len(lags)/2], "lag-p50-ms")
	b.ReportMetric(lags[min(len(lags)*99/100, len(lags)-1)], "lag-p99-ms")
}
