package statestore_test

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

const pausable = `
workflows:
  - name: pausable
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x}
      - {action: c, agent: x, delay: 1ms}
`

// TestAPausedOrderHasNothingClaimed: a paused order's step in flight ends
// normally, but nothing of it is claimed (not the step its reply made
// pending, not by the claim the reply makes at once), its timers and
// deadline do not fire and the supervisor does not expire its steps;
// resumed, it runs on, its deadline moved on by the time it was paused.
func TestAPausedOrderHasNothingClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate)
	o.Deadline = time.Hour
	insert(t, b, o)
	var due0 time.Time
	if err := b.pool.QueryRow(ctx, `SELECT due_at FROM order_deadlines WHERE order_id = $1`, o.OrderID).Scan(&due0); err != nil {
		t.Fatal(err)
	}
	inFlight := claimAll(t, b, o.OrderID)["a"]
	if got, err := b.store.PauseOrder(ctx, o.OrderID, "incident 42", "ops"); err != nil || got != statestore.Paused {
		t.Fatalf("pause: %q %v", got, err)
	}
	if got, err := b.store.PauseOrder(ctx, o.OrderID, "again", "ops"); err != nil || got != statestore.AlreadyPaused {
		t.Fatalf("pause again: %q %v", got, err)
	}
	// In flight, it ends normally; b becomes pending, and is not claimed.
	if res, err := b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{{OrderID: o.OrderID, Step: inFlight.Step, Attempt: inFlight.Attempt,
		OK: true, Actor: "s"}}, []string{"x"}); err[0] != nil || res[0].Claimed != nil {
		t.Fatalf("a reply while paused: %+v %v; want applied, nothing claimed with it", res[0], err[0])
	}
	if got := claimAll(t, b, o.OrderID); len(got) != 0 {
		t.Fatalf("claimed %s of a paused order", names(got))
	}
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{"x": 10}); err != nil || len(got) != 0 {
		t.Fatalf("claimed by kind %v (%v) of a paused order", got, err)
	}
	// Its deadline, due now, waits; the order shows its pause.
	if _, err := b.pool.Exec(ctx, `UPDATE order_deadlines SET due_at = clock_timestamp() - interval '1 minute' WHERE order_id = $1`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	if fired := passDeadlineNow(t, b); len(fired) != 0 {
		t.Fatalf("a paused order's deadline fired: %+v", fired)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE order_deadlines SET due_at = $2 WHERE order_id = $1`, o.OrderID, due0); err != nil {
		t.Fatal(err)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil || d.Paused == nil || d.Paused.Reason != "incident 42" || d.Paused.Scope != "order" {
		t.Fatalf("the paused order shows %+v (%v)", d.Paused, err)
	}
	if got, err := b.store.ResumeOrder(ctx, o.OrderID, "ops"); err != nil || got != statestore.Resumed {
		t.Fatalf("resume: %q %v", got, err)
	}
	if got, err := b.store.ResumeOrder(ctx, o.OrderID, "ops"); err != nil || got != statestore.NotPaused {
		t.Fatalf("resume again: %q %v", got, err)
	}
	var due1 time.Time
	if err := b.pool.QueryRow(ctx, `SELECT due_at FROM order_deadlines WHERE order_id = $1`, o.OrderID).Scan(&due1); err != nil {
		t.Fatal(err)
	}
	if moved := due1.Sub(due0); moved <= 0 || moved > time.Minute {
		t.Fatalf("the deadline moved on by %v after the resume, want the time it was paused", moved)
	}
	if names(claimAll(t, b, o.OrderID)) != "b" {
		t.Fatal("b was not claimed once the order was resumed")
	}
	if n := count(t, b, `SELECT count(*) FROM operator_actions WHERE target = $1 AND action IN ('pause', 'resume') AND claimed_by = 'ops'`, o.OrderID); n != 2 {
		t.Fatalf("%d operator actions recorded, want pause and resume", n)
	}
}

// passDeadlineNow fires the due deadlines as the lease holder would.
func passDeadlineNow(t *testing.T, b bundle) []statestore.FiredDeadline {
	t.Helper()
	ctx := ctxFor(t)
	if _, err := b.store.AcquireLease(ctx, statestore.SupervisorLease, "sup-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	fired, err := b.store.FireDeadlines(ctx, "sup-1", statestore.SupervisorLease, 100)
	if err != nil {
		t.Fatal(err)
	}
	return fired
}

// TestTheSupervisorNeverExpiresPausedWork: a paused order's step past its
// complete_by is left processing; once resumed, it is reset.
func TestTheSupervisorNeverExpiresPausedWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	claimAll(t, b, o.OrderID)
	if _, err := b.store.PauseOrder(ctx, o.OrderID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE steps SET complete_by = now() - interval '1 second' WHERE order_id = $1 AND step = 1`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	sweep := statestore.SweepParams{Actor: "sup", Limit: 100, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}
	if swept, err := b.store.SweepExpired(ctx, sweep); err != nil || len(swept) != 0 {
		t.Fatalf("swept %v (%v) of a paused order", swept, err)
	}
	if _, err := b.store.ResumeOrder(ctx, o.OrderID, "ops"); err != nil {
		t.Fatal(err)
	}
	if swept, err := b.store.SweepExpired(ctx, sweep); err != nil || len(swept) != 1 {
		t.Fatalf("swept %v (%v) once resumed, want its expired step", swept, err)
	}
}

// TestPausedWorkflowsAndKinds: a paused workflow pauses its running
// orders and the orders written while it is paused, and its resume
// resumes them all but an order paused on its own; a paused agent kind
// has none of its steps claimed until resumed.
func TestPausedWorkflowsAndKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	wfName := "pausable-" + time.Now().Format("150405.000000")
	file := `
workflows:
  - name: ` + wfName + `
    steps:
      - {action: a, agent: x}
`
	running, own := graphOrder(t, file, wfName, `{}`, statestore.PolicyCompensate), graphOrder(t, file, wfName, `{}`, statestore.PolicyCompensate)
	insert(t, b, running)
	insert(t, b, own)
	if _, err := b.store.PauseOrder(ctx, own.OrderID, "its own", "ops"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.PauseWorkflow(ctx, wfName, "deploying a fix", "ops"); err != nil || n != 1 {
		t.Fatalf("pause workflow: %d %v, want the one running order not paused yet", n, err)
	}
	later := graphOrder(t, file, wfName, `{}`, statestore.PolicyCompensate)
	insert(t, b, later)
	// A paused order with a step set aside reads as any order does.
	if d, err := b.store.GetOrder(ctx, running.OrderID); err != nil || d.Paused == nil || d.Steps[0].ProcessState != statestore.StepPending {
		t.Fatalf("reading a paused order: %+v %v", d.Paused, err)
	}
	for _, id := range []string{running.OrderID, own.OrderID, later.OrderID} {
		if got := claimAll(t, b, id); len(got) != 0 {
			t.Fatalf("claimed %s of an order of a paused workflow", names(got))
		}
	}
	if n, err := b.store.ResumeWorkflow(ctx, wfName, "ops"); err != nil || n != 2 {
		t.Fatalf("resume workflow: %d %v, want the two paused with it", n, err)
	}
	if _, err := b.store.ResumeWorkflow(ctx, wfName, "ops"); err == nil {
		t.Fatal("a workflow not paused was resumed")
	}
	claimed, err := b.store.ClaimPending(ctx, "s", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	byOrder := map[string]int{}
	for _, c := range claimed {
		byOrder[c.OrderID]++
	}
	if byOrder[running.OrderID] != 1 || byOrder[later.OrderID] != 1 || byOrder[own.OrderID] != 0 {
		t.Fatalf("after the workflow's resume, claimed %v; want its orders claimed but the one paused on its own", byOrder)
	}

	kind := "kind-" + time.Now().Format("150405.000000")
	ko := order(1, time.Minute, 3)
	ko.Steps[0].Agent = kind
	insert(t, b, ko)
	if got, err := b.store.PauseKind(ctx, kind, "its service is down", "ops"); err != nil || got != statestore.Paused {
		t.Fatalf("pause kind: %q %v", got, err)
	}
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{kind: 10}); err != nil || len(got) != 0 {
		t.Fatalf("claimed %v (%v) of a paused kind", got, err)
	}
	if got := claimAll(t, b, ko.OrderID); len(got) != 0 {
		t.Fatalf("claimed %s of a paused kind", names(got))
	}
	if lc, err := b.store.ClaimLimited(ctx, "s", kind, 10); err != nil || len(lc.Steps) != 0 || lc.Held != "paused" {
		t.Fatalf("a limited claim of a paused kind: %+v %v", lc, err)
	}
	ps, err := b.store.Pauses(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	var sawKind bool
	for _, p := range ps {
		sawKind = sawKind || p.Scope == "kind" && p.Target == kind && p.Reason == "its service is down"
	}
	if !sawKind {
		t.Fatalf("pauses %+v do not list the kind", ps)
	}
	if got, err := b.store.ResumeKind(ctx, kind, "ops"); err != nil || got != statestore.Resumed {
		t.Fatalf("resume kind: %q %v", got, err)
	}
	if got, err := b.store.ClaimKinds(ctx, "s", map[string]int{kind: 10}); err != nil || len(got) != 1 {
		t.Fatalf("claimed %v (%v) once the kind was resumed", got, err)
	}
}

// TestSettlingPausesResumesWhatAResumeMissed: an order paused with its
// workflow whose insert committed after the workflow's resume (its pause
// row the resume could not see) is resumed by the leader's settling; one
// paused on its own is not, and an ended order's pause goes.
func TestSettlingPausesResumesWhatAResumeMissed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	missed, own := graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate), graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate)
	insert(t, b, missed)
	insert(t, b, own)
	if _, err := b.pool.Exec(ctx, `INSERT INTO order_pauses (order_id, paused_by, scope) VALUES ($1, 'ann', 'workflow')`, missed.OrderID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.PauseOrder(ctx, own.OrderID, "", "ann"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SettlePauses(ctx, "sup"); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, missed.OrderID); n != 0 {
		t.Fatal("an order paused with a workflow no longer paused stayed paused")
	}
	if n := count(t, b, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, own.OrderID); n != 1 {
		t.Fatal("settling resumed an order paused on its own")
	}
	testenv.Forge(t, b.pool, `UPDATE orders SET status = 'completed' WHERE order_id = $1`, own.OrderID)
	if _, err := b.store.SettlePauses(ctx, "sup"); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, own.OrderID); n != 0 {
		t.Fatal("an ended order's pause stayed")
	}
}

