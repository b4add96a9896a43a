package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

const signalsFile = `
workflows:
  - name: approval
    policy: compensate
    steps:
      - {action: score, agent: risk, timeout: 20s, compensation: {action: unscore}}
      - {id: approved, wait: {signal: approved, timeout: 5m, schema: {type: object, required: [by]}}}
      - {action: open_account, agent: core, timeout: 20s, needs: [approved]}
  - name: approval_early
    policy: compensate
    steps:
      - {action: score, agent: risk, timeout: 20s, compensation: {action: unscore}}
      - {id: approved, wait: {signal: approved, timeout: 5m, schema: {type: object, required: [by]}}}
      - {action: open_account, agent: core, timeout: 20s, needs: [approved]}
  - name: approval_short
    policy: compensate
    steps:
      - {action: score, agent: risk, timeout: 20s, compensation: {action: unscore}}
      - {id: approved, wait: {signal: approved, timeout: 5s}}
      - {action: open_account, agent: core, timeout: 20s, needs: [approved]}
`

// TestSignalsEndWaits: 1,000 orders wait for a signal after a first
// step; 900 are signalled through the signals queue, half before their
// wait began (their workflow is paused until every one of those signals
// is kept), 50 of them twice; the other 100 (a workflow whose wait
// times out after 5 s) never are. A scheduler and the leading supervisor
// are killed with SIGKILL midway. Every signalled order completes once,
// with the signal's payload as the wait's result; the 100 time out, are
// undone and fail; signals for an unknown order, a name no step waits
// for and a payload the schema refuses are dead-lettered with their
// reasons and told to their reply_to.
func TestSignalsEndWaits(t *testing.T) {
	t.Parallel()
	g := runFile(t, "signals.yaml", signalsFile, pipelineOpts{supervisors: 2, agents: 2, schedulers: 2,
		faults: `{"score":{"latency_min_ms":150,"latency_max_ms":150}}`})
	p := g.pipeline
	// ids[:450] are signalled once their waits began, ids[450:900] before:
	// their workflow is paused until each of their signals is kept (a
	// first step of 3 s once let a loaded machine apply 230 of them only
	// after their waits began). The last 100, of approval_short, are not
	// signalled and time out.
	sasctlOK(t, p.env, "workflows", "pause", "approval_early", "--reason", "signals first", "--as", "e2e")
	early := g.submit(t, "approval_early", slices.Repeat([]string{`{}`}, 450))
	ch := amqpChannel(t)
	queue := p.topo.Queue(messages.SignalsQueue)
	send := func(id, sigID, name, payload, replyTo string) {
		t.Helper()
		sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: sigID, OrderID: id, Name: name, Payload: []byte(payload),
			ReplyTo: replyTo, By: "e2e"}
		body, err := messages.Encode(sig)
		if err != nil {
			t.Fatal(err)
		}
		publish(t, ch, queue, messages.ContentType, sigID, body)
	}
	payload := func(i int) string { return fmt.Sprintf(`{"by": "manager-%d"}`, i) }
	// Half of the 900 at once, before their waits begin.
	for i, id := range early {
		send(id, "early-"+id, "approved", payload(450+i), "")
	}
	testenv.Eventually(t, 3*time.Minute, "the early signals kept", func() bool {
		return p.count(t, `SELECT count(*) FROM signals WHERE order_id = ANY($1::uuid[])`, early) == len(early)
	})
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND spec ? 'wait' AND process_state IN ('awaiting', 'processed')`, early); n != 0 {
		t.Fatalf("%d waits of a paused workflow's orders began", n)
	}
	sasctlOK(t, p.env, "workflows", "resume", "approval_early", "--as", "e2e")
	ids := g.submit(t, "approval", slices.Repeat([]string{`{}`}, 450))
	ids = append(ids, early...)
	ids = append(ids, g.submit(t, "approval_short", slices.Repeat([]string{`{}`}, 100))...)
	testenv.Eventually(t, 3*time.Minute, "the first 450 orders' waits to begin", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND spec ? 'wait' AND process_state = 'awaiting'`,
			ids[:450]) == 450
	})
	p.schedulers[0].kill(t)
	p.supervisors[0].kill(t)
	// Refusals, each told to its reply_to; sent to orders whose waits
	// began and last 5 minutes, before the signals that end them, so that
	// neither can have ended first (an approval_short order's 5 s wait
	// can, in a slow hour: then the refusal is order_ended).
	replies := "e2e-signal-replies." + messages.NewID()
	if _, err := ch.QueueDeclare(replies, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	send(messages.NewID(), "r1", "approved", `{"by": "x"}`, replies)
	send(ids[448], "r2", "rejected", `{"by": "x"}`, replies)
	send(ids[449], "r3", "approved", `{"who": "x"}`, replies)
	for i := range 450 {
		send(ids[i], "late-"+ids[i], "approved", payload(i), "")
		if i < 50 {
			send(ids[i], "late-"+ids[i], "approved", payload(i), "") // the same signal again
		}
	}

	p.waitTerminal(t, ids, 3*time.Minute)
	completed, failed := p.checkSaga(t, ids)
	if completed != 900 || failed != 100 {
		t.Fatalf("%d completed and %d failed, want 900 and 100\n%s", completed, failed, p.stuck(t, ids))
	}
	var rightResults, signalRows, applied int
	if err := p.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM steps s WHERE s.order_id = ANY($1::uuid[]) AND s.spec ? 'wait' AND s.process_state = 'processed'
		   AND s.result->>'by' LIKE 'manager-%'),
		(SELECT count(*) FROM signals WHERE order_id = ANY($1::uuid[])),
		(SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND to_state = 'processed'
		   AND step = (SELECT s.step FROM steps s WHERE s.order_id = transitions.order_id AND s.spec ? 'wait'))`,
		ids).Scan(&rightResults, &signalRows, &applied); err != nil {
		t.Fatal(err)
	}
	kept := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND reason LIKE '%had come before the wait began'`, ids)
	t.Logf("%d signals came before their wait began", kept)
	if kept != len(early) {
		t.Fatalf("%d signals came before their wait began, want %d", kept, len(early))
	}
	if rightResults != 900 || signalRows != 900 || applied != 900 {
		t.Fatalf("%d waits ended with their manager's payload, %d signals kept, %d wait ends in the history; want 900 each",
			rightResults, signalRows, applied)
	}
	want := map[string]int{"unknown_order": 1, "no_such_wait": 1, "invalid_payload": 1}
	told := map[string]int{}
	for _, d := range drain(t, ch, replies, 3, 30*time.Second) {
		ev, err := messages.DecodeStatusEvent(d.Body)
		if err != nil || ev.Status != messages.StatusRejected || ev.Detail == "" {
			t.Fatalf("told %s (%v), want a rejected event with a detail", d.Body, err)
		}
		told[ev.Reason]++
	}
	dead := map[string]int{}
	for _, d := range drain(t, ch, p.topo.DeadLetterQueue(messages.SignalsQueue), 3, 30*time.Second) {
		dead[fmt.Sprint(d.Headers["x-error-reason"])]++
	}
	if !maps.Equal(told, want) || !maps.Equal(dead, want) {
		t.Fatalf("refusals told %v, dead-lettered %v; want %v each", told, dead, want)
	}
}

