package statestore_test

import (
	"errors"
	"strings"
	"testing"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

const family = `
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: kyc, workflow: kyc_check, input: '{"person": payload.who}'}
      - {action: open_account, agent: core, compensation: {action: close_account}}
  - name: kyc_check
    steps:
      - {action: check_id, agent: kyc, compensation: {action: forget_id}}
      - {action: check_address, agent: kyc}
`

// startChild does what a scheduler does for a claimed sub-process step.
func startChild(t *testing.T, b bundle, c statestore.ClaimedStep, payload string) (string, statestore.GraphResult, error) {
	t.Helper()
	reg, err := workflow.Parse("family.yaml", []byte(family))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("kyc_check")
	id := messages.DerivedID("child:" + c.IdempotencyKey)
	child := statestore.NewOrder{OrderID: id, Workflow: wf.Name, WorkflowVersion: wf.Version(), Payload: []byte(payload),
		PayloadHash: statestore.DerivedHash(wf.Name, []byte(payload)), FailurePolicy: wf.Policy, Steps: statestore.StepsOf(wf, 0), Actor: "s"}
	v := statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: "s"}
	res, err := b.store.StartChild(ctxFor(t), c, child, v, "s")
	return id, res, err
}

// runChild claims and answers the child's steps, ok, or failing the step
// named failing for good. It returns the steps of other orders it
// claimed (the parent's, once the child's end made them pending).
func runChild(t *testing.T, b bundle, childID, failing string) map[string]statestore.ClaimedStep {
	t.Helper()
	others := map[string]statestore.ClaimedStep{}
	for range 10 {
		claimed, err := b.store.ClaimPending(ctxFor(t), "s", 100, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) == 0 {
			break
		}
		for _, c := range claimed {
			if c.OrderID != childID {
				others[c.Name] = c
				continue
			}
			reply(t, b, c, c.Name != failing, `{"`+c.Name+`":true}`)
		}
	}
	return others
}