// TestSettlingPausesNeverSetsAsideWhatAResumeFreed: the leader's settling
// sets aside the pending steps of paused orders; when a workflow's resume
// frees an order while that settling is under way (its statement began
// before the resume deleted the pause, and reaches the order's step after
// the resume committed), the order's steps must not end set aside with
// no pause left to free them: such an order would wait for ever, never
// claimed. A transaction holding the step's row makes the settling wait
// there, so the two meet in that order.
func TestSettlingPausesNeverSetsAsideWhatAResumeFreed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.PauseWorkflow(ctx, "pausable", "deploying", "ops"); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate)
	insert(t, b, o) // written paused, its first step pending and not set aside yet

	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	var holderPID int
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1 FROM steps WHERE order_id = $1 AND process_state = 'pending' FOR UPDATE`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	blockedBy := func(pid int) int {
		var waiter int
		err := b.pool.QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&waiter)
		if err != nil {
			t.Fatal(err)
		}
		return waiter
	}

	settled := make(chan error, 1)
	go func() {
		_, err := b.store.SettlePauses(ctx, "sup")
		settled <- err
	}()
	var settler int
	testenv.Eventually(t, 30*time.Second, "the settling to wait for the held step", func() bool {
		settler = blockedBy(holderPID)
		return settler != 0
	})
	resumed := make(chan error, 1)
	go func() {
		_, err := b.store.ResumeWorkflow(ctx, "pausable", "ops")
		resumed <- err
	}()
	// The resume either ends at once or waits behind the settling; the
	// held step is let go only then.
	var resumeErr error
	resumeDone := false
	testenv.Eventually(t, 30*time.Second, "the resume to end or to wait for the settling", func() bool {
		select {
		case resumeErr = <-resumed:
			resumeDone = true
			return true
		default:
			return blockedBy(settler) != 0
		}
	})
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-settled; err != nil {
		t.Fatalf("settle: %v", err)
	}
	if !resumeDone {
		resumeErr = <-resumed
	}
	if resumeErr != nil {
		t.Fatalf("resume: %v", resumeErr)
	}
	if n := count(t, b, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, o.OrderID); n != 0 {
		t.Fatal("the order stayed paused after its workflow's resume")
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND available_at = '9999-12-31 00:00:00+00'`, o.OrderID); n != 0 {
		t.Fatalf("%d steps of a resumed order were left set aside, never to be claimed", n)
	}
	if got := claimAll(t, b, o.OrderID); len(got) != 1 {
		t.Fatalf("claimed %s of the resumed order, want its first step", names(got))
	}
}

