package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// ruleFields returns, in order, the values of every "key: value" line of
// deploy/prometheus/alerts.yml whose key is key ("- alert", "expr").
func ruleFields(t *testing.T, key string) []string {
	t.Helper()
	raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+": "); ok {
			out = append(out, v)
		}
	}
	return out
}

// alertStates returns, by rule, the states Prometheus has its alerts in.
func alertStates(t *testing.T, prom string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range r.Data.Alerts {
		out[a.Labels["alertname"]] = a.State
	}
	return out
}

// lastEvaluation is when Prometheus last evaluated the rules.
func lastEvaluation(t *testing.T, prom string) time.Time {
	t.Helper()
	resp, err := http.Get("http://" + prom + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Data.Groups) == 0 {
		t.Fatalf("rules: %v", err)
	}
	return r.Data.Groups[0].LastEvaluation
}

// TestEveryAlertRuleFires runs the alert rules, with every for: made 0s
// (the only change; thresholds, expressions and labels as shipped), in a
// real Prometheus scraping a running stack. Healthy, no rule fires; then
// each rule's condition is caused once, as it would happen, and every
// rule must reach firing.
func TestEveryAlertRuleFires(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	short := regexp.MustCompile(`(?m)^(\s+)for: .*$`).ReplaceAllString(string(raw), "${1}for: 0s")
	rulesFile := filepath.Join(t.TempDir(), "alerts.yml")
	if err := os.WriteFile(rulesFile, []byte(short), 0o600); err != nil {
		t.Fatal(err)
	}

	s := newStack(t)
	viaProxy, dbProxy := testenv.Proxied(t, s.dbURL)
	// Ended orders are archived to a directory a second after they end.
	archiveDir := t.TempDir()
	p := newPipeline(t, pipelineOpts{on: &s, supervisors: 2,
		schedulerEnv: []string{"SAS_DATABASE_URL=" + viaProxy},
		supervisorEnv: []string{"SAS_SUPERVISOR_STATS_INTERVAL=200ms", "SAS_ARCHIVE=" + archiveDir, "SAS_RETENTION=1s",
			"SAS_RETENTION_INTERVAL=200ms"}})
	testenv.Eventually(t, 30*time.Second, "a supervisor to lead", func() bool {
		return sum(t, p.supervisors, "sas_supervisor_leader") == 1
	})
	procs := []*proc{p.remote, p.submitter, p.schedulers[0], p.agents[0], p.supervisors[0], p.supervisors[1]}
	pr := startPrometheusWith(t, procs, rulesFile)
	prom := pr.addr

	// Healthy, with orders flowing: nothing fires.
	ids := p.submitOrders(t, 30)
	p.waitTerminal(t, ids, time.Minute)
	testenv.Eventually(t, 60*time.Second, "every target scraped", func() bool {
		r := promQuery(t, prom, `count(up{job=~"sas-.*"} == 1)`)
		return len(r.Data.Result) == 1 && strings.Contains(string(r.Data.Result[0]), `"6"`)
	})
	healthySince := time.Now()
	testenv.Eventually(t, 30*time.Second, "the rules evaluated a few times", func() bool {
		return lastEvaluation(t, prom).After(healthySince.Add(1500 * time.Millisecond))
	})
	if states := alertStates(t, prom); len(states) != 0 {
		t.Fatalf("alerts on a healthy stack: %v", states)
	}

	// From here, every alert seen firing is noted.
	var mu sync.Mutex
	fired := map[string]bool{}
	ctx, stopWatching := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			states := alertStates(t, prom)
			mu.Lock()
			for name, state := range states {
				if state == "firing" {
					fired[name] = true
				}
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	defer func() {
		stopWatching()
		<-watched
	}()
	waitFiring := func(names ...string) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, strings.Join(names, ", ")+" to fire", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, n := range names {
				if !fired[n] {
					return false
				}
			}
			return true
		})
	}

	// An order refused for good under the hold policy: held in error,
	// with an open alert. A message that is not an order: dead-lettered.
	held := messages.NewID()
	p.setFaults(t, `{"charge_payment":{"fail_orders":["`+held+`"]}}`)
	ch := amqpChannel(t)
	publish(t, ch, p.submit, messages.ContentType, held,
		[]byte(strings.Replace(badinput.ValidSubmitJSON(held), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)))
	publish(t, ch, p.submit, messages.ContentType, "junk", []byte("not an order"))
	// A step no scheduler serves, due two minutes ago; and a step
	// claimed ten minutes ago whose attempt has an hour left.
	store := statestore.New(p.pool)
	waiting, stuck := orphanOrder(), orphanOrder()
	for _, o := range []statestore.NewOrder{waiting, stuck} {
		if got, err := store.InsertOrder(t.Context(), o); err != nil || got != statestore.Inserted {
			t.Fatalf("insert: %v %v", got, err)
		}
	}
	if _, err := p.pool.Exec(t.Context(), `UPDATE steps SET available_at = now() - interval '2 minutes' WHERE order_id = $1`, waiting.OrderID); err != nil {
		t.Fatal(err)
	}
	testenv.Forge(t, p.pool, `UPDATE steps SET process_state = 'processing', locked_by = 'scheduler:gone', attempt = 1,
		timeout = interval '70 minutes', complete_by = now() + interval '1 hour' WHERE order_id = $1`, stuck.OrderID)
	// The kind of the step waiting for two minutes (its budget is one)
	// is limited: it waits for its limit past its budget.
	if out, errOut, code := sasctl(t, p.env, "limits", "set", "nobody", "--rate", "1/h"); code != 0 {
		t.Fatalf("sasctl limits set: %s %s", out, errOut)
	}
	// A schedule of another workflows file, due two minutes ago: the
	// leader (of the built-in file) cannot tell its ticks.
	if _, err := p.pool.Exec(t.Context(), `INSERT INTO schedules (name, workflow, cron, timezone, payload, overlap, catch_up, version, next_tick)
		VALUES ('elsewhere', 'order', '* * * * *', 'UTC', '{}', 'skip', 'last', 'another file', now() - interval '2 minutes')`); err != nil {
		t.Fatal(err)
	}
	// An order of the built-in workflow whose own deadline of an hour is
	// brought to now: the leader fires it.
	late := orphanOrder()
	late.Workflow, late.Deadline = "order", time.Hour
	if got, err := store.InsertOrder(t.Context(), late); err != nil || got != statestore.Inserted {
		t.Fatalf("insert: %v %v", got, err)
	}
	if _, err := p.pool.Exec(t.Context(), `UPDATE order_deadlines SET due_at = now() WHERE order_id = $1`, late.OrderID); err != nil {
		t.Fatal(err)
	}
	// The archive's directory goes: the ended orders wait.
	if err := os.Rename(archiveDir, archiveDir+".gone"); err != nil {
		t.Fatal(err)
	}
	// An agent kind paused two hours ago, and not resumed.
	if _, err := p.pool.Exec(t.Context(), `INSERT INTO kind_pauses (agent, paused_at, paused_by, reason) VALUES ('nobody', now() - interval '2 hours', 'ann', 'incident')`); err != nil {
		t.Fatal(err)
	}
	waitFiring("SasOrderHeldInError", "SasOperatorAlertsOpen", "SasDeadLetters", "SasPendingBacklog", "SasStepsStuckProcessing", "SasScheduleLate",
		"SasStepsWaitOnLimit", "SasOrderDeadlinePassed", "SasPausedTooLong", "SasArchiveDown")

	// Two supervisors sharing an instance id both lead.
	var leaderID string
	if err := p.pool.QueryRow(t.Context(), `SELECT holder FROM leases WHERE name = 'supervisor'`).Scan(&leaderID); err != nil {
		t.Fatal(err)
	}
	twin := p.startSupervisor(t, "SAS_INSTANCE_ID="+leaderID, "SAS_SUPERVISOR_STATS_INTERVAL=200ms")
	pr.setTargets(t, append(slices.Clone(procs), twin))
	waitFiring("SasTwoSupervisorLeaders")
	twin.stop(t)
	pr.setTargets(t, procs)

	// The scheduler loses its database: running, not ready.
	dbProxy.SetDown(true)
	dbProxy.Sever()
	waitFiring("SasServiceNotReady")
	dbProxy.SetDown(false)

	// The status exchange disappears from the broker: the relay cannot
	// publish the new order's events. (Its reply_to gets every event, its
	// received one at once; nobody hears progress events on the exchange,
	// so without one the first would be the order's end.) A consumer
	// that subscribes again declares the topology afresh: the scheduler's,
	// back from its database, may bring the exchange back after it went,
	// so it goes again, with another order, until the relay fails.
	// The relay's failures first, then the rule on them: a timeout says
	// which of the two never came (and the scheduler's log why).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the scheduler's log:\n%s", p.schedulers[0].tail())
		}
	})
	var lastTry time.Time
	testenv.Eventually(t, 90*time.Second, "the relay to fail to publish the new order's events", func() bool {
		if p.schedulers[0].metric(t, "sas_outbox_relay_errors_total") > 0 {
			return true
		}
		if time.Since(lastTry) > 10*time.Second {
			lastTry = time.Now()
			if err := ch.ExchangeDelete(s.topo.StatusExchange(), false, false); err != nil {
				t.Fatal(err)
			}
			// Published here, not by sasctl: a tool that connects
			// declares the topology, and would bring the exchange back.
			id := messages.NewID()
			publish(t, ch, p.submit, messages.ContentType, id, []byte(strings.Replace(badinput.ValidSubmitJSON(id),
				`"amount":1999`, `"amount":1999,"reply_to":"`+s.topo.Prefix+`outbox-behind"`, 1)))
		}
		return false
	})
	waitFiring("SasOutboxBehind")
	if err := s.topo.Declare(amqpChannel(t)); err != nil {
		t.Fatal(err)
	}

	// Every service stops.
	for _, sup := range p.supervisors {
		sup.stop(t)
	}
	waitFiring("SasNoSupervisorLeader", "SasServiceDown")
	p.schedulers[0].stop(t)
	p.submitter.stop(t)
	p.agents[0].stop(t)
	waitFiring("SasNoScheduler", "SasNoSubmitter", "SasNoAgent")

	mu.Lock()
	defer mu.Unlock()
	var missing []string
	for _, name := range ruleFields(t, "- alert") {
		if !fired[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("rules never fired: %v", missing)
	}
}

