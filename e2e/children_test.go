package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/remote"
)

const childrenFile = `
workflows:
  - name: loan
    policy: compensate
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: kyc, workflow: kyc_check, input: '{"person": payload.who}'}
      - {action: open_account, agent: core, compensation: {action: close_account}}
  - name: kyc_check
    payload_schema: {type: object, required: [person]}
    steps:
      - {action: check_id, agent: kyc, compensation: {action: forget_id}}
      - {action: check_address, agent: kyc}
  - name: loan_slow
    policy: compensate
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: kyc, workflow: kyc_slow}
  - name: kyc_slow
    steps:
      - {action: check_id, agent: kyc, compensation: {action: forget_id}}
      - {action: slow_check, agent: kyc, timeout: 30s}
`

// childOf is the id of the child a parent's sub-process step starts.
func childOf(parent string, step int, ref string) string {
	return messages.DerivedID("child:" + parent + "/" + fmt.Sprint(step) + "/" + ref)
}

// TestSubProcessesEndWithTheirChildren: 200 orders each start a child
// order of another workflow with their input as its payload; 20 of the
// children fail for good (their check_address refuses). The 180 others
// complete, each parent with its child's results; the 20 children undo
// their own work once, and their parents undo theirs and fail, naming
// the child. An order cancelled while its child runs undoes the child
// too. Every action is applied at most once and undone at most once
// (the demo service's ledger), and parent and child are linked both ways
// in sasctl orders show.
func TestSubProcessesEndWithTheirChildren(t *testing.T) {
	t.Parallel()
	g := runFile(t, "children.yaml", childrenFile, pipelineOpts{supervisors: 1, agents: 2, schedulers: 2,
		faults: `{"slow_check":{"latency_min_ms":5000,"latency_max_ms":5000}}`})
	p := g.pipeline
	ids := make([]string, 200)
	children := make([]string, 200)
	for i := range ids {
		ids[i] = messages.NewID()
		children[i] = childOf(ids[i], 2, "kyc")
	}
	failing := children[:20]
	p.setFaults(t, string(must(json.Marshal(remote.FaultConfig{
		"check_address": {FailOrders: failing},
		"slow_check":    {LatencyMinMS: 5000, LatencyMaxMS: 5000},
	}))))
	ch := amqpChannel(t)
	start := time.Now()
	for i, id := range ids {
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitV2JSON(id, "loan", fmt.Sprintf(`{"who":"p-%d"}`, i))))
	}
	slow := g.submit(t, "loan_slow", []string{`{"who":"slow"}`})[0]
	slowChild := childOf(slow, 2, "kyc")

	// Cancel the slow parent while its child's slow step runs.
	testenv.Eventually(t, 2*time.Minute, "the slow child's second step to run", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND name = 'slow_check' AND process_state = 'processing'`, slowChild) == 1
	})
	if out, errOut, code := sasctl(t, p.env, "orders", "cancel", slow); code != 0 {
		t.Fatalf("cancel: exit %d\n%s%s", code, out, errOut)
	}

	t.Logf("the slow child's step ran %v after the submits began", time.Since(start).Round(time.Millisecond))
	all := append(slices.Clone(ids), slow)
	p.waitTerminal(t, all, 3*time.Minute)
	t.Logf("every parent ended %v after the submits began", time.Since(start).Round(time.Millisecond))
	p.waitTerminal(t, append(slices.Clone(children), slowChild), time.Minute)
	completed, failed := p.checkSaga(t, all)
	if completed != 180 || failed != 21 {
		t.Fatalf("parents: %d completed and %d failed, want 180 and 21\n%s", completed, failed, p.stuck(t, all))
	}
	completed, failed = p.checkSaga(t, children)
	if completed != 180 || failed != 20 {
		t.Fatalf("children: %d completed and %d failed, want 180 and 20", completed, failed)
	}
	// The cancelled parent's child: its check_id undone once if it was
	// applied; its slow_check, cancelled in flight and declaring no
	// compensation, applied at most once (the service may finish the
	// call it was given, which nothing can then undo) and never undone.
	// (checkSaga would ask an applied slow_check to be undone: it held
	// only while the check ran before the 5 s call ended.)
	applied, undone := map[string]int{}, map[string]int{}
	for _, e := range p.ledger(t) {
		if e.Undoes != "" {
			undone[e.Undoes] += e.Effects
		} else if e.OrderID == slowChild {
			applied[e.Key] += e.Effects
		}
	}
	var checkKey, slowKey string
	if err := p.pool.QueryRow(t.Context(), `SELECT max(idempotency_key) FILTER (WHERE name = 'check_id'), max(idempotency_key) FILTER (WHERE name = 'slow_check')
		FROM steps WHERE order_id = $1 AND kind = 'action'`, slowChild).Scan(&checkKey, &slowKey); err != nil {
		t.Fatal(err)
	}
	if applied[checkKey] > 1 || undone[checkKey] != applied[checkKey] {
		t.Errorf("the cancelled child's check_id applied %d times, undone %d times", applied[checkKey], undone[checkKey])
	}
	if applied[slowKey] > 1 || undone[slowKey] != 0 {
		t.Errorf("the cancelled child's slow_check applied %d times, undone %d times", applied[slowKey], undone[slowKey])
	}
	// One child per parent, linked to it and its step, one level down.
	if n := p.count(t, `SELECT count(*) FROM orders WHERE parent_order = ANY($1::uuid[]) AND parent_step = 2 AND depth = 1
		AND order_id = ANY($2::uuid[])`, all, append(slices.Clone(children), slowChild)); n != 201 {
		t.Fatalf("%d children linked to their parents, want 201", n)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE parent_order = ANY($1::uuid[])`, all); n != 201 {
		t.Fatalf("%d children in all, want 201", n)
	}
	// A completed parent's kyc result is its child's results; its child
	// got the parent's input as payload.
	var right int
	if err := p.pool.QueryRow(t.Context(), `SELECT count(*) FROM steps s JOIN orders c ON c.parent_order = s.order_id AND c.parent_step = s.step
		WHERE s.order_id = ANY($1::uuid[]) AND s.name = 'kyc' AND s.process_state = 'processed'
		  AND s.result ? 'check_id' AND s.result ? 'check_address' AND c.payload->>'person' LIKE 'p-%'`, ids[20:]).Scan(&right); err != nil {
		t.Fatal(err)
	}
	if right != 180 {
		t.Fatalf("%d completed parents have their child's results, want 180", right)
	}
	// The failed parents name their child and undid their score.
	for i, id := range ids[:20] {
		var lastErr string
		if err := p.pool.QueryRow(t.Context(), `SELECT coalesce(last_error, '') FROM steps WHERE order_id = $1 AND name = 'kyc'`, id).Scan(&lastErr); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(lastErr, "its child order "+children[i]+" failed: check_address") {
			t.Fatalf("order %s's kyc step says %q", id, lastErr)
		}
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name IN ('unscore', 'undo_kyc') AND process_state = 'processed'`,
		append(slices.Clone(ids[:20]), slow)); n != 42 {
		t.Fatalf("%d of the failed parents' undos processed, want 42", n)
	}
	// The cancelled parent's child was undone with it.
	var slowStatus string
	if err := p.pool.QueryRow(t.Context(), `SELECT status FROM orders WHERE order_id = $1`, slowChild).Scan(&slowStatus); err != nil || slowStatus != "failed" {
		t.Fatalf("the cancelled parent's child is %s (%v), want failed", slowStatus, err)
	}
	// orders show links both ways.
	out, _, code := sasctl(t, p.env, "orders", "show", ids[30])
	if code != 0 || !strings.Contains(out, children[30]) {
		t.Fatalf("orders show of a parent does not name its child:\n%s", out)
	}
	// Its sub-process step reads as one, not as an action of an agent.
	if !regexp.MustCompile(`(?m)^2\s+kyc\s+sub-process\s+workflow:kyc_check\s`).MatchString(out) {
		t.Fatalf("orders show of a parent does not show its sub-process step as one:\n%s", out)
	}
	out, _, code = sasctl(t, p.env, "orders", "show", children[30])
	if code != 0 || !strings.Contains(out, ids[30]) {
		t.Fatalf("orders show of a child does not name its parent:\n%s", out)
	}
	// So does the console: from the parent to its child and back.
	c := startConsole(t, p.stack)
	ctx := browser(t)
	login(t, ctx, c.url, "alice", "alice's password")
	do(t, ctx, "open the parent", chromedp.Navigate(c.url+"/orders/"+ids[30]), chromedp.WaitVisible(chromedp.CSS("#children a")))
	do(t, ctx, "follow the link to the child", chromedp.Click(chromedp.CSS("#children a")), chromedp.WaitVisible(chromedp.CSS("#parent a")))
	if got := text(t, ctx, "#order-id"); got != children[30] {
		t.Fatalf("the child's link led to %q, want %s", got, children[30])
	}
	if got := text(t, ctx, "#parent"); !strings.Contains(got, ids[30]) || !strings.Contains(got, "step 2") {
		t.Fatalf("the child's page names its parent as %q", got)
	}
	do(t, ctx, "follow the link back", chromedp.Click(chromedp.CSS("#parent a")), chromedp.WaitVisible(chromedp.CSS("#children a")))
	if got := text(t, ctx, "#order-id"); got != ids[30] {
		t.Fatalf("the parent's link led to %q, want %s", got, ids[30])
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
