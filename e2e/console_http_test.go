package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// webClient is a browser without JavaScript: it keeps the cookies it is
// given (Secure ones too: the test talks plain HTTP on loopback) and
// follows no redirect.
type webClient struct {
	t       *testing.T
	base    string
	host    string // the Host header to send, when set
	origin  string // the Origin header to send, when set
	cookies map[string]*http.Cookie
	http    *http.Client
	last    *http.Response
}

func newWebClient(t *testing.T, base string) *webClient {
	return &webClient{t: t, base: base, cookies: map[string]*http.Cookie{}, http: &http.Client{
		Timeout:       30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (c *webClient) do(method, path string, form url.Values) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if c.host != "" {
		req.Host = c.host
	}
	if c.origin != "" {
		req.Header.Set("Origin", c.origin)
	}
	for _, ck := range c.cookies {
		req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, ck := range resp.Cookies() {
		if ck.MaxAge < 0 {
			delete(c.cookies, ck.Name)
		} else {
			c.cookies[ck.Name] = ck
		}
	}
	c.last = resp
	return resp.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", page)
	}
	return m[1]
}

// login logs in with the form, as a browser would, and returns the status.
func (c *webClient) login(name, password string) int {
	c.t.Helper()
	_, page := c.do("GET", "/login", nil)
	status, _ := c.do("POST", "/login", url.Values{"csrf": {csrfOf(c.t, page)}, "name": {name}, "password": {password}, "next": {"/"}})
	return status
}

// TestConsoleAnswersOnlyForItsOwnOrigin: a page of another site whose
// name points at the console (DNS rebinding) sends that name as Host and
// Origin; the console refuses it (421) before anything else, and a form
// from another origin with the console's own Host is refused too (403).
// With SAS_CONSOLE_PUBLIC_URL stated, only its host is answered.
func TestConsoleAnswersOnlyForItsOwnOrigin(t *testing.T) {
	t.Parallel()
	st := newStack(t)
	local := startConsole(t, st)
	stated := startConsole(t, st, "SAS_CONSOLE_PUBLIC_URL=http://console.test")
	port := func(base string) string { return base[strings.LastIndex(base, ":")+1:] }

	for _, c := range []struct {
		desc, base, host, origin string
		want                     int
	}{
		{"another name, rebound to the console", local.url, "evil.example:" + port(local.url), "http://evil.example:" + port(local.url), http.StatusMisdirectedRequest},
		{"another name without an Origin", local.url, "evil.example", "", http.StatusMisdirectedRequest},
		{"the console's address, a form from another site", local.url, "", "http://evil.example", http.StatusForbidden},
		{"localhost", local.url, "localhost:" + port(local.url), "http://localhost:" + port(local.url), http.StatusSeeOther},
		{"the console's address", local.url, "", "", http.StatusSeeOther},
		{"stated: its public name", stated.url, "console.test", "http://console.test", http.StatusSeeOther},
		{"stated: its address, which it was told is not its name", stated.url, "", "", http.StatusMisdirectedRequest},
		{"stated: its public name, a form from another site", stated.url, "console.test", "http://evil.example", http.StatusForbidden},
		{"stated: its public name, another scheme", stated.url, "console.test", "https://console.test", http.StatusForbidden},
	} {
		// A login with the right password: only the origin decides.
		wc := newWebClient(t, c.base)
		wc.host = c.host
		status, page := wc.do("GET", "/login", nil)
		if refused := c.want == http.StatusMisdirectedRequest; (status == c.want) != refused || (!refused && status != http.StatusOK) {
			t.Errorf("%s: GET /login answered %d", c.desc, status)
		}
		if status != http.StatusOK {
			page = `name="csrf" value="none"`
		}
		wc.origin = c.origin
		status, _ = wc.do("POST", "/login", url.Values{"csrf": {csrfOf(t, page)}, "name": {"alice"}, "password": {"alice's password"}, "next": {"/"}})
		if status != c.want {
			t.Errorf("%s: the login answered %d, want %d", c.desc, status, c.want)
		}
		if got := wc.cookies["sas_session"] != nil; got != (c.want == http.StatusSeeOther) {
			t.Errorf("%s: a session cookie was given: %v", c.desc, got)
		}
	}
}

// TestConsoleLoginLimitHoldsUnderConcurrency: 30 wrong logins for one
// name from one address, all at once, against the real console: only
// the limit's 5 passwords are checked, the other 25 are refused (429)
// without one; and then the right password waits too.
func TestConsoleLoginLimitHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	st := newStack(t)
	c := startConsole(t, st)
	clients := make([]*webClient, 30)
	forms := make([]url.Values, 30)
	for i := range clients {
		clients[i] = newWebClient(t, c.url)
		_, page := clients[i].do("GET", "/login", nil)
		forms[i] = url.Values{"csrf": {csrfOf(t, page)}, "name": {"alice"}, "password": {fmt.Sprint("guess ", i)}, "next": {"/"}}
	}
	statuses := make([]int, 30)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range clients {
		wg.Go(func() {
			<-start
			statuses[i], _ = clients[i].do("POST", "/login", forms[i])
		})
	}
	close(start)
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusUnauthorized] != 5 || count[http.StatusTooManyRequests] != 25 {
		t.Fatalf("30 concurrent wrong logins answered %v, want 5 × 401 and 25 × 429", count)
	}
	if wrong, refused := c.metric(t, `sas_console_logins_total{result="wrong"}`), c.metric(t, `sas_console_logins_total{result="refused"}`); wrong != 5 || refused != 25 {
		t.Fatalf("passwords checked %v, refused unchecked %v; want 5 and 25", wrong, refused)
	}
	if status := newWebClient(t, c.url).login("alice", "alice's password"); status != http.StatusTooManyRequests {
		t.Fatalf("the right password after the limit: %d, want 429", status)
	}
}

