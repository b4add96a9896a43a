package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/harness/chaos"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// checkSaga checks the remote ledger against every order's outcome
// (invariant 5): a completed order had each action applied once and none
// undone; a failed order has exactly one undo effect for each action that
// was applied and none for actions that were not. In a graph, a skipped
// step and a for_each step itself call no service (its instances do, each
// under its own key). It returns how many orders completed and failed.
func (p pipeline) checkSaga(t *testing.T, ids []string) (completed, failed int) {
	t.Helper()
	status := map[string]string{}
	rows, err := p.pool.Query(context.Background(), `SELECT order_id::text, status FROM orders WHERE order_id = ANY($1::uuid[])`, ids)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			t.Fatal(err)
		}
		status[id] = st
	}
	known := map[string]bool{}
	all, err := p.pool.Query(context.Background(), `SELECT order_id::text FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	for all.Next() {
		var id string
		if err := all.Scan(&id); err != nil {
			t.Fatal(err)
		}
		known[id] = true
	}
	applied, undone := map[string]bool{}, map[string]int{}
	for _, e := range p.ledger(t) {
		switch {
		case e.Effects > 1:
			t.Errorf("key %s applied %d times", e.Key, e.Effects)
		case e.Voided && e.Effects > 0:
			t.Errorf("key %s applied although its undo voided it", e.Key)
		case e.Effects == 1 && e.Undoes != "":
			undone[e.Undoes]++
		case e.Effects == 1:
			applied[e.Key] = true
		}
		if e.Effects > 0 && !known[e.OrderID] {
			t.Errorf("effect %s for order %s that was never submitted here", e.Key, e.OrderID)
		}
	}
	rows, err = p.pool.Query(context.Background(), `SELECT order_id::text, idempotency_key, process_state FROM steps WHERE kind = 'action' AND order_id = ANY($1::uuid[])
		AND process_state <> 'skipped' AND NOT coalesce(spec ? 'for_each', false) AND agent <> ''`, ids) // a wait or timer calls no service
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, key, state string
		if err := rows.Scan(&id, &key, &state); err != nil {
			t.Fatal(err)
		}
		switch status[id] {
		case statestore.OrderCompleted:
			if state == statestore.StepCancelled {
				// a branch an N-of-M join spared: applied or not (a
				// refusal applies nothing), never undone
				if undone[key] != 0 {
					t.Errorf("completed order %s: spared action %s undone %d times", id, key, undone[key])
				}
				continue
			}
			if !applied[key] || undone[key] != 0 {
				t.Errorf("completed order %s: action %s applied %v, undone %d times", id, key, applied[key], undone[key])
			}
		case statestore.OrderFailed:
			want := 0
			if applied[key] {
				want = 1
			}
			if undone[key] != want {
				t.Errorf("failed order %s: action %s applied %v, undone %d times", id, key, applied[key], undone[key])
			}
		default:
			t.Errorf("order %s is %s, not completed or failed", id, status[id])
		}
	}
	for _, st := range status {
		switch st {
		case statestore.OrderCompleted:
			completed++
		case statestore.OrderFailed:
			failed++
		}
	}
	return completed, failed
}

// TestFiveHundredOrdersSucceedOrFailAsAWhole: the payment is refused for
// good for some orders, the shipment for others, and transient faults hit
// every endpoint, undo endpoints included. Every order ends completed or
// failed, and the ledger shows exactly the undo effects it should.
func TestFiveHundredOrdersSucceedOrFailAsAWhole(t *testing.T) {
	t.Parallel()
	var ids, refuseCharge, refuseShip []string
	for i := range 500 {
		id := messages.NewID()
		ids = append(ids, id)
		switch i % 5 {
		case 1:
			refuseCharge = append(refuseCharge, id)
		case 2:
			refuseShip = append(refuseShip, id)
		}
	}
	charge, _ := json.Marshal(refuseCharge)
	ship, _ := json.Marshal(refuseShip)
	transient := `"error_rate":0.1,"rate_limit_rate":0.03,"apply_then_fail_rate":0.03,"latency_max_ms":3`
	p := newPipeline(t, pipelineOpts{supervisors: 1, faults: `{"*":{` + transient + `},` +
		`"charge_payment":{` + transient + `,"fail_orders":` + string(charge) + `},` +
		`"create_shipment":{` + transient + `,"fail_orders":` + string(ship) + `}}`})
	ch := amqpChannel(t)
	began := time.Now()
	for _, id := range ids {
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitJSON(id)))
	}
	p.waitTerminal(t, ids, 4*time.Minute)
	took := time.Since(began)
	completed, failed := p.checkSaga(t, ids)
	p.checkInvariants(t, ids)
	if completed != 300 || failed != 200 {
		t.Fatalf("%d completed and %d failed, want 300 and 200", completed, failed)
	}
	undos := 0
	for _, e := range p.ledger(t) {
		if e.Undoes != "" && e.Effects == 1 {
			undos++
		}
	}
	// Refused payments undo one reservation each; refused shipments a
	// reservation and a payment each.
	if undos != len(refuseCharge)+2*len(refuseShip) {
		t.Fatalf("%d undo effects, want %d", undos, len(refuseCharge)+2*len(refuseShip))
	}
	retries := sum(t, p.agents, `sas_agent_retries_total{endpoint="refund_payment",reason="5xx"}`) +
		sum(t, p.agents, `sas_agent_retries_total{endpoint="release_inventory",reason="5xx"}`)
	if retries == 0 {
		t.Fatal("no transient fault hit an undo endpoint")
	}
	t.Logf("500 orders ended in %v: %d completed, %d failed, %d undo effects; undo endpoints retried %v times after 5xx",
		took.Round(time.Millisecond), completed, failed, undos, retries)
}

// TestCancelInFlightOrder: an operator cancels an order while its payment
// call is in progress. The payment lands after the cancel; its reply is
// refused; the refund waits for it and then undoes it; the order fails
// with every applied action undone once.
func TestCancelInFlightOrder(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{supervisors: 1, faults: `{"charge_payment":{"latency_min_ms":3000,"latency_max_ms":3000}}`})
	ch := amqpChannel(t)
	statusQueue := p.topo.Prefix + "cancel-status"
	if _, err := ch.QueueDeclare(statusQueue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = amqpChannel(t).QueueDelete(statusQueue, false, false, false) })
	ids := p.submitOrders(t, 1, "--reply-to", statusQueue)
	testenv.Eventually(t, 30*time.Second, "the payment in progress", func() bool {
		e, ok := p.callInFlight(t)
		return ok && e.Action == "charge_payment"
	})
	out, errOut, code := sasctl(t, p.env, "orders", "cancel", ids[0])
	if code != 0 || !strings.Contains(out, "undoing") {
		t.Fatalf("cancel: exit %d: %s %s", code, out, errOut)
	}
	p.waitTerminal(t, ids, time.Minute)
	if _, failed := p.checkSaga(t, ids); failed != 1 {
		t.Fatal("the cancelled order did not fail")
	}
	p.checkInvariants(t, ids)
	refund := p.stepOf(t, ids[0], 5)
	if refund.Name != "refund_payment" || refund.ProcessState != statestore.StepProcessed {
		t.Fatalf("refund step %+v", refund)
	}
	// The order's status events tell the whole story, in order.
	var got []string
	for _, d := range drain(t, ch, statusQueue, 4, 30*time.Second) {
		ev, err := messages.DecodeStatusEvent(d.Body)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.Status)
	}
	if strings.Join(got, ",") != "received,processing,compensating,failed" {
		t.Fatalf("status events %v", got)
	}
	t.Logf("undo waited %v times for the payment in flight", p.remote.metric(t, `sas_remote_requests_total{action="refund_payment",outcome="undo_waits"}`))
}

// TestHoldPolicyThenResubmit: under the hold policy a refused payment holds
// the order in error, with an alert; once the cause is fixed, an
// operator's resubmit completes it, and nothing is undone.
func TestHoldPolicyThenResubmit(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	p := newPipeline(t, pipelineOpts{supervisors: 1, faults: `{"charge_payment":{"fail_orders":["` + id + `"]}}`})
	body := strings.Replace(badinput.ValidSubmitJSON(id), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)
	publish(t, amqpChannel(t), p.submit, messages.ContentType, id, []byte(body))
	p.waitTerminal(t, []string{id}, time.Minute)
	if status := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, id); status != 1 {
		t.Fatal("the refused order is not held in error")
	}
	// The refusal (a permanent 4xx) raised one alert, counting that one
	// failure of the step.
	if al := openAlerts(t, p.env, id); len(al) != 1 || al[0].FailureCount != 1 || al[0].Step == nil || *al[0].Step != 2 {
		t.Fatalf("open alerts of the refused order: %+v", al)
	}
	p.setFaults(t, `{}`)
	if out, errOut, code := sasctl(t, p.env, "orders", "resubmit", id); code != 0 {
		t.Fatalf("resubmit: %s %s", out, errOut)
	}
	p.waitTerminal(t, []string{id}, time.Minute)
	if completed, _ := p.checkSaga(t, []string{id}); completed != 1 {
		t.Fatal("the resubmitted order did not complete")
	}
}

// TestCompensationThatKeepsFailingNeedsAPerson: the shipment is refused, so
// the order is compensated; but the refund endpoint is down, so the
// refund's attempts run out: the order is held in error with an alert.
func TestCompensationThatKeepsFailingNeedsAPerson(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	p := newPipeline(t, pipelineOpts{supervisors: 1,
		faults:       `{"create_shipment":{"fail_orders":["` + id + `"]},"refund_payment":{"error_rate":1}}`,
		submitterEnv: []string{"SAS_STEP_TIMEOUT=1s"}})
	publish(t, amqpChannel(t), p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitJSON(id)))
	testenv.Eventually(t, 2*time.Minute, "the order held in error", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, id) == 1
	})
	refund := p.stepOf(t, id, 5)
	if refund.Name != "refund_payment" || refund.ProcessState != statestore.StepError || refund.FailureCount != refund.MaxFailures {
		t.Fatalf("refund step %+v", refund)
	}
	if al := openAlerts(t, p.env, id); len(al) != 1 || !strings.Contains(al[0].Reason, "compensation failed") || al[0].FailureCount != refund.MaxFailures {
		t.Fatalf("open alerts of the order: %+v", al)
	}
	out, _, _ := sasctl(t, p.env, "orders", "show", id)
	if !strings.Contains(out, "status    error") || !strings.Contains(flat(out), fmt.Sprintf("compensation step %d failed", 5)) {
		t.Fatalf("orders show:\n%s", out)
	}
}

// checkInvariants runs the fault-run checker over this pipeline's whole
// history: the orders the test confirmed, the store, the remote ledger.
func (p pipeline) checkInvariants(t *testing.T, confirmed []string) chaos.Result {
	t.Helper()
	h := chaos.History{Confirmed: map[string]bool{}}
	for _, id := range confirmed {
		h.Confirmed[id] = true
	}
	// Invariant 9 holds once the relays have caught up: the events of the
	// last orders to end may still be on their way. Wait for that (up to
	// a deadline; after it, the check reports what is left).
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if p.count(t, `SELECT count(*) FROM outbox`) == 0 {
			break
		}
	}
	audit, err := statestore.New(p.pool).ReadAudit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := chaos.Check(h, audit, p.ledger(t))
	for _, v := range r.Violations {
		t.Errorf("%v", v)
	}
	return r
}
