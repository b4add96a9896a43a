package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// nsFile is the workflow both namespaces run: a call, then a wait for
// an approval, with a search attribute.
const nsFile = `
workflows:
  - name: shop
    steps:
      - {action: charge, agent: payments, timeout: 20s}
  - name: approval
    payload_schema: {type: object, required: [customer], properties: {customer: {type: string}}}
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
    steps:
      - {action: score, agent: payments, timeout: 20s}
      - {id: approved, wait: {signal: approved, timeout: 5m, schema: {type: object, required: [by]}}}
  - name: team-a-only
    namespaces: [team-a]
    steps:
      - {action: charge, agent: payments, timeout: 20s}
`

// nsToken makes an API token of role acting in namespaces.
func nsToken(t *testing.T, g graphRun, name, role string, namespaces ...string) string {
	t.Helper()
	args := []string{"api", "token", "create", "--name", name, "--role", role}
	for _, ns := range namespaces {
		args = append(args, "--namespace", ns)
	}
	out := sasctlOK(t, g.stack.env, args...)
	return strings.TrimSpace(out)
}

// TestNamespacesIsolateOrdersOverTheAPI: two namespaces run the same
// workflow; a token of each tries every route of the API on the other's
// orders (their ids in every text form a UUID has), its bulk jobs,
// signals by key and pauses: each is refused as if the thing did not
// exist, and nothing of the other's changes. Actions on the whole
// deployment need a token of every namespace; a deployment that names
// none is unchanged.
func TestNamespacesIsolateOrdersOverTheAPI(t *testing.T) {
	t.Parallel()
	g := runFile(t, "ns.yaml", nsFile, pipelineOpts{schedulers: 1, agents: 1})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	// Before any namespace is added, a token of the default namespace
	// acts on the whole deployment as before.
	plain := nsToken(t, g, "plain-ops", "operator")
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/workflows/shop/pause", token: plain}); code != http.StatusOK {
		t.Fatalf("a default-namespace operator pausing a workflow in a deployment of one namespace: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/workflows/shop/resume", token: plain}); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, b)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "add", "team-a", "team-b"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	opsA, opsB := nsToken(t, g, "ops-a", "operator", "team-a"), nsToken(t, g, "ops-b", "operator", "team-b")
	appA := nsToken(t, g, "app-a", "submitter", "team-a")
	every := nsToken(t, g, "ops-all", "operator", "*")
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "list"); code != 0 ||
		!regexp.MustCompile(`(?m)^NAME +CREATED +BY +QUOTAS +QUOTAS_BY\n(?:default .*\n)(?:team-a .*sasctl:.*\n)(?:team-b .*\n)$`).MatchString(out) {
		t.Fatalf("namespaces list: %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "api", "token", "list"); code != 0 ||
		!regexp.MustCompile(`(?m)^ops-a +operator +team-a +`).MatchString(out) || !regexp.MustCompile(`(?m)^ops-all +operator +\* +`).MatchString(out) {
		t.Fatalf("api token list: %d\n%s%s", code, out, errOut)
	}

	submit := func(token, ns, id, customer string) (int, []byte) {
		t.Helper()
		h := map[string]string{}
		if ns != "" {
			h["Sas-Namespace"] = ns
		}
		code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token, header: h,
			body: submitBody(id, "approval", fmt.Sprintf(`{"customer":%q}`, customer))})
		return code, b
	}
	idA, idB := messages.NewID(), messages.NewID()
	if code, b := submit(appA, "", idA, "c-1"); code != http.StatusAccepted {
		t.Fatalf("team-a submits: %d %s", code, b)
	}
	if code, b := submit(opsB, "team-b", idB, "c-1"); code != http.StatusAccepted {
		t.Fatalf("team-b submits: %d %s", code, b)
	}
	if code, b := submit(opsA, "team-b", messages.NewID(), "c-1"); code != http.StatusForbidden {
		t.Fatalf("team-a's token submitting to team-b: %d %s", code, b)
	}
	if code, b := submit(every, "team-c", messages.NewID(), "c-1"); code != http.StatusNotFound {
		t.Fatalf("a submit to a namespace that does not exist: %d %s", code, b)
	}
	// A workflow of team-a alone does not exist for team-b's submits.
	only := func(token, ns string) (int, []byte) {
		t.Helper()
		code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token, header: map[string]string{"Sas-Namespace": ns},
			body: submitBody(messages.NewID(), "team-a-only", `{}`)})
		return code, b
	}
	if code, b := only(opsB, "team-b"); code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "unknown_workflow") ||
		!strings.Contains(string(b), "known: [approval shop]") {
		t.Fatalf("team-b submitting team-a's workflow: %d %s", code, b)
	}
	if code, b := only(opsA, "team-a"); code != http.StatusAccepted {
		t.Fatalf("team-a submitting its workflow: %d %s", code, b)
	}
	// team-b takes team-a's order id, in another text form: refused
	// without a word of that order.
	for _, form := range []string{idA, strings.ToUpper(idA), "{" + idA + "}", strings.ReplaceAll(idA, "-", "")} {
		code, b := submit(opsB, "team-b", form, "c-1")
		if code != http.StatusConflict && code != http.StatusBadRequest || strings.Contains(string(b), "status") && strings.Contains(string(b), "received") {
			t.Fatalf("team-b submitting team-a's id as %s: %d %s", form, code, b)
		}
	}
	testenv.Eventually(t, time.Minute, "both orders to wait for their approval", func() bool {
		return g.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND step = 2 AND process_state = 'awaiting'`, []string{idA, idB}) == 2
	})
	before := g.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1`, idA)
	// sasctl, the deployment's operators' tool, lists a namespace's
	// orders, and shows an order's namespace.
	if out, errOut, code := sasctl(t, g.stack.env, "orders", "list", "--namespace", "team-a"); code != 0 || !strings.Contains(out, idA) || strings.Contains(out, idB) {
		t.Fatalf("orders list --namespace team-a: %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "orders", "list", "--namespace", "team-b", "--where", "customer=c-1", "--json"); code != 0 ||
		!strings.Contains(out, idB) || strings.Contains(out, idA) || !strings.Contains(out, `"namespace": "team-b"`) {
		t.Fatalf("orders list --namespace team-b --where: %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := sasctl(t, g.stack.env, "orders", "list", "--namespace", "Team_A"); code != 2 || !strings.Contains(errOut, "--namespace") {
		t.Fatalf("orders list --namespace Team_A: exit %d, %q; want a usage error", code, errOut)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "orders", "show", idA); code != 0 || !regexp.MustCompile(`(?m)^namespace +team-a$`).MatchString(out) {
		t.Fatalf("orders show: %d\n%s%s", code, out, errOut)
	}
	// With --namespace team-b, sasctl finds nothing of team-a's order in
	// any command, and changes nothing of it; team-b's own is there.
	for _, id := range []string{idA, strings.ToUpper(idA)} {
		for _, cmd := range [][]string{
			{"orders", "show", id}, {"orders", "cancel", id}, {"orders", "resubmit", id}, {"orders", "pause", id},
			{"orders", "resume", id}, {"orders", "signal", id, "approved"},
		} {
			out, errOut, code := sasctl(t, g.stack.env, append(cmd, "--namespace", "team-b")...)
			if code == 0 || !strings.Contains(errOut, "not found") || strings.Contains(out+errOut, "approval") {
				t.Errorf("sasctl %s --namespace team-b: exit %d\n%s%s", strings.Join(cmd, " "), code, out, errOut)
			}
		}
	}
	if out, errOut, code := sasctl(t, g.stack.env, "orders", "show", idB, "--namespace", "team-b"); code != 0 || !strings.Contains(out, idB) {
		t.Errorf("sasctl orders show --namespace team-b of team-b's order: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "orders", "signal", "--workflow", "approval", "--where", "customer=c-1", "--namespace", "default", "approved"); code == 0 ||
		!strings.Contains(errOut, statestore.SignalNoMatch) {
		t.Errorf("sasctl orders signal by key in default, of team-a's and team-b's orders: exit %d\n%s%s", code, out, errOut)
	}

	// Every route of team-a's order, with team-b's operator token, with
	// the id as written and in capitals: not found.
	for _, id := range []string{idA, strings.ToUpper(idA)} {
		for _, c := range []apiCall{
			{method: "GET", path: "/api/v1/orders/" + id},
			{method: "GET", path: "/api/v1/orders/" + id + "/await?timeout=1s"},
			{method: "GET", path: "/api/v1/orders/" + id + "/events"},
			{method: "POST", path: "/api/v1/orders/" + id + "/signals/approved", body: `{"payload":{"by":"eve"}}`},
			{method: "POST", path: "/api/v1/orders/" + id + "/resubmit", body: `{}`},
			{method: "POST", path: "/api/v1/orders/" + id + "/cancel", body: `{}`},
			{method: "POST", path: "/api/v1/orders/" + id + "/rerun", body: `{"payload":{"customer":"x"}}`},
			{method: "POST", path: "/api/v1/orders/" + id + "/pause", body: `{}`},
			{method: "POST", path: "/api/v1/orders/" + id + "/resume", body: `{}`},
			{method: "GET", path: "/api/v1/orders/" + id + "/archived"},
		} {
			c.token = opsB
			if code, _, b := api.call(t, c); code != http.StatusNotFound {
				t.Errorf("team-b: %s %s: %d %s, want 404", c.method, c.path, code, b)
			}
		}
	}
	// Lists, bulk jobs, signals by key, pauses.
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders?workflow=approval", token: opsB}); code != http.StatusOK ||
		strings.Contains(string(b), idA) || !strings.Contains(string(b), idB) {
		t.Errorf("team-b's list: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders?workflow=approval&where=customer%3Dc-1", token: opsA}); code != http.StatusOK ||
		!strings.Contains(string(b), idA) || strings.Contains(string(b), idB) {
		t.Errorf("team-a's search: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/cancel", token: opsB,
		body: `{"filter":{"workflow":"approval","namespaces":["team-a","team-b"]},"dry_run":true}`}); code != http.StatusOK || !strings.Contains(string(b), `"count":1`) {
		t.Errorf("team-b's bulk dry run counts what is not its own: %d %s", code, b)
	}
	code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/pause", token: opsA, body: `{"filter":{"workflow":"approval"}}`})
	if code != http.StatusAccepted {
		t.Fatalf("team-a's bulk pause: %d %s", code, b)
	}
	jobA := strings.TrimPrefix(h.Get("Location"), "/api/v1/bulk/")
	for _, c := range []apiCall{{method: "GET", path: "/api/v1/bulk/" + jobA}, {method: "GET", path: "/api/v1/bulk/" + jobA + "/orders"},
		{method: "POST", path: "/api/v1/bulk/" + jobA + "/stop"}} {
		c.token = opsB
		if code, _, b := api.call(t, c); code != http.StatusNotFound {
			t.Errorf("team-b: %s %s: %d %s, want 404", c.method, c.path, code, b)
		}
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/bulk", token: opsB}); code != http.StatusOK || strings.Contains(string(b), `"id":`+jobA+`,`) {
		t.Errorf("team-b's bulk jobs list team-a's: %d %s", code, b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the API's log:\n%s", api.tail())
		}
	})
	testenv.Eventually(t, time.Minute, "team-a's bulk pause to pause its order only", func() bool {
		return g.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, idA) == 1
	})
	if n := g.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, idB); n != 0 {
		t.Fatalf("team-a's bulk job paused team-b's order")
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/pauses", token: opsB}); code != http.StatusOK || strings.Contains(string(b), idA) {
		t.Errorf("team-b sees team-a's pause: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/signals", token: opsB,
		body: `{"workflow":"approval","where":{"customer":"c-1"},"name":"approved","payload":{"by":"eve"},"all":true}`}); code/100 != 2 ||
		strings.Contains(string(b), idA) {
		t.Errorf("team-b's signal by key: %d %s", code, b)
	}
	// The deployment's own actions need every namespace.
	for _, c := range []apiCall{{method: "POST", path: "/api/v1/workflows/approval/pause"}, {method: "POST", path: "/api/v1/kinds/payments/pause"},
		{method: "POST", path: "/api/v1/migrations", body: `{"workflow":"approval","ids":["` + idA + `"]}`}} {
		for _, tok := range []string{opsA, plain} {
			c.token = tok
			if code, _, b := api.call(t, c); code != http.StatusForbidden {
				t.Errorf("%s %s with a token of some namespaces: %d %s, want 403", c.method, c.path, code, b)
			}
		}
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + idA, token: every}); code != http.StatusOK {
		t.Errorf("a token of every namespace reads team-a's order: %d %s", code, b)
	}

	// Nothing of team-a's order changed: still waiting, paused by its
	// own job only, no signal, and no history written by team-b.
	if n := g.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND step = 2 AND process_state = 'awaiting'`, idA); n != 1 {
		t.Errorf("team-a's order no longer waits")
	}
	if n := g.count(t, `SELECT count(*) FROM signals WHERE order_id = $1`, idA); n != 0 {
		t.Errorf("team-a's order got %d signals", n)
	}
	if n := g.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND actor LIKE '%ops-b%'`, idA); n != 0 {
		t.Errorf("team-b wrote team-a's history")
	}
	if after := g.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1`, idA); after < before {
		t.Errorf("team-a's history shrank")
	}
	if n := g.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND namespace = 'team-a'`, idA); n != 1 {
		t.Errorf("team-a's order is not in team-a")
	}
}

