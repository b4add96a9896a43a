package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/workflow"
)

// held is an order's rows held by another connection.
type held struct {
	// release releases them and returns the database clock just before.
	release func() time.Time
	pid     uint32 // the holding connection's backend
}

// holdOrder locks an order's row and all its step rows from another
// connection, as a stuck transaction would, until released.
func holdOrder(t *testing.T, b bundle, orderID string) held {
	t.Helper()
	return holdRows(t, b, orderID, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`,
		`SELECT 1 FROM steps WHERE order_id = $1 FOR UPDATE`)
}

// holdRows locks the rows each of locks (a statement of one argument,
// arg) locks, from another connection, until released.
func holdRows(t *testing.T, b bundle, arg any, locks ...string) held {
	t.Helper()
	ctx := ctxFor(t)
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, lock := range locks {
		if _, err := tx.Exec(ctx, lock, arg); err != nil {
			t.Fatal(err)
		}
	}
	var pid uint32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() time.Time {
		var at time.Time
		if !released {
			released = true
			_ = tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
			_ = tx.Rollback(ctx)
			conn.Close(ctx)
		}
		return at
	}
	t.Cleanup(func() { release() })
	return held{release: release, pid: pid}
}

// storeWith opens a store on the test's schema whose statements wait at
// most lockTimeout for a row lock (0: no limit).
func storeWith(t *testing.T, b bundle, lockTimeout time.Duration) *statestore.Store {
	t.Helper()
	pool, err := statestore.Open(statestore.Options{URL: b.url, MaxConns: 10, LockTimeout: lockTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return statestore.New(pool)
}

func okReply(c statestore.ClaimedStep) statestore.Reply {
	return statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Result: []byte(`{}`), Actor: "s"}
}

// TestStuckRowDoesNotStallABatch: one order's rows held by another
// transaction cost the batch its reply, not the batch: the others are
// applied after the lock timeout, the held one is given back as a lock
// timeout to be tried again, and alone it gives up as quickly.
func TestStuckRowDoesNotStallABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	store := storeWith(t, b, 300*time.Millisecond)
	for range 8 {
		insert(t, b, order(2, time.Hour, 3))
	}
	claimed, err := store.ClaimPending(ctx, "s", 10, "agent")
	if err != nil || len(claimed) != 8 {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	h := holdOrder(t, b, claimed[3].OrderID)
	var replies []statestore.Reply
	for _, c := range claimed {
		replies = append(replies, okReply(c))
	}
	began := time.Now()
	res, errs := store.ApplyRepliesClaiming(ctx, replies, []string{"agent"})
	took := time.Since(began)
	if took > 3*time.Second {
		t.Errorf("the batch took %v with one order held", took)
	}
	for i := range replies {
		if i == 3 {
			if !statestore.IsLockTimeout(errs[i]) {
				t.Errorf("the held order's reply: %v, want a lock timeout", errs[i])
			}
			continue
		}
		if errs[i] != nil || res[i].StepState != statestore.StepProcessed || res[i].NextStep != 2 {
			t.Errorf("reply %d beside the held order: %+v %v", i, res[i], errs[i])
		}
	}
	began = time.Now()
	if _, err := store.ApplyReply(ctx, replies[3]); !statestore.IsLockTimeout(err) || time.Since(began) > 2*time.Second {
		t.Errorf("alone, the held reply: %v after %v", err, time.Since(began))
	}
	// The claim and the sweep pass a held order by too.
	insert(t, b, order(1, time.Hour, 3))
	heldOrder := order(1, time.Hour, 3)
	insert(t, b, heldOrder)
	hNew := holdOrder(t, b, heldOrder.OrderID)
	began = time.Now()
	got, err := store.ClaimPending(ctx, "s", 10, "agent")
	if err != nil || time.Since(began) > 2*time.Second {
		t.Fatalf("claim beside a held new order: %v after %v", err, time.Since(began))
	}
	for _, c := range got {
		if c.OrderID == heldOrder.OrderID {
			t.Errorf("the held order's first step was claimed")
		}
	}
	hNew.release()
	h.release()
	if _, err := store.ApplyReply(ctx, replies[3]); err != nil {
		t.Errorf("the reply once the rows are free: %v", err)
	}
}

// TestHistoryAndFenceReadTheClockWhenTheyWrite: a reply that waited for a
// held row is judged and recorded at the time it is written: in time, its
// history entry comes after the release and the next step claimed with it
// gets its whole budget from then; late by then, it changes nothing.
func TestHistoryAndFenceReadTheClockWhenTheyWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	store := storeWith(t, b, 0) // waits as long as the row is held
	inTime := order(2, 30*time.Second, 3)
	// Each late one is still in time when its reply starts to wait.
	lateAlone, lateBatched := order(2, 2*time.Second, 3), order(2, 5*time.Second, 3)
	for _, o := range []statestore.NewOrder{inTime, lateAlone, lateBatched} {
		insert(t, b, o)
	}
	claimed, err := store.ClaimPending(ctx, "s", 10, "agent")
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	byOrder := map[string]statestore.ClaimedStep{}
	for _, c := range claimed {
		byOrder[c.OrderID] = c
	}

	h := holdOrder(t, b, inTime.OrderID)
	type outcome struct {
		res statestore.ApplyResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, errs := store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(byOrder[inTime.OrderID])}, []string{"agent"})
		done <- outcome{res[0], errs[0]}
	}()
	// The rows stay held for a while after the reply began to wait.
	waitBlocked(t, b, h, 1500*time.Millisecond)
	releasedAt := h.release()
	o := <-done
	if o.err != nil || o.res.Claimed == nil {
		t.Fatalf("the reply after the release: %+v %v", o.res, o.err)
	}
	var appliedAt, claimedAt time.Time
	if err := b.pool.QueryRow(ctx, `SELECT
		(SELECT at FROM transitions WHERE order_id = $1 AND step = 1 AND to_state = 'processed'),
		(SELECT at FROM transitions WHERE order_id = $1 AND step = 2 AND to_state = 'processing')`, inTime.OrderID).Scan(&appliedAt, &claimedAt); err != nil {
		t.Fatal(err)
	}
	if appliedAt.Before(releasedAt) || claimedAt.Before(releasedAt) {
		t.Errorf("history says the reply was applied at %v and the next step claimed at %v, before the rows were released at %v",
			appliedAt, claimedAt, releasedAt)
	}
	if budget := o.res.Claimed.CompleteBy.Sub(releasedAt); budget < 30*time.Second-200*time.Millisecond {
		t.Errorf("the next step was claimed with %v of its 30 s budget left after the release", budget)
	}

	// Late by the time of the write, alone and in a batch: nothing
	// changes.
	for _, late := range []statestore.NewOrder{lateAlone, lateBatched} {
		batched := late.OrderID == lateBatched.OrderID
		h = holdOrder(t, b, late.OrderID)
		go func() {
			if batched {
				res, errs := store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(byOrder[late.OrderID])}, []string{"agent"})
				done <- outcome{res[0], errs[0]}
				return
			}
			res, err := store.ApplyReply(ctx, okReply(byOrder[late.OrderID]))
			done <- outcome{res, err}
		}()
		waitBlocked(t, b, h, 0)
		testenv.Eventually(t, 10*time.Second, "the late order's complete_by to pass", func() bool {
			return count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 1 AND complete_by < clock_timestamp()`, late.OrderID) == 1
		})
		h.release()
		o = <-done
		var stale *statestore.StaleReplyError
		if !errors.As(o.err, &stale) || stale.Kind != statestore.StaleLate {
			t.Fatalf("a reply written after its complete_by (batched %v): %+v %v, want stale (late)", batched, o.res, o.err)
		}
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND to_state = 'processed'`,
		[]string{lateAlone.OrderID, lateBatched.OrderID}); n != 0 {
		t.Fatalf("the late orders have %d steps processed", n)
	}
}

// waitBlocked waits until a statement has waited at least for for the
// rows h holds (on the database clock).
func waitBlocked(t *testing.T, b bundle, h held, waited time.Duration) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "a statement to wait for the held rows", func() bool {
		var n int
		_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE $1::int = ANY(pg_blocking_pids(pid)) AND clock_timestamp() - query_start >= make_interval(secs => $2::float8)`,
			h.pid, waited.Seconds()).Scan(&n)
		return n > 0
	})
}

