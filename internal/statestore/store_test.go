package statestore_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/migrations"
)

type bundle struct {
	url   string
	pool  *pgxpool.Pool
	store *statestore.Store
}

func setup(t *testing.T) bundle {
	t.Helper()
	url, pool := testenv.Database(t)
	return bundle{url: url, pool: pool, store: statestore.New(pool)}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// storeNamed is a store on a pool of its own whose sessions carry an
// application_name of their own (prefix and a random suffix, returned),
// for a test to find them in pg_stat_activity; tracer, if not nil, sees
// its queries.
func storeNamed(t *testing.T, b bundle, prefix string, tracer pgx.QueryTracer) (*statestore.Store, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	app := prefix + testenv.RandomSuffix(8)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return statestore.New(pool), app
}

// order returns a new order of n steps with the given step timeout.
func order(n int, timeout time.Duration, maxFailures int) statestore.NewOrder {
	id := messages.NewID()
	steps := make([]statestore.NewStep, n)
	for i := range steps {
		steps[i] = statestore.NewStep{Name: fmt.Sprintf("step%d", i+1), Agent: "agent", Timeout: timeout, MaxFailures: maxFailures}
	}
	h := sha256.Sum256([]byte(id))
	return statestore.NewOrder{
		OrderID: id, Workflow: "test", Payload: []byte(`{"customer":"c"}`), PayloadHash: h[:], Steps: steps, Actor: "test",
		FailurePolicy: statestore.PolicyHold,
	}
}

func insert(t *testing.T, b bundle, o statestore.NewOrder) {
	t.Helper()
	got, err := b.store.InsertOrder(ctxFor(t), o)
	if err != nil || got != statestore.Inserted {
		t.Fatalf("insert: %v %v", got, err)
	}
}

func count(t *testing.T, b bundle, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(ctxFor(t), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// waitExpired waits until every processing step's complete_by (of only
// the given orders, if any) has passed on the database clock.
func waitExpired(t *testing.T, b bundle, orderIDs ...string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "steps to expire", func() bool {
		return count(t, b, `SELECT count(*) FROM steps WHERE process_state = 'processing' AND complete_by >= now()
			AND (coalesce(cardinality($1::uuid[]), 0) = 0 OR order_id = ANY($1))`, orderIDs) == 0
	})
}

// makeDue moves every pending step's backoff into the past, so a test need
// not wait it out.
func makeDue(t *testing.T, b bundle) {
	t.Helper()
	if _, err := b.pool.Exec(ctxFor(t), `UPDATE steps SET available_at = now() - interval '1 second' WHERE process_state = 'pending'`); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateTwiceAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t) // already migrated once
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	ran := make([][]string, 4)
	for i := range 4 {
		wg.Go(func() { ran[i], errs[i] = statestore.Migrate(ctxFor(t), b.pool, ms) })
	}
	wg.Wait()
	for i := range 4 {
		if errs[i] != nil || len(ran[i]) != 0 {
			t.Fatalf("migrate %d on a migrated schema: ran %v, err %v", i, ran[i], errs[i])
		}
	}
	if n := count(t, b, `SELECT count(*) FROM schema_migrations`); n != len(ms) {
		t.Fatalf("%d migrations recorded, want %d", n, len(ms))
	}
}

func TestMigrateFreshSchemaConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	// A second, empty schema in the same database, migrated by 4 at once.
	schema := "t_fresh_" + testenv.RandomSuffix(8)
	if _, err := b.pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`) })
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Go(func() {
			ran, err := statestore.Migrate(ctx, pool, ms)
			if err != nil {
				t.Errorf("migrate: %v", err)
			}
			mu.Lock()
			total += len(ran)
			mu.Unlock()
		})
	}
	wg.Wait()
	if total != len(ms) {
		t.Fatalf("4 concurrent migrations applied %d files in all, want %d (each once)", total, len(ms))
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatalf("orders table missing after migration: %v", err)
	}
}

func TestInsertOrderWritesEverythingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(3, time.Minute, 3)
	o.ReplyTo = "shop.status"
	insert(t, b, o)

	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Order.Status != statestore.OrderReceived || d.Order.ReplyTo != "shop.status" {
		t.Fatalf("order %+v", d.Order)
	}
	wantStates := []string{statestore.StepPending, statestore.StepWaiting, statestore.StepWaiting}
	for i, st := range d.Steps {
		if st.ProcessState != wantStates[i] || st.Attempt != 0 || st.IdempotencyKey != statestore.IdempotencyKey(o.OrderID, i+1, st.Name) {
			t.Fatalf("step %d: %+v", i+1, st)
		}
	}
	// The order's and the first step's creation: steps created waiting
	// get no history row.
	if len(d.History) != 2 || d.History[0].Step != nil || d.History[0].To != statestore.OrderReceived ||
		d.History[1].Step == nil || *d.History[1].Step != 1 || d.History[1].To != statestore.StepPending {
		t.Fatalf("history %+v, want the order received and step 1 pending", d.History)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'status_event' AND reply_to = 'shop.status'`, o.OrderID); n != 1 {
		t.Fatalf("%d received events in the outbox, want 1", n)
	}
	// The outbox body must be a StatusEvent the decoder accepts.
	var body []byte
	if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE order_id = $1`, o.OrderID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	if ev, err := messages.DecodeStatusEvent(body); err != nil || ev.Status != messages.StatusReceived {
		t.Fatalf("outbox body %s: %+v %v", body, ev, err)
	}

	// Same id, same payload: a duplicate that writes nothing.
	got, err := b.store.InsertOrder(ctx, o)
	if err != nil || got != statestore.Duplicate {
		t.Fatalf("second insert: %v %v", got, err)
	}
	// Same id, other payload: a conflict that writes nothing.
	other := o
	other.PayloadHash = make([]byte, 32)
	if _, err := b.store.InsertOrder(ctx, other); !errors.Is(err, statestore.ErrConflict) {
		t.Fatalf("conflicting insert: %v", err)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions`); n != 2 {
		t.Fatalf("%d history entries after duplicate and conflict, want 2", n)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows after duplicate and conflict, want 1", n)
	}
}

func TestInsertOrderIsOneTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := order(2, time.Minute, 3)
	o.Steps[1].MaxFailures = 0 // violates a CHECK on the second step row
	if _, err := b.store.InsertOrder(ctxFor(t), o); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("insert with an invalid step: %v, want ErrInvalidData", err)
	}
	for _, table := range []string{"orders", "steps", "transitions", "outbox"} {
		if n := count(t, b, `SELECT count(*) FROM `+table); n != 0 {
			t.Fatalf("%d rows left in %s after a failed insert", n, table)
		}
	}
}

func TestInsertSameOrderConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := order(1, time.Minute, 3)
	var mu sync.Mutex
	outcomes := map[statestore.InsertOutcome]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			got, err := b.store.InsertOrder(ctxFor(t), o)
			if err != nil {
				t.Errorf("insert: %v", err)
			}
			mu.Lock()
			outcomes[got]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if outcomes[statestore.Inserted] != 1 || outcomes[statestore.Duplicate] != 7 {
		t.Fatalf("outcomes %v, want 1 inserted and 7 duplicates", outcomes)
	}
}

// TestClaimConcurrently: claimers on separate connections share 2,000
// pending steps; no step is claimed twice and none is lost.
func TestClaimConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const steps, claimers = 2000, 10
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < steps; i += 8 {
				if _, err := b.store.InsertOrder(ctx, order(1, time.Hour, 3)); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	type key struct {
		order   string
		step    int
		attempt int
	}
	var mu sync.Mutex
	claimedBy := map[key]string{}
	dups := 0
	for c := range claimers {
		wg.Go(func() {
			// A pool of one: each claimer is its own database session.
			pool, err := statestore.Connect(ctx, b.url, 1)
			if err != nil {
				t.Errorf("connect: %v", err)
				return
			}
			defer pool.Close()
			store := statestore.New(pool)
			me := fmt.Sprintf("scheduler-%d", c)
			for {
				got, err := store.ClaimPending(ctx, me, 17, "")
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, s := range got {
					k := key{s.OrderID, s.Step, s.Attempt}
					if _, seen := claimedBy[k]; seen {
						dups++
					}
					claimedBy[k] = me
					if s.Budget <= 0 || s.Budget > time.Hour || s.Attempt != 1 {
						t.Errorf("claimed step %+v: want attempt 1 and a budget within the hour", s)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if dups != 0 {
		t.Fatalf("%d steps were claimed twice in the same attempt", dups)
	}
	if len(claimedBy) != steps {
		t.Fatalf("%d steps claimed, want %d", len(claimedBy), steps)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE process_state = 'processing' AND attempt = 1 AND locked_by IS NOT NULL`); n != steps {
		t.Fatalf("%d steps processing in the store, want %d", n, steps)
	}
	if n := count(t, b, `SELECT count(*) FROM (SELECT order_id, step FROM transitions WHERE to_state = 'processing' AND step IS NOT NULL
		GROUP BY order_id, step HAVING count(*) <> 1) x`); n != 0 {
		t.Fatalf("%d steps have other than one claim in their history", n)
	}
	perClaimer := map[string]int{}
	for _, who := range claimedBy {
		perClaimer[who]++
	}
	t.Logf("steps per claimer: %v", perClaimer)
}

func TestClaimRespectsPriorityAndBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	low, high, later := order(1, time.Minute, 3), order(1, time.Minute, 3), order(1, time.Minute, 3)
	high.Priority = 9
	for _, o := range []statestore.NewOrder{low, high, later} {
		insert(t, b, o)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET available_at = now() + interval '1 hour' WHERE order_id = $1`, later.OrderID); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.ClaimPending(ctx, "s", 1, "")
	if err != nil || len(got) != 1 || got[0].OrderID != high.OrderID {
		t.Fatalf("first claim %+v %v, want the priority 9 order", got, err)
	}
	got, err = b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(got) != 1 || got[0].OrderID != low.OrderID {
		t.Fatalf("second claim %+v %v, want only the low order (the other is backing off)", got, err)
	}
	d, err := b.store.GetOrder(ctx, low.OrderID)
	if err != nil || d.Order.Status != statestore.OrderProcessing {
		t.Fatalf("order after its first claim: %+v %v", d.Order, err)
	}
}

// snapshot is what a stale reply must not change.
func snapshot(t *testing.T, b bundle, orderID string) string {
	t.Helper()
	d, err := b.store.GetOrder(ctxFor(t), orderID)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(j)
}

func TestApplyReplyIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)

	t.Run("old attempt", func(t *testing.T) {
		o := order(2, 50*time.Millisecond, 5)
		insert(t, b, o)
		first, err := b.store.ClaimPending(ctx, "s1", 1, "")
		if err != nil || len(first) != 1 {
			t.Fatalf("claim: %v %v", first, err)
		}
		waitExpired(t, b)
		if _, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "sup", Limit: 10, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		makeDue(t, b)
		if _, err := b.pool.Exec(ctx, `UPDATE steps SET timeout = interval '1 hour' WHERE order_id = $1`, o.OrderID); err != nil {
			t.Fatal(err)
		}
		second, err := b.store.ClaimPending(ctx, "s2", 1, "")
		if err != nil || len(second) != 1 || second[0].Attempt != 2 {
			t.Fatalf("reclaim: %+v %v", second, err)
		}
		before := snapshot(t, b, o.OrderID)
		_, err = b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: true, Result: []byte(`{}`), Actor: "s1"})
		var stale *statestore.StaleReplyError
		if !errors.As(err, &stale) || !errors.Is(err, statestore.ErrStale) || stale.Kind != statestore.StaleSuperseded {
			t.Fatalf("reply of attempt 1 after attempt 2 was claimed: %v", err)
		}
		t.Logf("reported: %v", err)
		if after := snapshot(t, b, o.OrderID); after != before {
			t.Fatalf("stale reply changed the order:\nbefore %s\nafter  %s", before, after)
		}
		// The current attempt's reply is applied and moves the order on.
		res, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 2, OK: true, Result: []byte(`{"r":1}`), Actor: "s2"})
		if err != nil || res.StepState != statestore.StepProcessed || res.NextStep != 2 || res.OrderStatus != "" {
			t.Fatalf("current reply: %+v %v", res, err)
		}
		// The same reply again (a redelivery) is stale and changes nothing.
		before = snapshot(t, b, o.OrderID)
		if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 2, OK: true, Actor: "s2"}); !errors.Is(err, statestore.ErrStale) {
			t.Fatalf("duplicate reply: %v", err)
		}
		if after := snapshot(t, b, o.OrderID); after != before {
			t.Fatal("duplicate reply changed the order")
		}
	})

	t.Run("after complete_by", func(t *testing.T) {
		o := order(1, 30*time.Millisecond, 5)
		insert(t, b, o)
		claimed, err := b.store.ClaimPending(ctx, "s1", 10, "")
		if err != nil {
			t.Fatal(err)
		}
		var mine *statestore.ClaimedStep
		for i := range claimed {
			if claimed[i].OrderID == o.OrderID {
				mine = &claimed[i]
			}
		}
		if mine == nil {
			t.Fatalf("order not claimed: %+v", claimed)
		}
		waitExpired(t, b, o.OrderID)
		before := snapshot(t, b, o.OrderID)
		_, err = b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: mine.Attempt, OK: true, Actor: "s1"})
		var stale *statestore.StaleReplyError
		if !errors.As(err, &stale) || stale.Kind != statestore.StaleLate {
			t.Fatalf("late reply: %v", err)
		}
		if after := snapshot(t, b, o.OrderID); after != before {
			t.Fatalf("late reply changed the order:\nbefore %s\nafter  %s", before, after)
		}
	})

	t.Run("unknown step", func(t *testing.T) {
		_, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: messages.NewID(), Step: 1, Attempt: 1, OK: true, Actor: "s"})
		var stale *statestore.StaleReplyError
		if !errors.As(err, &stale) || stale.Kind != statestore.StaleUnknownStep {
			t.Fatalf("reply for an unknown order: %v", err)
		}
	})
}

func TestApplyReplyCompletesAndFailsOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	ok, bad := order(2, time.Hour, 3), order(2, time.Hour, 3)
	insert(t, b, ok)
	insert(t, b, bad)
	attempts := map[string]int{}
	claimAll := func() {
		got, err := b.store.ClaimPending(ctx, "s", 10, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got {
			attempts[fmt.Sprint(c.OrderID, c.Step)] = c.Attempt
		}
	}
	claimAll()
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: ok.OrderID, Step: 1, Attempt: 1, OK: true, Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: bad.OrderID, Step: 1, Attempt: 1, OK: false, Error: "card declined", Actor: "s"})
	if err != nil || res.StepState != statestore.StepError || res.OrderStatus != statestore.OrderError {
		t.Fatalf("failed reply: %+v %v", res, err)
	}
	claimAll()
	res, err = b.store.ApplyReply(ctx, statestore.Reply{OrderID: ok.OrderID, Step: 2, Attempt: attempts[fmt.Sprint(ok.OrderID, 2)], OK: true, Result: []byte(`{"shipment":"s-1"}`), Actor: "s"})
	if err != nil || res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("last reply: %+v %v", res, err)
	}
	d, err := b.store.GetOrder(ctx, bad.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Order.Status != statestore.OrderError || d.Steps[0].LastError != "card declined" || d.Steps[1].ProcessState != statestore.StepWaiting {
		t.Fatalf("failed order: %+v", d)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'operator_alert'`, bad.OrderID); n != 1 {
		t.Fatalf("%d alerts for the failed order, want 1", n)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND body->>'status' = 'completed'`, ok.OrderID); n != 1 {
		t.Fatalf("%d completed events, want 1", n)
	}
}

func TestSweepResetsThenFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(1, 20*time.Millisecond, 3)
	insert(t, b, o)
	params := statestore.SweepParams{Actor: "supervisor-1", Limit: 100, BackoffBase: time.Second, BackoffMax: time.Minute}
	for failure := 1; failure <= 3; failure++ {
		claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
		if err != nil || len(claimed) != 1 || claimed[0].Attempt != failure {
			t.Fatalf("claim %d: %+v %v", failure, claimed, err)
		}
		waitExpired(t, b)
		swept, err := b.store.SweepExpired(ctx, params)
		if err != nil || len(swept) != 1 {
			t.Fatalf("sweep %d: %+v %v", failure, swept, err)
		}
		want := statestore.StepPending
		if failure == 3 {
			want = statestore.StepError
		}
		if swept[0].FailureCount != failure || swept[0].NewState != want {
			t.Fatalf("sweep %d: %+v, want failure_count %d and %s", failure, swept[0], failure, want)
		}
		if failure < 3 {
			// Backoff: not claimable until available_at, 1s * 2^(failure-1).
			var wait float64
			if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM available_at - now()) FROM steps WHERE order_id = $1`, o.OrderID).Scan(&wait); err != nil {
				t.Fatal(err)
			}
			if lo, hi := float64(int(1)<<(failure-1))-0.5, float64(int(1)<<(failure-1)); wait < lo || wait > hi {
				t.Fatalf("backoff after failure %d is %.2fs, want about %.0fs", failure, wait, hi)
			}
			if again, err := b.store.ClaimPending(ctx, "s", 10, ""); err != nil || len(again) != 0 {
				t.Fatalf("claimed during backoff: %+v %v", again, err)
			}
			makeDue(t, b)
		}
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Order.Status != statestore.OrderError || d.Steps[0].ProcessState != statestore.StepError || d.Steps[0].LockedBy != "" {
		t.Fatalf("after the threshold: %+v", d)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE message_type = 'operator_alert' AND order_id = $1`, o.OrderID); n != 1 {
		t.Fatalf("%d alerts, want 1", n)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE actor = 'supervisor-1'`); n != 4 {
		t.Fatalf("%d supervisor transitions, want 4 (2 resets, 1 error, the order's error)", n)
	}
	if swept, err := b.store.SweepExpired(ctx, params); err != nil || len(swept) != 0 {
		t.Fatalf("sweep after error: %+v %v", swept, err)
	}
}

// TestSweepConcurrently: sweepers on separate connections never count one
// expiry twice.
func TestSweepConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const n = 300
	for range n {
		insert(t, b, order(1, 10*time.Millisecond, 5))
	}
	if claimed, err := b.store.ClaimPending(ctx, "s", n, ""); err != nil || len(claimed) != n {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	waitExpired(t, b)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for i := range 6 {
		wg.Go(func() {
			pool, err := statestore.Connect(ctx, b.url, 1)
			if err != nil {
				t.Errorf("connect: %v", err)
				return
			}
			defer pool.Close()
			store := statestore.New(pool)
			for {
				swept, err := store.SweepExpired(ctx, statestore.SweepParams{Actor: fmt.Sprint("sup-", i), Limit: 7, BackoffBase: time.Second, BackoffMax: time.Second})
				if err != nil {
					t.Errorf("sweep: %v", err)
					return
				}
				if len(swept) == 0 {
					return
				}
				mu.Lock()
				total += len(swept)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if total != n {
		t.Fatalf("sweepers handled %d steps, want %d", total, n)
	}
	if c := count(t, b, `SELECT count(*) FROM steps WHERE failure_count <> 1 OR process_state <> 'pending'`); c != 0 {
		t.Fatalf("%d steps not at failure_count 1 and pending", c)
	}
	if c := count(t, b, `SELECT count(*) FROM (SELECT order_id, step, attempt FROM transitions
		WHERE from_state = 'processing' AND to_state = 'pending' GROUP BY 1, 2, 3 HAVING count(*) > 1) x`); c != 0 {
		t.Fatalf("%d expiries recorded twice in the history", c)
	}
}

func TestResubmit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(2, time.Hour, 3)
	insert(t, b, o)
	if _, err := b.store.Resubmit(ctx, o.OrderID, 0, "operator:alice"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("resubmit of a received order: %v", err)
	}
	if _, err := b.store.Resubmit(ctx, messages.NewID(), 0, "operator:alice"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("resubmit of an unknown order: %v", err)
	}
	if _, err := b.store.ClaimPending(ctx, "s", 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: false, Error: "down", Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Resubmit(ctx, o.OrderID, 2, "operator:alice"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("resubmit of a waiting step: %v", err)
	}
	if _, err := b.store.Resubmit(ctx, o.OrderID, 7, "operator:alice"); !errors.Is(err, statestore.ErrNotFound) ||
		!strings.Contains(err.Error(), "has no step 7 (its steps are 1 to 2)") {
		t.Fatalf("resubmit of an unknown step: %v", err)
	}
	reset, err := b.store.Resubmit(ctx, o.OrderID, 0, "operator:alice")
	if err != nil || len(reset) != 1 || reset[0] != 1 {
		t.Fatalf("resubmit: %v %v", reset, err)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Order.Status != statestore.OrderProcessing || d.Steps[0].ProcessState != statestore.StepPending || d.Steps[0].FailureCount != 0 {
		t.Fatalf("after resubmit: %+v", d)
	}
	// The history names the database login that did it, whatever the
	// operator claims; the claim is kept apart, labelled.
	var login string
	if err := b.pool.QueryRow(ctx, `SELECT session_user`).Scan(&login); err != nil {
		t.Fatal(err)
	}
	for _, h := range d.History[len(d.History)-2:] {
		if h.Actor != "operator:"+login || h.DBUser != login || h.ClaimedBy != "operator:alice" || h.Reason != "operator resubmit" {
			t.Fatalf("history entry of the resubmit %+v", h)
		}
	}
	for _, h := range d.History[:len(d.History)-2] {
		if h.DBUser != "" || h.ClaimedBy != "" {
			t.Fatalf("a service's history entry names an operator: %+v", h)
		}
	}
	claimed, err := b.store.ClaimPending(ctx, "s", 1, "")
	if err != nil || len(claimed) != 1 || claimed[0].Attempt != 2 {
		t.Fatalf("claim after resubmit: %+v %v", claimed, err)
	}
}

func TestHistoryIsAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, order(1, time.Hour, 3))
	if _, err := b.pool.Exec(ctxFor(t), `UPDATE transitions SET actor = 'someone else'`); err == nil {
		t.Fatal("history entries could be rewritten")
	}
}

func TestListOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	a, c := order(1, time.Hour, 3), order(1, time.Hour, 3)
	insert(t, b, a)
	insert(t, b, c)
	if _, err := b.store.ClaimPending(ctx, "s", 2, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: a.OrderID, Step: 1, Attempt: 1, OK: true, Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	all, err := b.store.ListOrders(ctx, statestore.ListFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("list all: %d %v", len(all), err)
	}
	done, err := b.store.ListOrders(ctx, statestore.ListFilter{Status: statestore.OrderCompleted})
	if err != nil || len(done) != 1 || done[0].OrderID != a.OrderID {
		t.Fatalf("list completed: %+v %v", done, err)
	}
	if _, err := b.store.GetOrder(ctx, messages.NewID()); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
}

func TestClaimByAgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	inv, pay := order(1, time.Minute, 3), order(1, time.Minute, 3)
	pay.Steps[0].Agent = "payment"
	insert(t, b, inv)
	insert(t, b, pay)
	got, err := b.store.ClaimPending(ctx, "s", 10, "payment")
	if err != nil || len(got) != 1 || got[0].OrderID != pay.OrderID {
		t.Fatalf("claim for payment: %+v %v", got, err)
	}
	got, err = b.store.ClaimPending(ctx, "s", 10, "payment")
	if err != nil || len(got) != 0 {
		t.Fatalf("second claim for payment: %+v %v", got, err)
	}
	got, err = b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(got) != 1 || got[0].OrderID != inv.OrderID {
		t.Fatalf("claim for any agent: %+v %v", got, err)
	}
}

func TestLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	a, err := b.store.AcquireLease(ctx, "supervisor", "a", 300*time.Millisecond)
	if err != nil || !a.Held || a.Holder != "a" {
		t.Fatalf("first acquire: %+v %v", a, err)
	}
	other, err := b.store.AcquireLease(ctx, "supervisor", "b", time.Second)
	if err != nil || other.Held || other.Holder != "a" || other.Remaining <= 0 {
		t.Fatalf("acquire while held: %+v %v", other, err)
	}
	renewed, err := b.store.AcquireLease(ctx, "supervisor", "a", 300*time.Millisecond)
	if err != nil || !renewed.Held || renewed.Epoch != a.Epoch {
		t.Fatalf("renew: %+v %v", renewed, err)
	}
	// a stops renewing: once the lease expires on the database clock, b
	// takes it, with a new epoch.
	var took statestore.Lease
	testenv.Eventually(t, 5*time.Second, "b to take the expired lease", func() bool {
		took, err = b.store.AcquireLease(ctx, "supervisor", "b", time.Second)
		return err == nil && took.Held
	})
	if took.Epoch != a.Epoch+1 {
		t.Fatalf("epoch after takeover %d, want %d", took.Epoch, a.Epoch+1)
	}
	if err := b.store.ReleaseLease(ctx, "supervisor", "b"); err != nil {
		t.Fatal(err)
	}
	if back, err := b.store.AcquireLease(ctx, "supervisor", "a", time.Second); err != nil || !back.Held {
		t.Fatalf("acquire after release: %+v %v", back, err)
	}
}

func TestSweepIsFencedByLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	insert(t, b, order(1, 10*time.Millisecond, 3))
	if _, err := b.store.ClaimPending(ctx, "s", 1, ""); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, b)
	if _, err := b.store.AcquireLease(ctx, "supervisor", "leader", time.Minute); err != nil {
		t.Fatal(err)
	}
	params := statestore.SweepParams{Actor: "old-leader", Limit: 10, BackoffBase: time.Second, BackoffMax: time.Second, Lease: "supervisor"}
	if swept, err := b.store.SweepExpired(ctx, params); err != nil || len(swept) != 0 {
		t.Fatalf("a sweeper without the lease swept %+v (%v)", swept, err)
	}
	params.Actor = "leader"
	if swept, err := b.store.SweepExpired(ctx, params); err != nil || len(swept) != 1 {
		t.Fatalf("the lease holder's sweep: %+v %v", swept, err)
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	insert(t, b, order(2, time.Hour, 3))
	insert(t, b, order(1, time.Hour, 3))
	if _, err := b.store.ClaimPending(ctx, "s", 1, ""); err != nil {
		t.Fatal(err)
	}
	st, err := b.store.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ByState[statestore.StepPending] != 1 || st.ByState[statestore.StepProcessing] != 1 || st.ByState[statestore.StepError] != 0 || len(st.ByState) != 3 {
		t.Fatalf("by state %v", st.ByState)
	}
	if st.OldestPending < 0 || st.OldestPending > time.Minute || st.OldestProcessing < 0 || st.OldestProcessing > time.Minute {
		t.Fatalf("ages %v %v", st.OldestPending, st.OldestProcessing)
	}
}

func TestCancelOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(3, time.Hour, 3)
	insert(t, b, o)
	claimed, err := b.store.ClaimPending(ctx, "s", 1, "")
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	// No compensations defined: nothing to undo, the order fails at once.
	status, err := b.store.CancelOrder(ctx, o.OrderID, "operator:bob")
	if err != nil || status != statestore.OrderFailed {
		t.Fatalf("cancel: %v %v", status, err)
	}
	// The agent's reply for the step that was processing now changes nothing.
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: true, Actor: "s"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("reply after cancel: %v", err)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil || d.Order.Status != statestore.OrderFailed {
		t.Fatalf("after cancel: %+v %v", d.Order, err)
	}
	for _, st := range d.Steps {
		if st.ProcessState != statestore.StepCancelled {
			t.Fatalf("step %d is %s", st.Step, st.ProcessState)
		}
	}
	if _, err := b.store.CancelOrder(ctx, o.OrderID, "operator:bob"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("second cancel: %v", err)
	}
	if _, err := b.store.CancelOrder(ctx, messages.NewID(), "operator:bob"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("cancel of an unknown order: %v", err)
	}
}

// TestProgressOf: progress counts the orders named, and no other (one
// written before, one beside them).
func TestProgressOf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	insert(t, b, order(1, time.Hour, 3)) // another's: not counted
	running := order(1, time.Hour, 3)
	insert(t, b, running)
	done := order(1, time.Hour, 3)
	insert(t, b, done)
	insert(t, b, order(1, time.Hour, 3)) // another's: not counted
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claimed {
		if c.OrderID == done.OrderID {
			if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: c.OrderID, Step: 1, Attempt: c.Attempt, OK: true, Actor: "s"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	p, err := b.store.ProgressOf(ctx, []string{running.OrderID, done.OrderID})
	if err != nil {
		t.Fatal(err)
	}
	if p.ByStatus[statestore.OrderCompleted] != 1 || p.ByStatus[statestore.OrderProcessing] != 1 || len(p.ByStatus) != 2 {
		t.Fatalf("by status %v", p.ByStatus)
	}
	if p.P50 <= 0 || p.P99 < p.P50 || p.P99 > time.Minute {
		t.Fatalf("latencies %v %v", p.P50, p.P99)
	}
}

// TestApplyRepliesBatch: replies applied together get each its own result
// (applied or stale, with the reason); a reply that breaks the batch's
// transaction sends every reply through on its own, so the good ones still
// apply.
func TestApplyRepliesBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for range 4 {
		insert(t, b, order(1, time.Hour, 3))
	}
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "agent")
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	started := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)
	reply := func(c statestore.ClaimedStep) statestore.Reply {
		return statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Result: []byte(`{"ok":1}`), Actor: "s",
			AgentStartedAt: &started, AgentSentAt: &started, AgentCallMicros: 1500}
	}
	superseded := reply(claimed[1])
	superseded.Attempt++
	unknown := reply(claimed[0])
	unknown.OrderID = messages.NewID()
	res, errs := b.store.ApplyReplies(ctx, []statestore.Reply{reply(claimed[0]), superseded, unknown, reply(claimed[2])})
	var stale *statestore.StaleReplyError
	if errs[0] != nil || res[0].OrderStatus != statestore.OrderCompleted || errs[3] != nil || res[3].OrderStatus != statestore.OrderCompleted {
		t.Fatalf("good replies: %+v %v / %+v %v", res[0], errs[0], res[3], errs[3])
	}
	if !errors.As(errs[1], &stale) || stale.Kind != statestore.StaleSuperseded {
		t.Fatalf("superseded reply: %v", errs[1])
	}
	if !errors.As(errs[2], &stale) || stale.Kind != statestore.StaleUnknownStep {
		t.Fatalf("unknown reply: %v", errs[2])
	}
	var callUS int64
	var gotStarted time.Time
	if err := b.pool.QueryRow(ctx, `SELECT agent_call_us, agent_started_at FROM steps WHERE order_id = $1`, claimed[0].OrderID).Scan(&callUS, &gotStarted); err != nil ||
		callUS != 1500 || !gotStarted.Equal(started) {
		t.Fatalf("agent timings stored: %d %v (%v)", callUS, gotStarted, err)
	}

	// Result is not JSON: the batch's transaction fails; each reply is
	// then applied alone.
	broken := reply(claimed[1])
	broken.Result = []byte(`{`)
	res, errs = b.store.ApplyReplies(ctx, []statestore.Reply{broken, reply(claimed[3])})
	if errs[0] == nil || errors.Is(errs[0], statestore.ErrStale) {
		t.Fatalf("broken reply: %v, want a database error", errs[0])
	}
	if errs[1] != nil || res[1].OrderStatus != statestore.OrderCompleted {
		t.Fatalf("the good reply beside a broken one: %+v %v", res[1], errs[1])
	}
	var state string
	if err := b.pool.QueryRow(ctx, `SELECT process_state FROM steps WHERE order_id = $1`, claimed[1].OrderID).Scan(&state); err != nil || state != statestore.StepProcessing {
		t.Fatalf("the broken reply's step is %s (%v), want processing", state, err)
	}
}

// TestInsertOrdersBatch: orders written in one statement each get their
// own outcome: inserted with every row InsertOrder writes, a repeat within
// the batch or of an earlier order a duplicate, another payload a
// conflict; an order the database refuses sends the batch through one by
// one, so the others are still written.
func TestInsertOrdersBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	earlier := order(1, time.Minute, 3)
	insert(t, b, earlier)
	a := order(3, time.Minute, 3)
	a.ReplyTo = "shop.status"
	bo := order(2, time.Minute, 3)
	bo.Priority = 5
	conflict := earlier
	conflict.PayloadHash = make([]byte, 32)
	empty := order(1, time.Minute, 3)
	empty.Steps = nil
	outcomes, errs := b.store.InsertOrders(ctx, []statestore.NewOrder{a, a, earlier, conflict, bo, empty})
	want := []statestore.InsertOutcome{statestore.Inserted, statestore.Duplicate, statestore.Duplicate, 0, statestore.Inserted, 0}
	for i := range want {
		if outcomes[i] != want[i] {
			t.Errorf("order %d: %v (%v), want %v", i, outcomes[i], errs[i], want[i])
		}
	}
	if !errors.Is(errs[3], statestore.ErrConflict) || errs[5] == nil {
		t.Fatalf("conflict: %v; no steps: %v", errs[3], errs[5])
	}
	for _, o := range []statestore.NewOrder{a, bo} {
		d, err := b.store.GetOrder(ctx, o.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		if d.Order.Status != statestore.OrderReceived || d.Order.ReplyTo != o.ReplyTo || len(d.Steps) != len(o.Steps) || len(d.History) != 2 {
			t.Fatalf("order %s: %+v, %d steps, %d history entries", o.OrderID, d.Order, len(d.Steps), len(d.History))
		}
		for i, st := range d.Steps {
			wantState := statestore.StepWaiting
			if i == 0 {
				wantState = statestore.StepPending
			}
			if st.ProcessState != wantState || st.IdempotencyKey != statestore.IdempotencyKey(o.OrderID, i+1, st.Name) {
				t.Fatalf("order %s step %d: %+v", o.OrderID, i+1, st)
			}
		}
		if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND coalesce(reply_to, '') = $2`, o.OrderID, o.ReplyTo); n != 1 {
			t.Fatalf("order %s: %d received events", o.OrderID, n)
		}
	}
	if n := count(t, b, `SELECT count(*) FROM orders`); n != 3 {
		t.Fatalf("%d orders, want 3", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND priority = 5`, bo.OrderID); n != 2 {
		t.Fatalf("%d steps carry their order's priority, want 2", n)
	}

	bad := order(2, time.Minute, 3)
	bad.Steps[1].MaxFailures = 0 // violates a CHECK
	good := order(1, time.Minute, 3)
	outcomes, errs = b.store.InsertOrders(ctx, []statestore.NewOrder{bad, good})
	if !errors.Is(errs[0], statestore.ErrInvalidData) || errs[1] != nil || outcomes[1] != statestore.Inserted {
		t.Fatalf("a refused order beside a good one: %v / %v %v", errs[0], outcomes[1], errs[1])
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE order_id = $1`, bad.OrderID); n != 0 {
		t.Fatalf("the refused order was written")
	}
}