// TestNamespaceQuotasOverTheAPI: sasctl sets a namespace's quotas and
// every submit of it through the API is held to them, a refusal saying
// which (429 with Retry-After; 413 for a payload) and writing nothing,
// while another namespace, and the default one, submit on; the refusals
// are counted by namespace.
func TestNamespaceQuotasOverTheAPI(t *testing.T) {
	t.Parallel()
	g := runFile(t, "ns.yaml", nsFile, pipelineOpts{schedulers: 1, agents: 1})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "add", "team-q", "team-free"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	for _, bad := range [][]string{{"default", "--in-flight", "5"}, {"team-q"}, {"team-q", "--burst", "2"},
		{"team-q", "--in-flight", "0"}, {"team-q", "--rate", "-1/s"}, {"team-q", "--payload-bytes", "99999999"}, {"team-q", "--none", "--in-flight", "3"}} {
		if _, errOut, code := sasctl(t, g.stack.env, append([]string{"namespaces", "quota"}, bad...)...); code != 2 || errOut == "" {
			t.Errorf("namespaces quota %v: exit %d, %q; want a usage error", bad, code, errOut)
		}
	}
	if _, errOut, code := sasctl(t, g.stack.env, "namespaces", "quota", "nobody", "--in-flight", "3"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("quotas for an unknown namespace: exit %d, %q", code, errOut)
	}
	opsQ, opsFree, opsDefault := nsToken(t, g, "ops-q", "operator", "team-q"), nsToken(t, g, "ops-free", "operator", "team-free"), nsToken(t, g, "ops-d", "operator")
	submit := func(token, ns, customer string) (int, http.Header, string, []byte) {
		t.Helper()
		id := messages.NewID()
		h := map[string]string{}
		if ns != "" {
			h["Sas-Namespace"] = ns
		}
		code, hdr, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token, header: h,
			body: submitBody(id, "approval", fmt.Sprintf(`{"customer":%q}`, customer))})
		return code, hdr, id, b
	}
	exists := func(id string) bool {
		return g.count(t, `SELECT count(*) FROM orders WHERE order_id = $1`, id) == 1
	}
	reason := func(b []byte) string {
		return regexp.MustCompile(`"reason":"([a-z_]+)"`).FindStringSubmatch(string(b) + `"reason":"none"`)[1]
	}

	// In flight: 3 (each order waits for an approval that never comes).
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "quota", "team-q", "--in-flight", "3", "--as", "ann"); code != 0 ||
		!strings.Contains(out, "in flight 3") {
		t.Fatalf("namespaces quota: %d %s %s", code, out, errOut)
	}
	if out, _, _ := sasctl(t, g.stack.env, "namespaces", "list"); !regexp.MustCompile(`(?m)^team-q .*in flight 3 +sasctl:ann`).MatchString(out) {
		t.Fatalf("namespaces list shows no quota:\n%s", out)
	}
	accepted := 0
	var refused []byte
	var refusedID string
	var refusedHdr http.Header
	testenv.Eventually(t, 30*time.Second, "the API to hold team-q to 3 orders in flight", func() bool {
		code, hdr, id, b := submit(opsQ, "team-q", "c")
		switch code {
		case http.StatusAccepted:
			accepted++
			return false
		case http.StatusTooManyRequests:
			refused, refusedID, refusedHdr = b, id, hdr
			return true
		}
		t.Fatalf("a submit to team-q: %d %s", code, b)
		return false
	})
	if accepted < 3 || reason(refused) != "quota_in_flight" || refusedHdr.Get("Retry-After") == "" || exists(refusedID) {
		t.Fatalf("%d accepted, then %s (Retry-After %q), written %v", accepted, refused, refusedHdr.Get("Retry-After"), exists(refusedID))
	}
	// Before the quota reached the API's cache (5 s) more may have come
	// in; none may once it holds.
	inFlight := g.count(t, `SELECT count(*) FROM orders WHERE namespace = 'team-q'`)
	if accepted > 3 {
		t.Logf("%d orders came in before the quota held", accepted-3)
	}
	for range 5 {
		if code, _, _, b := submit(opsQ, "team-q", "c"); code != http.StatusTooManyRequests || reason(b) != "quota_in_flight" {
			t.Fatalf("team-q at its quota: %d %s", code, b)
		}
	}
	if n := g.count(t, `SELECT count(*) FROM orders WHERE namespace = 'team-q'`); n != inFlight {
		t.Fatalf("team-q has %d orders after its refusals, %d before", n, inFlight)
	}
	// Another namespace, and the default one, are not held by team-q's.
	for range 5 {
		if code, _, _, b := submit(opsFree, "team-free", "c"); code != http.StatusAccepted {
			t.Fatalf("team-free beside team-q at its quota: %d %s", code, b)
		}
		if code, _, _, b := submit(opsDefault, "", "c"); code != http.StatusAccepted {
			t.Fatalf("the default namespace beside team-q at its quota: %d %s", code, b)
		}
	}

	// A payload's bytes, and the submit rate: a bucket of 1, 1 a minute.
	if _, errOut, code := sasctl(t, g.stack.env, "namespaces", "quota", "team-free", "--payload-bytes", "40", "--rate", "1/m", "--burst", "1"); code != 0 {
		t.Fatalf("namespaces quota: %s", errOut)
	}
	testenv.Eventually(t, 30*time.Second, "the API to hold team-free to 40 bytes of payload", func() bool {
		code, _, id, b := submit(opsFree, "team-free", strings.Repeat("x", 40))
		if code == http.StatusRequestEntityTooLarge && (reason(b) != "quota_payload_bytes" || exists(id)) {
			t.Fatalf("a payload past the size: %s, written %v", b, exists(id))
		}
		return code == http.StatusRequestEntityTooLarge
	})
	code, _, oneID, b := submit(opsFree, "team-free", "c")
	if code != http.StatusAccepted {
		t.Fatalf("the bucket's one: %d %s", code, b)
	}
	// Past the rate: refused by the admission, then (the bucket known
	// empty for a minute) by the API before it; the order it took, sent
	// again, is still the same order.
	for i := range 2 {
		code, hdr, id, b := submit(opsFree, "team-free", "c")
		if code != http.StatusTooManyRequests || reason(b) != "quota_submit_rate" || exists(id) ||
			i == 1 && !strings.Contains(string(b), "room for no other order") {
			t.Fatalf("past the rate (%d): %d %s, written %v", i, code, b, exists(id))
		}
		if ra, err := strconv.Atoi(hdr.Get("Retry-After")); err != nil || ra < 30 || ra > 60 {
			t.Fatalf("past a rate of 1 a minute (%d): Retry-After %q, want about a minute", i, hdr.Get("Retry-After"))
		}
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: opsFree, header: map[string]string{"Sas-Namespace": "team-free"},
		body: submitBody(oneID, "approval", `{"customer":"c"}`)}); code != http.StatusOK || !strings.Contains(string(b), "duplicate") {
		t.Fatalf("the order taken, sent again past the rate: %d %s, want 200 duplicate", code, b)
	}
	// Its rate raised (which fills its bucket), the namespace submits
	// again within the time a quota takes to reach a replica (5 s), not
	// at its old Retry-After.
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "quota", "team-free", "--rate", "100/s"); code != 0 {
		t.Fatalf("namespaces quota --rate: %s %s", out, errOut)
	}
	testenv.Eventually(t, 15*time.Second, "team-free to submit once its rate is raised", func() bool {
		code, _, _, _ := submit(opsFree, "team-free", "c")
		return code == http.StatusAccepted
	})
	for series, least := range map[string]float64{
		`sas_api_quota_refusals_total{namespace="team-q",quota="in_flight"}`:        6,
		`sas_api_quota_refusals_total{namespace="team-free",quota="submit_rate"}`:   1,
		`sas_api_quota_refusals_total{namespace="team-free",quota="payload_bytes"}`: 1,
		// The API's orders are counted by namespace too.
		`sas_api_orders_total{namespace="team-free",outcome="inserted"}`: 1,
		`sas_api_orders_total{namespace="team-q",outcome="rejected"}`:    6,
	} {
		if v := api.metric(t, series); v < least {
			t.Errorf("%s = %v, want at least %v", series, v, least)
		}
	}
}

