package messages

import (
	"strconv"
	"time"
)

// Decoding without encoding/json's reflection, for the messages on the hot
// path. A body reaches here only after the walker accepted it (valid JSON,
// one object, snake_case keys, no duplicates, no NUL, the version and the
// required fields checked), so what is left is to put each value in its
// field. The values' common forms are read directly: a string without
// escapes, a whole number, a time, null. For anything else (an escape, a
// number with a fraction, a value of the wrong type, an unknown key) the
// fast path gives up and encoding/json decodes the body, so a rejection
// reads exactly as it always did. FuzzFastDecodeMatchesJSON holds the two
// paths to the same result.

// fastDecoder is a message that can fill itself from a walked body's
// top-level members. decodeMembers reports false, changing nothing, when
// it meets a value it does not read directly.
type fastDecoder interface {
	decodeMembers(ms []member) bool
}

// rawString reads a JSON string without escapes; null leaves *dst alone,
// as encoding/json does.
func rawString(raw []byte, dst *string) bool {
	if isNull(raw) {
		return true
	}
	if len(raw) < 2 || raw[0] != '"' {
		return false
	}
	s := raw[1 : len(raw)-1]
	for _, c := range s {
		if c == '\\' {
			return false
		}
	}
	*dst = string(s)
	return true
}

// rawInt64 reads a JSON number that is a whole number in range.
func rawInt64(raw []byte, dst *int64) bool {
	if isNull(raw) {
		return true
	}
	if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return false
	}
	*dst = n
	return true
}

func rawInt(raw []byte, dst *int) bool {
	var n int64
	if !rawInt64(raw, &n) || int64(int(n)) != n {
		return false
	}
	if !isNull(raw) {
		*dst = int(n)
	}
	return true
}

func rawIntPtr(raw []byte, dst **int) bool {
	if isNull(raw) {
		*dst = nil
		return true
	}
	var n int
	if !rawInt(raw, &n) {
		return false
	}
	*dst = &n
	return true
}

// rawTime reads a time as encoding/json does, through time.Time's own
// UnmarshalJSON (which takes null as no change).
func rawTime(raw []byte, dst *time.Time) bool {
	var t time.Time
	if err := t.UnmarshalJSON(raw); err != nil {
		return false
	}
	if !isNull(raw) {
		*dst = t
	}
	return true
}

func rawTimePtr(raw []byte, dst **time.Time) bool {
	if isNull(raw) {
		*dst = nil
		return true
	}
	var t time.Time
	if !rawTime(raw, &t) {
		return false
	}
	*dst = &t
	return true
}

func rawBool(raw []byte, dst *bool) bool {
	switch string(raw) {
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		return false
	}
	return true
}

func isNull(raw []byte) bool { return string(raw) == "null" }

// eachMember calls fn with each member of the object raw, a value the
// walker accepted; false from fn stops it and is returned. null has no
// members; anything else that is not an object is false.
func eachMember(raw []byte, fn func(m member) bool) bool {
	if isNull(raw) {
		return true
	}
	if len(raw) == 0 || raw[0] != '{' {
		return false
	}
	w := walker{b: raw, i: 1}
	w.space()
	if w.b[w.i] == '}' {
		return true
	}
	for {
		w.space()
		key, err := w.str()
		if err != nil {
			return false
		}
		w.space()
		w.i++ // ':'
		w.space()
		start := w.i
		if _, err := w.value(0, false); err != nil {
			return false
		}
		if !fn(member{key: key, raw: w.b[start:w.i]}) {
			return false
		}
		w.space()
		if w.b[w.i] == '}' {
			return true
		}
		w.i++ // ','
	}
}

// rawItems reads an array of items; null leaves *dst alone.
func rawItems(raw []byte, dst *[]Item) bool {
	if isNull(raw) {
		return true
	}
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	items := []Item{}
	w := walker{b: raw, i: 1}
	w.space()
	for w.b[w.i] != ']' {
		w.space()
		start := w.i
		if _, err := w.value(0, false); err != nil {
			return false
		}
		elem := w.b[start:w.i]
		if isNull(elem) {
			return false
		}
		var it Item
		ok := eachMember(elem, func(m member) bool {
			switch string(m.key) {
			case "sku":
				return rawString(m.raw, &it.SKU)
			case "qty":
				return rawInt64(m.raw, &it.Qty)
			}
			return false
		})
		if !ok {
			return false
		}
		items = append(items, it)
		w.space()
		if w.b[w.i] == ',' {
			w.i++
			w.space()
		}
	}
	*dst = items
	return true
}

