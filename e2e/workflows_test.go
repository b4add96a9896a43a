package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/badinput"
	"sas/internal/contract"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// onboardFile is a process sas knows nothing of: four steps, agent kinds
// the built-in workflows never name, a payload schema.
const onboardFile = `
workflows:
  - name: onboard
    policy: compensate
    payload_schema:
      type: object
      required: [tenant, plan]
      properties:
        tenant: {type: string, minLength: 1}
        plan: {enum: [free, team, enterprise]}
    steps:
      - action: create_account
        agent: accounts
        timeout: 20s
        max_failures: 5
        compensation: {action: delete_account}
      - action: provision_storage
        agent: infra
        timeout: 20s
        compensation: {action: release_storage}
      - action: send_welcome
        agent: mail
        timeout: 20s
      - action: bill_first_month
        agent: billing
        timeout: 20s
        compensation: {action: void_bill}
`

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// requestOf reads the call a ledger entry recorded.
func requestOf(t *testing.T, raw json.RawMessage) contract.Request {
	t.Helper()
	var r contract.Request
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("ledger request %s: %v", raw, err)
	}
	return r
}

// TestYourOwnProcessFromAFile: a workflow that exists only in a file the
// test writes runs 500 orders through real processes with 20% transient
// faults, all complete; each step's request carries the payload and the
// results of the steps before it; 20 more orders are refused at step 3,
// and the undo of step 2 gets step 1's result and its own action's; every
// key is applied once.
func TestYourOwnProcessFromAFile(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "onboard.yaml", onboardFile)
	reg, err := workflow.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	kinds := reg.Agents()
	var ids, refused []string
	for range 500 {
		ids = append(ids, messages.NewID())
	}
	for range 20 {
		refused = append(refused, messages.NewID())
	}
	refusedJSON, _ := json.Marshal(refused)
	st := newStackFor(t, kinds)
	wf := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1, agents: 2,
		faults:       `{"*":{"error_rate":0.2,"latency_max_ms":2},"send_welcome":{"error_rate":0.2,"latency_max_ms":2,"fail_orders":` + string(refusedJSON) + `}}`,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=" + strings.Join(kinds, ",")}, remoteEnv: []string{"SAS_REMOTE_KEEP_REQUESTS=true"}})
	ch := amqpChannel(t)
	for i, id := range append(append([]string{}, ids...), refused...) {
		payload := fmt.Sprintf(`{"tenant":"t-%d","plan":"team","seats":%d}`, i, i%7)
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, "onboard", payload)))
	}
	all := append(append([]string{}, ids...), refused...)
	p.waitTerminal(t, all, 4*time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != len(ids) {
		t.Fatalf("%d of %d orders completed\n%s", n, len(ids), p.stuck(t, ids))
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'failed'`, refused); n != len(refused) {
		t.Fatalf("%d of %d refused orders failed", n, len(refused))
	}
	wfDef, _ := reg.Lookup("onboard")
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND workflow_version = $2`, all, wfDef.Version()); n != len(all) {
		t.Fatalf("%d orders of version %s", n, wfDef.Version())
	}
	completed, failed := p.checkSaga(t, all)
	if completed != len(ids) || failed != len(refused) {
		t.Fatalf("saga: %d completed, %d failed", completed, failed)
	}

	byKey := map[string]contract.Request{}
	results := map[string]json.RawMessage{}
	retried := 0
	for _, e := range p.ledger(t) {
		if e.Calls > 1 {
			retried++
		}
		if e.Effects > 1 {
			t.Errorf("key %s applied %d times", e.Key, e.Effects)
		}
		if e.Effects == 1 {
			byKey[e.Key] = requestOf(t, e.Request)
			results[e.Key] = e.Result
		}
	}
	key := func(id string, step int, name string) string { return statestore.IdempotencyKey(id, step, name) }
	if retried < 100 {
		t.Fatalf("only %d keys were called more than once: the transient faults did not happen", retried)
	}
	for _, id := range ids {
		first, third := key(id, 1, "create_account"), key(id, 3, "send_welcome")
		r3, ok := byKey[third]
		if !ok {
			t.Fatalf("order %s: step 3 was never applied", id)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(r3.Results, &got); err != nil || len(got) != 2 {
			t.Fatalf("order %s: step 3's results %s (%v)", id, r3.Results, err)
		}
		if !jsonEqual(got["create_account"], results[first]) || !jsonEqual(got["provision_storage"], results[key(id, 2, "provision_storage")]) {
			t.Fatalf("order %s: step 3 got results %s, the ledger has %s and %s", id, r3.Results, results[first], results[key(id, 2, "provision_storage")])
		}
		var payload struct{ Tenant, Plan string }
		if json.Unmarshal(r3.Payload, &payload) != nil || payload.Tenant == "" || payload.Plan != "team" || r3.Action != "send_welcome" {
			t.Fatalf("order %s: step 3's request %+v", id, r3)
		}
		if r4 := byKey[key(id, 4, "bill_first_month")]; !strings.Contains(string(r4.Results), "send_welcome") {
			t.Fatalf("order %s: step 4's results %s", id, r4.Results)
		}
	}
	for _, id := range refused {
		// Rows: 1-4 actions, then 5 void_bill, 6 release_storage, 7 delete_account.
		undo, ok := byKey[key(id, 6, "release_storage")]
		if !ok {
			t.Fatalf("refused order %s: the storage was not released", id)
		}
		var got map[string]json.RawMessage
		_ = json.Unmarshal(undo.Results, &got)
		if undo.Undoes != key(id, 2, "provision_storage") || !jsonEqual(undo.UndoneResult, results[key(id, 2, "provision_storage")]) ||
			!jsonEqual(got["create_account"], results[key(id, 1, "create_account")]) {
			t.Fatalf("refused order %s: the undo of step 2 was called with %+v", id, undo)
		}
		if _, billed := byKey[key(id, 4, "bill_first_month")]; billed {
			t.Fatalf("refused order %s was billed", id)
		}
	}
	p.checkInvariants(t, all)
	t.Logf("500 orders of a four-step workflow from a file completed, 20 failed and were compensated; %d keys called more than once", retried)
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}
