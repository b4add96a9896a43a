package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/broker"
	"sas/internal/harness/badinput"
	"sas/internal/harness/chaos"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/scheduler"
	"sas/internal/statestore"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// haOrders is how many orders a failover test runs: SAS_HA_ORDERS (make ha
// sets 3000), else a short run for make test.
func haOrders(short int) int {
	if n, err := strconv.Atoi(os.Getenv("SAS_HA_ORDERS")); err == nil && n > 0 {
		return n
	}
	return short
}

// submitInBackground submits n orders through sasctl while the test goes
// on, and hands over their ids once all are confirmed.
func submitInBackground(t *testing.T, environ []string, n int) <-chan []string {
	idsc := make(chan []string, 1)
	go func() {
		out, errOut, code := sasctl(t, environ, "submit", "--count", strconv.Itoa(n), "--print-ids")
		ids := strings.Fields(out)
		if code != 0 || len(ids) != n {
			t.Errorf("sasctl submit: exit %d, %d ids: %s", code, len(ids), errOut)
		}
		idsc <- ids
	}()
	return idsc
}

// rabbitCluster is scripts/rabbit-cluster.sh's nodes, stopped and removed
// when the test ends.
type rabbitCluster struct {
	dir, base, name string
	urls            string
}

// startRabbitCluster starts three nodes, sasha1-3, clustered.
func startRabbitCluster(t *testing.T) rabbitCluster {
	t.Helper()
	return startRabbitNodes(t, "sasha", "5700", 3, "", "")
}

// startRabbitNodes starts n nodes named name1… with AMQP on base+1…,
// clustered, conf (if not "") added to each node's configuration and
// plugins (a list separated by commas, or "") enabled.
func startRabbitNodes(t *testing.T, name, base string, n int, conf, plugins string) rabbitCluster {
	t.Helper()
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		testenv.Unavailable(t, "rabbitmq-server (scripts/services.sh installs it)", err)
	}
	c := rabbitCluster{dir: filepath.Join(os.TempDir(), "sas-rabbit-"+name), base: base, name: name}
	script := filepath.Join("..", "scripts", "rabbit-cluster.sh")
	// A run killed before its cleanup leaves its nodes: stop them first.
	_ = exec.Command(script, "stop", c.dir, c.base, c.name).Run()
	cmd := exec.Command(script, "start", c.dir, c.base, c.name)
	cmd.Env = append(os.Environ(), fmt.Sprintf("NODES=%d", n), "CONF="+conf, "PLUGINS="+plugins)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start the RabbitMQ nodes: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "stop", c.dir, c.base, c.name).CombinedOutput(); err != nil {
			t.Logf("stop the RabbitMQ nodes: %v\n%s", err, out)
		}
	})
	lines := strings.Fields(string(out))
	if len(lines) == 0 {
		t.Fatalf("the cluster script printed no URLs\n%s", stderr.String())
	}
	c.urls = lines[len(lines)-1]
	return c
}

func (c rabbitCluster) node(n int) string { return fmt.Sprintf("%s%d@localhost", c.name, n) }

// restartApp stops RabbitMQ on node n and starts it again in the same
// Erlang runtime: every connection is closed and every queue, exchange
// and binding recovered from disk as at a restart of the node, without
// the runtime's boot (about 10 s of the 15 a restart takes here).
func (c rabbitCluster) restartApp(t *testing.T, n int) {
	t.Helper()
	for _, cmd := range []string{"stop_app", "start_app"} {
		if out, err := exec.Command("rabbitmqctl", "-q", "-n", c.node(n), cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", cmd, c.node(n), err, out)
		}
	}
}

// leaders returns each queue with the given prefix and the node that
// leads it.
func (c rabbitCluster) leaders(t *testing.T, via int, prefix string) map[string]string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "-n", c.node(via), "list_queues", "name", "leader", "--no-table-headers").CombinedOutput()
	if err != nil {
		t.Fatalf("list_queues: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && strings.HasPrefix(f[0], prefix) {
			m[f[0]] = f[1]
		}
	}
	return m
}

// kill kills node n with SIGKILL, as a crash would.
func (c rabbitCluster) kill(t *testing.T, n int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("node%d.pid", n)))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (pid %d): %v", c.node(n), pid, err)
	}
}

