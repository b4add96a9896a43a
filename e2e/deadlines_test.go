package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

const deadlinesFile = `
workflows:
  - name: bounded
    deadline: 3s
    steps:
      - {action: reserve, agent: shop, timeout: 20s, compensation: {action: release, agent: shop}}
      - {action: charge, agent: shop, timeout: 20s, compensation: {action: refund, agent: shop}}
      - {action: ship, agent: shop, timeout: 20s}
  - name: racing
    deadline: 2s
    steps:
      - {action: hold_seat, agent: shop, timeout: 20s, compensation: {action: free_seat, agent: shop}}
      - {action: issue, agent: shop, timeout: 20s, compensation: {action: void_ticket, agent: shop}}
  - name: open
    steps:
      - {action: note, agent: shop, timeout: 20s, compensation: {action: unnote, agent: shop}}
      - {action: slow_note, agent: shop, timeout: 20s, compensation: {action: unslow, agent: shop}}
`

// TestDeadlinesFenceUndoAndRace, with real binaries: orders whose
// deadline passes while a step is in flight (charge takes 5 s, the
// deadline is 3 s) are undone, the step in flight fenced out and
// compensated once, each ending event's reason deadline; orders whose
// last step's reply races their deadline end either completed or
// undone, never both, nothing applied twice or undone twice; an order's
// own deadline given at submit bounds an order of a workflow without
// one. The supervisor counts each, and orders show says what happened.
func TestDeadlinesFenceUndoAndRace(t *testing.T) {
	t.Parallel()
	g := runFile(t, "deadlines.yaml", deadlinesFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1})
	p := g.pipeline
	p.setFaults(t, `{"charge":{"latency_min_ms":5000,"latency_max_ms":5000},"issue":{"latency_min_ms":1500,"latency_max_ms":2100},
		"slow_note":{"latency_min_ms":4000,"latency_max_ms":4000}}`)
	fenced := g.submit(t, "bounded", slices.Repeat([]string{`{}`}, 10))
	racing := g.submit(t, "racing", slices.Repeat([]string{`{}`}, 30))
	ch := amqpChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sasctl(t, p.env, "submit", "--workflows", g.file, "--workflow", "open", "--payload", "{}", "--count", "3", "--deadline", "2s", "--print-ids",
		"--reply-to", q.Name)
	own := strings.Fields(out)
	if code != 0 || len(own) != 3 {
		t.Fatalf("sasctl submit --deadline: %d %s %s", code, out, errOut)
	}
	all := slices.Concat(fenced, racing, own)
	p.waitTerminal(t, all, 90*time.Second)
	completed, failed := p.checkSaga(t, all)

	endedBy := func(id string) (status, reason string) {
		t.Helper()
		d, err := statestore.New(p.pool).GetOrder(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range d.History {
			if h.Step == nil && strings.HasPrefix(h.Reason, "deadline passed") {
				reason = "deadline"
			}
		}
		if d.Deadline == nil {
			t.Fatalf("order %s shows no deadline", id)
		}
		switch {
		case d.Order.Status == statestore.OrderCompleted && d.Deadline.Outcome != "ended" && d.Deadline.Outcome != "":
			t.Errorf("order %s completed, yet its deadline says %q", id, d.Deadline.Outcome)
		case d.Order.Status == statestore.OrderFailed && d.Deadline.Outcome != "compensate":
			t.Errorf("order %s failed, its deadline says %q", id, d.Deadline.Outcome)
		}
		return d.Order.Status, reason
	}
	for _, id := range slices.Concat(fenced, own) {
		if status, reason := endedBy(id); status != statestore.OrderFailed || reason != "deadline" {
			t.Errorf("order %s ended %s (%q), want failed at its deadline", id, status, reason)
		}
	}
	wins := map[string]int{}
	for _, id := range racing {
		status, reason := endedBy(id)
		if status == statestore.OrderFailed && reason != "deadline" || status != statestore.OrderFailed && status != statestore.OrderCompleted {
			t.Errorf("racing order %s ended %s (%q)", id, status, reason)
		}
		wins[status]++
	}
	t.Logf("%d completed, %d failed; the racing orders: %v", completed, failed, wins)

	// Each fenced order's charge was in flight: its compensation ran
	// (checkSaga: it undid the charge once if the service applied it).
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'refund' AND process_state = 'processed'`, fenced); n != len(fenced) {
		t.Errorf("%d of %d in-flight charges compensated", n, len(fenced))
	}
	if got := p.supervisors[0].metric(t, `sas_order_deadlines_passed_total{on_deadline="compensate",workflow="bounded"}`); got != float64(len(fenced)) {
		t.Errorf("sas_order_deadlines_passed_total for bounded: %v, want %d", got, len(fenced))
	}
	out, _, code = sasctl(t, p.env, "orders", "show", fenced[0])
	if code != 0 || !strings.Contains(out, "deadline  3s, due ") || !strings.Contains(out, "followed on_deadline compensate") {
		t.Fatalf("orders show of an order undone at its deadline:\n%s", out)
	}
	// The events of the orders with their own deadline, to their reply_to.
	ended := map[string]messages.StatusEvent{}
	testenv.Eventually(t, 30*time.Second, "the ending events of the orders with their own deadline", func() bool {
		d, ok, err := ch.Get(q.Name, true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			ev, err := messages.DecodeStatusEvent(d.Body)
			if err != nil {
				t.Fatalf("event %s: %v", d.Body, err)
			}
			if ev.Status == messages.StatusFailed {
				ended[ev.OrderID] = ev
			}
		}
		return len(ended) == len(own)
	})
	for id, ev := range ended {
		if ev.Reason != messages.EndDeadline || !strings.Contains(ev.Detail, "deadline of 2 s") || !slices.Contains(ev.Undone, "note") {
			t.Errorf("order %s's ending event %+v, want reason deadline with note undone", id, ev)
		}
	}
}
