package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/broker"
	"sas/internal/harness/badinput"
	"sas/internal/harness/netproxy"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/scheduler"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// stack is one test's isolated piece of the world.
type stack struct {
	dbURL  string
	pool   *pgxpool.Pool
	topo   broker.Topology
	env    []string
	submit string // the submit queue's name
	dlq    string // its dead-letter queue
}

func newStack(t *testing.T) stack {
	t.Helper()
	return newStackFor(t, workflow.Builtin().Agents())
}

// newStackFor is newStack for the agent kinds of another workflows file.
func newStackFor(t *testing.T, kinds []string) stack {
	t.Helper()
	return newStackOf(t, kinds, broker.QueueQuorum)
}

// newStackOf is newStackFor with queues of queueType (broker.QueueQuorum
// or broker.QueueClassic), declared so and named to every service.
func newStackOf(t *testing.T, kinds []string, queueType string) stack {
	t.Helper()
	dbURL, pool := testenv.Database(t)
	topo := scheduler.Topology(testenv.Prefix(t), 10, queueType, kinds)
	topo.Inputs = append(topo.Inputs, submitter.Input)
	testenv.Broker(t, topo)
	vars := []string{"SAS_DATABASE_URL=" + dbURL, "SAS_AMQP_URL=" + testenv.AMQPURL(),
		"SAS_QUEUE_PREFIX=" + topo.Prefix, "SAS_LOG_LEVEL=debug"}
	if queueType != broker.QueueQuorum {
		vars = append(vars, "SAS_QUEUE_TYPE="+queueType)
	}
	return stack{
		dbURL: dbURL, pool: pool, topo: topo,
		env:    env(vars...),
		submit: topo.Queue(submitter.Input),
		dlq:    topo.DeadLetterQueue(submitter.Input),
	}
}

