package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/batch"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/statestore"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

const apiFile = `
workflows:
  - name: shop
    payload_schema: {type: object, required: [customer]}
    steps:
      - {action: pay, agent: payments}
`

// newTestServer is the API's server over fakes: tokens from st, inserts
// answered by insertErr (nil: inserted), the workflows of apiFile.
func newTestServer(t *testing.T, st *fakeTokenStore, insertErr error) (*server, *[]statestore.NewOrder) {
	t.Helper()
	reg, err := workflow.Parse("api_test.yaml", []byte(apiFile))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var written []statestore.NewOrder
	inserts := batch.New(8, time.Millisecond, func(_ context.Context, orders []statestore.NewOrder) ([]statestore.InsertOutcome, []error) {
		mu.Lock()
		defer mu.Unlock()
		outs, errs := make([]statestore.InsertOutcome, len(orders)), make([]error, len(orders))
		for i, o := range orders {
			written = append(written, o)
			outs[i], errs[i] = statestore.Inserted, insertErr
		}
		return outs, errs
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		inserts.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	s := &server{cfg: Config{Rate: 1000, Burst: 1000}, me: "api:test", workflows: reg, tokens: newTokens(st, time.Minute, 1000, 1000),
		stores: partition.One(nil), parts: []*part{{inserts: inserts}}, tr: tracing.Off(), logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
	return s, &written
}

// TestEveryRouteChecksItsCallerFirst: every request passes the same
// checks before its route's work, each refused as a problem document: an
// unknown path (404), a method the path does not take (405, with Allow),
// headers past their bound (431), a query that cannot be read (400), no
// token or a wrong one (401), a role the route does not allow (403), a
// token past its rate (429, Retry-After).
func TestEveryRouteChecksItsCallerFirst(t *testing.T) {
	t.Parallel()
	st := &fakeTokenStore{known: map[string]statestore.APIToken{
		"viewer":  {ID: 8, Name: "dash", Role: statestore.TokenViewer, Namespaces: []string{statestore.AllNamespaces}},
		"limited": {ID: 9, Name: "busy", Role: statestore.TokenSubmitter, Namespaces: []string{statestore.AllNamespaces}},
	}}
	s, written := newTestServer(t, st, nil)
	h := s.mux()
	do := func(method, path, token string, hdr map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(`{}`))
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct {
		name, method, path, token string
		hdr                       map[string]string
		status                    int
		kind                      string
	}{
		{"an unknown path", http.MethodGet, "/nope", "good", nil, http.StatusNotFound, probNotFound},
		{"another method", http.MethodDelete, prefix + "/orders", "good", nil, http.StatusMethodNotAllowed, probMethod},
		{"huge headers", http.MethodGet, prefix + "/orders", "good", map[string]string{"X-Big": strings.Repeat("x", maxHeaderBytes)},
			http.StatusRequestHeaderFieldsTooLarge, probTooLarge},
		{"an unreadable query", http.MethodGet, prefix + "/orders?a=%zz", "good", nil, http.StatusBadRequest, probBadRequest},
		{"no token", http.MethodGet, prefix + "/orders", "", nil, http.StatusUnauthorized, probUnauthorized},
		{"a wrong token", http.MethodGet, prefix + "/orders", "sas_wrong", nil, http.StatusUnauthorized, probUnauthorized},
		{"a viewer submitting", http.MethodPost, prefix + "/orders", "viewer", nil, http.StatusForbidden, probForbidden},
		{"a viewer cancelling", http.MethodPost, prefix + "/orders/" + messages.NewID() + "/cancel", "viewer", nil, http.StatusForbidden, probForbidden},
	} {
		w := do(tc.method, tc.path, tc.token, tc.hdr)
		var p problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != tc.status || p.Type != problemTypePrefix+tc.kind ||
			w.Header().Get("Content-Type") != problemContentType {
			t.Fatalf("%s: %d %s", tc.name, w.Code, w.Body)
		}
		if tc.status == http.StatusMethodNotAllowed && w.Header().Get("Allow") != "GET, POST" {
			t.Fatalf("%s: Allow %q", tc.name, w.Header().Get("Allow"))
		}
	}
	// A token's allowance is made at its first request: "limited" gets
	// one request and no more for a long while.
	s.tokens.mu.Lock()
	s.tokens.rate, s.tokens.burst = 0.001, 1
	s.tokens.mu.Unlock()
	body := `{"schema_version":2,"order_id":"` + messages.NewID() + `","workflow":"shop","payload":{"customer":"c"}}`
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, prefix+"/orders", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer limited")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := send(); w.Code != http.StatusAccepted {
		t.Fatalf("the first request of a token: %d %s", w.Code, w.Body)
	}
	if w := send(); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("past its rate: %d %v", w.Code, w.Header())
	}
	if len(*written) != 1 {
		t.Fatalf("%d orders written, want the one let through", len(*written))
	}
}

// TestSubmitAnswersAsTheSubmitQueueRefuses: POST /orders writes a valid
// order (202, Location) by the caller's name; a body that is no submit
// is a 400 naming the rule, an order its workflow refuses a 422 with the
// submit queue's reason, one the store finds a conflict a 409, one it
// finds invalid a 422; nothing refused is written.
func TestSubmitAnswersAsTheSubmitQueueRefuses(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	valid := `{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{"customer":"c"}}`
	for _, tc := range []struct {
		name      string
		body      string
		insertErr error
		status    int
		reason    string
		written   int
	}{
		{"written", valid, nil, http.StatusAccepted, "", 1},
		{"no submit", `{"schema_version":2,"order_id":"` + id + `","workflow":7,"payload":{}}`, nil, http.StatusBadRequest, messages.ReasonInvalidValue, 0},
		{"not JSON", `{"schema_version":`, nil, http.StatusBadRequest, "", 0},
		{"refused by its workflow", `{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{}}`, nil,
			http.StatusUnprocessableEntity, messages.ReasonInvalidPayload, 0},
		{"no such workflow", `{"schema_version":2,"order_id":"` + id + `","workflow":"nope","payload":{}}`, nil,
			http.StatusUnprocessableEntity, "unknown_workflow", 0},
		{"a conflict", valid, statestore.ErrConflict, http.StatusConflict, "conflict", 1},
		{"invalid data", valid, statestore.ErrInvalidData, http.StatusUnprocessableEntity, messages.ReasonInvalidValue, 1},
		{"the store away", valid, errors.New("connection refused"), http.StatusServiceUnavailable, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, written := newTestServer(t, &fakeTokenStore{}, tc.insertErr)
			r := httptest.NewRequest(http.MethodPost, prefix+"/orders", strings.NewReader(tc.body))
			r.Header.Set("Authorization", "Bearer good")
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			s.mux().ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.status)
			}
			if tc.status == http.StatusAccepted {
				if w.Header().Get("Location") != prefix+"/orders/"+id || (*written)[0].Actor != "api:ci" {
					t.Fatalf("Location %q, written %+v", w.Header().Get("Location"), *written)
				}
			} else {
				var p problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Detail == "" || tc.reason != "" && p.Reason != tc.reason ||
					strings.Contains(p.Detail, "SQLSTATE") {
					t.Fatalf("problem %s", w.Body)
				}
			}
			if len(*written) != tc.written {
				t.Fatalf("%d written, want %d", len(*written), tc.written)
			}
		})
	}
}

