package statestore_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// sagaOrder is an order of the built-in "order" workflow (3 actions, 3
// compensations) with the given policy.
func sagaOrder(policy string) statestore.NewOrder {
	wf, _ := workflow.Builtin().Lookup("order")
	id := messages.NewID()
	h := sha256.Sum256([]byte(id))
	return statestore.NewOrder{OrderID: id, Workflow: "order", Payload: []byte(`{"customer":"c","amount":100}`), PayloadHash: h[:],
		Steps: stepsOf(wf), Actor: "test", FailurePolicy: policy}
}

// stepsOf lays a workflow out as an order's steps, as the submitter does,
// each with an hour's budget and three failures.
func stepsOf(wf workflow.Workflow) []statestore.NewStep {
	var steps []statestore.NewStep
	for _, r := range wf.Rows() {
		kind := statestore.KindAction
		if r.Compensates > 0 {
			kind = statestore.KindCompensation
		}
		steps = append(steps, statestore.NewStep{Name: r.Name, Agent: r.Agent, Kind: kind, Compensates: r.Compensates,
			Timeout: time.Hour, MaxFailures: 3, Needs: r.Needs, Ancestors: r.Ancestors, Spec: r.Spec()})
	}
	return steps
}

// run claims the order's pending step and replies to it.
func run(t *testing.T, b bundle, orderID string, ok bool) (statestore.ClaimedStep, statestore.ApplyResult) {
	t.Helper()
	ctx := ctxFor(t)
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	var mine *statestore.ClaimedStep
	for i := range claimed {
		if claimed[i].OrderID == orderID {
			mine = &claimed[i]
		}
	}
	if mine == nil {
		t.Fatalf("nothing of order %s to claim (claimed %+v)", orderID, claimed)
	}
	r := statestore.Reply{OrderID: orderID, Step: mine.Step, Attempt: mine.Attempt, OK: ok, Actor: "s"}
	if !ok {
		r.Error = "refused"
	}
	res, err := b.store.ApplyReply(ctx, r)
	if err != nil {
		t.Fatalf("reply to step %d: %v", mine.Step, err)
	}
	return *mine, res
}

func states(t *testing.T, b bundle, orderID string) (string, string) {
	t.Helper()
	d, err := b.store.GetOrder(ctxFor(t), orderID)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for _, st := range d.Steps {
		s += st.ProcessState[:4] + " "
	}
	return d.Order.Status, s
}

func TestCompensationUndoesAttemptedActionsLastFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true) // reserve
	_, res := run(t, b, o.OrderID, false)
	if res.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("after the payment failed: %+v", res)
	}
	// Shipping never ran: its compensation is cancelled. The failed
	// payment may have been applied by an earlier attempt: it is undone
	// first, then the reservation.
	if status, steps := states(t, b, o.OrderID); status != statestore.OrderCompensating || steps != "proc erro canc canc pend wait " {
		t.Fatalf("order %s, steps %s", status, steps)
	}
	c, res := run(t, b, o.OrderID, true)
	if c.Kind != statestore.KindCompensation || c.Name != "refund_payment" || c.Undoes != statestore.IdempotencyKey(o.OrderID, 2, "charge_payment") {
		t.Fatalf("first compensation claimed: %+v", c)
	}
	if res.NextStep != 6 {
		t.Fatalf("after the refund: %+v", res)
	}
	c, res = run(t, b, o.OrderID, true)
	if c.Name != "release_inventory" || c.Undoes != statestore.IdempotencyKey(o.OrderID, 1, "reserve_inventory") || res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("second compensation %+v -> %+v", c, res)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND body->>'status' IN ('compensating', 'failed')`, o.OrderID); n != 2 {
		t.Fatalf("%d compensating/failed events, want 2", n)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'operator_alert'`, o.OrderID); n != 0 {
		t.Fatalf("%d alerts for an order compensated as planned", n)
	}
}

func TestFailingFirstStepLeavesNothingToUndo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	// The failed first step was attempted: its release runs (the remote
	// makes it a no-op if the reservation never happened).
	_, res := run(t, b, o.OrderID, false)
	if res.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("%+v", res)
	}
	_, res = run(t, b, o.OrderID, true)
	if res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("%+v", res)
	}
}

