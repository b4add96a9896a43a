package statestore_test

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// graphOrder is an order of the named workflow of the file, laid out as
// the submitter lays it out.
func graphOrder(t *testing.T, file, name, payload, policy string) statestore.NewOrder {
	t.Helper()
	return graphOrders(t, file, name, payload, policy, 1)[0]
}

// graphOrders is n orders as graphOrder makes them, the file read once.
func graphOrders(t *testing.T, file, name, payload, policy string, n int) []statestore.NewOrder {
	t.Helper()
	reg, err := workflow.Parse("graph.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup(name)
	out := make([]statestore.NewOrder, n)
	for i := range out {
		id := messages.NewID()
		h := sha256.Sum256([]byte(id))
		out[i] = statestore.NewOrder{OrderID: id, Workflow: name, Payload: []byte(payload), PayloadHash: h[:], Steps: stepsOf(wf),
			Actor: "test", FailurePolicy: policy}
	}
	return out
}

const diamond = `
workflows:
  - name: diamond
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, needs: [], compensation: {action: undo_b}}
      - {action: j, agent: x, needs: [a, b], compensation: {action: undo_j}}
      - {action: k, agent: x, needs: [b]}
`

// claimAll claims every due step of the order, by name.
func claimAll(t *testing.T, b bundle, orderID string) map[string]statestore.ClaimedStep {
	t.Helper()
	claimed, err := b.store.ClaimPending(ctxFor(t), "s", 100, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]statestore.ClaimedStep{}
	for _, c := range claimed {
		if c.OrderID == orderID {
			key := c.Name
			if c.Index != nil {
				key = fmt.Sprintf("%s[%d]", c.Name, *c.Index)
			}
			out[key] = c
		}
	}
	return out
}

func names(m map[string]statestore.ClaimedStep) string {
	var ns []string
	for n := range m {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(ns, ",")
}

func reply(t *testing.T, b bundle, c statestore.ClaimedStep, ok bool, result string) statestore.ApplyResult {
	t.Helper()
	r := statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: ok, Actor: "s"}
	if ok && result != "" {
		r.Result = []byte(result)
	}
	if !ok {
		r.Error = "refused"
	}
	res, err := b.store.ApplyReply(ctxFor(t), r)
	if err != nil {
		t.Fatalf("reply to %s (step %d): %v", c.Name, c.Step, err)
	}
	return res
}

// stepsByName reads the order's status and its steps, by name (an
// instance as name[index]).
func stepsByName(t *testing.T, b bundle, orderID string) (string, map[string]statestore.Step) {
	t.Helper()
	d, err := b.store.GetOrder(ctxFor(t), orderID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]statestore.Step{}
	for _, st := range d.Steps {
		key := st.Name
		if st.Index != nil {
			key = fmt.Sprintf("%s[%d]", st.Name, *st.Index)
		}
		out[key] = st
	}
	return d.Order.Status, out
}

func stepStates(t *testing.T, b bundle, orderID string) (string, map[string]string) {
	t.Helper()
	status, steps := stepsByName(t, b, orderID)
	out := map[string]string{}
	for k, st := range steps {
		out[k] = st.ProcessState
	}
	return status, out
}

func TestGraphRunsBranchesAtOnceAndJoinsAfterBoth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, diamond, "diamond", `{"n":1}`, statestore.PolicyCompensate)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	if names(first) != "a,b" {
		t.Fatalf("claimed at the start: %s, want a,b", names(first))
	}
	if res := reply(t, b, first["b"], true, `{"b":1}`); res.NextStep == 0 {
		t.Fatalf("b processed made nothing pending (k needs only b): %+v", res)
	}
	second := claimAll(t, b, o.OrderID)
	if names(second) != "k" {
		t.Fatalf("after b: claimed %s, want k (j still needs a)", names(second))
	}
	reply(t, b, first["a"], true, `{"a":1}`)
	third := claimAll(t, b, o.OrderID)
	if names(third) != "j" {
		t.Fatalf("after a: claimed %s, want j", names(third))
	}
	if got := string(third["j"].Results); got != `{"a": {"a": 1}, "b": {"b": 1}}` {
		t.Fatalf("j's results %s, want a's and b's", got)
	}
	if got := string(second["k"].Results); got != `{"b": {"b": 1}}` {
		t.Fatalf("k's results %s, want b's only (a is not its ancestor)", got)
	}
	reply(t, b, third["j"], true, "")
	if status, _ := stepStates(t, b, o.OrderID); status != statestore.OrderProcessing {
		t.Fatalf("order %s with k still running", status)
	}
	res := reply(t, b, second["k"], true, "")
	if res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("last step ended: order %q, want completed", res.OrderStatus)
	}
}

