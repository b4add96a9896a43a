package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
)

// TestAPIRefusesBadInputWithProblems: every malformed submit of the bad
// input catalogue, and bad ids, filters, cursors, timeouts, headers,
// tokens, sizes and bodies on every other route, are answered 4xx with a
// problem document (the catalogue's reason for a submit) and change
// nothing; nothing is a 500.
func TestAPIRefusesBadInputWithProblems(t *testing.T) {
	t.Parallel()
	st := newStack(t)
	api := startAPI(t, st, "")
	app, ops := apiToken(t, st, "app", "submitter"), apiToken(t, st, "ops", "operator")
	// One good order, so that refusals about an order that exists are
	// tried too.
	good := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: badinput.ValidSubmitV2JSON(good, "order", badinput.GoodOrderPayload)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	snapshot := func() string {
		var s string
		if err := st.pool.QueryRow(t.Context(), `SELECT concat_ws(',', (SELECT count(*) FROM orders), (SELECT count(*) FROM steps),
			(SELECT count(*) FROM transitions), (SELECT count(*) FROM outbox), (SELECT count(*) FROM bulk_jobs),
			(SELECT count(*) FROM order_payloads), (SELECT count(*) FROM order_attributes), (SELECT max(updated_at) FROM orders))`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	n := 0
	expect := func(desc string, c apiCall, want int, reason string) {
		t.Helper()
		n++
		code, h, b := api.call(t, c)
		if code != want {
			t.Errorf("%s: %d, want %d: %s", desc, code, want, b)
			return
		}
		p := problemOf(t, h, b)
		if reason != "" && p["reason"] != reason {
			t.Errorf("%s: reason %v, want %s: %s", desc, p["reason"], reason, b)
		}
	}
	for _, c := range append(badinput.SubmitOrders(messages.NewID), badinput.SubmitPayloads(messages.NewID)...) {
		call := apiCall{method: "POST", path: "/api/v1/orders", token: app, body: string(c.Body), header: map[string]string{}}
		want := http.StatusBadRequest
		switch c.Reason {
		case messages.ReasonTooLarge:
			want = http.StatusRequestEntityTooLarge
		case messages.ReasonWrongContentType:
			want = http.StatusUnsupportedMediaType
		case messages.ReasonInvalidPayload:
			want = http.StatusUnprocessableEntity
		}
		if c.ContentType != "" {
			call.header["Content-Type"] = c.ContentType
		}
		if len(c.Body) == 0 {
			call.body = " " // an empty body is sent as one space: still no JSON
		}
		expect("submit: "+c.Name, call, want, c.Reason)
	}
	o := "/api/v1/orders/" + good
	big := strings.Repeat("x", 70<<10)
	for _, c := range []struct {
		desc   string
		call   apiCall
		want   int
		reason string
	}{
		{"an unknown workflow", apiCall{method: "POST", path: "/api/v1/orders", token: app, body: badinput.ValidSubmitV2JSON(messages.NewID(), "nope", `{}`)}, 422, "unknown_workflow"},
		{"no content type", apiCall{method: "POST", path: "/api/v1/orders", token: app, body: "x", header: map[string]string{"Content-Type": ""}}, 415, ""},
		{"an id that is not a UUID", apiCall{method: "GET", path: "/api/v1/orders/42", token: ops}, 400, ""},
		{"an id with a NUL", apiCall{method: "GET", path: "/api/v1/orders/%00" + good[1:], token: ops}, 400, ""},
		{"an id of 10,000 characters", apiCall{method: "GET", path: "/api/v1/orders/" + strings.Repeat("a", 10000), token: ops}, 400, ""},
		{"an unknown order", apiCall{method: "GET", path: "/api/v1/orders/" + messages.NewID(), token: ops}, 404, ""},
		{"an unknown status", apiCall{method: "GET", path: "/api/v1/orders?status=lost", token: ops}, 400, ""},
		{"a limit of 0", apiCall{method: "GET", path: "/api/v1/orders?limit=0", token: ops}, 400, ""},
		{"a limit that is no number", apiCall{method: "GET", path: "/api/v1/orders?limit=ten", token: ops}, 400, ""},
		{"a limit too large", apiCall{method: "GET", path: "/api/v1/orders?limit=100000", token: ops}, 400, ""},
		{"a forged cursor", apiCall{method: "GET", path: "/api/v1/orders?after=bm90LWEtY3Vyc29y", token: ops}, 400, ""},
		{"a cursor of garbage", apiCall{method: "GET", path: "/api/v1/orders?after=%%%", token: ops}, 400, ""},
		{"a time that is none", apiCall{method: "GET", path: "/api/v1/orders?from=yesterday", token: ops}, 400, ""},
		{"an id prefix that is no hex", apiCall{method: "GET", path: "/api/v1/orders?id=zz", token: ops}, 400, ""},
		{"an attribute nobody declares", apiCall{method: "GET", path: "/api/v1/orders?where=colour%3Dred", token: ops}, 400, ""},
		{"a condition with no operator", apiCall{method: "GET", path: "/api/v1/orders?where=colour", token: ops}, 400, ""},
		{"six conditions", apiCall{method: "GET", path: "/api/v1/orders?" + strings.Repeat("where=a%3D1&", 6), token: ops}, 400, ""},
		{"a timeout that is no duration", apiCall{method: "GET", path: o + "/await?timeout=forever", token: ops}, 400, ""},
		{"a negative timeout", apiCall{method: "GET", path: o + "/await?timeout=-1s", token: ops}, 400, ""},
		{"a timeout past the limit", apiCall{method: "GET", path: o + "/await?timeout=1h", token: ops}, 400, ""},
		{"a signal name with a space", apiCall{method: "POST", path: o + "/signals/a%20b", token: ops}, 400, ""},
		{"a signal for an unknown order", apiCall{method: "POST", path: "/api/v1/orders/" + messages.NewID() + "/signals/approved", token: ops}, 404, "unknown_order"},
		{"a signal for no wait", apiCall{method: "POST", path: o + "/signals/approved", token: ops, body: `{}`}, 409, "no_such_wait"},
		{"a signal payload that is no JSON", apiCall{method: "POST", path: o + "/signals/approved", token: ops, body: `{"by":`}, 400, "not_json"},
		{"a signal id too long", apiCall{method: "POST", path: o + "/signals/approved", token: ops, header: map[string]string{"Idempotency-Key": strings.Repeat("k", 500)}}, 400, ""},
		{"a negative step", apiCall{method: "POST", path: o + "/resubmit", token: ops, body: `{"step":-1}`}, 400, ""},
		{"a step that is text", apiCall{method: "POST", path: o + "/resubmit", token: ops, body: `{"step":"one"}`}, 400, ""},
		{"a resubmit of an order not in error", apiCall{method: "POST", path: o + "/resubmit", token: ops}, 409, ""},
		{"a re-run without a body", apiCall{method: "POST", path: o + "/rerun", token: ops}, 400, ""},
		{"a re-run of an order not in error", apiCall{method: "POST", path: o + "/rerun", token: ops, body: `{"payload":` + badinput.GoodOrderPayload + `}`}, 409, ""},
		{"a re-run with a payload the schema refuses", apiCall{method: "POST", path: o + "/rerun", token: ops, body: `{"payload":{"customer":""}}`}, 422, "invalid_payload"},
		{"a cancel of an unknown order", apiCall{method: "POST", path: "/api/v1/orders/" + messages.NewID() + "/cancel", token: ops}, 404, ""},
		{"an unknown bulk action", apiCall{method: "POST", path: "/api/v1/bulk/delete", token: ops, body: `{"filter":{"status":"error"}}`}, 404, ""},
		{"a bulk action with no filter", apiCall{method: "POST", path: "/api/v1/bulk/cancel", token: ops, body: `{"filter":{}}`}, 400, ""},
		{"a bulk filter with an unknown key", apiCall{method: "POST", path: "/api/v1/bulk/cancel", token: ops, body: `{"filter":{"colour":"red"}}`}, 400, ""},
		{"a bulk filter with a bad condition", apiCall{method: "POST", path: "/api/v1/bulk/resubmit", token: ops, body: `{"filter":{"where":["x"]}}`}, 400, ""},
		{"a bulk job id that is text", apiCall{method: "GET", path: "/api/v1/bulk/abc", token: ops}, 400, ""},
		{"an unknown bulk job", apiCall{method: "GET", path: "/api/v1/bulk/999999", token: ops}, 404, ""},
		{"stopping an unknown bulk job", apiCall{method: "POST", path: "/api/v1/bulk/999999/stop", token: ops}, 404, ""},
		{"another method", apiCall{method: "DELETE", path: "/api/v1/orders", token: ops}, 405, ""},
		{"an unknown path", apiCall{method: "GET", path: "/api/v2/orders", token: ops}, 404, ""},
		{"a query that cannot be read", apiCall{method: "GET", path: "/api/v1/orders?status=%zz", token: ops}, 400, ""},
		{"basic authentication", apiCall{method: "GET", path: o, header: map[string]string{"Authorization": "Basic YWRtaW46YWRtaW4="}}, 401, ""},
		{"a token of 10,000 characters", apiCall{method: "GET", path: o, token: strings.Repeat("t", 10000)}, 401, ""},
		{"a token of another's form", apiCall{method: "GET", path: o, token: "sas_1_x"}, 401, ""},
		{"headers of 70 KiB", apiCall{method: "GET", path: o, token: ops, header: map[string]string{"X-Padding": big}}, 431, ""},
		{"a submitter cancels", apiCall{method: "POST", path: o + "/cancel", token: app}, 403, ""},
	} {
		expect(c.desc, c.call, c.want, c.reason)
	}
	// Every query parameter of every route, given values a person or a
	// program might send by mistake or on purpose: typed and bounded
	// before it acts, so never a failure of sas (5xx).
	hostile := []string{"a\x00b", "\xff\xfe", strings.Repeat("9", 10000), "-1", "1e999", "NaN", "-Inf",
		"99999999999999999999", "0000-01-01", "9999-12-31T23:59:59Z", "customer=\x00", "customer>=1e999"}
	for _, route := range []struct {
		path   string
		params []string
	}{
		{"/api/v1/orders", []string{"status", "workflow", "from", "to", "id", "where", "limit", "after"}},
		{o + "/await", []string{"timeout"}},
		{"/api/v1/bulk", []string{"after", "limit"}},
	} {
		for _, param := range route.params {
			for _, v := range hostile {
				n++
				path := route.path + "?" + url.Values{param: {v}}.Encode()
				code, _, b := api.call(t, apiCall{method: "GET", path: path, token: ops})
				if code >= 500 || code == 0 {
					t.Errorf("GET %s?%s=%.40q: %d %.300s", route.path, param, v, code, b)
				}
			}
		}
	}
	for _, v := range hostile {
		n++
		code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + url.PathEscape(v), token: ops})
		if code >= 500 || code == 0 {
			t.Errorf("GET /api/v1/orders/%.40q: %d %.300s", v, code, b)
		}
	}
	if n < 30 {
		t.Fatalf("only %d bad requests tried", n)
	}
	if after := snapshot(); after != before {
		t.Fatalf("bad requests changed the store: %s, was %s", after, before)
	}
	// And the service still serves.
	code, _, b := api.call(t, apiCall{method: "GET", path: o, token: ops})
	var v map[string]any
	if code != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("after the bad requests: %d %s", code, b)
	}
	if out := api.logText(); strings.Contains(out, "panic") {
		t.Fatalf("the API panicked:\n%s", out)
	}
	t.Logf("%d bad requests refused", n)
}

