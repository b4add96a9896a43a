package workflow_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

func TestBuiltin(t *testing.T) {
	t.Parallel()
	r := workflow.Builtin()
	wf, ok := r.Lookup("")
	if !ok || wf.Name != workflow.DefaultName || len(wf.Steps) != 3 {
		t.Fatalf("default workflow: %+v %v", wf, ok)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Fatal("found an unknown workflow")
	}
	if got := r.Agents(); len(got) != 3 {
		t.Fatalf("agents %v", got)
	}
}

func TestRowsPutCompensationsInReverse(t *testing.T) {
	t.Parallel()
	wf, _ := workflow.Builtin().Lookup("order")
	var got []string
	for _, r := range wf.Rows() {
		got = append(got, fmt.Sprintf("%s/%d", r.Name, r.Compensates))
	}
	want := "reserve_inventory/0 charge_payment/0 create_shipment/0 cancel_shipment/3 refund_payment/2 release_inventory/1"
	if strings.Join(got, " ") != want {
		t.Fatalf("rows %v, want %s", got, want)
	}
	if hold, _ := workflow.Builtin().Lookup("order_hold"); hold.Policy != workflow.Hold {
		t.Fatalf("order_hold policy %q", hold.Policy)
	}
}

// TestStepsSayWhatTheyDo: each kind of step says what it does in a
// person's words, its durations as they were written (a 10-minute wait
// reads 10m, not its attempt's budget), and a join which steps it waits
// for.
func TestStepsSayWhatTheyDo(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("describe.yaml", []byte(`
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk, timeout: 1500ms}
      - {id: approval, wait: {signal: approved, timeout: 10m}, needs: [score], when: "payload.amount > 1000"}
      - {id: nice, wait: {signal: nice, timeout: 2h, on_timeout: skip}, needs: []}
      - {action: cooling_off, delay: 90s, needs: [approval]}
      - {id: kyc, workflow: kyc_check, needs: []}
      - {action: open, agent: core, needs: {any: 2, of: [cooling_off, kyc, nice]}}
      - {action: notify, agent: mail, for_each: payload.people, needs: [open]}
  - name: kyc_check
    steps:
      - {action: check_id, agent: kyc}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("loan")
	want := []struct{ kind, does, after string }{
		{"action", "calls risk (1.5s an attempt)", ""},
		{"wait", "waits for signal approved, at most 10m, then fails; when payload.amount > 1000", "score"},
		{"wait", "waits for signal nice, at most 2h, then is skipped", ""},
		{"timer", "waits 90s", "approval"},
		{"sub-process", "runs workflow kyc_check", ""},
		{"action", "calls core (", "any 2 of cooling_off, kyc, nice"},
		{"action", "; for each of payload.people", "open"},
	}
	for i, st := range wf.Steps {
		if st.Kind() != want[i].kind || !strings.Contains(st.Does(), want[i].does) || st.After() != want[i].after || wf.After(i) != want[i].after {
			t.Errorf("step %s: %s %q after %q, want %s %q after %q", st.Ref(), st.Kind(), st.Does(), st.After(), want[i].kind, want[i].does, want[i].after)
		}
	}
	// A list: each step after the one before it.
	kyc, _ := reg.Lookup("kyc_check")
	kyc.Steps = append(kyc.Steps, workflow.Step{Name: "check_address", Agent: "kyc"})
	if kyc.Graph || kyc.After(0) != "" || kyc.After(1) != "check_id" {
		t.Fatalf("a list's steps come after %q and %q", kyc.After(0), kyc.After(1))
	}
}

// TestWebhooksAreReadAndChecked: a workflow's webhooks name an http(s)
// address and the environment variable holding their secret (never the
// secret), and the order ends they are told of (all three unless said);
// an address with a user, a fragment or another scheme, a variable that
// is no name, an event that is not an end, a webhook twice are refused
// at their line.
func TestWebhooksAreReadAndChecked(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("hooks.yaml", []byte(`
workflows:
  - name: shop
    webhooks:
      - {url: "https://hooks.example.com/sas", secret_env: SHOP_HOOK_SECRET}
      - {url: "http://127.0.0.1:9000/failed", secret_env: OPS_HOOK, events: [failed, error, step.awaiting], namespace: team-a}
      - {url: "http://127.0.0.1:9000/all", secret_env: OPS_HOOK, namespace: "*"}
    steps:
      - {action: charge, agent: pay}
`))
	if err != nil {
		t.Fatal(err)
	}
	shop, _ := reg.Lookup("shop")
	if len(shop.Webhooks) != 3 || shop.Webhooks[0].Namespace != "" || shop.Webhooks[1].Namespace != "team-a" || shop.Webhooks[2].Namespace != "*" {
		t.Fatalf("webhooks' namespaces %+v", shop.Webhooks)
	}
	shop.Webhooks = shop.Webhooks[:2]
	if len(shop.Webhooks) != 2 || !slices.Equal(shop.Webhooks[0].Events, []string{"completed", "failed", "error"}) ||
		!slices.Equal(shop.Webhooks[1].Events, []string{"failed", "error", "step.awaiting"}) || shop.Webhooks[0].SecretEnv != "SHOP_HOOK_SECRET" {
		t.Fatalf("webhooks %+v", shop.Webhooks)
	}
	_, err = workflow.Parse("bad.yaml", []byte(`
workflows:
  - name: shop
    webhooks:
      - {url: "https://user:pw@hooks.example.com/", secret_env: A}
      - {url: "ftp://hooks.example.com/", secret_env: A}
      - {url: "https://hooks.example.com/#x", secret_env: A}
      - {url: "https://hooks.example.com/a", secret_env: "s3cr3t-value"}
      - {url: "https://hooks.example.com/b", secret_env: B, events: [processing]}
      - {url: "https://hooks.example.com/c", secret_env: C}
      - {url: "https://hooks.example.com/c", secret_env: C}
      - {url: "https://hooks.example.com/d", secret_env: D, namespace: Team_A}
    steps:
      - {action: charge, agent: pay}
`))
	for _, want := range []string{"bad.yaml:5: url must not carry a user", "bad.yaml:6: url \"ftp://", "bad.yaml:7: url \"https://hooks.example.com/#x\" has a fragment",
		"bad.yaml:8: secret_env", "bad.yaml:9: event \"processing\"", "bad.yaml:11: webhook \"https://hooks.example.com/c\" is declared twice",
		"bad.yaml:12: webhook's namespace \"Team_A\" is not a name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("problems %v, without %q", err, want)
		}
	}
}

// TestDeadlineAndOnDeadline: a workflow's deadline and on_deadline are
// read and kept in its definition (so its version changes with them);
// a deadline out of bounds or an unknown on_deadline is a problem at its
// line.
func TestDeadlineAndOnDeadline(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("w.yaml", []byte(`
workflows:
  - name: w
    deadline: 36h
    on_deadline: fail
    steps: [{action: a, agent: x}]
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("w")
	if d, how := wf.Deadline(0); d != 36*time.Hour || how != workflow.Fail || !strings.Contains(string(wf.Definition()), `"deadline_ms":129600000`) {
		t.Fatalf("deadline %v %q, definition %s", d, how, wf.Definition())
	}
	for _, tc := range []struct{ keys, want string }{
		{"    deadline: 10ms\n", `deadline "10ms" is not a duration from 1s to 366d`},
		{"    deadline: 400d\n", `deadline "400d" is not a duration from 1s to 366d`},
		{"    on_deadline: retry\n", `on_deadline "retry" is not known; write compensate`},
	} {
		_, err := workflow.Parse("w.yaml", []byte("workflows:\n  - name: w\n"+tc.keys+"    steps: [{action: a, agent: x}]\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "w.yaml:3") {
			t.Fatalf("%q: got %v, want an error at line 3 saying %q", tc.keys, err, tc.want)
		}
	}
}

// TestInboundRoutes: an inbound route maps an event to an order (its key
// and payload) or to a signal by business key, through CEL over the
// event; a route that says neither or both, names an attribute the
// workflow lacks, or a secret that is not a variable's name, is a
// problem at its line.
func TestInboundRoutes(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("w.yaml", []byte(`
workflows:
  - name: w
    search_attributes: [{name: invoice, type: string, expr: payload.invoice}]
    inbound:
      - name: created
        secret_env: HOOK_SECRET
        start: {key: payload.id, payload: "{'invoice': payload.data.inv}"}
      - name: paid
        secret_env: HOOK_SECRET
        namespace: team-a
        signal: {name: paid, where: {invoice: payload.data.inv}, payload: payload.data}
    steps: [{action: a, agent: x}]
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("w")
	in, ok := wf.InboundRoute("created")
	if !ok || in.SignatureHeader != "Sas-Signature" {
		t.Fatalf("route %+v", in)
	}
	key, payload, err := in.Start.StartOf([]byte(`{"id": "evt_1", "data": {"inv": "INV-1"}}`))
	if err != nil || key != "evt_1" || string(payload) != `{"invoice":"INV-1"}` {
		t.Fatalf("start of the event: %q %s %v", key, payload, err)
	}
	if _, _, err := in.Start.StartOf([]byte(`{"data": {}}`)); err == nil {
		t.Fatal("an event without the key mapped to an order")
	}
	paid, _ := wf.InboundRoute("paid")
	if in.Namespace != "" || paid.Namespace != "team-a" {
		t.Fatalf("namespaces %q and %q, want the default one's and team-a", in.Namespace, paid.Namespace)
	}
	where, p, err := paid.Signal.SignalOf([]byte(`{"data": {"inv": "INV-1", "at": 5}}`))
	if err != nil || where["invoice"] != "INV-1" || string(p) != `{"at":5,"inv":"INV-1"}` {
		t.Fatalf("signal of the event: %v %s %v", where, p, err)
	}
	for _, tc := range []struct{ route, want string }{
		{"{name: r, secret_env: S}", "must say either start"},
		{"{name: r, secret_env: S, namespace: Team_A, start: {key: payload.id, payload: payload}}", `namespace "Team_A" is not a name`},
		{"{name: r, secret_env: lower, start: {key: payload.id, payload: payload}}", "is not the name of an environment variable"},
		{"{name: r, secret_env: S, signal: {name: s, where: {nope: payload.x}}}", `"nope", which is not a search attribute`},
		{"{name: r, secret_env: S, start: {key: 'payload.', payload: payload}}", "does not compile"},
	} {
		_, err := workflow.Parse("w.yaml", []byte("workflows:\n  - name: w\n    search_attributes: [{name: invoice, type: string, expr: payload.invoice}]\n    inbound:\n      - "+
			tc.route+"\n    steps: [{action: a, agent: x}]\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: got %v, want %q", tc.route, err, tc.want)
		}
	}
}
