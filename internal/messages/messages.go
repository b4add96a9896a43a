package messages

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Message types, sent as the AMQP type property.
const (
	TypeSubmitOrder   = "sas.submit_order"
	TypeStepRequest   = "sas.step_request"
	TypeStepReply     = "sas.step_reply"
	TypeStatusEvent   = "sas.status_event"
	TypeOperatorAlert = "sas.operator_alert"
	TypeSignal        = "sas.signal"
)

// Message is implemented by every wire message.
type Message interface {
	// Type is the message's type name (TypeSubmitOrder, ...).
	Type() string
	// Validate reports the first value out of range as a *DecodeError.
	Validate() error
}

// Encode validates m and returns its JSON body. A message whose free-form
// fields a decoder holds to more than Validate checks (a reply's result)
// is held to it here too: what Encode makes, the decoder takes.
func Encode(m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.Type(), err)
	}
	if c, ok := m.(interface{ encodeCheck() error }); ok {
		if err := c.encodeCheck(); err != nil {
			return nil, fmt.Errorf("encode %s: %w", m.Type(), err)
		}
	}
	if f, ok := m.(fastEncoder); ok {
		if b, ok := f.appendJSON(make([]byte, 0, 512)); ok {
			return b, nil
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.Type(), err)
	}
	return b, nil
}

// decodeValid decodes body into a T and validates it; fast as decodeBody.
func decodeValid[T Message](body []byte, required, opaque []string, fast bool) (T, error) {
	var m T
	if err := decodeBody(body, &m, required, opaque, fast); err != nil {
		return m, err
	}
	if err := m.Validate(); err != nil {
		var zero T
		return zero, err
	}
	return m, nil
}

// SubmitOrder is what an application posts to the submit queue. See
// docs/submit-order.schema.json for the document given to its authors.
//
// Version 2 (SubmitOrderVersion) carries any process's order: the
// workflow to run and its payload, any JSON object. Version 1, the demo
// order's fixed fields (customer, items, amount, currency), is still read
// as the payload of the workflow it names ("order" by default).
type SubmitOrder struct {
	SchemaVersion int    `json:"schema_version"`
	OrderID       string `json:"order_id"`
	// Workflow names the steps to run; required in version 2, in version 1
	// empty means the default workflow.
	Workflow string `json:"workflow,omitempty"`
	// Payload is the order's data (version 2): a JSON object of at most
	// MaxPayloadBytes, checked against the workflow's schema if it has one.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Version 1's payload fields.
	Customer string `json:"customer,omitempty"`
	Items    []Item `json:"items,omitempty"`
	// Amount in the currency's minor units (cents): never fractional.
	Amount   int64  `json:"amount,omitempty"`
	Currency string `json:"currency,omitempty"`
	// Priority 0 (default) to 9; higher is claimed first.
	Priority int `json:"priority,omitempty"`
	// ReplyTo names the queue that receives this order's status events.
	ReplyTo string `json:"reply_to,omitempty"`
	// PlacedAt is when the order was placed, for the record.
	PlacedAt *time.Time `json:"placed_at,omitempty"`
	// StartAt is when the order starts: until then (on the
	// database clock) its first steps wait, delayed. Past or absent: at
	// once.
	StartAt *time.Time `json:"start_at,omitempty"`
	// Deadline bounds this order as a whole in place of its workflow's
	// deadline: a duration such as "90m", "2h" or "14d" from its
	// submit, on the database clock.
	Deadline string `json:"deadline,omitempty"`
}

// MarshalJSON writes a version 1 order in its own layout (every payload
// field, even a zero amount) and a version 2 order without them.
func (o SubmitOrder) MarshalJSON() ([]byte, error) {
	if o.SchemaVersion == 1 {
		return json.Marshal(submitOrderV1{o.SchemaVersion, o.OrderID, o.Customer, o.Items, o.Amount, o.Currency,
			o.Priority, o.ReplyTo, o.Workflow, o.PlacedAt, o.StartAt, o.Deadline})
	}
	return json.Marshal(submitOrderV2{o.SchemaVersion, o.OrderID, o.Workflow, o.Payload, o.Priority, o.ReplyTo, o.PlacedAt, o.StartAt, o.Deadline})
}

type submitOrderV1 struct {
	SchemaVersion int        `json:"schema_version"`
	OrderID       string     `json:"order_id"`
	Customer      string     `json:"customer"`
	Items         []Item     `json:"items"`
	Amount        int64      `json:"amount"`
	Currency      string     `json:"currency"`
	Priority      int        `json:"priority,omitempty"`
	ReplyTo       string     `json:"reply_to,omitempty"`
	Workflow      string     `json:"workflow,omitempty"`
	PlacedAt      *time.Time `json:"placed_at,omitempty"`
	StartAt       *time.Time `json:"start_at,omitempty"`
	Deadline      string     `json:"deadline,omitempty"`
}

type submitOrderV2 struct {
	SchemaVersion int             `json:"schema_version"`
	OrderID       string          `json:"order_id"`
	Workflow      string          `json:"workflow"`
	Payload       json.RawMessage `json:"payload"`
	Priority      int             `json:"priority,omitempty"`
	ReplyTo       string          `json:"reply_to,omitempty"`
	PlacedAt      *time.Time      `json:"placed_at,omitempty"`
	StartAt       *time.Time      `json:"start_at,omitempty"`
	Deadline      string          `json:"deadline,omitempty"`
}

// SubmitOrderVersion is the current SubmitOrder version; 1 is still read.
const SubmitOrderVersion = 2

