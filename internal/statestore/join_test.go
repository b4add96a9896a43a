package statestore_test

import (
	"strings"
	"testing"

	"sas/internal/statestore"
)

// quorum is an N-of-M join: three checks at once, a decision once any two
// have ended well, and a step after it. a2 follows a, so a branch of the
// join is two steps long.
const quorum = `
workflows:
  - name: quorum
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: a2, agent: x, needs: [a], compensation: {action: undo_a2}}
      - {action: b, agent: x, needs: [], compensation: {action: undo_b}}
      - {action: c, agent: x, needs: [], compensation: {action: undo_c}}
      - {action: j, agent: x, needs: {any: 2, of: [a2, b, c]}, compensation: {action: undo_j}}
      - {action: k, agent: x, needs: [j]}
`

// TestJoinRunsOnceAnyNOfItsNeedsEnded: the join runs once two of its
// three branches ended well, the third still running; the order completes
// only when that one has ended too.
func TestJoinRunsOnceAnyNOfItsNeedsEnded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, quorum, "quorum", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	if names(first) != "a,b,c" {
		t.Fatalf("claimed at the start: %s, want a,b,c", names(first))
	}
	reply(t, b, first["b"], true, `{"b":1}`)
	if got := names(claimAll(t, b, o.OrderID)); got != "" {
		t.Fatalf("after one of three: claimed %s, want nothing (the join needs two)", got)
	}
	reply(t, b, first["c"], true, `{"c":1}`)
	second := claimAll(t, b, o.OrderID)
	if names(second) != "j" {
		t.Fatalf("after two of three: claimed %s, want j", names(second))
	}
	reply(t, b, second["j"], true, "")
	third := claimAll(t, b, o.OrderID)
	if names(third) != "k" {
		t.Fatalf("after j: claimed %s, want k", names(third))
	}
	if res := reply(t, b, third["k"], true, ""); res.OrderStatus != "" {
		t.Fatalf("k ended with a still running: order %q, want it to go on", res.OrderStatus)
	}
	reply(t, b, first["a"], true, "")
	last := claimAll(t, b, o.OrderID)
	if names(last) != "a2" {
		t.Fatalf("after a: claimed %s, want a2 (a branch is let finish)", names(last))
	}
	if res := reply(t, b, last["a2"], true, ""); res.OrderStatus != statestore.OrderCompleted {
		t.Fatalf("every step ended: order %q, want completed", res.OrderStatus)
	}
	if got := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 5 AND to_state = 'pending'`, o.OrderID); got != 1 {
		t.Fatalf("the join was made pending %d times, want once", got)
	}
}

// TestJoinSparesABranchItCanDoWithout: a branch that fails for good while
// the join can still reach its two is spared, with the step after it in
// the branch, under either failure policy; the order completes and
// nothing is undone.
func TestJoinSparesABranchItCanDoWithout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, policy := range []string{statestore.PolicyCompensate, statestore.PolicyHold} {
		o := graphOrder(t, quorum, "quorum", `{}`, policy)
		insert(t, b, o)
		first := claimAll(t, b, o.OrderID)
		if res := reply(t, b, first["a"], false, ""); res.OrderStatus != "" && res.OrderStatus != statestore.OrderProcessing {
			t.Fatalf("%s: a failed with b and c running: order %q, want it to go on", policy, res.OrderStatus)
		}
		status, steps := stepsByName(t, b, o.OrderID)
		if status != statestore.OrderProcessing || steps["a"].ProcessState != statestore.StepCancelled ||
			steps["a2"].ProcessState != statestore.StepCancelled || steps["a"].LastError == "" {
			t.Fatalf("%s: order %s, a %s (%q), a2 %s: want processing, a and a2 cancelled, a's error kept",
				policy, status, steps["a"].ProcessState, steps["a"].LastError, steps["a2"].ProcessState)
		}
		for step, why := range map[int]string{1: "failed for good; a join can do without it", 2: "a join no longer needs it"} {
			if got := count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = $2 AND to_state = 'cancelled' AND reason = $3`,
				o.OrderID, step, why); got != 1 {
				t.Fatalf("%s: step %d's history has %d moves to cancelled for %q", policy, step, got, why)
			}
		}
		reply(t, b, first["b"], true, "")
		reply(t, b, first["c"], true, "")
		j := claimAll(t, b, o.OrderID)
		reply(t, b, j["j"], true, "")
		k := claimAll(t, b, o.OrderID)
		if res := reply(t, b, k["k"], true, ""); res.OrderStatus != statestore.OrderCompleted {
			t.Fatalf("%s: every step that could run ended: order %q, want completed", policy, res.OrderStatus)
		}
		if got := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND kind = 'compensation' AND attempt > 0`, o.OrderID); got != 0 {
			t.Fatalf("%s: %d compensations ran for a completed order", policy, got)
		}
	}
}

// TestJoinFailsOnceItCanNoLongerReachN: a second branch failing leaves
// the join one short: the order is undone, the branch still in flight is
// let end and then undone, and the branch spared before is undone too (its
// request left), while the steps that never ran are not.
func TestJoinFailsOnceItCanNoLongerReachN(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := graphOrder(t, quorum, "quorum", `{}`, statestore.PolicyCompensate)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	reply(t, b, first["a"], false, "")
	if res := reply(t, b, first["b"], false, ""); res.OrderStatus != statestore.OrderCompensating {
		t.Fatalf("two of three failed: order %q, want compensating", res.OrderStatus)
	}
	comp := claimAll(t, b, o.OrderID)
	if names(comp) != "undo_a,undo_b" {
		t.Fatalf("claimed %s, want undo_a and undo_b (c still runs; a2, j and k never ran)", names(comp))
	}
	_, st := stepStates(t, b, o.OrderID)
	for _, n := range []string{"undo_a2", "undo_j"} {
		if st[n] != statestore.StepCancelled {
			t.Fatalf("steps %v: %s should be cancelled (its action never ran)", st, n)
		}
	}
	reply(t, b, first["c"], true, "")
	undoC := claimAll(t, b, o.OrderID)
	if names(undoC) != "undo_c" {
		t.Fatalf("after c ended: claimed %s, want undo_c", names(undoC))
	}
	reply(t, b, comp["undo_a"], true, "")
	reply(t, b, comp["undo_b"], true, "")
	if res := reply(t, b, undoC["undo_c"], true, ""); res.OrderStatus != statestore.OrderFailed {
		t.Fatalf("every compensation processed: order %q, want failed", res.OrderStatus)
	}
	var reason string
	if err := b.pool.QueryRow(ctxFor(t), `SELECT reason FROM transitions WHERE order_id = $1 AND step IS NULL AND to_state = 'compensating'`,
		o.OrderID).Scan(&reason); err != nil || !strings.Contains(reason, "step 3 failed") {
		t.Fatalf("the order was undone for %q (%v), want b's failure (step 3)", reason, err)
	}
}

// TestJoinDoesNotSpareWhatTheOrderNeeds: a branch whose failure leaves a
// step nothing follows unable to run (a leaf, here k after the join, or a
// branch's own last step) is not spared.
func TestJoinDoesNotSpareWhatTheOrderNeeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const leaf = `
workflows:
  - name: leaf
    steps:
      - {action: a, agent: x}
      - {action: a_note, agent: x, needs: [a]}
      - {action: b, agent: x, needs: []}
      - {action: c, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: 2, of: [a, b, c]}}