// TestBrokerClusterFailover: every service is given the three nodes of a
// RabbitMQ cluster; in the middle of a run the node that leads the
// submit, replies and agent queues is killed with SIGKILL. Every order
// completes, none is lost, no idempotency key takes effect twice, and the
// time from the kill to orders completing again is measured.
func TestBrokerClusterFailover(t *testing.T) {
	t.Parallel()
	n := haOrders(600)
	cl := startRabbitCluster(t)
	dbURL, pool := testenv.Database(t)
	topo := scheduler.Topology(testenv.Prefix(t), 10, broker.QueueQuorum, workflow.Builtin().Agents())
	st := stack{dbURL: dbURL, pool: pool, topo: topo,
		env:    env("SAS_DATABASE_URL="+dbURL, "SAS_AMQP_URL="+cl.urls, "SAS_QUEUE_PREFIX="+topo.Prefix, "SAS_LOG_LEVEL=debug"),
		submit: topo.Queue(submitter.Input), dlq: topo.DeadLetterQueue(submitter.Input)}
	p := newPipeline(t, pipelineOpts{on: &st, schedulers: 2, agents: 2, supervisors: 1})
	t.Cleanup(func() {
		if t.Failed() {
			for _, pr := range append(append([]*proc{p.submitter}, p.schedulers...), p.agents...) {
				t.Logf("%s:\n%s", pr.name, pr.tail())
			}
			out, _ := exec.Command("rabbitmqctl", "-q", "-n", cl.node(2), "list_queues", "name", "leader", "messages", "consumers", "members").CombinedOutput()
			t.Logf("queues:\n%s", out)
		}
	})

	// The services connected to the first node and declared every queue
	// there: it leads them all.
	leaders := cl.leaders(t, 2, topo.Prefix)
	for _, q := range []string{topo.Queue(submitter.Input), topo.Queue("replies"), topo.Queue("agent.payment")} {
		if leaders[q] != cl.node(1) {
			t.Fatalf("queue %s is led by %q, want %s (leaders: %v)", q, leaders[q], cl.node(1), leaders)
		}
	}

	idsc := submitInBackground(t, st.env, n)
	completed := func() int {
		return p.count(t, `SELECT count(*) FROM orders WHERE status = 'completed'`)
	}
	testenv.Eventually(t, 3*time.Minute, "a third of the orders completed", func() bool { return completed() >= n/3 })
	before := completed()
	cl.kill(t, 1)
	killed := time.Now()
	t.Logf("killed %s with %d of %d orders completed", cl.node(1), before, n)
	// Flowing again: every service has connected to a surviving node, and
	// 20 more orders have completed since (orders whose replies were
	// applied from memory may complete before that, without the broker).
	services := append(append([]*proc{p.submitter}, p.schedulers...), p.agents...)
	var reconnected, flowing time.Duration
	testenv.Eventually(t, 2*time.Minute, "every service reconnected", func() bool {
		for _, s := range services {
			if s.metric(t, "sas_broker_reconnects_total") < 1 || s.metric(t, "sas_broker_connected") != 1 {
				return false
			}
		}
		reconnected = time.Since(killed)
		return true
	})
	atReconnect := completed()
	testenv.Eventually(t, 2*time.Minute, "orders completing again", func() bool {
		if completed() >= min(atReconnect+20, n) {
			flowing = time.Since(killed)
			return true
		}
		return false
	})
	ids := <-idsc
	if len(ids) != n {
		t.FailNow()
	}
	p.waitTerminal(t, ids, 90*time.Second)
	if got := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); got != n {
		t.Fatalf("%d of %d orders completed", got, n)
	}
	keys, requests := p.checkOneEffectPerStep(t, ids)
	newLeaders := cl.leaders(t, 2, topo.Prefix)
	t.Logf("RabbitMQ cluster failover: %d orders completed, %d actions each applied once (%d calls); every service reconnected %v and orders flowing again %v after the kill; queues now led by %v",
		n, keys, requests, reconnected.Round(10*time.Millisecond), flowing.Round(10*time.Millisecond), distinct(newLeaders))
}

func clip(s string, n int) string { return s[:min(len(s), n)] }

