package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// TestAgentCheckTellsAKeptContractFromABrokenOne: sasctl agent check
// passes every rule against the demo service (slowed down, so that calls
// at once with one key meet one in flight) and fails, naming the rules,
// against a service that applies every call anew.
func TestAgentCheckTellsAKeptContractFromABrokenOne(t *testing.T) {
	t.Parallel()
	demo := startOn(t, "remote", env("SAS_REMOTE_FAULTS="+`{"*":{"latency_min_ms":200,"latency_max_ms":200}}`), "SAS_REMOTE_ADDR")
	out, errOut, code := sasctl(t, env(), "agent", "check", "http://"+demo.ops, "--action", "open_account")
	if code != 0 || strings.Count(out, "PASS") != 9 || strings.Contains(out, "FAIL") {
		t.Fatalf("against the demo service (exit %d):\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "answered 409") || strings.Contains(out, "0 answered 409") {
		t.Fatalf("no call met another in flight:\n%s", out)
	}

	var applied atomic.Int64
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Applies every call, whatever its key, body or deadline.
		n := applied.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"effect":%d}`, n)
	}))
	t.Cleanup(broken.Close)
	out, errOut, code = sasctl(t, env(), "agent", "check", broken.URL)
	if code != 1 {
		t.Fatalf("against a broken service: exit %d\n%s%s", code, out, errOut)
	}
	for _, rule := range []string{
		"FAIL  the same key twice gives the same answer",
		"FAIL  the same key with another body gives 422",
		"FAIL  8 calls at once with one key give one result",
		"FAIL  a call past its deadline is refused or harmless",
		"FAIL  a call it cannot read is refused for good",
		"FAIL  the undo of an action that never ran is done, and the action cannot happen after it",
	} {
		if !strings.Contains(out, rule) {
			t.Errorf("the check did not say %q:\n%s", rule, out)
		}
	}
	if !strings.Contains(out, "PASS  a call is done") {
		t.Errorf("a call that is done was not passed:\n%s", out)
	}
}

// TestAgentCheckFindsARememberedRefusal: a service that keeps the demo's
// contract but remembers its refusals as a key's answer (so a step
// resubmitted after its cause was fixed is refused for ever) fails the
// check's refusal rule, and only it.
func TestAgentCheckFindsARememberedRefusal(t *testing.T) {
	t.Parallel()
	demo := startOn(t, "remote", env("SAS_REMOTE_FAULTS={}"), "SAS_REMOTE_ADDR")
	var mu sync.Mutex
	refused := map[string]bool{}
	remembering := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if refused[key] || !json.Valid(body) {
			refused[key] = true
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		// Everything else as the demo service does it.
		req, _ := http.NewRequest(r.Method, "http://"+demo.ops+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(remembering.Close)
	out, errOut, code := sasctl(t, env(), "agent", "check", remembering.URL)
	if code != 1 || strings.Count(out, "FAIL") != 1 || !strings.Contains(out, "FAIL  a refusal is not kept as the key's answer") {
		t.Fatalf("against a service that remembers its refusals (exit %d):\n%s%s", code, out, errOut)
	}
}

// TestPayloadMeansTheSameEverywhere: --payload takes a JSON object
// inline, @FILE, or a bare file name, in agent check as in submit; what
// is neither says so.
func TestPayloadMeansTheSameEverywhere(t *testing.T) {
	t.Parallel()
	demo := startOn(t, "remote", env("SAS_REMOTE_FAULTS={}"), "SAS_REMOTE_ADDR")
	file := writeFile(t, "payload.json", `{"customer":"c","items":[{"sku":"S","qty":1}],"amount":1,"currency":"EUR"}`)
	for _, payload := range []string{"@" + file, file, `{"plan":"team"}`} {
		if out, errOut, code := sasctl(t, env(), "agent", "check", "http://"+demo.ops, "--payload", payload); code != 0 {
			t.Errorf("agent check --payload %s: exit %d\n%s%s", payload, code, out, errOut)
		}
	}
	if _, errOut, code := sasctl(t, env(), "agent", "check", "http://"+demo.ops, "--payload", "@/no/such/file"); code != 2 ||
		!strings.Contains(errOut, "write a JSON object inline, or @FILE") {
		t.Errorf("agent check with a missing payload file: exit %d\n%s", code, errOut)
	}
	s := newStack(t)
	start(t, "submitter", s.env)
	inline, _ := os.ReadFile(file)
	for _, payload := range []string{"@" + file, string(inline)} {
		out := sasctlOK(t, s.env, "submit", "--count", "1", "--workflow", "single", "--payload", payload, "--print-ids")
		id := strings.TrimSpace(out)
		testenv.Eventually(t, 30*time.Second, "the order written", func() bool {
			return s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND payload->>'customer' = 'c'`, id) == 1
		})
	}
}