func TestFailedCompensationNeedsAPerson(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	run(t, b, o.OrderID, true)
	run(t, b, o.OrderID, false) // shipping refused
	_, res := run(t, b, o.OrderID, false)
	if res.OrderStatus != statestore.OrderError {
		t.Fatalf("after a compensation failed: %+v", res)
	}
	if n := count(t, b, `SELECT count(*) FROM outbox WHERE order_id = $1 AND message_type = 'operator_alert'`, o.OrderID); n != 1 {
		t.Fatalf("%d alerts, want 1", n)
	}
	if _, err := b.store.CancelOrder(ctx, o.OrderID, "operator"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("cancel of an order whose compensation failed: %v", err)
	}
	if _, err := b.store.Resubmit(ctx, o.OrderID, 0, "operator"); err != nil {
		t.Fatal(err)
	}
	if status, _ := states(t, b, o.OrderID); status != statestore.OrderCompensating {
		t.Fatalf("after resubmitting the compensation: %s", status)
	}
	run(t, b, o.OrderID, true)
	run(t, b, o.OrderID, true)
	_, res = run(t, b, o.OrderID, true)
	if res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("%+v", res)
	}
}

func TestHoldPolicyWaitsForOperator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyHold)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	_, res := run(t, b, o.OrderID, false)
	if res.OrderStatus != statestore.OrderError {
		t.Fatalf("hold: %+v", res)
	}
	if status, steps := states(t, b, o.OrderID); status != statestore.OrderError || steps != "proc erro wait wait wait wait " {
		t.Fatalf("held order %s, steps %s", status, steps)
	}
	// cancel runs the compensations even under hold.
	status, err := b.store.CancelOrder(ctx, o.OrderID, "operator")
	if err != nil || status != statestore.OrderCompensating {
		t.Fatalf("cancel: %s %v", status, err)
	}
	run(t, b, o.OrderID, true)
	_, res = run(t, b, o.OrderID, true)
	if res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("%+v", res)
	}
}

func TestCancelInFlightOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "") // payment in flight
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	status, err := b.store.CancelOrder(ctx, o.OrderID, "operator")
	if err != nil || status != statestore.OrderCompensating {
		t.Fatalf("cancel: %s %v", status, err)
	}
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: 2, Attempt: claimed[0].Attempt, OK: true, Actor: "s"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("the in-flight payment's reply after cancel: %v", err)
	}
	if _, steps := states(t, b, o.OrderID); steps != "proc canc canc canc pend wait " {
		t.Fatalf("steps after cancel %s", steps)
	}
	run(t, b, o.OrderID, true)
	if _, res := run(t, b, o.OrderID, true); res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("%+v", res)
	}

	// An order nothing was attempted for fails at once.
	fresh := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, fresh)
	if status, err := b.store.CancelOrder(ctx, fresh.OrderID, "operator"); err != nil || status != statestore.OrderFailed {
		t.Fatalf("cancel of an untouched order: %s %v", status, err)
	}
}