// orphanOrder is a one-step order for an agent kind that no scheduler
// serves: nothing ever claims its step.
func orphanOrder() statestore.NewOrder {
	id := messages.NewID()
	h := sha256.Sum256([]byte(id))
	return statestore.NewOrder{OrderID: id, Workflow: "orphan", Payload: []byte(`{"customer":"c"}`), PayloadHash: h[:], Actor: "test", FailurePolicy: statestore.PolicyHold,
		Steps: []statestore.NewStep{{Name: "orphan_step", Agent: "nobody", Timeout: time.Minute, MaxFailures: 3}}}
}

// metricNames are the sas_ metric names an expression reads.
func metricNames(expr string) []string {
	var out []string
	for _, n := range regexp.MustCompile(`\bsas_[a-z_]+`).FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			n = strings.TrimSuffix(n, suffix)
		}
		out = append(out, n)
	}
	return out
}

// TestSeriesExistFromStart: every series a rule or a dashboard panel
// reads is there at a process's first scrape, before anything happened,
// at zero for the label values known at start; a rule over increase()
// then sees the first event.
func TestSeriesExistFromStart(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{supervisors: 1})
	scraped := map[string]bool{}
	series := map[string]bool{}
	for _, pr := range []*proc{p.submitter, p.schedulers[0], p.agents[0], p.supervisors[0]} {
		resp, err := http.Get("http://" + pr.ops + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "#") || line == "" {
				continue
			}
			name, _, _ := strings.Cut(line, " ")
			series[name] = true
			base, _, _ := strings.Cut(name, "{")
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suffix)
			}
			scraped[base] = true
		}
		resp.Body.Close()
	}
	exprs := ruleFields(t, "expr")
	for _, panel := range readDashboard(t).Panels {
		for _, target := range panel.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	var missing []string
	for _, e := range exprs {
		for _, name := range metricNames(e) {
			if !scraped[name] && !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("read by a rule or panel, absent at start: %v", missing)
	}
	for _, want := range []string{
		`sas_orders_finished_total{namespace="default",status="error"}`,
		`sas_dead_lettered_total{queue="` + p.submit + `",reason="not_json"}`,
		`sas_dead_lettered_total{queue="` + p.submit + `",reason="handler_panic"}`,
		`sas_dead_lettered_total{queue="` + p.topo.Queue("replies") + `",reason="invalid_value"}`,
		`sas_supervisor_failures_total`,
		`sas_supervisor_leader`,
		`sas_alerts_open{namespace="default"}`,
		`sas_ready`,
		`sas_outbox_relay_errors_total`,
		`sas_step_duration_seconds_count{name="charge_payment",outcome="ok"}`,
		`sas_agent_retries_total{endpoint="charge_payment",reason="5xx"}`,
		`sas_submitter_orders_total{outcome="inserted"}`,
		`sas_retention_deleted_total{table="orders"}`,
	} {
		if !series[want] {
			t.Errorf("no series %s at start", want)
		}
	}
}