// TestConsoleAccess: nobody gets in without logging in; the cookies are
// Secure, HttpOnly and SameSite; the login form has its own CSRF token;
// failed logins are rate-limited; a user removed from the file is logged
// out; a read-only console refuses every action.
func TestConsoleAccess(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	c := startConsole(t, p.stack, "SAS_CONSOLE_LOGIN_ATTEMPTS=3", "SAS_CONSOLE_LOGIN_WINDOW=1m")

	anon := newWebClient(t, c.url)
	for _, path := range []string{"/", "/orders", "/orders/" + messages.NewID(), "/alerts", "/dead-letters", "/workflows"} {
		if status, _ := anon.do("GET", path, nil); status != http.StatusSeeOther || !strings.HasPrefix(anon.last.Header.Get("Location"), "/login?next=") {
			t.Errorf("GET %s unlogged: %d to %q, want 303 to the login page", path, status, anon.last.Header.Get("Location"))
		}
	}
	if status, _ := anon.do("POST", "/orders/"+messages.NewID()+"/cancel", url.Values{"csrf": {"x"}}); status != http.StatusForbidden {
		t.Errorf("POST unlogged: %d, want 403", status)
	}
	if status, _ := anon.do("GET", "/overview/live", nil); status != http.StatusUnauthorized {
		t.Errorf("live overview unlogged: %d, want 401", status)
	}
	// The login form's token must come back with it.
	if status, _ := anon.do("POST", "/login", url.Values{"name": {"alice"}, "password": {"alice's password"}}); status != http.StatusForbidden {
		t.Errorf("a login without the form's token: %d, want 403", status)
	}

	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("alice logs in: %d", status)
	}
	session := alice.cookies["sas_session"]
	if session == nil || !session.Secure || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Path != "/" {
		t.Fatalf("session cookie %+v: want Secure, HttpOnly, SameSite=Strict", session)
	}
	if status, page := alice.do("GET", "/", nil); status != 200 || !strings.Contains(page, `id="live"`) {
		t.Fatalf("overview: %d", status)
	}
	// A login from another site is refused.
	_, page := anon.do("GET", "/login", nil)
	req, _ := http.NewRequest("POST", c.url+"/login", strings.NewReader(url.Values{"csrf": {csrfOf(t, page)}, "name": {"alice"}, "password": {"alice's password"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	req.AddCookie(&http.Cookie{Name: "sas_login", Value: anon.cookies["sas_login"].Value})
	if resp, err := anon.http.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a cross-site login: %v %v, want 403", resp.Status, err)
	}

	// Failed logins: after 3, even the right password waits, from this
	// address and for this name.
	mallory := newWebClient(t, c.url)
	for i := range 3 {
		if status := mallory.login("victor", "guess"); status != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i, status)
		}
	}
	if status := mallory.login("victor", "victor's password"); status != http.StatusTooManyRequests || mallory.last.Header.Get("Retry-After") == "" {
		t.Fatalf("the 4th try: %d (Retry-After %q), want 429 with Retry-After", status, mallory.last.Header.Get("Retry-After"))
	}
	if status := newWebClient(t, c.url).login("alice", "alice's password"); status != http.StatusTooManyRequests {
		t.Fatalf("another name from the same address: %d, want 429", status)
	}
	// alice's session is not touched by it.
	if status, _ := alice.do("GET", "/orders", nil); status != 200 {
		t.Fatalf("alice after the lockout: %d", status)
	}

	// A user removed from the file is logged out at the next request.
	data, err := os.ReadFile(c.users)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "alice:") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(c.users, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "alice logged out", func() bool {
		status, _ := alice.do("GET", "/orders", nil)
		return status == http.StatusSeeOther
	})
}

