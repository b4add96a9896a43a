package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/contract"
	"sas/internal/harness/testenv"
	"sas/internal/remote"
	"sas/internal/tracing"
)

// testCaller calls one endpoint, as the agent calls a kind's.
type testCaller struct {
	*caller
	ep *endpoint
	// throttled hears of the 429s with a Retry-After, as the agent does.
	throttled func(time.Duration)
}

func (c testCaller) call(ctx context.Context, action, key string, body []byte) callResult {
	completeBy, ok := ctx.Deadline()
	if !ok {
		completeBy = time.Now().Add(time.Hour)
	}
	return c.caller.call(ctx, c.ep, call{action: action, key: key, attempt: 1, completeBy: completeBy, body: body, throttled: c.throttled})
}

func newCaller(t testing.TB, faults remote.FaultConfig) (testCaller, *remote.Service, *metrics) {
	t.Helper()
	svc := remote.New(faults, 7, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	m := newMetrics(prometheus.NewRegistry())
	cfg := Config{CallTimeout: time.Second, RetryBase: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		BreakerFailures: 3, BreakerOpenFor: 100 * time.Millisecond, MaxResponseBytes: 1 << 20}
	ep := &endpoint{kind: "test", base: srv.URL, client: srv.Client(), timeout: cfg.CallTimeout, headers: http.Header{}}
	return testCaller{caller: &caller{cfg: cfg, metrics: m, now: time.Now, tr: tracing.Off()}, ep: ep}, svc, m
}

func body(orderID string) []byte {
	b, _ := json.Marshal(contract.Request{OrderID: orderID, Step: 1, Action: "a", Payload: json.RawMessage(`{}`)})
	return b
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestCallRetriesTransientFaults(t *testing.T) {
	t.Parallel()
	c, svc, m := newCaller(t, remote.FaultConfig{"*": {ErrorRate: 0.5, ApplyThenFailRate: 0.3}})
	for i := range 40 {
		key := fmt.Sprint("k", i)
		res := c.call(within(t, 10*time.Second), "charge_payment", key, body(key))
		if res.outcome != callOK {
			t.Fatalf("call %d: %+v", i, res)
		}
	}
	for _, e := range svc.Ledger() {
		if e.Effects != 1 {
			t.Fatalf("key %s applied %d times", e.Key, e.Effects)
		}
	}
	if got := testutil.ToFloat64(m.retries.WithLabelValues("charge_payment", "5xx")); got == 0 {
		t.Fatal("no retries counted for 5xx")
	}
}

func TestCallHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	c, svc, m := newCaller(t, remote.FaultConfig{"*": {RateLimitRate: 1, RetryAfterS: 1}})
	heard := make(chan time.Duration, 100)
	c.throttled = func(d time.Duration) { heard <- d }
	ctx := within(t, 10*time.Second)
	done := make(chan callResult, 1)
	start := time.Now()
	go func() { done <- c.call(ctx, "create_shipment", "k", body("o")) }()
	// Lift the limit once the first 429 has been answered.
	testenv.Eventually(t, 5*time.Second, "a 429 answered", func() bool {
		return testutil.ToFloat64(m.retries.WithLabelValues("create_shipment", "429")) > 0
	})
	svc.SetFaults(nil)
	res := <-done
	if res.outcome != callOK {
		t.Fatalf("%+v", res)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("retried after %v, before the 1s Retry-After", took)
	}
	// The agent heard of the 429 and its Retry-After (and tells the
	// schedulers, which lower the kind's rate).
	if len(heard) == 0 || <-heard != time.Second {
		t.Fatal("the 429's Retry-After was not passed on")
	}
}

func TestCallPermanentFault(t *testing.T) {
	t.Parallel()
	c, _, m := newCaller(t, remote.FaultConfig{"charge_payment": {FailOrders: []string{"o"}}})
	res := c.call(within(t, 10*time.Second), "charge_payment", "k", body("o"))
	if res.outcome != callPermanent || res.reason != "charge_payment answered 400: charge_payment refuses order o" {
		t.Fatalf("%+v", res)
	}
	if got := testutil.ToFloat64(m.calls.WithLabelValues("charge_payment", "permanent")); got != 1 {
		t.Fatalf("%v permanent calls counted, want exactly one (no retry)", got)
	}
}

func TestCallGivesUpAtDeadline(t *testing.T) {
	t.Parallel()
	c, svc, m := newCaller(t, remote.FaultConfig{"*": {ErrorRate: 1}})
	start := time.Now()
	res := c.call(within(t, 300*time.Millisecond), "reserve_inventory", "k", body("o"))
	if res.outcome != callAbandoned {
		t.Fatalf("%+v", res)
	}
	if took := time.Since(start); took > 400*time.Millisecond {
		t.Fatalf("gave up after %v, past the 300ms deadline", took)
	}
	if len(svc.Ledger()) != 0 || testutil.ToFloat64(m.abandoned.WithLabelValues("deadline")) != 1 {
		t.Fatal("an abandoned call left an effect or was not counted")
	}
	// A hang is cut by the deadline too.
	svc.SetFaults(remote.FaultConfig{"*": {HangRate: 1}})
	start = time.Now()
	if res := c.call(within(t, 300*time.Millisecond), "reserve_inventory", "k2", body("o")); res.outcome != callAbandoned {
		t.Fatalf("hang: %+v", res)
	}
	if took := time.Since(start); took > 400*time.Millisecond {
		t.Fatalf("a hanging remote held the call for %v", took)
	}
}

func TestCircuitOpensAndCloses(t *testing.T) {
	t.Parallel()
	c, svc, m := newCaller(t, remote.FaultConfig{"*": {ErrorRate: 1}})
	c.call(within(t, 200*time.Millisecond), "charge_payment", "k", body("o"))
	if state := testutil.ToFloat64(m.circuit.WithLabelValues("charge_payment")); state != circuitOpen && state != circuitHalfOpen {
		t.Fatalf("circuit state %v after repeated 503s, want open", state)
	}
	if testutil.ToFloat64(m.retries.WithLabelValues("charge_payment", "circuit_open")) == 0 {
		t.Fatal("no call was refused by the open circuit")
	}
	svc.SetFaults(nil)
	if res := c.call(within(t, 5*time.Second), "charge_payment", "k", body("o")); res.outcome != callOK {
		t.Fatalf("after the remote recovered: %+v", res)
	}
	if state := testutil.ToFloat64(m.circuit.WithLabelValues("charge_payment")); state != circuitClosed {
		t.Fatalf("circuit state %v after a good probe, want closed", state)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		h    string
		want time.Duration
	}{
		{"", 0}, {"3", 3 * time.Second}, {"-1", 0}, {"soon", 0}, {" 7 ", 7 * time.Second},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second},
		{now.Add(-5 * time.Second).Format(http.TimeFormat), 0},
		// Typed and bounded before they act: decades, numbers past any
		// clock, dates far away, fractions and junk.
		{"3600", time.Hour}, {"3601", contract.MaxRetryAfter}, {"946080000", contract.MaxRetryAfter},
		{"99999999999999999999999", contract.MaxRetryAfter}, {"-99999999999999999999999", 0},
		{now.AddDate(30, 0, 0).Format(http.TimeFormat), contract.MaxRetryAfter},
		{"1.5", 0}, {"1e9", 0}, {"0x10", 0}, {"5\x00", 0}, {strings.Repeat("9", 100), 0},
	} {
		if got := contract.RetryAfter(tc.h, now); got != tc.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tc.h, got, tc.want)
		}
	}
	if got := contract.Heartbeat("946080000", now); got != contract.MaxHeartbeat {
		t.Errorf("a heartbeat of 30 years: %v, want %v", got, contract.MaxHeartbeat)
	}
	if got := contract.Heartbeat("86400", now); got != 24*time.Hour {
		t.Errorf("a heartbeat of a day: %v", got)
	}
}

