package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
)

const inboundFile = `
workflows:
  - name: invoicing
    search_attributes:
      - {name: invoice, type: string, expr: payload.invoice}
    inbound:
      - name: created
        secret_env: E2E_PAYMENTS_SECRET
        start:
          key: payload.id
          payload: "{'invoice': payload.data.invoice, 'amount': payload.data.amount}"
      - name: paid
        secret_env: E2E_PAYMENTS_SECRET
        signature_header: X-Hub-Signature-256
        signal:
          name: paid
          where: {invoice: payload.data.invoice}
          payload: "{'paid_at': payload.created}"
      - name: created-a
        namespace: team-a
        secret_env: E2E_PAYMENTS_SECRET
        start: {key: payload.id, payload: "{'invoice': payload.data.invoice, 'amount': payload.data.amount}"}
      - name: paid-a
        namespace: team-a
        secret_env: E2E_PAYMENTS_SECRET
        signal: {name: paid, where: {invoice: payload.data.invoice}, payload: "{'paid_at': payload.created}"}
    steps:
      - {action: bill, agent: billing, timeout: 20s}
      - {id: payment, needs: [bill], wait: {signal: paid, timeout: 10m}}
      - {action: ship_goods, agent: billing, timeout: 20s, needs: [payment]}
`

// TestInboundEventsStartAndSignalOrders, with real binaries: a foreign
// event posted to a workflow's inbound route, signed with the route's
// secret, starts an order through CEL mappings (the same event again is
// the same order); a second route's event signals that order by its
// business key, and the order completes. A wrong or missing signature is
// refused and changes nothing; an unknown route is a 404. Routes of a
// namespace start orders in it and signal its orders alone, however the
// business keys of other namespaces' orders match.
func TestInboundEventsStartAndSignalOrders(t *testing.T) {
	t.Parallel()
	const secret = "e2e-inbound-secret-value"
	g := runFile(t, "inbound.yaml", inboundFile, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1})
	p := g.pipeline
	api := startAPI(t, p.stack, "", "SAS_WORKFLOWS_FILE="+g.file, "E2E_PAYMENTS_SECRET="+secret)
	sign := func(body string) string {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(body))
		return "sha256=" + hex.EncodeToString(mac.Sum(nil))
	}
	created := `{"id": "evt_1", "type": "invoice.created", "data": {"invoice": "INV-7", "amount": 1200}}`
	post := func(route, body string, header map[string]string) (int, []byte) {
		t.Helper()
		code, _, out := api.call(t, apiCall{method: http.MethodPost, path: "/api/v1/hooks/invoicing/" + route, body: body, header: header})
		return code, out
	}
	if code, out := post("created", created, map[string]string{"Sas-Signature": "sha256=" + strings.Repeat("0", 64)}); code != http.StatusUnauthorized {
		t.Fatalf("a wrong signature: %d %s", code, out)
	}
	if code, out := post("created", created, nil); code != http.StatusUnauthorized {
		t.Fatalf("no signature: %d %s", code, out)
	}
	if code, out := post("nope", created, map[string]string{"Sas-Signature": sign(created)}); code != http.StatusNotFound {
		t.Fatalf("an unknown route: %d %s", code, out)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE workflow = 'invoicing'`); n != 0 {
		t.Fatalf("%d orders written by refused events", n)
	}
	code, out := post("created", created, map[string]string{"Sas-Signature": sign(created)})
	var acc struct {
		OrderID string `json:"order_id"`
		Outcome string `json:"outcome"`
	}
	if code != http.StatusAccepted || json.Unmarshal(out, &acc) != nil || acc.Outcome != "inserted" {
		t.Fatalf("the created event: %d %s", code, out)
	}
	if code, out := post("created", created, map[string]string{"Sas-Signature": sign(created)}); code != http.StatusOK ||
		!strings.Contains(string(out), acc.OrderID) || !strings.Contains(string(out), "duplicate") {
		t.Fatalf("the same event again: %d %s", code, out)
	}
	testenv.Eventually(t, 30*time.Second, "the order awaiting its payment", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, acc.OrderID) == 1
	})
	d, err := statestore.New(p.pool).GetOrder(t.Context(), acc.OrderID)
	if err != nil || string(d.Order.Payload) != `{"amount": 1200, "invoice": "INV-7"}` {
		t.Fatalf("the order's payload %s (%v)", d.Order.Payload, err)
	}
	// team-a's routes: its own order of the same invoice, signalled alone.
	createdA := `{"id": "evt_a1", "data": {"invoice": "INV-7", "amount": 5}}`
	if code, out := post("created-a", createdA, map[string]string{"Sas-Signature": sign(createdA)}); code != http.StatusNotFound ||
		!strings.Contains(string(out), "team-a") {
		t.Fatalf("a route of a namespace that does not exist: %d %s", code, out)
	}
	if out, errOut, code := sasctl(t, p.stack.env, "namespaces", "add", "team-a"); code != 0 {
		t.Fatalf("namespaces add: %s %s", out, errOut)
	}
	var accA struct {
		OrderID string `json:"order_id"`
	}
	if code, out := post("created-a", createdA, map[string]string{"Sas-Signature": sign(createdA)}); code != http.StatusAccepted || json.Unmarshal(out, &accA) != nil {
		t.Fatalf("team-a's created event: %d %s", code, out)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND namespace = 'team-a'`, accA.OrderID); n != 1 {
		t.Fatalf("team-a's route wrote its order outside team-a")
	}
	testenv.Eventually(t, 30*time.Second, "team-a's order awaiting its payment", func() bool {
		return p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, accA.OrderID) == 1
	})
	paidA := `{"id": "evt_a2", "created": 1767225601, "data": {"invoice": "INV-7"}}`
	if code, out := post("paid-a", paidA, map[string]string{"Sas-Signature": sign(paidA)}); code != http.StatusAccepted ||
		!strings.Contains(string(out), accA.OrderID) || strings.Contains(string(out), acc.OrderID) {
		t.Fatalf("team-a's paid event: %d %s", code, out)
	}
	p.waitTerminal(t, []string{accA.OrderID}, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, acc.OrderID); n != 1 {
		t.Fatalf("team-a's payment reached the default namespace's order")
	}
	paid := `{"id": "evt_2", "created": 1767225600, "data": {"invoice": "INV-7"}}`
	if code, out := post("paid", paid, map[string]string{"X-Hub-Signature-256": sign(paid)}); code != http.StatusAccepted ||
		!strings.Contains(string(out), acc.OrderID) || strings.Contains(string(out), accA.OrderID) {
		t.Fatalf("the paid event: %d %s", code, out)
	}
	p.waitTerminal(t, []string{acc.OrderID}, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'completed'`, acc.OrderID); n != 1 {
		t.Fatalf("the order did not complete\n%s", p.stuck(t, []string{acc.OrderID}))
	}
	if strings.Contains(api.tail(), secret) {
		t.Fatal("the API's log shows the route's secret")
	}
}
