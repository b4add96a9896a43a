package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// consoleUser adds a console user to the users file through sasctl, as an
// operator would make one.
func consoleUser(t *testing.T, file, name, role, password string, namespaces ...string) {
	t.Helper()
	args := []string{"console", "user", "add", name, "--role", role, "--file", file, "--cost", "4"}
	for _, ns := range namespaces {
		args = append(args, "--namespace", ns)
	}
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), args...)
	cmd.Env = env()
	cmd.Stdin = strings.NewReader(password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("console user add %s: %v\n%s", name, err, out)
	}
}

// consoleLogin makes a database login in role sas_console for this
// test's schema and returns the database URL that logs in with it: the
// console then has only that role's rights.
func consoleLogin(t *testing.T, s stack) string {
	t.Helper()
	suffix := "_" + testenv.RandomSuffix(8)
	t.Cleanup(func() { _, _ = s.pool.Exec(context.Background(), `DROP ROLE IF EXISTS sas_console`+suffix) })
	out, errOut, code := sasctl(t, append(append([]string{}, s.env...), "SAS_DB_PASSWORD_CONSOLE=console-pw"), "db", "users", "--login-suffix", suffix)
	if code != 0 || !strings.Contains(out, "sas_console"+suffix) {
		t.Fatalf("db users: exit %d: %s %s", code, out, errOut)
	}
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("sas_console"+suffix, "console-pw")
	return u.String()
}

// console is a running console with its users file.
type consoleProc struct {
	*proc
	url   string // http://host:port
	users string
}

func startConsole(t *testing.T, s stack, extra ...string) consoleProc {
	t.Helper()
	return startConsoleFor(t, s, nil, extra...)
}

// startConsoleFor is startConsole with alice and victor users of the
// namespaces given (nil: of default).
func startConsoleFor(t *testing.T, s stack, namespaces []string, extra ...string) consoleProc {
	t.Helper()
	users := filepath.Join(t.TempDir(), "users")
	consoleUser(t, users, "alice", "operator", "alice's password", namespaces...)
	consoleUser(t, users, "victor", "viewer", "victor's password", namespaces...)
	addr := freeAddr(t)
	environ := append(append([]string{}, s.env...), "SAS_DATABASE_URL="+consoleLogin(t, s),
		"SAS_CONSOLE_ADDR="+addr, "SAS_CONSOLE_USERS_FILE="+users)
	p := start(t, "console", append(environ, extra...))
	return consoleProc{proc: p, url: "http://" + addr, users: users}
}

