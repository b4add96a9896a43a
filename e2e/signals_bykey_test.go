package e2e

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

const byKeyFile = `
workflows:
  - name: loan_by_key
    search_attributes:
      - {name: applicant, type: string, expr: payload.applicant}
    steps:
      - {action: score, agent: lender, timeout: 20s}
      - {id: approval, needs: [score], wait: {signal: approved, timeout: 10m}}
      - {action: pay_out, agent: lender, timeout: 20s, needs: [approval]}
`

// TestSignalsByBusinessKey, with real binaries: a signal names its order
// by a search attribute's value through sasctl, the API and the signals
// queue; it reaches exactly the one waiting order, or every match when
// asked; none or several is a clear refusal (a problem, or a rejected
// event to the reply_to and a dead letter); and a signal by key racing a
// second matching order reaches one order, or is refused, never both.
func TestSignalsByBusinessKey(t *testing.T) {
	t.Parallel()
	g := runFile(t, "bykey.yaml", byKeyFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1})
	p := g.pipeline
	seven := g.submit(t, "loan_by_key", []string{`{"applicant": "7"}`})
	twins := g.submit(t, "loan_by_key", []string{`{"applicant": "42"}`, `{"applicant": "42"}`})
	awaiting := func(ids []string) func() bool {
		return func() bool {
			return p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND process_state = 'awaiting'`, ids) == len(ids)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the three orders awaiting their approval", awaiting(slices.Concat(seven, twins)))

	// sasctl: the one match.
	out, errOut, code := sasctl(t, p.env, "orders", "signal", "--workflow", "loan_by_key", "--where", "applicant=7", "approved", "--payload", `{"by":"ann"}`)
	if code != 0 || !strings.Contains(out, seven[0]) || !strings.Contains(out, "ended step") {
		t.Fatalf("sasctl signal by key: %d %s %s", code, out, errOut)
	}
	// sasctl: several, and none.
	if _, errOut, code := sasctl(t, p.env, "orders", "signal", "--workflow", "loan_by_key", "--where", "applicant=42", "approved"); code == 0 ||
		!strings.Contains(errOut, "ambiguous") {
		t.Fatalf("sasctl signal of two matches: %d %s", code, errOut)
	}
	if _, errOut, code := sasctl(t, p.env, "orders", "signal", "--workflow", "loan_by_key", "--where", "applicant=nobody", "approved"); code == 0 ||
		!strings.Contains(errOut, "no_match") {
		t.Fatalf("sasctl signal of no match: %d %s", code, errOut)
	}

	// The API: ambiguous, then all.
	api := startAPI(t, p.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	token := apiToken(t, p.stack, "bykey-operator", statestore.TokenOperator)
	code, _, body := api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/signals", token: token,
		body: `{"workflow": "loan_by_key", "where": {"applicant": "42"}, "name": "approved", "payload": {"by": "bob"}}`})
	if code != http.StatusConflict || !strings.Contains(string(body), "ambiguous") {
		t.Fatalf("POST /signals of two matches: %d %s", code, body)
	}
	code, _, body = api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/signals", token: token,
		body: `{"workflow": "loan_by_key", "where": {"applicant": "42"}, "name": "approved", "payload": {"by": "bob"}, "all": true}`})
	if code != http.StatusAccepted || !strings.Contains(string(body), twins[0]) || !strings.Contains(string(body), twins[1]) {
		t.Fatalf("POST /signals with all: %d %s", code, body)
	}
	code, _, body = api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/signals", token: token,
		body: `{"workflow": "loan_by_key", "where": {"applicant": 3.5, "x": [1]}, "name": "approved"}`})
	if code != http.StatusBadRequest {
		t.Fatalf("POST /signals with a list as a value: %d %s", code, body)
	}
	p.waitTerminal(t, slices.Concat(seven, twins), time.Minute)

	// The signals queue: no match is refused to the reply_to.
	ch := amqpChannel(t)
	replies := "e2e-bykey-replies." + messages.NewID()
	if _, err := ch.QueueDeclare(replies, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	sendByKey := func(applicant, id string) {
		body, err := messages.Encode(messages.Signal{SchemaVersion: 1, SignalID: id, Workflow: "loan_by_key",
			Where: map[string]any{"applicant": applicant}, Name: "approved", ReplyTo: replies})
		if err != nil {
			t.Fatal(err)
		}
		publish(t, ch, p.topo.Queue(messages.SignalsQueue), messages.ContentType, id, body)
	}
	sendByKey("nobody", "nomatch-1")
	refusals := func(reason string) func() bool {
		return func() bool {
			d, ok, err := ch.Get(replies, true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return false
			}
			ev, err := messages.DecodeStatusEvent(d.Body)
			return err == nil && ev.Status == messages.StatusRejected && ev.Reason == reason
		}
	}
	testenv.Eventually(t, 30*time.Second, "the no-match refusal told to the reply_to", refusals(statestore.SignalNoMatch))

	// A signal by key racing a second matching order: one order, or a
	// refusal, never both.
	first := g.submit(t, "loan_by_key", []string{`{"applicant": "99"}`})
	testenv.Eventually(t, 30*time.Second, "the first order awaiting", awaiting(first))
	var wg sync.WaitGroup
	var second []string
	wg.Go(func() { second = g.submit(t, "loan_by_key", []string{`{"applicant": "99"}`}) })
	wg.Go(func() { sendByKey("99", "race-1") })
	wg.Wait()
	both := slices.Concat(first, second)
	var signalled int
	testenv.Eventually(t, 30*time.Second, "the racing signal applied or refused", func() bool {
		signalled = p.count(t, `SELECT count(*) FROM signals WHERE order_id = ANY($1::uuid[]) AND signal_id LIKE 'race-1:%'`, both)
		if signalled > 0 {
			return true
		}
		return refusals(statestore.SignalAmbiguous)()
	})
	if signalled > 1 {
		t.Fatalf("a signal by key without all reached %d orders", signalled)
	}
}
