package messages

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
)

// Encoding without encoding/json's reflection, for the messages sent on
// the hot path (orders, a scheduler's requests, an agent's replies). The output is
// byte for byte what json.Marshal writes; where that needs escaping (a
// string with a quote, a control or non-ASCII character, <, > or &) or
// compacting (a result with spaces), the fast path gives up and
// json.Marshal writes the body. FuzzFastEncodeMatchesJSON holds the two
// to the same bytes.

// fastEncoder is a message that can append its JSON form; false means
// json.Marshal must.
type fastEncoder interface {
	appendJSON(b []byte) ([]byte, bool)
}

// plain reports whether json.Marshal writes s between quotes unchanged.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// encoder appends JSON members and remembers whether all were plain.
type encoder struct {
	b  []byte
	ok bool
}

// field starts a member named k, after a comma unless it is the first of
// its object.
func (e *encoder) field(k string) {
	if n := len(e.b); n > 0 && e.b[n-1] != '{' {
		e.b = append(e.b, ',')
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, k...)
	e.b = append(e.b, '"', ':')
}

func (e *encoder) str(s string) {
	if !plain(s) {
		e.ok = false
		return
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, s...)
	e.b = append(e.b, '"')
}

func (e *encoder) int(n int64) { e.b = strconv.AppendInt(e.b, n, 10) }

func (e *encoder) time(t time.Time) {
	// time.Time's MarshalJSON: RFC 3339 with nanoseconds, years 0..9999
	// only (checkTime keeps them far inside).
	if y := t.Year(); y < 0 || y > 9999 {
		e.ok = false
		return
	}
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.b = append(e.b, '"')
}

func (e *encoder) items(items []Item) {
	if items == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.b = append(e.b, '[')
	for i, it := range items {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = append(e.b, '{')
		e.field("sku")
		e.str(it.SKU)
		e.field("qty")
		e.int(it.Qty)
		e.b = append(e.b, '}')
	}
	e.b = append(e.b, ']')
}

func (o SubmitOrder) appendJSON(b []byte) ([]byte, bool) {
	e := encoder{b: b, ok: true}
	e.b = append(e.b, '{')
	e.field("schema_version")
	e.int(int64(o.SchemaVersion))
	e.field("order_id")
	e.str(o.OrderID)
	if o.SchemaVersion == 1 {
		e.field("customer")
		e.str(o.Customer)
		e.field("items")
		e.items(o.Items)
		e.field("amount")
		e.int(o.Amount)
		e.field("currency")
		e.str(o.Currency)
	} else {
		e.field("workflow")
		e.str(o.Workflow)
		e.field("payload")
		e.raw(o.Payload)
	}
	if o.Priority != 0 {
		e.field("priority")
		e.int(int64(o.Priority))
	}
	if o.ReplyTo != "" {
		e.field("reply_to")
		e.str(o.ReplyTo)
	}
	if o.Workflow != "" && o.SchemaVersion == 1 {
		e.field("workflow")
		e.str(o.Workflow)
	}
	if o.PlacedAt != nil {
		e.field("placed_at")
		e.time(*o.PlacedAt)
	}
	if o.StartAt != nil {
		e.field("start_at")
		e.time(*o.StartAt)
	}
	if o.Deadline != "" {
		e.field("deadline")
		e.str(o.Deadline)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

func (r StepRequest) appendJSON(b []byte) ([]byte, bool) {
	e := encoder{b: b, ok: true}
	e.b = append(e.b, '{')
	e.field("schema_version")
	e.int(int64(r.SchemaVersion))
	e.field("order_id")
	e.str(r.OrderID)
	e.field("step")
	e.int(int64(r.Step))
	e.field("name")
	e.str(r.Name)
	e.field("agent")
	e.str(r.Agent)
	e.field("attempt")
	e.int(int64(r.Attempt))
	e.field("idempotency_key")
	e.str(r.IdempotencyKey)
	e.field("complete_by")
	e.time(r.CompleteBy)
	e.field("payload")
	e.raw(r.Payload)
	if len(r.Results) > 0 {
		e.field("results")
		e.raw(r.Results)
	}
	if r.Undoes != "" {
		e.field("undoes")
		e.str(r.Undoes)
	}
	if len(r.UndoneResult) > 0 {
		e.field("undone_result")
		e.raw(r.UndoneResult)
	}
	if len(r.Input) > 0 {
		e.field("input")
		e.raw(r.Input)
	}
	if len(r.Item) > 0 {
		e.field("item")
		e.raw(r.Item)
	}
	if r.Index != nil {
		e.field("index")
		e.int(int64(*r.Index))
	}
	if r.Token != "" {
		e.field("token")
		e.str(r.Token)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}

// raw appends a raw JSON value compacted, as json.Marshal writes a
// json.RawMessage; a value json.Marshal would also escape (<, >, &, U+2028,
// U+2029) or that is not valid JSON is left to json.Marshal.
func (e *encoder) raw(v json.RawMessage) {
	if len(v) == 0 {
		e.b = append(e.b, "null"...)
		return
	}
	for i, c := range v {
		if c == '<' || c == '>' || c == '&' || (c == 0xE2 && i+2 < len(v) && v[i+1] == 0x80 && (v[i+2] == 0xA8 || v[i+2] == 0xA9)) {
			e.ok = false
			return
		}
	}
	buf := bytes.NewBuffer(e.b)
	if err := json.Compact(buf, v); err != nil {
		e.ok = false
		return
	}
	e.b = buf.Bytes()
}

func (r StepReply) appendJSON(b []byte) ([]byte, bool) {
	e := encoder{b: b, ok: true}
	e.b = append(e.b, '{')
	e.field("schema_version")
	e.int(int64(r.SchemaVersion))
	e.field("order_id")
	e.str(r.OrderID)
	e.field("step")
	e.int(int64(r.Step))
	e.field("attempt")
	e.int(int64(r.Attempt))
	e.field("outcome")
	e.str(r.Outcome)
	if len(r.Result) > 0 {
		// json.Marshal compacts a RawMessage and escapes <, > and &:
		// a result with none of those bytes, nor any space, is written
		// as it is.
		for _, c := range r.Result {
			if c <= ' ' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
				e.ok = false
			}
		}
		e.field("result")
		e.b = append(e.b, r.Result...)
	}
	if r.Error != "" {
		e.field("error")
		e.str(r.Error)
	}
	if r.LastAnswer != "" {
		e.field("last_answer")
		e.str(r.LastAnswer)
	}
	if r.StartedAt != nil {
		e.field("started_at")
		e.time(*r.StartedAt)
	}
	if r.CallMicros != 0 {
		e.field("call_us")
		e.int(r.CallMicros)
	}
	if r.SentAt != nil {
		e.field("sent_at")
		e.time(*r.SentAt)
	}
	if r.HoldMS != 0 {
		e.field("hold_ms")
		e.int(r.HoldMS)
	}
	if r.RetryAfterMS != 0 {
		e.field("retry_after_ms")
		e.int(r.RetryAfterMS)
	}
	e.b = append(e.b, '}')
	return e.b, e.ok
}
