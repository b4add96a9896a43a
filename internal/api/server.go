package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/archive"
	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/oidcauth"
	"sas/internal/partition"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

// prefix is the path every route of the API is under.
const prefix = "/api/v1"

type server struct {
	cfg       Config
	me        string
	store     *statestore.Store
	workflows *workflow.Registry
	tokens    *tokens
	idp       *oidcauth.Provider // nil: API tokens only
	// namespaces are the deployment's, read a few seconds at most
	// before; buckets the submit rates known to be spent.
	namespaces *intake.Namespaces
	buckets    rateBuckets
	// stores are the deployment's state stores (a partitioned one's, or
	// store alone), and parts what the API keeps for each, in the same
	// order. store is SAS_DATABASE_URL's, which keeps the deployment's
	// tokens and namespaces.
	stores  partition.Stores
	parts   []*part
	pub     *broker.Publisher
	topo    broker.Topology
	tr      *tracing.Tracing
	redact  *secrets.Redactor
	archive archive.Archive // nil: none
	logger  *slog.Logger
	metrics *metrics
}

type metrics struct {
	requests      *prometheus.CounterVec
	orders        *prometheus.CounterVec
	bulk          *prometheus.CounterVec
	quotaRefusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_api_requests_total",
			Help: "API requests by route and status code.",
		}, []string{"route", "code"}),
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_api_orders_total",
			Help: "Orders submitted through the API by namespace (only those sasctl namespaces add made) and outcome: inserted, duplicate, rejected.",
		}, []string{"namespace", "outcome"}),
		bulk: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_api_bulk_orders_total",
			Help: "Orders bulk jobs acted on, by action and outcome (done, failed).",
		}, []string{"action", "outcome"}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_api_quota_refusals_total",
			Help: "Submits a namespace's quota refused, by namespace (only those sasctl namespaces add made) and quota (in_flight, submit_rate, payload_bytes).",
		}, []string{"namespace", "quota"}),
	}
	for _, o := range []string{"inserted", "duplicate", "rejected"} {
		m.orders.WithLabelValues(statestore.DefaultNamespace, o)
	}
	for _, a := range statestore.BulkActions {
		for _, o := range []string{"done", "failed"} {
			m.bulk.WithLabelValues(a, o)
		}
	}
	reg.MustRegister(m.requests, m.orders, m.bulk, m.quotaRefusals)
	return m
}

// handler is a route's work, for a caller whose token was checked.
type handler func(w http.ResponseWriter, r *http.Request, c caller)

// route is one path: its handlers by method, and the roles each allows.
type route struct {
	path    string
	methods map[string]action
	// stepToken: a step's callback, whose step token is its credential
	// (an API token too when SAS_API_CALLBACKS_NEED_TOKEN is set).
	stepToken bool
	// signed: an inbound route's event, whose signature is its
	// credential (no API token; limited per client address)
	signed bool
	// order: the path's {id} is an order, which the caller must be able
	// to see (its namespace; a submitter's own) or it does not exist.
	order bool
	// everywhere: the route acts on the whole deployment (a workflow, an
	// agent kind, migrations), for a token of every namespace only.
	everywhere bool
}

type action struct {
	roles []string
	h     handler
}

