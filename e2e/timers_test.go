package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/messages"
)

const timersFile = `
workflows:
  - name: cooling_off
    steps:
      - {action: score, agent: risk, timeout: 20s}
      - {action: open_account, agent: core, timeout: 20s, delay: 2s}
  - name: start_later
    steps:
      - {action: remind, agent: core, timeout: 20s, delay: 3s}
  - name: statement
    steps:
      - {action: send_statement, agent: core, timeout: 20s}
      - {action: file_statement, agent: core, timeout: 20s}
`

// TestTimersFireWithinASecondOfDue: 1,000 orders wait 2 s between their
// two steps, 500 start 3 s after they were written (a first step's
// delay) and 1,000 of a list workflow are submitted with start_at spread
// from 5 s to 15 s ahead, with real binaries: every delayed step is made
// pending once, never before its due time and within a second of it
// (p99) on the database clock, by the supervisor; every order completes.
func TestTimersFireWithinASecondOfDue(t *testing.T) {
	t.Parallel()
	g := runFile(t, "timers.yaml", timersFile, pipelineOpts{supervisors: 1, agents: 2, schedulers: 1})
	p := g.pipeline
	ids := g.submit(t, "cooling_off", slices.Repeat([]string{`{}`}, 1000))
	ids = append(ids, g.submit(t, "start_later", slices.Repeat([]string{`{}`}, 500))...)
	var dbNow time.Time
	if err := p.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	ch := amqpChannel(t)
	for i := range 1000 {
		id := messages.NewID()
		startAt := dbNow.Add(5*time.Second + time.Duration(i)*10*time.Millisecond)
		body, err := messages.Encode(messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: id, Workflow: "statement",
			Payload: []byte(`{}`), StartAt: &startAt})
		if err != nil {
			t.Fatal(err)
		}
		publish(t, ch, p.submit, messages.ContentType, id, body)
		ids = append(ids, id)
	}
	// One order that starts in an hour: what shows it says when.
	later := messages.NewID()
	inAnHour := dbNow.Add(time.Hour)
	body, err := messages.Encode(messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: later, Workflow: "statement",
		Payload: []byte(`{}`), StartAt: &inAnHour})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ch, p.submit, messages.ContentType, later, body)
	p.waitTerminal(t, ids, 2*time.Minute)
	out, _, code := sasctl(t, p.env, "orders", "show", later)
	if code != 0 || !strings.Contains(out, "delayed") || !strings.Contains(out, "due "+inAnHour.UTC().Format("2006-01-02")) {
		t.Fatalf("orders show of an order that starts in an hour:\n%s", out)
	}
	if completed, _ := p.checkSaga(t, ids); completed != len(ids) {
		t.Fatalf("%d of %d orders completed\n%s", completed, len(ids), p.stuck(t, ids))
	}
	var delayed, fired, early, twice int
	var p99, worst float64
	if err := p.pool.QueryRow(context.Background(), `
		WITH f AS (
		    SELECT s.order_id, s.step, count(t.id) AS n, min(t.at) AS at, s.due_at
		    FROM steps s LEFT JOIN transitions t ON t.order_id = s.order_id AND t.step = s.step
		                                          AND t.from_state = 'delayed' AND t.to_state = 'pending'
		    WHERE s.order_id = ANY($1::uuid[]) AND s.due_at IS NOT NULL
		    GROUP BY s.order_id, s.step, s.due_at)
		SELECT count(*), count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE at < due_at), count(*) FILTER (WHERE n > 1),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM at - due_at)), 0),
		       coalesce(max(extract(epoch FROM at - due_at)), 0)::float8
		FROM f`, ids).Scan(&delayed, &fired, &early, &twice, &p99, &worst); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d delayed steps, %d fired once; late by p99 %.0f ms, at most %.0f ms", delayed, fired, p99*1000, worst*1000)
	if delayed != len(ids) || fired != len(ids) || early != 0 || twice != 0 {
		t.Fatalf("%d delayed steps of %d orders: %d fired once, %d early, %d twice", delayed, len(ids), fired, early, twice)
	}
	if p99 > 1 {
		t.Fatalf("timers fired late by %.0f ms at p99, want within a second of due", p99*1000)
	}
}