// TestClaimKinds: one claim takes up to each kind's room and nothing of a
// kind without room.
func TestClaimKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for _, kind := range []string{"inventory", "payment", "shipping"} {
		for range 5 {
			o := order(1, time.Hour, 3)
			o.Steps[0].Agent = kind
			insert(t, b, o)
		}
	}
	got, err := b.store.ClaimKinds(ctx, "s", map[string]int{"inventory": 2, "payment": 10, "shipping": 0})
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]int{}
	for _, c := range got {
		byKind[c.Agent]++
		if c.Attempt != 1 || c.IdempotencyKey == "" || c.Budget <= 0 {
			t.Fatalf("claimed %+v", c)
		}
	}
	if byKind["inventory"] != 2 || byKind["payment"] != 5 || byKind["shipping"] != 0 {
		t.Fatalf("claimed by kind %v, want 2 inventory, 5 payment, no shipping", byKind)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE to_state = 'processing' AND step = 1`); n != 7 {
		t.Fatalf("%d claims in the history, want 7", n)
	}
	if _, err := b.store.ClaimKinds(ctx, "s", map[string]int{"payment": 0}); err == nil {
		t.Fatal("a claim with no room anywhere was accepted")
	}
}

// The history and the steps have no foreign key to orders (migrations
// 0009 and 0010, a cost on every row); what the keys did is done
// otherwise: deleting (or truncating) orders deletes their steps and
// history, and order_transition refuses an unknown order.
func TestHistoryGoesWithItsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	gone, kept := order(3, time.Minute, 3), order(2, time.Minute, 3)
	insert(t, b, gone)
	insert(t, b, kept)
	if _, err := b.store.ClaimPending(ctx, "test", 10, ""); err != nil {
		t.Fatal(err)
	}
	keptHistory := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1`, kept.OrderID)
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1`, gone.OrderID); n == 0 || keptHistory == 0 {
		t.Fatalf("history before the delete: %d and %d rows", n, keptHistory)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM orders WHERE order_id = $1`, gone.OrderID); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1`, gone.OrderID); n != 0 {
		t.Fatalf("%d history rows left of a deleted order", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1`, gone.OrderID); n != 0 {
		t.Fatalf("%d step rows left of a deleted order", n)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1`, kept.OrderID); n != keptHistory {
		t.Fatalf("the other order's history has %d rows, had %d", n, keptHistory)
	}
	_, err := b.pool.Exec(ctx, `SELECT order_transition($1, 'failed', NULL, 'test', 'no such order')`, messages.NewID())
	if err == nil {
		t.Fatal("order_transition accepted an order that does not exist")
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id NOT IN (SELECT order_id FROM orders)`); n != 0 {
		t.Fatalf("%d history rows without an order", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id NOT IN (SELECT order_id FROM orders)`); n != 0 {
		t.Fatalf("%d step rows without an order", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1`, kept.OrderID); n != len(kept.Steps) {
		t.Fatalf("the other order has %d step rows, want %d", n, len(kept.Steps))
	}
	if _, err := b.pool.Exec(ctx, `TRUNCATE orders`); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM transitions)`); n != 0 {
		t.Fatalf("%d step and history rows left after TRUNCATE orders", n)
	}
}

// TestHistoryHasOneIndex: every history row goes into one index only
// (migration 0011), the primary key (order_id, id), and an order's history
// is still read through it, in order, without a sort.
func TestHistoryHasOneIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		insert(t, b, order(3, time.Minute, 3))
	}
	if n := count(t, b, `SELECT count(*) FROM pg_index WHERE indrelid = 'transitions'::regclass`); n != 1 {
		t.Fatalf("the history has %d indexes, want 1", n)
	}
	var def string
	if err := b.pool.QueryRow(ctxFor(t), `SELECT pg_get_indexdef(indexrelid) FROM pg_index
		WHERE indrelid = 'transitions'::regclass AND indisprimary`).Scan(&def); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(def, "(order_id, id)") {
		t.Fatalf("the history's primary key is %q, want it on (order_id, id)", def)
	}
	text := indexPlan(t, b, `SELECT id FROM transitions WHERE order_id = $1 ORDER BY id`, messages.NewID())
	if !strings.Contains(text, "transitions_pkey") || strings.Contains(text, "Sort") {
		t.Fatalf("an order's history is not read in order through the primary key:\n%s", text)
	}
}

// TestOutboxHasOneIndex: an outbox message goes into one index (migration
// 0019), its primary key on id, through which the relay reads messages in
// order and deletes what it published.
func TestOutboxHasOneIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 3 {
		insert(t, b, order(1, time.Minute, 3))
	}
	ctx := ctxFor(t)
	rows, err := b.pool.Query(ctx, `SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'outbox'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(defs) != 1 || !strings.Contains(defs[0], "outbox_pkey ON") || !strings.HasSuffix(defs[0], "(id)") {
		t.Fatalf("the outbox's indexes: %q, want only the primary key on id", defs)
	}
	text := indexPlan(t, b, `SELECT id FROM outbox ORDER BY id LIMIT 10`)
	if !strings.Contains(text, "outbox_pkey") || strings.Contains(text, "Sort") {
		t.Fatalf("the relay's read does not take messages in order through the primary key:\n%s", text)
	}
	text = indexPlan(t, b, `DELETE FROM outbox WHERE id = ANY($1)`, []int64{1, 2})
	if !strings.Contains(text, "outbox_pkey") {
		t.Fatalf("the relay's delete does not find its messages through the primary key:\n%s", text)
	}
}

