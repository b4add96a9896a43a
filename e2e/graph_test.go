package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// fulfilFile is the graph of issue 37: stock and card at once, a parcel
// booked per package after both, a review only above an amount.
const fulfilFile = `
workflows:
  - name: fulfil
    policy: compensate
    steps:
      - action: reserve_stock
        agent: inventory
        timeout: 20s
        compensation: {action: release_stock}
      - action: charge_card
        agent: payment
        timeout: 20s
        needs: []
        input: "{'amount': payload.amount}"
        compensation: {action: refund_card}
      - action: book_parcel
        agent: shipping
        timeout: 20s
        needs: [reserve_stock, charge_card]
        for_each: payload.parcels
        max_parallel: 5
        input: "{'parcel': item, 'n': index, 'charge': results.charge_card.confirmation}"
        compensation: {action: cancel_parcel}
      - action: manual_review
        agent: review
        timeout: 20s
        needs: [charge_card]
        when: payload.amount > 100000
  - name: fulfil_hold
    policy: hold
    steps:
      - {action: reserve_stock, agent: inventory, timeout: 20s, compensation: {action: release_stock}}
      - {action: charge_card, agent: payment, timeout: 20s, needs: [], compensation: {action: refund_card}}
      - {action: book_parcel, agent: shipping, timeout: 20s, needs: [reserve_stock, charge_card]}
`

type graphRun struct {
	*pipeline
	reg  *workflow.Registry
	file string // the workflows file's path
}

func newGraphRun(t *testing.T, faults string, schedulers int) graphRun {
	t.Helper()
	return runFile(t, "fulfil.yaml", fulfilFile, pipelineOpts{supervisors: 1, agents: 2, schedulers: schedulers, faults: faults,
		remoteEnv: []string{"SAS_REMOTE_KEEP_REQUESTS=true"}})
}

// runFile starts a pipeline on a stack of its own whose services read the
// workflows file text (written as name), with an agent for every kind it
// names; o says the rest.
func runFile(t *testing.T, name, text string, o pipelineOpts) graphRun {
	t.Helper()
	file := writeFile(t, name, text)
	reg, err := workflow.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	kinds := reg.Agents()
	st := newStackFor(t, kinds)
	wf := "SAS_WORKFLOWS_FILE=" + file
	o.on = &st
	o.submitterEnv = append(o.submitterEnv, wf)
	o.schedulerEnv = append(o.schedulerEnv, wf)
	o.supervisorEnv = append(o.supervisorEnv, wf)
	o.agentEnv = append(o.agentEnv, wf, "SAS_AGENT_KINDS="+strings.Join(kinds, ","))
	return graphRun{pipeline: newPipeline(t, o), reg: reg, file: file}
}

func (g graphRun) submit(t *testing.T, workflowName string, payloads []string) []string {
	t.Helper()
	ids := make([]string, len(payloads))
	for i := range ids {
		ids[i] = messages.NewID()
	}
	g.submitIDs(t, workflowName, ids, payloads)
	return ids
}

// submitIDs submits one order per payload under the ids given.
func (g graphRun) submitIDs(t *testing.T, workflowName string, ids, payloads []string) {
	t.Helper()
	ch := amqpChannel(t)
	for i, payload := range payloads {
		publish(t, ch, g.pipeline.submit, messages.ContentType, ids[i], []byte(badinput.ValidSubmitV2JSON(ids[i], workflowName, payload)))
	}
}