// asyncCheckService answers every call 202 Accepted and, once a key is
// called a second time (a later attempt, with a new token), sends the
// key's heartbeat and callback: with the newest token, or, when stale,
// with the first.
func asyncCheckService(t *testing.T, send func(ctx context.Context, token, name string) error, stale bool) *httptest.Server {
	var mu sync.Mutex
	tokens := map[string][]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !json.Valid(body) {
			http.Error(w, `{"error":"unreadable"}`, http.StatusBadRequest)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		tokens[key] = append(tokens[key], r.Header.Get("Sas-Step-Token"))
		seen := slices.Clone(tokens[key])
		mu.Unlock()
		w.Header().Set("Sas-Heartbeat", "60")
		w.WriteHeader(http.StatusAccepted)
		if len(seen) < 3 { // the first call, and the same key again
			return
		}
		tok := seen[len(seen)-1]
		if stale {
			tok = seen[0]
		}
		for _, name := range []string{"heartbeat", "complete"} {
			if err := send(r.Context(), tok, name); err != nil {
				t.Errorf("send the callback: %v", err)
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestAgentCheckFollowsTheCallbackPath: a service that answers 202
// Accepted is checked on the callback path: sasctl watches the queue it
// names, or serves the API's callback routes at the address it names,
// for the callback, and passes a service that calls back with the
// newest token; one that calls back with an earlier attempt's token
// fails that rule, counted once (sas would refuse it, stale_token), and
// with neither the callback rule cannot pass.
func TestAgentCheckFollowsTheCallbackPath(t *testing.T) {
	t.Parallel()
	ch := amqpChannel(t)
	overQueue := func(queue string) func(ctx context.Context, token, name string) error {
		return func(ctx context.Context, token, name string) error {
			cb, _ := json.Marshal(map[string]any{"schema_version": 1, "token": token, "name": name})
			return ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{ContentType: "application/json", Body: cb})
		}
	}
	overHTTP := func(addr string) func(ctx context.Context, token, name string) error {
		return func(ctx context.Context, token, name string) error {
			body := ""
			if name == "complete" {
				body = `{"file":"x"}`
			}
			req, err := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/api/v1/steps/"+name, strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Sas-Step-Token", token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		}
	}
	for _, stale := range []bool{false, true} {
		for _, how := range []string{"queue", "http"} {
			var send func(ctx context.Context, token, name string) error
			var flags []string
			switch how {
			case "queue":
				queue := "e2e-check-callbacks." + messages.NewID()
				if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
				send, flags = overQueue(queue), []string{"--signals-queue", queue}
			case "http":
				addr := freeAddr(t)
				send, flags = overHTTP(addr), []string{"--callback-listen", addr}
			}
			srv := asyncCheckService(t, send, stale)
			out, errOut, code := sasctl(t, env(), append([]string{"agent", "check", srv.URL, "--callback-wait", "20s"}, flags...)...)
			if !strings.Contains(out, "answered 202 Accepted: checking the callback path") {
				t.Fatalf("%s, stale %v: not checked as a 202 service (exit %d):\n%s%s", how, stale, code, out, errOut)
			}
			switch {
			case !stale && (code != 0 || strings.Count(out, "PASS") != 5 || strings.Contains(out, "FAIL")):
				t.Fatalf("%s: a service that calls back with the newest token (exit %d):\n%s%s", how, code, out, errOut)
			case stale && (code != 1 || strings.Count(out, "FAIL") != 1 || !strings.Contains(out, "FAIL  the callback comes, with the newest token") ||
				!strings.Contains(out, "stale_token") || !strings.Contains(errOut, "1 of 5 rules failed")):
				t.Fatalf("%s: a service that calls back with the first token (exit %d):\n%s%s", how, code, out, errOut)
			}
			if !stale && !strings.Contains(out, "after 1 heartbeats") {
				t.Fatalf("%s: the heartbeat before the callback was not seen:\n%s", how, out)
			}
		}
	}
	srv := asyncCheckService(t, overQueue("nowhere."+messages.NewID()), false)
	out, _, code := sasctl(t, env(), "agent", "check", srv.URL)
	if code != 1 || !strings.Contains(out, "FAIL  the callback comes") || !strings.Contains(out, "give --callback-listen") {
		t.Fatalf("without a queue to watch (exit %d):\n%s", code, out)
	}
}