// TestConsoleIsReadyOnceItListens: a console slow to bind its pages'
// address (a failpoint waits a second before the listen) does not say it
// is ready before it has: the first request once /readyz said so is
// answered.
func TestConsoleIsReadyOnceItListens(t *testing.T) {
	t.Parallel()
	c := startConsole(t, newStack(t), "SAS_FAILPOINTS=console-slow-to-listen")
	if status, _ := newWebClient(t, c.url).do("GET", "/login", nil); status != http.StatusOK {
		t.Fatalf("GET /login once the console was ready: %d, want 200", status)
	}
}

// TestConsoleReadOnly: with SAS_CONSOLE_READ_ONLY an operator sees no
// action and every action is refused.
func TestConsoleReadOnly(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	held := messages.NewID()
	p.setFaults(t, `{"reserve_inventory":{"fail_orders":["`+held+`"]}}`)
	publish(t, amqpChannel(t), p.submit, messages.ContentType, held, holdOrder(held))
	p.waitTerminal(t, []string{held}, time.Minute)
	c := startConsole(t, p.stack, "SAS_CONSOLE_READ_ONLY=true")
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	status, page := alice.do("GET", "/orders/"+held, nil)
	if status != 200 || !strings.Contains(page, "read-only") || strings.Contains(page, `id="resubmit"`) || strings.Contains(page, `id="cancel"`) {
		t.Fatalf("order page on a read-only console: %d, actions shown or no read-only badge", status)
	}
	if status, _ := alice.do("GET", "/orders/"+held+"/cancel", nil); status != http.StatusForbidden {
		t.Fatalf("the cancel's confirmation: %d, want 403", status)
	}
	if status, _ := alice.do("POST", "/orders/"+held+"/cancel", url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusForbidden {
		t.Fatalf("a cancel on a read-only console: %d, want 403", status)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, held); n != 1 {
		t.Fatal("a read-only console changed the order")
	}
}

// holdOrder is a valid order of the workflow order_hold, held in error
// when a step fails.
func holdOrder(id string) []byte {
	return []byte(strings.Replace(badinput.ValidSubmitJSON(id), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1))
}

// TestConsoleRefusesBadInput: every parameter is checked; what is not
// there is a 404 page; nothing gives a 500; what the request carried is
// shown escaped.
func TestConsoleRefusesBadInput(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	ids := p.submitOrders(t, 3)
	p.waitTerminal(t, ids, time.Minute)
	c := startConsole(t, p.stack)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	_, page := alice.do("GET", "/", nil)
	csrf := csrfOf(t, page)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/orders/" + ids[0], 200},
		{"GET", "/orders/not-an-id", 404},
		{"GET", "/orders/" + messages.NewID(), 404},
		{"GET", "/orders/%3Cscript%3Ealert(1)%3C%2Fscript%3E", 404},
		{"GET", "/orders?status=bogus", 400},
		{"GET", "/orders?status=%3Cscript%3E", 400},
		{"GET", "/orders?workflow=%3Cscript%3Ealert(1)%3C%2Fscript%3E", 400},
		{"GET", "/orders?from=yesterday", 400},
		{"GET", "/orders?to=2026-13-45T99:00", 400},
		{"GET", "/orders?id=xyz", 400},
		{"GET", "/orders?id=" + strings.Repeat("a", 40), 400},
		{"GET", "/orders?after=not-a-cursor", 400},
		{"GET", "/orders?after=" + url.QueryEscape("MjAyNi0wMS0wMVQwMDowMDowMFp8bm90LWEtdXVpZA"), 400},
		{"GET", "/orders?id=" + ids[0][:6], 200},
		{"GET", "/orders?from=2020-01-01T00:00&to=2099-01-01T00:00&status=completed&workflow=order", 200},
		{"GET", "/orders/" + ids[0] + "/resubmit?step=abc", 400},
		{"GET", "/orders/" + ids[0] + "/resubmit?step=99", 404},
		{"GET", "/orders/" + ids[0] + "/signal", 400},
		{"GET", "/orders/" + ids[0] + "/signal?step=abc", 400},
		{"GET", "/orders/" + ids[0] + "/signal?step=99", 404},
		{"GET", "/orders/" + ids[0] + "/signal?step=1", 409},
		{"POST", "/orders/" + messages.NewID() + "/signal", 404},
		{"POST", "/orders/" + ids[0] + "/signal", 400},
		{"GET", "/alerts?all=yes", 400},
		{"GET", "/alerts/abc/ack", 404},
		{"GET", "/alerts/99999/ack", 404},
		{"GET", "/dead-letters/no-such-queue", 404},
		{"GET", "/dead-letters/submit/some-id/explode", 404},
		{"GET", "/no/such/page", 404},
		{"POST", "/orders/" + messages.NewID() + "/cancel", 404},
		{"POST", "/orders/" + ids[0] + "/cancel", 409},
		{"POST", "/orders/" + ids[0] + "/resubmit", 409},
		{"POST", "/alerts/424242/ack", 404},
	} {
		var form url.Values
		if tc.method == "POST" {
			form = url.Values{"csrf": {csrf}}
		}
		status, body := alice.do(tc.method, tc.path, form)
		if status != tc.want {
			t.Errorf("%s %s: %d, want %d\n%s", tc.method, tc.path, status, tc.want, body)
		}
		if strings.Contains(body, "<script>") {
			t.Errorf("%s %s: the answer holds an unescaped <script>", tc.method, tc.path)
		}
	}
	if strings.Contains(c.logText(), "panic") {
		t.Fatalf("the console panicked:\n%s", c.tail())
	}
}