func (s *server) routes() []route {
	all := []string{statestore.TokenSubmitter, statestore.TokenViewer, statestore.TokenOperator}
	readers := []string{statestore.TokenViewer, statestore.TokenOperator}
	ops := []string{statestore.TokenOperator}
	callers := []string{statestore.TokenSubmitter, statestore.TokenOperator}
	return []route{
		{path: "/orders", methods: map[string]action{
			http.MethodPost: {callers, s.submit},
			http.MethodGet:  {readers, s.list},
		}},
		{path: "/orders/{id}", methods: map[string]action{http.MethodGet: {all, s.get}}, order: true},
		{path: "/orders/{id}/await", methods: map[string]action{http.MethodGet: {all, s.await}}, order: true},
		{path: "/orders/{id}/events", methods: map[string]action{http.MethodGet: {all, s.events}}, order: true},
		{path: "/orders/{id}/signals/{name}", methods: map[string]action{http.MethodPost: {callers, s.signal}}, order: true},
		{path: "/orders/{id}/resubmit", methods: map[string]action{http.MethodPost: {ops, s.resubmit}}, order: true},
		{path: "/orders/{id}/cancel", methods: map[string]action{http.MethodPost: {ops, s.cancel}}, order: true},
		{path: "/orders/{id}/rerun", methods: map[string]action{http.MethodPost: {ops, s.rerun}}, order: true},
		{path: "/orders/{id}/pause", methods: map[string]action{http.MethodPost: {ops, s.pauseOrder(true)}}, order: true},
		{path: "/orders/{id}/resume", methods: map[string]action{http.MethodPost: {ops, s.pauseOrder(false)}}, order: true},
		{path: "/workflows/{id}/pause", methods: map[string]action{http.MethodPost: {ops, s.pauseWorkflow(true)}}, everywhere: true},
		{path: "/workflows/{id}/resume", methods: map[string]action{http.MethodPost: {ops, s.pauseWorkflow(false)}}, everywhere: true},
		{path: "/kinds/{id}/pause", methods: map[string]action{http.MethodPost: {ops, s.pauseKind(true)}}, everywhere: true},
		{path: "/kinds/{id}/resume", methods: map[string]action{http.MethodPost: {ops, s.pauseKind(false)}}, everywhere: true},
		{path: "/hooks/{id}/{name}", methods: map[string]action{http.MethodPost: {all, s.hook}}, signed: true},
		{path: "/migrations", methods: map[string]action{http.MethodPost: {ops, s.migrate}}, everywhere: true},
		{path: "/signals", methods: map[string]action{http.MethodPost: {callers, s.signalByKey}}},
		{path: "/pauses", methods: map[string]action{http.MethodGet: {readers, s.pauses}}},
		{path: "/orders/{id}/archived", methods: map[string]action{http.MethodGet: {readers, s.archived}}},
		{path: "/bulk", methods: map[string]action{http.MethodGet: {readers, s.bulkList}}},
		// POST /bulk/resubmit and /bulk/cancel make a job; GET /bulk/ID reads one.
		{path: "/bulk/{id}", methods: map[string]action{http.MethodGet: {readers, s.bulkGet}, http.MethodPost: {ops, s.bulkCreate}}},
		{path: "/bulk/{id}/orders", methods: map[string]action{http.MethodGet: {readers, s.bulkOrders}}},
		{path: "/bulk/{id}/stop", methods: map[string]action{http.MethodPost: {ops, s.bulkStop}}},
		{path: "/steps/complete", methods: map[string]action{http.MethodPost: {callers, s.stepCallback(messages.CallbackComplete)}}, stepToken: true},
		{path: "/steps/fail", methods: map[string]action{http.MethodPost: {callers, s.stepCallback(messages.CallbackFail)}}, stepToken: true},
		{path: "/steps/heartbeat", methods: map[string]action{http.MethodPost: {callers, s.stepCallback(messages.CallbackHeartbeat)}}, stepToken: true},
	}
}

// mux serves every route under prefix, each through the same checks:
// a panic is a 500 problem, never a dropped connection; an unknown path
// a 404 and another method a 405, as problems; then the token, its rate
// and its role.
func (s *server) mux() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(prefix+rt.path, s.serve(rt))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, http.StatusNotFound, probNotFound, fmt.Sprintf("no such path: the API is under %s (docs/api.openapi.yaml)", prefix))
	})
	return s.recoverer(mux)
}

