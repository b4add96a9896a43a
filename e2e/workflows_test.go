package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/contract"
	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
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
	retried := 0.0
	for _, action := range []string{"create_account", "provision_storage", "send_welcome", "bill_first_month"} {
		retried += p.remote.metric(t, fmt.Sprintf(`sas_remote_requests_total{action=%q,outcome="error"}`, action))
	}
	for _, e := range p.ledger(t) {
		if e.Effects > 1 {
			t.Errorf("key %s applied %d times", e.Key, e.Effects)
		}
		if e.Effects == 1 {
			byKey[e.Key] = requestOf(t, e.Request)
			results[e.Key] = e.Result
		}
	}
	key := func(id string, step int, name string) string { return statestore.IdempotencyKey(id, step, name) }
	if retried < 200 {
		t.Fatalf("only %v calls failed: the 20%% transient faults did not happen", retried)
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
	t.Logf("500 orders of a four-step workflow from a file completed, 20 failed and were compensated; %v calls failed and were retried", retried)
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

func flowFile(third bool) string {
	f := `
workflows:
  - name: flow
    steps:
      - {action: first, agent: k1, timeout: 60s}
      - {action: second, agent: k1, timeout: 60s}
`
	if third {
		f += "      - {action: third, agent: k2, timeout: 60s}\n"
	}
	return f
}

// TestChangedFileKeepsOrdersOnTheirVersion: 200 orders are in flight
// when the workflows file changes (a third step, of a new agent kind) and
// a new submitter starts beside the old scheduler, which still reads the
// old file but is configured for the new kind. The 200 finish on the
// version they started with; the orders after the change run the new one;
// both versions are listed.
func TestChangedFileKeepsOrdersOnTheirVersion(t *testing.T) {
	t.Parallel()
	newPath := writeFile(t, "new.yaml", flowFile(true))
	oldPath := writeFile(t, "old.yaml", flowFile(false))
	path := filepath.Join(t.TempDir(), "workflows.yaml")
	if err := os.WriteFile(path, []byte(flowFile(false)), 0o644); err != nil {
		t.Fatal(err)
	}
	st := newStackFor(t, []string{"k1", "k2"})
	p := newPipeline(t, pipelineOpts{on: &st, withoutAgents: true,
		submitterEnv: []string{"SAS_WORKFLOWS_FILE=" + path},
		// The old scheduler: the old file, and the kinds it is told.
		schedulerEnv: []string{"SAS_WORKFLOWS_FILE=" + oldPath, "SAS_SCHEDULER_KINDS=k1,k2"}})
	ch := amqpChannel(t)
	submit := func(n int) []string {
		var ids []string
		for i := range n {
			id := messages.NewID()
			ids = append(ids, id)
			publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, "flow", fmt.Sprintf(`{"n":%d}`, i))))
		}
		return ids
	}
	before := submit(200)
	p.waitWritten(t, before)

	// The file changes; a new submitter reads it.
	if err := os.WriteFile(path, []byte(flowFile(true)), 0o644); err != nil {
		t.Fatal(err)
	}
	p.submitter.stop(t)
	p.submitter = start(t, "submitter", append(append([]string{}, p.env...), "SAS_STEP_TIMEOUT=60s", "SAS_WORKFLOWS_FILE="+path))
	after := submit(50)
	p.startAgent(t, "SAS_WORKFLOWS_FILE="+newPath, "SAS_AGENT_KINDS=k1,k2")
	p.waitTerminal(t, append(append([]string{}, before...), after...), 2*time.Minute)

	oldReg, _ := workflow.Load(oldPath)
	newReg, _ := workflow.Load(newPath)
	oldWF, _ := oldReg.Lookup("flow")
	newWF, _ := newReg.Lookup("flow")
	if oldWF.Version() == newWF.Version() {
		t.Fatal("the two files have one version")
	}
	for _, c := range []struct {
		ids     []string
		version string
		steps   int
	}{{before, oldWF.Version(), 2}, {after, newWF.Version(), 3}} {
		if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed' AND workflow_version = $2`, c.ids, c.version); n != len(c.ids) {
			t.Fatalf("%d of %d orders completed on version %s\n%s", n, len(c.ids), c.version, p.stuck(t, c.ids))
		}
		if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[])`, c.ids); n != c.steps*len(c.ids) {
			t.Fatalf("%d step rows for %d orders of version %s, want %d each", n, len(c.ids), c.version, c.steps)
		}
	}
	third := 0
	for _, e := range p.ledger(t) {
		if strings.HasSuffix(e.Key, "/3/third") {
			third++
		}
	}
	if third != len(after) {
		t.Fatalf("the third step ran %d times, want %d (only the orders after the change)", third, len(after))
	}
	out, errOut, code := sasctl(t, p.env, "workflows", "list")
	if code != 0 || !strings.Contains(out, oldWF.Version()) || !strings.Contains(out, newWF.Version()) {
		t.Fatalf("workflows list (exit %d):\n%s%s", code, out, errOut)
	}
}

// TestInvalidWorkflowsFileStopsEveryProcess: a service given a bad file
// exits 2 before it connects to anything, listing every problem at its
// line; sasctl workflows check says the same and exits 1.
func TestInvalidWorkflowsFileStopsEveryProcess(t *testing.T) {
	t.Parallel()
	bad := writeFile(t, "bad.yaml", "workflows:\n  - name: w\n    policy: retry\n    steps:\n      - {action: a, agent: x, timout: 5s}\n")
	for _, svc := range []string{"submitter", "scheduler", "agent"} {
		cmd := exec.Command(filepath.Join(binDir, svc))
		cmd.Env = env("SAS_WORKFLOWS_FILE="+bad, "SAS_DATABASE_URL=postgres://nobody@127.0.0.1:1/none", "SAS_AMQP_URL=amqp://nobody@127.0.0.1:1/")
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("%s with a bad file: %v\n%s", svc, err, errOut.String())
		}
		for _, want := range []string{bad + ":3: policy \"retry\"", bad + `:5: unknown field "timout"`} {
			if !strings.Contains(errOut.String(), want) {
				t.Fatalf("%s says:\n%s\nwithout %q", svc, errOut.String(), want)
			}
		}
	}
	out, _, code := sasctl(t, env(), "workflows", "check", bad)
	if code != 1 || strings.Count(out, bad+":") != 2 {
		t.Fatalf("workflows check (exit %d):\n%s", code, out)
	}
	good := writeFile(t, "good.yaml", onboardFile)
	if out, errOut, code := sasctl(t, env(), "workflows", "check", good); code != 0 || !strings.Contains(out, "workflow onboard version") {
		t.Fatalf("workflows check of a good file (exit %d):\n%s%s", code, out, errOut)
	}
}

// waitWritten waits until every order is in the store.
func (p pipeline) waitWritten(t *testing.T, ids []string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "the orders written", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids) == len(ids)
	})
}

// TestWorkflowsListDrawsGraphs: workflows list draws a list as a chain
// and a graph as each step with the steps it waits for (an N-of-M join
// as any N of them), and says how long waits and timers last as the file
// wrote it.
func TestWorkflowsListDrawsGraphs(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "graphs.yaml", `
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: approval, wait: {signal: approved, timeout: 10m}, needs: [score]}
      - {action: cooling_off, delay: 90s, needs: [approval]}
      - {id: kyc, workflow: checks, needs: []}
      - {action: open, agent: core, needs: {any: 2, of: [cooling_off, kyc, score]}}
  - name: checks
    steps:
      - {action: check_id, agent: kyc}
      - {action: check_address, agent: kyc}
`)
	out := sasctlOK(t, env(), "workflows", "list", "--file", file)
	for _, want := range []string{"check_id@kyc → check_address@kyc", "approval@signal:approved(10m) ← score", "cooling_off@timer(90s) ← approval",
		"kyc@workflow:checks", "open@core ← any 2 of cooling_off, kyc, score"} {
		if !strings.Contains(out, want) {
			t.Errorf("workflows list says:\n%s\nwithout %q", out, want)
		}
	}
}