func (o *SubmitOrder) decodeMembers(ms []member) bool {
	var v SubmitOrder
	for _, m := range ms {
		var ok bool
		switch string(m.key) {
		case "schema_version":
			ok = rawInt(m.raw, &v.SchemaVersion)
		case "order_id":
			ok = rawString(m.raw, &v.OrderID)
		case "customer":
			ok = rawString(m.raw, &v.Customer)
		case "items":
			ok = rawItems(m.raw, &v.Items)
		case "amount":
			ok = rawInt64(m.raw, &v.Amount)
		case "currency":
			ok = rawString(m.raw, &v.Currency)
		case "priority":
			ok = rawInt(m.raw, &v.Priority)
		case "reply_to":
			ok = rawString(m.raw, &v.ReplyTo)
		case "workflow":
			ok = rawString(m.raw, &v.Workflow)
		case "payload":
			v.Payload, ok = m.raw, true
		case "placed_at":
			ok = rawTimePtr(m.raw, &v.PlacedAt)
		case "start_at":
			ok = rawTimePtr(m.raw, &v.StartAt)
		case "deadline":
			ok = rawString(m.raw, &v.Deadline)
		}
		if !ok {
			return false
		}
	}
	*o = v
	return true
}

func (r *StepRequest) decodeMembers(ms []member) bool {
	var v StepRequest
	for _, m := range ms {
		var ok bool
		switch string(m.key) {
		case "schema_version":
			ok = rawInt(m.raw, &v.SchemaVersion)
		case "order_id":
			ok = rawString(m.raw, &v.OrderID)
		case "step":
			ok = rawInt(m.raw, &v.Step)
		case "name":
			ok = rawString(m.raw, &v.Name)
		case "agent":
			ok = rawString(m.raw, &v.Agent)
		case "attempt":
			ok = rawInt(m.raw, &v.Attempt)
		case "idempotency_key":
			ok = rawString(m.raw, &v.IdempotencyKey)
		case "complete_by":
			ok = rawTime(m.raw, &v.CompleteBy)
		case "undoes":
			ok = rawString(m.raw, &v.Undoes)
		case "payload":
			v.Payload, ok = m.raw, true
		case "results":
			v.Results, ok = m.raw, true
		case "undone_result":
			v.UndoneResult, ok = m.raw, true
		case "input":
			v.Input, ok = m.raw, true
		case "item":
			v.Item, ok = m.raw, true
		case "index":
			var i int
			ok = rawInt(m.raw, &i)
			v.Index = &i
		case "token":
			ok = rawString(m.raw, &v.Token)
		}
		if !ok {
			return false
		}
	}
	*r = v
	return true
}

func (r *StepReply) decodeMembers(ms []member) bool {
	var v StepReply
	for _, m := range ms {
		var ok bool
		switch string(m.key) {
		case "schema_version":
			ok = rawInt(m.raw, &v.SchemaVersion)
		case "order_id":
			ok = rawString(m.raw, &v.OrderID)
		case "step":
			ok = rawInt(m.raw, &v.Step)
		case "attempt":
			ok = rawInt(m.raw, &v.Attempt)
		case "outcome":
			ok = rawString(m.raw, &v.Outcome)
		case "result":
			// json.RawMessage keeps any value as it is, null included.
			v.Result, ok = append([]byte(nil), m.raw...), true
		case "error":
			ok = rawString(m.raw, &v.Error)
		case "last_answer":
			ok = rawString(m.raw, &v.LastAnswer)
		case "started_at":
			ok = rawTimePtr(m.raw, &v.StartedAt)
		case "call_us":
			ok = rawInt64(m.raw, &v.CallMicros)
		case "sent_at":
			ok = rawTimePtr(m.raw, &v.SentAt)
		case "hold_ms":
			ok = rawInt64(m.raw, &v.HoldMS)
		case "retry_after_ms":
			ok = rawInt64(m.raw, &v.RetryAfterMS)
		}
		if !ok {
			return false
		}
	}
	*r = v
	return true
}

func (e *StatusEvent) decodeMembers(ms []member) bool {
	var v StatusEvent
	for _, m := range ms {
		var ok bool
		switch string(m.key) {
		case "schema_version":
			ok = rawInt(m.raw, &v.SchemaVersion)
		case "order_id":
			ok = rawString(m.raw, &v.OrderID)
		case "status":
			ok = rawString(m.raw, &v.Status)
		case "step":
			ok = rawIntPtr(m.raw, &v.Step)
		case "at":
			ok = rawTime(m.raw, &v.At)
		case "results":
			v.Results, ok = m.raw, true
		case "results_truncated":
			ok = rawBool(m.raw, &v.ResultsTruncated)
		case "reason":
			ok = rawString(m.raw, &v.Reason)
		case "detail":
			ok = rawString(m.raw, &v.Detail)
		case "failed_step":
			ok = rawString(m.raw, &v.FailedStep)
		}
		if !ok {
			return false
		}
	}
	*e = v
	return true
}