func TestCallCapsResponseSize(t *testing.T) {
	t.Parallel()
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"x":"` + strings.Repeat("a", 2000) + `"}`))
	}))
	t.Cleanup(big.Close)
	c, _, _ := newCaller(t, nil)
	c.ep.base = big.URL
	c.cfg.MaxResponseBytes = 1000
	res := c.call(within(t, 5*time.Second), "charge_payment", "k", body("o"))
	if res.outcome != callPermanent || !strings.Contains(res.reason, "more than 1000 bytes") {
		t.Fatalf("%+v", res)
	}
}

// TestCallKeepsTheServicesLastAnswer: a call that ends without a result
// carries the last answer the service gave, so an operator can tell a
// service that is down (503 with its own words), refusing (4xx), slow
// (no answer in time) or gone (no connection).
func TestCallKeepsTheServicesLastAnswer(t *testing.T) {
	t.Parallel()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"mail relay down"}`))
	}))
	t.Cleanup(down.Close)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"error":"no such plan"}`))
	}))
	t.Cleanup(refusing.Close)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read first: the server notices a caller hanging up only then.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(slow.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL
	gone.Close()

	c, _, _ := newCaller(t, remote.FaultConfig{})
	// Only the slow service's calls time out: the others have time to
	// answer however loaded the machine is.
	for _, tc := range []struct {
		desc, url       string
		timeout, budget time.Duration
		outcome         callOutcome
		want            string
	}{
		{"down", down.URL, 5 * time.Second, 1500 * time.Millisecond, callAbandoned, `503 Service Unavailable: {"error":"mail relay down"}`},
		{"refusing", refusing.URL, 5 * time.Second, 5 * time.Second, callPermanent, `422 Unprocessable Entity: {"error":"no such plan"}`},
		{"slow", slow.URL, 100 * time.Millisecond, 600 * time.Millisecond, callAbandoned, "no answer in time (the call's timeout is 100ms)"},
		{"gone", goneURL, 5 * time.Second, 600 * time.Millisecond, callAbandoned, "no answer: "},
	} {
		ep := &endpoint{kind: "k", base: tc.url, client: &http.Client{}, timeout: tc.timeout, headers: http.Header{}}
		res := testCaller{caller: c.caller, ep: ep}.call(within(t, tc.budget), "act_"+tc.desc, "k-"+tc.desc, body("o"))
		if res.outcome != tc.outcome || !strings.Contains(res.lastAnswer, tc.want) {
			t.Errorf("%s: outcome %v, last answer %q; want %v with %q", tc.desc, res.outcome, res.lastAnswer, tc.outcome, tc.want)
		}
	}
}

// TestAcceptedCallWaitsForTheCallback: a 202 ends the call at once,
// without a retry, as accepted: its Sas-Heartbeat is the hold asked
// for, the answer is kept, and the step's token went with the call (and
// is kept out of what the service echoed).
func TestAcceptedCallWaitsForTheCallback(t *testing.T) {
	t.Parallel()
	var calls int
	var gotToken string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		gotToken = r.Header.Get(contract.HeaderStepToken)
		w.Header().Set(contract.HeaderHeartbeat, "90")
		w.WriteHeader(http.StatusAccepted)
		_, _ = fmt.Fprintf(w, `{"job":"j-1","token":%q}`, gotToken)
	}))
	t.Cleanup(srv.Close)
	c, _, m := newCaller(t, remote.FaultConfig{})
	ep := &endpoint{kind: "k", base: srv.URL, client: srv.Client(), timeout: time.Second, headers: http.Header{}}
	const token = "st1.o.1.1.mac"
	var res callResult
	// More in a row than the circuit breaker's failures: an accepted call
	// is a service that works, not one that fails.
	for i := range c.cfg.BreakerFailures + 2 {
		res = c.caller.call(within(t, 5*time.Second), ep, call{action: "slow", key: fmt.Sprint("k-", i), attempt: 1,
			completeBy: time.Now().Add(5 * time.Second), body: body("o"), token: token})
		res = hideToken(res, token)
		if res.outcome != callAccepted || calls != i+1 || gotToken != token {
			t.Fatalf("call %d: outcome %v after %d calls, token sent %q", i, res.outcome, calls, gotToken)
		}
	}
	if res.hold != 90*time.Second || !strings.HasPrefix(res.lastAnswer, "202 Accepted: ") || strings.Contains(res.lastAnswer, token) {
		t.Fatalf("hold %v, answer %q", res.hold, res.lastAnswer)
	}
	if got := testutil.ToFloat64(m.calls.WithLabelValues("slow", "accepted")); got != float64(c.cfg.BreakerFailures+2) {
		t.Fatalf("%v accepted calls counted", got)
	}
	if got := testutil.ToFloat64(m.retries.WithLabelValues("slow", "circuit_open")); got != 0 {
		t.Fatalf("accepted calls opened the circuit breaker (%v calls held back)", got)
	}
}
