// Package remote is the demo remote service that agents call. It speaks
// the contract of package contract for any action name (POST /v1/{action}):
// a request naming the key it undoes is an undo, anything else an action.
// It keeps an idempotency-key ledger and injects faults set at start and
// changeable while it runs. Tests and fault runs read its ledger to check
// that every effect happened at most once.
package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/contract"
	"sas/internal/tracing"
)

// Actions returns the order workflow's actions and their undo actions,
// the demo's usual traffic (any other name is served as well).
func Actions() []string {
	return []string{
		"reserve_inventory", "release_inventory",
		"charge_payment", "refund_payment",
		"create_shipment", "cancel_shipment",
	}
}

// maxBody caps a request body.
const maxBody = 1 << 20

// Entry is the ledger's record of one idempotency key.
type Entry struct {
	Key     string `json:"key"`
	Action  string `json:"action"`
	OrderID string `json:"order_id"`
	Step    int    `json:"step"`
	Effects int    `json:"effects"` // times the effect was applied: 1, or it went wrong
	// Request is the body of the call that applied the effect, as sent
	// (payload, results, undone_result), for tests to read what a step
	// was given.
	Request json.RawMessage `json:"request,omitempty"`
	Calls   int             `json:"requests"` // requests that reached the ledger with this key
	Result  json.RawMessage `json:"result,omitempty"`
	At      time.Time       `json:"applied_at,omitzero"`
	// Undoes is, for an undo, the key of the action it undid (or found
	// nothing to undo for).
	Undoes string `json:"undoes,omitempty"`
	// Voided: an undo came before this action was applied; the action is
	// refused from then on (410), so it can never happen after its undo.
	Voided bool `json:"voided,omitempty"`

	// hash identifies the payload (with the action): a key reused with
	// another answers 422. The payload itself is not kept, so the ledger
	// stays small over long runs.
	hash     [sha256.Size]byte
	inFlight bool
	done     bool // answered for good: replays give Result
}

// Service is the remote service.
type Service struct {
	// KeepRequests keeps each entry's Request (set before serving).
	KeepRequests bool
	// Tracing records each call as a span of the caller's trace (New
	// sets it off; replace it before serving).
	Tracing *tracing.Tracing

	logger  *slog.Logger
	metrics *prometheus.CounterVec

	mu     sync.Mutex
	faults FaultConfig
	rng    *rand.Rand
	ledger map[string]*Entry
	// traffic is what each action saw (traffic.go).
	traffic map[string]*Traffic
}

// New returns a service with the given faults. seed 0 picks a random seed.
func New(faults FaultConfig, seed uint64, reg prometheus.Registerer, logger *slog.Logger) *Service {
	if seed == 0 {
		seed = rand.Uint64()
	}
	m := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sas_remote_requests_total",
		Help: "Requests to the demo remote service, by action and outcome.",
	}, []string{"action", "outcome"})
	reg.MustRegister(m)
	return &Service{
		logger: logger, metrics: m, faults: faults,
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		ledger:  map[string]*Entry{},
		traffic: map[string]*Traffic{},
		Tracing: tracing.Off(),
	}
}

// Handler serves the API: POST /v1/{action}, GET /ledger, GET and PUT
// /admin/faults, GET and DELETE /admin/traffic.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{action}", s.call)
	mux.HandleFunc("GET /ledger", s.getLedger)
	mux.HandleFunc("GET /admin/faults", s.getFaults)
	mux.HandleFunc("PUT /admin/faults", s.putFaults)
	mux.HandleFunc("GET /admin/traffic", s.getTraffic)
	mux.HandleFunc("DELETE /admin/traffic", s.deleteTraffic)
	return mux
}

// SetFaults replaces the fault configuration.
func (s *Service) SetFaults(cfg FaultConfig) {
	s.mu.Lock()
	s.faults = cfg
	s.mu.Unlock()
}

// Ledger returns a copy of every entry.
func (s *Service) Ledger() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.ledger))
	for _, e := range s.ledger {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.Key < b.Key {
			return -1
		}
		if a.Key > b.Key {
			return 1
		}
		return 0
	})
	return out
}

