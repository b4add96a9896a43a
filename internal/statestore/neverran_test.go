package statestore_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

const neverRanFile = `
workflows:
  - name: shapes
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: b, agent: x, needs: [a], when: "payload.go", compensation: {action: undo_b}}
  - name: items
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {action: each, agent: x, needs: [a], for_each: "payload.items", input: "{'n': item.n}", compensation: {action: undo_each}}
  - name: parent
    steps:
      - {action: a, agent: x, compensation: {action: undo_a}}
      - {id: sub, workflow: child, needs: [a]}
  - name: child
    steps:
      - {action: c, agent: x}
`

// endedUndone reads the order's ending event's undone list.
func endedUndone(t *testing.T, b bundle, orderID string) []string {
	t.Helper()
	var body []byte
	if err := b.pool.QueryRow(ctxFor(t), `SELECT body FROM outbox WHERE order_id = $1 AND body->>'status' IN ('failed', 'error')
		ORDER BY message_id DESC LIMIT 1`, orderID).Scan(&body); err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Undone []string `json:"undone"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Undone
}

// TestNothingIsUndoneThatNeverRan: a step sas fails before any request of
// it leaves (its when fails, an instance's input fails, its child is
// refused), or whose claim is cancelled, never had its compensation run;
// the order's other actions are undone, and the ending event lists only
// them. A step whose earlier attempt may have reached its service is
// still undone.
func TestNothingIsUndoneThatNeverRan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	// finish claims and answers the order's compensations until it ends.
	finish := func(id string) {
		t.Helper()
		for range 10 {
			c := claimAll(t, b, id)
			if len(c) == 0 {
				return
			}
			for _, s := range c {
				if s.Kind != statestore.KindCompensation {
					t.Fatalf("action %s claimed while the order is undone", s.Name)
				}
				reply(t, b, s, true, "")
			}
		}
	}
	cancelledAsNeverRan := func(id, comp string) {
		t.Helper()
		if n := count(t, b, `SELECT count(*) FROM steps s WHERE s.order_id = $1 AND s.name = $2 AND s.process_state = 'cancelled' AND s.attempt = 0
			AND EXISTS (SELECT 1 FROM transitions t WHERE t.order_id = s.order_id AND t.step = s.step AND t.reason = 'its action never ran')`,
			id, comp); n != 1 {
			_, st := stepStates(t, b, id)
			t.Fatalf("compensation %s not cancelled as never run: %v", comp, st)
		}
	}

	t.Run("a when that fails at run time", func(t *testing.T) {
		o := graphOrder(t, neverRanFile, "shapes", `{}`, statestore.PolicyCompensate)
		insert(t, b, o)
		reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
		bStep := claimAll(t, b, o.OrderID)["b"]
		if _, err := b.store.FailUnsent(ctx, bStep, "s", `when "payload.go": no such key: go`); err != nil {
			t.Fatal(err)
		}
		finish(o.OrderID)
		status, st := stepStates(t, b, o.OrderID)
		if status != statestore.OrderFailed || st["undo_a"] != statestore.StepProcessed {
			t.Fatalf("order %s, steps %v", status, st)
		}
		cancelledAsNeverRan(o.OrderID, "undo_b")
		if u := endedUndone(t, b, o.OrderID); !slices.Equal(u, []string{"a"}) {
			t.Fatalf("the ending event lists %v as undone, want [a]", u)
		}
	})

	t.Run("an instance whose input fails", func(t *testing.T) {
		o := graphOrder(t, neverRanFile, "items", `{"items":[{"n":1},{"m":2}]}`, statestore.PolicyCompensate)
		insert(t, b, o)
		reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
		each := claimAll(t, b, o.OrderID)["each"]
		if _, err := b.store.ExpandStep(ctx, each, []json.RawMessage{json.RawMessage(`{"n":1}`), json.RawMessage(`{"m":2}`)}, "s"); err != nil {
			t.Fatal(err)
		}
		c := claimAll(t, b, o.OrderID)
		reply(t, b, c["each[0]"], true, "")
		if _, err := b.store.FailUnsent(ctx, c["each[1]"], "s", `input "{'n': item.n}": no such key: n`); err != nil {
			t.Fatal(err)
		}
		finish(o.OrderID)
		status, steps := stepsByName(t, b, o.OrderID)
		if status != statestore.OrderFailed {
			t.Fatalf("order %s", status)
		}
		var undone, neverRan int
		for _, s := range steps {
			if s.Name == "undo_each" && s.Index != nil {
				switch {
				case *s.Index == 0 && s.ProcessState == statestore.StepProcessed:
					undone++
				case *s.Index == 1 && s.ProcessState == statestore.StepCancelled && s.Attempt == 0:
					neverRan++
				}
			}
		}
		if undone != 1 || neverRan != 1 {
			t.Fatalf("instance 0 undone %d, instance 1's undo cancelled %d; want 1 and 1", undone, neverRan)
		}
		if u := endedUndone(t, b, o.OrderID); !slices.Equal(u, []string{"a", "each"}) {
			t.Fatalf("the ending event lists %v as undone, want [a each]", u)
		}
	})

	t.Run("a child refused", func(t *testing.T) {
		o := graphOrder(t, neverRanFile, "parent", `{}`, statestore.PolicyCompensate)
		insert(t, b, o)
		reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
		sub := claimAll(t, b, o.OrderID)["sub"]
		if _, err := b.store.FailUnsent(ctx, sub, "s", "workflow child refuses the child's payload"); err != nil {
			t.Fatal(err)
		}
		finish(o.OrderID)
		status, st := stepStates(t, b, o.OrderID)
		if status != statestore.OrderFailed || st["undo_a"] != statestore.StepProcessed {
			t.Fatalf("order %s, steps %v", status, st)
		}
		cancelledAsNeverRan(o.OrderID, "undo_sub")
		if u := endedUndone(t, b, o.OrderID); !slices.Equal(u, []string{"a"}) {
			t.Fatalf("the ending event lists %v as undone, want [a]", u)
		}
	})

	t.Run("a step whose earlier attempt may have run", func(t *testing.T) {
		// b's first attempt was claimed (its request may have left) and
		// ran out of time; its second fails before sending: it may have
		// acted, so it is undone.
		o := graphOrder(t, neverRanFile, "shapes", `{"go":true}`, statestore.PolicyCompensate)
		insert(t, b, o)
		reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
		first := claimAll(t, b, o.OrderID)["b"]
		testenv.Forge(t, b.pool, `UPDATE steps SET process_state = 'pending', locked_by = NULL, complete_by = NULL
			WHERE order_id = $1 AND step = $2`, o.OrderID, first.Step)
		second := claimAll(t, b, o.OrderID)["b"]
		if second.Attempt != 2 {
			t.Fatalf("attempt %d", second.Attempt)
		}
		if _, err := b.store.FailUnsent(ctx, second, "s", "when failed"); err != nil {
			t.Fatal(err)
		}
		finish(o.OrderID)
		status, st := stepStates(t, b, o.OrderID)
		if status != statestore.OrderFailed || st["undo_a"] != statestore.StepProcessed || st["undo_b"] != statestore.StepProcessed {
			t.Fatalf("order %s, steps %v", status, st)
		}
	})

	t.Run("a stale answer changes nothing", func(t *testing.T) {
		o := graphOrder(t, neverRanFile, "shapes", `{}`, statestore.PolicyCompensate)
		insert(t, b, o)
		a := claimAll(t, b, o.OrderID)["a"]
		stale := a
		stale.Attempt++
		if _, err := b.store.FailUnsent(ctx, stale, "s", "x"); !errors.Is(err, statestore.ErrStale) {
			t.Fatalf("a stale answer: %v", err)
		}
		if n := count(t, b, `SELECT unsent_attempts FROM steps WHERE order_id = $1 AND step = $2`, o.OrderID, a.Step); n != 0 {
			t.Fatalf("unsent_attempts %d after a stale answer", n)
		}
	})
}
