package statestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/migrations"
)

// TestMigrationConvertsOrdersInEveryState: orders written before opaque
// payloads (customer, items, amount and currency columns), one in every
// status with steps in every state, come out of migration 0017 with those
// four in their payload and everything else as it was; the pending step
// of the received one is then claimed with that payload.
func TestMigrationConvertsOrdersInEveryState(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	_, pool := testenv.EmptyDatabase(t)
	all, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	cut := 0
	for i, m := range all {
		if m.Version < 17 {
			cut = i + 1
		}
	}
	if _, err := statestore.MigrateSchema(ctx, pool, all[:cut]); err != nil {
		t.Fatal(err)
	}
	states := map[string][]string{
		"received":     {"pending", "waiting"},
		"processing":   {"processed", "processing"},
		"completed":    {"processed", "processed"},
		"compensating": {"processed", "error", "pending"},
		"failed":       {"error", "processed"},
		"error":        {"processed", "error"},
	}
	ids := map[string]string{}
	for status, steps := range states {
		id := messages.NewID()
		ids[status] = id
		if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id, workflow, customer, items, amount, currency, payload_hash, status, failure_policy)
			VALUES ($1::uuid, 'order', $2, '[{"sku":"sku-1","qty":2}]', 1234, 'EUR', $4, $3, 'compensate')`,
			id, "customer of "+status, status, make([]byte, 32)); err != nil {
			t.Fatal(err)
		}
		for i, st := range steps {
			kind, lockedBy, completeBy, result := "action", any(nil), any(nil), any(nil)
			if i == 2 {
				kind = "compensation"
			}
			if st == "processing" {
				lockedBy, completeBy = "s", "2100-01-01T00:00:00Z"
			}
			if st == "processed" {
				result = fmt.Sprintf(`{"step":%d}`, i+1)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO steps (order_id, step, name, kind, agent, process_state, timeout, max_failures,
				idempotency_key, locked_by, complete_by, result, compensates)
				VALUES ($1::uuid, $2, $3, $4, 'inventory', $5, interval '10s', 5, $9, $6, $7, $8,
				        CASE WHEN $4 = 'compensation' THEN 1 END)`,
				id, i+1, fmt.Sprintf("step_%d", i+1), kind, st, lockedBy, completeBy, result, fmt.Sprintf("%s/%d", id, i+1)); err != nil {
				t.Fatalf("%s step %d: %v", status, i+1, err)
			}
		}
	}
	if _, err := statestore.Migrate(ctx, pool, all); err != nil {
		t.Fatal(err)
	}
	store := statestore.New(pool)
	for status, id := range ids {
		d, err := store.GetOrder(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var p map[string]any
		if err := json.Unmarshal(d.Order.Payload, &p); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`map[amount:1234 currency:EUR customer:customer of %s items:[map[qty:2 sku:sku-1]]]`, status)
		if got := fmt.Sprint(p); got != want || d.Order.Status != status || len(d.Steps) != len(states[status]) {
			t.Fatalf("%s: payload %s, status %s, %d steps", status, got, d.Order.Status, len(d.Steps))
		}
		for i, st := range d.Steps {
			if st.ProcessState != states[status][i] {
				t.Fatalf("%s step %d is %s, want %s", status, i+1, st.ProcessState, states[status][i])
			}
		}
	}
	claimed, err := store.ClaimPending(context.Background(), "s", 10, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]statestore.ClaimedStep{}
	for _, c := range claimed {
		got[c.OrderID] = c
	}
	c, ok := got[ids["received"]]
	if !ok || string(c.Payload) != `{"items": [{"qty": 2, "sku": "sku-1"}], "amount": 1234, "currency": "EUR", "customer": "customer of received"}` {
		t.Fatalf("claimed %+v", claimed)
	}
	// The compensating order's compensation gets the results before it and
	// the one of the action it undoes.
	if c := got[ids["compensating"]]; c.Step != 3 || string(c.Results) != `{"step_1": {"step": 1}}` || string(c.UndoneResult) != `{"step": 1}` {
		t.Fatalf("compensation claimed as %+v", c)
	}
}

// TestEndingStatusEventCarriesResults: the event that ends an order
// carries its actions' results by name, whether the last reply was applied
// alone or in a batch (whose statement writes the last result itself).
func TestEndingStatusEventCarriesResults(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		b := setup(t)
		ctx := ctxFor(t)
		o := sagaOrder(statestore.PolicyCompensate)
		insert(t, b, o)
		for step := 1; step <= 3; step++ {
			claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
			if err != nil || len(claimed) != 1 {
				t.Fatalf("claim: %v %v", claimed, err)
			}
			c := claimed[0]
			r := statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true,
				Result: fmt.Appendf(nil, `{"id":"r%d"}`, c.Step), Actor: "s"}
			if batched {
				_, errs := b.store.ApplyReplies(ctx, []statestore.Reply{r})
				err = errs[0]
			} else {
				_, err = b.store.ApplyReply(ctx, r)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		var body []byte
		if err := b.pool.QueryRow(ctx, `SELECT body FROM outbox WHERE order_id = $1 AND body->>'status' = 'completed'`, o.OrderID).Scan(&body); err != nil {
			t.Fatal(err)
		}
		ev, err := messages.DecodeStatusEvent(body)
		if err != nil {
			t.Fatal(err)
		}
		var results map[string]struct{ ID string }
		if err := json.Unmarshal(ev.Results, &results); err != nil {
			t.Fatalf("batched %v: %s: %v", batched, body, err)
		}
		if results["reserve_inventory"].ID != "r1" || results["charge_payment"].ID != "r2" || results["create_shipment"].ID != "r3" {
			t.Fatalf("batched %v: results %s", batched, ev.Results)
		}
	}
}

// TestStepBackoffOverridesTheSupervisors: a step whose workflow sets its
// own backoff waits that long after a reset; a step without one waits the
// supervisor's.
func TestStepBackoffOverridesTheSupervisors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	own := order(1, 10*time.Millisecond, 5)
	own.Steps[0].BackoffBase, own.Steps[0].BackoffMax = time.Hour, 2*time.Hour
	plain := order(1, 10*time.Millisecond, 5)
	insert(t, b, own)
	insert(t, b, plain)
	if claimed, err := b.store.ClaimPending(ctx, "s", 10, ""); err != nil || len(claimed) != 2 {
		t.Fatalf("claimed %v (%v)", claimed, err)
	}
	waitExpired(t, b, own.OrderID)
	waitExpired(t, b, plain.OrderID)
	if swept, err := b.store.SweepExpired(ctx, statestore.SweepParams{Actor: "sup", Limit: 10,
		BackoffBase: time.Second, BackoffMax: time.Minute}); err != nil || len(swept) != 2 {
		t.Fatalf("swept %v (%v)", swept, err)
	}
	wait := func(id string) time.Duration {
		var secs float64
		if err := b.pool.QueryRow(ctx, `SELECT extract(epoch FROM available_at - now()) FROM steps WHERE order_id = $1`, id).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	if w := wait(own.OrderID); w < 59*time.Minute || w > time.Hour {
		t.Fatalf("the step with its own backoff waits %v, want its 1h base", w)
	}
	if w := wait(plain.OrderID); w <= 0 || w > time.Second {
		t.Fatalf("the step without one waits %v, want the supervisor's 1s base", w)
	}
}
