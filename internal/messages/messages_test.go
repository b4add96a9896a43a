package messages_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
)

func TestDecodeSubmitOrderAcceptsValid(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	body := `{"schema_version":1,"order_id":"` + strings.ToUpper(id) + `","customer":"Zoë & Co","items":[{"sku":"SKU-1","qty":2},{"sku":"b.2","qty":1}],
		"amount":1999,"currency":"EUR","priority":7,"reply_to":"shop.status-1","workflow":"order","placed_at":"2026-11-21T10:00:00+02:00"}`
	o, err := messages.DecodeSubmitOrder([]byte(body))
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	placed := time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)
	want := messages.SubmitOrder{
		SchemaVersion: 1, OrderID: id, Customer: "Zoë & Co",
		Items:  []messages.Item{{SKU: "SKU-1", Qty: 2}, {SKU: "b.2", Qty: 1}},
		Amount: 1999, Currency: "EUR", Priority: 7, ReplyTo: "shop.status-1", Workflow: "order", PlacedAt: &placed,
	}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", o, want)
	}
}

func TestDecodeSubmitOrderRejectsCatalogue(t *testing.T) {
	t.Parallel()
	for _, c := range badinput.SubmitOrders(messages.NewID) {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			var err error
			if c.ContentType != "" {
				err = messages.CheckContentType(c.ContentType)
			} else {
				_, err = messages.DecodeSubmitOrder(c.Body)
			}
			de, ok := messages.AsDecodeError(err)
			if !ok {
				t.Fatalf("got %v, want a DecodeError with reason %s", err, c.Reason)
			}
			if de.Reason != c.Reason {
				t.Fatalf("reason %q (%s), want %q", de.Reason, de.Detail, c.Reason)
			}
			if de.Detail == "" {
				t.Fatal("a rejection must say why")
			}
		})
	}
}

func TestDecodeStepReplyRejectsCatalogue(t *testing.T) {
	t.Parallel()
	for _, c := range badinput.StepReplies(messages.NewID) {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			_, err := messages.DecodeStepReply(c.Body)
			de, ok := messages.AsDecodeError(err)
			if !ok || de.Reason != c.Reason {
				t.Fatalf("got %v, want reason %s", err, c.Reason)
			}
		})
	}
}

func TestDecodeSignalRejectsBadCallbacks(t *testing.T) {
	t.Parallel()
	for _, c := range badinput.Callbacks("st1." + messages.NewID() + ".1.1.mac") {
		_, err := messages.DecodeSignal(c.Body)
		de, ok := messages.AsDecodeError(err)
		if !ok || de.Reason != c.Reason {
			t.Errorf("%s: got %v, want reason %s", c.Name, err, c.Reason)
		}
	}
	ok := `{"schema_version":1,"token":"st1.x.1.1.mac","name":"complete","payload":{"id":7}}`
	if sig, err := messages.DecodeSignal([]byte(ok)); err != nil || sig.Token == "" || sig.OrderID != "" {
		t.Fatalf("a callback without order_id or signal_id: %+v %v", sig, err)
	}
}

func TestContentType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ct   string
		want bool
	}{
		{"application/json", true},
		{"application/json; charset=utf-8", true},
		{"Application/JSON", true},
		{"", false},
		{"text/plain", false},
		{"application/jsonx", false},
	} {
		if got := messages.CheckContentType(tc.ct) == nil; got != tc.want {
			t.Errorf("CheckContentType(%q) ok=%v, want %v", tc.ct, got, tc.want)
		}
	}
}