// MaxResultBytes caps a step's result (a service's answer, numbers
// written out in full): an agent's SAS_AGENT_MAX_RESPONSE_BYTES may not
// be more.
const MaxResultBytes = 256 << 10

// MaxPayloadBytes caps an order's payload (and so what a step request
// carries besides the results).
const MaxPayloadBytes = 32 << 10

// Item is one line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

// Type implements Message.
func (SubmitOrder) Type() string { return TypeSubmitOrder }

// Validate implements Message.
func (o SubmitOrder) Validate() error {
	switch o.SchemaVersion {
	case 1:
		if err := o.validateV1(); err != nil {
			return err
		}
	case SubmitOrderVersion:
		if err := o.validateV2(); err != nil {
			return err
		}
	default:
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported (write %d)", o.SchemaVersion, SubmitOrderVersion)
	}
	if err := checkID("order_id", o.OrderID); err != nil {
		return err
	}
	if o.Priority < 0 || o.Priority > maxPriority {
		return reject(ReasonInvalidValue, "priority %d is outside 0..%d", o.Priority, maxPriority)
	}
	if o.ReplyTo != "" {
		if err := checkName("reply_to", o.ReplyTo, 255); err != nil {
			return err
		}
		if err := checkReplyTo(o.ReplyTo); err != nil {
			return err
		}
	}
	if o.Workflow != "" {
		if err := checkName("workflow", o.Workflow, 64); err != nil {
			return err
		}
	}
	if o.PlacedAt != nil {
		if err := checkTime("placed_at", *o.PlacedAt); err != nil {
			return err
		}
	}
	if o.StartAt != nil {
		if err := checkTime("start_at", *o.StartAt); err != nil {
			return err
		}
	}
	if o.Deadline != "" {
		if err := checkDeadline(o.Deadline); err != nil {
			return err
		}
	}
	return nil
}

// Bounds of an order's deadline.
const (
	MinDeadline = time.Second
	MaxDeadline = 366 * 24 * time.Hour
)

// ParseDuration reads a duration as time.ParseDuration does, and also a
// whole number of days ("14d"), as workflows files and orders write them.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 100000 {
			return 0, fmt.Errorf("%q is not a whole number of days", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

func checkDeadline(s string) error {
	d, err := ParseDuration(s)
	if len(s) > 32 || err != nil || d < MinDeadline || d > MaxDeadline {
		shown := s
		if len(shown) > 32 {
			shown = strings.ToValidUTF8(shown[:32], "") + "…"
		}
		return reject(ReasonInvalidValue, "deadline %q is not a duration from 1s to 366d; write a number with a unit, such as 90m, 2h or 14d", shown)
	}
	return nil
}

func (o SubmitOrder) validateV1() error {
	if len(o.Payload) > 0 {
		return reject(ReasonUnknownField, "payload is a version 2 field; send schema_version 2, or the order's customer, items, amount and currency")
	}
	if o.Customer == "" {
		return reject(ReasonMissingField, "customer is required")
	}
	if err := checkText("customer", o.Customer, maxText); err != nil {
		return err
	}
	if err := checkItems(o.Items); err != nil {
		return err
	}
	return checkAmount(o.Amount, o.Currency)
}

func (o SubmitOrder) validateV2() error {
	if o.Customer != "" || o.Items != nil || o.Amount != 0 || o.Currency != "" {
		return reject(ReasonUnknownField, "customer, items, amount and currency are version 1 fields; in version 2 put them in payload")
	}
	if o.Workflow == "" {
		return reject(ReasonMissingField, "workflow is required")
	}
	return CheckPayload(o.Payload)
}

// ReasonInvalidPayload is the dead-letter reason of a payload that is not
// a JSON object, is too large or breaks its workflow's schema; the detail
// starts with the JSON Pointer of the first error.
const ReasonInvalidPayload = "invalid_payload"

// CheckPayload checks that payload is a JSON object of at most
// MaxPayloadBytes.
func CheckPayload(payload []byte) error {
	if len(payload) == 0 || string(payload) == "null" {
		return reject(ReasonMissingField, "payload is required")
	}
	if len(payload) > MaxPayloadBytes {
		return reject(ReasonInvalidPayload, "at /: payload is %d bytes, limit %d", len(payload), MaxPayloadBytes)
	}
	if !isObject(payload) {
		return reject(ReasonInvalidPayload, "at /: payload must be a JSON object, not %s", jsonKind(payload))
	}
	if err := CheckJSON(payload, MaxPayloadBytes); err != nil {
		de, _ := AsDecodeError(err)
		switch de.Reason {
		case ReasonTooLarge:
			return reject(ReasonInvalidPayload, "at /: payload is %s", de.Detail)
		case ReasonNotJSON:
			return reject(ReasonInvalidPayload, "at /: payload is not valid JSON")
		}
		return reject(de.Reason, "payload: %s", de.Detail)
	}
	return nil
}

func isObject(raw []byte) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}

func jsonKind(raw []byte) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// checkReplyTo refuses a reply_to that can never receive. RabbitMQ keeps
// queue names starting with "amq." for itself: the only such queues that
// exist are the ones it names when a client declares a queue without a
// name ("amq.gen-…", the usual exclusive reply queue of RPC clients), which
// are accepted. Any other "amq." name, such as the direct reply-to
// pseudo-queue amq.rabbitmq.reply-to (it answers only the channel that
// published, and status events come later from a scheduler), can never be
// declared, so events sent there would be lost.
func checkReplyTo(q string) error {
	if strings.HasPrefix(q, "amq.") && !strings.HasPrefix(q, "amq.gen-") {
		return reject(ReasonInvalidValue, "reply_to %q can never receive: only RabbitMQ names amq. queues, and of those only server-named amq.gen-… queues hold messages", q)
	}
	return nil
}