// lockedAction is an action of TestOperatorActionsWaitOutABriefLock, on
// a store with a short lock timeout.
type lockedAction = func(ctx context.Context, s *statestore.Store) error

// runningOrder is an order of the built-in "order" workflow whose first
// step has ended and whose second is pending.
func runningOrder(t *testing.T, b bundle) string {
	t.Helper()
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	return o.OrderID
}

// orderInError is an order held in error (policy hold) by its second
// step's failure, with an operator alert.
func orderInError(t *testing.T, b bundle) string {
	t.Helper()
	o := sagaOrder(statestore.PolicyHold)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	if _, res := run(t, b, o.OrderID, false); res.OrderStatus != statestore.OrderError {
		t.Fatalf("the order is %s, want error", res.OrderStatus)
	}
	return o.OrderID
}

// limitedKind sets the agent kind "pay"'s rate as an operator.
func limitedKind(t *testing.T, b bundle) {
	t.Helper()
	if _, err := b.store.SetLimits(ctxFor(t), "pay", statestore.LimitChange{Rate: ptr(5.0)}, "ann"); err != nil {
		t.Fatal(err)
	}
}

// limitedInNamespace adds the namespace "team-a" and sets its own rate on
// the kind "pay" as an operator.
func limitedInNamespace(t *testing.T, b bundle) {
	t.Helper()
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetNamespaceLimits(ctx, "team-a", "pay", statestore.LimitChange{Rate: ptr(5.0)}, "ann"); err != nil {
		t.Fatal(err)
	}
}

