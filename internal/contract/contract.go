// Package contract is the HTTP contract between an agent and the remote
// service it calls for a step: the request body, the headers, and what
// each answer means to sas. docs/remote-service.openapi.yaml describes the
// same contract for services written in any language; tests keep the two
// in step.
//
// A call is POST {base URL}{path} with a JSON Request body, where the path
// is /v1/{action} unless the agent's endpoint configuration names another.
// Every attempt of one step sends the same body and the same
// Idempotency-Key; the attempt and the deadline travel in headers so that
// they never change the body. A service must apply a key's effect at most
// once and answer a repeated key with the answer of the first that applied
// it; a refusal applied nothing and is not kept as the key's answer (a
// resubmit after its cause is fixed comes with the same key).
package contract

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers of a call.
const (
	// HeaderIdempotencyKey carries the step's key: the same on every
	// attempt of the step, different for every other step.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderCompleteBy is the step's deadline (RFC 3339, UTC): an effect
	// applied after it may be ignored by sas, so a service should refuse
	// (408) work it cannot finish by then.
	HeaderCompleteBy = "Sas-Complete-By"
	// HeaderAttempt is the step's attempt number, from 1, for the
	// service's logs: it never changes what the service should do.
	HeaderAttempt = "Sas-Attempt"
	// HeaderRetryAfter is read from a 429 or 503 answer: seconds or an
	// HTTP date, the least time before the next attempt.
	HeaderRetryAfter = "Retry-After"
	// HeaderTraceparent is the W3C trace context of the call's span, sent
	// when the agents trace: a service instrumented with OpenTelemetry
	// continues the order's trace from it.
	HeaderTraceparent = "traceparent"
	// HeaderStepToken carries the step's token: a service that answers
	// 202 Accepted presents it later in the callback (a signal with the
	// token) that completes or fails the step, or holds it open. A token
	// names one attempt: a later attempt of the step comes with another,
	// and only the step's running attempt's token counts.
	HeaderStepToken = "Sas-Step-Token"
	// HeaderHeartbeat is read from a 202 answer: seconds (or an HTTP
	// date) the service asks the step to be held open, instead of the
	// step's timeout; never past the step's max_duration.
	HeaderHeartbeat = "Sas-Heartbeat"
)

// ContentType is the content type of a request and of a 2xx answer.
const ContentType = "application/json"

// DefaultPath is the path of an action when the endpoint names none.
func DefaultPath(action string) string { return "/v1/" + action }

// Request is the body of a call.
type Request struct {
	OrderID string `json:"order_id"`
	// Step is the step's number in its order (compensations come after
	// the actions).
	Step int `json:"step"`
	// Action is the step's name in the workflow.
	Action string `json:"action"`
	// Payload is the order's payload as submitted: any JSON object.
	Payload json.RawMessage `json:"payload"`
	// Results holds the result of every earlier action of the order that
	// returned one, by action name: a JSON object.
	Results json.RawMessage `json:"results,omitempty"`
	// Undoes is set on a compensation only: the idempotency key of the
	// action it undoes. A service that finds no effect for that key must
	// answer 2xx (nothing to undo) and make sure the action cannot happen
	// later.
	Undoes string `json:"undoes,omitempty"`
	// UndoneResult is, for a compensation, the result of the action it
	// undoes, if that action returned one (a refund gets the charge id).
	UndoneResult json.RawMessage `json:"undone_result,omitempty"`
	// Input is, when the workflow says input for the step, what its
	// expression built from payload and results: what the service needs.
	Input json.RawMessage `json:"input,omitempty"`
	// Item and Index are, for one instance of a for_each step (or its
	// undo), its element of the list and its position.
	Item  json.RawMessage `json:"item,omitempty"`
	Index *int            `json:"index,omitempty"`
}

// Class is what an answer means to the agent.
type Class int

const (
	// OK: done; the body (a JSON object) is the step's result.
	OK Class = iota + 1
	// Permanent: refused for good; the step fails without retrying.
	Permanent
	// Transient: not done this time; the agent retries with backoff
	// (honouring Retry-After) until the step's deadline.
	Transient
	// Accepted: the service took the work and will end the step later, by
	// a callback with the step's token; the step waits for it.
	Accepted
)

