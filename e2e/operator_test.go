package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// openAlerts returns the open alerts of an order, through sasctl.
func openAlerts(t *testing.T, environ []string, orderID string) []statestore.Alert {
	t.Helper()
	out := sasctlOK(t, environ, "alerts", "list", "--open", "--order", orderID, "--json")
	var alerts []statestore.Alert
	if err := json.Unmarshal([]byte(out), &alerts); err != nil {
		t.Fatalf("alerts list --json: %v\n%s", err, out)
	}
	return alerts
}

// TestAlertsAreReadWithoutTakingThem: two operators following alerts both
// see a new one; listing them again shows it again; acknowledging it
// records the database login, whatever name the operator gives or the
// environment claims.
func TestAlertsAreReadWithoutTakingThem(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	// Two tails, started before the alert is raised.
	type tailed struct {
		out  string
		code int
	}
	results := make(chan tailed, 2)
	var started sync.WaitGroup
	for range 2 {
		started.Add(1)
		go func() {
			cmd := exec.Command(filepath.Join(binDir, "sasctl"), "alerts", "tail", "--count", "1", "--timeout", "90s", "--poll", "100ms")
			cmd.Env = p.env
			stderr, _ := cmd.StderrPipe()
			var out strings.Builder
			cmd.Stdout = &out
			if err := cmd.Start(); err != nil {
				started.Done()
				results <- tailed{err.Error(), -1}
				return
			}
			// It follows once it says so.
			sc := bufio.NewScanner(stderr)
			for sc.Scan() && !strings.Contains(sc.Text(), "following") {
			}
			started.Done()
			for sc.Scan() {
			}
			err := cmd.Wait()
			code := 0
			if err != nil {
				code = -1
			}
			results <- tailed{out.String(), code}
		}()
	}
	started.Wait()
	held := messages.NewID()
	p.setFaults(t, `{"charge_payment":{"fail_orders":["`+held+`"]}}`)
	body := strings.Replace(badinput.ValidSubmitJSON(held), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)
	publish(t, amqpChannel(t), p.submit, messages.ContentType, held, []byte(body))
	for range 2 {
		r := <-results
		if r.code != 0 || !strings.Contains(r.out, held) || !strings.Contains(r.out, "failures 1") {
			t.Fatalf("alerts tail: exit %d: %s", r.code, r.out)
		}
	}
	for range 2 {
		if al := openAlerts(t, p.env, held); len(al) != 1 {
			t.Fatalf("open alerts after two reads: %+v", al)
		}
	}
	id := fmt.Sprint(openAlerts(t, p.env, held)[0].ID)
	// The environment claims to be alice; the database knows better.
	forged := append(append([]string{}, p.env...), "USER=alice", "LOGNAME=alice")
	out, errOut, code := sasctl(t, forged, "alerts", "ack", id)
	if code != 0 || !strings.Contains(out, "acknowledged by postgres") || !strings.Contains(out, `(as "alice")`) {
		t.Fatalf("alerts ack: exit %d: %s %s", code, out, errOut)
	}
	if out, _, code := sasctl(t, p.env, "alerts", "ack", id, "--as", "bob"); code != 0 || !strings.Contains(out, "already acknowledged by postgres") {
		t.Fatalf("second ack: %s", out)
	}
	if al := openAlerts(t, p.env, held); len(al) != 0 {
		t.Fatalf("open alerts after the ack: %+v", al)
	}
	out, _, code = sasctl(t, p.env, "alerts", "list", "--since", "1h")
	if code != 0 || !strings.Contains(out, held) || !strings.Contains(out, "by postgres") {
		t.Fatalf("alerts list: %s", out)
	}

	// Resubmit and cancel record the login, and the claimed name apart.
	p.setFaults(t, `{}`)
	if out, errOut, code := sasctl(t, forged, "orders", "resubmit", held); code != 0 {
		t.Fatalf("resubmit: %s %s", out, errOut)
	}
	p.waitTerminal(t, []string{held}, time.Minute)
	d, err := statestore.New(p.pool).GetOrder(t.Context(), held)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range d.History {
		if h.Reason == "operator resubmit" {
			found = true
			if h.Actor != "operator:postgres" || h.DBUser != "postgres" || h.ClaimedBy != "alice" {
				t.Errorf("the resubmit is recorded as %+v", h)
			}
		}
	}
	if !found {
		t.Fatalf("no resubmit in the history: %+v", d.History)
	}
	out, _, _ = sasctl(t, p.env, "orders", "show", held)
	if !strings.Contains(flat(out), `by operator:postgres (database login postgres, who gave the name "alice")`) {
		t.Fatalf("orders show does not say who resubmitted:\n%s", out)
	}
}