func (s stack) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestSubmitterWritesOrdersAndDeadLettersBadInput(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	sub := start(t, "submitter", s.env)

	// Valid orders through sasctl, as an application would post them.
	out := sasctlOK(t, s.env, "submit", "--count", "100", "--print-ids")
	ids := strings.Fields(out)
	if len(ids) != 100 {
		t.Fatalf("sasctl printed %d ids, want 100", len(ids))
	}
	testenv.Eventually(t, 60*time.Second, "100 orders written", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids) == 100
	})
	// Each order landed whole: 3 actions and 3 compensations, 2 history
	// entries (the order received, its first step pending: steps created
	// waiting get none), 1 received event.
	if n := s.count(t, `SELECT count(*) FROM orders o WHERE
		(SELECT count(*) FROM steps s WHERE s.order_id = o.order_id) <> 6 OR
		(SELECT count(*) FROM transitions h WHERE h.order_id = o.order_id) <> 2 OR
		(SELECT count(*) FROM outbox b WHERE b.order_id = o.order_id) <> 1`); n != 0 {
		t.Fatalf("%d orders were not written whole", n)
	}

	ch := amqpChannel(t)
	// The same order delivered three times (as a publisher's retry or a
	// redelivery would) is written once; the repeats change nothing.
	before := s.count(t, `SELECT count(*) FROM transitions`)
	fresh := messages.NewID()
	body := []byte(badinput.ValidSubmitJSON(fresh))
	for range 3 {
		publish(t, ch, s.submit, messages.ContentType, fresh, body)
	}
	testenv.Eventually(t, 30*time.Second, "the order and its two duplicates handled", func() bool {
		return sub.metric(t, `sas_submitter_orders_total{outcome="duplicate"}`) == 2
	})
	if n := s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1`, fresh); n != 1 {
		t.Fatalf("%d rows for an order sent three times", n)
	}
	if n := s.count(t, `SELECT count(*) FROM transitions`); n != before+2 {
		t.Fatalf("history grew by %d for one order sent three times, want 2", n-before)
	}

	// Every bad input of the catalogue, plus a conflict (the same order id
	// with another amount), each followed by a valid order: the bad ones
	// land in the dead-letter queue with their reason, the good ones in
	// the store.
	cases := badinput.SubmitOrders(messages.NewID)
	cases = append(cases, badinput.SubmitPayloads(messages.NewID)...)
	cases = append(cases, badinput.Case{
		Name:   "conflict",
		Body:   []byte(strings.Replace(badinput.ValidSubmitJSON(fresh), `"amount":1999`, `"amount":2999`, 1)),
		Reason: submitter.ReasonConflict,
	}, badinput.Case{
		Name:   "unknown workflow",
		Body:   []byte(strings.Replace(badinput.ValidSubmitJSON(messages.NewID()), `"amount":1999`, `"amount":1999,"workflow":"teleport"`, 1)),
		Reason: submitter.ReasonUnknownWorkflow,
	})
	want := map[string]badinput.Case{}
	var goodIDs []string
	for i, c := range cases {
		id := fmt.Sprintf("bad-%d", i)
		want[id] = c
		ct := c.ContentType
		if ct == "" {
			ct = messages.ContentType
		}
		publish(t, ch, s.submit, ct, id, c.Body)
		good := messages.NewID()
		goodIDs = append(goodIDs, good)
		publish(t, ch, s.submit, messages.ContentType, good, []byte(badinput.ValidSubmitJSON(good)))
	}
	dead := drain(t, ch, s.dlq, len(cases), 60*time.Second)
	for _, d := range dead {
		c, ok := want[d.MessageId]
		if !ok {
			t.Errorf("unexpected dead letter %q: %v", d.MessageId, d.Headers)
			continue
		}
		delete(want, d.MessageId)
		if got := d.Headers[broker.HeaderErrorReason]; got != c.Reason {
			t.Errorf("%s: dead-lettered with reason %v (%v), want %s", c.Name, got, d.Headers[broker.HeaderErrorDetail], c.Reason)
		}
		if d.Headers[broker.HeaderErrorDetail] == "" || d.Headers[broker.HeaderOriginalQueue] != s.submit {
			t.Errorf("%s: headers %v", c.Name, d.Headers)
		}
		if detail, _ := d.Headers[broker.HeaderErrorDetail].(string); !strings.HasPrefix(detail, c.DetailPrefix) {
			t.Errorf("%s: detail %q does not start with %q", c.Name, detail, c.DetailPrefix)
		}
		if string(d.Body) != string(c.Body) {
			t.Errorf("%s: dead letter's body was changed", c.Name)
		}
	}
	for id, c := range want {
		t.Errorf("%s (%s) was not dead-lettered", c.Name, id)
	}
	testenv.Eventually(t, 60*time.Second, "the valid orders between the bad ones written", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, goodIDs) == len(goodIDs)
	})
	// The conflicting resubmission did not change the stored order.
	if n := s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND (payload->>'amount')::int = 1999`, fresh); n != 1 {
		t.Fatal("a conflicting submission changed the stored order")
	}
	if got := sub.metric(t, `sas_submitter_orders_total{outcome="rejected"}`); got != float64(len(cases)) {
		t.Errorf("rejected counter %v, want %d", got, len(cases))
	}
	if got := sub.metric(t, fmt.Sprintf(`sas_dead_lettered_total{queue=%q,reason="not_json"}`, s.submit)); got < 1 {
		t.Errorf("dead-letter counter for not_json is %v", got)
	}
	if sub.exited() {
		t.Fatalf("submitter exited: %v\n%s", sub.err, sub.tail())
	}
	q, err := ch.QueueDeclarePassive(s.submit, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("submit queue left with %d messages (%v)", q.Messages, err)
	}
}

// TestSubmitterSurvivesConnectionLoss cuts the submitter's broker
// connection several times while orders stream in: every confirmed order
// lands exactly once.
func TestSubmitterSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	viaProxy, proxy := testenv.Proxied(t, testenv.AMQPURL())
	subEnv := append(append([]string{}, s.env...), "SAS_AMQP_URL="+viaProxy, "SAS_SUBMITTER_PREFETCH=16")
	sub := start(t, "submitter", subEnv)

	const n = 1500
	type result struct {
		ids  []string
		err  string
		code int
	}
	published := make(chan result, 1)
	go func() {
		out, errOut, code := sasctl(t, s.env, "submit", "--count", fmt.Sprint(n), "--print-ids", "--concurrency", "8")
		published <- result{strings.Fields(out), errOut, code}
	}()

	cuts := 0
	for _, at := range []int{n / 5, 2 * n / 5, 3 * n / 5} {
		testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d orders before cut %d", at, cuts+1), func() bool {
			return s.count(t, `SELECT count(*) FROM orders`) >= at
		})
		if proxy.Sever() > 0 {
			cuts++
		}
		// Wait for the submitter to consume again before the next cut.
		testenv.Eventually(t, 30*time.Second, "the submitter to reconnect", func() bool {
			return sub.metric(t, "sas_broker_reconnects_total") >= float64(cuts)
		})
	}
	res := <-published
	if res.code != 0 || len(res.ids) != n {
		t.Fatalf("sasctl submit: exit %d, %d ids: %s", res.code, len(res.ids), res.err)
	}
	testenv.Eventually(t, 90*time.Second, fmt.Sprintf("all %d orders written", n), func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, res.ids) == n
	})
	if total := s.count(t, `SELECT count(*) FROM orders`); total != n {
		t.Fatalf("%d orders in the store, want %d", total, n)
	}
	if cuts < 3 {
		t.Fatalf("only %d connection cuts happened", cuts)
	}
	t.Logf("%d connection cuts, %v reconnects, %v duplicates from redelivery", cuts,
		sub.metric(t, "sas_broker_reconnects_total"), sub.metric(t, `sas_submitter_orders_total{outcome="duplicate"}`))
}