// TestGraphJoinUnderConcurrentReplies ends both branches of many orders
// at once, from several goroutines: every join is made pending once.
func TestGraphJoinUnderConcurrentReplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	var orders []statestore.NewOrder
	for range n {
		o := graphOrder(t, diamond, "diamond", `{}`, statestore.PolicyCompensate)
		insert(t, b, o)
		orders = append(orders, o)
	}
	claimed, err := b.store.ClaimPending(ctxFor(t), "s", 1000, "")
	if err != nil || len(claimed) != 2*n {
		t.Fatalf("claimed %d (%v), want %d", len(claimed), err, 2*n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(claimed))
	for _, c := range claimed {
		wg.Go(func() {
			_, err := b.store.ApplyReplies(ctxFor(t), []statestore.Reply{{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s"}})
			errs <- err[0]
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range orders {
		if got := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND name = 'j' AND process_state = 'pending'`, o.OrderID); got != 1 {
			t.Fatalf("order %s: join pending %d times", o.OrderID, got)
		}
		if got := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 3 AND to_state = 'pending'`, o.OrderID); got != 1 {
			t.Fatalf("order %s: join made pending %d times", o.OrderID, got)
		}
	}
}

func TestGraphFailureUndoesEveryBranchAfterItsStepsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, diamond, "diamond", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	// b fails for good while a is in flight: nothing new starts, a is let
	// end, and only then is it undone.
	res := reply(t, b, first["b"], false, "")
	if res.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("b failed: order %q, want compensating", res.OrderStatus)
	}
	comp := claimAll(t, b, o.OrderID)
	if names(comp) != "undo_b" {
		t.Fatalf("claimed %s, want undo_b only (a still runs, j and k never ran)", names(comp))
	}
	_, st := stepStates(t, b, o.OrderID)
	if st["j"] != statestore.StepCancelled || st["k"] != statestore.StepCancelled || st["undo_j"] != statestore.StepCancelled {
		t.Fatalf("steps %v: j, k and undo_j should be cancelled", st)
	}
	reply(t, b, first["a"], true, "")
	if got := names(claimAll(t, b, o.OrderID)); got != "undo_a" {
		t.Fatalf("after a ended: claimed %s, want undo_a", got)
	}
	reply(t, b, comp["undo_b"], true, "")
	_, st = stepStates(t, b, o.OrderID)
	if st["undo_a"] != statestore.StepProcessing {
		t.Fatalf("undo_a %s", st["undo_a"])
	}
	d, _ := b.store.GetOrder(ctxFor(t), o.OrderID)
	var undoA statestore.ClaimedStep
	for _, s := range d.Steps {
		if s.Name == "undo_a" {
			undoA = statestore.ClaimedStep{OrderID: o.OrderID, Step: s.Step, Attempt: s.Attempt, Name: s.Name}
		}
	}
	if res := reply(t, b, undoA, true, ""); res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("every compensation processed: order %q, want failed", res.OrderStatus)
	}
}

const chain = `
workflows:
  - name: chain
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, needs: [a], compensation: {action: undo_b}}
      - {action: c, agent: x, needs: [b], when: "payload.go", compensation: {action: undo_c}}
      - {action: d, agent: x, needs: [c], compensation: {action: undo_d}}
`

// TestGraphUndoesAStepAfterTheStepsThatNeededIt: compensations of a
// chain run last first; a skipped step is not undone.
func TestGraphUndoesAStepAfterTheStepsThatNeededIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, chain, "chain", `{"go":false}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
	reply(t, b, claimAll(t, b, o.OrderID)["b"], true, "")
	c := claimAll(t, b, o.OrderID)["c"]
	if _, err := b.store.SkipStep(ctxFor(t), c, "s", "when is false"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SkipStep(ctxFor(t), c, "s", "when is false"); err == nil {
		t.Fatal("a second skip of the same attempt was applied")
	}
	d := claimAll(t, b, o.OrderID)["d"]
	if d.Step == 0 {
		t.Fatal("d did not run after c was skipped")
	}
	reply(t, b, d, false, "")
	var order []string
	for range 3 {
		got := claimAll(t, b, o.OrderID)
		if len(got) != 1 {
			_, st := stepStates(t, b, o.OrderID)
			t.Fatalf("claimed %s at once, want one compensation at a time (%v)", names(got), st)
		}
		for n, c := range got {
			order = append(order, n)
			reply(t, b, c, true, "")
		}
	}
	if got := strings.Join(order, ","); got != "undo_d,undo_b,undo_a" {
		t.Fatalf("undone %s, want undo_d,undo_b,undo_a (undo_c cancelled: c was skipped)", got)
	}
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderFailed || st["undo_c"] != statestore.StepCancelled {
		t.Fatalf("order %s, steps %v", status, st)
	}
}

const fanOut = `
workflows:
  - name: fan
    steps:
      - {action: prep, agent: x}
      - action: book
        agent: x
        for_each: payload.parcels
        max_parallel: 2
        compensation: {action: unbook}
      - {action: after, agent: x, needs: [book]}
`

func TestGraphForEachRunsInstancesBoundedAndCollectsResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, fanOut, "fan", `{"parcels":["p0","p1","p2"]}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["prep"], true, "")
	book := claimAll(t, b, o.OrderID)["book"]
	items := []json.RawMessage{[]byte(`"p0"`), []byte(`"p1"`), []byte(`"p2"`)}
	if _, err := b.store.ExpandStep(ctxFor(t), book, items, "s"); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, b, o.OrderID)
	if names(got) != "book[0],book[1]" {
		t.Fatalf("claimed %s, want book[0],book[1] (max_parallel 2)", names(got))
	}
	if string(got["book[1]"].Item) != `"p1"` || got["book[1]"].IdempotencyKey != book.IdempotencyKey+"/1" {
		t.Fatalf("instance 1: item %s key %s", got["book[1]"].Item, got["book[1]"].IdempotencyKey)
	}
	reply(t, b, got["book[1]"], true, `{"n":1}`)
	third := claimAll(t, b, o.OrderID)
	if names(third) != "book[2]" {
		t.Fatalf("claimed %s, want book[2]", names(third))
	}
	reply(t, b, third["book[2]"], true, `{"n":2}`)
	if names(claimAll(t, b, o.OrderID)) != "" {
		t.Fatal("after ran before every instance ended")
	}
	reply(t, b, got["book[0]"], true, `{"n":0}`)
	after := claimAll(t, b, o.OrderID)["after"]
	if string(after.Results) != `{"book": [{"n": 0}, {"n": 1}, {"n": 2}], "prep": null}` && string(after.Results) != `{"book": [{"n": 0}, {"n": 1}, {"n": 2}]}` {
		t.Fatalf("after's results %s, want book's list in item order", after.Results)
	}
	if res := reply(t, b, after, true, ""); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("order %q", res.OrderStatus)
	}
}