func TestCanonicalDistinguishesPayloads(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	a, err := messages.DecodeSubmitOrder([]byte(badinput.ValidSubmitJSON(id)))
	if err != nil {
		t.Fatal(err)
	}
	// The same order with keys reordered, white space and an upper-case id.
	b, err := messages.DecodeSubmitOrder([]byte(`{ "currency":"EUR", "amount":1999, "items":[{"qty":2,"sku":"SKU-1"}],
		"customer":"ACME Ltd", "order_id":"` + strings.ToUpper(id) + `", "schema_version":1 }`))
	if err != nil {
		t.Fatal(err)
	}
	if string(a.Canonical()) != string(b.Canonical()) {
		t.Fatalf("same order, different canonical forms:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	c := a
	c.Amount++
	if string(a.Canonical()) == string(c.Canonical()) {
		t.Fatal("different amounts, same canonical form")
	}
}

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 21, 12, 0, 0, 123456000, time.UTC)
	step := 2
	id := messages.NewID()
	payload := json.RawMessage(`{"customer":"c","items":[{"sku":"a","qty":1}],"amount":5,"currency":"USD"}`)
	cases := []struct {
		msg    messages.Message
		decode func([]byte) (messages.Message, error)
	}{
		{messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: 1, Name: "reserve", Agent: "inventory", Attempt: 3,
			IdempotencyKey: id + "/1/reserve", CompleteBy: at, Payload: payload},
			func(b []byte) (messages.Message, error) { return messages.DecodeStepRequest(b) }},
		{messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: 5, Name: "refund", Agent: "payment", Attempt: 1,
			IdempotencyKey: id + "/5/refund", CompleteBy: at, Payload: payload, Results: json.RawMessage(`{"charge":{"ID":"c-1"}}`),
			Undoes: id + "/2/charge", UndoneResult: json.RawMessage(`{"ID":"c-1"}`)},
			func(b []byte) (messages.Message, error) { return messages.DecodeStepRequest(b) }},
		{messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: id, Workflow: "onboard", Payload: json.RawMessage(`{"Tenant":"acme","n":[1,2.5]}`),
			Priority: 3, ReplyTo: "amq.gen-x", PlacedAt: &at},
			func(b []byte) (messages.Message, error) { return messages.DecodeSubmitOrder(b) }},
		{messages.StatusEvent{SchemaVersion: 1, OrderID: id, Status: messages.StatusCompleted, At: at, Results: json.RawMessage(`{"a":{"X":1}}`)},
			func(b []byte) (messages.Message, error) { return messages.DecodeStatusEvent(b) }},
		{messages.StatusEvent{SchemaVersion: 1, OrderID: id, Status: messages.StatusFailed, At: at, ResultsTruncated: true},
			func(b []byte) (messages.Message, error) { return messages.DecodeStatusEvent(b) }},
		{messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 3, Outcome: messages.OutcomeOK, Result: json.RawMessage(`{"Reservation":"r-1"}`),
			StartedAt: &at, CallMicros: 1234, SentAt: &at},
			func(b []byte) (messages.Message, error) { return messages.DecodeStepReply(b) }},
		{messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 3, Outcome: messages.OutcomeFailed, Error: "card declined"},
			func(b []byte) (messages.Message, error) { return messages.DecodeStepReply(b) }},
		{messages.StatusEvent{SchemaVersion: 1, OrderID: id, Status: messages.StatusError, Step: &step, At: at},
			func(b []byte) (messages.Message, error) { return messages.DecodeStatusEvent(b) }},
		{messages.StatusEvent{SchemaVersion: 1, OrderID: id, Status: messages.StatusCompleted, At: at},
			func(b []byte) (messages.Message, error) { return messages.DecodeStatusEvent(b) }},
		{messages.OperatorAlert{SchemaVersion: 1, OrderID: id, Step: 2, Reason: "threshold", FailureCount: 5, At: at},
			func(b []byte) (messages.Message, error) { return messages.DecodeOperatorAlert(b) }},
		{messages.OperatorAlert{SchemaVersion: 1, OrderID: id, Step: 2, Reason: "threshold", FailureCount: 5, At: at, Namespace: "team-a"},
			func(b []byte) (messages.Message, error) { return messages.DecodeOperatorAlert(b) }},
	}
	for _, tc := range cases {
		body, err := messages.Encode(tc.msg)
		if err != nil {
			t.Fatalf("encode %T: %v", tc.msg, err)
		}
		got, err := tc.decode(body)
		if err != nil {
			t.Fatalf("decode %T %s: %v", tc.msg, body, err)
		}
		if !reflect.DeepEqual(got, tc.msg) {
			t.Fatalf("round trip of %T:\n got %+v\nwant %+v", tc.msg, got, tc.msg)
		}
	}
}