// TestSubmitterRidesOutDatabaseOutage takes the database away while orders
// arrive: the submitter reports not ready and keeps the orders; on SIGTERM
// it hands them back at once (not after its shutdown timeout) and exits
// cleanly; a new submitter writes every one of them once the database is
// back. None is dead-lettered or lost.
func TestSubmitterRidesOutDatabaseOutage(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	viaProxy, proxy := testenv.Proxied(t, s.dbURL)
	subEnv := append(append([]string{}, s.env...), "SAS_DATABASE_URL="+viaProxy, "SAS_SHUTDOWN_TIMEOUT=60s")
	sub := start(t, "submitter", subEnv)

	proxy.SetDown(true)
	out := sasctlOK(t, s.env, "submit", "--count", "200", "--print-ids")
	ids := strings.Fields(out)
	testenv.Eventually(t, 30*time.Second, "the submitter to retry and report not ready", func() bool {
		return sub.metric(t, "sas_submitter_db_retries_total") > 0 && !ready(sub)
	})
	began := time.Now()
	sub.stop(t)
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("SIGTERM during a database outage took %v to stop the submitter", took)
	}
	if n := s.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders written while the database was away", n)
	}

	proxy.SetDown(false)
	start(t, "submitter", subEnv)
	testenv.Eventually(t, 60*time.Second, "all 200 orders written after the outage", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids) == 200
	})
	q, err := amqpChannel(t).QueueDeclarePassive(s.dlq, true, false, false, false, nil)
	if err != nil || q.Messages != 0 {
		t.Fatalf("%d messages dead-lettered during a database outage (%v)", q.Messages, err)
	}
}

// TestServicesStartWhileTheDatabaseIsDown: every service with a database
// starts while it cannot be reached: alive (/healthz), not ready
// (/readyz says what it waits for), trying again with backoff, one log
// line per try, and never exiting; once the database answers, they work.
func TestServicesStartWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	viaProxy, proxy := testenv.Proxied(t, s.dbURL)
	proxy.SetDown(true)
	p := &pipeline{stack: s}
	p.remote = startOn(t, "remote", append(append([]string{}, s.env...), "SAS_REMOTE_FAULTS={}"), "SAS_REMOTE_ADDR")
	env := append(append([]string{}, s.env...), "SAS_DATABASE_URL="+viaProxy)
	var waiting []*proc
	for _, name := range []string{"submitter", "scheduler", "supervisor"} {
		extra := []string{}
		if name == "supervisor" {
			extra = []string{"SAS_SUPERVISOR_INTERVAL=200ms", "SAS_SUPERVISOR_LEASE_TTL=1s"}
		}
		waiting = append(waiting, launch(t, name, append(append([]string{}, env...), extra...), "SAS_METRICS_ADDR"))
	}
	for _, w := range waiting {
		testenv.Eventually(t, 30*time.Second, w.name+" to wait for the database, alive and not ready", func() bool {
			if w.exited() {
				t.Fatalf("%s exited while the database was down: %v\n%s", w.name, w.err, w.tail())
			}
			health, _ := w.get("/healthz")
			status, body := w.get("/readyz")
			return health == http.StatusOK && status == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the database") &&
				strings.Count(w.logText(), "database not reachable; waiting for it") >= 3
		})
	}
	// One line per try, the tries spaced by a growing backoff: a few
	// lines a second at first, not hundreds.
	for _, w := range waiting {
		if n := strings.Count(w.logText(), "database not reachable"); n > 20 {
			t.Errorf("%s logged %d tries within seconds", w.name, n)
		}
		if !strings.Contains(w.logText(), `"retry_in":"`) {
			t.Errorf("%s does not say when it tries again:\n%s", w.name, w.tail())
		}
	}

	proxy.SetDown(false)
	for _, w := range waiting {
		testenv.Eventually(t, 30*time.Second, w.name+" to become ready once the database answers", func() bool {
			return ready(w)
		})
	}
	p.submitter, p.schedulers, p.supervisors = waiting[0], waiting[1:2], waiting[2:]
	p.startAgent(t)
	ids := p.submitOrders(t, 20)
	p.waitTerminal(t, ids, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != 20 {
		t.Fatalf("%d of 20 orders completed", n)
	}
	testenv.Eventually(t, 30*time.Second, "the supervisor to lead", func() bool {
		return waiting[2].metric(t, "sas_supervisor_leader") == 1
	})
}