// TestApplyRepliesMatchesApplyReply: the same orders driven to their end
// once reply by reply (ApplyReply) and once in batches (ApplyReplies, one
// statement for the ok replies) end in the same states with the same
// history: steps made pending one after the other, orders completed, and
// failed orders compensated last action first until failed.
func TestApplyRepliesMatchesApplyReply(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	type entry struct {
		step                 int
		from, to, actor, why string
		attempt              int
	}
	drive := func(batch bool) [][]entry {
		b := setup(t)
		var ids []string
		for i := range 12 {
			o := sagaOrder(statestore.PolicyCompensate)
			o.OrderID = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
			insert(t, b, o)
			ids = append(ids, o.OrderID)
		}
		// Orders 0, 3, 6, 9 are refused at their second action (payment).
		fails := func(c statestore.ClaimedStep) bool {
			return c.Kind == statestore.KindAction && c.Step == 2 && c.OrderID[len(c.OrderID)-1]%3 == 0
		}
		for round := 0; ; round++ {
			if round > 20 {
				t.Fatal("orders did not end in 20 rounds")
			}
			claimed, err := b.store.ClaimPending(ctx, "s", 100, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(claimed) == 0 {
				break
			}
			var rs []statestore.Reply
			for _, c := range claimed {
				r := statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Result: []byte(`{"done":true}`), Actor: "s"}
				if fails(c) {
					r.OK, r.Result, r.Error = false, nil, "refused"
				}
				rs = append(rs, r)
			}
			if batch {
				if _, errs := b.store.ApplyReplies(ctx, rs); errors.Join(errs...) != nil {
					t.Fatal(errors.Join(errs...))
				}
				continue
			}
			for _, r := range rs {
				if _, err := b.store.ApplyReply(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
		}
		var all [][]entry
		for _, id := range ids {
			rows, err := b.pool.Query(ctx, `SELECT coalesce(step, 0), coalesce(from_state, ''), to_state, actor, reason, attempt
				FROM transitions WHERE order_id = $1 ORDER BY id`, id)
			if err != nil {
				t.Fatal(err)
			}
			es, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (entry, error) {
				var e entry
				err := row.Scan(&e.step, &e.from, &e.to, &e.actor, &e.why, &e.attempt)
				return e, err
			})
			if err != nil {
				t.Fatal(err)
			}
			var status string
			if err := b.pool.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, id).Scan(&status); err != nil {
				t.Fatal(err)
			}
			want := statestore.OrderCompleted
			if id[len(id)-1]%3 == 0 {
				want = statestore.OrderFailed
			}
			if status != want {
				t.Fatalf("order %s (batch %v) ended %s, want %s", id, batch, status, want)
			}
			all = append(all, es)
		}
		return all
	}
	one, batched := drive(false), drive(true)
	for i := range one {
		if !reflect.DeepEqual(one[i], batched[i]) {
			t.Fatalf("order %d's history differs:\none by one %+v\nbatched    %+v", i, one[i], batched[i])
		}
	}
}

