package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/migrations"
)

func TestSasctlMigrateConcurrently(t *testing.T) {
	t.Parallel()
	dbURL, pool := testenv.EmptyDatabase(t)
	environ := env("SAS_DATABASE_URL=" + dbURL)
	var wg sync.WaitGroup
	outs := make([]string, 3)
	codes := make([]int, 3)
	for i := range 3 {
		wg.Go(func() {
			var errOut string
			outs[i], errOut, codes[i] = sasctl(t, environ, "migrate")
			if codes[i] != 0 {
				t.Errorf("migrate %d: exit %d: %s", i, codes[i], errOut)
			}
		})
	}
	wg.Wait()
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	applied := strings.Count(strings.Join(outs, ""), "applied ")
	if applied != len(ms) {
		t.Fatalf("three concurrent runs applied %d files in all, want %d:\n%s", applied, len(ms), strings.Join(outs, "\n"))
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("schema_migrations has %d rows (%v), want %d", n, err, len(ms))
	}
	out, _, code := sasctl(t, environ, "migrate")
	if code != 0 || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate again: exit %d: %s", code, out)
	}
}

func TestSasctlSubmitShowListResubmit(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	start(t, "submitter", s.env)

	// The hold policy: a failed step waits for an operator.
	id := messages.NewID()
	file := filepath.Join(t.TempDir(), "order.json")
	body := strings.Replace(badinput.ValidSubmitJSON(id), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := sasctl(t, s.env, "submit", "--file", file); code != 0 {
		t.Fatalf("submit --file: exit %d: %s", code, errOut)
	}
	testenv.Eventually(t, 30*time.Second, "the order written", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE order_id = $1`, id) == 1
	})

	out, errOut, code := sasctl(t, s.env, "orders", "show", id)
	if code != 0 {
		t.Fatalf("orders show: exit %d: %s", code, errOut)
	}
	for _, want := range []string{id, "status    received", "reserve_inventory", "charge_payment", "create_shipment", "release_inventory", "compensation", "pending", "waiting", "history", "submitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("orders show lacks %q:\n%s", want, out)
		}
	}
	out, _, code = sasctl(t, s.env, "orders", "show", id, "--json")
	var d statestore.OrderDetail
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || len(d.Steps) != 6 || len(d.History) != 2 {
		t.Fatalf("orders show --json: exit %d: %s", code, out)
	}
	out, _, code = sasctl(t, s.env, "orders", "list", "--status", "received")
	if code != 0 || !strings.Contains(out, id) {
		t.Fatalf("orders list --status received: exit %d: %s", code, out)
	}
	out, _, code = sasctl(t, s.env, "orders", "list", "--status", "completed")
	if code != 0 || strings.Contains(out, id) {
		t.Fatalf("orders list --status completed: exit %d: %s", code, out)
	}

	// Clear errors for what makes no sense.
	badPayload := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(badPayload, []byte(`{"amount":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		desc string
		args []string
		code int
		want string
	}{
		{"resubmit an order not in error", []string{"orders", "resubmit", id}, 1, "only an order in error"},
		{"show an unknown order", []string{"orders", "show", messages.NewID()}, 1, "not found"},
		{"show a malformed id", []string{"orders", "show", "nope"}, 1, "not an order id"},
		{"list an unknown status", []string{"orders", "list", "--status", "lost"}, 1, "unknown status"},
		{"submit an invalid file", []string{"submit", "--file", writeTemp(t, `{"schema_version":1}`)}, 1, "not a valid order"},
		{"submit with neither file nor count", []string{"submit"}, 2, "either --file or"},
		{"submit an unknown workflow", []string{"submit", "--count", "3", "--workflow", "nope"}, 1, `unknown workflow "nope": the workflows of the built-in file (neither --workflows nor SAS_WORKFLOWS_FILE names one) are order, order_approval, order_hold, single; name another file with --workflows FILE or SAS_WORKFLOWS_FILE: nothing published`},
		{"submit a payload its workflow refuses", []string{"submit", "--count", "1", "--payload", badPayload}, 1, `payload at /: missing properties 'customer', 'items', 'currency': nothing published`},
		// Any workflow name is listed: orders may run another file's.
		{"list a workflow that is not a name", []string{"orders", "list", "--workflow", "no pe"}, 1, `--workflow may hold only letters`},
		{"list no orders", []string{"orders", "list", "--limit", "0"}, 2, "--limit must be at least 1"},
		{"list a negative number", []string{"orders", "list", "--limit", "-3"}, 2, "--limit must be at least 1"},
		{"resubmit a step that does not exist", []string{"orders", "resubmit", id, "--step", "99"}, 1, "has no step 99 (its steps are 1 to 6)"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
		{"unknown command of a group", []string{"orders", "frobnicate"}, 2, "unknown command"},
		{"a group alone", []string{"orders"}, 2, "orders list"},
		{"no command", nil, 2, "usage"},
	} {
		out, errOut, code := sasctl(t, s.env, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s: exit %d, output %q; want exit %d mentioning %q", tc.desc, code, out+errOut, tc.code, tc.want)
		}
	}

	// Put the order in error as a failed agent reply would, then resubmit
	// it as an operator.
	store := statestore.New(s.pool)
	ctx := context.Background()
	claimed, err := store.ClaimPending(ctx, "scheduler-test", 10, "")
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	longError := "out of stock: " + strings.Repeat("the warehouse answered 409 with a very long explanation of why ", 4) + strings.Repeat("x", 150)
	if _, err := store.ApplyReply(ctx, statestore.Reply{OrderID: id, Step: 1, Attempt: claimed[0].Attempt, Error: longError, Actor: "scheduler-test"}); err != nil {
		t.Fatal(err)
	}
	out, _, _ = sasctl(t, s.env, "orders", "show", id)
	if !strings.Contains(out, "status    error") || !strings.Contains(out, "out of stock") {
		t.Fatalf("orders show of a failed order lacks status or reason:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if n := len([]rune(line)); n > 100 {
			t.Errorf("orders show writes a line of %d columns:\n%s", n, line)
		}
	}
	out, errOut, code = sasctl(t, s.env, "orders", "resubmit", id, "--step", "1")
	if code != 0 || !strings.Contains(out, "[1] back to work") {
		t.Fatalf("orders resubmit: exit %d: %s %s", code, out, errOut)
	}
	d, err = store.GetOrder(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	last := d.History[len(d.History)-1]
	if d.Order.Status != statestore.OrderProcessing || d.Steps[0].ProcessState != statestore.StepPending ||
		!strings.HasPrefix(last.Actor, "operator:") {
		t.Fatalf("after resubmit: order %s, step %s, last history %+v", d.Order.Status, d.Steps[0].ProcessState, last)
	}

	// Filters.
	out, _, code = sasctl(t, s.env, "orders", "list", "--workflow", "order_hold", "--since", "1h")
	if code != 0 || !strings.Contains(out, id) {
		t.Fatalf("orders list --workflow order_hold --since 1h: exit %d: %s", code, out)
	}
	out, _, _ = sasctl(t, s.env, "orders", "list", "--workflow", "single")
	if strings.Contains(out, id) {
		t.Fatalf("orders list --workflow single lists an order of workflow order:\n%s", out)
	}

	// An operator ends the order: the reservation attempted is undone
	// (no scheduler runs here, so it stays compensating); a second cancel
	// makes no sense.
	out, errOut, code = sasctl(t, s.env, "orders", "cancel", id)
	if code != 0 || !strings.Contains(out, "undoing what was done") {
		t.Fatalf("orders cancel: exit %d: %s %s", code, out, errOut)
	}
	if d, err = store.GetOrder(ctx, id); err != nil || d.Order.Status != statestore.OrderCompensating || d.Steps[5].ProcessState != statestore.StepPending {
		t.Fatalf("after cancel: %+v %v", d, err)
	}
	_, errOut, code = sasctl(t, s.env, "orders", "cancel", id)
	if code != 1 || !strings.Contains(errOut, "only an order that has not ended can be cancelled") {
		t.Fatalf("second cancel: exit %d: %s", code, errOut)
	}
	_, errOut, code = sasctl(t, s.env, "orders", "cancel", messages.NewID())
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("cancel of an unknown order: exit %d: %s", code, errOut)
	}
}

func writeTemp(t *testing.T, body string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// portSpan is how many ports from its base a sasctl-run stack may take:
// its services at +1 to +9, and the second and third replicas of a
// scheduler or an agent ten and twenty above the first.
const portSpan = 30

// portBase picks the first port of a sasctl-run stack: 20,000 to 31,970,
// below Linux's ephemeral range (32768 and up), where outgoing
// connections take their ports, and above freeAddr's. Every port of
// its span is free now (RabbitMQ's distribution port, 25672, once fell on
// a second scheduler's, past the ten ports then checked), and no other
// test of this binary was given a span that overlaps it.
func portBase() int {
	for try := 0; ; try++ {
		base := 20000 + portSpan*rand.IntN((32000-20000)/portSpan)
		if _, taken := handedOut.LoadOrStore(fmt.Sprintf("span:%d", base), true); taken {
			continue
		}
		free := true
		for port := base; port < base+portSpan && free; port++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				free = false
				continue
			}
			ln.Close()
		}
		if free || try > 1000 {
			return base
		}
	}
}

// TestSasctlDev runs the local stack the way make demo does (without
// Prometheus) and checks its summary and that it leaves nothing running.
func TestSasctlDev(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	base := portBase()
	// The payment kind goes to a service of the test's own; the others to
	// the demo service.
	var charged atomic.Int64
	payment := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/charge_payment" {
			charged.Add(1)
		}
		_, _ = w.Write([]byte(`{"charged":true}`))
	}))
	t.Cleanup(payment.Close)
	endpoints := writeFile(t, "endpoints.yaml", fmt.Sprintf("endpoints:\n  payment: {url: %q}\n", payment.URL))
	out, errOut, code := sasctl(t, s.env, "dev", "--orders", "60", "--bin", binDir, "--prometheus-port", "0", "--endpoints", endpoints,
		"--port-base", strconv.Itoa(base), "--console-port", strconv.Itoa(base+7), "--api-port", strconv.Itoa(base+9), "--faults", `{"*":{"error_rate":0.1}}`)
	if code != 0 {
		t.Fatalf("sasctl dev: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "agent kinds payment: "+payment.URL+" (your service, from ") ||
		!strings.Contains(errOut, "agent kinds inventory, shipping: the demo service") {
		t.Errorf("sasctl dev does not say which kinds go where:\n%s", errOut)
	}
	if !regexp.MustCompile(`HTTP API: http://localhost:\d+/api/v1 \(operator token, shown once: SAS_API_TOKEN=sas_\d+_\S+\)`).MatchString(errOut) {
		t.Errorf("sasctl dev does not say where the API is with a token:\n%s", errOut)
	}
	if n := charged.Load(); n < 60 {
		t.Errorf("the payment service of the endpoints file was called %d times for 60 orders", n)
	}
	// Its folders (the logs, the console's users file) are gone.
	for _, re := range []*regexp.Regexp{regexp.MustCompile(`logs: (\S+)`), regexp.MustCompile(`users file (\S+)\)`)} {
		m := re.FindStringSubmatch(out + errOut)
		if m == nil {
			t.Fatalf("sasctl dev does not say %s:\n%s\n%s", re, out, errOut)
		}
		dir := m[1]
		if re.String() != `logs: (\S+)` {
			dir = filepath.Dir(dir)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sasctl dev left %s behind (%v)", dir, err)
		}
	}
	for _, want := range []string{"SUMMARY", "orders completed         60", "throughput", "latency submit->end p99", "agent retries", "logs: "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "60/60 ended") {
		t.Errorf("no progress line reached 60/60:\n%s", errOut)
	}
	// It says it stopped everything and how to keep it, and its hints
	// name the sasctl that ran.
	sasctlPath := filepath.Join(binDir, "sasctl")
	if !strings.Contains(errOut, "the stack was stopped") || !strings.Contains(errOut, "make demo DEMO_FLAGS=--keep") ||
		!strings.Contains(errOut, sasctlPath+" dev --keep") {
		t.Errorf("sasctl dev does not say it stopped the stack and how to keep it:\n%s", errOut)
	}
	if !strings.Contains(out, "inspect: "+sasctlPath+" orders list") {
		t.Errorf("the hints do not name the sasctl that ran (%s):\n%s", sasctlPath, out)
	}
	if n := s.count(t, `SELECT count(*) FROM orders WHERE status = 'completed'`); n != 60 {
		t.Fatalf("%d orders completed in the store", n)
	}
	// The console ran too (every process was ready before the orders were
	// submitted), with a user made for it.
	if !strings.Contains(errOut, fmt.Sprintf("console: http://localhost:%d/ (log in as admin, password ", base+7)) {
		t.Errorf("sasctl dev does not say where its console is and how to log in:\n%s", errOut)
	}
	for port := base + 1; port <= base+7; port++ {
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond); err == nil {
			conn.Close()
			t.Errorf("something still listens on %d after sasctl dev ended", port)
		}
	}
}

// TestSasctlDBUsers: logins made by sasctl db users act with their role's
// rights only.
func TestSasctlDBUsers(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	suffix := "_t" + testenv.RandomSuffix(8)
	t.Cleanup(func() {
		for _, r := range []string{"sas_submitter", "sas_scheduler"} {
			_, _ = s.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+r+suffix)
		}
	})
	env := append(append([]string{}, s.env...), "SAS_DB_PASSWORD_SUBMITTER=pw-one", "SAS_DB_PASSWORD_SCHEDULER=pw-two")
	for range 2 { // the second run updates the passwords
		out, errOut, code := sasctl(t, env, "db", "users", "--login-suffix", suffix)
		if code != 0 || strings.Count(out, "login ") != 2 {
			t.Fatalf("db users: exit %d: %s %s", code, out, errOut)
		}
	}
	if _, errOut, code := sasctl(t, s.env, "db", "users"); code != 1 || !strings.Contains(errOut, "SAS_DB_PASSWORD_") {
		t.Fatalf("db users with no password set: exit %d: %s", code, errOut)
	}
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("sas_submitter"+suffix, "pw-one")
	as, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer as.Close()
	var user string
	if err := as.QueryRow(context.Background(), `SELECT current_user`).Scan(&user); err != nil || user != "sas_submitter"+suffix {
		t.Fatalf("logged in as %q (%v)", user, err)
	}
	if _, err := statestore.New(as).ClaimPending(context.Background(), "x", 1, ""); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the submitter's login claimed steps: %v", err)
	}
}