func TestGraphForEachFailureUndoesTheInstancesThatRan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, fanOut, "fan", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["prep"], true, "")
	book := claimAll(t, b, o.OrderID)["book"]
	items := []json.RawMessage{[]byte(`1`), []byte(`2`), []byte(`3`), []byte(`4`)}
	if _, err := b.store.ExpandStep(ctxFor(t), book, items, "s"); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, b, o.OrderID)
	reply(t, b, got["book[0]"], true, "")
	third := claimAll(t, b, o.OrderID)["book[2]"]
	if res := reply(t, b, got["book[1]"], false, ""); res.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("an instance failed: order %q", res.OrderStatus)
	}
	// book[0] ran and book[1] failed: both are undone; book[2] is in
	// flight, so it is undone once it ends; book[3] never ran.
	comp := claimAll(t, b, o.OrderID)
	if names(comp) != "unbook[0],unbook[1]" {
		t.Fatalf("claimed %s, want unbook[0],unbook[1]", names(comp))
	}
	reply(t, b, third, true, "")
	last := claimAll(t, b, o.OrderID)
	if names(last) != "unbook[2]" {
		t.Fatalf("claimed %s, want unbook[2]", names(last))
	}
	for _, c := range []statestore.ClaimedStep{comp["unbook[0]"], comp["unbook[1]"], last["unbook[2]"]} {
		if c.Undoes != fmt.Sprintf("%s/%d", book.IdempotencyKey, *c.Index) {
			t.Fatalf("%s undoes %q", c.Name, c.Undoes)
		}
		reply(t, b, c, true, "")
	}
	status, st := stepStates(t, b, o.OrderID)
	if status != statestore.OrderFailed || st["unbook[3]"] != statestore.StepCancelled || st["unbook"] != statestore.StepCancelled {
		t.Fatalf("order %s, steps %v", status, st)
	}
	var undone []string
	for k, v := range st {
		if strings.HasPrefix(k, "unbook[") && v == statestore.StepProcessed {
			undone = append(undone, k)
		}
	}
	slices.Sort(undone)
	if strings.Join(undone, ",") != "unbook[0],unbook[1],unbook[2]" {
		t.Fatalf("undone %v", undone)
	}
}