func distinct(m map[string]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range m {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// startStandbyPair starts scripts/pg-standby.sh's primary and standby
// (mode sync or async), migrated, and returns the multi-host URL.
// ownDatabaseStack is a stack on a PostgreSQL primary and standby of the
// test's own (startStandbyPair), migrated, serving kinds.
func ownDatabaseStack(t *testing.T, mode, base string, kinds []string) (string, stack) {
	t.Helper()
	dir, dbURL := startStandbyPair(t, mode, base)
	topo := scheduler.Topology(testenv.Prefix(t), 10, broker.QueueQuorum, kinds)
	topo.Inputs = append(topo.Inputs, submitter.Input)
	testenv.Broker(t, topo)
	st := stack{dbURL: dbURL, topo: topo,
		env:    env("SAS_DATABASE_URL="+dbURL, "SAS_AMQP_URL="+testenv.AMQPURL(), "SAS_QUEUE_PREFIX="+topo.Prefix, "SAS_LOG_LEVEL=debug"),
		submit: topo.Queue(submitter.Input), dlq: topo.DeadLetterQueue(submitter.Input)}
	if out, errOut, code := sasctl(t, st.env, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d: %s %s", code, out, errOut)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st.pool = pool
	return dir, st
}

func startStandbyPair(t *testing.T, mode, base string) (dir, url string) {
	t.Helper()
	return startPostgresServers(t, mode, base, filepath.Join(os.TempDir(), "sas-pg-standby-"+mode))
}

// startPostgresServers starts scripts/pg-standby.sh's servers in dir
// (mode sync, async or alone) and returns their URL.
func startPostgresServers(t *testing.T, mode, base, dir string) (string, string) {
	t.Helper()
	if _, err := exec.LookPath("pg_ctlcluster"); err != nil {
		testenv.Unavailable(t, "PostgreSQL (scripts/services.sh installs it)", err)
	}
	script := filepath.Join("..", "scripts", "pg-standby.sh")
	_ = exec.Command(script, "stop", dir, base).Run()
	cmd := exec.Command(script, "start", dir, base, mode)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start the primary and standby: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "stop", dir, base).CombinedOutput(); err != nil {
			t.Logf("stop the primary and standby: %v\n%s", err, out)
		}
	})
	return dir, strings.TrimSpace(string(out))
}

// TestDatabaseFailover: every service is given the primary and its
// synchronous standby as one multi-host URL (target_session_attrs=
// read-write); in the middle of a run the primary crashes (-m immediate)
// and the standby is promoted. Every order completes, none is lost, no
// action takes effect twice.
func TestDatabaseFailover(t *testing.T) {
	t.Parallel()
	res, ids, _ := databaseFailover(t, "sync", "5440")
	if !res.OK() || res.Completed != len(ids) {
		t.Fatalf("%d of %d orders completed; %d invariants broken: %v", res.Completed, len(ids), len(res.Violations), res.Violations[:min(10, len(res.Violations))])
	}
}

// TestDatabaseFailoverAsync runs the same against an asynchronous standby
// and reports what was lost: a commit the primary reported may not have
// reached the standby. The fault suite's checker must count every
// confirmed submit missing from the store, and find nothing else broken
// but what follows from it.
func TestDatabaseFailoverAsync(t *testing.T) {
	t.Parallel()
	res, ids, missing := databaseFailover(t, "async", "5450")
	lost := 0
	for _, v := range res.Violations {
		switch v.Invariant {
		case 1:
			lost++
		case 7: // an effect of an order that is gone with the lost commits
		default:
			t.Errorf("%s", v)
		}
	}
	if lost != missing {
		t.Fatalf("the checker counts %d lost orders, the store misses %d", lost, missing)
	}
	t.Logf("PostgreSQL failover (asynchronous standby): %d of %d confirmed orders lost with the primary's last commits, %d completed; the checker reports %d lost (invariant 1) and %d effects of orders not in the store (invariant 7)",
		missing, len(ids), res.Completed, lost, len(res.Violations)-lost)
}