// TestOperatorActionsWaitOutABriefLock: every action an operator or a
// caller takes through the store on rows the hot path or the supervisor
// locks (on an order: cancel, resubmit, re-run, a move to another
// version, a signal, a callback, an alert's acknowledgement, a bulk job's
// turn at it, its stop; an agent kind's limits set or reset, a namespace's, its
// quotas; a schedule paused or triggered) waits out a lock held longer
// than the store's lock timeout, as a claim or a batch of replies holds
// one for milliseconds, instead of giving up with it; each then did what
// it was asked.
func TestOperatorActionsWaitOutABriefLock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// prepare makes the order (or the alert) the action is for, and
		// returns the action on a store with a short lock timeout and
		// what holds the rows it needs.
		prepare func(t *testing.T, b bundle) (act lockedAction, hold func() held)
	}{
		{"cancel", func(t *testing.T, b bundle) (lockedAction, func() held) {
			id := runningOrder(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
				status, err := s.CancelOrder(ctx, id, "ops")
				if err == nil && status != statestore.OrderCompensating {
					return fmt.Errorf("cancelled into %s, want compensating", status)
				}
				return err
			}, func() held { return holdOrder(t, b, id) }
		}},
		{"resubmit", func(t *testing.T, b bundle) (lockedAction, func() held) {
			id := orderInError(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
				steps, err := s.Resubmit(ctx, id, 0, "ops")
				if err == nil && len(steps) != 1 {
					return fmt.Errorf("reset %v, want the failed step", steps)
				}
				return err
			}, func() held { return holdOrder(t, b, id) }
		}},
		{"rerun", func(t *testing.T, b bundle) (lockedAction, func() held) {
			id := orderInError(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
				steps, err := s.Rerun(ctx, id, 0, []byte(`{"customer":"c","amount":99}`), nil, "ops")
				if err == nil && len(steps) != 1 {
					return fmt.Errorf("reset %v, want the failed step", steps)
				}
				return err
			}, func() held { return holdOrder(t, b, id) }
		}},
		{"migrate", func(t *testing.T, b bundle) (lockedAction, func() held) {
			v1, v2 := lookup(t, versions), lookup(t, fixed)
			o := graphOrder(t, versions, "fixme", `{}`, statestore.PolicyCompensate)
			o.WorkflowVersion = v1.Version()
			if err := b.store.StoreWorkflowVersions(ctxFor(t), []statestore.WorkflowVersion{{Name: "fixme", Version: v1.Version(), Definition: v1.Definition(), CreatedBy: "t"}}); err != nil {
				t.Fatal(err)
			}
			insert(t, b, o)
			reply(t, b, claimAll(t, b, o.OrderID)["reserve"], true, `{}`)
			return func(ctx context.Context, s *statestore.Store) error {
				v, err := s.MigrateOrder(ctx, o.OrderID, v2, true, "ops")
				if err == nil && !v.Moved {
					return fmt.Errorf("not moved: %s", v.Why)
				}
				return err
			}, func() held { return holdOrder(t, b, o.OrderID) }
		}},
		{"signal", func(t *testing.T, b bundle) (lockedAction, func() held) {
			o := graphOrder(t, loan, "loan", `{}`, statestore.PolicyCompensate)
			insert(t, b, o)
			reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value": 550}`)
			return func(ctx context.Context, s *statestore.Store) error {
				out, err := s.ApplySignal(ctx, statestore.Signal{OrderID: o.OrderID, ID: "s1", Name: "approved", Payload: []byte(`{"by": "ann"}`), Actor: "t"})
				if err == nil && out.Outcome != statestore.SignalApplied {
					return fmt.Errorf("the signal: %+v", out)
				}
				return err
			}, func() held { return holdOrder(t, b, o.OrderID) }
		}},
		{"callback", func(t *testing.T, b bundle) (lockedAction, func() held) {
			o := graphOrder(t, accepting, "slow", `{}`, statestore.PolicyCompensate)
			insert(t, b, o)
			c := claimAll(t, b, o.OrderID)["a"]
			tok := tokenKey(t, b).Mint(steptoken.Ref{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt})
			return func(ctx context.Context, s *statestore.Store) error {
				out, err := s.Callback(ctx, statestore.Callback{Token: tok, Name: "complete", SignalID: "cb-1", Result: []byte(`{}`), Actor: "t"})
				if err == nil && out.Outcome != statestore.SignalApplied {
					return fmt.Errorf("the callback: %+v", out)
				}
				return err
			}, func() held { return holdOrder(t, b, o.OrderID) }
		}},
		{"acknowledge", func(t *testing.T, b bundle) (lockedAction, func() held) {
			id := orderInError(t, b)
			alert := int64(count(t, b, `SELECT id FROM alerts WHERE order_id = $1`, id))
			return func(ctx context.Context, s *statestore.Store) error {
				a, already, err := s.AckAlert(ctx, alert, "ops", nil)
				if err == nil && (already || a.AckedAt == nil) {
					return fmt.Errorf("acknowledged %+v, already %v", a, already)
				}
				return err
			}, func() held { return holdRows(t, b, alert, `SELECT 1 FROM alerts WHERE id = $1 FOR UPDATE`) }
		}},
		{"bulk", func(t *testing.T, b bundle) (lockedAction, func() held) {
			id := runningOrder(t, b)
			ctx := ctxFor(t)
			if _, err := b.store.CreateBulkJob(ctx, statestore.BulkCancel, statestore.OrderQuery{}, []byte(`{}`), "api:ops", 10); err != nil {
				t.Fatal(err)
			}
			job, ok, err := b.store.TakeBulkJob(ctx, "h", time.Minute)
			if err != nil || !ok {
				t.Fatalf("take the job: %v %v", ok, err)
			}
			return func(ctx context.Context, s *statestore.Store) error {
				n, err := s.RunBulkBatch(ctx, job, "h", "bulk", 10)
				if err == nil && n != 1 {
					return fmt.Errorf("acted on %d orders, want 1", n)
				}
				return err
			}, func() held { return holdOrder(t, b, id) }
		}},
		{"bulk stop", func(t *testing.T, b bundle) (lockedAction, func() held) {
			job, err := b.store.CreateBulkJob(ctxFor(t), statestore.BulkCancel, statestore.OrderQuery{}, []byte(`{}`), "api:ops", 10)
			if err != nil {
				t.Fatal(err)
			}
			return func(ctx context.Context, s *statestore.Store) error {
					j, err := s.StopBulkJob(ctx, job.ID, "api:ops")
					if err == nil && j.State != statestore.BulkStopped {
						return fmt.Errorf("the job is %s, want stopped", j.State)
					}
					return err
				}, func() held {
					return holdRows(t, b, job.ID, `SELECT 1 FROM bulk_jobs WHERE id = $1 FOR UPDATE`)
				}
		}},
		{"limits set", func(t *testing.T, b bundle) (lockedAction, func() held) {
			limitedKind(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
				_, err := s.SetLimits(ctx, "pay", statestore.LimitChange{Rate: ptr(8.0)}, "ann")
				return err
			}, func() held { return holdRows(t, b, "pay", `SELECT 1 FROM agent_limits WHERE agent = $1 FOR UPDATE`) }
		}},
		{"limits reset", func(t *testing.T, b bundle) (lockedAction, func() held) {
			limitedKind(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
					_, err := s.ResetLimits(ctx, "pay", "ann")
					return err
				}, func() held {
					return holdRows(t, b, "pay", `SELECT 1 FROM agent_limits WHERE agent = $1 FOR UPDATE`)
				}
		}},
		{"namespace limits set", func(t *testing.T, b bundle) (lockedAction, func() held) {
			limitedInNamespace(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
					_, err := s.SetNamespaceLimits(ctx, "team-a", "pay", statestore.LimitChange{Rate: ptr(8.0)}, "ann")
					return err
				}, func() held {
					return holdRows(t, b, "pay", `SELECT 1 FROM namespace_limits WHERE agent = $1 FOR UPDATE`)
				}
		}},
		{"namespace limits reset", func(t *testing.T, b bundle) (lockedAction, func() held) {
			limitedInNamespace(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
					return s.ResetNamespaceLimits(ctx, "team-a", "pay", "ann")
				}, func() held {
					return holdRows(t, b, "pay", `SELECT 1 FROM namespace_limits WHERE agent = $1 FOR UPDATE`)
				}
		}},
		{"namespace quotas", func(t *testing.T, b bundle) (lockedAction, func() held) {
			if _, err := b.store.AddNamespace(ctxFor(t), "team-a", "test"); err != nil {
				t.Fatal(err)
			}
			return func(ctx context.Context, s *statestore.Store) error {
					return s.SetNamespaceQuotas(ctx, "team-a", statestore.Quotas{MaxInFlight: ptr(10)}, "ann")
				}, func() held {
					return holdRows(t, b, "team-a", `SELECT 1 FROM namespaces WHERE name = $1 FOR UPDATE`)
				}
		}},
		{"schedule pause", func(t *testing.T, b bundle) (lockedAction, func() held) {
			oneSchedule(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
					return s.PauseSchedule(ctx, "often", true, time.Time{}, "ann")
				}, func() held {
					return holdRows(t, b, "often", `SELECT 1 FROM schedules WHERE name = $1 FOR UPDATE`)
				}
		}},
		{"schedule trigger", func(t *testing.T, b bundle) (lockedAction, func() held) {
			oneSchedule(t, b)
			return func(ctx context.Context, s *statestore.Store) error {
					_, err := s.TriggerSchedule(ctx, "often", "ann")
					return err
				}, func() held {
					return holdRows(t, b, "often", `SELECT 1 FROM schedules WHERE name = $1 FOR UPDATE`)
				}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			store := storeWith(t, b, 200*time.Millisecond)
			act, hold := c.prepare(t, b)
			h := hold()
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(450 * time.Millisecond) // two lock timeouts: the first try gives up
				h.release()
			}()
			err := act(ctxFor(t), store)
			<-released
			if err != nil {
				t.Fatalf("%s behind a lock held for 450 ms: %v, want it done", c.name, err)
			}
		})
	}
}