// TestSasctlSignalsAnOrder: sasctl orders signal refuses, before sending,
// what the order would refuse, saying why; sent, it says which step the
// signal ended, and the order goes on. The console sends one too, from
// the order page (Chromium).
func TestSasctlSignalsAnOrder(t *testing.T) {
	t.Parallel()
	p := runFile(t, "signals.yaml", signalsFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1}).pipeline
	id := g0(t, p, "approval", `{}`)
	testenv.Eventually(t, 30*time.Second, "the wait to begin", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, id) == 1
	})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"orders", "signal", id, "nope"}, "no step of order " + id + " waits for a signal nope (its steps wait for approved)"},
		{[]string{"orders", "signal", messages.NewID(), "approved"}, "does not exist"},
		{[]string{"orders", "signal", id, "approved", "--payload", "{not json"}, "is not JSON"},
	} {
		if out, errOut, code := sasctl(t, p.env, c.args...); code == 0 || !strings.Contains(errOut, c.want) {
			t.Fatalf("sasctl %v: exit %d, %s%s; want a refusal saying %q", c.args, code, out, errOut, c.want)
		}
	}
	out, errOut, code := sasctl(t, p.env, "orders", "signal", id, "approved", "--payload", `{"by": "ops"}`, "--as", "ann")
	if code != 0 || !strings.Contains(out, "ended step 2") {
		t.Fatalf("sasctl orders signal: exit %d, %s%s", code, out, errOut)
	}
	p.waitTerminal(t, []string{id}, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 2 AND to_state = 'processed' AND actor = 'signal:ann'`, id); n != 1 {
		t.Fatalf("the history does not say who signalled: %d", n)
	}
	out, _, _ = sasctl(t, p.env, "orders", "show", id)
	if !strings.Contains(out, "completed") {
		t.Fatalf("orders show:\n%s", out)
	}

	// The console: an operator sends the signal from the order page, with
	// a confirmation, and the history records who.
	other := g0(t, p, "approval", `{}`)
	testenv.Eventually(t, 30*time.Second, "the second wait to begin", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, other) == 1
	})
	c := startConsole(t, p.stack)
	ctx := browser(t)
	login(t, ctx, c.url, "alice", "alice's password")
	do(t, ctx, "open the order", chromedp.Navigate(c.url+"/orders/"+other), chromedp.WaitVisible(chromedp.CSS(".signal-step")))
	if got := text(t, ctx, ".signal-step"); got != "send signal approved" {
		t.Fatalf("the button says %q", got)
	}
	do(t, ctx, "send the signal", chromedp.Click(chromedp.CSS(".signal-step")), chromedp.WaitVisible(chromedp.CSS("#payload")),
		chromedp.SendKeys(chromedp.CSS("#payload"), `{"by": "alice"}`), chromedp.Click(chromedp.CSS("#confirm-button")),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	waitStatus(t, ctx, c.url, other, "completed")
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 2 AND result->>'by' = 'alice'`, other); n != 1 {
		t.Fatal("the wait did not end with the console's payload")
	}
	if h := text(t, ctx, "#history"); !strings.Contains(h, "signal:console:alice") {
		t.Fatalf("the history does not record alice's signal:\n%s", h)
	}
}