// A surrogate pair written as two escapes is one character, and is kept;
// half of one is refused (the badinput catalogue), never stored as U+FFFD.
func TestDecodeKeepsEscapedSurrogatePairs(t *testing.T) {
	t.Parallel()
	body := strings.Replace(badinput.ValidSubmitJSON(messages.NewID()), `"customer":"ACME Ltd"`, `"customer":"Smile \ud83d\ude00 Ltd \\ud800"`, 1)
	o, err := messages.DecodeSubmitOrder([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if o.Customer != "Smile \U0001F600 Ltd \\ud800" {
		t.Fatalf("customer %q", o.Customer)
	}
}

// RabbitMQ's server-named queues are a client's usual private reply
// queue; only amq. names that can never receive are refused.
func TestReplyToRule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		replyTo string
		ok      bool
	}{
		{"shop.status-1", true},
		{"amq.gen-JzTY20BRgKO-HjmUJj0wLg", true},
		{"amq.rabbitmq.reply-to", false},
		{"amq.rabbitmq.reply-to.g1h2AA==", false},
		{"amq.direct", false},
		{"amq.", false},
	} {
		body := strings.Replace(badinput.ValidSubmitJSON(messages.NewID()), `"amount":1999`, `"amount":1999,"reply_to":"`+tc.replyTo+`"`, 1)
		_, err := messages.DecodeSubmitOrder([]byte(body))
		if (err == nil) != tc.ok {
			t.Errorf("reply_to %q: got %v, want accepted=%v", tc.replyTo, err, tc.ok)
		}
	}
}

func TestEncodeRefusesInvalid(t *testing.T) {
	t.Parallel()
	_, err := messages.Encode(messages.SubmitOrder{SchemaVersion: 1, OrderID: "nope"})
	if _, ok := messages.AsDecodeError(err); !ok {
		t.Fatalf("got %v, want a DecodeError", err)
	}
}

