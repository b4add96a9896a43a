package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/oidcauth"
	"sas/internal/partition"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pageSize is how many orders a page of the orders list shows.
const pageSize = 50

type server struct {
	cfg   Config
	store *statestore.Store
	// stores are the deployment's state stores: a partitioned one's
	// (SAS_PARTITIONS_FILE), or store alone. An order's pages and
	// actions go to its own; the orders list merges every one's.
	stores    partition.Stores
	users     *directory
	sessions  *sessions
	limiter   *limiter
	origins   origins
	logins    *prometheus.CounterVec
	logger    *slog.Logger
	pages     map[string]*template.Template
	static    http.Handler
	workflows *workflow.Registry
	now       func() time.Time
	// idp is the identity provider people sign in with (nil: none).
	idp       *oidcauth.Provider
	pending   *pendingSSO
	ssoLogins *prometheus.CounterVec
	// known are the deployment's namespaces, read a few seconds at most
	// before.
	known *intake.Namespaces

	mu      sync.Mutex
	conn    *broker.Conn
	pub     *broker.Publisher
	inspect *broker.QueueInspector
}

func newServer(cfg Config, store *statestore.Store, users *directory, reg prometheus.Registerer, logger *slog.Logger) (*server, error) {
	wfs, err := cfg.Workflows()
	if err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	origins, err := parseOrigins(cfg.PublicURL)
	if err != nil {
		return nil, err
	}
	logins := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sas_console_logins_total",
		Help: "Console logins by result: ok, wrong (name or password), refused (too many failures), busy (no slot to check the password).",
	}, []string{"result"})
	for _, r := range []string{"ok", "wrong", "refused", "busy"} {
		logins.WithLabelValues(r)
	}
	ssoLogins := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sas_console_sso_total",
		Help: "Console sign-ins at the identity provider by result: ok, refused (state, code or token not accepted), refreshed (a session renewed), ended (the provider did not renew a session).",
	}, []string{"result"})
	for _, r := range []string{"ok", "refused", "refreshed", "ended"} {
		ssoLogins.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{logins, ssoLogins} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	var idp *oidcauth.Provider
	if cfg.OIDC.On() {
		if idp, err = oidcauth.NewProvider(cfg.OIDC, nil, Viewer, Operator); err != nil {
			return nil, err
		}
	}
	return &server{
		cfg: cfg, store: store, stores: partition.One(store), users: users, logger: logger, pages: pages, workflows: wfs, now: time.Now, origins: origins, logins: logins,
		sessions: newSessions(cfg.SessionTTL), idp: idp, known: intake.NewNamespaces(store.Namespaces), pending: &pendingSSO{m: map[string]pendingSignIn{}}, ssoLogins: ssoLogins,
		limiter: newLimiter(cfg.LoginAttempts, cfg.LoginWindow),
		static:  http.StripPrefix("/static/", http.FileServerFS(sub)),
	}, nil
}

// prefixOf is the queue prefix of the partition holding order id (the
// console's own, unpartitioned).
func (s *server) prefixOf(ctx context.Context, id string) string {
	if s.stores.Layout == nil {
		return s.cfg.QueuePrefix
	}
	return s.stores.Layout.Partitions[s.stores.Index(ctx, id)].QueuePrefix
}

func (s *server) setBroker(conn *broker.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.pub, s.inspect = conn, broker.NewPublisher(conn, broker.NewMetrics(nil)), broker.NewQueueInspector(conn)
}

func (s *server) broker() (*broker.Conn, *broker.Publisher, *broker.QueueInspector) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn, s.pub, s.inspect
}

func (s *server) closeBroker() {
	conn, pub, inspect := s.broker()
	if conn == nil {
		return
	}
	inspect.Close()
	pub.Close()
	conn.Close()
}

// request is a logged-in request: who asks, and whether they may act.
type request struct {
	// user's Role is its role in the namespace it looks at.
	user    User
	session *session
	token   string
	// ns is the namespace it looks at (everyNamespace: every one), among
	// views, those it may look at.
	ns    string
	views []string
}

// canAct: an operator, and the console not read-only.
func (s *server) canAct(rq *request) bool {
	return rq != nil && rq.user.Role == Operator && !s.cfg.ReadOnly
}

