package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

const fixableV1 = `
workflows:
  - name: fixable
    steps:
      - {action: reserve, agent: shop, timeout: 20s, compensation: {action: release, agent: shop}}
      - {action: charge, agent: shop, timeout: 20s, delay: 30s, compensation: {action: refund, agent: shop}}
      - {action: ship, agent: shop, timeout: 20s}
`

// The fix: a notification the first version forgot, before shipping.
const fixableV2 = `
workflows:
  - name: fixable
    steps:
      - {action: reserve, agent: shop, timeout: 20s, compensation: {action: release, agent: shop}}
      - {action: charge, agent: shop, timeout: 20s, delay: 30s, compensation: {action: refund, agent: shop}}
      - {action: notify, agent: shop, timeout: 20s}
      - {action: ship, agent: shop, timeout: 20s}
`

// TestMigrationOfRunningOrdersUnderLoad, with real binaries: 400
// orders wait on their delay while more orders come in; a dry run says
// each can move, then sasctl moves them to a fixed version while the
// load runs; every moved order runs the step the fix adds, each action
// applied once, the invariant checker clean. The API's dry run says
// why an order cannot move.
func TestMigrationOfRunningOrdersUnderLoad(t *testing.T) {
	t.Parallel()
	g := runFile(t, "fixable.yaml", fixableV1, pipelineOpts{supervisors: 1, agents: 2, schedulers: 1})
	p := g.pipeline
	v2File := writeFile(t, "fixable-v2.yaml", fixableV2)
	reg, err := workflow.Load(v2File)
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := reg.Lookup("fixable")

	// The console, with the fixed file: a running order of the first
	// version offers the move, and makes it. Four orders are submitted at
	// once, so that their delays run out together: one for the order's
	// page, three for the workflow's. (First, so that their delays run
	// out while the load below runs.)
	four := g.submit(t, "fixable", slices.Repeat([]string{`{}`}, 4))
	last, three := four[0], four[1:]
	testenv.Eventually(t, 30*time.Second, "four more orders waiting on their delay", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'charge' AND process_state = 'delayed'`, four) == 4
	})
	con := startConsole(t, p.stack, "SAS_WORKFLOWS_FILE="+v2File)
	alice := newWebClient(t, con.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	status, page := alice.do("GET", "/orders/"+last, nil)
	if status != http.StatusOK || !strings.Contains(page, `id="migrate"`) || !strings.Contains(page, v2.Version()) {
		t.Fatalf("the order page offers no move: %d", status)
	}
	status, page = alice.do("GET", "/orders/"+last+"/migrate", nil)
	if status != http.StatusOK || !strings.Contains(page, "adds [notify]") {
		t.Fatalf("the move's confirmation: %d\n%s", status, page)
	}
	if status, _ := alice.do("POST", "/orders/"+last+"/migrate", url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusSeeOther {
		t.Fatalf("the move: %d", status)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND workflow_version = $2`, last, v2.Version()); n != 1 {
		t.Fatal("the console's move did not pin the order to the new version")
	}

	// The console moves a workflow's running orders at once: a dry run
	// that counts them (the order above is on the new version already),
	// then the move.
	if _, page := alice.do("GET", "/workflows", nil); !strings.Contains(page, `href="/workflows/fixable/migrate"`) {
		t.Fatal("the workflows page offers no move of running orders")
	}
	status, page = alice.do("GET", "/workflows/fixable/migrate", nil)
	if status != http.StatusOK || !strings.Contains(page, "Move 3 running orders of fixable to version "+v2.Version()) {
		t.Fatalf("the dry run of moving the workflow's orders: %d\n%s", status, page)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND workflow_version = $2`, three, v2.Version()); n != 0 {
		t.Fatalf("the console's dry run moved %d orders", n)
	}
	status, page = alice.do("POST", "/workflows/fixable/migrate", url.Values{"csrf": {csrfOf(t, page)}})
	if status != http.StatusOK || !strings.Contains(page, "3 orders of fixable moved to version "+v2.Version()) {
		t.Fatalf("the console's move of the workflow's orders: %d\n%s", status, page)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND workflow_version = $2`, three, v2.Version()); n != 3 {
		t.Fatalf("the console moved %d of 3 orders", n)
	}
	if status, _ := alice.do("GET", "/workflows/no_such_workflow/migrate", nil); status != http.StatusNotFound {
		t.Fatalf("moving the orders of a workflow the file lacks: %d, want 404", status)
	}

	// sasctl, under load: 400 orders waiting on their delay (a slow hour
	// moved 1,000 in 39 s, past their 30 s delay).
	waiting := g.submit(t, "fixable", slices.Repeat([]string{`{}`}, 400))
	testenv.Eventually(t, 2*time.Minute, "the 400 orders waiting on their delay", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'charge' AND process_state = 'delayed'`,
			waiting) >= 360
	})

	// Load goes on meanwhile, on the first version.
	var wg sync.WaitGroup
	var more []string
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			more = append(more, g.submit(t, "fixable", []string{`{}`})...)
		}
	})
	out, errOut, code := sasctl(t, p.env, "orders", "migrate", "--workflow", "fixable", "--to", v2.Version(), "--workflows", v2File,
		"--id", waiting[0], "--id", waiting[1])
	if code != 0 || !strings.Contains(out, "can move") || !strings.Contains(out, "dry run: 2 of 2 orders can move") {
		t.Fatalf("dry run: %d\n%s%s", code, out, errOut)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND workflow_version = $2`, waiting, v2.Version()); n != 0 {
		t.Fatalf("a dry run moved %d orders", n)
	}
	var jsonArgs []string
	for _, id := range waiting {
		jsonArgs = append(jsonArgs, "--id", id)
	}
	began := time.Now()
	out, errOut, code = sasctl(t, p.env, append([]string{"orders", "migrate", "--workflow", "fixable", "--to", v2.Version(), "--workflows", v2File,
		"--apply", "--as", "ann", "--json"}, jsonArgs...)...)
	took := time.Since(began)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	// The orders whose delay had not run out when the migration ended
	// were waiting on it throughout: every one of them must move. (The
	// others may have begun the step the fix moves, and then stay.)
	var stillWaiting []string
	if err := p.pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(order_id::text), '{}') FROM steps
		WHERE order_id = ANY($1::uuid[]) AND name = 'charge' AND due_at > clock_timestamp()`, waiting).Scan(&stillWaiting); err != nil {
		t.Fatal(err)
	}
	var verdicts []statestore.MigrationVerdict
	if err := json.Unmarshal([]byte(out), &verdicts); err != nil {
		t.Fatalf("migrate's verdicts: %v\n%s", err, out)
	}
	moved := map[string]bool{}
	whys := map[string]int{}
	for _, v := range verdicts {
		switch {
		case v.Moved:
			moved[v.OrderID] = true
		case v.Why == "":
			t.Fatalf("order %s neither moved nor says why", v.OrderID)
		default:
			whys[v.Why]++
		}
	}
	if len(whys) > 0 {
		t.Logf("left as they were: %v", whys)
	}
	t.Logf("%d of %d orders moved in %v while %d more came in; %d were still waiting on their delay when it ended",
		len(moved), len(waiting), took.Round(time.Millisecond), len(more), len(stillWaiting))
	for _, id := range stillWaiting {
		if !moved[id] {
			t.Fatalf("order %s waited on its delay throughout the migration and did not move", id)
		}
	}
	if len(stillWaiting) < len(waiting)/4 {
		t.Fatalf("only %d of %d orders were still waiting on their 30 s delay when the migration ended, after %v: it tested too little",
			len(stillWaiting), len(waiting), took.Round(time.Millisecond))
	}
	all := slices.Concat(four, waiting, more)
	p.waitTerminal(t, all, 3*time.Minute)
	if completed, _ := p.checkSaga(t, all); completed != len(all) {
		t.Fatalf("%d of %d orders completed\n%s", completed, len(all), p.stuck(t, all))
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'notify' AND process_state = 'processed'`,
		slices.Collect(func(yield func(string) bool) {
			for id := range moved {
				if !yield(id) {
					return
				}
			}
		})); n != len(moved) {
		t.Fatalf("%d of the %d moved orders ran the step the fix adds", n, len(moved))
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND name = 'notify' AND process_state = 'processed'`, four); n != 4 {
		t.Fatalf("%d of the 4 orders the console moved ran the step the fix adds", n)
	}
	if r := p.checkInvariants(t, all); !r.OK() {
		t.Fatalf("invariants: %v", r.Violations)
	}

	// The API's dry run of an ended order says why it stays.
	api := startAPI(t, p.stack, "", "SAS_WORKFLOWS_FILE="+v2File)
	token := apiToken(t, p.stack, "migrator", statestore.TokenOperator)
	code, _, body := api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/migrations", token: token,
		body: `{"workflow": "fixable", "to_version": "` + v2.Version() + `", "ids": ["` + waiting[0] + `"]}`})
	if code != http.StatusOK || !strings.Contains(string(body), `"can_move":false`) || !strings.Contains(string(body), "only an order that runs") {
		t.Fatalf("POST /migrations of an ended order: %d %s", code, body)
	}
}