// oneSchedule stores the schedule "often" of workflow "tick".
func oneSchedule(t *testing.T, b bundle) {
	t.Helper()
	reg, err := workflow.Parse("s.yaml", []byte(`
workflows:
  - name: tick
    steps:
      - {action: a, agent: x}
schedules:
  - {name: often, cron: "@every 1h", workflow: tick}
`))
	if err != nil {
		t.Fatal(err)
	}
	sc := reg.Schedules()[0]
	if err := b.store.SyncSchedules(ctxFor(t), []statestore.ScheduleDef{{Name: sc.Name, Workflow: sc.Workflow, Cron: sc.Cron, Timezone: sc.Timezone,
		Payload: sc.Payload, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Version: sc.Version(), FirstTick: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
}

// TestAnActionADeadlockPicksIsTriedAgain: a cancel locks the order, then
// its steps, where a reply locks a step, then its order; when the two
// meet, PostgreSQL rolls one back as a deadlock's victim. The cancel,
// picked (it waited first, and the other side looks for deadlocks only
// after 10 s), is tried again once the other ends, and cancels.
func TestAnActionADeadlockPicksIsTriedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	id := runningOrder(t, b)
	store := storeWith(t, b, 0)

	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '10s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM steps WHERE order_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	type result struct {
		status string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, err := store.CancelOrder(ctx, id, "ops")
		done <- result{status, err}
	}()
	// The cancel holds the order and waits for the steps.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%operator_cancel%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancel never waited for the steps")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The cycle closes; the cancel is its victim, so this lock is granted.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM orders WHERE order_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatalf("the other side of the deadlock: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.status != statestore.OrderCompensating {
		t.Fatalf("cancel picked by a deadlock: %q %v, want it tried again and compensating", r.status, r.err)
	}
}