func (c Class) String() string {
	switch c {
	case OK:
		return "ok"
	case Permanent:
		return "permanent"
	case Transient:
		return "transient"
	case Accepted:
		return "accepted"
	}
	return "unknown"
}

// Classify says what an HTTP status means: 202 is Accepted (a callback
// will end the step), any other 2xx is OK; 408 (timeout), 409
// (the key is in flight), 425 and 429 (slow down) and every 5xx are
// Transient; any other 4xx is Permanent (422 included: the key was used
// with another body), and so is a redirect (3xx): a redirect is an answer,
// not a hop, and an agent follows none but a 307 or 308 to the endpoint's
// own origin, when the endpoint allows it. Anything else (1xx) is
// Transient.
func Classify(status int) Class {
	switch {
	case status == http.StatusAccepted:
		return Accepted
	case status >= 200 && status < 300:
		return OK
	case status >= 300 && status < 400:
		return Permanent
	case status == http.StatusRequestTimeout, status == http.StatusConflict,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return Transient
	case status >= 400 && status < 500:
		return Permanent
	}
	return Transient
}

// MaxRetryAfter is the longest wait a Retry-After asks that sas takes: a
// service that asks longer (a year, a date decades away) is read as
// asking this. It bounds both the agent's wait before its next try and
// how long a 429 lowers its kind's rate.
const MaxRetryAfter = time.Hour

// MaxHeartbeat is the longest hold a Sas-Heartbeat asks that sas takes
// (a step's max_duration bounds it further).
const MaxHeartbeat = 366 * 24 * time.Hour

// RetryAfter reads a Retry-After header (whole seconds, or an HTTP date)
// as the wait from now, at most MaxRetryAfter; 0 when absent, unreadable,
// negative or past.
func RetryAfter(h string, now time.Time) time.Duration { return Delay(h, now, MaxRetryAfter) }

// Heartbeat reads a Sas-Heartbeat header as RetryAfter does, at most
// MaxHeartbeat.
func Heartbeat(h string, now time.Time) time.Duration { return Delay(h, now, MaxHeartbeat) }

// Delay reads a header of whole seconds or an HTTP date as the wait from
// now, typed and bounded before it acts: at most most, 0 when absent,
// unreadable, negative or past. A number too large for any clock is
// most, never an overflow.
func Delay(h string, now time.Time, most time.Duration) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" || len(h) > 64 {
		return 0
	}
	if s, err := strconv.ParseInt(h, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		switch {
		case s < 0 || strings.HasPrefix(h, "-"):
			return 0
		case errors.Is(err, strconv.ErrRange) || s > int64(most/time.Second):
			return most
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return min(max(t.Sub(now), 0), most)
	}
	return 0
}

// FormatCompleteBy writes a deadline for HeaderCompleteBy.
func FormatCompleteBy(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// ParseCompleteBy reads HeaderCompleteBy.
func ParseCompleteBy(h string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, strings.TrimSpace(h))
}

// ErrorBody is the body of a non-2xx answer, by convention: sas quotes
// Error in the step's last error.
type ErrorBody struct {
	Error string `json:"error"`
}

// ParseHeaders reads "Name: value" lines (blank lines and # comments
// skipped): the headers an agent sends with every call to a service, its
// credentials. The headers of the contract itself cannot be set so.
func ParseHeaders(lines []byte) (http.Header, error) {
	h := http.Header{}
	sc := bufio.NewScanner(bytes.NewReader(lines))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("header line %d is not \"Name: value\"", n)
		}
		switch http.CanonicalHeaderKey(name) {
		case HeaderIdempotencyKey, HeaderCompleteBy, HeaderAttempt, "Content-Type", "Content-Length", "Host":
			return nil, fmt.Errorf("header line %d: %s is set by the agent", n, name)
		}
		h.Add(name, value)
	}
	return h, sc.Err()
}