// TestYourProcessApprovalExampleRuns: the approval example of
// docs/YOUR-PROCESS.md, as the document shows it, with the demo service:
// a large loan waits for the manager's signal, sent with sasctl, and
// completes with it as the wait's result; a small one skips the wait.
func TestYourProcessApprovalExampleRuns(t *testing.T) {
	t.Parallel()
	g := runFile(t, "loan.yaml", docBlock(t, "yaml", "# loan.yaml"), pipelineOpts{supervisors: 1})
	p := g.pipeline
	large := g0(t, p, "loan", `{"amount": 20000}`)
	small := g0(t, p, "loan", `{"amount": 500}`)
	testenv.Eventually(t, time.Minute, "the large loan to wait for its approval", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND name = 'approval' AND process_state = 'awaiting'`, large) == 1
	})
	if out, errOut, code := sasctl(t, p.env, "orders", "signal", large, "approved", "--payload", `{"by":"ann"}`, "--as", "ann"); code != 0 {
		t.Fatalf("sasctl orders signal: exit %d\n%s%s", code, out, errOut)
	}
	p.waitTerminal(t, []string{large, small}, time.Minute)
	var result, smallApproval string
	if err := p.pool.QueryRow(context.Background(), `SELECT
		(SELECT result->>'by' FROM steps WHERE order_id = $1 AND name = 'approval'),
		(SELECT process_state FROM steps WHERE order_id = $2 AND name = 'approval')`, large, small).Scan(&result, &smallApproval); err != nil {
		t.Fatal(err)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id IN ($1, $2) AND status = 'completed'`, large, small); n != 2 ||
		result != "ann" || smallApproval != "skipped" {
		t.Fatalf("%d of 2 completed; the approval's result by %q, the small loan's approval %s", n, result, smallApproval)
	}
}
