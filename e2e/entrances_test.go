package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// entrancesFile has a payload schema and a wait's schema that a legal
// recursive definition makes costly, a payload-only for_each with no
// when, a search attribute, and limits for the one agent kind; held is
// held in error at once (its when fails), for re-runs.
const entrancesFile = `
workflows:
  - name: loan
    payload_schema: &schema
      type: object
      required: [amount]
      properties:
        amount: {type: number, minimum: 1}
        code: {type: string, pattern: "^[A-Z]{3}$"}
        tree: {$ref: "#/$defs/n"}
      $defs:
        n:
          anyOf:
            - {type: array, items: {$ref: "#/$defs/n"}}
            - {type: array, items: {$ref: "#/$defs/n"}}
    search_attributes:
      - {name: customer, type: string, expr: "payload.customer"}
    steps:
      - id: approve
        wait:
          signal: approved
          timeout: 10m
          schema:
            type: object
            required: [by]
            properties:
              by: {type: string}
              tree: {$ref: "#/$defs/n"}
            $defs:
              n:
                anyOf:
                  - {type: array, items: {$ref: "#/$defs/n"}}
                  - {type: array, items: {$ref: "#/$defs/n"}}
      - {action: notify, agent: mail, needs: [approve], for_each: payload.items}
  - name: held
    policy: hold
    payload_schema: *schema
    steps:
      - {action: act, agent: mail, when: "payload.go"}
      - {action: notify, agent: mail, needs: [act], for_each: payload.items}
limits:
  mail: {rate: 50/s}
`

// verdict is what an entrance said of a value: the refusal's reason (""
// where the entrance has none to give, as a file's check) and its text.
type verdict struct {
	status int // the HTTP status, where there is one
	reason string
	text   string
}

// hostileValue is one value fed to every entrance it can reach: each must
// refuse it, with the reason (where it has one) and saying says.
type hostileValue struct {
	desc, reason, says string
	// saysInJSON, when set, is what an entrance that carries the value
	// inside a JSON body says: JSON's own rule (UTF-8 without NUL, for
	// every JSON body of every entrance) refuses it first.
	saysInJSON string
	// only names the entrances that take this value (nil: all of the
	// group's).
	only []string
}

