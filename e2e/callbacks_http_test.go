package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sas/internal/contract"
	"sas/internal/harness/testenv"
)

// TestServicesCallBackOverHTTP: the export example of
// docs/YOUR-PROCESS.md, its service answering 202 Accepted, its steps
// ended over the HTTP API by the step's token alone (POST
// /api/v1/steps/complete, /fail, /heartbeat), as a service in any
// language does. A heartbeat holds a step; complete ends it with its
// result; a fail refuses it for good and the order's policy applies. Hostile callbacks (no token, a forged or tampered
// one, a body of 1 MB, not JSON, a NUL, a result that is no object, a
// fail without a reason) each get a problem document with its reason and
// change nothing; a repeated callback is a duplicate, one of an ended
// attempt stale (one of a superseded or timed-out attempt: the state
// store's TestCallbacksAreFencedAndAppliedOnce). An API that asks for an API token as well
// (SAS_API_CALLBACKS_NEED_TOKEN) refuses a callback without one. The
// curl and Python examples of docs/YOUR-PROCESS.md run as written; sasctl
// steps complete ends a step through the same door.
func TestServicesCallBackOverHTTP(t *testing.T) {
	t.Parallel()
	svc := &asyncService{tokens: map[string][]string{}, calls: make(chan string, 100)}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	file := strings.NewReplacer("timeout: 30s", "timeout: 20s", "max_duration: 2h", "max_duration: 60s").
		Replace(docBlock(t, "yaml", "# export.yaml"))
	g := runFile(t, "export.yaml", file, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1,
		agentEnv: []string{"SAS_REMOTE_URL=" + srv.URL}, submitterEnv: []string{"SAS_STEP_TIMEOUT=0s"}})
	p := g.pipeline
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	strict := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file, "SAS_API_CALLBACKS_NEED_TOKEN=true")
	app := apiToken(t, g.stack, "svc", "submitter")

	const orders = 12
	ids := g.submit(t, "export", slices.Repeat([]string{`{}`}, orders))
	testenv.Eventually(t, time.Minute, "every step to be called", func() bool {
		for _, id := range ids {
			if len(svc.tokensOf(id)) == 0 {
				return false
			}
		}
		return true
	})
	token := func(id string, attempt int) string { return svc.tokensOf(id)[attempt-1] }
	callback := func(a apiProc, what, tok, bearer, body string) (int, http.Header, []byte) {
		t.Helper()
		hdr := map[string]string{}
		if tok != "" {
			hdr[contract.HeaderStepToken] = tok
		}
		return a.call(t, apiCall{method: "POST", path: "/api/v1/steps/" + what, token: bearer, body: body, header: hdr})
	}
	refused := func(desc string, code int, h http.Header, b []byte, want int, reason string) {
		t.Helper()
		if code != want {
			t.Errorf("%s: %d, want %d: %s", desc, code, want, b)
			return
		}
		if p := problemOf(t, h, b); p["reason"] != reason {
			t.Errorf("%s: reason %v, want %s: %s", desc, p["reason"], reason, b)
		}
	}
	state := func(id string) string {
		var s string
		if err := p.pool.QueryRow(t.Context(), `SELECT process_state || ' ' || attempt || ' ' || coalesce(result::text, '-') || ' '
			|| (SELECT count(*) FROM signals WHERE order_id = $1) FROM steps WHERE order_id = $1 AND step = 1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Hostile callbacks on the first order's running step change nothing.
	first := ids[0]
	tok := token(first, 1)
	before := state(first)
	if !strings.HasPrefix(before, "processing 1 ") {
		t.Fatalf("the first order's step: %s", before)
	}
	code, h, b := callback(api, "complete", "", "", `{"file":"x"}`)
	refused("no token", code, h, b, 401, "invalid_token")
	code, h, b = callback(api, "complete", strings.Replace(tok, ".1.1.", ".2.1.", 1), "", `{"file":"forged"}`)
	refused("a token for another step", code, h, b, 403, "invalid_token")
	code, h, b = callback(api, "complete", tok[:len(tok)-1]+map[bool]string{true: "B", false: "A"}[strings.HasSuffix(tok, "A")], "", `{"file":"tampered"}`)
	refused("a tampered token", code, h, b, 403, "invalid_token")
	code, h, b = callback(api, "complete", "st1.made-up", "", `{"file":"made up"}`)
	refused("a made-up token", code, h, b, 403, "invalid_token")
	code, h, b = callback(api, "complete", tok, "", `{"file":"`+strings.Repeat("x", 1<<20)+`"}`)
	refused("a body of 1 MB", code, h, b, 413, "too_large")
	code, h, b = callback(api, "complete", tok, "", `this is not JSON`)
	refused("not JSON", code, h, b, 400, "not_json")
	code, h, b = callback(api, "complete", tok, "", `[1, 2]`)
	refused("a result that is no object", code, h, b, 400, "invalid_value")
	code, h, b = callback(api, "fail", tok, "", `{"error":"a\u0000b"}`)
	refused("a NUL in the reason", code, h, b, 400, "invalid_encoding")
	code, h, b = callback(api, "fail", tok, "", ``)
	refused("a fail without a body", code, h, b, 400, "not_json")
	code, h, b = callback(api, "fail", tok, "", `{"why":"no"}`)
	refused("a fail with another field", code, h, b, 400, "invalid_value")
	code, h, b = callback(strict, "complete", tok, "", `{"file":"no API token"}`)
	if code != 401 {
		t.Errorf("a callback without an API token where one is asked: %d %s", code, b)
	} else {
		problemOf(t, h, b)
	}
	// Where an API token is asked, one of another namespace than the
	// step's order's reaches nothing with a valid step token.
	if out, errOut, code := sasctl(t, g.stack.env, "namespaces", "add", "team-a"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	svcA, errOut, exit := sasctl(t, g.stack.env, "api", "token", "create", "--name", "svc-a", "--role", "submitter", "--namespace", "team-a")
	if exit != 0 {
		t.Fatalf("api token create: %s", errOut)
	}
	code, h, b = callback(strict, "complete", tok, strings.TrimSpace(svcA), `{"file":"another namespace's"}`)
	refused("an API token of another namespace", code, h, b, 403, "invalid_token")
	if after := state(first); after != before {
		t.Fatalf("hostile callbacks changed the step: %s → %s", before, after)
	}

	// A heartbeat holds the step open: its complete_by moves out.
	var until time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT complete_by FROM steps WHERE order_id = $1 AND step = 1`, ids[1]).Scan(&until); err != nil {
		t.Fatal(err)
	}
	code, _, b = callback(api, "heartbeat", token(ids[1], 1), "", "")
	var done struct {
		OrderID    string    `json:"order_id"`
		Step       int       `json:"step"`
		Attempt    int       `json:"attempt"`
		CompleteBy time.Time `json:"complete_by"`
	}
	if code != 200 || json.Unmarshal(b, &done) != nil || done.OrderID != ids[1] || done.Step != 1 || done.Attempt != 1 || !done.CompleteBy.After(until) {
		t.Fatalf("a heartbeat: %d %s (complete_by was %s)", code, b, until.Format(time.RFC3339Nano))
	}

	// The examples of docs/YOUR-PROCESS.md, as written there: curl
	// (heartbeat, complete, then a fail that comes too late) and Python.
	docAPI := "http://localhost:8090/api/v1"
	sh := docBlock(t, "sh", "API="+docAPI)
	cmd := exec.CommandContext(t.Context(), "sh", "-e", "-c", strings.Replace(sh, docAPI, api.url+"/api/v1", 1))
	cmd.Env = append(os.Environ(), "TOKEN="+token(ids[3], 1))
	if out, err := cmd.CombinedOutput(); err != nil || strings.Count(string(out), `"outcome":"applied"`) != 2 || !strings.Contains(string(out), "stale_token") {
		t.Fatalf("the curl example: %v\n%s", err, out)
	}
	py := docBlock(t, "python", "import json, urllib.request")
	cmd = exec.CommandContext(t.Context(), "python3", "-c", "token = "+strconv.Quote(token(ids[4], 1))+"\n"+strings.Replace(py, docAPI, api.url+"/api/v1", 1))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Python example: %v\n%s", err, out)
	}
	byExample := map[string]bool{ids[3]: true, ids[4]: true}

	// Complete every other order but the last two over the API; one
	// through the API that asks for an API token too.
	for i, id := range ids[:orders-2] {
		if byExample[id] {
			continue
		}
		a, bearer := api, ""
		if i == 2 {
			a, bearer = strict, app
		}
		code, _, b := callback(a, "complete", token(id, 1), bearer, `{"file":"export-`+id+`"}`)
		if code != 200 || !strings.Contains(string(b), `"outcome":"applied"`) {
			t.Fatalf("complete %s: %d %s", id, code, b)
		}
	}
	// sasctl steps complete: the same door.
	out, errOut, exit := sasctl(t, g.stack.env, "steps", "complete", token(ids[orders-2], 1), "--result", `{"file":"export-`+ids[orders-2]+`"}`)
	if exit != 0 || !strings.Contains(out, "completed") {
		t.Fatalf("sasctl steps complete: exit %d: %s %s", exit, out, errOut)
	}
	// A fail refuses the step for good: the order's policy applies (here
	// it ends failed, nothing to undo), with the reason in its history.
	last := ids[orders-1]
	code, _, b = callback(api, "fail", token(last, 1), "", `{"error":"the source system refused the export"}`)
	if code != 200 {
		t.Fatalf("fail: %d %s", code, b)
	}
	p.waitTerminal(t, ids, 2*time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids[:orders-1]); n != orders-1 {
		t.Fatalf("%d of %d orders completed", n, orders-1)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'failed'`, last); n != 1 {
		t.Fatal("the order whose step failed did not end failed")
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND reason LIKE '%the source system refused the export%'`, last); n == 0 {
		t.Fatal("the fail's reason is not in the history")
	}
	for _, id := range ids[:orders-1] {
		var file string
		want := "export-" + id
		if byExample[id] {
			want = "s3://exports/42.csv"
		}
		if err := p.pool.QueryRow(t.Context(), `SELECT result->>'file' FROM steps WHERE order_id = $1 AND step = 1`, id).Scan(&file); err != nil || file != want {
			t.Fatalf("order %s: result file %q (%v)", id, file, err)
		}
	}

	// Repeated and late callbacks change nothing, and say which.
	before = state(first)
	code, h, b = callback(api, "complete", tok, "", `{"file":"export-`+first+`"}`)
	refused("the same complete again", code, h, b, 409, "duplicate")
	code, h, b = callback(api, "fail", tok, "", `{"error":"too late"}`)
	refused("a fail after the step ended", code, h, b, 409, "stale_token")
	code, h, b = callback(api, "heartbeat", tok, "", "")
	refused("a heartbeat after the step ended", code, h, b, 409, "stale_token")
	code, h, b = callback(api, "complete", token(last, 1), "", `{"file":"stale"}`)
	refused("a complete after a fail", code, h, b, 409, "stale_token")
	if after := state(first); after != before {
		t.Fatalf("late callbacks changed the step: %s → %s", before, after)
	}
	_, errOut, exit = sasctl(t, g.stack.env, "steps", "fail", tok, "--error", "too late")
	if exit == 0 || !strings.Contains(errOut, "stale_token") {
		t.Fatalf("sasctl steps fail of an ended step: exit %d: %s", exit, errOut)
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND result::text LIKE '%stale%'`, ids); n != 0 {
		t.Fatalf("%d steps took a refused callback's result", n)
	}
}
