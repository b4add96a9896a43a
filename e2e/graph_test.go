package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
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
	reg *workflow.Registry
}

func newGraphRun(t *testing.T, faults string, schedulers int) graphRun {
	t.Helper()
	file := writeFile(t, "fulfil.yaml", fulfilFile)
	reg, err := workflow.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	kinds := reg.Agents()
	st := newStackFor(t, kinds)
	wf := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1, agents: 2, schedulers: schedulers, faults: faults,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=" + strings.Join(kinds, ",")}, remoteEnv: []string{"SAS_REMOTE_KEEP_REQUESTS=true"}})
	return graphRun{pipeline: p, reg: reg}
}

func (g graphRun) submit(t *testing.T, workflowName string, payloads []string) []string {
	t.Helper()
	ch := amqpChannel(t)
	var ids []string
	for _, payload := range payloads {
		id := messages.NewID()
		ids = append(ids, id)
		publish(t, ch, g.pipeline.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, workflowName, payload)))
	}
	return ids
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