// TestChildEndsItsParentsStep: a sub-process step starts one child (the
// same again for a retried claim), awaits it, and ends with it: its
// result the child's results; the parent links to it and it to them.
func TestChildEndsItsParentsStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, family, "loan", `{"who":"ann"}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value":700}`)
	kyc := claimAll(t, b, o.OrderID)["kyc"]
	childID, _, err := startChild(t, b, kyc, `{"person":"ann"}`)
	if err != nil {
		t.Fatal(err)
	}
	// The same claim again changes nothing and starts no second child.
	if _, _, err := startChild(t, b, kyc, `{"person":"ann"}`); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("the claim again: %v", err)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE parent_order = $1`, o.OrderID); n != 1 {
		t.Fatalf("%d children", n)
	}
	if _, st := stepStates(t, b, o.OrderID); st["kyc"] != "awaiting" {
		t.Fatalf("the sub-process step is %s, want awaiting", st["kyc"])
	}
	parent, children, err := b.store.Family(ctxFor(t), childID)
	if err != nil || parent == nil || parent.OrderID != o.OrderID || parent.Step != kyc.Step || len(children) != 0 {
		t.Fatalf("the child's family: %+v %+v %v", parent, children, err)
	}
	next := runChild(t, b, childID, "")
	status, steps := stepsByName(t, b, o.OrderID)
	if status != statestore.OrderProcessing || steps["kyc"].ProcessState != statestore.StepProcessed ||
		!strings.Contains(string(steps["kyc"].Result), `"check_address": {"check_address": true}`) {
		t.Fatalf("parent %s, kyc %s with %s", status, steps["kyc"].ProcessState, steps["kyc"].Result)
	}
	reply(t, b, next["open_account"], true, `{}`)
	if status, _ := stepStates(t, b, o.OrderID); status != statestore.OrderCompleted {
		t.Fatalf("the parent is %s", status)
	}
	_, children, _ = b.store.Family(ctxFor(t), o.OrderID)
	if len(children) != 1 || children[0].OrderID != childID || children[0].Status != statestore.OrderCompleted || children[0].Workflow != "kyc_check" {
		t.Fatalf("the parent's children: %+v", children)
	}
}

// TestChildFailingUndoesItsParent: a child that fails for good undoes
// itself; its parent's step fails and the parent undoes what it did; the
// child's undo in the parent has nothing left to do, so the child is
// undone once.
func TestChildFailingUndoesItsParent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, family, "loan", `{"who":"bob"}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value":700}`)
	childID, _, err := startChild(t, b, claimAll(t, b, o.OrderID)["kyc"], `{"person":"bob"}`)
	if err != nil {
		t.Fatal(err)
	}
	next := runChild(t, b, childID, "check_address")
	if status, _ := stepStates(t, b, childID); status != statestore.OrderFailed {
		t.Fatalf("the child is %s", status)
	}
	status, steps := stepsByName(t, b, o.OrderID)
	if status != statestore.OrderCompensating || steps["kyc"].ProcessState != statestore.StepError ||
		!strings.Contains(steps["kyc"].LastError, "its child order "+childID+" failed: check_address") {
		t.Fatalf("parent %s, kyc %s: %s", status, steps["kyc"].ProcessState, steps["kyc"].LastError)
	}
	// The parent's undo of its child: nothing left to undo; then score's.
	undo := next["undo_kyc"]
	if _, err := b.store.UndoChild(ctxFor(t), undo, "s"); err != nil {
		t.Fatal(err)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["unscore"], true, "")
	if status, _ := stepStates(t, b, o.OrderID); status != statestore.OrderFailed {
		t.Fatalf("the parent is %s", status)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND to_state = 'compensating'`, childID); n != 1 {
		t.Fatalf("the child began undoing %d times", n)
	}
}

// TestCancellingAParentUndoesItsChild: an operator's cancel of a parent
// whose child runs undoes the child; a completed child of a parent undone
// later is undone too, and the parent ends once it is.
func TestCancellingAParentUndoesItsChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, family, "loan", `{"who":"cy"}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value":700}`)
	childID, _, err := startChild(t, b, claimAll(t, b, o.OrderID)["kyc"], `{"person":"cy"}`)
	if err != nil {
		t.Fatal(err)
	}
	// The child's first step is done, its second runs when the parent is
	// cancelled.
	reply(t, b, claimAll(t, b, childID)["check_id"], true, `{"id":1}`)
	second := claimAll(t, b, childID)["check_address"]
	if _, err := b.store.CancelOrder(ctx, o.OrderID, "op"); err != nil {
		t.Fatal(err)
	}
	if status, _ := stepStates(t, b, childID); status != statestore.OrderCompensating {
		t.Fatalf("the child of a cancelled parent is %s, want compensating", status)
	}
	// A list's step in flight is cancelled with its order: its reply is
	// stale.
	if _, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: childID, Step: second.Step, Attempt: second.Attempt, OK: true, Actor: "s"}); !errors.Is(err, statestore.ErrStale) {
		t.Fatalf("the reply of a cancelled step: %v", err)
	}
	// The parent's undo of its child and the child's own undo are both
	// pending: the parent's begins first, and awaits the child's.
	claimed, err := b.store.ClaimPending(ctx, "s", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]statestore.ClaimedStep{}
	for _, c := range claimed {
		byName[c.Name] = c
	}
	if _, err := b.store.UndoChild(ctx, byName["undo_kyc"], "s"); err != nil {
		t.Fatal(err)
	}
	if _, st := stepStates(t, b, o.OrderID); st["undo_kyc"] != "awaiting" {
		t.Fatalf("the parent's undo of its child is %s, want awaiting", st["undo_kyc"])
	}
	reply(t, b, byName["forget_id"], true, "")
	next := runChild(t, b, childID, "")
	if status, _ := stepStates(t, b, childID); status != statestore.OrderFailed {
		t.Fatalf("the child is %s, want failed (undone)", status)
	}
	reply(t, b, next["unscore"], true, "")
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderFailed || st["undo_kyc"] != statestore.StepProcessed {
		t.Fatalf("the parent is %s, its undo of the child %s", status, st["undo_kyc"])
	}
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND name = 'forget_id' AND process_state = 'processed'`, childID); n != 1 {
		t.Fatalf("the child's check_id undone %d times", n)
	}
}

// TestChildTooDeepIsRefused: a parent at the deepest depth a child may
// have starts no child (ErrTooDeep) and nothing changes; the scheduler
// then fails the step with the reason.
func TestChildTooDeepIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, family, "loan", `{"who":"dee"}`, statestore.PolicyCompensate)
	insert(t, b, o)
	if _, err := b.pool.Exec(ctxFor(t), `UPDATE orders SET depth = $2 WHERE order_id = $1`, o.OrderID, workflow.MaxDepth); err != nil {
		t.Fatal(err)
	}
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value":700}`)
	kyc := claimAll(t, b, o.OrderID)["kyc"]
	before := snapshot(t, b, o.OrderID)
	if _, _, err := startChild(t, b, kyc, `{"person":"dee"}`); !errors.Is(err, statestore.ErrTooDeep) {
		t.Fatalf("a child past the deepest depth: %v", err)
	}
	if after := snapshot(t, b, o.OrderID); after != before {
		t.Fatalf("a refused child changed the order:\nbefore %s\nafter  %s", before, after)
	}
	if n := count(t, b, `SELECT count(*) FROM orders WHERE parent_order = $1`, o.OrderID); n != 0 {
		t.Fatalf("%d children written", n)
	}
}

// TestAParentFailingLaterUndoesItsCompletedChild: a child that completed
// is undone when a later step of its parent fails for good: the parent's
// undo of it begins the child's compensation (completed to compensating,
// a move the door refused before migration 0051) and awaits it; the
// parent fails once the child is undone.
func TestAParentFailingLaterUndoesItsCompletedChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, family, "loan", `{"who":"dan"}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["score"], true, `{"value":700}`)
	childID, _, err := startChild(t, b, claimAll(t, b, o.OrderID)["kyc"], `{"person":"dan"}`)
	if err != nil {
		t.Fatal(err)
	}
	next := runChild(t, b, childID, "")
	if status, _ := stepStates(t, b, childID); status != statestore.OrderCompleted {
		t.Fatalf("the child is %s, want completed", status)
	}
	reply(t, b, next["open_account"], false, "")
	// open_account's request left: its own undo first, then the child's.
	reply(t, b, claimAll(t, b, o.OrderID)["close_account"], true, "")
	undo := claimAll(t, b, o.OrderID)["undo_kyc"]
	if _, err := b.store.UndoChild(ctxFor(t), undo, "s"); err != nil {
		t.Fatalf("undo a completed child: %v", err)
	}
	if status, _ := stepStates(t, b, childID); status != statestore.OrderCompensating {
		t.Fatalf("the child of a parent undone is %s, want compensating", status)
	}
	rest := runChild(t, b, childID, "")
	if status, _ := stepStates(t, b, childID); status != statestore.OrderFailed {
		t.Fatalf("the child is %s, want failed (undone)", status)
	}
	reply(t, b, rest["unscore"], true, "")
	if status, st := stepStates(t, b, o.OrderID); status != statestore.OrderFailed || st["undo_kyc"] != statestore.StepProcessed {
		t.Fatalf("the parent is %s, its undo of the child %s", status, st["undo_kyc"])
	}
}