// TestDeadLettersCanBeReadRequeuedAndDiscarded: dlq list shows what is in
// the dead-letter queues without taking it; show prints one in full;
// requeue sends them back to their queue; discard asks first.
func TestDeadLettersCanBeReadRequeuedAndDiscarded(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	sub := start(t, "submitter", s.env)
	ch := amqpChannel(t)
	fixable := messages.NewID()
	// An order for a workflow that does not exist yet, and plain junk.
	publish(t, ch, s.submit, messages.ContentType, fixable,
		[]byte(strings.Replace(badinput.ValidSubmitJSON(fixable), `"amount":1999`, `"amount":1999,"workflow":"later"`, 1)))
	publish(t, ch, s.submit, messages.ContentType, "junk-1", []byte("not json at all"))
	publish(t, ch, s.submit, "text/plain", "junk-2", []byte(badinput.ValidSubmitJSON(messages.NewID())))
	testenv.Eventually(t, 30*time.Second, "three dead letters", func() bool {
		q, err := ch.QueueDeclarePassive(s.dlq, true, false, false, false, nil)
		return err == nil && q.Messages == 3
	})
	for range 2 { // reading takes nothing
		out, errOut, code := sasctl(t, s.env, "dlq", "list")
		if code != 0 || !strings.Contains(out, "junk-1") || !strings.Contains(out, "not_json") || !strings.Contains(out, "unknown_workflow") ||
			!strings.Contains(out, "wrong_content_type") || !strings.Contains(errOut, "3 dead letters") {
			t.Fatalf("dlq list: exit %d: %s %s", code, out, errOut)
		}
	}
	if out, _, code := sasctl(t, s.env, "dlq", "list", "submit", "--reason", "not_json"); code != 0 || strings.Count(out, "\n") != 2 || !strings.Contains(out, "junk-1") {
		t.Fatalf("dlq list --reason:\n%s", out)
	}
	out, _, code := sasctl(t, s.env, "dlq", "show", fixable)
	if code != 0 || !strings.Contains(out, `workflow "later" is not defined`) || !strings.Contains(out, s.submit) || !strings.Contains(out, `"amount":1999`) {
		t.Fatalf("dlq show:\n%s", out)
	}
	// Discard asks, and does nothing without a yes.
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), "dlq", "discard", "--reason", "not_json")
	cmd.Env = s.env
	cmd.Stdin = strings.NewReader("n\n")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "discard 1 dead letters for good?") {
		t.Fatalf("discard without yes: %v %s", err, out)
	}
	out, errOut, code := sasctl(t, s.env, "dlq", "discard", "--reason", "not_json", "--yes")
	if code != 0 || !strings.Contains(out, "discarded junk-1") {
		t.Fatalf("discard --yes: exit %d: %s %s", code, out, errOut)
	}
	// Requeue one by id: still bad, it comes back once more.
	if out, errOut, code := sasctl(t, s.env, "dlq", "requeue", "junk-2"); code != 0 || !strings.Contains(out, "requeued junk-2 to "+s.submit) {
		t.Fatalf("requeue: exit %d: %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 30*time.Second, "the requeued junk back in the dead-letter queue", func() bool {
		return sub.metric(t, `sas_dead_lettered_total{queue="`+s.submit+`",reason="wrong_content_type"}`) == 2
	})
	if out, errOut, code := sasctl(t, s.env, "dlq", "requeue", "no-such-id"); code == 0 || !strings.Contains(errOut, "no dead letter matched") {
		t.Fatalf("requeue of an unknown id: %s %s", out, errOut)
	}
	if _, errOut, code := sasctl(t, s.env, "dlq", "list", "nope"); code == 0 || !strings.Contains(errOut, "no input queue") {
		t.Fatalf("dlq list of an unknown queue: %s", errOut)
	}
	q, err := ch.QueueDeclarePassive(s.dlq, true, false, false, false, nil)
	if err != nil || q.Messages != 2 {
		t.Fatalf("%d dead letters left (%v), want the requeued junk and the unknown workflow", q.Messages, err)
	}
}