// TestConsoleActionsAreRecorded: acknowledging an alert and requeueing a
// dead letter from the console, each through its confirmation page, are
// recorded with the console user.
func TestConsoleActionsAreRecorded(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	held := messages.NewID()
	p.setFaults(t, `{"reserve_inventory":{"fail_orders":["`+held+`"]}}`)
	ch := amqpChannel(t)
	publish(t, ch, p.submit, messages.ContentType, held, holdOrder(held))
	bad := "bad-" + testenv.RandomSuffix(8)
	publish(t, ch, p.submit, messages.ContentType, bad, []byte("not JSON at all"))
	p.waitTerminal(t, []string{held}, time.Minute)
	c := startConsole(t, p.stack)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	var alertID int
	if err := p.pool.QueryRow(t.Context(), `SELECT id FROM alerts WHERE order_id = $1`, held).Scan(&alertID); err != nil {
		t.Fatal(err)
	}
	ackPath := "/alerts/" + strconv.Itoa(alertID) + "/ack"
	status, page := alice.do("GET", ackPath, nil)
	if status != 200 || !strings.Contains(page, `id="confirm-button"`) {
		t.Fatalf("the acknowledgement's confirmation: %d", status)
	}
	if status, _ := alice.do("POST", ackPath, url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusSeeOther {
		t.Fatalf("acknowledge: %d", status)
	}
	if n := p.count(t, `SELECT count(*) FROM alerts WHERE id = $1 AND acked_as = 'console:alice' AND acked_by LIKE 'sas_console_%'`, alertID); n != 1 {
		t.Fatal("the acknowledgement is not recorded with the console user")
	}
	testenv.Eventually(t, 30*time.Second, "the bad submit listed", func() bool {
		_, page := alice.do("GET", "/dead-letters/submit", nil)
		return strings.Contains(page, bad)
	})
	requeue := "/dead-letters/submit/" + bad + "/requeue"
	status, page = alice.do("GET", requeue, nil)
	if status != 200 || !strings.Contains(page, "not JSON at all") {
		t.Fatalf("the requeue's confirmation: %d, without the message's body", status)
	}
	if status, _ := alice.do("POST", requeue, url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusSeeOther {
		t.Fatalf("requeue: %d", status)
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE action = 'dead letter requeue' AND target = $1 AND claimed_by = 'console:alice'`, "submit/"+bad); n != 1 {
		t.Fatal("the requeue is not recorded")
	}
	// Still bad, it is dead-lettered again, after a trip through its queue.
	testenv.Eventually(t, 30*time.Second, "the requeued message back among the dead letters", func() bool {
		_, page := alice.do("GET", "/dead-letters/submit", nil)
		return strings.Contains(page, bad)
	})
	if status, _ := alice.do("POST", "/dead-letters/submit/no-such-message/discard", url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusNotFound {
		t.Fatalf("discarding a message that is not there: %d, want 404", status)
	}
}

// TestConsoleWorkflowsSayWhatEachStepDoes: the Workflows page says of
// each step what it is and does (a 10-minute wait reads 10m, not its
// attempt's budget), and which steps it comes after, a join's as any N
// of them.
func TestConsoleWorkflowsSayWhatEachStepDoes(t *testing.T) {
	t.Parallel()
	g := runFile(t, "loan.yaml", `
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk, compensation: {action: unscore}}
      - {id: approval, wait: {signal: approved, timeout: 10m}, needs: [score]}
      - {action: cooling_off, delay: 90s, needs: [approval]}
      - {action: open, agent: core, needs: {any: 1, of: [cooling_off, score]}}
`, pipelineOpts{agents: 1, schedulers: 1})
	c := startConsole(t, g.stack, "SAS_WORKFLOWS_FILE="+g.file)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	status, page := alice.do("GET", "/workflows", nil)
	if status != 200 {
		t.Fatalf("workflows page: %d", status)
	}
	for _, want := range []string{"waits for signal approved, at most 10m, then fails", "<td>wait</td>", "<td>timer</td>", "waits 90s",
		"any 1 of cooling_off, score", "calls risk (", "unscore"} {
		if !strings.Contains(page, want) {
			t.Errorf("the workflows page has no %q", want)
		}
	}
	// Drawn as a graph: four boxes, an arrow from each step needed, the
	// join's two marked.
	if n, e, j := strings.Count(page, `class="gnode"`), strings.Count(page, `marker-end="url(#arrow)"`), strings.Count(page, `class="edge join-any"`); n != 4 || e != 4 || j != 2 {
		t.Errorf("the workflow's drawing has %d boxes, %d arrows, %d join arrows; want 4, 4, 2", n, e, j)
	}
}
