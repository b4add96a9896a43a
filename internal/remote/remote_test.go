package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/contract"
	"sas/internal/harness/testenv"
	"sas/internal/remote"
)

func setup(t *testing.T, faults remote.FaultConfig) (*remote.Service, *httptest.Server) {
	t.Helper()
	svc := remote.New(faults, 1, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return svc, srv
}

type reply struct {
	status     int
	body       string
	retryAfter string
}

func call(t *testing.T, ctx context.Context, srv *httptest.Server, action, key, orderID string) reply {
	t.Helper()
	body, _ := json.Marshal(contract.Request{OrderID: orderID, Step: 1, Payload: json.RawMessage(`{"amount":1}`)})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/"+action, bytes.NewReader(body))
	if key != "" {
		req.Header.Set(contract.HeaderIdempotencyKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b), resp.Header.Get("Retry-After")}
}

func entry(svc *remote.Service, key string) (remote.Entry, bool) {
	for _, e := range svc.Ledger() {
		if e.Key == key {
			return e, true
		}
	}
	return remote.Entry{}, false
}

func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	svc, srv := setup(t, nil)
	ctx := context.Background()
	first := call(t, ctx, srv, "charge_payment", "k1", "o1")
	again := call(t, ctx, srv, "charge_payment", "k1", "o1")
	if first.status != 200 || again.status != 200 || first.body != again.body {
		t.Fatalf("first %+v, replay %+v: want the same 200", first, again)
	}
	if e, _ := entry(svc, "k1"); e.Effects != 1 || e.Calls != 2 || e.OrderID != "o1" || e.Action != "charge_payment" {
		t.Fatalf("ledger %+v", e)
	}
	if r := call(t, ctx, srv, "charge_payment", "k1", "o2"); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused with another payload: %+v", r)
	}
	if r := call(t, ctx, srv, "reserve_inventory", "k1", "o1"); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused for another action: %+v", r)
	}
	if r := call(t, ctx, srv, "charge_payment", "", "o1"); r.status != http.StatusBadRequest {
		t.Fatalf("no key: %+v", r)
	}
	// Any action name is served: a new workflow needs no change here.
	if r := call(t, ctx, srv, "teleport", "k9", "o1"); r.status != http.StatusOK {
		t.Fatalf("new action: %+v", r)
	}
	if r := call(t, ctx, srv, "no%20spaces", "k10", "o1"); r.status != http.StatusBadRequest {
		t.Fatalf("action that is not a name: %+v", r)
	}
}

