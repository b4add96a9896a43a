// Package badinput is the catalogue of malformed messages from
// shared/RELIABILITY.md, each with the reason sas must give when it
// dead-letters it. Decoder tests, fuzz seeds, end-to-end tests and fault
// runs all draw on it, so that every one of them covers the same list.
package badinput

import (
	"fmt"
	"strings"

	"sas/internal/messages"
)

// Case is one malformed message and the verdict it must get.
type Case struct {
	Name        string
	ContentType string // "" means application/json
	Body        []byte
	Reason      string // the x-error-reason it must be dead-lettered with
	// DetailPrefix, when set, is how the x-error-detail must start (the
	// JSON Pointer of a payload's first error).
	DetailPrefix string
}

// ValidSubmit returns a valid SubmitOrder body for orderID, as a map so that
// a case can change one thing about it.
func ValidSubmit(orderID string) map[string]any {
	return map[string]any{
		"schema_version": 1,
		"order_id":       orderID,
		"customer":       "ACME Ltd",
		"items":          []any{map[string]any{"sku": "SKU-1", "qty": 2}},
		"amount":         1999,
		"currency":       "EUR",
	}
}

// ValidSubmitJSON is ValidSubmit as JSON, keys in a fixed order.
func ValidSubmitJSON(orderID string) string {
	return fmt.Sprintf(`{"schema_version":1,"order_id":%q,"customer":"ACME Ltd","items":[{"sku":"SKU-1","qty":2}],"amount":1999,"currency":"EUR"}`, orderID)
}

// with returns ValidSubmitJSON with the "amount":1999 member replaced by
// members (which may be empty to drop it) — a cheap way to vary one field
// while keeping the rest valid.
func with(orderID, old, new string) []byte {
	s := ValidSubmitJSON(orderID)
	if !strings.Contains(s, old) {
		panic("badinput: " + old + " not in the valid body")
	}
	return []byte(strings.Replace(s, old, new, 1))
}

