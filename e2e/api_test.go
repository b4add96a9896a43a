package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/client"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

const apiFile = `
workflows:
  - name: shop
    policy: hold
    payload_schema: {type: object, required: [customer], properties: {customer: {type: string}, amount: {type: number}}}
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
      - {name: amount, type: number, expr: "has(payload.amount) ? payload.amount : 0"}
    steps:
      - {action: charge, agent: payments, timeout: 20s}
  - name: approval
    policy: compensate
    steps:
      - {action: score, agent: payments, timeout: 20s}
      - {id: approved, wait: {signal: approved, timeout: 5m, schema: {type: object, required: [by]}}}
`

// apiProc is a running API service.
type apiProc struct {
	*proc
	url string
}

// apiLogin makes a database login in role sas_api for this test's schema
// and returns the database URL that logs in with it.
func apiLogin(t *testing.T, s stack) string {
	t.Helper()
	suffix := "_" + testenv.RandomSuffix(8)
	t.Cleanup(func() { _, _ = s.pool.Exec(t.Context(), `DROP ROLE IF EXISTS sas_api`+suffix) })
	out, errOut, code := sasctl(t, append(append([]string{}, s.env...), "SAS_DB_PASSWORD_API=api-pw"), "db", "users", "--login-suffix", suffix)
	if code != 0 || !strings.Contains(out, "sas_api"+suffix) {
		t.Fatalf("db users: exit %d: %s %s", code, out, errOut)
	}
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("sas_api"+suffix, "api-pw")
	return u.String()
}

// startAPI starts the API service on s, logged in as sas_api, at addr
// ("" for a free one).
func startAPI(t *testing.T, s stack, addr string, extra ...string) apiProc {
	t.Helper()
	if addr == "" {
		addr = freeAddr(t)
	}
	environ := append(append([]string{}, s.env...), "SAS_DATABASE_URL="+apiLogin(t, s), "SAS_API_ADDR="+addr)
	p := start(t, "api", append(environ, extra...))
	return apiProc{proc: p, url: "http://" + addr}
}

// apiToken makes a token with sasctl and returns it.
func apiToken(t *testing.T, s stack, name, role string) string {
	t.Helper()
	out := sasctlOK(t, s.env, "api", "token", "create", "--name", name, "--role", role)
	return strings.TrimSpace(out)
}

// apiCall is one request to the API.
type apiCall struct {
	method, path, token, body string
	header                    map[string]string
}

// apiHTTP is the tests' client of the API: a bounded wait over the
// default transport's shared connections.
func apiHTTP() *http.Client { return &http.Client{Timeout: 90 * time.Second} }

func (a apiProc) call(t *testing.T, c apiCall) (int, http.Header, []byte) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, a.url+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := apiHTTP().Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", c.method, c.path, err)
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// Every answer is checked against docs/api.openapi.yaml.
	doc, err := loadAPIDoc()
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.check(c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), b); err != nil {
		t.Error(err)
	}
	return resp.StatusCode, resp.Header, b
}

// problemOf reads a problem document, failing the test if the answer is
// not one.
func problemOf(t *testing.T, h http.Header, b []byte) map[string]any {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("content type %q, want application/problem+json: %s", ct, b)
	}
	var p map[string]any
	if err := json.Unmarshal(b, &p); err != nil || p["type"] == nil || p["status"] == nil || p["title"] == nil {
		t.Errorf("not a problem document: %s", b)
	}
	return p
}

func submitBody(id, workflow, payload string) string {
	return fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":%q,"payload":%s}`, id, workflow, payload)
}