// TestServicesStartThroughALostConnection: a database connection lost
// at any statement a service runs as it starts (after its database first
// answered, before it serves: the schema check, the workflow versions,
// the step token key, the file's limits, step events, the schedules),
// or a broker connection lost while it declares its queues, delays the
// service, which says what it retries; it never stops it.
func TestServicesStartThroughALostConnection(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	users := filepath.Join(t.TempDir(), "users")
	consoleUser(t, users, "alice", "operator", "alice's password")
	services := []struct {
		name   string
		db     string   // its login; "": none
		cuts   []string // a fragment of each statement it runs as it starts
		broker bool     // it declares queues and exchanges as it starts
		extra  []string
	}{
		{"scheduler", s.dbURL, []string{"FROM step_token_key", "INSERT INTO agent_limits", "namespace_limits_sync(", "INSERT INTO status_routes"},
			true, []string{"SAS_SCHEDULER_STEP_EVENTS=true"}},
		{"submitter", s.dbURL, []string{"INSERT INTO workflow_versions"}, true, nil},
		{"supervisor", s.dbURL, []string{"SELECT now()", "UPDATE schedules SET in_file"}, false, nil},
		{"api", apiLogin(t, s), []string{"FROM orders LIMIT 0", "INSERT INTO workflow_versions"}, true, []string{"SAS_API_ADDR=" + freeAddr(t)}},
		{"console", consoleLogin(t, s), []string{"FROM orders LIMIT 0"}, false,
			[]string{"SAS_CONSOLE_ADDR=" + freeAddr(t), "SAS_CONSOLE_USERS_FILE=" + users}},
		{"agent", "", nil, true, []string{"SAS_REMOTE_URL=http://" + freeAddr(t)}},
	}
	type started struct {
		p       *proc
		db      *netproxy.Proxy   // its database's, when it has one
		proxies []*netproxy.Proxy // every one it goes through
		cuts    int
	}
	var all []started
	for _, sv := range services {
		env := append(append([]string{}, s.env...), sv.extra...)
		st := started{cuts: len(sv.cuts)}
		if sv.db != "" {
			viaProxy, proxy := testenv.Proxied(t, sv.db)
			for _, f := range sv.cuts {
				proxy.CutOn(f)
			}
			env, st.db, st.proxies = append(env, "SAS_DATABASE_URL="+viaProxy), proxy, append(st.proxies, proxy)
		}
		if sv.broker {
			viaProxy, proxy := testenv.Proxied(t, testenv.AMQPURL())
			proxy.CutOn(s.topo.DeadLetterExchange()) // the first exchange it declares
			env, st.proxies = append(env, "SAS_AMQP_URL="+viaProxy), append(st.proxies, proxy)
			st.cuts++
		}
		st.p = launch(t, sv.name, env, "SAS_METRICS_ADDR")
		all = append(all, st)
	}
	for _, st := range all {
		testenv.Eventually(t, time.Minute, st.p.name+" to start through its lost connections", func() bool {
			if st.p.exited() {
				t.Fatalf("%s exited as a connection was lost: %v\n%s", st.p.name, st.p.err, st.p.tail())
			}
			cuts := 0
			for _, p := range st.proxies {
				cuts += p.Cuts()
			}
			return cuts == st.cuts && ready(st.p)
		})
		if st.db != nil {
			want := st.db.Cuts()
			if n := strings.Count(st.p.logText(), "failed, retrying"); n < want {
				t.Errorf("%s said it retried %d times for %d lost database connections:\n%s", st.p.name, n, want, st.p.tail())
			}
		}
	}
}