// TestOneRuleAtEveryEntrance feeds the same hostile values to every
// entrance they can reach (the workflows file, sasctl, the console, the
// HTTP API, AMQP) and expects the same verdict from each: refused, with
// the same reason and words, and nothing changed. Payloads (a submit, a
// re-run, a schedule of the file): a schema violation, a payload too
// costly to check, a for_each list that is none. Signals: a payload its
// wait's schema refuses, one too costly to check (a signal of a few
// dozen bytes against a legal recursive schema), a name no step waits
// for, a name that is none. Limits: a floor above the rate, a burst
// without a rate, a count out of range, a kind that is no name. Filters:
// a value that is not UTF-8 or holds a NUL, a status and a time that are
// none.
func TestOneRuleAtEveryEntrance(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "entrances.yaml", entrancesFile)
	st := newStackFor(t, []string{"mail"})
	wfEnv := "SAS_WORKFLOWS_FILE=" + file
	st.env = append(st.env, wfEnv)
	start(t, "submitter", st.env)
	start(t, "scheduler", append(append([]string{}, st.env...), "SAS_SCHEDULER_POLL_INTERVAL=200ms"))
	api := startAPI(t, st, "")
	ops := apiToken(t, st, "ops", "operator")
	con := startConsole(t, st)
	web := newWebClient(t, con.url)
	if status := web.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("console login: %d", status)
	}
	ch := amqpChannel(t)
	replies := "e2e-entrances." + messages.NewID()
	if _, err := ch.QueueDeclare(replies, false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	// refusal publishes body to queue with reply_to and reads the rejected
	// event that answers it.
	refusal := func(queue, body string) verdict {
		t.Helper()
		corr := messages.NewID()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
			ContentType: messages.ContentType, MessageId: corr, CorrelationId: corr, ReplyTo: replies, DeliveryMode: amqp.Persistent, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("not confirmed: %v", err)
		}
		var got verdict
		testenv.Eventually(t, 30*time.Second, "the refusal told to reply_to", func() bool {
			for {
				d, ok, err := ch.Get(replies, true)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					return false
				}
				if d.CorrelationId != corr {
					continue
				}
				var ev messages.StatusEvent
				if err := json.Unmarshal(d.Body, &ev); err != nil {
					t.Fatal(err)
				}
				got = verdict{reason: ev.Reason, text: ev.Detail}
				return true
			}
		})
		return got
	}
	problem := func(c apiCall) verdict {
		t.Helper()
		c.token = ops
		code, h, b := api.call(t, c)
		if code < 400 || code >= 500 {
			return verdict{status: code, text: string(b)}
		}
		p := problemOf(t, h, b)
		reason, _ := p["reason"].(string)
		detail, _ := p["detail"].(string)
		return verdict{status: code, reason: reason, text: detail}
	}
	cli := func(args ...string) verdict {
		t.Helper()
		out, errOut, code := sasctl(t, st.env, args...)
		if code == 0 {
			return verdict{text: "accepted: " + out}
		}
		return verdict{status: code, text: flat(out + " " + errOut)}
	}
	page := func(method, path string, form url.Values) verdict {
		t.Helper()
		if form != nil {
			_, p := web.do("GET", path, nil)
			form.Set("csrf", csrfOf(t, p))
		}
		code, body := web.do(method, path, form)
		return verdict{status: code, text: html.UnescapeString(body)}
	}
	fileCheck := func(text string) verdict {
		t.Helper()
		f := filepath.Join(t.TempDir(), "check.yaml")
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return cli("workflows", "check", f)
	}
	expect := func(group string, v hostileValue, entrance string, got verdict, reasonToo bool) {
		t.Helper()
		if strings.HasPrefix(got.text, "accepted") || (got.status >= 200 && got.status < 400) {
			t.Errorf("%s %q at %s: taken (%d) %.300s", group, v.desc, entrance, got.status, got.text)
			return
		}
		if got.status >= 500 {
			t.Errorf("%s %q at %s: %d, a failure of sas, not a refusal: %.300s", group, v.desc, entrance, got.status, got.text)
		}
		if len(got.text) > messages.MaxReasonBytes && got.reason != "" {
			t.Errorf("%s %q at %s: a detail of %d bytes, past the bound of %d", group, v.desc, entrance, len(got.text), messages.MaxReasonBytes)
		}
		if !strings.Contains(got.text, v.says) {
			t.Errorf("%s %q at %s: says %.400q, want it to say %q", group, v.desc, entrance, got.text, v.says)
		}
		if reasonToo && got.reason != v.reason && !strings.Contains(got.text, "("+v.reason+")") && !strings.Contains(got.text, v.reason+":") {
			t.Errorf("%s %q at %s: reason %q (%.200s), want %s", group, v.desc, entrance, got.reason, got.text, v.reason)
		}
	}
	takes := func(v hostileValue, entrance string) bool {
		if v.only == nil {
			return true
		}
		for _, e := range v.only {
			if e == entrance {
				return true
			}
		}
		return false
	}

	// An order held in error (its when fails at its claim), for re-runs;
	// an order awaiting its signal, for signals.
	held, loan := messages.NewID(), messages.NewID()
	publish(t, ch, st.submit, messages.ContentType, held, []byte(badinput.ValidSubmitV2JSON(held, "held", `{"amount":5,"items":[]}`)))
	publish(t, ch, st.submit, messages.ContentType, loan, []byte(badinput.ValidSubmitV2JSON(loan, "loan", `{"amount":5,"items":[],"customer":"c1"}`)))
	testenv.Eventually(t, 60*time.Second, "one order held, one awaiting", func() bool {
		return st.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error'`, held) == 1 &&
			st.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, loan) == 1
	})
	snapshot := func() string {
		var s string
		if err := st.pool.QueryRow(context.Background(), `SELECT concat_ws(',', (SELECT count(*) FROM orders), (SELECT count(*) FROM steps),
			(SELECT count(*) FROM transitions), (SELECT count(*) FROM signals), (SELECT count(*) FROM order_payloads),
			(SELECT count(*) FROM bulk_jobs), (SELECT count(*) FROM agent_limits WHERE set_by IS NOT NULL),
			(SELECT max(updated_at) FROM orders), (SELECT max(updated_at) FROM steps))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()

	deep := func(n int) string { return strings.Repeat("[", n) + "1" + strings.Repeat("]", n) }
	payloads := []struct {
		hostileValue
		payload string
	}{
		{hostileValue{desc: "a payload its schema refuses", reason: messages.ReasonInvalidPayload, says: "at /amount"}, `{"amount":0,"items":[]}`},
		{hostileValue{desc: "a payload too costly to check", reason: messages.ReasonInvalidPayload, says: "would take more than 50000 steps"},
			`{"amount":1,"items":[],"tree":` + deep(26) + `}`},
		{hostileValue{desc: "a violation quoting 20 KB of the payload", reason: messages.ReasonInvalidPayload, says: "at /code"},
			`{"amount":1,"items":[],"code":"` + strings.Repeat("x", 20000) + `"}`},
		{hostileValue{desc: "a for_each list that is null", reason: messages.ReasonInvalidPayload, says: "step notify: for_each"}, `{"amount":1,"items":null}`},
		{hostileValue{desc: "a for_each list that is missing", reason: messages.ReasonInvalidPayload, says: "no such key: items"}, `{"amount":1}`},
	}
	for _, c := range payloads {
		v := c.hostileValue
		id := messages.NewID()
		submit := badinput.ValidSubmitV2JSON(id, "loan", c.payload)
		told := fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":"loan","reply_to":%q,"payload":%s}`, id, replies, c.payload)
		expect("payload", v, "AMQP submit", refusal(st.submit, told), true)
		expect("payload", v, "API submit", problem(apiCall{method: "POST", path: "/api/v1/orders", body: submit}), true)
		expect("payload", v, "sasctl submit --file", cli("submit", "--file", writeTemp(t, submit)), true)
		expect("payload", v, "API re-run", problem(apiCall{method: "POST", path: "/api/v1/orders/" + held + "/rerun",
			body: `{"payload":` + c.payload + `}`}), true)
		expect("payload", v, "console re-run", page("POST", "/orders/"+held+"/rerun", url.Values{"payload": {c.payload}, "step": {""}}), true)
		expect("payload", v, "workflows file (a schedule)", fileCheck(entrancesFile+
			"schedules:\n  - {name: nightly, workflow: loan, cron: \"0 3 * * *\", payload: "+c.payload+"}\n"), false)
	}

	signals := []struct {
		hostileValue
		name, payload string
	}{
		{hostileValue{desc: "a payload its wait's schema refuses", reason: "invalid_payload", says: "missing property 'by'"}, "approved", `{"who":"x"}`},
		{hostileValue{desc: "a payload too costly to check", reason: "invalid_payload", says: "would take more than 50000 steps"},
			"approved", `{"by":"x","tree":` + deep(26) + `}`},
		{hostileValue{desc: "a name no step waits for", reason: "no_such_wait", says: "its steps wait for approved",
			only: []string{"AMQP", "API", "sasctl"}}, "rejected", `{"by":"x"}`},
		{hostileValue{desc: "a name that is none", reason: messages.ReasonInvalidValue, says: "may hold only letters",
			only: []string{"AMQP", "API", "sasctl"}}, "approved!", `{"by":"x"}`},
	}
	for _, c := range signals {
		v := c.hostileValue
		if takes(v, "AMQP") {
			body := fmt.Sprintf(`{"schema_version":1,"signal_id":%q,"order_id":%q,"name":%q,"payload":%s,"reply_to":%q}`,
				messages.NewID(), loan, c.name, c.payload, replies)
			expect("signal", v, "AMQP", refusal(st.topo.Queue(messages.SignalsQueue), body), true)
		}
		if takes(v, "API") {
			expect("signal", v, "API", problem(apiCall{method: "POST", path: "/api/v1/orders/" + loan + "/signals/" + url.PathEscape(c.name), body: c.payload}), true)
		}
		if takes(v, "sasctl") {
			expect("signal", v, "sasctl", cli("orders", "signal", loan, c.name, "--payload", c.payload, "--wait", "2s"), true)
		}
		if takes(v, "console") {
			expect("signal", v, "console", page("POST", "/orders/"+loan+"/signal", url.Values{"step": {"1"}, "payload": {c.payload}}), true)
		}
	}

	limits := []struct {
		hostileValue
		kind, yaml string
		flags      []string
		form       url.Values
	}{
		{hostileValue{desc: "a floor above the rate", says: "min_rate (10/s) is above rate (5/s)"}, "mail", "{rate: 5/s, min_rate: 10/s}",
			[]string{"--rate", "5/s", "--min-rate", "10/s"}, url.Values{"rate": {"5/s"}, "min_rate": {"10/s"}}},
		{hostileValue{desc: "a burst without a rate", says: "a burst or a min_rate needs a rate"}, "mail", "{max_in_flight: 4, burst: 3}",
			[]string{"--rate", "none", "--max-in-flight", "4", "--burst", "3"}, url.Values{"max_in_flight": {"4"}, "burst": {"3"}}},
		{hostileValue{desc: "a count out of range", says: "from 1 to 1000000"}, "mail", "{max_in_flight: 0}",
			[]string{"--max-in-flight", "0"}, url.Values{"max_in_flight": {"0"}, "rate": {"50/s"}}},
		{hostileValue{desc: "a kind that is no name", says: `agent kind "Mail Kind" is not a name`, only: []string{"file", "sasctl"}},
			"Mail Kind", "{rate: 5/s}", []string{"--rate", "5/s"}, nil},
	}
	for _, c := range limits {
		v := c.hostileValue
		expect("limits", v, "workflows file", fileCheck(strings.Replace(entrancesFile, "  mail: {rate: 50/s}", fmt.Sprintf("  %q: %s", c.kind, c.yaml), 1)), false)
		expect("limits", v, "sasctl", cli(append([]string{"limits", "set", c.kind}, c.flags...)...), false)
		if takes(v, "console") {
			expect("limits", v, "console", page("POST", "/limits/"+c.kind+"/set", c.form), false)
		}
	}

	filters := []struct {
		hostileValue
		query url.Values
		flags []string // nil: no sasctl form (argv holds no NUL; sasctl has --since, not --from)
	}{
		{hostileValue{desc: "a value that is not UTF-8", says: "is not a string, the type of customer", saysInJSON: "not valid UTF-8"},
			url.Values{"where": {"customer=\xff"}}, []string{"--where", "customer=\xff"}},
		{hostileValue{desc: "a value holding a NUL", says: "is not a string, the type of customer", saysInJSON: "NUL character"},
			url.Values{"where": {"customer=a\x00b"}}, nil},
		{hostileValue{desc: "a status that is none", says: `unknown status "bogus": want one of`}, url.Values{"status": {"bogus"}}, []string{"--status", "bogus"}},
		{hostileValue{desc: "a time that is none", says: `from "2026-13-45" is not a time`}, url.Values{"from": {"2026-13-45"}}, nil},
	}
	for _, c := range filters {
		v := c.hostileValue
		expect("filter", v, "API list", problem(apiCall{method: "GET", path: "/api/v1/orders?" + c.query.Encode()}), false)
		inJSON := v
		if v.saysInJSON != "" {
			inJSON.says = v.saysInJSON
		}
		expect("filter", inJSON, "API bulk", problem(apiCall{method: "POST", path: "/api/v1/bulk/cancel", body: rawFilterBody(c.query)}), false)
		expect("filter", v, "console list", page("GET", "/orders?"+c.query.Encode(), nil), false)
		expect("filter", v, "console bulk", page("GET", "/bulk/cancel?"+c.query.Encode(), nil), false)
		if c.flags != nil {
			expect("filter", v, "sasctl", cli(append([]string{"orders", "list"}, c.flags...)...), false)
		}
	}

	if after := snapshot(); after != before {
		t.Errorf("refused values changed the store: %s, then %s", before, after)
	}

	// Every refusal reaches its sender: a callback whose token sas never
	// made, and one that cannot be read, name no order, and are told to
	// their reply_to all the same.
	forged := refusal(st.topo.Queue(messages.SignalsQueue), fmt.Sprintf(`{"schema_version":1,"token":"st1.forged","name":"complete","payload":{},"reply_to":%q}`, replies))
	if forged.reason != "invalid_token" {
		t.Errorf("a forged token: told %+v, want invalid_token", forged)
	}
	unread := refusal(st.topo.Queue(messages.SignalsQueue), fmt.Sprintf(`{"schema_version":1,"token":"st1.x","name":"done","reply_to":%q}`, replies))
	if unread.reason != messages.ReasonInvalidValue {
		t.Errorf("an unreadable callback: told %+v, want invalid_value", unread)
	}
	// Every queue sas reads has its dead letters listed, the signals' too.
	out, errOut, code := sasctl(t, st.env, "dlq", "list", "signals")
	if code != 0 || !strings.Contains(out, "invalid_token") || !strings.Contains(out, "invalid_payload") {
		t.Errorf("sasctl dlq list signals: exit %d\n%s%s", code, out, errOut)
	}
	if _, p := web.do("GET", "/dead-letters", nil); !strings.Contains(p, `href="/dead-letters/signals"`) {
		t.Errorf("the console's dead letters leave out the signals:\n%s", p)
	}
	if code, p := web.do("GET", "/dead-letters/signals", nil); code != http.StatusOK || !strings.Contains(p, "invalid_token") {
		t.Errorf("the console's signals dead letters: %d\n%.2000s", code, p)
	}
}

// rawFilterBody is a bulk dry run's body of the filter q, its values
// written as they are (a byte that is not UTF-8 stays one; a NUL is
// written \u0000).
func rawFilterBody(q url.Values) string {
	quote := func(v string) string {
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\x00", `\u0000`).Replace(v) + `"`
	}
	var parts []string
	for k, vs := range q {
		if k == "where" {
			var ws []string
			for _, w := range vs {
				ws = append(ws, quote(w))
			}
			parts = append(parts, quote(k)+":["+strings.Join(ws, ",")+"]")
		} else {
			parts = append(parts, quote(k)+":"+quote(vs[0]))
		}
	}
	return `{"filter":{` + strings.Join(parts, ",") + `},"dry_run":true}`
}