func TestKeyInFlightAnswers409(t *testing.T) {
	t.Parallel()
	svc, srv := setup(t, remote.FaultConfig{"*": {LatencyMinMS: 2000, LatencyMaxMS: 2000}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go call(t, ctx, srv, "reserve_inventory", "k", "o")
	testenv.Eventually(t, 5*time.Second, "the first call in flight", func() bool {
		e, ok := entry(svc, "k")
		return ok && e.Calls == 1
	})
	if r := call(t, context.Background(), srv, "reserve_inventory", "k", "o"); r.status != http.StatusConflict {
		t.Fatalf("second call while the first is in flight: %+v", r)
	}
	// The first caller gives up: nothing was done, and the key can be
	// used again.
	cancel()
	testenv.Eventually(t, 5*time.Second, "the abandoned call to leave the ledger entry free", func() bool {
		svc.SetFaults(nil)
		r := call(t, context.Background(), srv, "reserve_inventory", "k", "o")
		return r.status == 200
	})
	if e, _ := entry(svc, "k"); e.Effects != 1 {
		t.Fatalf("effects %d after an abandoned call and a retry, want 1", e.Effects)
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc        string
		faults      remote.Faults
		status      int
		effects     int
		inLedger    bool
		retryAfter  string
		thenReplays bool
	}{
		{desc: "5xx", faults: remote.Faults{ErrorRate: 1}, status: 503},
		{desc: "429", faults: remote.Faults{RateLimitRate: 1, RetryAfterS: 2}, status: 429, retryAfter: "2"},
		{desc: "hang", faults: remote.Faults{HangRate: 1, HangMS: 20}, status: 503, inLedger: true},
		{desc: "apply then fail", faults: remote.Faults{ApplyThenFailRate: 1}, status: 500, effects: 1, inLedger: true, thenReplays: true},
		{desc: "permanent for the order", faults: remote.Faults{FailOrders: []string{"o"}}, status: 400},
		{desc: "latency", faults: remote.Faults{LatencyMinMS: 10, LatencyMaxMS: 20}, status: 200, effects: 1, inLedger: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			svc, srv := setup(t, remote.FaultConfig{"create_shipment": tc.faults})
			r := call(t, context.Background(), srv, "create_shipment", "k", "o")
			if r.status != tc.status || r.retryAfter != tc.retryAfter {
				t.Fatalf("got %+v, want %d with Retry-After %q", r, tc.status, tc.retryAfter)
			}
			e, ok := entry(svc, "k")
			if ok != tc.inLedger || e.Effects != tc.effects {
				t.Fatalf("ledger %+v (present %v), want effects %d", e, ok, tc.effects)
			}
			// Other actions are not affected.
			if r := call(t, context.Background(), srv, "reserve_inventory", "k2", "o"); r.status != 200 {
				t.Fatalf("another action: %+v", r)
			}
			svc.SetFaults(nil)
			again := call(t, context.Background(), srv, "create_shipment", "k", "o")
			if again.status != 200 {
				t.Fatalf("retry without faults: %+v", again)
			}
			if e, _ := entry(svc, "k"); e.Effects != 1 {
				t.Fatalf("effects %d after the retry, want exactly 1", e.Effects)
			}
		})
	}
}

func TestAdminFaults(t *testing.T) {
	t.Parallel()
	_, srv := setup(t, nil)
	put := func(body string) int {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/admin/faults", bytes.NewBufferString(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, bad := range []string{`{"no pe":{}}`, `{"*":{"error_rate":2}}`, `not json`} {
		if code := put(bad); code != 400 {
			t.Errorf("PUT %s: %d, want 400", bad, code)
		}
	}
	if code := put(`{"charge_payment":{"error_rate":1}}`); code != 200 {
		t.Fatalf("valid PUT: %d", code)
	}
	if r := call(t, context.Background(), srv, "charge_payment", "k", "o"); r.status != 503 {
		t.Fatalf("after setting error_rate 1: %+v", r)
	}
	resp, err := http.Get(srv.URL + "/admin/faults")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cfg remote.FaultConfig
	if err := json.NewDecoder(resp.Body).Decode(&cfg); err != nil || cfg["charge_payment"].ErrorRate != 1 {
		t.Fatalf("GET /admin/faults: %+v %v", cfg, err)
	}
}

func undo(t *testing.T, srv *httptest.Server, action, key, undoes string) reply {
	t.Helper()
	body, _ := json.Marshal(contract.Request{OrderID: "o", Step: 4, Payload: json.RawMessage(`{}`), Undoes: undoes})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/"+action, bytes.NewReader(body))
	req.Header.Set(contract.HeaderIdempotencyKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: string(b)}
}

func TestUndo(t *testing.T) {
	t.Parallel()
	svc, srv := setup(t, nil)
	ctx := context.Background()

	// An applied action is undone once, however often the undo is sent.
	call(t, ctx, srv, "charge_payment", "charge", "o")
	for range 2 {
		if r := undo(t, srv, "refund_payment", "refund", "charge"); r.status != 200 || !strings.Contains(r.body, `"undone":true`) {
			t.Fatalf("undo of an applied action: %+v", r)
		}
	}
	if e, _ := entry(svc, "refund"); e.Effects != 1 || e.Undoes != "charge" {
		t.Fatalf("undo entry %+v", e)
	}

	// An action never applied: the undo does nothing, and the action can
	// no longer happen.
	if r := undo(t, srv, "cancel_shipment", "cancel", "ship"); r.status != 200 || !strings.Contains(r.body, `"undone":false`) {
		t.Fatalf("undo of an action never applied: %+v", r)
	}
	if e, _ := entry(svc, "cancel"); e.Effects != 0 {
		t.Fatalf("a no-op undo counted %d effects", e.Effects)
	}
	if r := call(t, ctx, srv, "create_shipment", "ship", "o"); r.status != http.StatusGone {
		t.Fatalf("action after its undo: %+v", r)
	}
	if e, _ := entry(svc, "ship"); e.Effects != 0 || !e.Voided {
		t.Fatalf("voided action entry %+v", e)
	}

	// What makes an undo is the key it names, not the action's name: a
	// call without one is an action of its own, whatever it is called.
	if r := undo(t, srv, "release_inventory", "release-as-action", ""); r.status != http.StatusOK {
		t.Fatalf("call without undoes: %+v", r)
	}
	if e, _ := entry(svc, "release-as-action"); e.Effects != 1 || e.Undoes != "" {
		t.Fatalf("call without undoes: %+v", e)
	}
}

func TestUndoWaitsForActionInFlight(t *testing.T) {
	t.Parallel()
	svc, srv := setup(t, remote.FaultConfig{"reserve_inventory": {LatencyMinMS: 300, LatencyMaxMS: 300}})
	done := make(chan reply, 1)
	go func() { done <- call(t, context.Background(), srv, "reserve_inventory", "reserve", "o") }()
	testenv.Eventually(t, 5*time.Second, "the action in flight", func() bool {
		_, ok := entry(svc, "reserve")
		return ok
	})
	if r := undo(t, srv, "release_inventory", "release", "reserve"); r.status != http.StatusConflict {
		t.Fatalf("undo while the action is in flight: %+v", r)
	}
	if r := <-done; r.status != 200 {
		t.Fatalf("action: %+v", r)
	}
	if r := undo(t, srv, "release_inventory", "release", "reserve"); r.status != 200 || !strings.Contains(r.body, `"undone":true`) {
		t.Fatalf("undo after the action: %+v", r)
	}
}