// The database builds status events and alerts in SQL (see the migration);
// this is one as Postgres writes it.
func TestDecodeDatabaseStatusEvent(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	e, err := messages.DecodeStatusEvent([]byte(`{"at": "2026-11-21T13:52:00.123456Z", "step": null, "status": "received", "order_id": "` + id + `", "schema_version": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	if e.Step != nil || e.Status != "received" || e.OrderID != id {
		t.Fatalf("decoded %+v", e)
	}
}

func TestNewIDIsCanonical(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := messages.NewID()
		c, ok := messages.CanonicalID(id)
		if !ok || c != id || seen[id] {
			t.Fatalf("NewID gave %q (canonical %q, ok %v, seen %v)", id, c, ok, seen[id])
		}
		seen[id] = true
	}
}

// checkDecoded is the fuzz targets' shared property: a decoder never
// panics; it either rejects with a DecodeError or returns a message that
// validates and survives a round trip through Encode.
func checkDecoded[T messages.Message](t *testing.T, body []byte, decode func([]byte) (T, error)) {
	m, err := decode(body)
	if err != nil {
		if _, ok := messages.AsDecodeError(err); !ok {
			t.Fatalf("rejection is not a DecodeError: %v", err)
		}
		return
	}
	if !utf8.Valid(body) {
		t.Fatalf("accepted invalid UTF-8: %q", body)
	}
	if unpairedSurrogate(body) {
		t.Fatalf("accepted a \\u escape that is half a surrogate pair: %q", body)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("accepted a message that does not validate: %v", err)
	}
	again, err := messages.Encode(m)
	if err != nil {
		t.Fatalf("accepted message does not encode: %v", err)
	}
	m2, err := decode(again)
	if err != nil {
		t.Fatalf("re-encoded message %s does not decode: %v", again, err)
	}
	b1, _ := json.Marshal(m)
	b2, _ := json.Marshal(m2)
	if string(b1) != string(b2) {
		t.Fatalf("round trip changed the message:\n%s\n%s", b1, b2)
	}
}

// escapeRE finds \uXXXX escapes with the backslashes before them: an
// escape is one only after an odd number of backslashes.
var escapeRE = regexp.MustCompile(`(\\+)u([0-9A-Fa-f]{4})`)

// unpairedSurrogate reports whether body holds a \u escape of a UTF-16
// surrogate that is not part of a high-then-low pair (written apart from
// the decoders' own check, which it tests).
func unpairedSurrogate(body []byte) bool {
	ms := escapeRE.FindAllSubmatchIndex(body, -1)
	for i := 0; i < len(ms); i++ {
		m := ms[i]
		if (m[3]-m[2])%2 == 0 {
			continue // an escaped backslash, then a plain u
		}
		r, _ := strconv.ParseUint(string(body[m[4]:m[5]]), 16, 32)
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if i+1 >= len(ms) || ms[i+1][0] != m[1] || ms[i+1][3]-ms[i+1][2] != 1 {
				return true
			}
			lo, _ := strconv.ParseUint(string(body[ms[i+1][4]:ms[i+1][5]]), 16, 32)
			if lo < 0xDC00 || lo >= 0xE000 {
				return true
			}
			i++
		case r >= 0xDC00 && r < 0xE000:
			return true
		}
	}
	return false
}

func addSeeds(f *testing.F, cases []badinput.Case, valid ...string) {
	for _, c := range cases {
		f.Add(c.Body)
	}
	for _, v := range valid {
		f.Add([]byte(v))
	}
}

const fuzzID = "6f1c2d1e-8a55-4e51-9d87-3b2a1c0e9f10"

func fixedID() string { return fuzzID }

func FuzzDecodeSubmitOrder(f *testing.F) {
	addSeeds(f, badinput.SubmitOrders(fixedID), badinput.ValidSubmitJSON(fuzzID),
		`{"schema_version":1,"order_id":"`+fuzzID+`","customer":"c","items":[{"sku":"a","qty":1}],"amount":0,"currency":"USD","priority":9,"reply_to":"q","workflow":"w","placed_at":"2030-01-01T00:00:00Z"}`)
	f.Fuzz(func(t *testing.T, body []byte) { checkDecoded(t, body, messages.DecodeSubmitOrder) })
}

func FuzzDecodeStepRequest(f *testing.F) {
	addSeeds(f, badinput.SubmitOrders(fixedID),
		`{"schema_version":1,"order_id":"`+fuzzID+`","step":1,"name":"reserve","agent":"inventory","attempt":1,"idempotency_key":"k","complete_by":"2030-01-01T00:00:00Z","payload":{"customer":"c","items":[{"sku":"a","qty":1}],"amount":1,"currency":"EUR"}}`)
	f.Fuzz(func(t *testing.T, body []byte) { checkDecoded(t, body, messages.DecodeStepRequest) })
}

func FuzzDecodeStepReply(f *testing.F) {
	addSeeds(f, badinput.StepReplies(fixedID),
		`{"schema_version":1,"order_id":"`+fuzzID+`","step":1,"attempt":1,"outcome":"ok","result":{"X":[1,{"y":null}]}}`,
		`{"schema_version":1,"order_id":"`+fuzzID+`","step":2,"attempt":4,"outcome":"failed","error":"declined"}`)
	f.Fuzz(func(t *testing.T, body []byte) { checkDecoded(t, body, messages.DecodeStepReply) })
}

func FuzzDecodeStatusEvent(f *testing.F) {
	addSeeds(f, badinput.StepReplies(fixedID),
		`{"schema_version":1,"order_id":"`+fuzzID+`","status":"completed","step":null,"at":"2030-01-01T00:00:00Z"}`,
		`{"schema_version":1,"order_id":"`+fuzzID+`","status":"error","step":2,"at":"2030-01-01T00:00:00.5Z"}`)
	f.Fuzz(func(t *testing.T, body []byte) { checkDecoded(t, body, messages.DecodeStatusEvent) })
}

func FuzzDecodeOperatorAlert(f *testing.F) {
	addSeeds(f, badinput.StepReplies(fixedID),
		`{"schema_version":1,"order_id":"`+fuzzID+`","step":1,"reason":"threshold","failure_count":5,"at":"2030-01-01T00:00:00Z"}`)
	f.Fuzz(func(t *testing.T, body []byte) { checkDecoded(t, body, messages.DecodeOperatorAlert) })
}

func TestDecodeErrorIsWrapped(t *testing.T) {
	t.Parallel()
	_, err := messages.Encode(messages.StatusEvent{SchemaVersion: 1, OrderID: "x"})
	var de *messages.DecodeError
	if !errors.As(err, &de) || de.Reason != messages.ReasonInvalidValue {
		t.Fatalf("got %v", err)
	}
}

// BenchmarkDecodeStepReply: the strict decoding of one reply, as a
// scheduler does for each.
func BenchmarkDecodeStepReply(b *testing.B) {
	at := time.Now().UTC()
	body, err := messages.Encode(messages.StepReply{SchemaVersion: 1, OrderID: messages.NewID(), Step: 2, Attempt: 1,
		Outcome: messages.OutcomeOK, Result: json.RawMessage(`{"reservation":"r-123","effects":1}`), StartedAt: &at, CallMicros: 1234, SentAt: &at})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := messages.DecodeStepReply(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeStepRequest: the strict decoding of one request, as an
// agent does for each.
func BenchmarkDecodeStepRequest(b *testing.B) {
	id := messages.NewID()
	body, err := messages.Encode(messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: 2, Name: "charge_payment", Agent: "payment",
		Attempt: 1, IdempotencyKey: id + "/2/charge_payment", CompleteBy: time.Now().Add(time.Minute).UTC(),
		Payload: json.RawMessage(`{"customer":"ACME Ltd","items":[{"sku":"SKU-1","qty":2},{"sku":"SKU-2","qty":1}],"amount":1999,"currency":"EUR"}`),
		Results: json.RawMessage(`{"reserve_inventory":{"action":"reserve_inventory","confirmation":"reserve_inventory-0a1b2c3d4e5f"}}`)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := messages.DecodeStepRequest(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeStepReply: one reply's body, as an agent sends it.
func BenchmarkEncodeStepReply(b *testing.B) {
	at := time.Now().UTC()
	reply := messages.StepReply{SchemaVersion: 1, OrderID: messages.NewID(), Step: 2, Attempt: 1,
		Outcome: messages.OutcomeOK, Result: json.RawMessage(`{"reservation":"r-123","effects":1}`), StartedAt: &at, CallMicros: 1234, SentAt: &at}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := messages.Encode(reply); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStepRequestVersion1IsStillRead: a request from a scheduler of the
// version before opaque payloads is read, its payload as it was.
func TestStepRequestVersion1IsStillRead(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	body := fmt.Sprintf(`{"schema_version":1,"order_id":%q,"step":1,"name":"reserve_inventory","agent":"inventory","attempt":1,`+
		`"idempotency_key":"%s/1/reserve_inventory","complete_by":"2030-01-01T00:00:00Z",`+
		`"payload":{"customer":"c","items":[{"sku":"a","qty":1}],"amount":5,"currency":"EUR"}}`, id, id)
	r, err := messages.DecodeStepRequest([]byte(body))
	if err != nil || string(r.Payload) != `{"customer":"c","items":[{"sku":"a","qty":1}],"amount":5,"currency":"EUR"}` {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := messages.DecodeStepRequest([]byte(strings.Replace(body, `"schema_version":1`, `"schema_version":3`, 1))); err == nil {
		t.Fatal("version 3 read")
	}
}

// TestVersion2DuplicatesAreTheSameContent: two submissions of one order
// whose payloads differ only in key order and spaces hash the same;
// another value does not.
func TestVersion2DuplicatesAreTheSameContent(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	order := func(payload string) messages.SubmitOrder {
		return messages.SubmitOrder{SchemaVersion: 2, OrderID: id, Workflow: "w", Payload: json.RawMessage(payload)}
	}
	a := order(`{"tenant":"acme","n":[1,2.50],"x":{"b":1,"a":2}}`).Canonical()
	b := order(` { "x" : {"a":2, "b":1}, "n": [1, 2.50], "tenant": "acme" } `).Canonical()
	c := order(`{"tenant":"acme","n":[1,2.5],"x":{"b":1,"a":2}}`).Canonical()
	if !bytes.Equal(a, b) {
		t.Fatalf("same content, different canonical forms:\n%s\n%s", a, b)
	}
	if bytes.Equal(a, c) {
		t.Fatal("2.50 and 2.5 hash the same: numbers are compared as written")
	}
	if bytes.Equal(a, messages.SubmitOrder{SchemaVersion: 1, OrderID: id, Workflow: "w"}.Canonical()) {
		t.Fatal("a version 1 and a version 2 submission hash the same")
	}
}

func TestDerivedIDIsStableAndCanonical(t *testing.T) {
	t.Parallel()
	a, b := messages.DerivedID("child:x/2/kyc"), messages.DerivedID("child:x/2/kyc")
	if c, ok := messages.CanonicalID(a); !ok || c != a || a != b || a[14] != '5' {
		t.Fatalf("DerivedID gave %q then %q", a, b)
	}
	if messages.DerivedID("child:x/3/kyc") == a {
		t.Fatal("two names gave one id")
	}
}

// TestEveryRefusalHasItsSender: the reply_to of a message its decoder
// refused is read whatever else is wrong with it, the order id only when
// it is one; a rejected event may name no order, no other may.
func TestEveryRefusalHasItsSender(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	for _, c := range []struct {
		desc, body   string
		order, reply string
		ok           bool
	}{
		{"a submit", `{"order_id":"` + id + `","reply_to":"app.replies","amount":-1}`, id, "app.replies", true},
		{"a callback without an order", `{"schema_version":1,"token":"forged","name":"complete","reply_to":"svc.replies"}`, "", "svc.replies", true},
		{"an order id that is none", `{"order_id":42,"reply_to":"q"}`, "", "q", true},
		{"no reply_to", `{"order_id":"` + id + `"}`, "", "", false},
		{"a reply_to that is no queue name", `{"order_id":"` + id + `","reply_to":"a b"}`, "", "", false},
		{"not JSON", `reply_to: q`, "", "", false},
	} {
		order, reply, ok := messages.RefusedRefOf([]byte(c.body))
		if order != c.order || reply != c.reply || ok != c.ok {
			t.Errorf("%s: %q %q %v, want %q %q %v", c.desc, order, reply, ok, c.order, c.reply, c.ok)
		}
	}
	at := time.Now().UTC()
	if _, err := messages.Encode(messages.StatusEvent{SchemaVersion: 1, Status: messages.StatusRejected, At: at, Reason: "invalid_token"}); err != nil {
		t.Fatalf("a rejected event without an order: %v", err)
	}
	if _, err := messages.Encode(messages.StatusEvent{SchemaVersion: 1, Status: messages.StatusCompleted, At: at}); err == nil {
		t.Fatal("a completed event without an order was encoded")
	}
	if _, err := messages.DecodeStatusEvent([]byte(`{"schema_version":1,"status":"failed","at":"2026-11-26T10:00:00Z"}`)); err == nil {
		t.Fatal("a failed event without an order was decoded")
	}
	ev, err := messages.DecodeStatusEvent([]byte(`{"schema_version":1,"status":"rejected","reason":"invalid_token","at":"2026-11-26T10:00:00Z"}`))
	if err != nil || ev.OrderID != "" {
		t.Fatalf("a rejected event without an order: %+v %v", ev, err)
	}
}

// TestInputsNameEveryQueueSASReads: submits, replies, signals and
// callbacks, and each agent kind's requests.
func TestInputsNameEveryQueueSASReads(t *testing.T) {
	t.Parallel()
	got := messages.Inputs([]string{"inventory", "", "payment"})
	want := []string{"submit", "replies", "signals", "agent.inventory", "agent.payment"}
	if !slices.Equal(got, want) {
		t.Fatalf("inputs %v, want %v", got, want)
	}
}

// TestStepEventsAreChecked: a step event as the store writes it decodes;
// one whose event, kind or step is out of range is refused.
func TestStepEventsAreChecked(t *testing.T) {
	t.Parallel()
	good := `{"schema_version":1,"order_id":"0b0e1c5e-2c59-4a3e-9d4c-6f2b8f1b2a10","step":2,"name":"approval","kind":"action",` +
		`"event":"awaiting","state":"awaiting","attempt":1,"wait":"approved","at":"2026-11-27T10:00:00.000001Z","reason":"waiting for signal approved"}`
	ev, err := messages.DecodeStepEvent([]byte(good))
	if err != nil || ev.Event != messages.StepAwaiting || ev.Wait != "approved" || messages.StepEventKey(ev.Event) != "step.awaiting" {
		t.Fatalf("%+v %v", ev, err)
	}
	for _, bad := range []string{
		strings.Replace(good, `"event":"awaiting"`, `"event":"finished"`, 1),
		strings.Replace(good, `"kind":"action"`, `"kind":"wait"`, 1),
		strings.Replace(good, `"step":2`, `"step":0`, 1),
		strings.Replace(good, `"schema_version":1`, `"schema_version":9`, 1),
		strings.Replace(good, `"order_id":"0b0e1c5e-2c59-4a3e-9d4c-6f2b8f1b2a10",`, ``, 1),
	} {
		if _, err := messages.DecodeStepEvent([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// An operator alert's namespace, when it has one, is a namespace's name.
func TestOperatorAlertNamespaceIsAName(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
	for _, ns := range []string{"Team_A", "-a", strings.Repeat("a", 64)} {
		body, err := json.Marshal(messages.OperatorAlert{SchemaVersion: 1, OrderID: messages.NewID(), Step: 1, Reason: "r", At: at, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := messages.DecodeOperatorAlert(body); err == nil {
			t.Errorf("an alert of namespace %q decoded", ns)
		}
	}
}