// routes is every page. GETs read; every POST but the login's needs a
// session, its CSRF token, and the operator role on a console that is not
// read-only.
func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /static/", s.static)
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("GET /login/oidc", s.ssoBegin)
	mux.HandleFunc("GET "+ssoCallback, s.ssoFinish)
	mux.HandleFunc("POST /logout", s.loggedIn(s.logout, false))
	mux.HandleFunc("POST /namespace", s.choice(s.switchNamespace))
	mux.HandleFunc("GET /{$}", s.authed(s.overview))
	mux.HandleFunc("GET /overview/live", s.authed(s.deployment(s.overviewLive)))
	mux.HandleFunc("GET /orders", s.authed(s.orders))
	order := func(method, path string, h handler) {
		if method == "GET" {
			mux.HandleFunc(method+" "+path, s.authed(s.inView(h)))
		} else {
			mux.HandleFunc(method+" "+path, s.action(s.inView(h)))
		}
	}
	order("GET", "/orders/{id}", s.order)
	order("GET", "/orders/{id}/resubmit", s.confirmResubmit)
	order("POST", "/orders/{id}/resubmit", s.resubmit)
	order("GET", "/orders/{id}/cancel", s.confirmCancel)
	order("POST", "/orders/{id}/cancel", s.cancel)
	order("GET", "/orders/{id}/migrate", s.confirmMigrate)
	order("POST", "/orders/{id}/migrate", s.migrate)
	order("GET", "/orders/{id}/pause", s.confirmPause(true))
	order("POST", "/orders/{id}/pause", s.pause(true))
	order("GET", "/orders/{id}/resume", s.confirmPause(false))
	order("POST", "/orders/{id}/resume", s.pause(false))
	order("GET", "/orders/{id}/signal", s.confirmSignal)
	order("POST", "/orders/{id}/signal", s.signal)
	order("GET", "/orders/{id}/rerun", s.confirmRerun)
	order("POST", "/orders/{id}/rerun", s.rerun)
	// Bulk jobs, alerts and dead letters: each namespace's in its view.
	get := func(path string, h handler) { mux.HandleFunc("GET "+path, s.authed(h)) }
	post := func(path string, h handler) { mux.HandleFunc("POST "+path, s.action(h)) }
	get("/bulk", s.bulkJobs)
	get("/bulk/{action}", s.confirmBulk)
	post("/bulk/{action}", s.bulkCreate)
	get("/bulk/jobs/{id}", s.bulkJob)
	get("/bulk/jobs/{id}/stop", s.confirmBulkStop)
	post("/bulk/jobs/{id}/stop", s.bulkStop)
	get("/alerts", s.alerts)
	get("/alerts/{id}/ack", s.confirmAck)
	post("/alerts/{id}/ack", s.ack)
	get("/dead-letters", s.deadLetters)
	get("/dead-letters/{queue}", s.deadLetterQueue)
	get("/dead-letters/{queue}/{id}/{verb}", s.confirmDeadLetter)
	post("/dead-letters/{queue}/{id}/{verb}", s.moveDeadLetter)
	// The deployment's pages: in the view of every namespace only.
	page := func(path string, h handler) { get(path, s.deployment(h)) }
	act := func(path string, h handler) { post(path, s.deployment(h)) }
	page("/workflows", s.workflowsPage)
	page("/workflows/{name}/migrate", s.confirmWorkflowMove)
	act("/workflows/{name}/migrate", s.workflowMoveAction)
	page("/schedules", s.schedulesPage)
	page("/schedules/{name}/{verb}", s.confirmSchedule)
	act("/schedules/{name}/{verb}", s.scheduleAction)
	page("/pauses", s.pausesPage)
	page("/pauses/{scope}/{verb}", s.confirmPauseTarget)
	act("/pauses/{scope}/{verb}", s.pauseTargetAction)
	page("/limits", s.limitsPage)
	page("/limits/{kind}/set", s.confirmLimits)
	act("/limits/{kind}/set", s.setLimits)
	page("/limits/{kind}/reset", s.confirmLimitsReset)
	act("/limits/{kind}/reset", s.resetLimits)
	page("/limits/{kind}/namespace", s.confirmScoped)
	act("/limits/{kind}/namespace", s.setScoped)
	page("/limits/{kind}/namespace/reset", s.confirmScopedReset)
	act("/limits/{kind}/namespace/reset", s.resetScoped)
	mux.HandleFunc("/", s.notFound)
	return s.secure(s.origins.only(mux, func(r *http.Request) {
		s.logger.Warn("console request for another host refused", "host", truncate(r.Host, 100), "addr", clientAddr(r))
	}))
}

// truncate bounds text a request brought, for a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// secure sets the headers every answer carries: no script, style or frame
// from anywhere else, no inline script, no sniffing, no caching of pages.
func (s *server) secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, "/static/") {
			hd.Set("Cache-Control", "no-store")
		}
		if s.cfg.TLSCertFile != "" {
			hd.Set("Strict-Transport-Security", "max-age=31536000")
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), startKey{}, time.Now())))
	})
}

