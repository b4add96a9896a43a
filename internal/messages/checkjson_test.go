package messages_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"sas/internal/harness/badinput"
	. "sas/internal/messages"
)

// TestCheckResultMatchesTheDecoders: an answer CheckResult accepts goes
// through a reply and a later request as it is, decoded by the very
// decoders schedulers and agents use; one it refuses would have been
// refused by the reply's decoder too, so an agent that checks first
// never sends a reply a scheduler refuses. (The state store's side:
// statestore's TestStoreKeepsWhatCheckResultAccepts.)
func TestCheckResultMatchesTheDecoders(t *testing.T) {
	t.Parallel()
	id := NewID()
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	for _, a := range badinput.Answers() {
		t.Run(a.Name, func(t *testing.T) {
			err := CheckResult(a.Body, MaxResultBytes)
			if (err == nil) != a.Keepable {
				t.Fatalf("CheckResult: %v, want keepable %v", err, a.Keepable)
			}
			// The reply as an agent would write it, by hand: Encode
			// checks the result itself.
			body := []byte(`{"schema_version":1,"order_id":"` + id + `","step":1,"attempt":1,"outcome":"ok","result":` + string(a.Body) + `}`)
			_, derr := DecodeStepReply(body)
			if (derr == nil) != a.Keepable {
				t.Fatalf("the reply decoder: %v, want keepable %v", derr, a.Keepable)
			}
			if _, eerr := Encode(StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 1, Outcome: OutcomeOK, Result: a.Body}); (eerr == nil) != a.Keepable {
				t.Fatalf("encoding the reply: %v, want keepable %v", eerr, a.Keepable)
			}
			if !a.Keepable {
				return
			}
			// A later request carries it among the results, one level down.
			req, err := Encode(StepRequest{SchemaVersion: StepRequestVersion, OrderID: id, Step: 2, Name: "next", Agent: "k", Attempt: 1,
				IdempotencyKey: id + "/2/next", CompleteBy: at, Payload: json.RawMessage(`{}`),
				Results: json.RawMessage(`{"first":` + string(a.Body) + `}`), UndoneResult: a.Body})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeStepRequest(req); err != nil {
				t.Fatalf("a later request carrying it: %v", err)
			}
		})
	}
}

func TestNumbersAreWrittenOutBounded(t *testing.T) {
	t.Parallel()
	for lit, want := range map[string]int{
		"1e2": 3, "-1.5e3": 5, "1.50e2": 3, "1e-5": 7, "0.5": 3, "12345": 5, "-0": 2, "1E+3": 4,
		"1.7976931348623157e308": 309, "5e-324": 326,
	} {
		if got, err := NumberWritten([]byte(lit)); err != nil || got != want {
			t.Errorf("numberWritten(%s) = %d, %v; want %d", lit, got, err, want)
		}
	}
	for _, lit := range []string{"1e331", "1e999999999999999999999", "-1e-400", "1e131072"} {
		if _, err := NumberWritten([]byte(lit)); err == nil {
			t.Errorf("numberWritten(%s) accepted", lit)
		}
	}
	// A payload of short numbers that grow is measured written out.
	payload := []byte(`{"n":[` + strings.Repeat("1e300,", 200) + `1]}`)
	if err := CheckPayload(payload); err == nil || !strings.Contains(err.Error(), "written out in full") {
		t.Fatalf("a %d-byte payload of 1e300s: %v", len(payload), err)
	}
}

func TestBoundTextFitsEveryMessage(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"plain", "line one\nline two\r\n\ttab", "nul\x00byte", "bad \xff\xfe utf-8", strings.Repeat("é", 3000),
		strings.Repeat("x", 1999) + "😀", "\u0085next line\u2028",
	} {
		out := BoundText(in, MaxReasonBytes)
		if len(out) > MaxReasonBytes || !utf8.ValidString(out) {
			t.Errorf("BoundText(%.40q) = %.40q: %d bytes, valid %v", in, out, len(out), utf8.ValidString(out))
		}
		reply, err := Encode(StepReply{SchemaVersion: 1, OrderID: NewID(), Step: 1, Attempt: 1, Outcome: OutcomeFailed, Error: out})
		if err == nil {
			_, err = DecodeStepReply(reply)
		}
		if err != nil {
			t.Errorf("BoundText(%.40q) = %.40q, which a reply cannot carry: %v", in, out, err)
		}
	}
}

func TestStepRefOfARefusedReply(t *testing.T) {
	t.Parallel()
	id := NewID()
	body := []byte("{\"schema_version\":1,\"order_id\":\"" + strings.ToUpper(id) + "\",\"step\":2,\"attempt\":3,\"outcome\":\"ok\",\"result\":{\"a\":\"\xff\"}}")
	if _, err := DecodeStepReply(body); err == nil {
		t.Fatal("the reply was not refused")
	}
	if got, step, attempt, ok := StepRefOf(body); !ok || got != id || step != 2 || attempt != 3 {
		t.Fatalf("StepRefOf: %s %d %d %v", got, step, attempt, ok)
	}
	for _, bad := range []string{`not json`, `{"order_id":"x","step":1,"attempt":1}`, `{"order_id":"` + id + `","step":0,"attempt":1}`} {
		if _, _, _, ok := StepRefOf([]byte(bad)); ok {
			t.Errorf("StepRefOf(%s) named a step", bad)
		}
	}
}
