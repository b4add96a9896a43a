package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"sas/internal/messages"
)

// problem is an RFC 9457 problem document. Type names the kind of
// problem (urn:sas:problem:NAME, a name a program branches on), Title
// says it for people, Detail says what was wrong with this request.
type problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Reason is the same refusal's reason where the AMQP entrance has one
	// (invalid_payload, conflict, no_such_wait, ...).
	Reason string `json:"reason,omitempty"`
	// Errors lists every problem of a filter or body, when there are
	// several.
	Errors []string `json:"errors,omitempty"`
	// RetryAfter, for 429 and 503, is the seconds to wait (also the
	// Retry-After header).
	RetryAfter int `json:"retry_after,omitempty"`
}

// The kinds of problem.
const (
	probBadRequest      = "bad-request"
	probUnauthorized    = "unauthorized"
	probForbidden       = "forbidden"
	probNotFound        = "not-found"
	probMethod          = "method-not-allowed"
	probConflict        = "conflict"
	probTooLarge        = "too-large"
	probMediaType       = "unsupported-media-type"
	probInvalid         = "invalid"
	probRateLimited     = "rate-limited"
	probQuota           = "quota-exceeded"
	probUnavailable     = "unavailable"
	probInternal        = "internal"
	problemContentType  = "application/problem+json"
	problemTypePrefix   = "urn:sas:problem:"
	defaultRetrySeconds = 1
)

// maxProblemErrors bounds the list of a problem's errors.
const maxProblemErrors = 20

// writeProblem answers with a problem document of kind and status. Its
// detail, and each of its errors, is bounded as the AMQP entrance bounds
// a dead letter's (messages.MaxReasonBytes, made to fit by
// messages.BoundText): what a refusal says never grows with what was sent.
func writeProblem(w http.ResponseWriter, r *http.Request, status int, kind, detail string, more ...func(*problem)) {
	p := problem{Type: problemTypePrefix + kind, Title: http.StatusText(status), Status: status,
		Detail: messages.BoundText(detail, messages.MaxReasonBytes), Instance: messages.BoundText(r.URL.Path, 300)}
	for _, f := range more {
		f(&p)
	}
	if len(p.Errors) > maxProblemErrors {
		p.Errors = append(p.Errors[:maxProblemErrors:maxProblemErrors], fmt.Sprintf("and %d more", len(p.Errors)-maxProblemErrors))
	}
	for i, e := range p.Errors {
		p.Errors[i] = messages.BoundText(e, messages.MaxReasonBytes)
	}
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sas"`)
	}
	w.Header().Set("Content-Type", problemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}

func withReason(reason string) func(*problem) { return func(p *problem) { p.Reason = reason } }

func withErrors(errs []string) func(*problem) { return func(p *problem) { p.Errors = errs } }

func retryAfter(d time.Duration) func(*problem) {
	return func(p *problem) { p.RetryAfter = max(defaultRetrySeconds, int((d+time.Second-1)/time.Second)) }
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