// TestRepliesClaimNextSteps: a batch of ok replies claims, in the same
// statement, each next step whose agent kind it is asked to (as a claim
// would: attempt, deadline, history, what the request needs, for a
// compensation the key it undoes), and leaves the others pending for the
// claimer.
func TestRepliesClaimNextSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	okReply := func(c statestore.ClaimedStep) statestore.Reply {
		return statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true,
			Result: fmt.Appendf(nil, `{"from":%d}`, c.Step), Actor: "s"}
	}
	claimOne := func(want int) statestore.ClaimedStep {
		t.Helper()
		claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
		if err != nil || len(claimed) != 1 || claimed[0].Step != want {
			t.Fatalf("claimed %+v (%v), want step %d", claimed, err, want)
		}
		return claimed[0]
	}
	stepState := func(step int) (state, lockedBy string, attempt int) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT process_state, coalesce(locked_by, ''), attempt FROM steps WHERE order_id = $1 AND step = $2`,
			o.OrderID, step).Scan(&state, &lockedBy, &attempt); err != nil {
			t.Fatal(err)
		}
		return state, lockedBy, attempt
	}

	// Step 2 (payment) is not of a kind asked for: it becomes pending.
	res, errs := b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(claimOne(1))}, []string{"shipping"})
	if errs[0] != nil || res[0].NextStep != 2 || res[0].Claimed != nil {
		t.Fatalf("reply to step 1: %+v %v", res[0], errs[0])
	}
	if state, _, _ := stepState(2); state != statestore.StepPending {
		t.Fatalf("step 2 is %s, want pending", state)
	}
	// Step 3 (shipping) is: claimed with the reply to step 2.
	res, errs = b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(claimOne(2))}, []string{"shipping"})
	c := res[0].Claimed
	if errs[0] != nil || res[0].NextStep != 3 || c == nil {
		t.Fatalf("reply to step 2: %+v %v", res[0], errs[0])
	}
	if c.OrderID != o.OrderID || c.Step != 3 || c.Name != "create_shipment" || c.Agent != "shipping" || c.Attempt != 1 ||
		c.Kind != statestore.KindAction || c.Undoes != "" || c.IdempotencyKey != statestore.IdempotencyKey(o.OrderID, 3, "create_shipment") ||
		string(c.Payload) != `{"amount": 100, "customer": "c"}` || c.UndoneResult != nil ||
		// step 1's result was written before; step 2's by this very statement
		string(c.Results) != `{"charge_payment": {"from": 2}, "reserve_inventory": {"from": 1}}` ||
		c.Budget <= 0 || c.Budget > time.Hour || time.Until(c.CompleteBy) > time.Hour+time.Minute || time.Until(c.CompleteBy) < 50*time.Minute {
		t.Fatalf("the claimed step: %+v", c)
	}
	if state, lockedBy, attempt := stepState(3); state != statestore.StepProcessing || lockedBy != "s" || attempt != 1 {
		t.Fatalf("step 3 is %s by %q, attempt %d; want processing by s, attempt 1", state, lockedBy, attempt)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	var hist []string
	for _, h := range d.History {
		if h.Step != nil && *h.Step == 3 {
			hist = append(hist, fmt.Sprintf("%s>%s/%d/%s/%s", h.From, h.To, h.Attempt, h.Actor, h.Reason))
		}
	}
	if want := []string{"waiting>pending/0/s/previous step processed", "pending>processing/1/s/claimed"}; !reflect.DeepEqual(hist, want) {
		t.Fatalf("step 3's history %q, want %q", hist, want)
	}
	// Nothing else is pending: the claimer has nothing to take.
	if claimed, err := b.store.ClaimPending(ctx, "other", 10, ""); err != nil || len(claimed) != 0 {
		t.Fatalf("a claim after the hand-off took %+v (%v)", claimed, err)
	}
	// The step is fenced like any claimed step: a reply for another
	// attempt is stale; the failure of attempt 1 starts compensating.
	stale := statestore.Reply{OrderID: o.OrderID, Step: 3, Attempt: 2, OK: false, Error: "x", Actor: "s"}
	if _, err := b.store.ApplyReply(ctx, stale); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("a reply for attempt 2: %v, want stale", err)
	}
	failed := statestore.Reply{OrderID: o.OrderID, Step: 3, Attempt: 1, OK: false, Error: "refused", Actor: "s"}
	if r, err := b.store.ApplyReply(ctx, failed); err != nil || r.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("the failure: %+v %v", r, err)
	}
	// A compensation's next compensation is claimed with the key it undoes.
	res, errs = b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(claimOne(4))}, []string{"payment", "shipping", "inventory"})
	c = res[0].Claimed
	if errs[0] != nil || c == nil || c.Step != 5 || c.Name != "refund_payment" || c.Kind != statestore.KindCompensation ||
		c.Undoes != statestore.IdempotencyKey(o.OrderID, 2, "charge_payment") {
		t.Fatalf("reply to compensation 4: %+v %+v %v", res[0], c, errs[0])
	}
	// The last one ends the order and claims nothing.
	res, errs = b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(*c)}, []string{"inventory"})
	if errs[0] != nil || res[0].Claimed == nil || res[0].Claimed.Step != 6 {
		t.Fatalf("reply to compensation 5: %+v %v", res[0], errs[0])
	}
	res, errs = b.store.ApplyRepliesClaiming(ctx, []statestore.Reply{okReply(*res[0].Claimed)}, []string{"inventory"})
	if errs[0] != nil || res[0].Claimed != nil || res[0].NextStep != 0 || res[0].OrderStatus != statestore.OrderFailed {
		t.Fatalf("reply to the last compensation: %+v %v", res[0], errs[0])
	}
}

// TestResubmitOnlyWhatMayRun: once a compensation failed, the order is
// partly undone: resubmitting its failed action is refused (saying which
// step may be), and a resubmit without a step resets only the
// compensation, so no action runs beside the undoing.
func TestResubmitOnlyWhatMayRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true)  // reserve_inventory
	run(t, b, o.OrderID, false) // charge_payment fails: undoing begins with refund_payment (5)
	run(t, b, o.OrderID, false) // refund_payment fails: held, partly undone
	if status, _ := states(t, b, o.OrderID); status != statestore.OrderError {
		t.Fatalf("the order is %s", status)
	}
	if _, err := b.store.Resubmit(ctx, o.OrderID, 2, "operator"); !errors.Is(err, statestore.ErrInvalidState) ||
		!strings.Contains(err.Error(), "resubmit its failed compensation (step 5)") {
		t.Fatalf("resubmitting the failed action of a partly undone order: %v", err)
	}
	reset, err := b.store.Resubmit(ctx, o.OrderID, 0, "operator")
	if err != nil || len(reset) != 1 || reset[0] != 5 {
		t.Fatalf("a resubmit without a step reset %v (%v), want only the compensation 5", reset, err)
	}
	if status, steps := states(t, b, o.OrderID); status != statestore.OrderCompensating || steps != "proc erro canc canc pend wait " {
		t.Fatalf("after: %s %q", status, steps)
	}
}

func TestResubmitOfAProcessedStepRunsItAndTheStepsAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyHold)
	insert(t, b, o)
	first, _ := run(t, b, o.OrderID, true) // reserve_inventory
	run(t, b, o.OrderID, false)            // charge_payment fails: held
	if status, steps := states(t, b, o.OrderID); status != statestore.OrderError || steps != "proc erro wait wait wait wait " {
		t.Fatalf("held: %s %q", status, steps)
	}
	reset, err := b.store.Resubmit(ctx, o.OrderID, 1, "operator")
	if err != nil || fmt.Sprint(reset) != "[1 2 3]" {
		t.Fatalf("reset %v (%v), want the step and the steps after it", reset, err)
	}
	if status, steps := states(t, b, o.OrderID); status != statestore.OrderProcessing || steps != "pend wait wait wait wait wait " {
		t.Fatalf("after: %s %q", status, steps)
	}
	again, _ := run(t, b, o.OrderID, true)
	if again.Step != 1 || again.IdempotencyKey == first.IdempotencyKey {
		t.Fatalf("ran step %d with key %s again (first %s): a processed step runs again with a new key", again.Step,
			again.IdempotencyKey, first.IdempotencyKey)
	}
	run(t, b, o.OrderID, true)
	if _, res := run(t, b, o.OrderID, true); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("order %q", res.OrderStatus)
	}
}

// TestUndoingWaitsForAClaimInFlight: an order of a list is undone (as
// its parent is) while a claim of its next action has not committed.
// Undoing waits for that claim and keeps the action's compensation: the
// claim's request goes out, so the action may be done, and must be
// undone. (The compensation was cancelled as "never ran" when undoing
// read the action's attempt before the claim committed: a fault run
// found such an order done and never undone.)
func TestUndoingWaitsForAClaimInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := sagaOrder(statestore.PolicyCompensate)
	insert(t, b, o)
	run(t, b, o.OrderID, true)
	claim, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = claim.Rollback(ctx) }()
	if _, err := claim.Exec(ctx, `UPDATE steps SET process_state = 'processing', attempt = attempt + 1, locked_by = 's',
		complete_by = now() + interval '1 hour', moves = moves + 1, moved_by = 's', moved_why = 'claimed'
		WHERE order_id = $1 AND step = 2 AND process_state = 'pending'`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	undone := make(chan error, 1)
	go func() {
		_, err := b.pool.Exec(ctx, `SELECT begin_compensation($1, NULL, 'test', 'its parent order is undone (undo-waits-for-claim)')`, o.OrderID)
		undone <- err
	}()
	// Undoing waits for the claim's row.
	testenv.Eventually(t, 10*time.Second, "undoing to wait for the claim", func() bool {
		return count(t, b, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%undo-waits-for-claim%'`) == 1
	})
	if err := claim.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-undone; err != nil {
		t.Fatal(err)
	}
	var action, compensation string
	if err := b.pool.QueryRow(ctx, `SELECT a.process_state, c.process_state FROM steps a JOIN steps c ON c.order_id = a.order_id AND c.compensates = a.step
		WHERE a.order_id = $1 AND a.step = 2`, o.OrderID).Scan(&action, &compensation); err != nil {
		t.Fatal(err)
	}
	if action != statestore.StepCancelled || compensation == statestore.StepCancelled {
		t.Fatalf("the action claimed in flight is %s and its compensation %s: want it cancelled and its compensation kept", action, compensation)
	}
}
