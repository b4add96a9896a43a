package statestore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

const delayed = `
workflows:
  - name: later
    steps:
      - {action: a, agent: x, delay: 1500ms, compensation: {action: undo_a}}
      - {action: b, agent: x, delay: 1500ms}
`

// fireAll fires the due timers as the lease holder would.
func fireAll(t *testing.T, b bundle, holder string) []statestore.FiredTimer {
	t.Helper()
	fired, err := b.store.FireTimers(ctxFor(t), holder, statestore.SupervisorLease, 100)
	if err != nil {
		t.Fatal(err)
	}
	return fired
}

// waitDue waits, on the database clock, until the earliest timer (of
// any order, a held one's too) is due.
func waitDue(t *testing.T, b bundle) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the earliest timer to fall due", func() bool {
		return count(t, b, `SELECT count(*) FROM steps WHERE process_state IN ('delayed', 'awaiting')
			AND due_at = (SELECT min(due_at) FROM steps WHERE process_state IN ('delayed', 'awaiting')) AND due_at <= clock_timestamp()`) > 0
	})
}

// TestTimersFireOnTheDatabaseClock: a step with a delay waits delayed
// after its needs ended (the first step from the order's start); the
// lease holder fires it once its due time has passed on the database
// clock, never before, and only once; without the lease nothing fires.
func TestTimersFireOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	if _, st := stepStates(t, b, o.OrderID); st["a"] != statestore.StepDelayed {
		t.Fatalf("the first step is %s, want delayed from the order's start", st["a"])
	}
	if d, ok, err := b.store.NextTimer(ctx); err != nil || !ok || d <= 0 || d > 1500*time.Millisecond {
		t.Fatalf("next timer in %v (%v, %v), want within 1.5s", d, ok, err)
	}
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if fired := fireAll(t, b, "sup-1"); len(fired) != 0 {
		t.Fatalf("fired %v before its due time", fired)
	}
	if len(claimAll(t, b, o.OrderID)) != 0 {
		t.Fatal("a delayed step was claimed")
	}
	waitDue(t, b)
	if fired := fireAll(t, b, "sup-2"); len(fired) != 0 {
		t.Fatalf("a supervisor without the lease fired %v", fired)
	}
	fired := fireAll(t, b, "sup-1")
	if len(fired) != 1 || fired[0].Step != 1 || fired[0].Late < 0 {
		t.Fatalf("fired %v, want step 1, not early", fired)
	}
	if again := fireAll(t, b, "sup-1"); len(again) != 0 {
		t.Fatalf("fired %v twice", again)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
	if _, st := stepStates(t, b, o.OrderID); st["b"] != statestore.StepDelayed {
		t.Fatalf("b is %s once a ended, want delayed", st["b"])
	}
	waitDue(t, b)
	fireAll(t, b, "sup-1")
	if res := reply(t, b, claimAll(t, b, o.OrderID)["b"], true, ""); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("order %q", res.OrderStatus)
	}
}

// TestTimersOfOrdersThatStopped: a held order's timer waits for the
// resubmit; a cancelled order's is cancelled with it and never fires.
func TestTimersOfOrdersThatStopped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	const file = `
workflows:
  - name: w
    steps:
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - {action: c, agent: x, needs: [b], delay: 200ms}
`
	held := graphOrder(t, file, "w", `{}`, statestore.PolicyHold)
	cancelled := graphOrder(t, file, "w", `{}`, statestore.PolicyCompensate)
	for _, o := range []statestore.NewOrder{held, cancelled} {
		insert(t, b, o)
		first := claimAll(t, b, o.OrderID)
		reply(t, b, first["b"], true, "") // c is delayed
		if o.OrderID == held.OrderID {
			reply(t, b, first["a"], false, "") // held in error
		}
	}
	if _, err := b.store.CancelOrder(ctx, cancelled.OrderID, "operator"); err != nil {
		t.Fatal(err)
	}
	if _, st := stepStates(t, b, cancelled.OrderID); st["c"] != statestore.StepCancelled {
		t.Fatalf("the cancelled order's delayed step is %s", st["c"])
	}
	waitDue(t, b)
	if fired := fireAll(t, b, "sup-1"); len(fired) != 0 {
		t.Fatalf("fired %v: a held order's timer, or a cancelled one's", fired)
	}
	if status, st := stepStates(t, b, held.OrderID); status != statestore.OrderError || st["c"] != statestore.StepDelayed {
		t.Fatalf("held order %s, c %s", status, st["c"])
	}
	if _, err := b.store.Resubmit(ctx, held.OrderID, 0, "operator"); err != nil {
		t.Fatal(err)
	}
	fired := fireAll(t, b, "sup-1")
	if len(fired) != 1 || fired[0].OrderID != held.OrderID {
		t.Fatalf("after the resubmit fired %v, want the held order's c", fired)
	}
	if _, err := b.store.Resubmit(ctx, held.OrderID, 0, "operator"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("a second resubmit: %v", err)
	}
}

