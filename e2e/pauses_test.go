package e2e

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

const pausesFile = `
workflows:
  - name: paced
    steps:
      - {action: first, agent: paced, timeout: 20s, compensation: {action: unfirst, agent: paced}}
      - {action: second, agent: paced, timeout: 20s}
  - name: cooled
    deadline: 1h
    steps:
      - {action: warm, agent: cool, timeout: 20s}
      - {action: chill, agent: cool, timeout: 20s, delay: 2s}
  - name: kinds
    steps:
      - {action: stamp, agent: stamper, timeout: 20s}
`

// TestPauseHoldsAcrossRestartsAndKills, with real binaries: a workflow
// paused while its first steps are in flight (they end normally), an
// order paused before its delay falls due, and an agent kind paused by a
// rate of 0 have nothing claimed, no timer fired and nothing expired,
// across a SIGKILL of the scheduler and a restart of the supervisor;
// orders submitted while their workflow is paused wait; resumed, every
// order completes, each action applied once, and the paused order's
// deadline has moved on by the time it was paused.
func TestPauseHoldsAcrossRestartsAndKills(t *testing.T) {
	t.Parallel()
	g := runFile(t, "pauses.yaml", pausesFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1})
	p := g.pipeline
	p.setFaults(t, `{"first":{"latency_min_ms":1500,"latency_max_ms":1500}}`)
	paced := g.submit(t, "paced", slices.Repeat([]string{`{}`}, 10))
	cooled := g.submit(t, "cooled", []string{`{}`})
	testenv.Eventually(t, 30*time.Second, "the first steps in flight and the delay begun", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'first' AND process_state = 'processing'`, paced) == len(paced) &&
			p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'chill' AND process_state = 'delayed'`, cooled) == 1
	})
	ctl := func(args ...string) string {
		t.Helper()
		return sasctlOK(t, p.env, args...)
	}
	if out := ctl("workflows", "pause", "paced", "--reason", "incident 7", "--as", "ann"); !strings.Contains(out, "paused with 10 running orders") {
		rows, _ := p.pool.Query(t.Context(), `SELECT o.workflow, o.status, o.namespace, (SELECT count(*) FROM order_pauses x WHERE x.order_id = o.order_id), (SELECT string_agg(workflow, ',') FROM workflow_pauses) FROM orders o WHERE order_id = ANY($1::uuid[])`, paced)
		for rows.Next() {
			var a, b, c, e any
			var d int
			_ = rows.Scan(&a, &b, &c, &d, &e)
			t.Logf("%v %v %v %v %v", a, b, c, d, e)
		}
		t.Fatalf("workflows pause: %s", out)
	}
	ctl("orders", "pause", cooled[0], "--reason", "checking the rates", "--as", "ann")
	if out := ctl("limits", "set", "stamper", "--rate", "0", "--as", "ann"); !strings.Contains(out, "paused") {
		t.Fatalf("limits set --rate 0: %s", out)
	}
	var pausedAt time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	later := g.submit(t, "paced", slices.Repeat([]string{`{}`}, 5))
	stamped := g.submit(t, "kinds", slices.Repeat([]string{`{}`}, 5))

	p.schedulers[0].kill(t)
	p.schedulers = append(p.schedulers[:0], start(t, "scheduler", append(append([]string{}, p.env...), "SAS_WORKFLOWS_FILE="+g.file)))
	p.supervisors[0].stop(t)
	p.startSupervisor(t, "SAS_WORKFLOWS_FILE="+g.file)

	// What was in flight ends; the delay falls due on the database clock;
	// the new orders are written, and a supervisor leads again.
	all := slices.Concat(paced, cooled, later, stamped)
	testenv.Eventually(t, time.Minute, "the steps in flight ended, the delay due, the new orders written, a leader", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'first' AND process_state = 'processed'`, paced) == len(paced) &&
			p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'chill' AND due_at < clock_timestamp()`, cooled) == 1 &&
			p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, all) == len(all) &&
			sum(t, p.supervisors[len(p.supervisors)-1:], "sas_supervisor_leader") == 1
	})
	// A few sweeps and timer rounds of the new leader pass.
	sweeps := p.supervisors[len(p.supervisors)-1].metric(t, "sas_supervisor_sweeps_total")
	testenv.Eventually(t, 30*time.Second, "the new leader to sweep a few times", func() bool {
		return p.supervisors[len(p.supervisors)-1].metric(t, "sas_supervisor_sweeps_total") >= sweeps+3
	})
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND to_state = 'processing' AND at > $2`, all, pausedAt); n != 0 {
		t.Fatalf("%d steps claimed while paused\n%s", n, p.stuck(t, all))
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'chill' AND process_state = 'delayed'`, cooled); n != 1 {
		t.Fatal("a paused order's timer fired")
	}
	out := ctl("pauses", "list")
	for _, want := range []string{"paced", "kind", "stamper", "rate set to 0", "incident 7", "checking the rates", cooled[0]} {
		if !strings.Contains(out, want) {
			t.Fatalf("pauses list lacks %q:\n%s", want, out)
		}
	}
	if got := p.supervisors[len(p.supervisors)-1].metric(t, `sas_paused{scope="order"}`); got != float64(len(paced)+len(later)+1) {
		t.Errorf("sas_paused{scope=order} = %v, want %d", got, len(paced)+len(later)+1)
	}
	if out := ctl("orders", "show", cooled[0]); !strings.Contains(out, "paused") || !strings.Contains(out, "checking the rates") {
		t.Fatalf("orders show of a paused order:\n%s", out)
	}

	var dueBefore time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT due_at FROM order_deadlines WHERE order_id = $1`, cooled[0]).Scan(&dueBefore); err != nil {
		t.Fatal(err)
	}
	// Through the API: what is paused, and the kind's resume.
	api := startAPI(t, p.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	token := apiToken(t, p.stack, "pauses-operator", statestore.TokenOperator)
	code, _, body := api.call(t, apiCall{method: http.MethodGet, path: "/api/v1/pauses", token: token})
	if code != http.StatusOK || !strings.Contains(string(body), `"target":"stamper"`) || !strings.Contains(string(body), cooled[0]) {
		t.Fatalf("GET /pauses: %d %s", code, body)
	}
	code, _, body = api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/orders/" + paced[0] + "/pause", token: token,
		body: `{"reason": "` + strings.Repeat("x", 501) + `"}`})
	if code != http.StatusBadRequest {
		t.Fatalf("a pause with a reason too long: %d %s", code, body)
	}
	ctl("workflows", "resume", "paced", "--as", "ann")
	ctl("orders", "resume", cooled[0], "--as", "ann")
	code, _, body = api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/kinds/stamper/resume", token: token})
	if code != http.StatusOK || !strings.Contains(string(body), `"outcome":"resumed"`) {
		t.Fatalf("POST /kinds/stamper/resume: %d %s", code, body)
	}
	p.waitTerminal(t, all, 2*time.Minute)
	if completed, _ := p.checkSaga(t, all); completed != len(all) {
		t.Fatalf("%d of %d orders completed\n%s", completed, len(all), p.stuck(t, all))
	}
	var dueAfter time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT due_at FROM order_deadlines WHERE order_id = $1`, cooled[0]).Scan(&dueAfter); err != nil {
		t.Fatal(err)
	}
	if moved := dueAfter.Sub(dueBefore); moved < time.Second {
		t.Fatalf("the paused order's deadline moved on by %v, want the seconds it was paused", moved)
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE claimed_by = 'ann' AND action IN ('pause workflow', 'pause', 'pause kind',
		'resume workflow', 'resume')`); n != 5 {
		t.Fatalf("%d pause and resume actions recorded with the operator, want 5", n)
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE claimed_by = 'api:pauses-operator' AND action = 'resume kind'`); n != 1 {
		t.Fatalf("%d kind resumes recorded with the API's token, want 1", n)
	}
}