// roll draws the faults of one request.
type roll struct {
	latency, hang                      time.Duration
	hung, fail, limited, applyThenFail bool
	retryAfter                         int
}

func (s *Service) draw(action string) (Faults, roll) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults.For(action)
	var r roll
	if f.LatencyMaxMS > 0 {
		r.latency = time.Duration(f.LatencyMinMS+s.rng.IntN(f.LatencyMaxMS-f.LatencyMinMS+1)) * time.Millisecond
	}
	r.limited = s.rng.Float64() < f.RateLimitRate
	r.fail = s.rng.Float64() < f.ErrorRate
	r.hung = s.rng.Float64() < f.HangRate
	r.applyThenFail = s.rng.Float64() < f.ApplyThenFailRate
	r.hang = time.Duration(f.HangMS) * time.Millisecond
	if r.hang == 0 {
		r.hang = time.Minute
	}
	r.retryAfter = max(f.RetryAfterS, 1)
	return f, r
}

func (s *Service) call(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	outcome := "ok"
	tr := s.Tracing
	// The call is a span of the caller's trace when its headers carry one.
	_, span := tr.Start(tr.ExtractHTTP(r.Context(), r.Header), "POST /v1/"+action, trace.WithSpanKind(trace.SpanKindServer))
	defer func() {
		if tr.On() {
			span.SetAttributes(attribute.String("remote.outcome", outcome), attribute.String("remote.idempotency_key", r.Header.Get(contract.HeaderIdempotencyKey)))
		}
		span.End()
		s.metrics.WithLabelValues(action, outcome).Inc()
	}()
	if validAction(action) {
		defer s.enter(action)()
	}
	key := r.Header.Get(contract.HeaderIdempotencyKey)
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	var req contract.Request
	switch {
	case !validAction(action):
		err = fmt.Errorf("action %q is not a name (letters, digits, _ . -)", action)
	case key == "":
		err = errors.New("the Idempotency-Key header is required")
	case err != nil:
	case len(body) > maxBody:
		err = fmt.Errorf("body over %d bytes", maxBody)
	default:
		err = json.Unmarshal(body, &req)
		if err == nil && req.OrderID == "" {
			err = errors.New("order_id is required")
		}
	}
	if err != nil {
		outcome = "bad_request"
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if h := r.Header.Get(contract.HeaderCompleteBy); h != "" {
		// Work that could only end after the caller's deadline is refused:
		// its effect would come when nobody counts it.
		if by, err := contract.ParseCompleteBy(h); err == nil && !time.Now().Before(by) {
			outcome = "past_deadline"
			httpError(w, http.StatusRequestTimeout, "the deadline %s has passed", h)
			return
		}
	}

	faults, roll := s.draw(action)
	if slices.Contains(faults.FailOrders, req.OrderID) || slices.Contains(faults.FailKeys, key) || refuses(faults.RefuseIf, req.Payload) {
		outcome = "refused"
		httpError(w, http.StatusBadRequest, "%s refuses order %s", action, req.OrderID)
		return
	}
	if roll.limited {
		outcome = "rate_limited"
		w.Header().Set("Retry-After", strconv.Itoa(roll.retryAfter))
		httpError(w, http.StatusTooManyRequests, "slow down")
		return
	}
	if roll.fail {
		outcome = "error"
		httpError(w, http.StatusServiceUnavailable, "injected failure")
		return
	}

	hash := sha256.Sum256(append([]byte(action+"\x00"), body...))
	e, status := s.begin(key, action, hash, req, body)
	switch status {
	case http.StatusConflict:
		outcome = "in_flight"
		httpError(w, status, "a request with this key is in progress")
		return
	case http.StatusUnprocessableEntity:
		outcome = "key_reused"
		httpError(w, status, "this key was used with another payload")
		return
	case http.StatusOK:
		outcome = "replayed"
		writeJSON(w, http.StatusOK, e.Result)
		return
	case http.StatusGone:
		outcome = "voided"
		httpError(w, status, "this key was voided by its undo: the action must not happen")
		return
	}

	// The work itself takes time; a caller that gives up meanwhile leaves
	// nothing done.
	wait := roll.latency
	if roll.hung {
		wait = roll.hang
	}
	if !sleep(r.Context(), wait) || roll.hung {
		s.abandon(key)
		outcome = "hung"
		httpError(w, http.StatusServiceUnavailable, "gave up")
		return
	}
	result, status := s.apply(key, action, req.Undoes)
	if status == http.StatusConflict {
		outcome = "undo_waits"
		httpError(w, status, "the action to undo is in progress")
		return
	}
	if roll.applyThenFail {
		outcome = "apply_then_fail"
		httpError(w, http.StatusInternalServerError, "injected failure after the effect")
		return
	}
	writeJSON(w, http.StatusOK, result)
}

// begin looks the key up. A new key is recorded as in flight and gets 0; a
// known one gets the status to answer: 409 in flight, 422 other payload,
// 200 done (replay e.Result).
func (s *Service) begin(key, action string, hash [sha256.Size]byte, req contract.Request, body []byte) (Entry, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.ledger[key]
	if !ok {
		s.ledger[key] = &Entry{Key: key, Action: action, OrderID: req.OrderID, Step: req.Step, Calls: 1,
			hash: hash, inFlight: true}
		if s.KeepRequests {
			s.ledger[key].Request = body
		}
		return Entry{}, 0
	}
	e.Calls++
	switch {
	case e.Voided:
		return *e, http.StatusGone
	case e.hash != hash:
		return *e, http.StatusUnprocessableEntity
	case e.inFlight:
		return *e, http.StatusConflict
	case !e.done:
		// Abandoned before: this request does the work.
		e.inFlight = true
		return Entry{}, 0
	}
	return *e, http.StatusOK
}

func (s *Service) abandon(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.ledger[key]; ok {
		e.inFlight = false
	}
}

// apply does the work of key. An undo undoes the action whose key it names
// if that was applied; if that action is in progress it answers 409 and
// the caller retries; if it never happened, the undo does nothing and
// voids the action's key, so that the action can never come after its
// undo.
func (s *Service) apply(key, action, undoKey string) (json.RawMessage, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.ledger[key]
	e.inFlight = false
	result := map[string]any{"action": e.Action}
	if undoKey != "" {
		e.Undoes = undoKey
		original, ok := s.ledger[undoKey]
		switch {
		case ok && original.inFlight:
			return nil, http.StatusConflict
		case ok && original.Effects > 0:
			e.Effects++
			result["undone"] = true
		default:
			if !ok {
				original = &Entry{Key: undoKey, OrderID: e.OrderID}
				s.ledger[undoKey] = original
			}
			original.Voided = true
			result["undone"] = false
			result["note"] = "nothing to undo"
		}
	} else {
		e.Effects++
	}
	e.done = true
	e.At = time.Now().UTC()
	sum := sha256.Sum256([]byte(key))
	result["confirmation"] = e.Action + "-" + hex.EncodeToString(sum[:6])
	e.Result, _ = json.Marshal(result)
	return e.Result, http.StatusOK
}

func (s *Service) getLedger(w http.ResponseWriter, r *http.Request) {
	writeJSONValue(w, s.Ledger())
}

func (s *Service) getFaults(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	cfg := s.faults
	s.mu.Unlock()
	writeJSONValue(w, cfg)
}

func (s *Service) putFaults(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	cfg, err := ParseFaultConfig(raw)
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	s.SetFaults(cfg)
	s.logger.Info("fault configuration changed", "faults", string(raw))
	writeJSONValue(w, cfg)
}

func validAction(a string) bool {
	if a == "" || len(a) > 100 {
		return false
	}
	for _, c := range a {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func httpError(w http.ResponseWriter, status int, format string, args ...any) {
	body, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(format, args...)})
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeJSONValue(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		httpError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// refuses reports whether payload has field set to true.
func refuses(field string, payload json.RawMessage) bool {
	if field == "" {
		return false
	}
	var p map[string]json.RawMessage
	return json.Unmarshal(payload, &p) == nil && string(p[field]) == "true"
}