// current returns the request's session and user, or nil when it has
// none (or its user is gone from the users file).
func (s *server) current(r *http.Request) *request {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	ss, ok := s.sessions.get(c.Value, s.now())
	if !ok {
		return nil
	}
	if ss.sso != nil {
		id, ok := s.ssoIdentity(r.Context(), ss.sso)
		if !ok {
			s.sessions.end(c.Value)
			return nil
		}
		return s.scoped(r, &request{user: User{Name: id.Actor(), Role: id.Role, Grants: id.Grants, Display: id.Display}, session: ss, token: c.Value})
	}
	if err := s.users.reload(); err != nil {
		s.logger.Error("users file", "err", err)
	}
	u, ok := s.users.lookup(ss.user)
	if !ok {
		s.sessions.end(c.Value)
		return nil
	}
	return s.scoped(r, &request{user: u, session: ss, token: c.Value})
}

// scoped sets the request's view and role (none, for a user with no role
// in any namespace there is: every page but the log-out refuses it).
func (s *server) scoped(r *http.Request, rq *request) *request {
	if !s.scope(r.Context(), rq) {
		rq.user.Role, rq.views = "", nil
	}
	return rq
}

// noRole refuses a user with no role in any namespace there is.
func (s *server) noRole(w http.ResponseWriter, r *http.Request, rq *request) bool {
	if len(rq.views) > 0 {
		return false
	}
	s.logger.Warn("console: the user has no role in any namespace", "user", rq.user.Name, "addr", clientAddr(r))
	s.fail(w, r, rq, http.StatusForbidden, "You have no role in any namespace of this deployment.")
	return true
}

type handler func(http.ResponseWriter, *http.Request, *request)

// authed lets only a logged-in user through; anyone else goes to the
// login page (a live fragment gets 401).
func (s *server) authed(h handler) http.HandlerFunc { return s.loggedIn(h, true) }

