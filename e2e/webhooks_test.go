package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// webhookReceiver takes signed deliveries: it checks each signature with
// secret (HMAC-SHA256 of "UNIX.BODY", UNIX within five minutes), refuses
// the first try of each delivery with 500, and keeps each delivery's
// envelope once by its Sas-Webhook-Id.
type webhookReceiver struct {
	secret string
	mu     sync.Mutex
	tries  map[string]int
	got    map[string]map[string]any // by delivery id
	bad    []string
	// lastBody and lastSig are the last delivery taken, as it came.
	lastBody, lastSig string
}

func (rv *webhookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("Sas-Webhook-Id")
	ts, v1, _ := strings.Cut(strings.TrimPrefix(r.Header.Get("Sas-Signature"), "t="), ",v1=")
	h := hmac.New(sha256.New, []byte(rv.secret))
	h.Write([]byte(ts + "." + string(body)))
	unix, err := strconv.ParseInt(ts, 10, 64)
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if err != nil || !hmac.Equal([]byte(v1), []byte(hex.EncodeToString(h.Sum(nil)))) || time.Since(time.Unix(unix, 0)).Abs() > 5*time.Minute {
		rv.bad = append(rv.bad, id)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	rv.tries[id]++
	if rv.tries[id] == 1 {
		http.Error(w, "not now", http.StatusInternalServerError)
		return
	}
	var env map[string]any
	if err := json.Unmarshal(body, &env); err != nil {
		rv.bad = append(rv.bad, id)
		return
	}
	rv.got[id] = env
	rv.lastBody, rv.lastSig = string(body), r.Header.Get("Sas-Signature")
}

// taken are the deliveries taken, by id, with how often each was tried.
func (rv *webhookReceiver) taken() (map[string]map[string]any, map[string]int) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	out, tries := map[string]map[string]any{}, map[string]int{}
	for k, v := range rv.got {
		out[k], tries[k] = v, rv.tries[k]
	}
	return out, tries
}

// TestOrdersEndsAreToldToSignedWebhooks: each order's end is posted to
// the webhooks its workflow names, signed with the secret in the
// supervisor's environment (the file names only the variable); a 500 is
// tried again and the delivery taken once; a redirect is never followed
// (its target hears nothing) and the delivery dies after its tries, is
// listed dead with why, and once the endpoint is mended a replay
// delivers it. The secret is never logged nor stored.
func TestOrdersEndsAreToldToSignedWebhooks(t *testing.T) {
	t.Parallel()
	const secret = "whsec-e2e-5b1c0e2f9a8d7c6b"
	rv := &webhookReceiver{secret: secret, tries: map[string]int{}, got: map[string]map[string]any{}}
	good := httptest.NewServer(rv)
	t.Cleanup(good.Close)
	var elsewhere atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(target.Close)
	var mended atomic.Bool
	moved := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mended.Load() {
			return // 200
		}
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(moved.Close)
	file := `
workflows:
  - name: hooked
    webhooks:
      - {url: "` + good.URL + `/sas", secret_env: SHOP_HOOK_SECRET}
      - {url: "` + moved.URL + `/old", secret_env: SHOP_HOOK_SECRET, events: [completed]}
    steps:
      - {action: charge, agent: pay}
`
	g := runFile(t, "hooked.yaml", file, pipelineOpts{schedulers: 1, agents: 1, supervisors: 1,
		supervisorEnv: []string{"SHOP_HOOK_SECRET=" + secret, "SAS_SUPERVISOR_WEBHOOK_POLL=100ms", "SAS_SUPERVISOR_WEBHOOK_BACKOFF=100ms",
			"SAS_SUPERVISOR_WEBHOOK_ATTEMPTS=2"}})
	ids := g.submit(t, "hooked", []string{`{}`, `{}`, `{}`})
	g.pipeline.waitTerminal(t, ids, time.Minute)

	testenv.Eventually(t, time.Minute, "each order's end taken by the good webhook", func() bool {
		got, _ := rv.taken()
		return len(got) == len(ids)
	})
	var orders []string
	got, tries := rv.taken()
	for id, env := range got {
		data, _ := env["data"].(map[string]any)
		if env["type"] != "order.completed" || data["status"] != "completed" || tries[id] != 2 {
			t.Fatalf("delivery %s: %v after %d tries", id, env, tries[id])
		}
		orders = append(orders, env["order_id"].(string))
	}
	slices.Sort(orders)
	want := slices.Clone(ids)
	slices.Sort(want)
	rv.mu.Lock()
	bad := slices.Clone(rv.bad)
	rv.mu.Unlock()
	if !slices.Equal(orders, want) || len(bad) != 0 {
		t.Fatalf("orders told %v, want %v; bad signatures %v", orders, want, bad)
	}
	testenv.Eventually(t, time.Minute, "the redirected deliveries to die", func() bool {
		return g.count(t, `SELECT count(*) FROM webhook_deliveries WHERE url LIKE $1 AND state = 'dead'`, moved.URL+"%") == len(ids)
	})
	if elsewhere.Load() != 0 {
		t.Fatalf("a redirect was followed %d times", elsewhere.Load())
	}
	out, errOut, code := sasctl(t, g.stack.env, "webhooks", "list", "--dead")
	if code != 0 || strings.Count(out, "redirect is not followed") != len(ids) {
		t.Fatalf("webhooks list --dead: exit %d\n%s%s", code, out, errOut)
	}
	mended.Store(true)
	var dead int64
	if err := g.pool.QueryRow(t.Context(), `SELECT min(id) FROM webhook_deliveries WHERE state = 'dead'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := sasctl(t, g.stack.env, "webhooks", "replay", strconv.FormatInt(dead, 10)); code != 0 {
		t.Fatalf("webhooks replay: exit %d\n%s%s", code, out, errOut)
	}
	testenv.Eventually(t, time.Minute, "the replayed delivery to be sent", func() bool {
		return g.count(t, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND state = 'sent'`, dead) == 1
	})
	// The check docs/YOUR-PROCESS.md shows, as written, takes a delivery
	// and refuses it changed.
	rv.mu.Lock()
	body, sig := rv.lastBody, rv.lastSig
	rv.mu.Unlock()
	check := docBlock(t, "python", "import hashlib, hmac, time") + `
import json, sys
h = {"Sas-Signature": sys.argv[1]}
print(verified(h, sys.argv[2].encode(), sys.argv[3]), verified(h, sys.argv[2].encode() + b" ", sys.argv[3]))
`
	if out, err := exec.CommandContext(t.Context(), "python3", "-c", check, sig, body, secret).CombinedOutput(); err != nil ||
		strings.TrimSpace(string(out)) != "True False" {
		t.Fatalf("the documented check: %v\n%s", err, out)
	}
	// The secret is nowhere but in the supervisor's environment.
	if n := g.count(t, `SELECT (SELECT count(*) FROM webhook_deliveries WHERE concat_ws(' ', url, body::text, last_error, secret_env) LIKE '%' || $1 || '%')
		+ (SELECT count(*) FROM workflow_versions WHERE definition::text LIKE '%' || $1 || '%')`, secret); n != 0 {
		t.Fatalf("the secret is stored in %d rows", n)
	}
	for _, p := range g.pipeline.supervisors {
		if b, err := os.ReadFile(p.log); err != nil || strings.Contains(string(b), secret) {
			t.Fatalf("the supervisor's log holds the secret (%v)", err)
		}
	}
}