const rerunGraph = `
workflows:
  - name: rerun
    steps:
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - action: book
        agent: x
        needs: [a]
        for_each: payload.parcels
        compensation: {action: unbook}
      - {action: after, agent: x, needs: [book], compensation: {action: unafter}}
      - {action: last, agent: x, needs: [after, b]}
`

// keysOf returns the idempotency key of each step of the order, by name.
func keysOf(t *testing.T, b bundle, orderID string) map[string]string {
	t.Helper()
	_, steps := stepsByName(t, b, orderID)
	out := map[string]string{}
	for k, st := range steps {
		out[k] = st.IdempotencyKey
	}
	return out
}

func TestGraphResubmitOfAChosenStepRunsItAndWhatDependsOnIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, rerunGraph, "rerun", `{}`, statestore.PolicyHold)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	reply(t, b, first["a"], true, `{"v":1}`)
	reply(t, b, first["b"], true, `{"v":1}`)
	book := claimAll(t, b, o.OrderID)["book"]
	items := []json.RawMessage{[]byte(`1`), []byte(`2`)}
	if _, err := b.store.ExpandStep(ctx, book, items, "s"); err != nil {
		t.Fatal(err)
	}
	inst := claimAll(t, b, o.OrderID)
	reply(t, b, inst["book[0]"], true, "")
	reply(t, b, inst["book[1]"], true, "")
	if res := reply(t, b, claimAll(t, b, o.OrderID)["after"], false, ""); res.OrderStatus != statestore.OrderError {
		t.Fatalf("after failed under hold: order %q", res.OrderStatus)
	}
	before := keysOf(t, b, o.OrderID)

	// An instance is not a step to choose; nor is a step still waiting.
	if _, err := b.store.Resubmit(ctx, o.OrderID, inst["book[0]"].Step, "operator"); !errors.Is(err, statestore.ErrInvalidState) ||
		!strings.Contains(err.Error(), "choose the step") {
		t.Fatalf("resubmit of an instance: %v", err)
	}
	if _, err := b.store.Resubmit(ctx, o.OrderID, 5, "operator"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("resubmit of a waiting step: %v", err)
	}

	reset, err := b.store.Resubmit(ctx, o.OrderID, 1, "operator")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(reset) != "[1 3 4 5]" {
		t.Fatalf("reset %v, want a and what depends on it: [1 3 4 5]", reset)
	}
	status, st := stepStates(t, b, o.OrderID)
	want := map[string]string{"a": "pending", "b": "processed", "book": "waiting", "after": "waiting", "last": "waiting",
		"unbook": "waiting", "unafter": "waiting"}
	if status != statestore.OrderProcessing || !maps.Equal(st, want) {
		t.Fatalf("after the resubmit: order %s, steps %v, want %v (the instances gone, unbook back)", status, st, want)
	}
	keys := keysOf(t, b, o.OrderID)
	if keys["a"] == before["a"] || keys["book"] == before["book"] || keys["after"] != before["after"] || keys["b"] != before["b"] {
		t.Fatalf("keys before %v, after %v: a processed step runs again with a new key, a failed one keeps its own", before, keys)
	}

	a := claimAll(t, b, o.OrderID)
	if names(a) != "a" || a["a"].IdempotencyKey != keys["a"] {
		t.Fatalf("claimed %s", names(a))
	}
	reply(t, b, a["a"], true, `{"v":2}`)
	book = claimAll(t, b, o.OrderID)["book"]
	if _, err := b.store.ExpandStep(ctx, book, []json.RawMessage{[]byte(`1`), []byte(`2`), []byte(`3`)}, "s"); err != nil {
		t.Fatal(err)
	}
	inst2 := claimAll(t, b, o.OrderID)
	if names(inst2) != "book[0],book[1],book[2]" {
		t.Fatalf("claimed %s", names(inst2))
	}
	for k, c := range inst2 {
		if c.IdempotencyKey == before[k] || !strings.HasPrefix(c.IdempotencyKey, keys["book"]+"/") {
			t.Fatalf("%s runs again with key %s (first run %s)", k, c.IdempotencyKey, before[k])
		}
		reply(t, b, c, true, "")
	}
	reply(t, b, claimAll(t, b, o.OrderID)["after"], true, "")
	if res := reply(t, b, claimAll(t, b, o.OrderID)["last"], true, ""); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("order %q", res.OrderStatus)
	}
	status, st = stepStates(t, b, o.OrderID)
	if st["unbook[2]"] != statestore.StepWaiting || st["unbook"] != statestore.StepCancelled || len(st) != 13 {
		t.Fatalf("order %s, steps %v: the new instances have their compensations, the step's gave them its place", status, st)
	}
}