// TestSasctlHelpOnEveryCommand: -h and --help on every command and group
// exit 0 and say what it does, its arguments, its flags and the
// environment it reads, even with a configuration that does not parse;
// --version says what was built.
func TestSasctlHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	broken := env("SAS_SHUTDOWN_TIMEOUT=soon", "SAS_AMQP_URL=amqp://sas:Top/Secret@h/")
	out, _, code := sasctl(t, broken, "--help")
	if code != 0 || !strings.Contains(out, "commands:") {
		t.Fatalf("sasctl --help: exit %d: %s", code, out)
	}
	var commands []string
	groups := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "  ") {
			continue
		}
		path, _, _ := strings.Cut(strings.TrimSpace(line), "  ")
		commands = append(commands, path)
		if g, _, ok := strings.Cut(path, " "); ok {
			groups[g] = true
		}
	}
	if len(commands) < 20 {
		t.Fatalf("the help lists %d commands:\n%s", len(commands), out)
	}
	for _, c := range commands {
		for _, h := range []string{"-h", "--help"} {
			out, errOut, code := sasctl(t, broken, append(strings.Fields(c), h)...)
			if code != 0 || !strings.Contains(out, "usage: sasctl "+c) || !strings.Contains(out, "environment:") || !strings.Contains(out, "SAS_LOG_LEVEL") {
				t.Errorf("sasctl %s %s: exit %d: %s %s", c, h, code, out, errOut)
			}
		}
	}
	for g := range groups {
		out, _, code := sasctl(t, broken, g, "-h")
		if code != 0 || !strings.Contains(out, "usage: sasctl "+g+" <command>") || !strings.Contains(out, g+" ") {
			t.Errorf("sasctl %s -h: exit %d: %s", g, code, out)
		}
	}
	// Flags, arguments and environment of a few.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"orders", "list", "-h"}, []string{"-status", "-workflow", "-since", "-limit", "SAS_DATABASE_URL", "SAS_DATABASE_PASSWORD"}},
		{[]string{"probe", "-h"}, []string{"usage: sasctl probe URL"}},
		{[]string{"submit", "--help"}, []string{"-file", "-count", "SAS_AMQP_URL", "SAS_AMQP_PASSWORD", "SAS_QUEUE_PREFIX"}},
		{[]string{"dlq", "requeue", "-h"}, []string{"ID | --reason R | --all", "before it is removed from the dead-letter queue"}},
		{[]string{"help", "alerts", "ack"}, []string{"usage: sasctl alerts ack ID"}},
	} {
		out, _, code := sasctl(t, broken, tc.args...)
		for _, w := range tc.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("sasctl %v: exit %d, lacks %q:\n%s", tc.args, code, w, out)
			}
		}
	}
	out, _, code = sasctl(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(out, "sasctl ") || !strings.Contains(out, "go1.") {
		t.Errorf("sasctl --version: exit %d: %s", code, out)
	}
}