// browser gives the test a tab of the test binary's one headless Chromium
// (Debian's chromium, which scripts/services.sh --chromium installs), in a
// browser context of its own: cookies, storage and cache the test's alone,
// as in a browser of its own. Chromium costs this machine about 4 s of CPU
// to start (perf stat, --dump-dom about:blank); the suite's browser tests
// each started one.
func browser(t *testing.T) context.Context {
	t.Helper()
	root, err := chromium.start()
	if err != nil {
		testenv.Unavailable(t, "Chromium (scripts/services.sh --chromium installs it)", err)
	}
	ctx, cancel := chromedp.NewContext(root, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(cancelTimeout)
	if err := chromedp.Do(ctx); err != nil {
		testenv.Unavailable(t, "Chromium", err)
	}
	return ctx
}

// sharedChromium is the test binary's one Chromium, started by the first
// test that asks for a browser and stopped when the tests are done.
type sharedChromium struct {
	mu     sync.Mutex
	ctx    context.Context // the browser's first tab: tests open theirs from it
	err    error
	cancel []context.CancelFunc
}

// start starts Chromium, once; its first tab's context or why it could not.
func (c *sharedChromium) start() (context.Context, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx != nil || c.err != nil {
		return c.ctx, c.err
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		c.err = err
		return nil, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1360, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	c.cancel = []context.CancelFunc{cancel, cancelAlloc}
	if err := chromedp.Do(ctx); err != nil {
		c.err = err
		return nil, err
	}
	c.ctx = ctx
	return ctx, nil
}

// stop closes Chromium, if it was started, and waits for it to exit.
func (c *sharedChromium) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.cancel {
		cancel()
	}
}

// screenshots saves full-page screenshots into SAS_CONSOLE_SCREENSHOTS
// (make console-screenshots points it at docs/console), else into a
// directory of the test's.
type screenshots struct {
	t   *testing.T
	dir string
}

func newScreenshots(t *testing.T) screenshots {
	dir := os.Getenv("SAS_CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "sas-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshots in %s", dir)
	return screenshots{t, dir}
}

func (s screenshots) take(ctx context.Context, name string) {
	s.t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		s.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, name+".png"), buf, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// takeOf saves a screenshot of the element sel selects (CSS).
func (s screenshots) takeOf(ctx context.Context, name, sel string) {
	s.t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
	if err != nil {
		s.t.Fatalf("screenshot %s of %s: %v", name, sel, err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, name+".png"), buf, 0o644); err != nil {
		s.t.Fatal(err)
	}
}

func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs an action that reads something from the page.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	deadline := time.Now().Add(staleNodeWait)
	for {
		v, err := chromedp.Run(ctx, a)
		switch {
		case err == nil:
			return v
		case strings.Contains(err.Error(), "No node with given id") && time.Now().Before(deadline):
			// The element was found in a document the browser has since
			// replaced (a page that loaded while the query ran, which a
			// loaded machine made once): read it again, from the page
			// now shown.
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// staleNodeWait is how long value reads again an element whose node the
// browser replaced.
const staleNodeWait = 10 * time.Second

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return value(t, ctx, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	return value(t, ctx, js, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
}

func login(t *testing.T, ctx context.Context, base, name, password string) {
	t.Helper()
	do(t, ctx, "log in as "+name,
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#name")),
		chromedp.SendKeys(chromedp.CSS("#name"), name),
		chromedp.SendKeys(chromedp.CSS("#password"), password),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#live")))
}

// waitStatus reloads an order's page until it shows status.
func waitStatus(t *testing.T, ctx context.Context, base, id, status string) {
	t.Helper()
	testenv.Eventually(t, 90*time.Second, "order "+id+" shown "+status, func() bool {
		do(t, ctx, "open order "+id, chromedp.Navigate(base+"/orders/"+id))
		return text(t, ctx, "#order-status") == status
	})
}

// post sends a form POST from the page with fetch, as a forged request
// would, and returns the answer's status.
func post(t *testing.T, ctx context.Context, path, form string) int {
	t.Helper()
	return eval[int](t, ctx, fmt.Sprintf(`fetch(%q, {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: %q, redirect: "manual"}).then(r => r.status)`, path, form))
}

func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	// Traced, so that an order's page has a trace id to show.
	_, st := tracedStack(t)
	p := newPipeline(t, pipelineOpts{on: st, supervisors: 1, supervisorEnv: []string{"SAS_SUPERVISOR_OVERVIEW_INTERVAL=1s"}})
	held, held2, toCancel, script := messages.NewID(), messages.NewID(), messages.NewID(), messages.NewID()
	p.setFaults(t, `{"reserve_inventory":{"fail_orders":["`+held+`","`+held2+`"]},"charge_payment":{"fail_orders":["`+toCancel+`"]}}`)
	ch := amqpChannel(t)
	for _, id := range []string{held, held2, toCancel} {
		publish(t, ch, p.submit, messages.ContentType, id, holdOrder(id))
	}
	const payloadScript = `<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">`
	xss := strings.Replace(badinput.ValidSubmitJSON(script), `"ACME Ltd"`, fmt.Sprintf("%q", payloadScript), 1)
	publish(t, ch, p.submit, messages.ContentType, script, []byte(xss))
	ids := p.submitOrders(t, 20)
	publish(t, ch, p.submit, messages.ContentType, "not-json-"+testenv.RandomSuffix(6), []byte("this is not JSON"))
	p.waitTerminal(t, append(ids, held, held2, toCancel, script), 2*time.Minute)
	for _, id := range []string{held, held2, toCancel} {
		if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, id); n != 1 {
			t.Fatalf("order %s is not held in error", id)
		}
	}
	p.setFaults(t, `{}`)

	c := startConsole(t, p.stack)
	ctx := browser(t)
	shots := newScreenshots(t)

	// Nobody gets in without logging in.
	do(t, ctx, "open an order unlogged", chromedp.Navigate(c.url+"/orders/"+held), chromedp.WaitVisible(chromedp.CSS("#login")))
	loc := value(t, ctx, "location", chromedp.Location())
	if !strings.Contains(loc, "/login?next=") {
		t.Fatalf("an unlogged visit went to %s, want the login page", loc)
	}
	shots.take(ctx, "login")
	do(t, ctx, "a wrong password", chromedp.SendKeys(chromedp.CSS("#name"), "alice"),
		chromedp.SendKeys(chromedp.CSS("#password"), "guess"), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")))

	// The overview, live.
	login(t, ctx, c.url, "alice", "alice's password")
	if got := text(t, ctx, "#live-error"); got != "3" {
		t.Fatalf("overview shows %s orders in error, want 3", got)
	}
	if got := text(t, ctx, "#leader"); !strings.Contains(got, "supervisor") {
		t.Fatalf("overview shows supervisor leader %q", got)
	}
	do(t, ctx, "the overview refreshes itself", chromedp.WaitReady(chromedp.CSS(`#live[data-updated]`)))
	// The last hour's charts, drawn on the server from the store: the 21
	// orders of workflow order that completed, and the held ones' failed
	// first steps nowhere (they are in error, not ended).
	completed := p.count(t, `SELECT count(*) FROM orders WHERE workflow = 'order' AND status = 'completed'`)
	testenv.Eventually(t, time.Minute, "the charts to count the completed orders", func() bool {
		do(t, ctx, "reload the overview", chromedp.Navigate(c.url+"/"), chromedp.WaitVisible(chromedp.CSS("#charts")))
		return eval[int](t, ctx, `+((document.querySelector('#charts .chart-row[data-workflow="order"]') || {dataset: {}}).dataset.completed || 0)`) == completed
	})
	if n := eval[int](t, ctx, `document.querySelectorAll('#charts .chart-row[data-workflow="order"] svg polyline').length`); n != 5 || completed < 21 {
		t.Fatalf("the order workflow's charts have %d lines (want 5) for %d completed orders", n, completed)
	}
	if pts := eval[string](t, ctx, `document.querySelector('#charts .chart-row[data-workflow="order"] polyline.line-ok').getAttribute("points")`); len(strings.Fields(pts)) != 60 {
		t.Fatalf("the completed line has points %q, want one a minute for an hour", pts)
	}
	if scripts := eval[int](t, ctx, `document.querySelectorAll("#charts script, svg script").length`); scripts != 0 {
		t.Fatal("the charts carry script")
	}
	shots.take(ctx, "overview")

	// Orders filtered by status.
	do(t, ctx, "filter orders in error", chromedp.Navigate(c.url+"/orders"),
		chromedp.SetValue(chromedp.CSS("#f-status"), "error"), chromedp.Click(chromedp.CSS("#f-apply")),
		chromedp.WaitVisible(chromedp.CSS(`#orders[data-status="error"]`)))
	listed := text(t, ctx, "#orders")
	for _, id := range []string{held, held2, toCancel} {
		if !strings.Contains(listed, id) {
			t.Fatalf("orders in error do not list %s:\n%s", id, listed)
		}
	}
	if strings.Contains(listed, ids[0]) || strings.Count(listed, "completed") > 0 {
		t.Fatalf("orders in error list other orders:\n%s", listed)
	}
	shots.take(ctx, "orders")

	// An order held in error: resubmit it and watch it complete.
	do(t, ctx, "open the held order", chromedp.Click(chromedp.CSS(`a[href="/orders/`+held+`"]`)), chromedp.WaitVisible(chromedp.CSS("#resubmit")))
	if got := text(t, ctx, "#order-status"); got != "error" {
		t.Fatalf("held order shows %q", got)
	}
	shots.take(ctx, "order-error")
	do(t, ctx, "resubmit", chromedp.Click(chromedp.CSS("#resubmit")), chromedp.WaitVisible(chromedp.CSS("#confirm-button")))
	shots.take(ctx, "confirm")
	do(t, ctx, "confirm the resubmit", chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	waitStatus(t, ctx, c.url, held, "completed")
	if h := text(t, ctx, "#history"); !strings.Contains(h, "console:alice") || !strings.Contains(h, "operator resubmit") {
		t.Fatalf("the history does not record alice's resubmit:\n%s", h)
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND reason = 'operator resubmit' AND claimed_by = 'console:alice'
		AND db_user LIKE 'sas_console_%'`, held); n == 0 {
		t.Fatal("the resubmit is not recorded with the console's login and user")
	}
	shots.take(ctx, "order-completed")

	// Cancel another and see its compensation.
	do(t, ctx, "cancel", chromedp.Navigate(c.url+"/orders/"+toCancel), chromedp.Click(chromedp.CSS("#cancel")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-button")), chromedp.Click(chromedp.CSS("#confirm-button")),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	waitStatus(t, ctx, c.url, toCancel, "failed")
	// Both attempted actions are undone: the inventory reserved and the
	// payment whose charge failed.
	want := p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND kind = 'compensation' AND process_state = 'processed'`, toCancel)
	if compensated := eval[int](t, ctx, `document.querySelectorAll(".ev-compensated").length`); compensated != 2 || want != 2 {
		t.Fatalf("the cancelled order shows %d compensations, the store has %d, want 2", compensated, want)
	}
	shots.take(ctx, "order-cancelled")

	// Pause an order that waits for a kind nobody serves, then resume it.
	waiting := orphanOrder()
	if got, err := statestore.New(p.pool).InsertOrder(t.Context(), waiting); err != nil || got != statestore.Inserted {
		t.Fatalf("insert: %v %v", got, err)
	}
	do(t, ctx, "pause", chromedp.Navigate(c.url+"/orders/"+waiting.OrderID), chromedp.Click(chromedp.CSS("#pause")),
		chromedp.WaitVisible(chromedp.CSS("#confirm-button")), chromedp.Click(chromedp.CSS("#confirm-button")),
		chromedp.WaitVisible(chromedp.CSS("#paused")))
	if got := text(t, ctx, "#paused"); !strings.Contains(got, "console:alice") {
		t.Fatalf("the paused order shows %q", got)
	}
	if n := p.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, waiting.OrderID); n != 1 {
		t.Fatal("the console's pause left no pause in the store")
	}
	do(t, ctx, "resume", chromedp.Click(chromedp.CSS("#resume")), chromedp.WaitVisible(chromedp.CSS("#confirm-button")),
		chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#pause")))
	if n := p.count(t, `SELECT count(*) FROM order_pauses WHERE order_id = $1`, waiting.OrderID); n != 0 {
		t.Fatal("the console's resume left the pause in the store")
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE target = $1 AND action IN ('pause', 'resume') AND claimed_by = 'console:alice'`,
		waiting.OrderID); n != 2 {
		t.Fatalf("%d pause and resume actions recorded for alice, want 2", n)
	}

	// A payload holding a script shows it as text and runs nothing.
	do(t, ctx, "open the order with a script", chromedp.Navigate(c.url+"/orders/"+script), chromedp.WaitVisible(chromedp.CSS("#payload")))
	if eval[bool](t, ctx, `window.pwned !== undefined || document.querySelector("#payload script, #payload img") !== null`) {
		t.Fatal("the payload's markup became part of the page")
	}
	if got := text(t, ctx, "#payload"); !strings.Contains(got, "<script>window.pwned = 1</script>") {
		t.Fatalf("the payload is not shown as text:\n%s", got)
	}
	if tid, got := p.traceOf(t, script), text(t, ctx, "#trace-id"); len(tid) != 32 || !strings.Contains(got, tid) {
		t.Errorf("the order page shows the trace %q, want the order's %q", got, tid)
	}

	// A POST without the CSRF token is refused, even from an operator.
	if status := post(t, ctx, "/orders/"+held2+"/cancel", ""); status != 403 {
		t.Fatalf("a cancel without the CSRF token answered %d, want 403", status)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, held2); n != 1 {
		t.Fatal("a POST without the CSRF token changed the order")
	}

	// The other pages.
	do(t, ctx, "alerts", chromedp.Navigate(c.url+"/alerts"), chromedp.WaitVisible(chromedp.CSS("#alerts")))
	shots.take(ctx, "alerts")
	do(t, ctx, "workflows", chromedp.Navigate(c.url+"/workflows"), chromedp.WaitVisible(chromedp.CSS(".workflow")))
	shots.take(ctx, "workflows")
	do(t, ctx, "dead letters", chromedp.Navigate(c.url+"/dead-letters/submit"), chromedp.WaitVisible(chromedp.CSS("#letters")))
	if got := text(t, ctx, "#letters"); !strings.Contains(got, "not_json") {
		t.Fatalf("the submit queue's dead letters do not show the bad message:\n%s", got)
	}
	shots.take(ctx, "dead-letters")
	do(t, ctx, "discard a dead letter", chromedp.Click(chromedp.CSS(`#letters a.danger`)),
		chromedp.WaitVisible(chromedp.CSS("#confirm-button")), chromedp.Click(chromedp.CSS("#confirm-button")),
		chromedp.WaitVisible(chromedp.CSS("#notice")))
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE action = 'dead letter discard' AND claimed_by = 'console:alice'`); n != 1 {
		t.Fatal("the discard is not recorded")
	}

	// A viewer sees no action, and a forged POST as a viewer is refused.
	do(t, ctx, "log out", chromedp.Navigate(c.url+"/"), chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)),
		chromedp.WaitVisible(chromedp.CSS("#login")))
	login(t, ctx, c.url, "victor", "victor's password")
	do(t, ctx, "the held order as a viewer", chromedp.Navigate(c.url+"/orders/"+held2), chromedp.WaitVisible(chromedp.CSS("#order-status")))
	if buttons := eval[int](t, ctx, `document.querySelectorAll("#resubmit, #cancel, .actions a, a.button").length`); buttons != 0 {
		t.Fatalf("a viewer sees %d action buttons", buttons)
	}
	shots.take(ctx, "order-viewer")
	csrf := value(t, ctx, "the viewer's token", chromedp.AttributeValue(chromedp.CSS(`form[action="/logout"] input[name="csrf"]`), "value")).Value
	if status := post(t, ctx, "/orders/"+held2+"/cancel", "csrf="+url.QueryEscape(csrf)); status != 403 {
		t.Fatalf("a viewer's cancel answered %d, want 403", status)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, held2); n != 1 {
		t.Fatal("a viewer's forged POST changed the order")
	}
}

// TestLoginNeverLeavesTheConsole: a login whose next page is another
// site's address, written in any of the ways a browser might re-read
// (badinput.HostileNext), ends on a page of the console in a real
// browser, whether next comes in the login page's address or straight in
// the form; the other site, a real server on another port, is never
// asked for anything.
func TestLoginNeverLeavesTheConsole(t *testing.T) {
	t.Parallel()
	st := newStack(t)
	c := startConsole(t, st)
	var visits atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		visits.Add(1)
		fmt.Fprint(w, "<html><body id=evil>another site</body></html>")
	}))
	t.Cleanup(evil.Close)
	evilHost := strings.TrimPrefix(evil.URL, "http://")
	ctx := browser(t)
	for i, next := range badinput.HostileNext(evilHost) {
		for _, how := range []string{"form", "address"} {
			if _, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{}); err != nil {
				t.Fatal(err)
			}
			page := c.url + "/login"
			if how == "address" {
				page += "?next=" + url.QueryEscape(next)
			}
			do(t, ctx, "open the login page", chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#name")))
			if how == "form" {
				// What a forged form would post: next exactly as written.
				js, _ := json.Marshal(next)
				eval[bool](t, ctx, `(document.querySelector('input[name="next"]').value = `+string(js)+`) !== undefined`)
			}
			// The fields are set as a whole, not typed key by key: what is
			// tested is where the login's answer leads, and 76 logins typed
			// would take most of this test's time.
			resp, err := chromedp.RunResponse(ctx, chromedp.SetValue(chromedp.CSS("#name"), "alice"),
				chromedp.SetValue(chromedp.CSS("#password"), "alice's password"), chromedp.Click(chromedp.CSS("#login")))
			if err != nil {
				t.Errorf("case %d (%q, %s): the login did not end on a page: %v", i, next, how, err)
				continue
			}
			loc := value(t, ctx, "location", chromedp.Location())
			if !strings.HasPrefix(loc, c.url+"/") || !strings.HasPrefix(resp.URL, c.url+"/") {
				t.Errorf("case %d: a login with next %q in the %s ended at %s (document %s), want a page of %s", i, next, how, loc, resp.URL, c.url)
			}
		}
	}
	if n := visits.Load(); n != 0 {
		t.Fatalf("the other site was visited %d times", n)
	}
}
