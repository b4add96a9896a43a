package messages

import (
	"encoding/json"
	"fmt"
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
)

// Message is implemented by every wire message.
type Message interface {
	// Type is the message's type name (TypeSubmitOrder, ...).
	Type() string
	// Validate reports the first value out of range as a *DecodeError.
	Validate() error
}

// Encode validates m and returns its JSON body.
func Encode(m Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.Type(), err)
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
type SubmitOrder struct {
	SchemaVersion int    `json:"schema_version"`
	OrderID       string `json:"order_id"`
	Customer      string `json:"customer"`
	Items         []Item `json:"items"`
	// Amount in the currency's minor units (cents): never fractional.
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Priority 0 (default) to 9; higher is claimed first.
	Priority int `json:"priority,omitempty"`
	// ReplyTo names the queue that receives this order's status events.
	ReplyTo string `json:"reply_to,omitempty"`
	// Workflow names the steps to run; empty means the default workflow.
	Workflow string `json:"workflow,omitempty"`
	// PlacedAt is when the customer placed the order, for the record.
	PlacedAt *time.Time `json:"placed_at,omitempty"`
}

// Item is one line of an order.
type Item struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

// Type implements Message.
func (SubmitOrder) Type() string { return TypeSubmitOrder }

// Validate implements Message.
func (o SubmitOrder) Validate() error {
	if o.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", o.SchemaVersion)
	}
	if err := checkID("order_id", o.OrderID); err != nil {
		return err
	}
	if err := checkText("customer", o.Customer, maxText); err != nil {
		return err
	}
	if err := checkItems(o.Items); err != nil {
		return err
	}
	if err := checkAmount(o.Amount, o.Currency); err != nil {
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
	return nil
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
// form that is stored and hashed.
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
// same order exactly when their canonical forms are equal.
func (o SubmitOrder) Canonical() []byte {
	n := o.Normalized()
	if b, ok := n.appendJSON(make([]byte, 0, 256)); ok {
		return b // the bytes json.Marshal writes (FuzzFastEncodeMatchesJSON)
	}
	b, _ := json.Marshal(n) // a struct of plain fields always marshals
	return b
}

// DecodeSubmitOrder decodes and validates a SubmitOrder body.
func DecodeSubmitOrder(body []byte) (SubmitOrder, error) { return decodeSubmitOrder(body, true) }

func decodeSubmitOrder(body []byte, fast bool) (SubmitOrder, error) {
	o, err := decodeValid[SubmitOrder](body, []string{"order_id", "customer", "items", "amount", "currency"}, nil, fast)
	if err != nil {
		return o, err
	}
	return o.Normalized(), nil
}

// OrderPayload is the part of an order an agent needs.
type OrderPayload struct {
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

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
	CompleteBy time.Time    `json:"complete_by"`
	Payload    OrderPayload `json:"payload"`
	// Undoes is, for a compensating step, the idempotency key of the
	// action it undoes.
	Undoes string `json:"undoes,omitempty"`
}

// Type implements Message.
func (StepRequest) Type() string { return TypeStepRequest }

// Validate implements Message.
func (r StepRequest) Validate() error {
	if r.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", r.SchemaVersion)
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
	if err := checkText("payload.customer", r.Payload.Customer, maxText); err != nil {
		return err
	}
	if err := checkItems(r.Payload.Items); err != nil {
		return err
	}
	return checkAmount(r.Payload.Amount, r.Payload.Currency)
}

func checkStepRef(orderID string, step, attempt int) error {
	if err := checkID("order_id", orderID); err != nil {
		return err
	}
	if step < 1 || step > 1000 {
		return reject(ReasonInvalidValue, "step %d is outside 1..1000", step)
	}
	if attempt < 1 {
		return reject(ReasonInvalidValue, "attempt %d must be at least 1", attempt)
	}
	return nil
}

// DecodeStepRequest decodes and validates a StepRequest body.
func DecodeStepRequest(body []byte) (StepRequest, error) { return decodeStepRequest(body, true) }

func decodeStepRequest(body []byte, fast bool) (StepRequest, error) {
	return decodeValid[StepRequest](body,
		[]string{"order_id", "step", "name", "agent", "attempt", "idempotency_key", "complete_by", "payload"}, nil, fast)
}

// Step reply outcomes.
const (
	OutcomeOK     = "ok"
	OutcomeFailed = "failed" // failed for good: retrying will not help
)

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
	// StartedAt (when the agent took the request), CallMicros (the remote
	// call, retries included) and SentAt (when the reply left) are the
	// agent's own clock readings, optional, kept with the step for the
	// latency breakdown (sasctl bench). Nothing decides on them.
	StartedAt  *time.Time `json:"started_at,omitempty"`
	CallMicros int64      `json:"call_us,omitempty"`
	SentAt     *time.Time `json:"sent_at,omitempty"`
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
	default:
		return reject(ReasonInvalidValue, "outcome %q is not ok or failed", truncate(r.Outcome))
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
)

// StatusEvent tells an order's new status to its reply_to queue and the
// status exchange.
type StatusEvent struct {
	SchemaVersion int    `json:"schema_version"`
	OrderID       string `json:"order_id"`
	Status        string `json:"status"`
	// Step is the step concerned, if any.
	Step *int      `json:"step"`
	At   time.Time `json:"at"`
}

// Type implements Message.
func (StatusEvent) Type() string { return TypeStatusEvent }

// Validate implements Message.
func (e StatusEvent) Validate() error {
	if e.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", e.SchemaVersion)
	}
	if err := checkID("order_id", e.OrderID); err != nil {
		return err
	}
	switch e.Status {
	case StatusReceived, StatusProcessing, StatusCompleted, StatusCompensating, StatusFailed, StatusError:
	default:
		return reject(ReasonInvalidValue, "status %q is not an order status", truncate(e.Status))
	}
	if e.Step != nil && (*e.Step < 1 || *e.Step > 1000) {
		return reject(ReasonInvalidValue, "step %d is outside 1..1000", *e.Step)
	}
	return checkTime("at", e.At)
}

// DecodeStatusEvent decodes and validates a StatusEvent body.
func DecodeStatusEvent(body []byte) (StatusEvent, error) { return decodeStatusEvent(body, true) }

func decodeStatusEvent(body []byte, fast bool) (StatusEvent, error) {
	return decodeValid[StatusEvent](body, []string{"order_id", "status", "at"}, nil, fast)
}

// OperatorAlert tells a person that an order needs them.
type OperatorAlert struct {
	SchemaVersion int       `json:"schema_version"`
	OrderID       string    `json:"order_id"`
	Step          int       `json:"step"`
	Reason        string    `json:"reason"`
	FailureCount  int       `json:"failure_count"`
	At            time.Time `json:"at"`
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
	if a.Step < 1 || a.Step > 1000 {
		return reject(ReasonInvalidValue, "step %d is outside 1..1000", a.Step)
	}
	if err := checkText("reason", a.Reason, maxReasonLen); err != nil {
		return err
	}
	if a.FailureCount < 0 {
		return reject(ReasonInvalidValue, "failure_count %d is negative", a.FailureCount)
	}
	return checkTime("at", a.At)
}

// DecodeOperatorAlert decodes and validates an OperatorAlert body.
func DecodeOperatorAlert(body []byte) (OperatorAlert, error) {
	return decodeValid[OperatorAlert](body, []string{"order_id", "step", "reason", "failure_count", "at"}, nil, true)
}