// loggedIn lets only a logged-in user through, and with needsRole one
// with a role in some namespace.
func (s *server) loggedIn(h handler, needsRole bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rq := s.current(r)
		if rq == nil {
			if strings.HasPrefix(r.URL.Path, "/overview/live") {
				http.Error(w, "log in", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if needsRole && s.noRole(w, r, rq) {
			return
		}
		h(w, r, rq)
	}
}

// maxFormBytes bounds an action's form: room for a corrected payload of
// messages.MaxPayloadBytes, URL-encoded (up to three bytes a byte).
const maxFormBytes = 3*messages.MaxPayloadBytes + 4<<10

// action guards a state-changing request: a session, a request from this
// site, the session's CSRF token, the operator role, not read-only.
func (s *server) action(h handler) http.HandlerFunc { return s.posted(h, true) }

// choice guards a form that changes the session alone (the namespace
// switcher): a session, a request from this site, its CSRF token.
func (s *server) choice(h handler) http.HandlerFunc { return s.posted(h, false) }

func (s *server) posted(h handler, acts bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rq := s.current(r)
		if rq == nil {
			s.fail(w, r, nil, http.StatusForbidden, "You are not logged in.")
			return
		}
		if !s.origins.sameOrigin(r) {
			s.fail(w, r, rq, http.StatusForbidden, "This request came from another site.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		err := r.ParseForm()
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			s.fail(w, r, rq, http.StatusRequestEntityTooLarge, fmt.Sprintf("The form is more than %d bytes: a payload is at most %d bytes of JSON.",
				maxFormBytes, messages.MaxPayloadBytes))
			return
		}
		if err != nil || !sameToken(r.PostForm.Get("csrf"), rq.session.csrf) {
			s.fail(w, r, rq, http.StatusForbidden, "The form's security token is missing or wrong: reload the page and try again.")
			return
		}
		if s.noRole(w, r, rq) {
			return
		}
		if !acts {
			h(w, r, rq)
			return
		}
		if s.cfg.ReadOnly {
			s.fail(w, r, rq, http.StatusForbidden, "The console is read-only.")
			return
		}
		if rq.user.Role != Operator {
			s.fail(w, r, rq, http.StatusForbidden, "Your role ("+rq.user.Role+") may only look.")
			return
		}
		h(w, r, rq)
	}
}

// page is what every page's template gets.
type page struct {
	Title    string
	Nav      string
	User     string
	Role     string
	CSRF     string
	CanAct   bool
	ReadOnly bool
	Notice   string
	Data     any
	// Namespace is the namespace the user looks at ("*": every one),
	// Views those it may choose; Everywhere: the deployment's pages are
	// shown.
	Namespace  string
	Views      []string
	Everywhere bool
}

func (s *server) render(w http.ResponseWriter, r *http.Request, rq *request, status int, name, title string, data any) {
	p := page{Title: title, Nav: name, ReadOnly: s.cfg.ReadOnly, Data: data}
	if rq != nil {
		p.User, p.Role, p.CSRF, p.CanAct = rq.user.shown(), rq.user.Role, rq.session.csrf, s.canAct(rq)
		p.Namespace, p.Views, p.Everywhere = rq.ns, rq.views, rq.everywhere()
	}
	p.Notice = noticeOf(r.URL.Query().Get("done"))
	t, ok := s.pages[name]
	if !ok {
		panic("no page " + name)
	}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", p); err != nil {
		s.logger.Error("render", "page", name, "err", err)
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	serverTiming(w, r)
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

type startKey struct{}

// serverTiming tells the browser (and the benchmark) how long the server
// took to make the answer, its queries included: Server-Timing app;dur=ms.
func serverTiming(w http.ResponseWriter, r *http.Request) {
	if start, ok := r.Context().Value(startKey{}).(time.Time); ok {
		w.Header().Set("Server-Timing", fmt.Sprintf("app;dur=%.2f", float64(time.Since(start).Microseconds())/1000))
	}
}

// noticeOf is the message an action's redirect shows: the query says
// which, never the text; anything else shows none.
func noticeOf(done string) string {
	switch done {
	case "resubmitted":
		return "Resubmitted: the step is pending again."
	case "cancelled":
		return "Cancelled: what was done is being undone."
	case "migrated":
		return "Moved: the order runs the new version of its workflow; its history records the move."
	case "order-paused":
		return "Paused: its steps in flight end normally; nothing new of it is claimed until it is resumed."
	case "order-resumed":
		return "Resumed: its pending steps are claimed now."
	case "signalled":
		return "Signal sent: the step ends once a scheduler applies it (if it is refused, the signals dead-letter queue says why)."
	case "acknowledged":
		return "Alert acknowledged."
	case "rerun":
		return "Re-run with the corrected payload: its failed step is pending again; the payload it had is in its history."
	case "bulk":
		return "Bulk job made: an API replica acts on its orders a batch at a time."
	case "stopped":
		return "Bulk job stopped: the orders it had not reached stay as they were."
	case "requeued":
		return "Dead letter requeued to its queue."
	case "discarded":
		return "Dead letter discarded."
	case "paused":
		return "Schedule paused: its ticks start nothing until it is resumed."
	case "resumed":
		return "Schedule resumed: it ticks again from its next tick."
	case "workflow-paused":
		return "Workflow paused: nothing new of its orders is claimed; orders of it submitted meanwhile wait."
	case "workflow-resumed":
		return "Workflow resumed: the orders paused with it run on."
	case "kind-paused":
		return "Agent kind paused: none of its steps is claimed until it is resumed."
	case "kind-resumed":
		return "Agent kind resumed: its pending steps are claimed again."
	case "triggered":
		return "Schedule triggered: the leading supervisor starts its order."
	}
	return ""
}

type failure struct {
	Status  int
	Message string
}

// fail answers status with a page saying msg, bounded as every entrance
// bounds a refusal's detail (messages.BoundText, messages.MaxReasonBytes).
func (s *server) fail(w http.ResponseWriter, r *http.Request, rq *request, status int, msg string) {
	s.render(w, r, rq, status, "error.html", http.StatusText(status), failure{status, messages.BoundText(msg, messages.MaxReasonBytes)})
}

func (s *server) notFound(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, s.current(r), http.StatusNotFound, "There is nothing at "+r.URL.Path+".")
}

// storeError answers a state store error: what is not found (a 404), an
// action refused (a 409, in the database's words), or a failure (logged,
// not shown).
func (s *server) storeError(w http.ResponseWriter, r *http.Request, rq *request, err error, what string) {
	switch {
	case errors.Is(err, statestore.ErrNotFound):
		s.fail(w, r, rq, http.StatusNotFound, "There is no "+what+".")
	case errors.Is(err, statestore.ErrInvalidState):
		s.fail(w, r, rq, http.StatusConflict, errorText(err))
	case errors.Is(err, statestore.ErrInvalidData):
		s.fail(w, r, rq, http.StatusUnprocessableEntity, errorText(err))
	case errors.Is(err, context.Canceled):
	default:
		s.logger.Error("console request failed", "path", r.URL.Path, "err", err)
		s.fail(w, r, rq, http.StatusInternalServerError, "The state store did not answer; the console's log says why.")
	}
}

// errorText is the database's refusal without the operation's name
// before it ("resubmit: ...").
func errorText(err error) string {
	_, msg, found := strings.Cut(err.Error(), ": ")
	if !found {
		return err.Error()
	}
	return msg
}

func (s *server) redirect(w http.ResponseWriter, r *http.Request, to, done string) {
	sep := "?"
	if strings.Contains(to, "?") {
		sep = "&"
	}
	http.Redirect(w, r, fmt.Sprintf("%s%sdone=%s", to, sep, url.QueryEscape(done)), http.StatusSeeOther)
}