func (s *server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.logger.Error("api: panic", "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				writeProblem(w, r, http.StatusInternalServerError, probInternal, "the request could not be handled; it is logged")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// statusRecorder keeps the status a handler answered with, for the
// request counter.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Flush lets Server-Sent Events through the recorder.
func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *server) serve(rt route) http.Handler {
	var allowed []string
	for m := range rt.methods {
		allowed = append(allowed, m)
	}
	sort.Strings(allowed)
	label := prefix + rt.path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		defer func() { s.metrics.requests.WithLabelValues(label, fmt.Sprint(rec.code)).Inc() }()
		if n := headerBytes(r.Header); n > maxHeaderBytes {
			writeProblem(rec, r, http.StatusRequestHeaderFieldsTooLarge, probTooLarge, fmt.Sprintf("the headers are %d bytes, at most %d", n, maxHeaderBytes))
			return
		}
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			writeProblem(rec, r, http.StatusBadRequest, probBadRequest, "the query string cannot be read: "+err.Error())
			return
		}
		a, ok := rt.methods[r.Method]
		if !ok {
			rec.Header().Set("Allow", strings.Join(allowed, ", "))
			writeProblem(rec, r, http.StatusMethodNotAllowed, probMethod, fmt.Sprintf("%s %s: use %s", r.Method, label, strings.Join(allowed, " or ")))
			return
		}
		if rt.signed || rt.stepToken && !s.cfg.CallbacksNeedAPIToken {
			if ok, wait := s.tokens.allow(clientLimit(r)); !ok {
				writeProblem(rec, r, http.StatusTooManyRequests, probRateLimited,
					fmt.Sprintf("more than %g requests a second came from %s (SAS_API_RATE)", s.cfg.Rate, clientHost(r)), retryAfter(wait))
				return
			}
			a.h(rec, r, caller{})
			return
		}
		presented, ok := bearer(r)
		if !ok {
			writeProblem(rec, r, http.StatusUnauthorized, probUnauthorized, "send an API token: Authorization: Bearer sas_... (sasctl api token create)")
			return
		}
		var tok statestore.APIToken
		var err error
		if s.idp != nil && oidcauth.LooksLikeJWT(presented) {
			var refused int
			if tok, refused, err = s.accessToken(r, presented); refused == http.StatusForbidden {
				writeProblem(rec, r, refused, probForbidden, "the access token is valid but grants no role: "+err.Error())
				return
			} else if refused != 0 {
				writeProblem(rec, r, refused, probUnauthorized, "the access token is not accepted: "+err.Error())
				return
			}
		} else {
			tok, err = s.tokens.check(r.Context(), presented)
		}
		if errors.Is(err, statestore.ErrBadToken) {
			writeProblem(rec, r, http.StatusUnauthorized, probUnauthorized, "the token is unknown, wrong or revoked")
			return
		}
		if err != nil {
			s.unavailable(rec, r, err)
			return
		}
		if ok, wait := s.tokens.allow(tok.ID); !ok {
			writeProblem(rec, r, http.StatusTooManyRequests, probRateLimited,
				fmt.Sprintf("token %s made more than %g requests a second (SAS_API_RATE)", tok.Name, s.cfg.Rate), retryAfter(wait))
			return
		}
		// A request that names a namespace acts in it alone.
		if ns := requestNamespace(r); ns != "" {
			if err := statestore.CheckNamespace(ns); err != nil {
				writeProblem(rec, r, http.StatusBadRequest, probBadRequest, "Sas-Namespace: "+err.Error(), withReason(messages.ReasonInvalidValue))
				return
			}
			if !tok.In(ns) {
				writeProblem(rec, r, http.StatusForbidden, probForbidden, fmt.Sprintf("token %s may not act in namespace %q", tok.Name, ns))
				return
			}
			tok.Namespaces = []string{ns}
		}
		c := caller{token: tok}
		if !c.may(a.roles...) {
			writeProblem(rec, r, http.StatusForbidden, probForbidden,
				fmt.Sprintf("token %s is a %s; %s %s needs a %s token", tok.Name, tok.Role, r.Method, label, strings.Join(a.roles, " or ")))
			return
		}
		if rt.everywhere {
			all, err := s.coversAll(r.Context(), c)
			if err != nil {
				s.unavailable(rec, r, err)
				return
			}
			if !all {
				writeProblem(rec, r, http.StatusForbidden, probForbidden,
					fmt.Sprintf("%s %s acts on the whole deployment: it needs a token of every namespace (sasctl api token create --namespace '*')", r.Method, label))
				return
			}
		}
		if rt.order && !s.reaches(rec, r, c) {
			return
		}
		a.h(rec, r, c)
	})
}

// maxHeaderBytes bounds a request's headers; the server reads up to 1
// MiB of them (http.Server.MaxHeaderBytes), so that more than this is
// still answered with a problem.
const maxHeaderBytes = 64 << 10

func headerBytes(h http.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// unavailable answers a failure of the store or the broker: 503, retry.
//
// A value the state store refused (statestore.ErrInvalidData: a rule of
// the store that an earlier check missed) is not the store being away:
// the same request can never succeed, so it is the sender's 422, in
// words that never quote the database.
func (s *server) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	if errors.Is(err, statestore.ErrInvalidData) {
		s.logger.Info("api: the state store refused a value", "path", r.URL.Path, "err", internalText(err))
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, err.Error(), withReason(messages.ReasonInvalidValue))
		return
	}
	s.logger.Warn("api: store or broker unavailable", "path", r.URL.Path, "err", err)
	writeProblem(w, r, http.StatusServiceUnavailable, probUnavailable, "the state store or the broker did not answer; try again", retryAfter(0))
}

// internalText is err's text with the database's own words, for a log.
func internalText(err error) string {
	var ide *statestore.InvalidDataError
	if errors.As(err, &ide) {
		return err.Error() + " [" + ide.Internal() + "]"
	}
	return err.Error()
}

// Endpoints lists every route the API serves as "METHOD /path" (paths
// relative to /api/v1, as docs/api.openapi.yaml writes them).
func Endpoints() []string {
	var out []string
	for _, rt := range (&server{}).routes() {
		for m := range rt.methods {
			out = append(out, m+" "+rt.path)
		}
	}
	sort.Strings(out)
	return out
}
