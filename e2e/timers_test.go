package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/testenv"
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
  - name: one_second
    steps:
      - {action: ping, agent: core, timeout: 20s, delay: 1s}
`

// TestTimers runs the two tests of timers fired on time side by side,
// before the parallel tests and beside none of them: their bounds are of
// time, which the other tests' stacks on two cores would take (they
// failed beside two of them in a slow hour), while these two leave each
// other room. Together they held p99 at 93 ms from due, and 72 ms from
// the database's return, against a second (2026-11-30); one after the
// other they took 57 s of the suite on one test at a time.
func TestTimers(t *testing.T) {
	t.Run("FireWithinASecondOfDue", func(t *testing.T) {
		t.Parallel()
		timersFireWithinASecondOfDue(t)
	})
	t.Run("FireOnTimeAcrossADatabaseRestart", func(t *testing.T) {
		t.Parallel()
		timersFireOnTimeAcrossADatabaseRestart(t)
	})
}

// timersFireWithinASecondOfDue (TestTimers): 1,000 orders wait 2 s
// between their two steps, 500 start 3 s after they were written (a first
// step's delay) and 1,000 of a list workflow are submitted with start_at
// spread from 5 s to 15 s ahead, with real binaries: every delayed step
// is made pending once, never before its due time and within a second of
// it (p99) on the database clock, by the supervisor; every order
// completes.
func timersFireWithinASecondOfDue(t *testing.T) {
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
	ts := readTimerStats(t, p.pool, ids)
	delayed, fired, early, twice, p99, worst := ts.timers, ts.fired, ts.early, ts.twice, ts.p99, ts.worst
	t.Logf("%d delayed steps, %d fired once; late by p99 %.0f ms, at most %.0f ms", delayed, fired, p99*1000, worst*1000)
	if delayed != len(ids) || fired != len(ids) || early != 0 || twice != 0 {
		t.Fatalf("%d delayed steps of %d orders: %d fired once, %d early, %d twice", delayed, len(ids), fired, early, twice)
	}
	if p99 > 1 {
		t.Fatalf("timers fired late by %.0f ms at p99, want within a second of due", p99*1000)
	}
}

// timerOrders is how many orders of each kind the timers' restart test
// runs, and over how long their start_at times are spread:
// SAS_TIMERS_ORDERS over 60 s (make timers sets 10,000), else a short
// run for make test, 1,000 over 30 s.
func timerOrders() (int, time.Duration) {
	if n, err := strconv.Atoi(os.Getenv("SAS_TIMERS_ORDERS")); err == nil && n > 0 {
		return n, time.Minute
	}
	return 1000, 30 * time.Second
}

const restartTimersFile = `
workflows:
  - name: later
    steps:
      - {action: note, agent: clock, timeout: 20s}
  - name: cool
    steps:
      - {action: cool_note, agent: clock, timeout: 20s, delay: 20s}
