package agent

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/secrets"
	"sas/internal/tracing"
)

// TestRedirectIsAnAnswer: a service that answers with a redirect gets no
// second call anywhere: the step fails for good naming the status and the
// Location, and the other host (another port of the same machine, another
// origin) never sees the call or the endpoint's credentials. With
// redirects: same_origin, a 307 or 308 to the endpoint's own origin is
// followed with its headers; a 303 (which would turn the POST into a GET)
// and a redirect elsewhere still are answers.
func TestRedirectIsAnAnswer(t *testing.T) {
	t.Parallel()
	var strayed atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		strayed.Add(1)
		_, _ = w.Write([]byte(`{"from":"another host"}`))
	}))
	t.Cleanup(other.Close)
	const secret = "Bearer redirect-Secret-42"
	var selfURL string
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /v1/<status>-<where>[-<hops>]
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "-")
		if parts[0] == "final" {
			if r.Method != http.MethodPost || r.Header.Get("Authorization") != secret {
				http.Error(w, `{"error":"lost the method or the credentials"}`, http.StatusBadRequest)
				return
			}
			_, _ = w.Write([]byte(`{"followed":true}`))
			return
		}
		status, _ := strconv.Atoi(parts[0])
		to := other.URL + "/v1/x"
		switch {
		case parts[1] == "self" && len(parts) == 3:
			n, _ := strconv.Atoi(parts[2])
			to = selfURL + "/v1/" + parts[0] + "-self-" + strconv.Itoa(n+1)
		case parts[1] == "self":
			to = selfURL + "/v1/final"
		case parts[1] == "creds":
			to = "http://user:pass-Word@" + strings.TrimPrefix(other.URL, "http://") + "/x"
		}
		w.Header().Set("Location", to)
		w.WriteHeader(status)
	}))
	t.Cleanup(svc.Close)
	selfURL = svc.URL

	for _, c := range []struct {
		desc, redirects, action string
		ok                      bool
		reason                  []string // what a failure's reason must name
	}{
		{"307 to another host", "", "307-other", false, []string{"answered 307", other.URL + "/v1/x"}},
		{"308 to another host", "", "308-other", false, []string{"answered 308", other.URL}},
		{"301 to another host", "", "301-other", false, []string{"answered 301"}},
		{"302 to another host", "", "302-other", false, []string{"answered 302"}},
		{"303 to another host", "", "303-other", false, []string{"answered 303"}},
		{"307 to itself, not allowed", "", "307-self", false, []string{"answered 307", svc.URL + "/v1/final"}},
		{"a Location with a password", "", "307-creds", false, []string{"answered 307", "user:" + secrets.Mask}},
		{"same origin: 307 to itself", "same_origin", "307-self", true, nil},
		{"same origin: 308 to itself", "same_origin", "308-self", true, nil},
		{"same origin: 303 to itself", "same_origin", "303-self", false, []string{"answered 303"}},
		{"same origin: 307 to another port", "same_origin", "307-other", false, []string{"answered 307", other.URL}},
		{"same origin: endless", "same_origin", "307-self-0", false, []string{"answered 307"}},
	} {
		t.Run(c.desc, func(t *testing.T) {
			dir := t.TempDir()
			headers := filepath.Join(dir, "headers")
			if err := os.WriteFile(headers, []byte("Authorization: "+secret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, "endpoints.yaml")
			spec := fmt.Sprintf("endpoints:\n  svc: {url: %q, headers_file: %q}\n", svc.URL, headers)
			if c.redirects != "" {
				spec = fmt.Sprintf("endpoints:\n  svc: {url: %q, headers_file: %q, redirects: %q}\n", svc.URL, headers, c.redirects)
			}
			if err := os.WriteFile(file, []byte(spec), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := Config{Kinds: []string{"svc"}, EndpointsFile: file, CallTimeout: time.Second, RetryBase: time.Millisecond,
				RetryMax: 5 * time.Millisecond, BreakerFailures: 100, BreakerOpenFor: time.Millisecond, MaxResponseBytes: 1 << 14}
			eps, _, err := loadEndpoints(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cl := testCaller{caller: &caller{cfg: cfg, metrics: newMetrics(prometheus.NewRegistry()), now: time.Now, tr: tracing.Off()}, ep: eps["svc"]}
			res := cl.call(within(t, 5*time.Second), c.action, "k-"+c.action, body("3f0c1b8e-7d2a-4c55-9a61-0e6f2d9b4c11"))
			if c.ok {
				if res.outcome != callOK || string(res.result) != `{"followed":true}` {
					t.Fatalf("outcome %v %s (%s), want the followed answer", res.outcome, res.result, res.reason)
				}
				return
			}
			if res.outcome != callPermanent {
				t.Fatalf("outcome %v (%s %s), want a failure for good", res.outcome, res.result, res.reason)
			}
			for _, want := range c.reason {
				if !strings.Contains(res.reason, want) {
					t.Errorf("reason %q does not name %q", res.reason, want)
				}
			}
			if strings.Contains(res.reason, "pass-Word") {
				t.Errorf("reason %q shows the Location's password", res.reason)
			}
		})
	}
	if n := strayed.Load(); n != 0 {
		t.Fatalf("the other host was called %d times", n)
	}
}
