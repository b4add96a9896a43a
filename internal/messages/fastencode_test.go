package messages_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"sas/internal/messages"
)

// sameAsMarshal encodes m and fails unless the bytes are json.Marshal's
// (for a message that validates) or both refuse it.
func sameAsMarshal(t *testing.T, m messages.Message) {
	t.Helper()
	if o, ok := m.(messages.SubmitOrder); ok && o.Validate() == nil {
		// The canonical form, hashed to tell duplicates from conflicts,
		// must stay json.Marshal's to the byte.
		n := o.Normalized()
		if n.SchemaVersion == messages.SubmitOrderVersion {
			n.Payload = canonical(t, n.Payload)
		}
		if v, err := messages.PayloadValue(o.Payload); err == nil && o.SchemaVersion == messages.SubmitOrderVersion && !bytes.Equal(o.CanonicalWith(v), o.Canonical()) {
			t.Fatalf("canonical with the decoded payload %s, without %s", o.CanonicalWith(v), o.Canonical())
		}
		if got, want := o.Canonical(), mustMarshal(t, n); !bytes.Equal(got, want) {
			t.Fatalf("canonical form:\n%s\njson.Marshal:\n%s", got, want)
		}
	}
	got, err := messages.Encode(m)
	if m.Validate() != nil {
		if err == nil {
			t.Fatalf("encoded an invalid message: %#v", m)
		}
		return
	}
	want, werr := json.Marshal(m)
	if err != nil || werr != nil || !bytes.Equal(got, want) {
		t.Fatalf("fast path:\n%s (%v)\njson.Marshal:\n%s (%v)", got, err, want, werr)
	}
}

func encodeSamples(s1, s2 string, n int64, result []byte, at time.Time) []messages.Message {
	id := fuzzID
	t := at
	return []messages.Message{
		messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: 2, Name: "charge_payment", Agent: "payment", Attempt: 3,
			IdempotencyKey: id + "/2/" + s1, CompleteBy: at, Payload: result, Results: result, Undoes: s1, UndoneResult: result},
		messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: 1, Name: s1, Agent: "inventory", Attempt: 1,
			IdempotencyKey: "k", CompleteBy: at, Payload: json.RawMessage(`{"customer": "c", "amount": 0}`)},
		messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 2, Outcome: messages.OutcomeOK, Result: result,
			StartedAt: &t, CallMicros: n, SentAt: &t},
		messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 3, Attempt: 1, Outcome: messages.OutcomeFailed, Error: s2},
		messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 3, Attempt: 1, Outcome: messages.OutcomeOK},
		messages.SubmitOrder{SchemaVersion: 1, OrderID: id, Customer: s2, Items: []messages.Item{{SKU: s1, Qty: n}}, Amount: n,
			Currency: "EUR", Priority: int(n % 10), ReplyTo: s1, Workflow: s1, PlacedAt: &t},
		messages.SubmitOrder{SchemaVersion: 1, OrderID: id, Customer: "c", Items: []messages.Item{{SKU: "a", Qty: 1}}, Currency: "USD"},
		messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: id, Workflow: s1, Payload: result,
			Priority: int(n % 10), ReplyTo: s1, PlacedAt: &t, StartAt: &t},
	}
}

func TestFastEncodeMatchesJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.UTC)
	for _, c := range []struct {
		s1, s2 string
		n      int64
		result string
		at     time.Time
	}{
		{"reserve", "ACME Ltd", 1999, `{"reservation":"r-1","effects":1}`, at},
		{"a<b", "Zoë & Co", 7, `{"a": 1}`, at.Truncate(time.Second)},
		{`quote"d`, "tab\there", 0, `[1,"x<y"]`, at.In(time.FixedZone("x", 3600))},
		{"back\\slash", "line\u2028sep", 42, `"é"`, at.Add(time.Millisecond)},
		{"plain", "plain", 1, `null`, at},
	} {
		for _, m := range encodeSamples(c.s1, c.s2, c.n, []byte(c.result), c.at) {
			sameAsMarshal(t, m)
		}
	}
}

func FuzzFastEncodeMatchesJSON(f *testing.F) {
	f.Add("reserve", "ACME Ltd", int64(1999), []byte(`{"reservation":"r-1"}`), int64(1893553445123456789))
	f.Add("a<b", "Zoë", int64(-1), []byte(`{"a": 1}`), int64(1893553445000000000))
	f.Fuzz(func(t *testing.T, s1, s2 string, n int64, result []byte, unixNano int64) {
		for _, m := range encodeSamples(s1, s2, n, result, time.Unix(0, unixNano).UTC()) {
			sameAsMarshal(t, m)
		}
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// canonical is what Canonical makes of a payload, done another way: keys
// sorted, no spaces, numbers as written.
func canonical(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return raw
	}
	return mustMarshal(t, v)
}