// TestHTTPAPIServesApplications: 20 clients submit orders over HTTP
// (1,000 in make api-e2e), a tenth of them twice (the same order: 200)
// and a hundredth again with other content (409); await and Server-Sent Events deliver every outcome;
// search attributes find a customer's orders; a submitter token sees its
// own orders only; a viewer cannot act; a revoked token is refused; a
// signal ends a wait, and one the wait refuses is refused at once; an
// order held for a bad payload is re-run with a corrected one, and its
// history keeps both and who.
func TestHTTPAPIServesApplications(t *testing.T) {
	t.Parallel()
	g := runFile(t, "api.yaml", apiFile, pipelineOpts{schedulers: 1, agents: 1, faults: `{"charge":{"refuse_if":"bad"}}`})
	// Traces on (to a collector that is not there): an order continues
	// its caller's trace.
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+freeAddr(t))
	app, other := apiToken(t, g.stack, "shop-app", "submitter"), apiToken(t, g.stack, "other-app", "submitter")
	viewer, ops := apiToken(t, g.stack, "dashboard", "viewer"), apiToken(t, g.stack, "ops", "operator")

	// make test: 200 orders; make api-e2e: the 1,000.
	const clients = 20
	each := scaleFromEnv(t, "SAS_API_ORDERS", 200) / clients
	ids := make([]string, clients*each)
	for i := range ids {
		ids[i] = messages.NewID()
	}
	payload := func(i int) string { return fmt.Sprintf(`{"customer":"c-%d","amount":%d}`, i%25, i) }
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for k := range each {
				i := c*each + k
				code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(ids[i], "shop", payload(i)),
					header: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
				if code != http.StatusAccepted {
					t.Errorf("submit %d: %d %s", i, code, b)
				}
				if i%10 == 0 { // 100 of them twice: the same order
					if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(ids[i], "shop", payload(i))}); code != http.StatusOK ||
						!strings.Contains(string(b), `"outcome":"duplicate"`) {
						t.Errorf("the same order again: %d %s", code, b)
					}
				}
				if i%100 == 1 { // 10 again with other content
					code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(ids[i], "shop", `{"customer":"someone else"}`)})
					if p := problemOf(t, h, b); code != http.StatusConflict || p["reason"] != "conflict" {
						t.Errorf("other content under the same id: %d %s", code, b)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := g.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids); n != len(ids) {
		t.Fatalf("%d orders written, want %d", n, len(ids))
	}
	if n := g.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND traceparent LIKE '00-4bf92f3577b34da6a3ce929d0e0e4736-%'`, ids); n != len(ids) {
		t.Errorf("%d of %d orders continue the caller's trace", n, len(ids))
	}

	// Await every order, 20 at a time; follow 50 of them by SSE too.
	var mu sync.Mutex
	outcomes := map[string]string{}
	for c := range clients {
		wg.Go(func() {
			for k := range each {
				id := ids[c*each+k]
				for {
					code, h, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + id + "/await?timeout=60s", token: app})
					if code != http.StatusOK {
						t.Errorf("await %s: %d %s", id, code, b)
						return
					}
					var ev messages.StatusEvent
					if err := json.Unmarshal(b, &ev); err != nil {
						t.Errorf("await %s: %v %s", id, err, b)
						return
					}
					if h.Get("Sas-Ended") == "true" {
						mu.Lock()
						outcomes[id] = ev.Status
						mu.Unlock()
						break
					}
				}
			}
		})
	}
	sse := map[string][]string{}
	for _, id := range ids[:min(50, len(ids))] {
		wg.Go(func() {
			got := followEvents(t, api, app, id)
			mu.Lock()
			sse[id] = got
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, id := range ids {
		if outcomes[id] != messages.StatusCompleted {
			t.Fatalf("order %s: await said %q, want completed", id, outcomes[id])
		}
	}
	for id, got := range sse {
		if len(got) == 0 || got[len(got)-1] != messages.StatusCompleted {
			t.Fatalf("order %s: the event stream sent %v, ending without completed", id, got)
		}
	}

	// Search by attribute: customer c-7's orders, and those of them with
	// an amount of at least half the count.
	var c7, c7big int
	for i := range ids {
		if i%25 == 7 {
			c7++
			if i >= len(ids)/2 {
				c7big++
			}
		}
	}
	code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders?where=customer%3Dc-7&limit=500", token: viewer})
	var page struct {
		Orders []struct {
			OrderID string `json:"order_id"`
		} `json:"orders"`
	}
	if err := json.Unmarshal(b, &page); code != http.StatusOK || err != nil || len(page.Orders) != c7 {
		t.Fatalf("customer=c-7: %d, %d orders, want %d: %s", code, len(page.Orders), c7, b)
	}
	code, _, b = api.call(t, apiCall{method: "GET", path: fmt.Sprintf("/api/v1/orders?where=customer%%3Dc-7&where=amount%%3E%%3D%d&limit=500", len(ids)/2), token: viewer})
	if err := json.Unmarshal(b, &page); code != http.StatusOK || err != nil || len(page.Orders) != c7big {
		t.Fatalf("customer=c-7 and amount>=%d: %d, %d orders, want %d: %s", len(ids)/2, code, len(page.Orders), c7big, b)
	}

	// Who may see and do what.
	for _, c := range []struct {
		desc string
		call apiCall
		want int
	}{
		{"no token", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0]}, 401},
		{"a wrong token", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0], token: app + "x"}, 401},
		{"another submitter's order", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0], token: other}, 404},
		{"another submitter awaits it", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0] + "/await?timeout=0s", token: other}, 404},
		{"a submitter lists", apiCall{method: "GET", path: "/api/v1/orders", token: app}, 403},
		{"a viewer submits", apiCall{method: "POST", path: "/api/v1/orders", token: viewer, body: submitBody(messages.NewID(), "shop", `{"customer":"v"}`)}, 403},
		{"a viewer cancels", apiCall{method: "POST", path: "/api/v1/orders/" + ids[0] + "/cancel", token: viewer}, 403},
		{"a submitter resubmits", apiCall{method: "POST", path: "/api/v1/orders/" + ids[0] + "/resubmit", token: app}, 403},
		{"its own order", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0], token: app}, 200},
		{"a viewer reads any", apiCall{method: "GET", path: "/api/v1/orders/" + ids[0], token: viewer}, 200},
		{"a completed order cannot be cancelled", apiCall{method: "POST", path: "/api/v1/orders/" + ids[0] + "/cancel", token: ops}, 409},
	} {
		code, h, b := api.call(t, c.call)
		if code != c.want {
			t.Errorf("%s: %d, want %d: %s", c.desc, code, c.want, b)
		}
		if code >= 400 {
			problemOf(t, h, b)
		}
	}
	if _, errOut, code := sasctl(t, g.env, "api", "token", "revoke", "other-app"); code != 0 {
		t.Fatalf("revoke: %s", errOut)
	}
	testenv.Eventually(t, 10*time.Second, "the revoked token to be refused", func() bool {
		code, _, _ := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: other, body: submitBody(messages.NewID(), "shop", `{"customer":"x"}`)})
		return code == http.StatusUnauthorized
	})

	// A signal ends a wait; one its schema refuses, or for no wait, is
	// refused at once with the reason.
	wait := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(wait, "approval", `{}`)}); code != 202 {
		t.Fatalf("submit approval: %d %s", code, b)
	}
	for _, c := range []struct {
		name, body, reason string
		want               int
	}{
		{"approved", `{"who":"nobody"}`, "invalid_payload", 422},
		{"rejected", `{"by":"ann"}`, "no_such_wait", 409},
		{"approved", `{"by":"ann"}`, "", 202},
	} {
		code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + wait + "/signals/" + c.name, token: app, body: c.body})
		if code != c.want {
			t.Fatalf("signal %s %s: %d, want %d: %s", c.name, c.body, code, c.want, b)
		}
		if c.reason != "" && problemOf(t, h, b)["reason"] != c.reason {
			t.Fatalf("signal %s %s: %s, want reason %s", c.name, c.body, b, c.reason)
		}
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + wait + "/await?timeout=60s", token: app}); code != 200 ||
		!strings.Contains(string(b), `"status":"completed"`) || !strings.Contains(string(b), `"by":"ann"`) {
		t.Fatalf("the signalled order: %d %s", code, b)
	}

	// The Go client's HTTP path: submit, await, and a refusal with its
	// reason.
	hc := client.NewHTTP(api.url, app, nil)
	goID, err := hc.Submit(t.Context(), client.Order{Workflow: "shop", Payload: map[string]any{"customer": "go-client"}})
	if err != nil {
		t.Fatalf("client.HTTP submit: %v", err)
	}
	if st, err := hc.Await(t.Context(), goID, 30*time.Second); err != nil || st.Status != messages.StatusCompleted {
		t.Fatalf("client.HTTP await: %+v %v", st, err)
	}
	var rej *client.RejectedError
	if _, err := hc.Submit(t.Context(), client.Order{Workflow: "nope", Payload: map[string]any{}}); !errors.As(err, &rej) || rej.Reason != "unknown_workflow" {
		t.Fatalf("client.HTTP submit of an unknown workflow: %v", err)
	}
	var prob *client.ProblemError
	if _, err := hc.Signal(t.Context(), goID, "approved", "", map[string]string{"by": "x"}); !errors.As(err, &prob) || prob.Reason != "order_ended" {
		t.Fatalf("client.HTTP signal of an ended order: %v", err)
	}

	// A payload the service refuses holds the order; a re-run with the
	// payload corrected completes, and the history keeps both and who.
	bad := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(bad, "shop", `{"customer":"c-bad","bad":true}`)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	if code, h, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + bad + "/await?timeout=60s", token: app}); code != 200 || h.Get("Sas-Ended") != "true" ||
		!strings.Contains(string(b), `"status":"error"`) {
		t.Fatalf("the bad order: %d %s", code, b)
	}
	for _, c := range []struct {
		body string
		want int
	}{
		{`{"payload":{"amount":3}}`, 422},           // breaks the schema: customer is required
		{`{"payload":"no"}`, 400},                   // not an object
		{`{"payload":{"customer":"x"},"x":1}`, 400}, // an unknown field
	} {
		if code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + bad + "/rerun", token: ops, body: c.body}); code != c.want {
			t.Fatalf("rerun %s: %d, want %d: %s", c.body, code, c.want, b)
		} else {
			problemOf(t, h, b)
		}
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + bad + "/rerun", token: ops, body: `{"payload":{"customer":"c-bad","bad":false}}`}); code != 200 {
		t.Fatalf("rerun: %d %s", code, b)
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + bad + "/await?timeout=60s", token: app}); code != 200 || !strings.Contains(string(b), `"status":"completed"`) {
		t.Fatalf("the re-run order: %d %s", code, b)
	}
	code, _, b = api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + bad, token: viewer})
	var view struct {
		Order struct {
			Payload map[string]any `json:"payload"`
		} `json:"order"`
		Payloads []struct {
			ReplacedBy string         `json:"replaced_by"`
			Payload    map[string]any `json:"payload"`
		} `json:"payload_history"`
		History []struct {
			Actor, ClaimedBy string
		} `json:"history"`
		Attributes map[string]any `json:"attributes"`
	}
	if err := json.Unmarshal(b, &view); code != 200 || err != nil {
		t.Fatalf("get: %d %v %s", code, err, b)
	}
	if view.Order.Payload["bad"] != false || len(view.Payloads) != 1 || view.Payloads[0].Payload["bad"] != true || view.Payloads[0].ReplacedBy != "api:ops" {
		t.Fatalf("after the re-run: payload %v, history %+v", view.Order.Payload, view.Payloads)
	}
	if !bytes.Contains(b, []byte(`"claimed_by":"api:ops"`)) || view.Attributes["customer"] != "c-bad" {
		t.Fatalf("the history does not name the operator's token, or the attributes are wrong: %s", b)
	}
}

// followEvents reads an order's event stream to its end and returns the
// statuses it sent.
func followEvents(t *testing.T, api apiProc, token, id string) []string {
	t.Helper()
	req, err := http.NewRequest("GET", api.url+"/api/v1/orders/"+id+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := apiHTTP().Do(req)
	if err != nil {
		t.Errorf("events %s: %v", id, err)
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("events %s: %d %s", id, resp.StatusCode, resp.Header.Get("Content-Type"))
		return nil
	}
	var got []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev messages.StatusEvent
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Errorf("events %s: %v in %s", id, err, data)
			return got
		}
		got = append(got, ev.Status)
	}
	return got
}

// TestBulkResubmitSurvivesAKill: orders held in error (2,000 in make
// api-e2e) are
// resubmitted by one bulk job; the API service is killed with SIGKILL
// halfway and started again; every order is resubmitted exactly once,
// and the job records each with its operator.
func TestBulkResubmitSurvivesAKill(t *testing.T) {
	t.Parallel()
	g := runFile(t, "api.yaml", apiFile, pipelineOpts{schedulers: 1, agents: 1, faults: `{"charge":{"refuse_if":"bad"}}`})
	addr := freeAddr(t)
	extra := []string{"SAS_WORKFLOWS_FILE=" + g.file, "SAS_API_BULK_LEASE=2s", "SAS_API_BULK_BATCH=20"}
	api := startAPI(t, g.stack, addr, extra...)
	app, ops := apiToken(t, g.stack, "loader", "submitter"), apiToken(t, g.stack, "ops", "operator")
	// make test: 300 held orders; make api-e2e: the 2,000.
	n := scaleFromEnv(t, "SAS_API_HELD", 300)
	var wg sync.WaitGroup
	for c := range 20 {
		wg.Go(func() {
			for i := c; i < n; i += 20 {
				body := submitBody(messages.NewID(), "shop", fmt.Sprintf(`{"customer":"held-%d","bad":true}`, i%7))
				if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: body}); code != 202 {
					t.Errorf("submit: %d %s", code, b)
				}
			}
		})
	}
	wg.Wait()
	testenv.Eventually(t, 3*time.Minute, "every order held in error", func() bool {
		return g.count(t, `SELECT count(*) FROM orders WHERE status = 'error' AND workflow = 'shop'`) == n
	})
	filter := `{"filter":{"status":"error","workflow":"shop"}`
	code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/resubmit", token: ops, body: filter + `,"dry_run":true}`})
	if code != 200 || !strings.Contains(string(b), fmt.Sprintf(`"count":%d`, n)) {
		t.Fatalf("dry run: %d %s", code, b)
	}
	if g.count(t, `SELECT count(*) FROM bulk_jobs`) != 0 {
		t.Fatal("a dry run made a job")
	}
	code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/resubmit", token: ops, body: filter + `}`})
	if code != 202 || h.Get("Location") == "" {
		t.Fatalf("bulk resubmit: %d %s", code, b)
	}
	job := h.Get("Location")
	var state struct {
		State       string
		Total, Done int
	}
	read := func(a apiProc) bool {
		code, _, b := a.call(t, apiCall{method: "GET", path: job, token: ops})
		return code == 200 && json.Unmarshal(b, &state) == nil
	}
	testenv.Eventually(t, time.Minute, "the job to be under way", func() bool { return read(api) && state.Done >= n/15 })
	if state.Done >= n {
		t.Fatalf("the job ended before the kill: %+v", state)
	}
	api.kill(t)
	killedAt := state.Done
	api = startAPI(t, g.stack, addr, extra...)
	testenv.Eventually(t, 3*time.Minute, "the job to finish after the restart", func() bool { return read(api) && state.State == "done" })
	if state.Total != n || state.Done != n {
		t.Fatalf("job: %+v, want %d done", state, n)
	}
	if killedAt >= n {
		t.Fatalf("killed at %d of %d: not halfway", killedAt, n)
	}
	if bad := g.count(t, `SELECT count(*) FROM (SELECT o.order_id FROM orders o
		LEFT JOIN transitions h ON h.order_id = o.order_id AND h.step IS NULL AND h.reason = 'operator resubmit'
		WHERE o.workflow = 'shop' GROUP BY o.order_id HAVING count(h.id) <> 1) x`); bad != 0 {
		t.Fatalf("%d orders were not resubmitted exactly once", bad)
	}
	if n2 := g.count(t, `SELECT count(*) FROM bulk_job_orders WHERE outcome = 'done'`); n2 != n {
		t.Fatalf("the job records %d orders done, want %d", n2, n)
	}
	if by := g.count(t, `SELECT count(*) FROM transitions WHERE reason = 'operator resubmit' AND step IS NULL
		AND actor LIKE 'operator:sas_api%'`); by != n {
		t.Fatalf("%d resubmits recorded as the API's login, want %d", by, n)
	}
}

// scaleFromEnv is a test's size: the variable's value when set (a make
// target that runs the full size), else small, for make test.
func scaleFromEnv(t *testing.T, name string, small int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return small
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 20 {
		t.Fatalf("%s=%q: want a number of at least 20", name, v)
	}
	return n
}