// TestGraphFulfilRunsBranchesAtOnceUnderFaults: 300 orders of the fulfil
// graph with 20% transient faults all complete; stock and card overlap in
// time; each join is made pending once, after both its needs ended; a
// parcel is booked per package with its item, index and input; the review
// runs only above the amount; every key is applied once.
func TestGraphFulfilRunsBranchesAtOnceUnderFaults(t *testing.T) {
	t.Parallel()
	g := newGraphRun(t, `{"*":{"error_rate":0.2,"latency_min_ms":5,"latency_max_ms":20}}`, 1)
	var payloads []string
	parcels := map[int]int{}
	for i := range 300 {
		amount := 500
		if i%4 == 0 {
			amount = 200000
		}
		n := 1 + i%3
		parcels[i] = n
		var ps []string
		for k := range n {
			ps = append(ps, fmt.Sprintf(`"p%d-%d"`, i, k))
		}
		payloads = append(payloads, fmt.Sprintf(`{"amount":%d,"parcels":[%s]}`, amount, strings.Join(ps, ",")))
	}
	ids := g.submit(t, "fulfil", payloads)
	g.waitTerminal(t, ids, 4*time.Minute)
	if n := g.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != len(ids) {
		t.Fatalf("%d of %d orders completed\n%s", n, len(ids), g.stuck(t, ids))
	}
	if completed, _ := g.checkSaga(t, ids); completed != len(ids) {
		t.Fatalf("saga: %d completed", completed)
	}
	// Branches overlap: charge_card was claimed before reserve_stock was
	// processed, and the other way round.
	overlap := g.count(t, `
		WITH span AS (
			SELECT t.order_id, s.name, min(t.at) FILTER (WHERE t.to_state = 'processing') AS began,
			       max(t.at) FILTER (WHERE t.to_state = 'processed') AS ended
			FROM transitions t JOIN steps s ON s.order_id = t.order_id AND s.step = t.step
			WHERE t.order_id = ANY($1::uuid[]) AND s.name IN ('reserve_stock', 'charge_card')
			GROUP BY 1, 2)
		SELECT count(*) FROM span a JOIN span b ON a.order_id = b.order_id AND a.name = 'reserve_stock' AND b.name = 'charge_card'
		WHERE a.began < b.ended AND b.began < a.ended`, ids)
	if overlap < len(ids)*8/10 {
		t.Fatalf("stock and card overlapped in %d of %d orders: the branches did not run at once", overlap, len(ids))
	}
	// Each join was made pending once, after both its needs ended.
	if n := g.count(t, `
		SELECT count(*) FROM (
			SELECT t.order_id FROM transitions t JOIN steps s ON s.order_id = t.order_id AND s.step = t.step
			WHERE t.order_id = ANY($1::uuid[]) AND s.name = 'book_parcel' AND s.parent IS NULL AND t.to_state = 'pending'
			GROUP BY 1 HAVING count(*) = 1) once`, ids); n != len(ids) {
		t.Fatalf("the join was made pending once in %d of %d orders", n, len(ids))
	}
	if n := g.count(t, `
		SELECT count(*) FROM transitions j JOIN steps js ON js.order_id = j.order_id AND js.step = j.step AND js.name = 'book_parcel' AND js.parent IS NULL
		WHERE j.order_id = ANY($1::uuid[]) AND j.to_state = 'processing'
		  AND EXISTS (SELECT 1 FROM transitions n JOIN steps ns ON ns.order_id = n.order_id AND ns.step = n.step
		              WHERE n.order_id = j.order_id AND ns.name IN ('reserve_stock', 'charge_card') AND n.to_state = 'processed' AND n.id > j.id)`, ids); n != 0 {
		t.Fatalf("%d joins were claimed before both their needs were processed", n)
	}
	// when: reviewed above the amount, skipped below.
	reviewed := g.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'manual_review' AND process_state = 'processed'`, ids)
	skipped := g.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'manual_review' AND process_state = 'skipped'`, ids)
	if reviewed != 75 || skipped != 225 {
		t.Fatalf("manual_review processed %d, skipped %d; want 75 and 225", reviewed, skipped)
	}
	// One parcel booked per package; the step's result lists theirs.
	wantInstances := 0
	for _, n := range parcels {
		wantInstances += n
	}
	if n := g.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'book_parcel' AND parent IS NOT NULL AND process_state = 'processed'`, ids); n != wantInstances {
		t.Fatalf("%d parcels booked, want %d", n, wantInstances)
	}
	if n := g.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'book_parcel' AND parent IS NULL
		AND jsonb_array_length(result) = jsonb_array_length((SELECT payload->'parcels' FROM orders o WHERE o.order_id = steps.order_id))`, ids); n != len(ids) {
		t.Fatalf("%d of %d for_each results list every parcel", n, len(ids))
	}
	// The requests: the card gets its input; each parcel its item, index
	// and an input built from them and the card's result.
	seen := 0
	for _, e := range g.ledger(t) {
		if e.Effects != 1 {
			continue
		}
		r := requestOf(t, e.Request)
		switch r.Action {
		case "charge_card":
			var in struct{ Amount int }
			if json.Unmarshal(r.Input, &in) != nil || (in.Amount != 500 && in.Amount != 200000) {
				t.Fatalf("charge_card input %s", r.Input)
			}
		case "book_parcel":
			var in struct {
				Parcel string
				N      int
				Charge string
			}
			if r.Index == nil || json.Unmarshal(r.Input, &in) != nil || in.N != *r.Index || `"`+in.Parcel+`"` != string(r.Item) ||
				!strings.HasSuffix(e.Key, fmt.Sprintf("/%d", *r.Index)) || in.Charge == "" {
				t.Fatalf("book_parcel request: key %s index %v item %s input %s", e.Key, r.Index, r.Item, r.Input)
			}
			seen++
		}
	}
	if seen != wantInstances {
		t.Fatalf("%d parcel requests in the ledger, want %d", seen, wantInstances)
	}
	// sasctl orders show draws the graph: joins, instances, skips.
	out, errOut, code := sasctl(t, g.env, "orders", "show", ids[1])
	for _, want := range []string{"RUNS AFTER", "join of steps 1, 2", "book_parcel[1]", "instance 1 of step 3", "skipped", "step 2"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("orders show lacks %q (exit %d):\n%s%s", want, code, out, errOut)
		}
	}
	// The console's order page draws it too, branch beside branch.
	c := startConsole(t, g.stack)
	ctx := browser(t)
	login(t, ctx, c.url, "alice", "alice's password")
	waitStatus(t, ctx, c.url, ids[1], "completed")
	if n := eval[int](t, ctx, `document.querySelectorAll("#graph .level").length`); n != 2 {
		t.Fatalf("the graph has %d levels, want 2", n)
	}
	if got := text(t, ctx, "#level-0"); !strings.Contains(got, "1. reserve_stock") || !strings.Contains(got, "2. charge_card") {
		t.Fatalf("level 0 shows %q, want both branches", got)
	}
	// The process drawn with its edges: a box an action, the join's two
	// arrows.
	if boxes, arrows := eval[int](t, ctx, `document.querySelectorAll("#process a.gnode").length`),
		eval[int](t, ctx, `document.querySelectorAll("#process path.edge").length`); boxes < 3 || arrows < 2 {
		t.Fatalf("the process drawing has %d boxes and %d arrows", boxes, arrows)
	}
	// Its timeline: a row a step, each with a bar; the parcels' instances
	// on one row with their count.
	if rows := eval[int](t, ctx, `document.querySelectorAll("#timeline g.row").length`); rows < 3 ||
		eval[int](t, ctx, `document.querySelectorAll("#timeline rect").length`) < rows {
		t.Fatalf("the timeline has %d rows", rows)
	}
	if got := eval[string](t, ctx, `document.querySelector("#timeline").textContent`); !strings.Contains(got, "book_parcel ×") {
		t.Fatalf("the timeline does not gather the parcels' instances: %q", got)
	}
	if got := text(t, ctx, "#node-3 .after"); got != "joins 1 + 2" {
		t.Fatalf("the join shows %q", got)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll("#node-3 .instances li").length`); n != 2 {
		t.Fatalf("the for_each step shows %d instances, want 2", n)
	}
	if got := text(t, ctx, "#node-4 .state"); got != "skipped" {
		t.Fatalf("manual_review shows %q, want skipped", got)
	}
}

// TestSasctlChecksAGraph: `sasctl workflows check` prints a graph level by
// level, with its joins, and refuses a cycle at its line.
func TestSasctlChecksAGraph(t *testing.T) {
	t.Parallel()
	good := writeFile(t, "fulfil.yaml", fulfilFile)
	out, errOut, code := sasctl(t, env(), "workflows", "check", good)
	if code != 0 || !strings.Contains(out, "level 0: reserve_stock (undo release_stock), charge_card (undo refund_card)") ||
		!strings.Contains(out, "level 1: book_parcel (joins reserve_stock + charge_card; for each of payload.parcels, 5 at once") ||
		!strings.Contains(out, "manual_review (after charge_card; when payload.amount > 100000)") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	bad := writeFile(t, "cycle.yaml", strings.Replace(fulfilFile, "needs: []\n", "needs: [book_parcel]\n", 1))
	out, _, code = sasctl(t, env(), "workflows", "check", bad)
	if code == 0 || !strings.Contains(out, "cycle.yaml:13: the steps charge_card → book_parcel → charge_card form a cycle") {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

// TestGraphBranchFailingForGoodUndoesTheOtherBranch: the card is refused
// for good for a third of the orders: the stock reserved beside it is
// released once, nothing after them ran, nothing else is undone.
func TestGraphBranchFailingForGoodUndoesTheOtherBranch(t *testing.T) {
	t.Parallel()
	var payloads []string
	for range 60 {
		payloads = append(payloads, `{"amount":500,"parcels":["a","b"]}`)
	}
	// The refused orders are chosen after the ids exist: the fault is
	// read when the remote starts, so submit first to a stack without
	// agents, then start them.
	file := writeFile(t, "fulfil.yaml", fulfilFile)
	reg, _ := workflow.Load(file)
	kinds := reg.Agents()
	st := newStackFor(t, kinds)
	wf := "SAS_WORKFLOWS_FILE=" + file
	ids := make([]string, len(payloads))
	var refused []string
	for i := range ids {
		ids[i] = messages.NewID()
		if i%3 == 0 {
			refused = append(refused, ids[i])
		}
	}
	refusedJSON, _ := json.Marshal(refused)
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1, agents: 2,
		faults:       `{"*":{"latency_min_ms":5,"latency_max_ms":30},"charge_card":{"latency_min_ms":5,"latency_max_ms":30,"fail_orders":` + string(refusedJSON) + `}}`,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=" + strings.Join(kinds, ",")}})
	ch := amqpChannel(t)
	for i, id := range ids {
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, "fulfil", payloads[i])))
	}
	p.waitTerminal(t, ids, 3*time.Minute)
	completed, failed := p.checkSaga(t, ids)
	if completed != 40 || failed != 20 {
		t.Fatalf("%d completed, %d failed; want 40 and 20\n%s", completed, failed, p.stuck(t, ids))
	}
	// In each failed order: the stock released once, the card's undo
	// asked (it has nothing to undo), no parcel booked or cancelled.
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'release_stock' AND process_state = 'processed'`, refused); n != 20 {
		t.Fatalf("release_stock processed in %d of 20 failed orders", n)
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name IN ('book_parcel', 'cancel_parcel', 'manual_review')
		AND process_state NOT IN ('cancelled')`, refused); n != 0 {
		t.Fatalf("%d steps after the failed branch did not stay cancelled", n)
	}
	for _, e := range p.ledger(t) {
		if e.Action == "cancel_parcel" && e.Effects > 0 {
			t.Fatalf("a parcel was cancelled (%s) though none was booked", e.Key)
		}
	}
}

// quoteFile asks three carriers at once and chooses a price once any two
// answered.
const quoteFile = `
workflows:
  - name: quote
    steps:
      - {action: ask_dhl, agent: carriers, timeout: 20s, compensation: {action: forget_dhl}}
      - {action: ask_ups, agent: carriers, timeout: 20s, needs: [], compensation: {action: forget_ups}}
      - {action: ask_gls, agent: carriers, timeout: 20s, needs: [], compensation: {action: forget_gls}}
      - action: choose_price
        agent: pricing
        timeout: 20s
        needs: {any: 2, of: [ask_dhl, ask_ups, ask_gls]}
`

// TestGraphJoinOfAnyTwoSparesARefusedBranch: a carrier refuses a third of
// the orders for good, and another a sixth: an order with one refusal
// completes with the refused branch spared, one with two is undone; the
// join runs once two branches ended. sasctl and the console draw it.
func TestGraphJoinOfAnyTwoSparesARefusedBranch(t *testing.T) {
	t.Parallel()
	// The refused orders are named in the remote's faults as it starts:
	// their ids are chosen first.
	ids := make([]string, 36)
	var gls, ups []string
	for i := range ids {
		ids[i] = messages.NewID()
		if i%3 == 0 {
			gls = append(gls, ids[i])
		}
		if i%6 == 0 {
			ups = append(ups, ids[i])
		}
	}
	glsJSON, _ := json.Marshal(gls)
	upsJSON, _ := json.Marshal(ups)
	g := runFile(t, "quote.yaml", quoteFile, pipelineOpts{supervisors: 1, agents: 2,
		faults: `{"*":{"latency_min_ms":5,"latency_max_ms":30},"ask_gls":{"latency_max_ms":30,"fail_orders":` + string(glsJSON) +
			`},"ask_ups":{"latency_max_ms":30,"fail_orders":` + string(upsJSON) + `}}`})
	p := g.pipeline
	ch := amqpChannel(t)
	for _, id := range ids {
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, "quote", `{}`)))
	}
	p.waitTerminal(t, ids, 3*time.Minute)
	completed, failed := p.checkSaga(t, ids)
	if completed != 30 || failed != 6 {
		t.Fatalf("%d completed, %d failed; want 30 and 6\n%s", completed, failed, p.stuck(t, ids))
	}
	if n := p.count(t, `SELECT count(*) FROM steps s JOIN orders o USING (order_id) WHERE s.order_id = ANY($1::uuid[])
		AND o.status = 'completed' AND s.name = 'ask_gls' AND s.process_state = 'cancelled' AND s.last_error <> ''`, ids); n != 6 {
		t.Fatalf("%d completed orders spared their refused ask_gls, want 6", n)
	}
	// The join ran once in every completed order, after two branches.
	if n := p.count(t, `SELECT count(*) FROM transitions j JOIN steps s ON s.order_id = j.order_id AND s.step = j.step AND s.name = 'choose_price'
		WHERE j.order_id = ANY($1::uuid[]) AND j.to_state = 'processing'
		  AND (SELECT count(*) FROM transitions n JOIN steps ns ON ns.order_id = n.order_id AND ns.step = n.step
		       WHERE n.order_id = j.order_id AND ns.name LIKE 'ask_%' AND n.to_state = 'processed' AND n.id < j.id) >= 2`, ids); n != 30 {
		t.Fatalf("the join was claimed after two branches ended %d times, want 30", n)
	}
	spared := gls[1]
	out, errOut, code := sasctl(t, p.env, "orders", "show", spared)
	for _, want := range []string{"any 2 of steps 1, 2, 3", "cancelled", "completed"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("orders show lacks %q (exit %d):\n%s%s", want, code, out, errOut)
		}
	}
	out, errOut, code = sasctl(t, env(), "workflows", "check", g.file)
	if code != 0 || !strings.Contains(out, "choose_price (joins any 2 of ask_dhl + ask_ups + ask_gls)") {
		t.Fatalf("workflows check (exit %d):\n%s%s", code, out, errOut)
	}
	c := startConsole(t, p.stack)
	ctx := browser(t)
	login(t, ctx, c.url, "alice", "alice's password")
	waitStatus(t, ctx, c.url, spared, "completed")
	if got := text(t, ctx, "#node-4 .after"); got != "joins any 2 of 1 + 2 + 3" {
		t.Fatalf("the join shows %q", got)
	}
	if got := text(t, ctx, "#node-3 .state"); got != "cancelled" {
		t.Fatalf("the spared branch shows %q", got)
	}
}

// forEachFile books 50 parcels at once; one is refused for good.
const forEachFile = `
workflows:
  - name: parcels
    steps:
      - {action: prepare, agent: shipping, timeout: 20s, compensation: {action: unprepare}}
      - action: book_parcel
        agent: shipping
        timeout: 20s
        for_each: payload.parcels
        max_parallel: 50
        compensation: {action: cancel_parcel}
`

// TestGraphForEachItemFailingForGoodUndoesTheOthers: of 50 parcels, one
// is refused for good: the 49 others, booked meanwhile, are cancelled once
// each, and the step before them is undone last.
func TestGraphForEachItemFailingForGoodUndoesTheOthers(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "parcels.yaml", forEachFile)
	st := newStackFor(t, []string{"shipping"})
	wf := "SAS_WORKFLOWS_FILE=" + file
	id := messages.NewID()
	// Rows: 1 prepare, 2 book_parcel, 3 cancel_parcel, 4 unprepare.
	failKey := statestore.IdempotencyKey(id, 2, "book_parcel") + "/17"
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1, agents: 1,
		faults:       `{"*":{"latency_min_ms":2,"latency_max_ms":5},"book_parcel":{"latency_min_ms":300,"latency_max_ms":400,"fail_keys":["` + failKey + `"]}}`,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=shipping", "SAS_AGENT_CONCURRENCY=64"}})
	var parcels []string
	for i := range 50 {
		parcels = append(parcels, fmt.Sprintf(`"p%d"`, i))
	}
	publish(t, amqpChannel(t), p.submit, messages.ContentType, id,
		[]byte(badinput.ValidSubmitV2JSON(id, "parcels", `{"parcels":[`+strings.Join(parcels, ",")+`]}`)))
	p.waitTerminal(t, []string{id}, 2*time.Minute)
	if _, failed := p.checkSaga(t, []string{id}); failed != 1 {
		t.Fatalf("the order did not fail\n%s", p.stuck(t, []string{id}))
	}
	booked, cancelled := 0, map[string]int{}
	var unpreparedAt, lastCancel time.Time
	for _, e := range p.ledger(t) {
		switch {
		case e.Action == "book_parcel" && e.Effects == 1:
			booked++
		case e.Action == "cancel_parcel" && e.Effects == 1:
			cancelled[e.Undoes]++
			if e.At.After(lastCancel) {
				lastCancel = e.At
			}
		case e.Action == "unprepare" && e.Effects == 1:
			unpreparedAt = e.At
		}
	}
	if booked != 49 || len(cancelled) != 49 {
		t.Fatalf("%d parcels booked, %d cancelled; want 49 and 49", booked, len(cancelled))
	}
	if cancelled[failKey] != 0 {
		t.Fatal("the refused parcel was cancelled as if booked")
	}
	if unpreparedAt.IsZero() || unpreparedAt.Before(lastCancel) {
		t.Fatalf("prepare undone at %v, before the last parcel was cancelled at %v", unpreparedAt, lastCancel)
	}
}

// TestGraphHoldThenResubmitRunsTheRestOfTheGraph: the card's agent is
// down, so its step fails for good and the orders are held in error with
// an alert while the stock branch ends; the agent comes back, an operator
// resubmits the first order's failed step, and its join runs after it;
// the second order's stock step is chosen to run again: it runs with a
// new idempotency key, the failed card step with it, then the join.
func TestGraphHoldThenResubmitRunsTheRestOfTheGraph(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "fulfil.yaml", strings.Replace(fulfilFile,
		"{action: charge_card, agent: payment, timeout: 20s,", "{action: charge_card, agent: payment, timeout: 1s, max_failures: 1,", 1))
	reg, _ := workflow.Load(file)
	kinds := reg.Agents()
	st := newStackFor(t, kinds)
	wf := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1, agents: 1,
		submitterEnv: []string{wf, "SAS_STEP_TIMEOUT=0s"}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=inventory,shipping,review"}})
	ids := []string{g0(t, p, "fulfil_hold", `{}`), g0(t, p, "fulfil_hold", `{}`)}
	deadline := time.Now().Add(time.Minute)
	for p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1) AND status = 'error'`, ids) != 2 ||
		p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND name = 'reserve_stock' AND process_state = 'processed'`, ids) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not held in error with the stock reserved\n%s", p.stuck(t, ids))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := p.count(t, `SELECT count(*) FROM alerts WHERE order_id = ANY($1)`, ids); n != 2 {
		t.Fatalf("%d alerts, want one per order", n)
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1) AND name = 'book_parcel' AND process_state = 'waiting'`, ids); n != 2 {
		t.Fatal("the join did not wait for the held branch")
	}
	var firstKey string
	if err := p.pool.QueryRow(context.Background(), `SELECT idempotency_key FROM steps WHERE order_id = $1 AND name = 'reserve_stock'`, ids[1]).Scan(&firstKey); err != nil {
		t.Fatal(err)
	}
	p.startAgent(t, wf, "SAS_AGENT_KINDS=payment")
	if out, errOut, code := sasctl(t, p.env, "orders", "resubmit", ids[0]); code != 0 {
		t.Fatalf("resubmit: %s%s", out, errOut)
	}
	out, errOut, code := sasctl(t, p.env, "orders", "resubmit", ids[1], "--step", "1")
	if code != 0 || !strings.Contains(out, "[1 2 3]") {
		t.Fatalf("resubmit of the stock step: %s%s, want steps 1 (chosen), 2 (failed) and 3 (needs it)", out, errOut)
	}
	p.waitTerminal(t, ids, time.Minute)
	if completed, _ := p.checkSaga(t, ids); completed != 2 {
		t.Fatalf("not completed after the resubmit\n%s", p.stuck(t, ids))
	}
	var runs int
	var key string
	if err := p.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 1 AND to_state = 'processed'),
		(SELECT idempotency_key FROM steps WHERE order_id = $1 AND step = 1)`, ids[1]).Scan(&runs, &key); err != nil {
		t.Fatal(err)
	}
	if runs != 2 || key == firstKey {
		t.Fatalf("the chosen step was processed %d times, key %s (first %s): want twice, with a new key", runs, key, firstKey)
	}
}

// g0 submits one order of the workflow and returns its id.
func g0(t *testing.T, p *pipeline, workflowName, payload string) string {
	t.Helper()
	id := messages.NewID()
	publish(t, amqpChannel(t), p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, workflowName, payload)))
	return id
}

// TestGraphJoinsUnderTwoSchedulers: 1,000 orders whose two branches end
// at once, their replies applied by two schedulers: every join runs once.
func TestGraphJoinsUnderTwoSchedulers(t *testing.T) {
	t.Parallel()
	g := newGraphRun(t, `{}`, 2)
	payloads := make([]string, 1000)
	for i := range payloads {
		payloads[i] = `{}`
	}
	ids := g.submit(t, "fulfil_hold", payloads)
	g.waitTerminal(t, ids, 4*time.Minute)
	if completed, _ := g.checkSaga(t, ids); completed != len(ids) {
		t.Fatalf("%d of %d completed", completed, len(ids))
	}
	if n := g.count(t, `
		SELECT count(*) FROM (
			SELECT t.order_id FROM transitions t JOIN steps s ON s.order_id = t.order_id AND s.step = t.step
			WHERE t.order_id = ANY($1::uuid[]) AND s.name = 'book_parcel' AND t.to_state = 'pending'
			GROUP BY 1 HAVING count(*) = 1) once`, ids); n != len(ids) {
		t.Fatalf("the join was made pending once in %d of %d orders", n, len(ids))
	}
	for _, s := range g.schedulers {
		if s.metric(t, `sas_scheduler_replies_total{result="processed"}`) == 0 {
			t.Fatal("a scheduler applied no reply: the replies did not race")
		}
	}
}

// docBlock returns the fenced block of docs/YOUR-PROCESS.md whose first
// line is first.
func docBlock(t *testing.T, lang, first string) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/YOUR-PROCESS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```"+lang+"\n"+first)
	if !ok {
		t.Fatalf("docs/YOUR-PROCESS.md has no %s block starting %q", lang, first)
	}
	block, _, _ := strings.Cut(rest, "```")
	return first + block
}