func TestGraphResubmitPutsBackEveryBranchInError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := graphOrder(t, diamond, "diamond", `{}`, statestore.PolicyHold)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	if res := reply(t, b, first["a"], false, ""); res.OrderStatus != statestore.OrderError {
		t.Fatalf("order %q", res.OrderStatus)
	}
	reply(t, b, first["b"], false, "") // in flight, let end: it failed too
	// Two branches failed; resubmitting one alone would leave the other
	// holding the order for ever.
	reset, err := b.store.Resubmit(ctx, o.OrderID, 1, "operator")
	if err != nil || fmt.Sprint(reset) != "[1 2]" {
		t.Fatalf("reset %v (%v), want both failed steps [1 2]", reset, err)
	}
	again := claimAll(t, b, o.OrderID)
	if names(again) != "a,b" {
		t.Fatalf("claimed %s", names(again))
	}
	reply(t, b, again["a"], true, "")
	reply(t, b, again["b"], true, "")
	last := claimAll(t, b, o.OrderID)
	if names(last) != "j,k" {
		t.Fatalf("claimed %s", names(last))
	}
	reply(t, b, last["j"], true, "")
	if res := reply(t, b, last["k"], true, ""); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("order %q", res.OrderStatus)
	}
}

func TestGraphEndingEventNamesWhatWasSkippedAndUndone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const file = `
workflows:
  - name: fan
    steps:
      - {action: prep, agent: x}
      - {action: review, agent: x, when: payload.n > 5}
      - action: book
        agent: x
        needs: [prep]
        for_each: payload.parcels
        max_parallel: 2
        compensation: {action: unbook}
`
	o := graphOrder(t, file, "fan", `{"n": 1, "parcels": [1, 2, 3]}`, statestore.PolicyCompensate)
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["prep"], true, "")
	next := claimAll(t, b, o.OrderID)
	if _, err := b.store.SkipStep(ctxFor(t), next["review"], "s", "when is false"); err != nil {
		t.Fatal(err)
	}
	items := []json.RawMessage{[]byte(`1`), []byte(`2`), []byte(`3`)}
	if _, err := b.store.ExpandStep(ctxFor(t), next["book"], items, "s"); err != nil {
		t.Fatal(err)
	}
	inst := claimAll(t, b, o.OrderID)
	reply(t, b, inst["book[0]"], true, "")
	reply(t, b, inst["book[1]"], false, "")
	for _, c := range claimAll(t, b, o.OrderID) {
		reply(t, b, c, true, "")
	}
	ev := endingEvent(t, b, o.OrderID, statestore.OrderFailed)
	if !slices.Equal(ev.Undone, []string{"book"}) || !slices.Equal(ev.Skipped, []string{"review"}) {
		t.Fatalf("the ending event says undone %v, skipped %v; want [book] (its two instances once) and [review]", ev.Undone, ev.Skipped)
	}
}