// TestStepsNowSayWhereRunningStepsAre: a follower of steps first hears
// of each step running or waiting when it came (a wait begun before it
// followed included), and of no step that has not begun or has ended.
func TestStepsNowSayWhereRunningStepsAre(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	d := statestore.OrderDetail{Order: statestore.Order{OrderID: id}, Steps: []statestore.Step{
		{Step: 1, Name: "score", Kind: statestore.KindAction, ProcessState: statestore.StepProcessed, Attempt: 1},
		{Step: 2, Name: "approval", ID: "approved", Kind: statestore.KindAction, ProcessState: statestore.StepAwaiting, Wait: "approved"},
		{Step: 3, Name: "charge", Kind: statestore.KindAction, ProcessState: statestore.StepProcessing, Attempt: 2},
		{Step: 4, Name: "ship", Kind: statestore.KindAction, ProcessState: statestore.StepWaiting},
	}}
	for i := range d.Steps {
		d.Steps[i].UpdatedAt = time.Now()
	}
	got := stepsNow(d)
	if len(got) != 2 || got[0].Name != "approved" || got[0].Event != messages.StepAwaiting || got[0].Wait != "approved" ||
		got[1].Name != "charge" || got[1].Event != messages.StepClaimed || got[1].Attempt != 2 {
		t.Fatalf("steps now: %+v", got)
	}
	for _, ev := range got {
		if err := ev.Validate(); err != nil {
			t.Fatalf("%+v: %v", ev, err)
		}
	}
}