// SubmitOrders returns the malformed SubmitOrder bodies. newID gives a
// fresh order id for each case, so cases never collide with each other or
// with valid traffic.
func SubmitOrders(newID func() string) []Case {
	id := newID
	valid := func() string { return ValidSubmitJSON(id()) }
	return []Case{
		{Name: "not json", Body: []byte("hello, I would like to order"), Reason: messages.ReasonNotJSON},
		{Name: "empty body", Body: []byte(""), Reason: messages.ReasonNotJSON},
		{Name: "json array", Body: []byte(`[1,2,3]`), Reason: messages.ReasonNotJSON},
		{Name: "truncated json", Body: []byte(valid()[:60]), Reason: messages.ReasonNotJSON},
		{Name: "trailing garbage", Body: []byte(valid() + "garbage"), Reason: messages.ReasonTrailingData},
		{Name: "two objects", Body: []byte(valid() + valid()), Reason: messages.ReasonTrailingData},
		{Name: "wrong content type", ContentType: "text/plain", Body: []byte(valid()), Reason: messages.ReasonWrongContentType},
		{Name: "missing schema version", Body: with(id(), `"schema_version":1,`, ``), Reason: messages.ReasonMissingField},
		{Name: "future schema version", Body: with(id(), `"schema_version":1,`, `"schema_version":3,`), Reason: messages.ReasonUnsupportedVersion},
		{Name: "unknown schema version", Body: with(id(), `"schema_version":1,`, `"schema_version":0,`), Reason: messages.ReasonUnsupportedVersion},
		{Name: "schema version as string", Body: with(id(), `"schema_version":1,`, `"schema_version":"1",`), Reason: messages.ReasonInvalidValue},
		{Name: "unknown field", Body: with(id(), `"amount":1999`, `"amount":1999,"discount":5`), Reason: messages.ReasonUnknownField},
		{Name: "field in other case", Body: with(id(), `"amount":1999`, `"Amount":1999`), Reason: messages.ReasonUnknownField},
		{Name: "field with folded letter", Body: with(id(), `"currency":"EUR"`, `"currency":"EUR","\u017fku":"x"`), Reason: messages.ReasonUnknownField},
		{Name: "unknown item field", Body: with(id(), `"qty":2`, `"qty":2,"colour":"red"`), Reason: messages.ReasonUnknownField},
		{Name: "duplicate field", Body: with(id(), `"amount":1999`, `"amount":1999,"amount":1`), Reason: messages.ReasonDuplicateField},
		{Name: "duplicate item field", Body: with(id(), `"qty":2`, `"qty":2,"qty":3`), Reason: messages.ReasonDuplicateField},
		{Name: "missing order id", Body: []byte(`{"schema_version":1,"customer":"ACME Ltd","items":[{"sku":"SKU-1","qty":2}],"amount":1999,"currency":"EUR"}`), Reason: messages.ReasonMissingField},
		{Name: "missing amount", Body: with(id(), `"amount":1999,`, ``), Reason: messages.ReasonMissingField},
		{Name: "null amount", Body: with(id(), `"amount":1999`, `"amount":null`), Reason: messages.ReasonMissingField},
		{Name: "missing items", Body: with(id(), `"items":[{"sku":"SKU-1","qty":2}],`, ``), Reason: messages.ReasonMissingField},
		{Name: "empty items", Body: with(id(), `"items":[{"sku":"SKU-1","qty":2}]`, `"items":[]`), Reason: messages.ReasonMissingField},
		{Name: "empty customer", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":""`), Reason: messages.ReasonMissingField},
		{Name: "zero quantity", Body: with(id(), `"qty":2`, `"qty":0`), Reason: messages.ReasonInvalidValue},
		{Name: "negative quantity", Body: with(id(), `"qty":2`, `"qty":-3`), Reason: messages.ReasonInvalidValue},
		{Name: "huge quantity", Body: with(id(), `"qty":2`, `"qty":99999999999`), Reason: messages.ReasonInvalidValue},
		{Name: "quantity beyond int64", Body: with(id(), `"qty":2`, `"qty":123456789012345678901234567890`), Reason: messages.ReasonInvalidValue},
		{Name: "fractional quantity", Body: with(id(), `"qty":2`, `"qty":1.5`), Reason: messages.ReasonInvalidValue},
		{Name: "fractional money", Body: with(id(), `"amount":1999`, `"amount":19.99`), Reason: messages.ReasonInvalidValue},
		{Name: "money in exponent form", Body: with(id(), `"amount":1999`, `"amount":2e3`), Reason: messages.ReasonInvalidValue},
		{Name: "negative money", Body: with(id(), `"amount":1999`, `"amount":-1`), Reason: messages.ReasonInvalidValue},
		{Name: "money as string", Body: with(id(), `"amount":1999`, `"amount":"1999"`), Reason: messages.ReasonInvalidValue},
		{Name: "bad currency", Body: with(id(), `"currency":"EUR"`, `"currency":"euro"`), Reason: messages.ReasonInvalidValue},
		{Name: "bad order id", Body: []byte(strings.Replace(valid(), `"order_id":"`, `"order_id":"x`, 1)), Reason: messages.ReasonInvalidValue},
		{Name: "priority out of range", Body: with(id(), `"amount":1999`, `"amount":1999,"priority":42`), Reason: messages.ReasonInvalidValue},
		{Name: "reserved reply queue", Body: with(id(), `"amount":1999`, `"amount":1999,"reply_to":"amq.rabbitmq.reply-to"`), Reason: messages.ReasonInvalidValue},
		{Name: "absurd past date", Body: with(id(), `"amount":1999`, `"amount":1999,"placed_at":"1900-01-01T00:00:00Z"`), Reason: messages.ReasonInvalidValue},
		{Name: "absurd future date", Body: with(id(), `"amount":1999`, `"amount":1999,"placed_at":"9999-12-31T23:59:59Z"`), Reason: messages.ReasonInvalidValue},
		{Name: "not a date", Body: with(id(), `"amount":1999`, `"amount":1999,"placed_at":"yesterday"`), Reason: messages.ReasonInvalidValue},
		{Name: "oversized body", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"`+strings.Repeat("A", messages.MaxBodyBytes)+`"`), Reason: messages.ReasonTooLarge},
		{Name: "invalid utf-8", Body: with(id(), `"customer":"ACME Ltd"`, "\"customer\":\"ACME \xff\xfe Ltd\""), Reason: messages.ReasonInvalidEncoding},
		{Name: "nul byte", Body: append([]byte(valid()), 0), Reason: messages.ReasonInvalidEncoding},
		{Name: "escaped nul", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"ACME\u0000Ltd"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "lone high surrogate", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"Probe \ud800 Ltd"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "lone low surrogate", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"Probe \uDC00 Ltd"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "surrogates reversed", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"\udc00\ud800"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "high surrogate at the end", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"ACME\ud83d"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "control character", Body: with(id(), `"customer":"ACME Ltd"`, `"customer":"ACME\u0007Ltd"`), Reason: messages.ReasonInvalidValue},
		{Name: "deep nesting", Body: with(id(), `"currency":"EUR"`, `"currency":"EUR","x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)), Reason: messages.ReasonInvalidValue},
	}
}

// ValidSubmitV2JSON is a valid version 2 SubmitOrder body of the
// built-in order workflow whose payload is payload.
func ValidSubmitV2JSON(orderID, workflow, payload string) string {
	return fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":%q,"payload":%s}`, orderID, workflow, payload)
}

// GoodOrderPayload is a payload the built-in order workflow's schema
// accepts.
const GoodOrderPayload = `{"customer":"ACME Ltd","items":[{"sku":"SKU-1","qty":2}],"amount":1999,"currency":"EUR"}`

// SubmitPayloads returns version 2 SubmitOrders whose payload is bad: not
// an object, too large, or (for the built-in order workflow, whose schema
// only the submitter knows) breaking its schema.
func SubmitPayloads(newID func() string) []Case {
	v2 := func(payload string) []byte { return []byte(ValidSubmitV2JSON(newID(), "order", payload)) }
	big := `{"note":"` + strings.Repeat("x", messages.MaxPayloadBytes) + `"}`
	return []Case{
		{Name: "payload not an object", Body: v2(`[1,2]`), Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /:"},
		{Name: "payload a string", Body: v2(`"hello"`), Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /:"},
		{Name: "payload too large", Body: v2(big), Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /:"},
		{Name: "payload missing", Body: []byte(fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":"order"}`, newID())), Reason: messages.ReasonMissingField},
		{Name: "version 1 field in version 2", Body: []byte(fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":"order","payload":{},"customer":"c"}`, newID())), Reason: messages.ReasonUnknownField},
		{Name: "payload breaks the schema deep down", Body: v2(strings.Replace(GoodOrderPayload, `"qty":2`, `"qty":0`, 1)),
			Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /items/0/qty:"},
		{Name: "payload lacks a required key", Body: v2(`{"customer":"c","items":[{"sku":"a","qty":1}],"amount":5}`),
			Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /:"},
		{Name: "payload of the wrong type", Body: v2(strings.Replace(GoodOrderPayload, `"amount":1999`, `"amount":"lots"`, 1)),
			Reason: messages.ReasonInvalidPayload, DetailPrefix: "at /amount:"},
	}
}

// StepReplies returns malformed StepReply bodies.
func StepReplies(newID func() string) []Case {
	reply := func(members string) []byte {
		return []byte(fmt.Sprintf(`{"schema_version":1,"order_id":%q,"step":1,"attempt":1%s}`, newID(), members))
	}
	return []Case{
		{Name: "reply not json", Body: []byte("ok"), Reason: messages.ReasonNotJSON},
		{Name: "reply unknown outcome", Body: reply(`,"outcome":"maybe"`), Reason: messages.ReasonInvalidValue},
		{Name: "reply missing outcome", Body: reply(``), Reason: messages.ReasonMissingField},
		{Name: "reply failed without error", Body: reply(`,"outcome":"failed"`), Reason: messages.ReasonMissingField},
		{Name: "reply ok with error", Body: reply(`,"outcome":"ok","error":"boom"`), Reason: messages.ReasonInvalidValue},
		{Name: "reply zero attempt", Body: []byte(fmt.Sprintf(`{"schema_version":1,"order_id":%q,"step":1,"attempt":0,"outcome":"ok"}`, newID())), Reason: messages.ReasonInvalidValue},
		{Name: "reply duplicate key in result", Body: reply(`,"outcome":"ok","result":{"A":1,"A":2}`), Reason: messages.ReasonDuplicateField},
		{Name: "reply future version", Body: []byte(fmt.Sprintf(`{"schema_version":3,"order_id":%q,"step":1,"attempt":1,"outcome":"ok"}`, newID())), Reason: messages.ReasonUnsupportedVersion},
		{Name: "reply trailing data", Body: append(reply(`,"outcome":"ok"`), "}"...), Reason: messages.ReasonTrailingData},
		{Name: "reply lone surrogate in result", Body: reply(`,"outcome":"ok","result":{"note":"\ud800"}`), Reason: messages.ReasonInvalidEncoding},
		{Name: "reply lone surrogate in error", Body: reply(`,"outcome":"failed","error":"bad \udfff"`), Reason: messages.ReasonInvalidEncoding},
		{Name: "reply negative call time", Body: reply(`,"outcome":"ok","call_us":-5`), Reason: messages.ReasonInvalidValue},
		{Name: "reply absurd sent_at", Body: reply(`,"outcome":"ok","sent_at":"1970-01-01T00:00:00Z"`), Reason: messages.ReasonInvalidValue},
		{Name: "reply accepted with a result", Body: reply(`,"outcome":"accepted","result":{"a":1}`), Reason: messages.ReasonInvalidValue},
		{Name: "reply hold without accepted", Body: reply(`,"outcome":"ok","hold_ms":1000`), Reason: messages.ReasonInvalidValue},
		{Name: "reply negative hold", Body: reply(`,"outcome":"accepted","hold_ms":-1`), Reason: messages.ReasonInvalidValue},
	}
}

// Callbacks are malformed callbacks (signals with a step's token) of a
// service that answered 202 Accepted, with token a step token (any
// string: the decoder does not read it).
func Callbacks(token string) []Case {
	cb := func(members string) []byte {
		return []byte(fmt.Sprintf(`{"schema_version":1,"token":%q%s}`, token, members))
	}
	return []Case{
		{Name: "callback unknown name", Body: cb(`,"name":"done"`), Reason: messages.ReasonInvalidValue},
		{Name: "callback missing name", Body: cb(``), Reason: messages.ReasonMissingField},
		{Name: "callback complete with a list", Body: cb(`,"name":"complete","payload":[1,2]`), Reason: messages.ReasonInvalidValue},
		{Name: "callback complete with an error", Body: cb(`,"name":"complete","error":"x"`), Reason: messages.ReasonInvalidValue},
		{Name: "callback fail without error", Body: cb(`,"name":"fail"`), Reason: messages.ReasonMissingField},
		{Name: "callback fail with a payload", Body: cb(`,"name":"fail","error":"x","payload":{}`), Reason: messages.ReasonInvalidValue},
		{Name: "callback heartbeat with a payload", Body: cb(`,"name":"heartbeat","payload":{"p":1}`), Reason: messages.ReasonInvalidValue},
		{Name: "callback order not a uuid", Body: cb(`,"name":"heartbeat","order_id":"42"`), Reason: messages.ReasonInvalidValue},
		{Name: "callback token too long", Body: []byte(fmt.Sprintf(`{"schema_version":1,"name":"heartbeat","token":%q}`,
			strings.Repeat("t", messages.MaxTokenBytes+1))), Reason: messages.ReasonInvalidValue},
		{Name: "signal error without token", Body: []byte(`{"schema_version":1,"signal_id":"s","order_id":"6f1c2d1e-8a55-4e51-9d87-3b2a1c0e9f10","name":"n","error":"x"}`),
			Reason: messages.ReasonInvalidValue},
		{Name: "signal without token or order", Body: []byte(`{"schema_version":1,"signal_id":"s","name":"n"}`), Reason: messages.ReasonInvalidValue},
	}
}

// HostileNext are ways to write another site's address, or text a browser
// may read as one (it drops tabs and newlines, takes a backslash for a
// slash, trims spaces and folds some look-alike characters), as the page
// a console login goes to afterwards. host is the other site ("host" or
// "host:port"). The console must answer each with a page of its own.
func HostileNext(host string) []string {
	forms := []string{
		"//%s/x", "///%s/x", "////%s", "/\\%s/x", "\\/%s/x", "\\\\%s/x", "/\\/%s/x",
		"/\t/%s/x", "\t//%s/x", "/\n/%s/x", "/\r/%s/x", "/\r\n/%s/x", "//\t%s/x",
		" //%s/x", "/ /%s/x", "/\x00/%s/x", "/\x0b/%s/x", "/\x0c/%s/x", "/\x7f/%s/x",
		"/\u00a0/%s/x", "/\u2028/%s/x", "/\u3000/%s/x", "\uff0f\uff0f%s/x", "/\uff0f%s/x",
		"https://%s/x", "http://%s/x", "http:%s/x", "https:/%s/x", "http:\\\\%s/x", "HTTP://%s",
		"//user@%s/", "%s/x", "x:/%s", "/\t\\%s/x",
	}
	out := make([]string, 0, len(forms)+4)
	for _, f := range forms {
		out = append(out, fmt.Sprintf(f, host))
	}
	return append(out, "javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "\t", "/"+strings.Repeat("a", 4096))
}

// Answer is a body a remote service may answer 200 with.
type Answer struct {
	Name string
	Body []byte
	// Keepable is whether the state store can keep it as a step's result
	// and every later message can carry it: an agent must pass it on as
	// it is, and fail the step for good with the true reason otherwise.
	Keepable bool
}

// nested is n objects one inside the other around a number.
func nested(n int) string {
	return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
}

// Answers are the answers a service may give that look like JSON
// objects, some of which no message or store of sas can carry.
func Answers() []Answer {
	return []Answer{
		{"plain", []byte(`{"id":"r-17","ok":true}`), true},
		{"non-ASCII and a surrogate pair", []byte(`{"note":"café \u00e9\ud83d\ude00 😀"}`), true},
		{"a float64's range", []byte(`{"big":1.7976931348623157e308,"tiny":5e-324,"neg":-2.5E-3}`), true},
		{"a long integer", []byte(`{"n":` + strings.Repeat("9", 1000) + `}`), true},
		{"nested 30 deep", []byte(nested(30)), true},
		{"escaped NUL", []byte(`{"note":"a\u0000b"}`), false},
		{"escaped NUL in a key", []byte(`{"a\u0000":1}`), false},
		{"invalid UTF-8", []byte("{\"note\":\"\xff\xfe\"}"), false},
		{"invalid UTF-8 in a key", []byte("{\"\xc3\x28\":1}"), false},
		{"an overlong encoding", []byte("{\"note\":\"\xc0\xaf\"}"), false},
		{"lone high surrogate", []byte(`{"s":"\ud800"}`), false},
		{"lone low surrogate", []byte(`{"s":"\udc00x"}`), false},
		{"high surrogate at the end", []byte(`{"s":"ok\ud83d"}`), false},
		{"a key twice", []byte(`{"a":1,"a":2}`), false},
		{"a key twice, nested", []byte(`{"a":{"b":1,"b":2}}`), false},
		{"a key twice, by escape", []byte(`{"a":1,"\u0061":2}`), false},
		{"a number past the store's range", []byte(`{"n":1e999999}`), false},
		{"a number past the store's digits", []byte(`{"n":1e131072}`), false},
		{"a fraction past the store's digits", []byte(`{"n":1e-16384}`), false},
		{"a number an exponent makes huge", []byte(`{"n":1e400}`), false},
		{"nested 40 deep", []byte(nested(40)), false},
		{"nested 31 deep", []byte(nested(31)), false},
		{"nested 32 deep", []byte(nested(32)), false},
	}
}

// CostlyWorkflow is a workflows file whose one workflow, "costly", has a
// legal payload schema that makes checking a payload twice as long per
// level of nesting (a recursive anyOf whose branches both descend), its
// one step done by agent kind agent. CostlyPayload is such a payload,
// nested depth deep in "a"; every payload it accepts nests empty arrays.
func CostlyWorkflow(agent string) string {
	return `
workflows:
  - name: costly
    payload_schema:
      type: object
      properties: {a: {$ref: "#/$defs/n"}}
      $defs:
        n:
          anyOf:
            - {type: array, items: {$ref: "#/$defs/n"}}
            - {type: array, items: {$ref: "#/$defs/n"}}
    steps:
      - {action: work, agent: ` + agent + `, timeout: 60s}
`
}

// CostlyPayload is a payload of CostlyWorkflow's that its schema refuses
// only at the bottom, depth levels down: the costliest to check.
func CostlyPayload(depth int) string {
	return `{"a":` + strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth) + `}`
}