func checkItems(items []Item) error {
	if len(items) == 0 {
		return reject(ReasonMissingField, "items must hold at least one item")
	}
	if len(items) > maxItems {
		return reject(ReasonInvalidValue, "%d items, limit %d", len(items), maxItems)
	}
	for i, it := range items {
		if err := checkName(fmt.Sprintf("items[%d].sku", i), it.SKU, 64); err != nil {
			return err
		}
		if it.Qty <= 0 || it.Qty > maxQty {
			return reject(ReasonInvalidValue, "items[%d].qty %d is outside 1..%d", i, it.Qty, maxQty)
		}
	}
	return nil
}

func checkAmount(amount int64, currency string) error {
	if amount < 0 || amount > maxAmount {
		return reject(ReasonInvalidValue, "amount %d is outside 0..%d minor units", amount, int64(maxAmount))
	}
	if len(currency) != 3 || !isUpper(currency) {
		return reject(ReasonInvalidValue, "currency must be a three-letter ISO 4217 code such as EUR")
	}
	return nil
}

func isUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// Normalized returns o with its id in lower case and its time in UTC, the
// form that is stored and hashed; a version 2 payload is compacted.
func (o SubmitOrder) Normalized() SubmitOrder {
	if id, ok := CanonicalID(o.OrderID); ok {
		o.OrderID = id
	}
	if o.PlacedAt != nil {
		t := o.PlacedAt.UTC()
		o.PlacedAt = &t
	}
	return o
}

// Canonical returns the normalized order's JSON: two submissions are the
// same order exactly when their canonical forms are equal. For version 2
// the payload's keys are sorted and its spaces removed, so only its
// content counts; version 1 keeps the form it always had, so that
// resubmitting an order accepted before version 2 is still a duplicate.
func (o SubmitOrder) Canonical() []byte { return o.canonical(nil) }

// canonical is Canonical with the payload decoded already, or nil.
func (o SubmitOrder) canonical(decoded any) []byte {
	n := o.Normalized()
	if n.SchemaVersion == SubmitOrderVersion {
		b, err := json.Marshal(decoded)
		if decoded == nil || err != nil {
			b = canonicalJSON(n.Payload)
		}
		n.Payload = b
	}
	if b, ok := n.appendJSON(make([]byte, 0, 256)); ok {
		return b // the bytes json.Marshal writes (FuzzFastEncodeMatchesJSON)
	}
	b, _ := json.Marshal(n) // plain fields and valid raw JSON always marshal
	return b
}

// CanonicalWith is Canonical for an order whose payload was decoded
// already (PayloadValue), so that a submitter decodes it once.
func (o SubmitOrder) CanonicalWith(payload any) []byte { return o.canonical(payload) }