// TestBatchedStatementsKeepGenericPlans: the batched reply and the relay's
// delete run on their generic plans from the first execution, whatever
// the batch's size; PostgreSQL would otherwise plan them for their
// arguments at least five times, and then again whenever a batch's custom
// plan looked cheaper. One connection, so its prepared statements can be
// read back.
func TestBatchedStatementsKeepGenericPlans(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	pool, err := statestore.Open(statestore.Options{URL: b.url, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := statestore.New(pool)
	const rounds = 8
	for round := range rounds {
		var batch []statestore.NewOrder
		for range 1 + round%4 {
			batch = append(batch, order(1, time.Minute, 3))
		}
		if _, errs := store.InsertOrders(ctx, batch); errs[0] != nil {
			t.Fatal(errs[0])
		}
		steps, err := store.ClaimKinds(ctx, "s", map[string]int{"agent": 10})
		if err != nil || len(steps) != len(batch) {
			t.Fatalf("claim: %d steps of %d, %v", len(steps), len(batch), err)
		}
		var replies []statestore.Reply
		for _, st := range steps {
			replies = append(replies, statestore.Reply{OrderID: st.OrderID, Step: st.Step, Attempt: st.Attempt, OK: true, Result: []byte(`{}`), Actor: "s"})
		}
		_, errs := store.ApplyReplies(ctx, replies)
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if _, err := store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
			return len(msgs), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []struct{ name, text string }{
		{"the batched reply", "unnest($1::uuid[], $2::int[], $3::int[], $4::jsonb[]"},
		{"the relay's delete", "DELETE FROM outbox WHERE id = ANY($1)"},
	} {
		var generic, custom int64
		err := pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE strpos(statement, $1) > 0`, st.text).
			Scan(&generic, &custom)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if custom != 0 || generic != rounds {
			t.Errorf("%s ran on %d custom and %d generic plans; want none custom, %d generic", st.name, custom, generic, rounds)
		}
	}
}

// TestRelayDeletesPublishedEvents: the relay deletes the status events the
// broker confirmed (migration 0014) and marks operator alerts published,
// keeping them; what publish did not get through stays for the next round.
func TestRelayDeletesPublishedEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	bad := order(1, 10*time.Millisecond, 1)
	insert(t, b, bad)
	if got, err := b.store.ClaimPending(ctx, "s", 1, ""); err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	waitExpired(t, b)
	if swept, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "sup", Limit: 10}); err != nil || len(swept) != 1 {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	good := order(1, time.Minute, 1)
	insert(t, b, good)

	var handed []statestore.OutboxMessage
	n, err := b.store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
		handed = msgs
		return len(msgs) - 1, nil // the last one (good's event) not confirmed
	})
	if err != nil || n != len(handed)-1 {
		t.Fatalf("relay: %d of %d, %v", n, len(handed), err)
	}
	alerts := 0
	for _, m := range handed {
		if m.Type == statestore.OutboxOperatorAlert {
			alerts++
		}
	}
	if alerts != 1 || len(handed) < 3 || handed[len(handed)-1].OrderID != good.OrderID {
		t.Fatalf("the relay was handed %+v, want bad's events and alert, then good's event", handed)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'status_event'`, bad.OrderID); n != 0 {
		t.Fatalf("%d published status events left in the outbox, want none", n)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1`, bad.OrderID); n != 0 {
		t.Fatalf("%d published messages left in the outbox, want none", n)
	}
	if n := count(t, b, `SELECT count(*) FROM alerts WHERE order_id = $1 AND acked_at IS NULL`, bad.OrderID); n != 1 {
		t.Fatalf("%d open alerts kept, want 1", n)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1`, good.OrderID); n != 1 {
		t.Fatalf("the unconfirmed event: %d unpublished rows, want 1", n)
	}
	if backlog, err := b.store.OutboxBacklog(ctx); err != nil || backlog != 1 {
		t.Fatalf("backlog %d, %v; want 1", backlog, err)
	}
	if n, err := b.store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) { return len(msgs), nil }); err != nil || n != 1 {
		t.Fatalf("second relay: %d, %v; want the one left", n, err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d outbox rows after relaying everything, want none", n)
	}
}

// roundTrips counts a pool's round trips to the database: each query
// outside a batch is one, each batch (a pipeline) one.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestRelayRoundIsTwoRoundTrips: a relay round takes, publishes and
// deletes in two round trips (at low load each order's events take a
// round of their own); a round that finds nothing, or another relay at
// work, ends its transaction and leaves the outbox as it was; and what
// publish did not get through stays for the next round.
func TestRelayRoundIsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	trips := &roundTrips{}
	store, app := storeNamed(t, b, "relay-test-", trips)
	all := func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) { return len(msgs), nil }
	round := func(publish func(context.Context, []statestore.OutboxMessage) (int, error)) (n int, rt int64, err error) {
		t.Helper()
		before := trips.n.Load()
		n, err = store.RelayOutbox(ctx, 100, publish)
		return n, trips.n.Load() - before, err
	}
	// The first rounds prepare their statements; count once they are cached.
	if _, _, err := round(all); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		insert(t, b, order(1, time.Minute, 1))
		if n, _, err := round(func(context.Context, []statestore.OutboxMessage) (int, error) { return 0, errors.New("broker gone") }); err == nil || n != 0 {
			t.Fatalf("a round whose publish failed: %d, %v; want 0 and the error", n, err)
		}
		if n, _, err := round(all); err != nil || n != 1 {
			t.Fatalf("warm-up round: %d, %v", n, err)
		}
	}

	insert(t, b, order(1, time.Minute, 1))
	insert(t, b, order(1, time.Minute, 1))
	if n, rt, err := round(all); err != nil || n != 2 || rt != 2 {
		t.Fatalf("a round of 2 events: relayed %d in %d round trips, %v; want 2 in 2", n, rt, err)
	}
	if n, rt, err := round(all); err != nil || n != 0 || rt != 2 {
		t.Fatalf("a round of nothing: relayed %d in %d round trips, %v; want 0 in 2", n, rt, err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d outbox rows left, want none", n)
	}

	// Half published: the rest stays, and the connection goes back to the
	// pool outside any transaction.
	insert(t, b, order(1, time.Minute, 1))
	insert(t, b, order(1, time.Minute, 1))
	if n, _, err := round(func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
		return 1, errors.New("confirm lost")
	}); err == nil || n != 1 {
		t.Fatalf("a round half published: %d, %v; want 1 and the error", n, err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows left, want the one not published", n)
	}

	// While one relay publishes, another finds the outbox busy and takes
	// nothing.
	holding, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := store.RelayOutbox(ctx, 100, func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
			close(holding)
			<-release
			return len(msgs), nil
		})
		first <- err
	}()
	<-holding
	if n, err := b.store.RelayOutbox(ctx, 100, func(context.Context, []statestore.OutboxMessage) (int, error) {
		t.Error("a second relay was handed messages while the first held the outbox")
		return 0, nil
	}); !errors.Is(err, statestore.ErrRelayBusy) || n != 0 {
		t.Fatalf("second relay: %d, %v; want ErrRelayBusy", n, err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d outbox rows left, want none", n)
	}
	var idle int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
		AND state LIKE 'idle in transaction%'`, app).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != 0 {
		t.Fatalf("%d connections left idle in a transaction", idle)
	}
}

// TestRelaysNeverHandOutAMessageTwice: relays that run at once, as every
// scheduler's does, hand each message to publish once. A relay reads the
// outbox only after it holds the lock, so it sees what the relay before it
// deleted: a read whose snapshot was taken before that relay committed
// would take its messages again.
func TestRelaysNeverHandOutAMessageTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const orders = 400
	for range orders {
		insert(t, b, order(1, time.Minute, 1))
	}
	var mu sync.Mutex
	handed := map[string]int{}
	publish := func(_ context.Context, msgs []statestore.OutboxMessage) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			handed[m.MessageID]++
		}
		return len(msgs), nil
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := b.store.RelayOutbox(ctx, 3, publish)
				if err != nil && !errors.Is(err, statestore.ErrRelayBusy) {
					t.Error(err)
					return
				}
				if count(t, b, `SELECT count(*) FROM outbox`) == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(handed) != orders {
		t.Fatalf("%d messages handed out, want %d", len(handed), orders)
	}
	for id, n := range handed {
		if n != 1 {
			t.Fatalf("message %s handed out %d times", id, n)
		}
	}
}

// TestStepKeysNeedNoIndex: the steps' idempotency keys have no unique
// index of their own (migration 0013); each is made of its step's primary
// key and name, so the primary key keeps them unique.
func TestStepKeysNeedNoIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orders := []statestore.NewOrder{order(3, time.Minute, 3), order(2, time.Minute, 3)}
	if _, errs := b.store.InsertOrders(ctxFor(t), orders); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	insert(t, b, order(1, time.Minute, 3))
	if n := count(t, b, `SELECT count(*) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = 'steps'::regclass AND a.attname = 'idempotency_key'`); n != 0 {
		t.Fatalf("%d indexes on steps.idempotency_key, want none", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE idempotency_key <> order_id::text || '/' || step || '/' || name`); n != 0 {
		t.Fatalf("%d steps with a key not made of their order, number and name", n)
	}
	if n := count(t, b, `SELECT count(*) FROM steps`); n < 6 {
		t.Fatalf("%d steps written", n)
	}
}

// indexPlan is the plan PostgreSQL makes for sql when it may neither scan
// a table whole nor build a bitmap (with tables this small it would
// rather): the plan it would make on a large table.
func indexPlan(t *testing.T, b bundle, sql string, args ...any) string {
	t.Helper()
	ctx := ctxFor(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}