// databaseFailover runs HA_ORDERS orders against a primary and its
// standby (mode sync or async, ports base+1 and base+2), crashes the
// primary a third of the way and promotes the standby, waits until every
// order in the store has ended, and checks the fault suite's invariants.
// It returns the checker's result, the confirmed order ids and how many of
// them are not in the store.
func databaseFailover(t *testing.T, mode, base string) (chaos.Result, []string, int) {
	t.Helper()
	n := haOrders(300)
	dir, st := ownDatabaseStack(t, mode, base, workflow.Builtin().Agents())
	script := filepath.Join("..", "scripts", "pg-standby.sh")
	pool := st.pool
	// Steps whose progress is lost with the primary wait out their budget
	// before the supervisor resets them: 10 s, not the tests' usual 60.
	p := newPipeline(t, pipelineOpts{on: &st, schedulers: 2, agents: 2, supervisors: 1, submitterEnv: []string{"SAS_STEP_TIMEOUT=10s"}})
	t.Cleanup(func() {
		if t.Failed() {
			var missing int
			_ = pool.QueryRow(context.Background(), `SELECT $1::int - count(*) FROM orders`, n).Scan(&missing)
			t.Logf("%d orders not in the store", missing)
			rows, err := pool.Query(context.Background(), `SELECT o.status, string_agg(s.step || ':' || s.process_state, ' ' ORDER BY s.step), count(*) OVER ()
				FROM orders o JOIN steps s USING (order_id) WHERE o.status NOT IN ('completed') GROUP BY o.order_id, o.status LIMIT 5`)
			if err == nil {
				for rows.Next() {
					var st, steps string
					var total int
					_ = rows.Scan(&st, &steps, &total)
					t.Logf("unfinished order (%d): %s %s", total, st, steps)
				}
				rows.Close()
			}
			for _, pr := range append(append([]*proc{p.submitter}, p.schedulers...), p.supervisors...) {
				msgs := map[string]int{}
				for _, l := range strings.Split(pr.logText(), "\n") {
					if strings.Contains(l, `"WARN"`) || strings.Contains(l, `"ERROR"`) {
						_, m, _ := strings.Cut(l, `"msg":"`)
						m, _, _ = strings.Cut(m, `"`)
						_, e, _ := strings.Cut(l, `"err":"`)
						msgs[m+" | "+clip(e, 160)]++
					}
				}
				t.Logf("%s: %v", pr.name, msgs)
			}
		}
	})

	idsc := submitInBackground(t, st.env, n)
	completed := func() int {
		var c int
		for {
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE status = 'completed'`).Scan(&c)
			if err == nil {
				return c
			}
			time.Sleep(50 * time.Millisecond) // the database is changing hands
		}
	}
	testenv.Eventually(t, 3*time.Minute, "a third of the orders completed", func() bool { return completed() >= n/3 })
	var lagged []string
	if mode == "async" {
		// A standby that lags: it stops receiving (primary_conninfo
		// emptied and reloaded) while the primary goes on alone. On this
		// machine's loopback an unbroken stream is never far behind.
		port, _ := strconv.Atoi(base)
		standby, err := pgx.Connect(context.Background(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port+2))
		if err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{`ALTER SYSTEM SET primary_conninfo = ''`, `SELECT pg_reload_conf()`} {
			if _, err := standby.Exec(context.Background(), stmt); err != nil {
				t.Fatal(err)
			}
		}
		standby.Close(context.Background())
		conn, err := pgx.Connect(context.Background(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port+1))
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the standby no longer streaming", func() bool {
			var c int
			err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_replication`).Scan(&c)
			return err == nil && c == 0
		})
		// Orders submitted meanwhile, confirmed by the broker and
		// committed by the submitter on the primary alone.
		ch := amqpChannel(t)
		for range 50 {
			id := messages.NewID()
			publish(t, ch, st.submit, messages.ContentType, id, []byte(badinput.ValidSubmitJSON(id)))
			lagged = append(lagged, id)
		}
		testenv.Eventually(t, 5*time.Second, "the orders submitted while the standby lags committed", func() bool {
			var c int
			err := conn.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, lagged).Scan(&c)
			return err == nil && c == len(lagged)
		})
		conn.Close(context.Background())
	}
	before := completed()
	if out, err := exec.Command(script, "crash", dir, base).CombinedOutput(); err != nil {
		t.Fatalf("crash the primary: %v\n%s", err, out)
	}
	crashed := time.Now()
	if out, err := exec.Command(script, "promote", dir, base).CombinedOutput(); err != nil {
		t.Fatalf("promote the standby: %v\n%s", err, out)
	}
	promoted := time.Since(crashed)
	t.Logf("crashed the primary with %d of %d orders completed; standby promoted %v later", before, n, promoted.Round(time.Millisecond))
	var flowing time.Duration
	testenv.Eventually(t, 2*time.Minute, "orders completing on the new primary", func() bool {
		if completed() >= min(before+20, n) {
			flowing = time.Since(crashed)
			return true
		}
		return false
	})
	ids := <-idsc
	if len(ids) != n {
		t.FailNow()
	}
	ids = append(ids, lagged...)
	// Every order the store has ends; the outbox empties.
	testenv.Eventually(t, 3*time.Minute, "every order in the store ended and the outbox published", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE status NOT IN ('completed', 'failed', 'error')`)+
			p.count(t, `SELECT count(*) FROM outbox`) == 0
	})
	missing := len(ids) - p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids)
	audit, err := statestore.New(pool).ReadAudit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	confirmed := map[string]bool{}
	for _, id := range ids {
		confirmed[id] = true
	}
	res := chaos.Check(chaos.History{Confirmed: confirmed}, audit, p.ledger(t))
	t.Logf("PostgreSQL failover (%s standby): %d orders confirmed, %d completed, %d actions applied (%d calls); orders flowing again %v after the crash; %d invariants broken",
		mode, len(ids), res.Completed, res.Keys, res.Requests, flowing.Round(10*time.Millisecond), len(res.Violations))
	return res, ids, missing
}
