package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sas/client"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// newcomerFile is a process of the test's own: three agent kinds no
// built-in workflow names, the same steps under both policies.
const newcomerFile = `
workflows:
  - name: onboard
    policy: compensate
    steps: &steps
      - action: create_account
        agent: accounts
        timeout: 10s
        compensation: {action: delete_account}
      - action: provision_storage
        agent: storage
        timeout: 10s
        compensation: {action: release_storage}
      - action: send_welcome
        agent: mail
        timeout: 2s
        max_failures: 2
        backoff: {base: 100ms, max: 200ms}
  - name: onboard_hold
    policy: hold
    steps: *steps
`

// TestANewcomersOwnProcess runs a three-kind process of a file of its own
// against services of the test's own, not the demo service: accounts
// works, storage refuses the gold plan (422 with its reason), mail is down
// (503 "mail relay down" on every call). Checked from the outside, as a
// newcomer meets it: the client's outcome says which step failed, why, in
// the service's words, and what was undone; orders show keeps the
// service's last answer; dlq list reads the agent kinds of the file; the
// console's pages, in a real browser, say "held" only of a held order,
// show every failure of an ended step and no lock, offer Resubmit only
// where it works, give each failed order's reason in the list, count only
// the steps that need an operator, and show the overview's whole table.
func TestANewcomersOwnProcess(t *testing.T) {
	t.Parallel()
	var mailCalls atomic.Int64
	services := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/send_welcome":
			mailCalls.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"mail relay down"}`))
		case r.URL.Path == "/v1/provision_storage" && strings.Contains(string(body), `"gold"`):
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte(`{"error":"no storage for plan gold"}`))
		case r.URL.Path == "/v1/create_account":
			_, _ = w.Write([]byte(`{"account_id":"acc-1"}`))
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	t.Cleanup(services.Close)
	file := writeFile(t, "onboard.yaml", newcomerFile)
	endpoints := writeFile(t, "endpoints.yaml", fmt.Sprintf("endpoints:\n  accounts: {url: %q}\n  storage: {url: %q}\n  mail: {url: %q}\n",
		services.URL, services.URL, services.URL))
	kinds := []string{"accounts", "mail", "storage"}
	st := newStackFor(t, kinds)
	wfEnv := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1,
		submitterEnv: []string{wfEnv, "SAS_STEP_TIMEOUT=0s"}, schedulerEnv: []string{wfEnv}, supervisorEnv: []string{wfEnv},
		agentEnv: []string{wfEnv, "SAS_AGENT_KINDS=" + strings.Join(kinds, ","), "SAS_AGENT_ENDPOINTS_FILE=" + endpoints}})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: testenv.AMQPURL(), QueuePrefix: p.topo.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	submit := func(workflow, plan string) string {
		id, err := c.Submit(ctx, client.Order{Workflow: workflow, Payload: map[string]any{"tenant": "acme", "plan": plan}})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	refused, down, held := submit("onboard", "gold"), submit("onboard", "team"), submit("onboard_hold", "gold")

	// 1. The client's outcome says why.
	for _, want := range []struct {
		id, status, reason, step, words string
		undone                          []string
	}{
		{refused, "failed", "refused", "provision_storage", "no storage for plan gold", []string{"create_account", "provision_storage"}},
		{down, "failed", "timed_out", "send_welcome", "mail relay down", []string{"create_account", "provision_storage"}},
		{held, "error", "refused", "provision_storage", "no storage for plan gold", nil},
	} {
		got, err := c.Await(ctx, want.id)
		if err != nil {
			t.Fatalf("await %s: %v", want.id, err)
		}
		if got.Status != want.status || got.Reason != want.reason || got.FailedStep != want.step || !strings.Contains(got.Detail, want.words) ||
			!slices.Equal(got.Undone, want.undone) {
			t.Errorf("order %s ended %+v; want %s, %s at %s with %q, undone %v", want.id, got, want.status, want.reason, want.step, want.words, want.undone)
		}
	}
	if n := mailCalls.Load(); n < 2 {
		t.Fatalf("the mail service was called %d times", n)
	}

	// 2. orders show keeps the service's last answer.
	for id, want := range map[string]string{
		down:    `the service's last answer: 503 Service Unavailable: {"error":"mail relay down"}`,
		refused: `the service's last answer: 422 Unprocessable Entity: {"error":"no storage for plan gold"}`,
	} {
		out, errOut, code := sasctl(t, p.env, "orders", "show", id)
		if code != 0 || !strings.Contains(flat(out), want) {
			t.Errorf("orders show %s (exit %d) lacks %q:\n%s%s", id, code, want, out, errOut)
		}
	}

	// 3. dlq list reads the agent kinds of the workflows file.
	ch := amqpChannel(t)
	publish(t, ch, p.topo.Queue(messages.RequestsQueue("accounts")), messages.ContentType, "not-a-request", []byte("this is not JSON"))
	testenv.Eventually(t, 30*time.Second, "the bad request dead-lettered", func() bool {
		return queueDepth(t, ch, p.topo.DeadLetterQueue(messages.RequestsQueue("accounts"))) == 1
	})
	out, errOut, code := sasctl(t, append(append([]string{}, p.env...), wfEnv), "dlq", "list", "agent.accounts")
	if code != 0 || !strings.Contains(out, "not-a-request") || !strings.Contains(out, "not_json") {
		t.Errorf("dlq list agent.accounts with the workflows file (exit %d):\n%s%s", code, out, errOut)
	}
	if _, errOut, code := sasctl(t, p.env, "dlq", "list", "agent.accounts"); code == 0 || !strings.Contains(errOut, "--workflows FILE or SAS_WORKFLOWS_FILE") {
		t.Errorf("dlq list agent.accounts without the file (exit %d) does not say how to name it:\n%s", code, errOut)
	}

	// 8. The console, in a real browser.
	con := startConsole(t, p.stack, wfEnv)
	bctx := browser(t)
	do(t, bctx, "a window 1,400 px wide", chromedp.EmulateViewport(1400, 900))
	login(t, bctx, con.url, "alice", "alice's password")
	if got := text(t, bctx, "#steps-error"); got != "1" {
		t.Errorf("the overview counts %s steps in error, want 1 (the held order's; the undone orders' do not need anyone)", got)
	}
	if !eval[bool](t, bctx, `(() => { const th = [...document.querySelectorAll("#recent th")].find(e => e.textContent === "failed");
		const r = th.getBoundingClientRect(); const s = th.closest("section").getBoundingClientRect();
		return r.width > 0 && r.right <= window.innerWidth && (r.right <= s.right || th.closest("section").scrollWidth > s.width); })()`) {
		t.Error("the overview's failed column is cut off at 1,400 px")
	}
	do(t, bctx, "the orders list", chromedp.Navigate(con.url+"/orders"), chromedp.WaitVisible(chromedp.CSS("#orders")))
	if list := text(t, bctx, "#orders"); !strings.Contains(list, "provision_storage: provision_storage answered 422: no storage for plan gold") ||
		!strings.Contains(list, "send_welcome: complete_by passed") || !strings.Contains(list, "mail relay down") {
		t.Errorf("the orders list does not say why each failed:\n%s", list)
	}
	for _, c := range []struct {
		id, label string
		resubmit  bool
	}{
		{refused, "the order's done steps are undone", false},
		{held, "held for an operator", true},
	} {
		do(t, bctx, "order "+c.id, chromedp.Navigate(con.url+"/orders/"+c.id), chromedp.WaitVisible(chromedp.CSS("#order-status")))
		step := text(t, bctx, "#step-2")
		if !strings.Contains(step, c.label) || !strings.Contains(step, "failed 1 time") || strings.Contains(step, "locked by") ||
			!strings.Contains(step, "The service's last answer") {
			t.Errorf("order %s, step 2 reads:\n%s\nwant %q, its one failure, its last answer and no lock", c.id, step, c.label)
		}
		if offered := eval[bool](t, bctx, `document.querySelector("#resubmit, .resubmit-step") !== null`); offered != c.resubmit {
			t.Errorf("order %s: Resubmit offered %v, want %v", c.id, offered, c.resubmit)
		}
	}
	do(t, bctx, "the timed-out order", chromedp.Navigate(con.url+"/orders/"+down), chromedp.WaitVisible(chromedp.CSS("#step-3")))
	if step := text(t, bctx, "#step-3"); !strings.Contains(step, "failed 2 times") || !strings.Contains(step, "mail relay down") {
		t.Errorf("the timed-out step reads:\n%s", step)
	}
}