// PayloadValue decodes a payload with numbers kept as written
// (json.Number), as JSON Schema validation and Canonical read it.
func PayloadValue(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// canonicalJSON rewrites a JSON value with sorted keys and no spaces,
// numbers as written.
func canonicalJSON(raw []byte) []byte {
	v, err := PayloadValue(raw)
	if err != nil {
		return raw
	}
	b, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return b
}

// PayloadJSON is the order's payload as a JSON object: version 2's as
// sent, version 1's fields gathered into one.
func (o SubmitOrder) PayloadJSON() []byte {
	if o.SchemaVersion == SubmitOrderVersion {
		return o.Payload
	}
	b, _ := json.Marshal(OrderPayload{Customer: o.Customer, Items: o.Items, Amount: o.Amount, Currency: o.Currency})
	return b
}

func (*SubmitOrder) required(version string) ([]string, bool) {
	switch version {
	case "1":
		return []string{"customer", "items", "amount", "currency"}, true
	case "2":
		return []string{"workflow", "payload"}, true
	}
	return nil, false
}

// A version 1 request (its payload the demo order's fields, no results)
// is read as a version 2 one: agents roll out before schedulers.
func (*StepRequest) required(version string) ([]string, bool) {
	return nil, version == "1" || version == "2"
}

// DecodeSubmitOrder decodes and validates a SubmitOrder body.
func DecodeSubmitOrder(body []byte) (SubmitOrder, error) { return decodeSubmitOrder(body, true) }

func decodeSubmitOrder(body []byte, fast bool) (SubmitOrder, error) {
	o, err := decodeValid[SubmitOrder](body, []string{"order_id"}, []string{"payload"}, fast)
	if err != nil {
		return o, err
	}
	return o.Normalized(), nil
}

// OrderPayload is the payload of the demo order (version 1's fields).
type OrderPayload struct {
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// StepRequestVersion is the StepRequest version: 2 since payloads are
// opaque.
const StepRequestVersion = 2

// StepRequest asks an agent to perform one attempt of one step.
type StepRequest struct {
	SchemaVersion  int    `json:"schema_version"`
	OrderID        string `json:"order_id"`
	Step           int    `json:"step"`
	Name           string `json:"name"`
	Agent          string `json:"agent"`
	Attempt        int    `json:"attempt"`
	IdempotencyKey string `json:"idempotency_key"`
	// CompleteBy is the absolute deadline; after it the agent stops and
	// sends nothing.
	CompleteBy time.Time `json:"complete_by"`
	// Payload is the order's payload, a JSON object.
	Payload json.RawMessage `json:"payload"`
	// Results are the results of the order's earlier actions by action
	// name, a JSON object; absent when there are none.
	Results json.RawMessage `json:"results,omitempty"`
	// Undoes is, for a compensating step, the idempotency key of the
	// action it undoes; UndoneResult that action's result, if it had one.
	Undoes       string          `json:"undoes,omitempty"`
	UndoneResult json.RawMessage `json:"undone_result,omitempty"`
	// Input is, when the step's workflow says input, what its CEL
	// expression built from payload and results: the service's input.
	Input json.RawMessage `json:"input,omitempty"`
	// Item and Index are, for an instance of a for_each step (or its
	// compensation), its element of the list and its position.
	Item  json.RawMessage `json:"item,omitempty"`
	Index *int            `json:"index,omitempty"`
	// Token is the step's token (steptoken): the agent sends it to the
	// service (contract.HeaderStepToken), which presents it in a callback
	// when it answered 202 Accepted.
	Token string `json:"token,omitempty"`
}

// Type implements Message.
func (StepRequest) Type() string { return TypeStepRequest }

// Validate implements Message.
func (r StepRequest) Validate() error {
	if r.SchemaVersion != StepRequestVersion && r.SchemaVersion != 1 {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported (write %d)", r.SchemaVersion, StepRequestVersion)
	}
	if err := checkStepRef(r.OrderID, r.Step, r.Attempt); err != nil {
		return err
	}
	if err := checkName("name", r.Name, 100); err != nil {
		return err
	}
	if err := checkName("agent", r.Agent, 100); err != nil {
		return err
	}
	if err := checkText("idempotency_key", r.IdempotencyKey, 300); err != nil {
		return err
	}
	if err := checkTime("complete_by", r.CompleteBy); err != nil {
		return err
	}
	if r.Undoes != "" {
		if err := checkText("undoes", r.Undoes, 300); err != nil {
			return err
		}
	}
	if r.Token != "" {
		if err := checkText("token", r.Token, MaxTokenBytes); err != nil {
			return err
		}
	}
	if !isObject(r.Payload) {
		return reject(ReasonInvalidValue, "payload must be a JSON object, not %s", jsonKind(r.Payload))
	}
	if len(r.Results) > 0 && !isObject(r.Results) {
		return reject(ReasonInvalidValue, "results must be a JSON object, not %s", jsonKind(r.Results))
	}
	for _, raw := range []json.RawMessage{r.Payload, r.Results, r.UndoneResult, r.Input, r.Item} {
		if len(raw) > 0 && !json.Valid(raw) {
			return reject(ReasonInvalidValue, "payload, results, undone_result, input or item is not valid JSON")
		}
	}
	if r.Index != nil && (*r.Index < 0 || *r.Index >= 1000) {
		return reject(ReasonInvalidValue, "index %d is outside 0..999", *r.Index)
	}
	return nil
}

// MaxStep is the highest step number: a graph's for_each steps add a
// step per item (and per item's compensation), at most 1,000 items each.
const MaxStep = 100000

func checkStepRef(orderID string, step, attempt int) error {
	if err := checkID("order_id", orderID); err != nil {
		return err
	}
	if step < 1 || step > MaxStep {
		return reject(ReasonInvalidValue, "step %d is outside 1..%d", step, MaxStep)
	}
	if attempt < 1 {
		return reject(ReasonInvalidValue, "attempt %d must be at least 1", attempt)
	}
	return nil
}

// DecodeStepRequest decodes and validates a StepRequest body.
func DecodeStepRequest(body []byte) (StepRequest, error) { return decodeStepRequest(body, true) }

func decodeStepRequest(body []byte, fast bool) (StepRequest, error) {
	r, err := decodeValid[StepRequest](body,
		[]string{"order_id", "step", "name", "agent", "attempt", "idempotency_key", "complete_by", "payload"},
		[]string{"payload", "results", "undone_result", "input", "item"}, fast)
	if string(r.UndoneResult) == "null" {
		r.UndoneResult = nil
	}
	return r, err
}

// Step reply outcomes.
const (
	OutcomeOK     = "ok"
	OutcomeFailed = "failed" // failed for good: retrying will not help
	// OutcomeAbandoned: the agent stopped trying before complete_by (the
	// next try would not end in time). The reply changes nothing but the
	// step's last answer; the step waits for its complete_by as before.
	OutcomeAbandoned = "abandoned"
	// OutcomeAccepted: the service answered 202 Accepted; it will end the
	// step by a callback with the step's token. The reply holds the
	// attempt open (HoldMS, or the step's timeout) and changes nothing
	// else.
	OutcomeAccepted = "accepted"
	// OutcomeThrottled: the service answered 429 Too Many Requests with
	// a Retry-After (RetryAfterMS); the agent goes on trying within
	// complete_by. The reply changes nothing of the step: it lowers its
	// agent kind's rate for a while, when the kind has one.
	OutcomeThrottled = "throttled"
)

// MaxHoldMS bounds a reply's hold_ms: 366 days.
const MaxHoldMS = 366 * 24 * 3600 * 1000

// MaxAnswerBytes bounds a reply's last_answer.
const MaxAnswerBytes = 500

// StepReply is an agent's answer to one attempt of one step.
type StepReply struct {
	SchemaVersion int    `json:"schema_version"`
	OrderID       string `json:"order_id"`
	Step          int    `json:"step"`
	Attempt       int    `json:"attempt"`
	Outcome       string `json:"outcome"`
	// Result is the remote service's answer, for ok.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is why the step failed, for failed.
	Error string `json:"error,omitempty"`
	// LastAnswer is the last answer the service gave that was not the
	// result: its HTTP status and a bounded, redacted excerpt of its body,
	// or why none came ("no answer: …"); at most MaxAnswerBytes. Optional
	// with failed, required with abandoned, absent with ok.
	LastAnswer string `json:"last_answer,omitempty"`
	// StartedAt (when the agent took the request), CallMicros (the remote
	// call, retries included) and SentAt (when the reply left) are the
	// agent's own clock readings, optional, kept with the step for the
	// latency breakdown (sasctl bench). Nothing decides on them.
	StartedAt  *time.Time `json:"started_at,omitempty"`
	CallMicros int64      `json:"call_us,omitempty"`
	SentAt     *time.Time `json:"sent_at,omitempty"`
	// HoldMS is, with accepted, how long the service asked the step to be
	// held open (its Sas-Heartbeat answer header); 0: the step's timeout.
	HoldMS int64 `json:"hold_ms,omitempty"`
	// RetryAfterMS is, with throttled, the Retry-After the service
	// answered with its 429.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Type implements Message.
func (StepReply) Type() string { return TypeStepReply }

// Validate implements Message.
func (r StepReply) Validate() error {
	if r.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", r.SchemaVersion)
	}
	if err := checkStepRef(r.OrderID, r.Step, r.Attempt); err != nil {
		return err
	}
	switch r.Outcome {
	case OutcomeOK:
		if r.Error != "" {
			return reject(ReasonInvalidValue, "error must be empty when outcome is ok")
		}
		if len(r.Result) > 0 && !json.Valid(r.Result) {
			return reject(ReasonInvalidValue, "result is not valid JSON")
		}
	case OutcomeFailed:
		if len(r.Result) > 0 {
			return reject(ReasonInvalidValue, "result must be absent when outcome is failed")
		}
		if err := checkText("error", r.Error, maxReasonLen); err != nil {
			return err
		}
	case OutcomeAbandoned:
		if len(r.Result) > 0 || r.Error != "" {
			return reject(ReasonInvalidValue, "result and error must be absent when outcome is abandoned")
		}
		if r.LastAnswer == "" {
			return reject(ReasonMissingField, "last_answer is required when outcome is abandoned")
		}
	case OutcomeAccepted:
		if len(r.Result) > 0 || r.Error != "" {
			return reject(ReasonInvalidValue, "result and error must be absent when outcome is accepted")
		}
	case OutcomeThrottled:
		if len(r.Result) > 0 || r.Error != "" {
			return reject(ReasonInvalidValue, "result and error must be absent when outcome is throttled")
		}
		if r.RetryAfterMS <= 0 {
			return reject(ReasonMissingField, "retry_after_ms is required when outcome is throttled")
		}
	default:
		return reject(ReasonInvalidValue, "outcome %q is not ok, failed, abandoned, accepted or throttled", truncate(r.Outcome))
	}
	if r.RetryAfterMS != 0 && (r.Outcome != OutcomeThrottled || r.RetryAfterMS < 0 || r.RetryAfterMS > MaxHoldMS) {
		return reject(ReasonInvalidValue, "retry_after_ms %d: only with throttled, within [1, %d]", r.RetryAfterMS, int64(MaxHoldMS))
	}
	if r.HoldMS != 0 && (r.Outcome != OutcomeAccepted || r.HoldMS < 0 || r.HoldMS > MaxHoldMS) {
		return reject(ReasonInvalidValue, "hold_ms %d: only with accepted, within [0, %d]", r.HoldMS, int64(MaxHoldMS))
	}
	if r.LastAnswer != "" {
		if r.Outcome == OutcomeOK {
			return reject(ReasonInvalidValue, "last_answer must be absent when outcome is ok")
		}
		if err := checkText("last_answer", r.LastAnswer, MaxAnswerBytes); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		field string
		at    *time.Time
	}{{"started_at", r.StartedAt}, {"sent_at", r.SentAt}} {
		if t.at != nil {
			if err := checkTime(t.field, *t.at); err != nil {
				return err
			}
		}
	}
	if r.CallMicros < 0 || r.CallMicros > maxCallMicros {
		return reject(ReasonInvalidValue, "call_us %d is outside [0, %d]", r.CallMicros, int64(maxCallMicros))
	}
	return nil
}

// encodeCheck holds the result to CheckResult, for Encode: what a reply
// decoder would refuse is never encoded.
func (r StepReply) encodeCheck() error {
	if len(r.Result) == 0 || string(r.Result) == "null" {
		return nil
	}
	if err := CheckResult(r.Result, MaxResultBytes); err != nil {
		de, _ := AsDecodeError(err)
		return reject(de.Reason, "result: %s", de.Detail)
	}
	return nil
}

// checkMembers holds the result to CheckResult's rules from what the
// body's walk found (the walk made every other of its checks).
func (*StepReply) checkMembers(ms []member) error {
	m, ok := memberOf(ms, "result")
	if !ok || isNull(m.raw) {
		return nil
	}
	switch {
	case m.deepest > maxDepth-1:
		return reject(ReasonInvalidValue, "result: nested deeper than %d levels", maxDepth-1)
	case len(m.raw)+m.grow > MaxResultBytes:
		return reject(ReasonTooLarge, "result: %d bytes with its numbers written out in full, limit %d", len(m.raw)+m.grow, MaxResultBytes)
	}
	return nil
}

// DecodeStepReply decodes and validates a StepReply body.
func DecodeStepReply(body []byte) (StepReply, error) { return decodeStepReply(body, true) }

func decodeStepReply(body []byte, fast bool) (StepReply, error) {
	r, err := decodeValid[StepReply](body, []string{"order_id", "step", "attempt", "outcome"}, []string{"result"}, fast)
	if err != nil {
		return r, err
	}
	if string(r.Result) == "null" {
		r.Result = nil
	}
	return r, nil
}

// Order statuses carried by status events.
const (
	StatusReceived     = "received"
	StatusProcessing   = "processing"
	StatusCompleted    = "completed"
	StatusCompensating = "compensating"
	StatusFailed       = "failed"
	StatusError        = "error"
	// StatusRejected is never an order's status: the submitter sends it to
	// a submit's reply_to when it dead-letters the submit (with the
	// reason and detail), so that the application learns its order does
	// not exist.
	StatusRejected = "rejected"
)

// StatusEvent tells an order's new status to its reply_to queue and the
// status exchange.
type StatusEvent struct {
	SchemaVersion int `json:"schema_version"`
	// OrderID is the order's; absent only from a rejected event answering
	// a message that named no order sas could read (a callback whose token
	// is not one sas made): its correlation_id says what it answers.
	OrderID string `json:"order_id,omitempty"`
	Status  string `json:"status"`
	// Step is the step concerned, if any.
	Step *int      `json:"step"`
	At   time.Time `json:"at"`
	// Results, on the event that ends an order (completed, failed,
	// error), are the results of its actions by action name; when they
	// would take more than 32 KiB, ResultsTruncated is set instead.
	Results          json.RawMessage `json:"results,omitempty"`
	ResultsTruncated bool            `json:"results_truncated,omitempty"`
	// Reason and Detail, for a rejected submit, are its dead letter's
	// x-error-reason and x-error-detail. On the event that ends an order
	// failed or in error they say why: Reason is EndRefused, EndTimedOut,
	// EndCancelled or EndDeadline, Detail the failed step's last error and
	// its service's last answer (or the deadline that passed).
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`
	// FailedStep names the step that failed (Step is its number), on the
	// event that ends an order failed or in error because one did.
	FailedStep string `json:"failed_step,omitempty"`
	// Undone names the actions whose effects were undone by their
	// compensation, on the event that ends an order failed or in error:
	// Results still shows what they had returned. In a graph each action
	// is named once by its id (or action), the instances of a for_each
	// step together.
	Undone []string `json:"undone,omitempty"`
	// Skipped names, on the event that ends an order, the steps of a
	// graph that did not run because their when was false, by id (or
	// action).
	Skipped []string `json:"skipped,omitempty"`
}

// Why an order ended failed or in error (StatusEvent.Reason).
const (
	EndRefused   = "refused"   // a step's service refused it for good
	EndTimedOut  = "timed_out" // a step's complete_by passed as often as it may
	EndCancelled = "cancelled" // an operator cancelled the order
	EndDeadline  = "deadline"  // the order's whole-order deadline passed
)

// Type implements Message.
func (StatusEvent) Type() string { return TypeStatusEvent }

// Validate implements Message.
func (e StatusEvent) Validate() error {
	if e.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", e.SchemaVersion)
	}
	switch {
	case e.OrderID == "" && e.Status == StatusRejected:
		// the refusal of a message that named no order
	case e.OrderID == "":
		return reject(ReasonMissingField, "order_id is required but for a rejected event")
	default:
		if err := checkID("order_id", e.OrderID); err != nil {
			return err
		}
	}
	switch e.Status {
	case StatusReceived, StatusProcessing, StatusCompleted, StatusCompensating, StatusFailed, StatusError:
	case StatusRejected:
		if err := checkText("reason", e.Reason, 100); err != nil {
			return err
		}
	default:
		return reject(ReasonInvalidValue, "status %q is not an order status", truncate(e.Status))
	}
	if e.Detail != "" && len(e.Detail) > maxReasonLen {
		return reject(ReasonInvalidValue, "detail is %d bytes, limit %d", len(e.Detail), maxReasonLen)
	}
	if e.Status != StatusRejected && e.Reason != "" {
		switch {
		case e.Status != StatusFailed && e.Status != StatusError:
			return reject(ReasonInvalidValue, "reason is for a rejected, failed or error event, not %s", e.Status)
		case e.Reason != EndRefused && e.Reason != EndTimedOut && e.Reason != EndCancelled && e.Reason != EndDeadline:
			return reject(ReasonInvalidValue, "reason %q is not %s, %s, %s or %s", truncate(e.Reason), EndRefused, EndTimedOut, EndCancelled, EndDeadline)
		}
	}
	if e.FailedStep != "" {
		if err := checkName("failed_step", e.FailedStep, 100); err != nil {
			return err
		}
	}
	for _, name := range e.Undone {
		if err := checkName("undone", name, 100); err != nil {
			return err
		}
	}
	for _, name := range e.Skipped {
		if err := checkName("skipped", name, 100); err != nil {
			return err
		}
	}
	if len(e.Results) > 0 && !isObject(e.Results) {
		return reject(ReasonInvalidValue, "results must be a JSON object, not %s", jsonKind(e.Results))
	}
	if e.Step != nil && (*e.Step < 1 || *e.Step > MaxStep) {
		return reject(ReasonInvalidValue, "step %d is outside 1..%d", *e.Step, MaxStep)
	}
	return checkTime("at", e.At)
}

// DecodeStatusEvent decodes and validates a StatusEvent body.
func DecodeStatusEvent(body []byte) (StatusEvent, error) { return decodeStatusEvent(body, true) }

func decodeStatusEvent(body []byte, fast bool) (StatusEvent, error) {
	return decodeValid[StatusEvent](body, []string{"status", "at"}, []string{"results"}, fast)
}

// OperatorAlert tells a person that an order needs them.
type OperatorAlert struct {
	SchemaVersion int       `json:"schema_version"`
	OrderID       string    `json:"order_id"`
	Step          int       `json:"step"`
	Reason        string    `json:"reason"`
	FailureCount  int       `json:"failure_count"`
	At            time.Time `json:"at"`
	// Namespace is the order's namespace when it is not the default one
	// (absent for the default's, as before namespaces).
	Namespace string `json:"namespace,omitempty"`
}

// Type implements Message.
func (OperatorAlert) Type() string { return TypeOperatorAlert }

// Validate implements Message.
func (a OperatorAlert) Validate() error {
	if a.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", a.SchemaVersion)
	}
	if err := checkID("order_id", a.OrderID); err != nil {
		return err
	}
	if a.Step < 1 || a.Step > MaxStep {
		return reject(ReasonInvalidValue, "step %d is outside 1..%d", a.Step, MaxStep)
	}
	if err := checkText("reason", a.Reason, maxReasonLen); err != nil {
		return err
	}
	if a.FailureCount < 0 {
		return reject(ReasonInvalidValue, "failure_count %d is negative", a.FailureCount)
	}
	if a.Namespace != "" {
		if err := CheckNamespace(a.Namespace); err != nil {
			return reject(ReasonInvalidValue, "namespace: %v", err)
		}
	}
	return checkTime("at", a.At)
}

// DecodeOperatorAlert decodes and validates an OperatorAlert body.
func DecodeOperatorAlert(body []byte) (OperatorAlert, error) {
	return decodeValid[OperatorAlert](body, []string{"order_id", "step", "reason", "failure_count", "at"}, nil, true)
}

// StepRefOf reads, as leniently as encoding/json does, which attempt of
// which step a body that DecodeStepReply refused was meant to answer, so
// that a scheduler can fail that step at once with the refusal's reason
// instead of leaving it to run out its time. ok is false when the body
// does not name a valid order, step and attempt.
func StepRefOf(body []byte) (orderID string, step, attempt int, ok bool) {
	var ref struct {
		OrderID string `json:"order_id"`
		Step    int    `json:"step"`
		Attempt int    `json:"attempt"`
	}
	if len(body) > MaxBodyBytes || json.Unmarshal(body, &ref) != nil || checkStepRef(ref.OrderID, ref.Step, ref.Attempt) != nil {
		return "", 0, 0, false
	}
	id, _ := CanonicalID(ref.OrderID)
	return id, ref.Step, ref.Attempt, true
}

// RefusedRefOf reads, as leniently as encoding/json does, the reply_to
// and the order id of a message its decoder refused (a submit, a signal,
// a callback), so that its sender can be told why: a refusal made after
// reply_to could be read reaches it. ok is false when the body names no
// valid reply_to queue; orderID is "" when it names no valid order id
// (the refusal is then told without one).
func RefusedRefOf(body []byte) (orderID, replyTo string, ok bool) {
	var ref struct {
		OrderID any `json:"order_id"`
		ReplyTo any `json:"reply_to"`
	}
	if len(body) > MaxBodyBytes || json.Unmarshal(body, &ref) != nil {
		return "", "", false
	}
	replyTo, _ = ref.ReplyTo.(string)
	if replyTo == "" || checkName("reply_to", replyTo, 255) != nil || checkReplyTo(replyTo) != nil {
		return "", "", false
	}
	if s, isText := ref.OrderID.(string); isText {
		orderID, _ = CanonicalID(s)
	}
	return orderID, replyTo, true
}

// CorrelationID is the AMQP correlation_id of a submit as sas sends it
// back with the status event that answers the submit: at most 255
// visible ASCII characters, else none.
func CorrelationID(id string) string {
	if len(id) > 255 {
		return ""
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return ""
		}
	}
	return id
}

// Signal is a signal for an order: it ends the step of the order that
// waits for a signal of its name (a wait step), its payload the step's
// result; one that comes before the wait began is kept until it begins.
// The same signal_id twice is applied once.
//
// A signal with a Token is a callback: the service of a step that
// answered its call 202 Accepted ends the step (name "complete", the
// payload its result, a JSON object; or "fail", with Error) or holds it
// open ("heartbeat"). The token names the order, step and attempt:
// order_id may be left out (when given it must be the token's), and
// signal_id too (the callback is then known by its token and name).
type Signal struct {
	SchemaVersion int    `json:"schema_version"`
	SignalID      string `json:"signal_id,omitempty"`
	OrderID       string `json:"order_id,omitempty"`
	Name          string `json:"name"`
	// Payload is any JSON value of at most MaxPayloadBytes (checked
	// against the wait's schema, if it has one); for a callback's
	// "complete", the step's result.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Token is a step's token (contract.HeaderStepToken): the signal is
	// that step's callback.
	Token string `json:"token,omitempty"`
	// Error is, for a callback's "fail", why the step failed.
	Error string `json:"error,omitempty"`
	// ReplyTo names a queue told of a refusal by a status event
	// "rejected" (the order's own events go to the order's reply_to).
	ReplyTo string `json:"reply_to,omitempty"`
	// By names who sent it, for the history.
	By string `json:"by,omitempty"`
	// Workflow and Where name the order by business key instead of
	// OrderID: the order of that workflow that runs whose search
	// attributes have these values (a string, number or boolean each).
	// Exactly one must match, or every one that matches when All is set;
	// none, or several without All, is refused with why.
	Workflow string         `json:"workflow,omitempty"`
	Where    map[string]any `json:"where,omitempty"`
	All      bool           `json:"all,omitempty"`
}

// MaxWhere bounds a signal's business key conditions.
const MaxWhere = 8

// ByKey says whether the signal names its order by business key.
func (g Signal) ByKey() bool { return g.Workflow != "" || g.Where != nil }

// CheckWhere checks a signal's business key: at most MaxWhere search
// attribute names, each with a string (at most 256 bytes), a number or a
// boolean.
func CheckWhere(where map[string]any) error {
	if len(where) == 0 || len(where) > MaxWhere {
		return reject(ReasonInvalidValue, "where names the order by 1 to %d search attributes, not %d", MaxWhere, len(where))
	}
	for k, v := range where {
		if !attributeName.MatchString(k) {
			return reject(ReasonInvalidValue, "where: %q is not a search attribute's name", truncate(k))
		}
		switch v := v.(type) {
		case string:
			if len(v) > 256 {
				return reject(ReasonInvalidValue, "where.%s is %d bytes, limit 256", k, len(v))
			}
		case float64, bool, json.Number:
		default:
			return reject(ReasonInvalidValue, "where.%s must be a string, a number or a boolean", k)
		}
	}
	return nil
}

// attributeName is a search attribute's name (order_attributes.name).
var attributeName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// SignalVersion is the current Signal version.
const SignalVersion = 1

// Type implements Message.
func (Signal) Type() string { return TypeSignal }

// Validate implements Message.
func (g Signal) Validate() error {
	if g.SchemaVersion != SignalVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported (write %d)", g.SchemaVersion, SignalVersion)
	}
	if g.Token != "" {
		if g.ByKey() {
			return reject(ReasonInvalidValue, "a callback names its step by its token, not by workflow and where")
		}
		if err := g.validateCallback(); err != nil {
			return err
		}
	} else {
		if err := checkName("signal_id", g.SignalID, 200); err != nil {
			return err
		}
		switch {
		case g.ByKey():
			if g.OrderID != "" {
				return reject(ReasonInvalidValue, "name the order by order_id or by workflow and where, not both")
			}
			if err := checkName("workflow", g.Workflow, 64); err != nil {
				return err
			}
			if err := CheckWhere(g.Where); err != nil {
				return err
			}
		default:
			if err := checkID("order_id", g.OrderID); err != nil {
				return err
			}
			if g.All {
				return reject(ReasonInvalidValue, "all is for a signal that names its orders by workflow and where")
			}
		}
		if err := checkName("name", g.Name, 100); err != nil {
			return err
		}
		if g.Error != "" {
			return reject(ReasonInvalidValue, "error is for a callback's fail (a signal with a token)")
		}
	}
	if len(g.Payload) > 0 {
		if len(g.Payload) > MaxPayloadBytes {
			return reject(ReasonTooLarge, "payload is %d bytes, limit %d", len(g.Payload), MaxPayloadBytes)
		}
		if err := CheckJSON(g.Payload, MaxPayloadBytes); err != nil {
			return err
		}
	}
	if g.ReplyTo != "" {
		if err := checkName("reply_to", g.ReplyTo, 255); err != nil {
			return err
		}
		if err := checkReplyTo(g.ReplyTo); err != nil {
			return err
		}
	}
	if g.By != "" {
		if err := checkText("by", g.By, 100); err != nil {
			return err
		}
	}
	return nil
}

// The names of a callback (a Signal with a token).
const (
	CallbackComplete  = "complete"
	CallbackFail      = "fail"
	CallbackHeartbeat = "heartbeat"
)

// MaxTokenBytes bounds a signal's token (the tokens sas makes are
// shorter: steptoken.MaxLen).
const MaxTokenBytes = 200

// validateCallback checks what a callback's fields must be.
func (g Signal) validateCallback() error {
	if err := checkText("token", g.Token, MaxTokenBytes); err != nil {
		return err
	}
	if g.SignalID != "" {
		if err := checkName("signal_id", g.SignalID, 200); err != nil {
			return err
		}
	}
	if g.OrderID != "" {
		if err := checkID("order_id", g.OrderID); err != nil {
			return err
		}
	}
	switch g.Name {
	case CallbackComplete:
		if g.Error != "" {
			return reject(ReasonInvalidValue, "error must be absent when a callback completes its step")
		}
		if len(g.Payload) > 0 && string(g.Payload) != "null" {
			if !isObject(g.Payload) {
				return reject(ReasonInvalidValue, "payload (the step's result) must be a JSON object, not %s", jsonKind(g.Payload))
			}
			if err := CheckResult(g.Payload, MaxResultBytes); err != nil {
				de, _ := AsDecodeError(err)
				return reject(de.Reason, "payload (the step's result): %s", de.Detail)
			}
		}
	case CallbackFail:
		if len(g.Payload) > 0 {
			return reject(ReasonInvalidValue, "payload must be absent when a callback fails its step (say why in error)")
		}
		if err := checkText("error", g.Error, maxReasonLen); err != nil {
			return err
		}
	case CallbackHeartbeat:
		if len(g.Payload) > 0 || g.Error != "" {
			return reject(ReasonInvalidValue, "payload and error must be absent in a heartbeat")
		}
	default:
		return reject(ReasonInvalidValue, "name %q is not complete, fail or heartbeat, the names of a callback (a signal with a token)", truncate(g.Name))
	}
	return nil
}

// DecodeSignal decodes and validates a Signal body.
func DecodeSignal(body []byte) (Signal, error) {
	return decodeValid[Signal](body, []string{"name"}, []string{"payload"}, false)
}
