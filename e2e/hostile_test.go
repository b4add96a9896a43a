package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/secrets"
)

// hostileCase is one way a user's service may answer, and what the order
// of a one-step workflow calling it must end with.
type hostileCase struct {
	name   string
	answer func(w http.ResponseWriter, r *http.Request)
	// status is the order's end; reason, what its step's last error says.
	status string
	reason []string
}

// TestHostileServiceEndsTheOrderWithTheTrueReason: a user's service
// answers 200 with JSON no message or store of sas can carry (a NUL,
// invalid UTF-8, half a surrogate pair, a key twice, a number past the
// store's range, nesting too deep: badinput.Answers), redirects to another
// host, refuses with an error text holding control characters, or echoes
// the endpoint's credentials in an error or an answer (as written,
// JSON-escaped as PHP writes JSON, past the point where an error's text
// is cut, in a redirect's Location). Through the real submitter,
// scheduler and agent, tracing on, each order ends at once (its step's
// budget is a minute; no supervisor runs) with the true reason on its
// step, an answer the store can keep completes the order with it as the
// result, no table of the store and no exported span holds a credential
// in any encoding or any part of one, no reply is dead-lettered, and the
// other host is never called.
func TestHostileServiceEndsTheOrderWithTheTrueReason(t *testing.T) {
	t.Parallel()
	var strayed atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		strayed.Add(1)
		_, _ = w.Write([]byte(`{"from":"another host"}`))
	}))
	t.Cleanup(other.Close)

	var cases []hostileCase
	for _, a := range badinput.Answers() {
		c := hostileCase{name: a.Name, answer: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(a.Body)
		}, status: "completed"}
		if !a.Keepable {
			c.status, c.reason = "error", []string{"answered 200 with a result the state store cannot keep"}
		}
		cases = append(cases, c)
	}
	// The endpoint's credentials, which a careless service echoes.
	const token, apiKey = "sk_live_Hostile42", "k3y-Hostile-77"
	echo := func(r *http.Request) string {
		return "Authorization=" + r.Header.Get("Authorization") + " X-Api-Key=" + r.Header.Get("X-Api-Key") + " via http://svc:" + apiKey + "@callback.example/x"
	}
	cases = append(cases,
		hostileCase{name: "a refusal echoing the credentials", answer: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = fmt.Fprintf(w, `{"error":%q}`, "bad credentials: "+echo(r))
		}, status: "error", reason: []string{"answered 401: bad credentials: Authorization=" + secrets.Mask + " X-Api-Key=" + secrets.Mask}},
		hostileCase{name: "an answer echoing the credentials", answer: func(w http.ResponseWriter, r *http.Request) {
			_, _ = fmt.Fprintf(w, `{"seen":{"authorization":%q,"key":%q,"all":%q}}`, r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), echo(r))
		}, status: "completed"},
		hostileCase{name: "a refusal echoing the credentials JSON-escaped", answer: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			// PHP's json_encode: / as \/, and here every other letter as \uXXXX.
			var esc strings.Builder
			for i, c := range "bad credentials: " + echo(r) {
				switch {
				case c == '/':
					esc.WriteString(`\/`)
				case i%2 == 0 && c < 0x80 && c != '"' && c != '\\':
					fmt.Fprintf(&esc, `\u%04x`, c)
				default:
					esc.WriteRune(c)
				}
			}
			_, _ = w.Write([]byte(`{"error":"` + esc.String() + `"}`))
		}, status: "error", reason: []string{"answered 403: bad credentials"}},
		hostileCase{name: "a refusal echoing the credentials past the cut", answer: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = fmt.Fprintf(w, `{"error":%q}`, strings.Repeat("x", 190)+" "+r.Header.Get("X-Api-Key")+" "+r.Header.Get("Authorization"))
		}, status: "error", reason: []string{"answered 401: xxxx"}},
		hostileCase{name: "a redirect whose Location echoes the key", answer: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/v1/steal?key="+url.QueryEscape(r.Header.Get("X-Api-Key")), http.StatusFound)
		}, status: "error", reason: []string{"answered 302", other.URL + "/v1/steal?key=" + secrets.Mask}},
		hostileCase{name: "a redirect to another host", answer: func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/v1/steal", http.StatusTemporaryRedirect)
		}, status: "error", reason: []string{"answered 307", other.URL + "/v1/steal"}},
		hostileCase{name: "an error text with control characters", answer: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte("{\"error\":\"line one\\nline two\\u0000\\u001b[31m and \xff\"}"))
		}, status: "error", reason: []string{"answered 422: line one line two"}},
		hostileCase{name: "a long error text", answer: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"` + strings.Repeat("é", 5000) + `"}`))
		}, status: "error", reason: []string{"answered 400: éé"}},
	)

	// Four steps whose results, each one the agent takes (180 KiB), add up
	// to more than a request can carry by the fourth.
	blob := []byte(`{"blob":"` + strings.Repeat("x", 180<<10) + `"}`)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/big") {
			_, _ = w.Write(blob)
			return
		}
		var i int
		if _, err := fmt.Sscanf(r.URL.Path, "/v1/act%d", &i); err != nil || i < 0 || i >= len(cases) {
			http.NotFound(w, r)
			return
		}
		cases[i].answer(w, r)
	}))
	t.Cleanup(svc.Close)

	var wf strings.Builder
	wf.WriteString("workflows:\n")
	for i := range cases {
		fmt.Fprintf(&wf, "  - name: hostile%d\n    policy: hold\n    steps:\n      - {action: act%d, agent: hostile, timeout: 60s}\n", i, i)
	}
	wf.WriteString("  - name: bigresults\n    policy: hold\n    steps:\n")
	for i := 1; i <= 4; i++ {
		fmt.Fprintf(&wf, "      - {action: big%d, agent: hostile, timeout: 60s}\n", i)
	}
	file := writeFile(t, "hostile.yaml", wf.String())
	endpoints := writeFile(t, "endpoints.yaml", fmt.Sprintf("endpoints:\n  hostile: {url: %q, headers_env: HOSTILE_HEADERS}\n", svc.URL))
	st := newStackFor(t, []string{"hostile"})
	rcv := newOTLPReceiver(t)
	st.env = append(st.env, rcv.env()...)
	wfEnv := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, submitterEnv: []string{wfEnv}, schedulerEnv: []string{wfEnv},
		agentEnv: []string{wfEnv, "SAS_AGENT_KINDS=hostile", "SAS_AGENT_ENDPOINTS_FILE=" + endpoints,
			"HOSTILE_HEADERS=Authorization: Bearer " + token + "\nX-Api-Key: " + apiKey,
			fmt.Sprint("SAS_AGENT_MAX_RESPONSE_BYTES=", messages.MaxResultBytes)}})

	ch := amqpChannel(t)
	ids := make([]string, len(cases))
	for i := range cases {
		ids[i] = messages.NewID()
		publish(t, ch, p.submit, messages.ContentType, ids[i], []byte(badinput.ValidSubmitV2JSON(ids[i], fmt.Sprintf("hostile%d", i), `{"n":1}`)))
	}
	big := messages.NewID()
	publish(t, ch, p.submit, messages.ContentType, big, []byte(badinput.ValidSubmitV2JSON(big, "bigresults", `{"n":1}`)))
	// Well within the step's budget of a minute: an order that waited for
	// its complete_by would not make it.
	p.waitTerminal(t, append([]string{big}, ids...), 40*time.Second)
	var bigStatus, bigErr string
	if err := p.pool.QueryRow(context.Background(), `SELECT o.status, coalesce(s.last_error, '') FROM orders o JOIN steps s USING (order_id)
		WHERE o.order_id = $1 AND s.step = 4`, big).Scan(&bigStatus, &bigErr); err != nil {
		t.Fatal(err)
	}
	if bigStatus != "error" || !strings.Contains(bigErr, "sas could not send the step's request") {
		t.Errorf("results too large together: the order ended %s, its fourth step says %q", bigStatus, bigErr)
	}
	for i, c := range cases {
		var status, lastErr string
		var result *string
		if err := p.pool.QueryRow(context.Background(), `SELECT o.status, coalesce(s.last_error, ''), s.result::text
			FROM orders o JOIN steps s ON s.order_id = o.order_id AND s.step = 1 WHERE o.order_id = $1`, ids[i]).Scan(&status, &lastErr, &result); err != nil {
			t.Fatal(err)
		}
		if status != c.status {
			t.Errorf("%s: the order ended %s (%q), want %s", c.name, status, lastErr, c.status)
			continue
		}
		for _, want := range c.reason {
			if !strings.Contains(lastErr, want) {
				t.Errorf("%s: the step's last error %q does not say %q", c.name, lastErr, want)
			}
		}
		if c.status == "error" && (result != nil || strings.Contains(lastErr, "complete_by")) {
			t.Errorf("%s: result %v, last error %q", c.name, result, lastErr)
		}
	}
	// Nothing the store keeps, in any table, holds a credential.
	tables, err := p.pool.Query(context.Background(), `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(tables, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// Whole or in part (a cut before redaction left the start of one),
	// raw or encoded.
	held := func(text string) string {
		for _, secret := range []string{token, apiKey} {
			if secrets.Holds(text, secret) || strings.Contains(text, secret[:9]) {
				return secret
			}
		}
		return ""
	}
	for _, table := range names {
		rows, err := p.pool.Query(context.Background(), `SELECT x::text FROM `+pgx.Identifier{table}.Sanitize()+` x`)
		if err != nil {
			t.Fatal(err)
		}
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range texts {
			if secret := held(text); secret != "" {
				t.Errorf("a row of %s holds the credential %s: %.300s", table, secret, text)
			}
		}
	}
	testenv.Eventually(t, 20*time.Second, "the agent's spans exported", func() bool {
		return strings.Contains(rcv.text(), "sas-agent")
	})
	for _, line := range strings.Split(rcv.text(), "\n") {
		if secret := held(line); secret != "" {
			t.Errorf("an exported span holds the credential %s: %.300s", secret, line)
		}
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND result::text LIKE '%' || $2 || '%'`, ids, secrets.Mask); n != 1 {
		t.Errorf("%d results show the credentials masked, want 1", n)
	}
	if n := queueDepth(t, ch, p.topo.DeadLetterQueue(messages.RepliesQueue)); n != 0 {
		t.Errorf("%d replies were dead-lettered", n)
	}
	if n := strayed.Load(); n != 0 {
		t.Errorf("the other host was called %d times", n)
	}
}

// queueDepth is how many messages queue holds now.
func queueDepth(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", queue, err)
	}
	return q.Messages
}

// TestRefusedReplyFailsItsStepAtOnce: an agent of another language
// replies with a result the scheduler refuses (a NUL in a string). The
// reply is dead-lettered with its reason as before, and the attempt it
// names fails for good at once with that reason, rather than running out
// a budget of a minute; a forged reply for an attempt that is not running
// changes nothing.
func TestRefusedReplyFailsItsStepAtOnce(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "custom.yaml", "workflows:\n  - name: custom\n    policy: hold\n    steps:\n      - {action: work, agent: custom, timeout: 60s}\n")
	st := newStackFor(t, []string{"custom"})
	wfEnv := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, withoutAgents: true, submitterEnv: []string{wfEnv}, schedulerEnv: []string{wfEnv}})
	ch := amqpChannel(t)
	id, other := messages.NewID(), messages.NewID()
	for _, o := range []string{id, other} {
		publish(t, ch, p.submit, messages.ContentType, o, []byte(badinput.ValidSubmitV2JSON(o, "custom", `{"n":1}`)))
	}
	testenv.Eventually(t, 30*time.Second, "both steps claimed", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND process_state = 'processing'`, []string{id, other}) == 2
	})
	reply := func(order string, attempt int) []byte {
		return []byte(fmt.Sprintf(`{"schema_version":1,"order_id":%q,"step":1,"attempt":%d,"outcome":"ok","result":{"note":"a\u0000b"}}`, order, attempt))
	}
	publish(t, ch, p.topo.Queue(messages.RepliesQueue), messages.ContentType, "bad-1", reply(id, 1))
	publish(t, ch, p.topo.Queue(messages.RepliesQueue), messages.ContentType, "bad-2", reply(other, 7)) // no such attempt
	p.waitTerminal(t, []string{id}, 20*time.Second)
	var status, lastErr string
	if err := p.pool.QueryRow(context.Background(), `SELECT o.status, s.last_error FROM orders o JOIN steps s USING (order_id)
		WHERE o.order_id = $1 AND s.step = 1`, id).Scan(&status, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "error" || !strings.Contains(lastErr, "the agent's reply could not be read: invalid_encoding") {
		t.Fatalf("the order ended %s with %q", status, lastErr)
	}
	testenv.Eventually(t, 20*time.Second, "both replies dead-lettered", func() bool {
		return queueDepth(t, ch, p.topo.DeadLetterQueue(messages.RepliesQueue)) == 2
	})
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'processing' AND attempt = 1`, other); n != 1 {
		t.Fatal("a reply naming an attempt that is not running changed the step")
	}
}

// TestCostlySchemaRefusesThePayloadNotTheSubmitter: a workflow's schema
// with a recursive anyOf whose branches both descend makes checking a
// payload take twice as long per level of nesting (a 57-byte payload
// nested 26 deep: minutes). The real submitter refuses it at once,
// dead-lettered invalid_payload with the reason and a rejected event to
// its reply_to, and goes on writing the orders after it.
func TestCostlySchemaRefusesThePayloadNotTheSubmitter(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "costly.yaml", badinput.CostlyWorkflow("custom"))
	st := newStackFor(t, []string{"custom"})
	sub := start(t, "submitter", append(append([]string{}, st.env...), "SAS_WORKFLOWS_FILE="+file))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(sub.tail())
		}
	})
	// A scheduler's relay sends the events to reply_to.
	start(t, "scheduler", append(append([]string{}, st.env...), "SAS_WORKFLOWS_FILE="+file))
	ch := amqpChannel(t)
	replyTo := "costly-" + testenv.RandomSuffix(6)
	if _, err := ch.QueueDeclare(replyTo, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	bad, good := messages.NewID(), messages.NewID()
	payload := badinput.CostlyPayload(26)
	withReply := func(id, payload string) []byte {
		return []byte(fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":"costly","reply_to":%q,"payload":%s}`, id, replyTo, payload))
	}
	publish(t, ch, st.submit, messages.ContentType, bad, withReply(bad, payload))
	publish(t, ch, st.submit, messages.ContentType, good, withReply(good, `{"a":[[]]}`))
	testenv.Eventually(t, 30*time.Second, "the order after it written", func() bool {
		return st.count(t, `SELECT count(*) FROM orders WHERE order_id = $1`, good) == 1
	})
	dl := drain(t, ch, st.dlq, 1, 10*time.Second)[0]
	if dl.Headers["x-error-reason"] != "invalid_payload" || !strings.Contains(fmt.Sprint(dl.Headers["x-error-detail"]), "would take more than") {
		t.Fatalf("dead letter %v: %v", dl.Headers["x-error-reason"], dl.Headers["x-error-detail"])
	}
	// The good order's own events (received, then its step's) may come
	// first: the refusal waits for the check to spend its budget, while
	// another worker writes the good order. Every event is read until the
	// refusal comes.
	var rejected, events int
	testenv.Eventually(t, 30*time.Second, "the refusal on "+replyTo, func() bool {
		for {
			d, ok, err := ch.Get(replyTo, true)
			if err != nil {
				t.Fatalf("get from %s: %v", replyTo, err)
			}
			if !ok {
				return rejected > 0
			}
			events++
			ev, err := messages.DecodeStatusEvent(d.Body)
			if err == nil && ev.OrderID == bad && ev.Status == messages.StatusRejected && ev.Reason == "invalid_payload" {
				rejected++
			}
		}
	})
	if rejected != 1 {
		t.Fatalf("reply_to heard of the refusal %d times in %d events", rejected, events)
	}
}