// TestSasctlErrorsNameTheSettingToFix: what stops a command is said in
// one line that names the setting, without waiting for what cannot
// succeed.
func TestSasctlErrorsNameTheSettingToFix(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	empty, _ := testenv.EmptyDatabase(t)
	u, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("no_such_login_" + testenv.RandomSuffix(6))
	for _, tc := range []struct {
		desc    string
		environ []string
		args    []string
		want    string
		within  time.Duration
	}{
		{"no database", []string{"SAS_DATABASE_URL=postgres://postgres@127.0.0.1:1/sas"}, []string{"orders", "list"}, "cannot reach the database within 5s (SAS_DATABASE_URL)", 10 * time.Second},
		{"no schema", []string{"SAS_DATABASE_URL=" + empty}, []string{"orders", "list"}, "run `sasctl migrate` first", 10 * time.Second},
		{"a login the database refuses", []string{"SAS_DATABASE_URL=" + u.String()}, []string{"alerts", "list"}, "the database refused the login (check the user and password in SAS_DATABASE_URL, SAS_DATABASE_PASSWORD)", 5 * time.Second},
		{"no broker", []string{"SAS_AMQP_URL=amqp://guest:guest@127.0.0.1:1/"}, []string{"submit", "--count", "1"}, "cannot use the broker (SAS_AMQP_URL)", 10 * time.Second},
		{"a password the broker refuses", []string{"SAS_AMQP_URL=amqp://guest:wrong-" + testenv.RandomSuffix(6) + "@127.0.0.1:5672/"}, []string{"dlq", "list"}, "the broker refused the login", 8 * time.Second},
	} {
		began := time.Now()
		out, errOut, code := sasctl(t, append(append([]string{}, s.env...), tc.environ...), tc.args...)
		took := time.Since(began)
		if code != 1 || !strings.Contains(errOut, tc.want) || took > tc.within {
			t.Errorf("%s: exit %d after %v: %s%s; want exit 1 within %v saying %q", tc.desc, code, took, out, errOut, tc.within, tc.want)
		}
		if lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1; lines > 1 {
			t.Errorf("%s: %d lines on stderr, want one:\n%s", tc.desc, lines, errOut)
		}
		if strings.Contains(errOut, "wrong-") {
			t.Errorf("%s: the password is in the error: %s", tc.desc, errOut)
		}
	}
}