// TestConsolePausesWorkflowsAndKinds, with real binaries: from the
// console's Pauses page an operator pauses an agent kind and a workflow,
// each behind a confirmation and recorded with the console user; the
// page lists them with why; an order of the paused workflow waits, its
// kind's step unclaimed; resumed from the page, it completes. A viewer
// may not act, and a name out of its rules, an unknown scope or a reason
// too long or with a NUL is refused and changes nothing.
func TestConsolePausesWorkflowsAndKinds(t *testing.T) {
	t.Parallel()
	g := runFile(t, "pauses.yaml", pausesFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1})
	p := g.pipeline
	c := startConsole(t, p.stack, "SAS_WORKFLOWS_FILE="+g.file)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	if status, page := alice.do("GET", "/pauses", nil); status != http.StatusOK || !strings.Contains(page, "Nothing is paused") ||
		!strings.Contains(page, `<option value="kinds">`) {
		t.Fatalf("the pauses page: %d", status)
	}
	if _, page := alice.do("GET", "/workflows", nil); !strings.Contains(page, `href="/pauses/workflow/pause?name=kinds"`) {
		t.Fatal("the workflows page offers no pause")
	}
	act := func(path, reason string, want int) {
		t.Helper()
		status, page := alice.do("GET", path, nil)
		if status != http.StatusOK || !strings.Contains(page, `id="confirm-button"`) {
			t.Fatalf("the confirmation of %s: %d", path, status)
		}
		target, _, _ := strings.Cut(path, "?")
		name := path[strings.Index(path, "name=")+len("name="):]
		if status, _ := alice.do("POST", target, url.Values{"csrf": {csrfOf(t, page)}, "name": {name}, "reason": {reason}}); status != want {
			t.Fatalf("POST %s: %d, want %d", path, status, want)
		}
	}
	act("/pauses/kind/pause?name=stamper", "incident 9", http.StatusSeeOther)
	act("/pauses/workflow/pause?name=kinds", "incident 9 too", http.StatusSeeOther)
	for _, bad := range []struct {
		path, reason string
		want         int
	}{
		{"/pauses/kind/pause?name=cool", strings.Repeat("x", 501), http.StatusBadRequest},
		{"/pauses/kind/pause?name=cool", "a\x00b", http.StatusBadRequest},
	} {
		act(bad.path, bad.reason, bad.want)
	}
	if status, _ := alice.do("GET", "/pauses/kind/pause?name=no%20such%20kind!", nil); status != http.StatusBadRequest {
		t.Fatalf("a kind out of its rules: %d, want 400", status)
	}
	if status, _ := alice.do("GET", "/pauses/team/pause?name=cool", nil); status != http.StatusNotFound {
		t.Fatalf("an unknown scope: %d, want 404", status)
	}
	victor := newWebClient(t, c.url)
	if status := victor.login("victor", "victor's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	if status, _ := victor.do("GET", "/pauses/kind/pause?name=cool", nil); status != http.StatusForbidden {
		t.Fatalf("a viewer's pause: %d, want 403", status)
	}
	if n := p.count(t, `SELECT count(*) FROM kind_pauses WHERE agent = 'cool'`); n != 0 {
		t.Fatal("a refused pause paused the kind")
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE claimed_by = 'console:alice' AND action IN ('pause kind', 'pause workflow') AND detail LIKE 'incident 9%'`); n != 2 {
		t.Fatalf("%d pauses recorded with the console user, want 2", n)
	}
	_, page := alice.do("GET", "/pauses", nil)
	for _, want := range []string{`data-target="stamper"`, `data-target="kinds"`, "incident 9 too", "console:alice",
		`href="/pauses/kind/resume?name=stamper"`, `href="/pauses/workflow/resume?name=kinds"`} {
		if !strings.Contains(page, want) {
			t.Fatalf("the pauses page lacks %q", want)
		}
	}

	// An order of the paused workflow waits; resumed, it completes.
	stamped := g.submit(t, "kinds", []string{`{}`})
	testenv.Eventually(t, 30*time.Second, "the order written, paused with its workflow", func() bool {
		return p.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, stamped[0]) == 1
	})
	act("/pauses/workflow/resume?name=kinds", "", http.StatusSeeOther)
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state IN ('processing', 'processed')`, stamped[0]); n != 0 {
		t.Fatal("a step of a paused kind was claimed")
	}
	act("/pauses/kind/resume?name=stamper", "", http.StatusSeeOther)
	p.waitTerminal(t, stamped, time.Minute)
	if completed, _ := p.checkSaga(t, stamped); completed != 1 {
		t.Fatalf("the resumed order did not complete\n%s", p.stuck(t, stamped))
	}
	act("/pauses/kind/resume?name=stamper", "", http.StatusConflict)
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE claimed_by = 'console:alice' AND action IN ('resume kind', 'resume workflow')`); n != 2 {
		t.Fatalf("%d resumes recorded with the console user, want 2", n)
	}
}