// TestYourProcessGraphExamplesRun: the parallel and the for_each example
// of docs/YOUR-PROCESS.md check as the document shows and run, with the
// demo service, to completion.
func TestYourProcessGraphExamplesRun(t *testing.T) {
	t.Parallel()
	examples := []struct{ file, workflow, payload string }{
		{"tenant.yaml", "tenant", `{"tenant":"acme","plan":"enterprise"}`},
		{"shipment.yaml", "shipment", `{"packages":["a","b","c","d","e","f","g"]}`},
	}
	for _, ex := range examples {
		t.Run(ex.workflow, func(t *testing.T) {
			t.Parallel()
			file := writeFile(t, ex.file, docBlock(t, "yaml", "# "+ex.file))
			if ex.file == "tenant.yaml" {
				console := docBlock(t, "console", "$ sasctl workflows check tenant.yaml\n")
				out, _, code := sasctl(t, env(), "workflows", "check", file)
				want := strings.ReplaceAll(strings.TrimPrefix(console, "$ sasctl workflows check tenant.yaml\n"), "tenant.yaml:", file+":")
				if code != 0 || out != want {
					t.Fatalf("check prints\n%s\nthe document shows\n%s", out, want)
				}
			}
			reg, err := workflow.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			s := newStackFor(t, reg.Agents())
			base := portBase()
			out, errOut, code := sasctl(t, s.env, "dev", "--workflows", file, "--workflow", ex.workflow, "--payload", ex.payload,
				"--orders", "20", "--bin", binDir, "--prometheus-port", "0", "--port-base", fmt.Sprint(base), "--console-port", fmt.Sprint(base+7), "--api-port", "0")
			if code != 0 || !strings.Contains(out, "orders completed         20") {
				t.Fatalf("sasctl dev: exit %d\n%s\n%s", code, out, errOut)
			}
		})
	}
}