// TestOrdersThatStartLater: an order with start_at ahead of the database
// clock waits delayed (its order received) until then; one with start_at
// past starts at once.
func TestOrdersThatStartLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	var dbNow time.Time
	if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	later, past := sagaOrder(statestore.PolicyCompensate), sagaOrder(statestore.PolicyCompensate)
	startAt, before := dbNow.Add(3*time.Second), dbNow.Add(-time.Hour) // room for a loaded machine's inserts
	later.StartAt, past.StartAt = &startAt, &before
	insert(t, b, later)
	insert(t, b, past)
	if _, steps := states(t, b, past.OrderID); steps[:5] != "pend " {
		t.Fatalf("an order whose start_at passed: %q, want its first step pending", steps)
	}
	if status, steps := states(t, b, later.OrderID); status != statestore.OrderReceived || steps[:5] != "dela " {
		t.Fatalf("an order that starts later: %s %q, want received with its first step delayed", status, steps)
	}
	var due time.Time
	if err := b.pool.QueryRow(ctx, `SELECT due_at FROM steps WHERE order_id = $1 AND step = 1`, later.OrderID).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if !due.Equal(startAt) {
		t.Fatalf("due at %v, want start_at %v", due, startAt)
	}
	if fired := fireAll(t, b, "sup-1"); len(fired) != 0 {
		t.Fatalf("fired %v before start_at", fired)
	}
	waitDue(t, b)
	if fired := fireAll(t, b, "sup-1"); len(fired) != 1 || fired[0].OrderID != later.OrderID {
		t.Fatalf("fired %v at start_at", fired)
	}
	run(t, b, later.OrderID, true)
}

// TestWaitingTimersAreReadFromTheirIndex: with 20,000 timers waiting, the
// earliest is read from the due-time index (one entry, not a scan), and a
// firing with none due reads no timer row.
func TestWaitingTimersAreReadFromTheirIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const file = `
workflows:
  - name: w
    steps:
      - {action: a, agent: x, delay: 1h}
`
	for range 20 {
		batch := graphOrders(t, file, "w", `{}`, statestore.PolicyCompensate, 1000)
		if _, errs := b.store.InsertOrders(ctx, batch); errors.Join(errs...) != nil {
			t.Fatal(errors.Join(errs...))
		}
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE steps`); err != nil {
		t.Fatal(err)
	}
	plan := func(query string) string {
		var out string
		rows, err := b.pool.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) `+query)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			out += line + "\n"
		}
		return out
	}
	next := plan(`SELECT min(due_at) FROM steps WHERE process_state = 'delayed'`)
	if !strings.Contains(next, "steps_due_idx") || !strings.Contains(next, "rows=1 loops=1") || strings.Contains(next, "Seq Scan") {
		t.Fatalf("the earliest timer is not one index entry:\n%s", next)
	}
	due := plan(`SELECT s.order_id FROM steps s WHERE s.process_state = 'delayed' AND s.due_at <= clock_timestamp() ORDER BY s.due_at LIMIT 500`)
	if !strings.Contains(due, "steps_due_idx") || !strings.Contains(due, "rows=0 loops=1") || strings.Contains(due, "Seq Scan") {
		t.Fatalf("looking for due timers reads waiting ones:\n%s", due)
	}
}

// TestNextTimerIsOneThatWouldFire: the next timer is the earliest one
// FireTimers would fire: a held order's overdue timer (which waits for a
// resubmit) is not it, so that a timer due now can be told from it and
// fired at once.
func TestNextTimerIsOneThatWouldFire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	held := graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate)
	insert(t, b, held)
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'error' WHERE order_id = $1`, held.OrderID)
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET due_at = now() - interval '1 hour' WHERE order_id = $1`, held.OrderID); err != nil {
		t.Fatal(err)
	}
	if d, ok, err := b.store.NextTimer(ctx); err != nil || ok {
		t.Fatalf("next timer %v %v (%v): a held order's timer counted", d, ok, err)
	}
	running := graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate)
	insert(t, b, running)
	if d, ok, err := b.store.NextTimer(ctx); err != nil || !ok || d <= 0 || d > 1500*time.Millisecond {
		t.Fatalf("next timer in %v (%v, %v), want the running order's, within 1.5s", d, ok, err)
	}
}

// TestOrderWhoseFirstStepWaitsWakesTheRelay: nobody claims such an order
// now, and a claim is what nudges a relay to publish an order's received
// event: writing one notifies ChannelOutbox instead.
func TestOrderWhoseFirstStepWaitsWakesTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	told := listenTo(t, b, statestore.ChannelOutbox)
	insert(t, b, graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate))
	told("an order whose first step waits")
}