// TestAPIRateLimitsEachToken: a token past its rate is answered 429 with
// a problem and Retry-After, and changes nothing; another token on the
// same replica is not held back by it.
func TestAPIRateLimitsEachToken(t *testing.T) {
	t.Parallel()
	st := newStack(t)
	api := startAPI(t, st, "", "SAS_API_RATE=2", "SAS_API_BURST=5")
	greedy, other := apiToken(t, st, "greedy", "submitter"), apiToken(t, st, "other", "viewer")
	limited, accepted := 0, 0
	for i := range 20 {
		code, h, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: greedy,
			body: badinput.ValidSubmitV2JSON(messages.NewID(), "order", badinput.GoodOrderPayload)})
		switch code {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			limited++
			if p := problemOf(t, h, b); p["type"] != "urn:sas:problem:rate-limited" || h.Get("Retry-After") == "" {
				t.Fatalf("request %d: a 429 without its problem or Retry-After: %v %s", i, h, b)
			}
		default:
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	// A burst of 5 and 2 a second: 5 to 7 of 20 quick ones go through.
	if accepted < 5 || accepted > 8 || limited != 20-accepted {
		t.Fatalf("%d accepted and %d limited of 20, want the burst of 5 (and what 2/s adds) accepted", accepted, limited)
	}
	if n := st.count(t, `SELECT count(*) FROM orders`); n != accepted {
		t.Fatalf("%d orders written for %d accepted", n, accepted)
	}
	if code, _, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders", token: other}); code != http.StatusOK {
		t.Fatalf("another token was held back: %d %s", code, b)
	}
}