`

// timersFireOnTimeAcrossADatabaseRestart (TestTimers): N orders
// submitted with start_at spread over 60 s (30 in make test) and N whose
// step has a 20 s delay, on a PostgreSQL of the test's own that is
// restarted while they wait (-m fast, as an upgrade does): every timer
// fires once, none before its due time, within a second of it at p99 on
// the database clock (of the database's return, for one that fell due
// while it was down: on a loaded machine the restart alone can take a
// second).
func timersFireOnTimeAcrossADatabaseRestart(t *testing.T) {
	n, spread := timerOrders()
	dir, st := ownDatabaseStack(t, "async", "5460", []string{"clock"})
	pool := st.pool
	script := filepath.Join("..", "scripts", "pg-standby.sh")
	file := writeFile(t, "restart-timers.yaml", restartTimersFile)
	wf := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, schedulers: 1, agents: 2, supervisors: 1,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf}, supervisorEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=clock"}})

	var dbNow time.Time
	if err := pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	ch := amqpChannel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var confirms []*amqp.DeferredConfirmation
	send := func(o messages.SubmitOrder) {
		body, err := messages.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", p.submit, true, false,
			amqp.Publishing{ContentType: messages.ContentType, MessageId: o.OrderID, DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, dc)
		ids = append(ids, o.OrderID)
	}
	for i := range n {
		startAt := dbNow.Add(5*time.Second + time.Duration(i)*spread/time.Duration(n))
		send(messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: "later",
			Payload: []byte(`{}`), StartAt: &startAt})
		send(messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: "cool", Payload: []byte(`{}`)})
	}
	for _, dc := range confirms {
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			t.Fatalf("a submit not confirmed: %v %v", ok, err)
		}
	}
	// Restart the database while timers fall due: once the first of the
	// cooling-off ones have fired.
	testenv.Eventually(t, 2*time.Minute, "the delays to start ending", func() bool {
		var fired int
		return pool.QueryRow(context.Background(), `SELECT count(*) FROM transitions WHERE from_state = 'delayed' AND to_state = 'pending'
			AND order_id IN (SELECT order_id FROM orders WHERE workflow = 'cool')`).Scan(&fired) == nil && fired > 0
	})
	restartAt := time.Now()
	if out, err := exec.Command(script, "restart", dir, "5460").CombinedOutput(); err != nil {
		t.Fatalf("restart the database: %v\n%s", err, out)
	}
	took := time.Since(restartAt)
	t.Logf("the database restarted in %v", took.Round(time.Millisecond))
	pool.Reset() // the test's own connections died with it
	p.waitTerminal(t, ids, 3*time.Minute)
	// Nothing fires while the database is down: a timer that fell due
	// then is measured from the database's return as well as from its
	// due time. It returned when it began to accept connections, as its
	// own log says on its own clock; its postmaster starts earlier, by a
	// second or more on a loaded machine (recovery, the checkpoint).
	back := readyAt(t, filepath.Join(dir, "primary.log"))

	ts := readTimerStats(t, pool, ids)
	delayed, fired, early, twice, completed, p50, p99, worst := ts.timers, ts.fired, ts.early, ts.twice, ts.completed, ts.p50, ts.p99, ts.worst
	since := readTimerStatsFrom(t, pool, ids, &back)
	t.Logf("the database accepted connections again at %s", back.Format("15:04:05.000"))
	t.Logf("%d timers (%d start_at over %v, %d delays), %d fired once; late by p50 %.0f ms, p99 %.0f ms, at most %.0f ms; "+
		"from the database's return when it was down at their due time: p99 %.0f ms, at most %.0f ms",
		delayed, n, spread, n, fired, p50*1000, p99*1000, worst*1000, since.p99*1000, since.worst*1000)
	if delayed != 2*n || fired != 2*n || early != 0 || twice != 0 || completed != 2*n {
		t.Fatalf("%d timers of %d orders: %d fired once, %d early, %d twice; %d orders completed", delayed, 2*n, fired, early, twice, completed)
	}
	if since.p99 > 1 {
		t.Fatalf("timers fired late by %.0f ms at p99 (from their due time, or the database's return if it was down then), want within a second", since.p99*1000)
	}
	if p99 > 1+took.Seconds() {
		t.Fatalf("timers fired late by %.0f ms at p99 across a restart of %v, want within a second of it", p99*1000, took.Round(time.Millisecond))
	}
}

// readyAt is when a PostgreSQL server last began to accept connections,
// from the line its log (log_line_prefix '%m [%p] ', the default) writes
// then, on the server's clock.
func readyAt(t *testing.T, logFile string) time.Time {
	t.Helper()
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var at time.Time
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, "database system is ready to accept connections") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		ts, err := time.Parse("2006-01-02 15:04:05.000 MST", f[0]+" "+f[1]+" "+f[2])
		if err != nil {
			t.Fatalf("the server's log line %q: %v", line, err)
		}
		at = ts
	}
	if at.IsZero() {
		t.Fatalf("%s never says the server accepts connections", logFile)
	}
	return at
}

// timerStats is what became of the timers of some orders: how many, how
// many fired once, early or twice, how many orders completed, and how
// late they fired on the database clock (seconds).
type timerStats struct {
	timers, fired, early, twice, completed int
	p50, p99, worst                        float64
}

func readTimerStats(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, ids []string) timerStats {
	return readTimerStatsFrom(t, pool, ids, nil)
}

// readTimerStatsFrom is readTimerStats with lateness counted from back,
// when set, for a timer that fell due before it: when the database was
// back, before which nothing can fire.
func readTimerStatsFrom(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, ids []string, back *time.Time) timerStats {
	t.Helper()
	var s timerStats
	if err := pool.QueryRow(context.Background(), `
		WITH f AS (
		    SELECT s.order_id, s.step, count(t.id) AS n, min(t.at) AS at, s.due_at
		    FROM steps s LEFT JOIN transitions t ON t.order_id = s.order_id AND t.step = s.step
		                                          AND t.from_state = 'delayed' AND t.to_state = 'pending'
		    WHERE s.order_id = ANY($1::uuid[]) AND s.due_at IS NOT NULL
		    GROUP BY s.order_id, s.step, s.due_at)
		SELECT count(*), count(*) FILTER (WHERE n = 1), count(*) FILTER (WHERE at < due_at), count(*) FILTER (WHERE n > 1),
		       (SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM at - greatest(due_at, coalesce($2, due_at)))), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM at - greatest(due_at, coalesce($2, due_at)))), 0),
		       coalesce(max(extract(epoch FROM at - greatest(due_at, coalesce($2, due_at)))), 0)::float8
		FROM f`, ids, back).Scan(&s.timers, &s.fired, &s.early, &s.twice, &s.completed, &s.p50, &s.p99, &s.worst); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTimersDueAtOnce measures (make bench-timers: SAS_TIMERS_BURST
// orders, 1,000 by default there; skipped in make test) how late N
// one-second timers fire when they fall due together: orders published
// at once whose only step has a delay of a second from when its order was
// written, so that they fall due over the moments the orders were
// written, many while the supervisor fires others. A figure for
// docs/BENCHMARKS.md, not a timed test: it fails only when a timer fires
// early, twice, or not at all.
func TestTimersDueAtOnce(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("SAS_TIMERS_BURST"))
	if err != nil || n <= 0 {
		t.Skip("make bench-timers sets SAS_TIMERS_BURST")
	}
	g := runFile(t, "timers.yaml", timersFile, pipelineOpts{supervisors: 1, agents: 2, schedulers: 2})
	p := g.pipeline
	ids := g.submit(t, "one_second", slices.Repeat([]string{`{}`}, n))
	p.waitTerminal(t, ids, 2*time.Minute)
	ts := readTimerStats(t, p.pool, ids)
	t.Logf("%d timers due at once: %d fired once, %d early, %d twice; late by p50 %.0f ms, p99 %.0f ms, at most %.0f ms",
		ts.timers, ts.fired, ts.early, ts.twice, ts.p50*1000, ts.p99*1000, ts.worst*1000)
	if ts.fired != n || ts.early != 0 || ts.twice != 0 {
		t.Fatalf("%d timers: %d fired once, %d early, %d twice", n, ts.fired, ts.early, ts.twice)
	}
}