// listenTo listens on channel for the rest of the test and returns a
// check that fails the test unless a notification comes there within 5 s
// (what names what should have sent it).
func listenTo(t *testing.T, b bundle, channel string) (told func(what string)) {
	t.Helper()
	ctx := ctxFor(t)
	l, err := b.store.Listen(ctx, channel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	schema, err := l.Schema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return func(what string) {
		t.Helper()
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if ch, err := l.Wait(wait, schema); err != nil || ch != channel {
			t.Fatalf("%s: no notification on %s (%q, %v)", what, channel, ch, err)
		}
	}
}

// TestTimersAreToldWhenDueBeforeTheNextLook: the leading supervisor's
// timer loop records when it looks next (WatchTimers: the earliest timer,
// at most its longest sleep); a timer set for sooner, by an insert or by
// an update, is told on ChannelTimers, and one set for later is not. A
// writer of a timer that has not committed keeps the loop from promising
// anything (not watched), so that its timer cannot go untold.
func TestTimersAreToldWhenDueBeforeTheNextLook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	const mark = "sas_test_mark"
	l, err := b.store.Listen(ctx, statestore.ChannelTimers, mark)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	schema, err := l.Schema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// next is the channel of the next notification; notifications come
	// in commit order, so a mark sent after a write comes first only if
	// the write told nothing.
	next := func() string {
		t.Helper()
		wait, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ch, err := l.Wait(wait, schema)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return ch
	}
	sendMark := func() {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `SELECT pg_notify($1, current_schema())`, mark); err != nil {
			t.Fatal(err)
		}
	}
	watch := func(want time.Duration) {
		t.Helper()
		d, ok, watched, err := b.store.WatchTimers(ctx, time.Hour)
		if err != nil || !watched || want > 0 && (!ok || d > want+time.Minute || d < want-time.Minute) || want == 0 && ok {
			t.Fatalf("watch: next in %v (%v), watched %v, %v; want %v", d, ok, watched, err, want)
		}
	}
	startingAt := func(after time.Duration) statestore.NewOrder {
		now, err := b.store.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		o := graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate)
		at := now.Add(after)
		o.StartAt = &at
		return o
	}

	watch(0) // nothing waits: the loop looks next in an hour
	insert(t, b, startingAt(30*time.Minute))
	if ch := next(); ch != statestore.ChannelTimers {
		t.Fatalf("a timer due before the next look told %q", ch)
	}
	watch(30 * time.Minute) // the loop looks next at that timer (its first step's delay after it)
	insert(t, b, startingAt(50*time.Minute))
	sendMark()
	if ch := next(); ch != mark {
		t.Fatalf("a timer due after the next look was told (%q)", ch)
	}
	// An update: a step that becomes delayed once its need ended.
	o := graphOrder(t, delayed, "later", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	if ch := next(); ch != statestore.ChannelTimers {
		t.Fatalf("an order's first delay (1.5 s, before the next look) told %q", ch)
	}
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	waitDue(t, b)
	if fired := fireAll(t, b, "sup-1"); len(fired) != 1 {
		t.Fatalf("fired %+v", fired)
	}
	watch(30 * time.Minute)
	reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
	if ch := next(); ch != statestore.ChannelTimers {
		t.Fatalf("a step that became delayed for 1.5 s told %q", ch)
	}

	// A writer between its read of the promise and its commit: the loop
	// promises nothing until it has committed.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT timer_set(clock_timestamp() + interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	if _, _, watched, err := b.store.WatchTimers(ctx, time.Hour); err != nil || watched {
		t.Fatalf("watched %v (%v) beside a writer that has not committed", watched, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, watched, err := b.store.WatchTimers(ctx, time.Hour); err != nil || !watched {
		t.Fatalf("watched %v (%v) once the writer committed", watched, err)
	}
}

// TestNextPendingIsTheEarliestAvailability: a claimer at rest waits no
// longer than the earliest pending step's availability: none pending,
// one available now, one held back by a reset's backoff.
func TestNextPendingIsTheEarliestAvailability(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if d, ok, err := b.store.NextPending(ctx); err != nil || ok {
		t.Fatalf("with nothing pending: %v %v %v", d, ok, err)
	}
	o := order(1, time.Minute, 3)
	insert(t, b, o)
	if d, ok, err := b.store.NextPending(ctx); err != nil || !ok || d > 0 {
		t.Fatalf("with a step available now: %v %v %v", d, ok, err)
	}
	testenv.Forge(t, b.pool, `UPDATE steps SET available_at = now() + interval '10 seconds' WHERE order_id = $1`, o.OrderID)
	if d, ok, err := b.store.NextPending(ctx); err != nil || !ok || d < 9*time.Second || d > 10*time.Second {
		t.Fatalf("with a step available in 10 s: %v %v %v", d, ok, err)
	}
	// A step of a fair key is read from its own index.
	testenv.Forge(t, b.pool, `UPDATE steps SET fair_key = 'k', available_at = now() + interval '3 seconds' WHERE order_id = $1`, o.OrderID)
	if d, ok, err := b.store.NextPending(ctx); err != nil || !ok || d < 2*time.Second || d > 3*time.Second {
		t.Fatalf("with a fair key's step available in 3 s: %v %v %v", d, ok, err)
	}
}
