package statestore_test

import (
	"fmt"
	"testing"
	"time"

	"sas/internal/statestore"
)

// TestOrderNextDecides: the order_next function's answer for every kind of
// step end, as sql/20_steps.sql documents it.
func TestOrderNextDecides(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	cases := []struct {
		kind, status, policy string
		ok, hasNext          bool
		want                 string
	}{
		{"action", "processing", "compensate", true, true, "next"},
		{"action", "received", "hold", true, true, "next"},
		{"action", "processing", "compensate", true, false, "completed"},
		{"compensation", "compensating", "compensate", true, true, "next"},
		{"compensation", "compensating", "compensate", true, false, "failed"},
		{"action", "processing", "compensate", false, false, "compensate"},
		{"action", "processing", "hold", false, false, "error"},
		{"compensation", "compensating", "compensate", false, false, "error"},
		// The order moved on meanwhile: the step's end changes nothing.
		{"action", "compensating", "compensate", true, true, "none"},
		{"action", "compensating", "compensate", false, false, "none"},
		{"action", "completed", "hold", true, false, "none"},
		{"action", "error", "hold", false, false, "none"},
		{"compensation", "processing", "compensate", true, true, "none"},
		{"compensation", "error", "compensate", false, false, "none"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s ok=%v in %s, %s, next=%v", c.kind, c.ok, c.status, c.policy, c.hasNext), func(t *testing.T) {
			var got string
			if err := b.pool.QueryRow(ctx, `SELECT order_next($1, $2, $3, $4, $5)`, c.kind, c.ok, c.status, c.policy, c.hasNext).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("order_next = %q, want %q", got, c.want)
			}
		})
	}
}

// TestOneRuleDecidesWhatComesNext: with order_next changed, every path
// that ends a step follows it: a single ok reply, a batch of ok replies,
// a failed reply and the supervisor's failure at the threshold. (Were the
// rule written anywhere else too, one of them would go on as before.)
func TestOneRuleDecidesWhatComesNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	// A changed rule: an order never completes, and a failed step always
	// holds its order in error, whatever the policy.
	if _, err := b.pool.Exec(ctx, `CREATE OR REPLACE FUNCTION order_next(p_kind text, p_ok boolean, p_order_status text, p_policy text, p_has_next boolean)
		RETURNS text LANGUAGE sql IMMUTABLE AS $$
		SELECT CASE WHEN p_ok AND p_has_next THEN 'next' WHEN p_ok THEN 'none' ELSE 'error' END $$`); err != nil {
		t.Fatal(err)
	}
	status := func(orderID string) string {
		t.Helper()
		var s string
		if err := b.pool.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, orderID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("a single ok reply", func(t *testing.T) {
		o := order(1, time.Hour, 3)
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		res, err := b.store.ApplyReply(ctx, okReply(c))
		if err != nil || res.StepState != statestore.StepProcessed {
			t.Fatalf("apply: %+v %v", res, err)
		}
		if s := status(o.OrderID); s != statestore.OrderProcessing || res.OrderStatus != "" {
			t.Fatalf("the order is %s (result %q) after its last step, want it left processing by the changed rule", s, res.OrderStatus)
		}
	})

	t.Run("a batch of ok replies", func(t *testing.T) {
		var replies []statestore.Reply
		var ids []string
		for range 3 {
			o := order(1, time.Hour, 3)
			insert(t, b, o)
			ids = append(ids, o.OrderID)
			replies = append(replies, okReply(claimOf(t, b, o.OrderID)))
		}
		_, errs := b.store.ApplyReplies(ctx, replies)
		for i, id := range ids {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if s := status(id); s != statestore.OrderProcessing {
				t.Fatalf("order %d is %s after its last step, want it left processing by the changed rule", i, s)
			}
		}
	})

	t.Run("a failed reply", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyCompensate)
		insert(t, b, o)
		c := claimOf(t, b, o.OrderID)
		res, err := b.store.ApplyReply(ctx, statestore.Reply{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, Error: "refused", Actor: "s"})
		if err != nil || res.OrderStatus != statestore.OrderError || status(o.OrderID) != statestore.OrderError {
			t.Fatalf("the order under policy compensate: %+v %v, now %s; want error by the changed rule", res, err, status(o.OrderID))
		}
	})

	t.Run("the supervisor's failure", func(t *testing.T) {
		o := sagaOrder(statestore.PolicyCompensate)
		for i := range o.Steps {
			o.Steps[i].Timeout, o.Steps[i].MaxFailures = 50*time.Millisecond, 1
		}
		insert(t, b, o)
		claimOf(t, b, o.OrderID)
		waitExpired(t, b, o.OrderID)
		if _, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "supervisor:t", Limit: 100, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if s := status(o.OrderID); s != statestore.OrderError {
			t.Fatalf("the order under policy compensate is %s after the sweep, want error by the changed rule", s)
		}
	})
}