// TestSasctlPurgeAsksFirst: orders purge says how many orders it would
// delete and asks; anything but yes deletes nothing; --yes skips the
// question.
func TestSasctlPurgeAsksFirst(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	store := statestore.New(s.pool)
	var ids []string
	for range 3 {
		id := messages.NewID()
		ids = append(ids, id)
		hash := sha256.Sum256([]byte(id))
		o := statestore.NewOrder{OrderID: id, Workflow: "single", Payload: []byte(`{}`), PayloadHash: hash[:], Actor: "test",
			Steps: []statestore.NewStep{{Name: "work", Agent: "inventory", Timeout: time.Minute, MaxFailures: 1}}}
		if _, err := store.InsertOrder(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Forge(t, s.pool, `UPDATE orders SET status = 'completed', created_at = now() - interval '2 days',
		updated_at = now() - interval '2 days' WHERE order_id = ANY($1::uuid[])`, ids)
	purge := func(stdin string, args ...string) (string, int) {
		cmd := exec.Command(filepath.Join(binDir, "sasctl"), append([]string{"orders", "purge", "--older-than", "24h"}, args...)...)
		cmd.Env, cmd.Stdin = s.env, strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	if out, code := purge("n\n"); code != 1 || !strings.Contains(out, "delete 3 orders that ended more than 24h0m0s ago") ||
		!strings.Contains(out, "nothing deleted") {
		t.Fatalf("purge answered no: exit %d\n%s", code, out)
	}
	if n := s.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids); n != 3 {
		t.Fatalf("%d of 3 orders left after answering no", n)
	}
	if out, code := purge("", "--yes"); code != 0 || !strings.Contains(out, "deleted 3 orders") {
		t.Fatalf("purge --yes: exit %d\n%s", code, out)
	}
	if out, code := purge(""); code != 0 || !strings.Contains(out, "nothing to delete") {
		t.Fatalf("purge with nothing left: exit %d\n%s", code, out)
	}
}

// TestDevCountsTheRunsOwnOrders: sasctl dev's progress and summary count
// the orders it submitted, not the child orders their sub-processes
// start: with each child done well before its parent (the parent then
// waits out a timer), it waits for the parents and reports them alone.
func TestDevCountsTheRunsOwnOrders(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "loan.yaml", `
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk}
      - {id: kyc, workflow: kyc_check}
      - {action: cooling_off, delay: 3s}
  - name: kyc_check
    steps:
      - {action: check_id, agent: risk}
`)
	s := newStackFor(t, []string{"risk"})
	base := portBase()
	out, errOut, code := sasctl(t, s.env, "dev", "--workflows", file, "--workflow", "loan", "--payload", `{"applicant":"ann"}`,
		"--orders", "5", "--bin", binDir, "--prometheus-port", "0", "--port-base", fmt.Sprint(base), "--console-port", fmt.Sprint(base+7), "--api-port", "0")
	if code != 0 || !strings.Contains(out, "orders completed         5\n") || strings.Contains(out, "orders processing") {
		t.Fatalf("sasctl dev: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := s.count(t, `SELECT count(*) FROM orders WHERE parent_order IS NOT NULL AND status = 'completed'`); n != 5 {
		t.Fatalf("%d child orders completed, want 5", n)
	}
}