// nsConsoleUser adds a console user acting in namespaces through sasctl.
func nsConsoleUser(t *testing.T, file, name, role, password string, namespaces ...string) {
	t.Helper()
	args := []string{"console", "user", "add", name, "--role", role, "--file", file, "--cost", "4"}
	for _, ns := range namespaces {
		args = append(args, "--namespace", ns)
	}
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), args...)
	cmd.Env = env()
	cmd.Stdin = strings.NewReader(password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("console user add %s: %v\n%s", name, err, out)
	}
}

// TestNamespacesIsolateTheConsole: console users act in the namespaces
// the users file grants them. A user of team-b, on every order page and
// action of team-a's order (and in its id's other text forms), finds
// nothing there; its lists, searches, alerts, dead letters and bulk jobs
// hold team-b's alone, and it acknowledges, requeues or discards nothing
// of another's; the deployment's pages (overview, workflows, schedules,
// limits) are refused to it. A user of every namespace switches between
// them in a browser.
func TestNamespacesIsolateTheConsole(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	if out, errOut, code := sasctl(t, s.env, "namespaces", "add", "team-a", "team-b"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	store := statestore.New(s.pool)
	orders := map[string]string{}
	for _, ns := range []string{"team-a", "team-b", "default"} {
		o := orphanOrder()
		o.Namespace = ns
		if got, err := store.InsertOrder(t.Context(), o); err != nil || got != statestore.Inserted {
			t.Fatalf("insert: %v %v", got, err)
		}
		orders[ns] = o.OrderID
	}
	idA, idB := orders["team-a"], orders["team-b"]
	alerts := map[string]int{} // by namespace
	for ns, id := range orders {
		var alert int
		if err := s.pool.QueryRow(t.Context(), `INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_by)
			VALUES (gen_random_uuid(), $1, 1, 'the step failed', 1, 'test') RETURNING id`, id).Scan(&alert); err != nil {
			t.Fatal(err)
		}
		alerts[ns] = alert
	}
	// Dead letters as sas writes them: of team-a, of team-b, of none (the
	// deployment's), in the submit and the signals queues; and one of the
	// replies, which are never a namespace's.
	ch := amqpChannel(t)
	if err := s.topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	deadLetter := func(input, id, ns string) {
		t.Helper()
		h := amqp.Table{"x-error-reason": "unknown_workflow", "x-error-detail": "no workflow nope", "x-original-queue": s.topo.Queue(input)}
		if ns != "" {
			h["x-sas-namespace"] = ns
		}
		if err := ch.PublishWithContext(t.Context(), "", s.topo.DeadLetterQueue(input), false, false,
			amqp.Publishing{ContentType: messages.ContentType, MessageId: id, Headers: h, Body: []byte(`{"secret of":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, in := range []string{messages.SubmitQueue, messages.SignalsQueue} {
		deadLetter(in, in+"-of-team-a", "team-a")
		deadLetter(in, in+"-of-team-b", "team-b")
		deadLetter(in, in+"-of-none", "")
	}
	deadLetter(messages.RepliesQueue, "a-reply", "team-b")
	c := startConsole(t, s)
	nsConsoleUser(t, c.users, "bea", "operator", "bea's password", "team-b")
	nsConsoleUser(t, c.users, "root", "operator", "root's password", "*")
	if _, errOut, code := sasctl(t, s.env, "console", "user", "add", "x", "--role", "viewer", "--namespace", "Team_B"); code != 2 || !strings.Contains(errOut, "--namespace") {
		t.Fatalf("console user add --namespace Team_B: exit %d %q, want a usage error", code, errOut)
	}
	historyA := s.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1`, idA)

	bea := newWebClient(t, c.url)
	bea.origin = c.url
	testenv.Eventually(t, 30*time.Second, "the console to read bea from its users file", func() bool { return bea.login("bea", "bea's password") == http.StatusSeeOther })
	if status, _ := bea.do("GET", "/", nil); status != http.StatusSeeOther || bea.last.Header.Get("Location") != "/orders" {
		t.Fatalf("bea's overview: %d to %q, want team-b's orders", status, bea.last.Header.Get("Location"))
	}
	status, page := bea.do("GET", "/orders", nil)
	if status != http.StatusOK || !strings.Contains(page, idB) || strings.Contains(page, idA) || strings.Contains(page, orders["default"]) ||
		strings.Contains(page, `href="/workflows"`) || !strings.Contains(page, `id="namespace-only">team-b<`) {
		t.Fatalf("bea's orders list: %d\n%s", status, page)
	}
	csrf := csrfOf(t, page)
	for _, q := range []string{"?id=" + idA[:8], "?workflow=orphan", "?status=received"} {
		if status, page := bea.do("GET", "/orders"+q, nil); status != http.StatusOK || strings.Contains(page, idA) {
			t.Errorf("bea's orders%s: %d, shows team-a's order", q, status)
		}
	}
	// Every page and action of team-a's order: not found.
	for _, id := range []string{idA, strings.ToUpper(idA)} {
		for _, p := range []string{"", "/resubmit", "/cancel", "/migrate", "/pause", "/resume", "/signal", "/rerun"} {
			if status, page := bea.do("GET", "/orders/"+id+p, nil); status != http.StatusNotFound || strings.Contains(page, "orphan_step") {
				t.Errorf("bea: GET /orders/%s%s: %d, want 404", id, p, status)
			}
			if p == "" {
				continue
			}
			form := url.Values{"csrf": {csrf}, "name": {"approved"}, "payload": {`{"customer":"x"}`}, "version": {"1"}}
			if status, _ := bea.do("POST", "/orders/"+id+p, form); status != http.StatusNotFound {
				t.Errorf("bea: POST /orders/%s%s: %d, want 404", id, p, status)
			}
		}
	}
	// Her own order is hers to act on.
	if status, _ := bea.do("POST", "/orders/"+idB+"/pause", url.Values{"csrf": {csrf}}); status != http.StatusSeeOther {
		t.Fatalf("bea pausing team-b's order: %d", status)
	}
	// Her alerts, not team-a's: seen, acknowledged.
	if status, page := bea.do("GET", "/alerts?all=1", nil); status != http.StatusOK || !strings.Contains(page, idB[:8]) ||
		strings.Contains(page, idA[:8]) || strings.Contains(page, orders["default"][:8]) {
		t.Errorf("bea's alerts: %d\n%s", status, page)
	}
	for _, method := range []string{"GET", "POST"} {
		if status, _ := bea.do(method, fmt.Sprintf("/alerts/%d/ack", alerts["team-a"]), url.Values{"csrf": {csrf}}); status != http.StatusNotFound {
			t.Errorf("bea: %s team-a's alert's ack: %d, want 404", method, status)
		}
	}
	if status, _ := bea.do("POST", fmt.Sprintf("/alerts/%d/ack", alerts["team-b"]), url.Values{"csrf": {csrf}}); status != http.StatusSeeOther {
		t.Errorf("bea acknowledging team-b's alert: %d", status)
	}
	if n := s.count(t, `SELECT count(*) FROM alerts WHERE acked_at IS NULL`); n != 2 {
		t.Errorf("%d alerts open, want team-a's and default's", n)
	}
	// Her dead letters, in the queues where a namespace's can be.
	if status, page := bea.do("GET", "/dead-letters", nil); status != http.StatusOK || !strings.Contains(page, `href="/dead-letters/submit"`) ||
		strings.Contains(page, `href="/dead-letters/replies"`) {
		t.Errorf("bea's dead letters: %d\n%s", status, page)
	}
	for _, in := range []string{messages.SubmitQueue, messages.SignalsQueue} {
		status, page := bea.do("GET", "/dead-letters/"+in, nil)
		if status != http.StatusOK || !strings.Contains(page, in+"-of-team-b") || strings.Contains(page, in+"-of-team-a") || strings.Contains(page, in+"-of-none") {
			t.Errorf("bea's dead letters of %s: %d\n%s", in, status, page)
		}
		for _, other := range []string{in + "-of-team-a", in + "-of-none"} {
			for _, verb := range []string{"requeue", "discard"} {
				if status, _ := bea.do("GET", "/dead-letters/"+in+"/"+other+"/"+verb, nil); status != http.StatusNotFound {
					t.Errorf("bea: GET %s's %s %s: %d, want 404", in, other, verb, status)
				}
				if status, _ := bea.do("POST", "/dead-letters/"+in+"/"+other+"/"+verb, url.Values{"csrf": {csrf}}); status != http.StatusNotFound {
					t.Errorf("bea: POST %s's %s %s: %d, want 404", in, other, verb, status)
				}
			}
		}
	}
	if status, _ := bea.do("POST", "/dead-letters/submit/submit-of-team-b/discard", url.Values{"csrf": {csrf}}); status != http.StatusSeeOther {
		t.Errorf("bea discarding her own dead letter: %d", status)
	}
	for _, p := range []string{"/dead-letters/replies", "/dead-letters/replies/a-reply/discard"} {
		if status, _ := bea.do("GET", p, nil); status != http.StatusNotFound {
			t.Errorf("bea: GET %s: %d, want 404", p, status)
		}
	}
	left := map[string]bool{}
	for _, in := range []string{messages.SubmitQueue, messages.SignalsQueue, messages.RepliesQueue} {
		for _, d := range drain(t, ch, s.topo.DeadLetterQueue(in), map[string]int{messages.SubmitQueue: 2, messages.SignalsQueue: 3, messages.RepliesQueue: 1}[in], 30*time.Second) {
			left[d.MessageId] = true
		}
	}
	for _, id := range []string{"submit-of-team-a", "submit-of-none", "signals-of-team-a", "signals-of-team-b", "signals-of-none", "a-reply"} {
		if !left[id] {
			t.Errorf("dead letter %s is gone", id)
		}
	}
	// The deployment's pages, and the switcher to what is not hers.
	for _, p := range []string{"/overview/live", "/workflows", "/schedules", "/limits", "/limits/nobody/set"} {
		if status, _ := bea.do("GET", p, nil); status != http.StatusForbidden {
			t.Errorf("bea: GET %s: %d, want 403", p, status)
		}
	}
	for _, ns := range []string{"team-a", "*", "default"} {
		if status, _ := bea.do("POST", "/namespace", url.Values{"csrf": {csrf}, "ns": {ns}}); status != http.StatusForbidden {
			t.Errorf("bea switching to %q: %d, want 403", ns, status)
		}
	}
	// A bulk job of hers acts on team-b's orders alone, whatever its form
	// says; root's, made in every namespace, is not hers to see.
	if status, _ := bea.do("POST", "/bulk/resume", url.Values{"csrf": {csrf}, "workflow": {"orphan"}, "namespaces": {"team-a"}}); status != http.StatusSeeOther {
		t.Fatalf("bea's bulk resume: %d", status)
	}
	beaJob := bea.last.Header.Get("Location")
	if n := s.count(t, `SELECT total FROM bulk_jobs WHERE id = $1`, strings.TrimPrefix(strings.Split(beaJob, "?")[0], "/bulk/jobs/")); n != 1 {
		t.Fatalf("bea's bulk job chose %d orders, want team-b's one", n)
	}
	root := newWebClient(t, c.url)
	root.origin = c.url
	if status := root.login("root", "root's password"); status != http.StatusSeeOther {
		t.Fatalf("root's login: %d", status)
	}
	_, page = root.do("GET", "/orders", nil)
	if !strings.Contains(page, idA) || !strings.Contains(page, idB) {
		t.Fatalf("root, in every namespace, does not see both orders:\n%s", page)
	}
	if status, _ := root.do("POST", "/bulk/pause", url.Values{"csrf": {csrfOf(t, page)}, "workflow": {"orphan"}}); status != http.StatusSeeOther {
		t.Fatalf("root's bulk pause: %d", status)
	}
	rootJob := strings.Split(root.last.Header.Get("Location"), "?")[0]
	if status, _ := bea.do("GET", rootJob, nil); status != http.StatusNotFound {
		t.Errorf("bea: GET %s (root's job): %d, want 404", rootJob, status)
	}
	if status, _ := bea.do("POST", rootJob+"/stop", url.Values{"csrf": {csrf}}); status != http.StatusNotFound {
		t.Errorf("bea: POST %s/stop: %d, want 404", rootJob, status)
	}
	if _, page := bea.do("GET", "/bulk", nil); strings.Contains(page, `href="`+rootJob+`"`) {
		t.Errorf("bea's bulk jobs list root's")
	}

	// In a browser: root switches to team-a and sees its orders alone,
	// without the deployment's pages; then back to every namespace.
	ctx := browser(t)
	login(t, ctx, c.url, "root", "root's password")
	if opts := eval[[]string](t, ctx, `Array.from(document.querySelectorAll("#namespace option")).map(o => o.value)`); strings.Join(opts, ",") != "*,default,team-a,team-b" {
		t.Fatalf("the switcher offers %v", opts)
	}
	// Choosing in the list switches (the page's script sends the form):
	// chosen as a person chooses, the value set and "change" fired once.
	eval[bool](t, ctx, `(() => { const s = document.getElementById("namespace"); s.value = "team-a"; s.dispatchEvent(new Event("change")); return true })()`)
	do(t, ctx, "team-a's orders", chromedp.WaitVisible(chromedp.CSS("#orders")))
	if rows := text(t, ctx, "#orders"); !strings.Contains(rows, idA[:8]) || strings.Contains(rows, idB[:8]) {
		t.Fatalf("root in team-a sees:\n%s", rows)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('nav a[href="/workflows"]').length`); n != 0 {
		t.Fatalf("the deployment's pages are offered in team-a's view")
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('nav a[href="/alerts"], nav a[href="/dead-letters"]').length`); n != 2 {
		t.Fatalf("team-a's alerts and dead letters are not offered in its view")
	}
	// And back with the button (the form without its script): the value
	// set without an event, then Switch.
	eval[bool](t, ctx, `(() => { document.getElementById("namespace").value = "*"; return true })()`)
	do(t, ctx, "back to every namespace", chromedp.Click(chromedp.CSS("#switch")), chromedp.WaitVisible(chromedp.CSS("#live")))

	// Nothing of team-a's order changed but root's job.
	if n := s.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND actor LIKE '%bea%'`, idA); n != 0 {
		t.Errorf("bea wrote team-a's history")
	}
	if n := s.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1`, idA); n < historyA {
		t.Errorf("team-a's history shrank")
	}
	if n := s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND namespace = 'team-a' AND status = 'received'`, idA); n != 1 {
		t.Errorf("team-a's order changed")
	}
}

// TestSubmitsReachTheirNamespaceByBrokerLogin: a submit on the queue that
// names a namespace (header sas-namespace) is written there when the
// login that published it, which RabbitMQ checks against its user-id, is
// granted that namespace (SAS_SUBMITTER_NAMESPACES), within its quotas;
// any other is dead-lettered with its reason. A user-id that is not the
// publisher's own never reaches the queue.
func TestSubmitsReachTheirNamespaceByBrokerLogin(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	if out, errOut, code := sasctl(t, s.env, "namespaces", "add", "team-a", "team-b", "team-q"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	if out, errOut, code := sasctl(t, s.env, "namespaces", "quota", "team-q", "--in-flight", "1"); code != 0 {
		t.Fatalf("namespaces quota: %s %s", out, errOut)
	}
	login := amqpLogin(t)
	sub := start(t, "submitter", append(append([]string{}, s.env...), "SAS_SUBMITTER_NAMESPACES="+login+"=team-a,"+login+"=team-q"))
	ch := amqpChannel(t)
	// sendWith publishes a submit (body: "" for a valid one) with the
	// headers given beside its namespace's.
	sendWith := func(user string, ns any, body string, headers amqp.Table) string {
		t.Helper()
		id := messages.NewID()
		if body == "" {
			body = badinput.ValidSubmitJSON(id)
		} else {
			body = strings.ReplaceAll(body, "ID", id)
		}
		p := amqp.Publishing{ContentType: messages.ContentType, MessageId: id, UserId: user, DeliveryMode: amqp.Persistent,
			Body: []byte(body), Headers: amqp.Table{}}
		for k, v := range headers {
			p.Headers[k] = v
		}
		if ns != nil {
			p.Headers["sas-namespace"] = ns
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", s.submit, true, false, p)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ok, err := dc.WaitContext(t.Context()); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
		return id
	}
	send := func(user string, ns any) string { return sendWith(user, ns, "", nil) }
	inA, plain, inQ := send(login, "team-a"), send("", nil), send(login, "team-q")
	// team-q's one order in flight first: the submitter handles submits
	// side by side, so the one past its quota is sent after it.
	testenv.Eventually(t, 30*time.Second, "team-q's first order written", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1`, inQ) == 1
	})
	// Each refusal's reason, and the namespace whose dead letter it is:
	// the one its login was granted, none for a namespace not granted
	// (whatever x-sas-namespace the publisher wrote itself).
	type refusal struct{ reason, ns string }
	forged := amqp.Table{"x-sas-namespace": "team-b"}
	refused := map[string]refusal{
		send(login, "team-b"):  {"namespace_refused", ""},
		send("", "team-a"):     {"namespace_refused", ""},
		send(login, "Team_A"):  {"invalid_value", ""},
		send(login, "team-q"):  {"quota_in_flight", "team-q"},
		send(login, "default"): {"namespace_refused", ""},
		sendWith(login, "team-a", `{"schema_version":2,"order_id":"ID","workflow":"nope","payload":{}}`, forged): {"unknown_workflow", "team-a"},
		sendWith(login, "team-b", `{"schema_version":2,"order_id":"ID","workflow":"nope","payload":{}}`, forged): {"namespace_refused", ""},
	}
	testenv.Eventually(t, 30*time.Second, "the submits handled", func() bool {
		return sub.metric(t, `sas_submitter_orders_total{outcome="inserted"}`)+sub.metric(t, `sas_submitter_orders_total{outcome="rejected"}`) == 10
	})
	for id, ns := range map[string]string{inA: "team-a", plain: "default", inQ: "team-q"} {
		if n := s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND namespace = $2`, id, ns); n != 1 {
			t.Errorf("order %s is not in %s", id, ns)
		}
	}
	// sasctl dlq list --namespace shows each namespace's alone.
	for _, ns := range []string{"team-a", "team-q"} {
		out, errOut, code := sasctl(t, s.env, "dlq", "list", "submit", "--namespace", ns, "--json")
		var listed []struct {
			MessageID string `json:"message_id"`
			Namespace string `json:"namespace"`
		}
		if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil || len(listed) != 1 || listed[0].Namespace != ns {
			t.Errorf("sasctl dlq list --namespace %s: exit %d %v\n%s%s", ns, code, err, out, errOut)
		} else if want := refused[listed[0].MessageID]; want.ns != ns {
			t.Errorf("sasctl dlq list --namespace %s listed %+v", ns, listed[0])
		}
	}
	for _, d := range drain(t, ch, s.dlq, len(refused), 30*time.Second) {
		want := refused[d.MessageId]
		if d.Headers["x-error-reason"] != want.reason {
			t.Errorf("dead letter %s: reason %v, want %s", d.MessageId, d.Headers["x-error-reason"], want.reason)
		}
		if ns, _ := d.Headers["x-sas-namespace"].(string); ns != want.ns {
			t.Errorf("dead letter %s (%s): namespace %q, want %q", d.MessageId, want.reason, ns, want.ns)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM orders WHERE namespace <> 'default'`); n != 2 {
		t.Errorf("%d orders outside the default namespace, want 2", n)
	}

	// Signals on the queue: an application's (through the signals
	// queue's exchange) reach the orders of the namespace its login was
	// granted, named in its header, or default's; one of sas's own
	// publishers (the default exchange) any order. Team-a's order waits
	// for nothing: a signal that reached it is refused no_such_wait, one
	// that did not, unknown_order, as for an order that does not exist.
	start(t, "scheduler", append(append([]string{}, s.env...), "SAS_SUBMITTER_NAMESPACES="+login+"=team-a"))
	signal := func(exchange, user string, ns any, order string) string {
		t.Helper()
		id := messages.NewID()
		body, err := messages.Encode(messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: id, OrderID: order, Name: "nothing_waits_for_this"})
		if err != nil {
			t.Fatal(err)
		}
		p := amqp.Publishing{ContentType: messages.ContentType, MessageId: id, UserId: user, DeliveryMode: amqp.Persistent, Body: body,
			Headers: amqp.Table{"x-sas-namespace": "team-b"}}
		if ns != nil {
			p.Headers["sas-namespace"] = ns
		}
		key := ""
		if exchange == "" {
			key = s.topo.Queue(messages.SignalsQueue)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), exchange, key, true, false, p)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if ok, err := dc.WaitContext(t.Context()); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
		return id
	}
	app := s.topo.Queue(messages.SignalsQueue) // the signals queue's own exchange
	signals := map[string]refusal{
		signal(app, login, "team-a", inA): {"no_such_wait", "team-a"},
		signal(app, "", nil, inA):         {"unknown_order", "default"},
		signal(app, login, nil, plain):    {"no_such_wait", "default"},
		signal(app, login, "team-b", inA): {"namespace_refused", ""},
		signal(app, login, "team-a", inQ): {"unknown_order", "team-a"},
		signal("", "", nil, inA):          {"no_such_wait", "team-a"},
		signal(app, login, "team-z", inA): {"namespace_refused", ""},
		signal(app, login, "Team_A", inA): {"invalid_value", ""},
	}
	// An unreadable one, in a namespace its login was granted: that
	// namespace's dead letter.
	unreadable := messages.NewID()
	if err := ch.PublishWithContext(t.Context(), app, "", false, false, amqp.Publishing{ContentType: messages.ContentType, MessageId: unreadable,
		UserId: login, Headers: amqp.Table{"sas-namespace": "team-a"}, Body: []byte(`{"schema_version":1,"nothing":"`)}); err != nil {
		t.Fatal(err)
	}
	signals[unreadable] = refusal{"not_json", "team-a"}
	for _, d := range drain(t, ch, s.topo.DeadLetterQueue(messages.SignalsQueue), len(signals), 30*time.Second) {
		want := signals[d.MessageId]
		ns, _ := d.Headers["x-sas-namespace"].(string)
		if d.Headers["x-error-reason"] != want.reason || ns != want.ns {
			t.Errorf("signal %s: dead-lettered for %v in namespace %q, want %s in %q", d.MessageId, d.Headers["x-error-reason"], ns, want.reason, want.ns)
		}
	}
	// sasctl submit --namespace sends its login as the user-id.
	out, errOut, code := sasctl(t, s.env, "submit", "--count", "2", "--namespace", "team-a", "--print-ids")
	if ids := strings.Fields(out); code != 0 || len(ids) != 2 {
		t.Fatalf("sasctl submit --namespace: exit %d\n%s%s", code, out, errOut)
	} else {
		testenv.Eventually(t, 30*time.Second, "sasctl's orders in team-a", func() bool {
			return s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND namespace = 'team-a'`, ids) == 2
		})
	}
	if _, errOut, code := sasctl(t, s.env, "submit", "--count", "1", "--namespace", "Team_A"); code != 2 || !strings.Contains(errOut, "--namespace") {
		t.Errorf("sasctl submit --namespace Team_A: exit %d %q, want a usage error", code, errOut)
	}
	// A user-id that is not the publisher's login: the broker refuses it.
	other := amqpChannel(t)
	closed := other.NotifyClose(make(chan *amqp.Error, 1))
	_ = other.PublishWithContext(t.Context(), "", s.submit, false, false, amqp.Publishing{ContentType: messages.ContentType, UserId: "someone-else",
		Headers: amqp.Table{"sas-namespace": "team-a"}, Body: []byte(badinput.ValidSubmitJSON(messages.NewID()))})
	select {
	case err := <-closed:
		if err == nil || err.Code != amqp.PreconditionFailed {
			t.Fatalf("a forged user-id: the channel closed with %v, want PRECONDITION_FAILED", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a forged user-id was taken by the broker")
	}
}

// amqpLogin is the login of the tests' broker URL.
func amqpLogin(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testenv.AMQPURL())
	if err != nil || u.User == nil {
		t.Fatalf("the broker URL names no login: %v", err)
	}
	return u.User.Username()
}

const nsLimitFile = `
limits:
  payments: {namespaces: {team-a: {max_in_flight: 1}}}
workflows:
  - name: shop
    steps:
      - {action: charge, agent: payments, timeout: 20s}
`

// TestANamespaceAtItsLimitLeavesTheKindToOthers: the workflows file gives
// team-a its own max_in_flight of 1 on a kind; team-a's orders, submitted
// first, run one at a time (no two of its calls overlap, on the database
// clock), while team-b's, submitted after, are claimed beside them and all
// end while team-a's backlog still waits. sasctl sets and resets a
// namespace's own limits, recorded with the operator; the default
// namespace takes none of its own, nor does a namespace that does not
// exist.
func TestANamespaceAtItsLimitLeavesTheKindToOthers(t *testing.T) {
	t.Parallel()
	g := runFile(t, "nslimit.yaml", nsLimitFile, pipelineOpts{schedulers: 2, agents: 1,
		faults: `{"charge":{"latency_min_ms":300,"latency_max_ms":300}}`})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "add", "team-a", "team-b"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	for _, bad := range [][]string{{"--namespace", "default", "--max-in-flight", "1"}, {"--namespace", "team-c", "--max-in-flight", "1"},
		{"--namespace", "team-a", "--min-rate", "1/s"}, {"--namespace", "team-a", "--rate", "0"}, {"--namespace", "Team A", "--max-in-flight", "1"}} {
		if out, errOut, code := sasctl(t, g.stack.env, append([]string{"limits", "set", "payments"}, bad...)...); code == 0 || errOut == "" {
			t.Errorf("limits set payments %v: exit %d, %q %q; want refused", bad, code, out, errOut)
		}
	}
	appA, appB := nsToken(t, g, "app-a", "submitter", "team-a"), nsToken(t, g, "app-b", "submitter", "team-b")
	submit := func(token string, n int) []string {
		t.Helper()
		var ids []string
		for range n {
			id := messages.NewID()
			if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token, body: submitBody(id, "shop", `{}`)}); code != http.StatusAccepted {
				t.Fatalf("submit: %d %s", code, b)
			}
			ids = append(ids, id)
		}
		return ids
	}
	a := submit(appA, 20)
	b := submit(appB, 6)
	g.waitTerminal(t, b, time.Minute)
	if left := g.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status <> 'completed'`, a); left < 5 {
		t.Fatalf("team-b's orders ended when %d of team-a's 20 were left: team-a's did not run one at a time (300 ms each), or team-b's waited behind them", left)
	}
	if out, _, _ := sasctl(t, g.stack.env, "limits", "list", "--namespace", "team-a"); !regexp.MustCompile(`(?m)^payments +team-a +max_in_flight=1 +file `).MatchString(out) {
		t.Fatalf("limits list --namespace team-a:\n%s", out)
	}
	// --json: each kind's entry, as before, with its namespaces' own.
	out, _, _ := sasctl(t, g.stack.env, "limits", "list", "--json")
	var kinds []struct {
		Agent      string `json:"agent"`
		Namespaces []struct {
			Namespace string `json:"namespace"`
			File      struct {
				MaxInFlight int `json:"max_in_flight"`
			} `json:"file"`
		} `json:"namespaces"`
	}
	if err := json.Unmarshal([]byte(out), &kinds); err != nil || len(kinds) != 1 || kinds[0].Agent != "payments" || len(kinds[0].Namespaces) != 1 ||
		kinds[0].Namespaces[0].Namespace != "team-a" || kinds[0].Namespaces[0].File.MaxInFlight != 1 {
		t.Fatalf("limits list --json (%v):\n%s", err, out)
	}
	g.waitTerminal(t, a, 2*time.Minute)
	// No two of team-a's calls overlapped.
	rows, err := g.pool.Query(context.Background(), `
		SELECT s.at, e.at FROM transitions s JOIN transitions e ON e.order_id = s.order_id AND e.step = 1 AND e.to_state = 'processed'
		WHERE s.order_id = ANY($1::uuid[]) AND s.step = 1 AND s.to_state = 'processing' ORDER BY s.at`, a)
	if err != nil {
		t.Fatal(err)
	}
	spans, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]time.Time, error) {
		var s [2]time.Time
		return s, r.Scan(&s[0], &s[1])
	})
	if err != nil || len(spans) != len(a) {
		t.Fatalf("%d spans of team-a's calls (%v), want %d", len(spans), err, len(a))
	}
	for i := 1; i < len(spans); i++ {
		if spans[i][0].Before(spans[i-1][1]) {
			t.Fatalf("team-a's calls %d and %d overlapped (%v < %v): its max_in_flight of 1 did not hold", i-1, i, spans[i][0], spans[i-1][1])
		}
	}
	if out, errOut, code := sasctl(t, g.stack.env, "limits", "set", "payments", "--namespace", "team-b", "--max-in-flight", "2", "--as", "ann"); code != 0 ||
		!strings.Contains(out, "agent payments in namespace team-b: max_in_flight=2") {
		t.Fatalf("limits set --namespace: %d %s %s", code, out, errOut)
	}
	if out, _, _ := sasctl(t, g.stack.env, "limits", "list"); !regexp.MustCompile(`(?m)^payments +team-b +max_in_flight=2 +operator:\S+ as ann at `).MatchString(out) {
		t.Fatalf("limits list:\n%s", out)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "limits", "reset", "payments", "--namespace", "team-b"); code != 0 || !strings.Contains(out, "else the kind's alone") {
		t.Fatalf("limits reset --namespace: %d %s %s", code, out, errOut)
	}
	if out, _, code := sasctl(t, g.stack.env, "limits", "reset", "payments", "--namespace", "team-a"); code == 0 {
		t.Fatalf("a reset of the file's own limits: %s, want refused", out)
	}
	if n := g.count(t, `SELECT count(*) FROM operator_actions WHERE target = 'payments in team-b' AND action IN ('limits set', 'limits reset')`); n != 2 {
		t.Fatalf("%d operator actions record team-b's limits set and reset, want 2", n)
	}
}