// TestSettlingLocksOnlyThePausesItSetsAsideFor: the leader settles pauses
// at every sweep; a row lock is a write (of the row and the log), so the
// settling locks the pause rows of orders with a step to set aside, not
// those of every paused order, whose steps it set aside before.
func TestSettlingLocksOnlyThePausesItSetsAsideFor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	quiet, fresh := graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate), graphOrder(t, pausable, "pausable", `{}`, statestore.PolicyCompensate)
	insert(t, b, quiet)
	if _, err := b.store.PauseOrder(ctx, quiet.OrderID, "", "ops"); err != nil {
		t.Fatal(err)
	}
	insert(t, b, fresh)
	// Paused as an order written while its workflow was: its first step
	// pending, not set aside yet.
	if _, err := b.pool.Exec(ctx, `INSERT INTO order_pauses (order_id, paused_by, scope) VALUES ($1, 'ops', 'order')`, fresh.OrderID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SettlePauses(ctx, "sup"); err != nil {
		t.Fatal(err)
	}
	locked := func(id string) bool {
		var xmax string
		if err := b.pool.QueryRow(ctx, `SELECT xmax::text FROM order_pauses WHERE order_id = $1`, id).Scan(&xmax); err != nil {
			t.Fatal(err)
		}
		return xmax != "0"
	}
	if locked(quiet.OrderID) {
		t.Fatal("settling locked the pause of an order with nothing to set aside")
	}
	if !locked(fresh.OrderID) {
		t.Fatal("settling set aside an order's step without locking its pause")
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND process_state = 'pending' AND available_at <> '9999-12-31 00:00:00+00'`,
		[]string{quiet.OrderID, fresh.OrderID}); n != 0 {
		t.Fatalf("%d pending steps of paused orders not set aside", n)
	}
}

// TestAWorkflowsResumeWaitsOutABriefLock: a workflow's resume that meets
// an order held by another transaction for longer than the lock timeout
// (a claim, a batch of replies) tries again and resumes it once the
// holder ends, rather than giving the operator a lock timeout; held for
// longer than its tries, it gives the lock timeout up as it was.
func TestAWorkflowsResumeWaitsOutABriefLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	store := storeWith(t, b, 200*time.Millisecond)
	wfName := "held-" + time.Now().Format("150405.000000")
	file := `
workflows:
  - name: ` + wfName + `
    steps:
      - {action: a, agent: x}
`
	o := graphOrder(t, file, wfName, `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	if n, err := store.PauseWorkflow(ctx, wfName, "a fix", "ops"); err != nil || n != 1 {
		t.Fatalf("pause workflow: %d %v", n, err)
	}
	h := holdOrder(t, b, o.OrderID)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(450 * time.Millisecond) // two lock timeouts: the first try gives up
		h.release()
	}()
	n, err := store.ResumeWorkflow(ctx, wfName, "ops")
	<-released
	if err != nil || n != 1 {
		t.Fatalf("resume workflow behind a lock held for 450 ms: %d %v, want the order resumed", n, err)
	}

	if _, err := store.PauseWorkflow(ctx, wfName, "again", "ops"); err != nil {
		t.Fatal(err)
	}
	h = holdOrder(t, b, o.OrderID)
	if _, err := store.ResumeWorkflow(ctx, wfName, "ops"); !statestore.IsLockTimeout(err) {
		t.Fatalf("resume workflow behind a lock held throughout: %v, want a lock timeout", err)
	}
	h.release()
	if n, err := store.ResumeWorkflow(ctx, wfName, "ops"); err != nil || n != 1 {
		t.Fatalf("resume workflow once the lock is gone: %d %v", n, err)
	}
}