// TestRequeueSurvivesAKill: 1,000 dead letters requeued by a sasctl that
// is killed in the middle: every message is in its queue or still in the
// dead-letter queue (some may be in both); a second requeue finishes the
// job.
func TestRequeueSurvivesAKill(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ch := amqpChannel(t)
	if err := s.topo.Declare(ch); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	want := map[string]bool{}
	var pending []*amqp.DeferredConfirmation
	for i := range n {
		id := fmt.Sprintf("dead-%04d", i)
		want[id] = true
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), s.topo.DeadLetterExchange(), s.dlq, true, false, amqp.Publishing{
			ContentType: messages.ContentType, MessageId: id, DeliveryMode: amqp.Persistent, Body: []byte(`{"n":` + fmt.Sprint(i) + `}`),
			Headers: amqp.Table{broker.HeaderErrorReason: "not_json", broker.HeaderOriginalQueue: s.submit, broker.HeaderErrorDetail: "test"},
		})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if ok, err := dc.WaitContext(t.Context()); !ok || err != nil {
			t.Fatalf("dead letter not confirmed: %v", err)
		}
	}
	depth := func(queue string) int {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), "dlq", "requeue", "--all", "--queue", "submit")
	cmd.Env = s.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed once it has moved a third (a tight loop: a requeue of a
	// thousand takes a fraction of a second).
	for began := time.Now(); depth(s.submit) < n/3; time.Sleep(time.Millisecond) {
		if time.Since(began) > time.Minute {
			t.Fatal("the requeue moved nothing in a minute")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	movedAtKill := depth(s.submit)
	if movedAtKill >= n {
		t.Fatalf("the requeue had finished when it was killed")
	}
	// What the killed sasctl held unacknowledged goes back to the
	// dead-letter queue as the broker drops its consumer.
	testenv.Eventually(t, 30*time.Second, "the killed sasctl's consumer gone", func() bool {
		q, err := ch.QueueDeclarePassive(s.dlq, true, false, false, false, nil)
		return err == nil && q.Consumers == 0
	})
	browse := func(queue string) map[string]int {
		out, _, code := sasctl(t, s.env, "dlq", "list", "--json", "--limit", "5000", strings.TrimSuffix(strings.TrimPrefix(queue, s.topo.Prefix), ".dlq"))
		if code != 0 {
			t.Fatalf("dlq list of %s failed", queue)
		}
		var ds []struct {
			MessageID string `json:"message_id"`
		}
		if err := json.Unmarshal([]byte(out), &ds); err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, d := range ds {
			got[d.MessageID]++
		}
		return got
	}
	inDLQ := browse(s.dlq)
	inQueue := map[string]int{}
	for _, d := range drain(t, ch, s.submit, depth(s.submit), 30*time.Second) {
		inQueue[d.MessageId]++
		if d.Headers[broker.HeaderErrorReason] != nil || d.Headers["x-requeued-after"] != "not_json" {
			t.Fatalf("a requeued message kept its dead-letter headers: %v", d.Headers)
		}
	}
	for id := range want {
		if inDLQ[id] == 0 && inQueue[id] == 0 {
			t.Fatalf("%s was lost", id)
		}
	}
	if _, errOut, code := sasctl(t, s.env, "dlq", "requeue", "--all", "--queue", "submit"); code != 0 || !strings.Contains(errOut, fmt.Sprintf("requeued %d dead letters", len(inDLQ))) {
		t.Fatalf("the second requeue: exit %d: %s", code, errOut)
	}
	if d := depth(s.dlq); d != 0 {
		t.Fatalf("%d dead letters left after the second requeue", d)
	}
	t.Logf("killed with %d of %d requeued; both: %d", movedAtKill, n, func() int {
		both := 0
		for id := range inDLQ {
			if inQueue[id] > 0 {
				both++
			}
		}
		return both
	}())
}

// TestOperatorLoginWithAnyPassword: sasctl db users --operator makes a
// person's login whose password holds the characters that break URLs;
// the login works with the password given apart or percent-encoded in
// the URL, a wrong password stops sasctl at once, and what the login does
// is recorded under its name.
func TestOperatorLoginWithAnyPassword(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{})
	ctx := t.Context()
	login := "op_" + testenv.RandomSuffix(8)
	const password = `Top/Secret#1 @:%? "ü"`
	t.Cleanup(func() { _, _ = p.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+login) })
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), "db", "users", "--operator", login)
	cmd.Env = p.env
	cmd.Stdin = strings.NewReader(password + "\n")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "login "+login+" in role sas_operator") {
		t.Fatalf("db users --operator: %v\n%s", err, out)
	}
	// Loopback logins are trusted here, except members of this role.
	if _, err := p.pool.Exec(ctx, `GRANT sas_password_auth TO `+login); err != nil {
		testenv.Unavailable(t, "the role sas_password_auth (scripts/services.sh and scripts/test-postgres.sh make it)", err)
	}
	u, err := url.Parse(p.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(login)
	withLogin := func(kv ...string) []string {
		return append(append(append([]string{}, p.env...), "SAS_DATABASE_URL="+u.String()), kv...)
	}
	if _, errOut, code := sasctl(t, withLogin("SAS_DATABASE_PASSWORD=not it"), "orders", "list"); code != 1 || !strings.Contains(errOut, "refused the login") {
		if code == 0 {
			testenv.Unavailable(t, "password authentication of sas_password_auth's members (scripts/services.sh and scripts/test-postgres.sh add it to pg_hba.conf)", fmt.Errorf("a wrong password was accepted"))
		}
		t.Fatalf("a wrong password: exit %d: %s", code, errOut)
	}
	if out, errOut, code := sasctl(t, withLogin("SAS_DATABASE_PASSWORD="+password), "orders", "list"); code != 0 {
		t.Fatalf("the password given apart: exit %d: %s %s", code, out, errOut)
	}
	encoded := *u
	encoded.User = url.UserPassword(login, password)
	environ := append(append([]string{}, p.env...), "SAS_DATABASE_URL="+encoded.String())
	if out, errOut, code := sasctl(t, environ, "orders", "list"); code != 0 {
		t.Fatalf("the password encoded in the URL: exit %d: %s %s", code, out, errOut)
	}
	// What the login does is recorded as its own.
	held := messages.NewID()
	p.setFaults(t, `{"reserve_inventory":{"fail_orders":["`+held+`"]}}`)
	body := strings.Replace(badinput.ValidSubmitJSON(held), `"amount":1999`, `"amount":1999,"workflow":"order_hold"`, 1)
	publish(t, amqpChannel(t), p.submit, messages.ContentType, held, []byte(body))
	p.waitTerminal(t, []string{held}, time.Minute)
	if out, errOut, code := sasctl(t, withLogin("SAS_DATABASE_PASSWORD="+password, "USER=someone-else"), "orders", "cancel", held); code != 0 {
		t.Fatalf("cancel as the operator: exit %d: %s %s", code, out, errOut)
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND reason = 'operator cancel'
		AND actor = 'operator:' || $2 AND db_user = $2 AND claimed_by = 'someone-else'`, held, login); n == 0 {
		t.Fatalf("the cancel is not recorded as %s's", login)
	}
}