`
	o := graphOrder(t, leaf, "leaf", `{}`, statestore.PolicyHold)
	insert(t, b, o)
	first := claimAll(t, b, o.OrderID)
	if res := reply(t, b, first["a"], false, ""); res.OrderStatus != statestore.OrderError {
		t.Fatalf("a failed and a_note, which nothing needs, can no longer run: order %q, want held in error", res.OrderStatus)
	}
	if _, st := stepStates(t, b, o.OrderID); st["a"] != statestore.StepError || st["a_note"] != statestore.StepWaiting {
		t.Fatalf("steps %v: a in error and a_note waiting, as a hold leaves them", st)
	}
}

// TestAListAdvancesAsTheChainItIs: one machine moves lists and graphs
// (graph_advance): a list's order, its ok replies applied one by one
// through apply_reply (the path of a callback, or of a reply the batched
// statement could not apply), passes through the same moves for the
// same reasons as the same steps written as a graph's chain, forward and
// undone: its actions one by one, its compensations last first.
func TestAListAdvancesAsTheChainItIs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const file = `
workflows:
  - name: list
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, compensation: {action: undo_b}}
      - {action: c, agent: x, compensation: {action: undo_c}}
      - {action: d, agent: x}
  - name: chain
    steps:
      - {id: a, action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, needs: [a], compensation: {action: undo_b}}
      - {action: c, agent: x, needs: [b], compensation: {action: undo_c}}
      - {action: d, agent: x, needs: [c]}
`
	run := func(name string, failAt string) []string {
		o := graphOrder(t, file, name, `{}`, statestore.PolicyCompensate)
		if (o.Steps[1].Needs == nil) != (name == "list") {
			t.Fatalf("%s: needs %v", name, o.Steps[1].Needs)
		}
		insert(t, b, o)
		for range 8 {
			claimed := claimAll(t, b, o.OrderID)
			if len(claimed) > 1 {
				t.Fatalf("%s: claimed %s at once, want one by one", name, names(claimed))
			}
			if len(claimed) == 0 {
				break
			}
			for n, c := range claimed {
				var applied bool
				if err := b.pool.QueryRow(ctxFor(t), `SELECT applied FROM apply_reply($1, $2, $3, $4, NULL, $5, 's', now(), now(), 0, true, '')`,
					c.OrderID, c.Step, c.Attempt, n != failAt, "refused").Scan(&applied); err != nil || !applied {
					t.Fatalf("%s: reply to %s: %v %v", name, n, applied, err)
				}
			}
		}
		var moves []string
		rows, err := b.pool.Query(ctxFor(t), `SELECT coalesce(s.name, 'order') || ' ' || coalesce(t.from_state, '') || '>' || t.to_state || ' ' || t.reason
			FROM transitions t LEFT JOIN steps s ON s.order_id = t.order_id AND s.step = t.step WHERE t.order_id = $1 ORDER BY t.id`, o.OrderID)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var m string
			if err := rows.Scan(&m); err != nil {
				t.Fatal(err)
			}
			moves = append(moves, m)
		}
		return moves
	}
	for _, failAt := range []string{"", "c"} {
		list, chain := run("list", failAt), run("chain", failAt)
		if strings.Join(list, "\n") != strings.Join(chain, "\n") {
			t.Fatalf("failing at %q, the list moved\n%s\nthe chain\n%s", failAt, strings.Join(list, "\n"), strings.Join(chain, "\n"))
		}
		last := list[len(list)-1]
		if want := map[string]string{"": "order processing>completed every step ended", "c": "order compensating>failed every compensation processed"}[failAt]; last != want {
			t.Fatalf("failing at %q, the last move %q, want %q", failAt, last, want)
		}
	}
}
