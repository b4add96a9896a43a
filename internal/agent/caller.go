package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/contract"
	"sas/internal/messages"
	"sas/internal/secrets"
	"sas/internal/tracing"
)

// callOutcome is how a call with all its retries ended.
type callOutcome int

const (
	callOK        callOutcome = iota + 1 // the remote did it; result holds its answer
	callPermanent                        // the remote refused for good; reason says why
	callAbandoned                        // the deadline came first: say nothing
	callShutdown                         // the agent is stopping: hand the request back
	callAccepted                         // the remote answered 202: a callback will end the step
)

type callResult struct {
	outcome callOutcome
	result  json.RawMessage
	reason  string
	// lastAnswer is the last answer the service gave that was not the
	// result (attempt.answer), "" when every try got one or none was made.
	lastAnswer string
	// hold is, for callAccepted, how long the service asked the step to
	// be held open (Sas-Heartbeat); 0: the step's timeout.
	hold time.Duration
}

// call is one step's call: the same on every retry.
type call struct {
	action, key string
	attempt     int
	completeBy  time.Time
	body        []byte
	// token is the step's token, sent as Sas-Step-Token ("": none).
	token string
	// throttled, when set, hears of each 429 answered with a
	// Retry-After, before the wait for it.
	throttled func(retryAfter time.Duration)
}

// caller calls the remote services with retries, per-action circuit
// breakers, timeouts and a response-size cap.
type caller struct {
	cfg      Config
	metrics  *metrics
	breakers sync.Map // endpoint -> *breaker
	now      func() time.Time
	tr       *tracing.Tracing
	// redact hides the endpoints' secrets (and any credential) in every
	// text made of what a service said (an attempt's detail and answer,
	// a redirect's Location), where the text is made: before it is cut,
	// logged, put in a span or a reply.
	redact *secrets.Redactor
}

func (c *caller) breaker(endpoint string) *breaker {
	if b, ok := c.breakers.Load(endpoint); ok {
		return b.(*breaker)
	}
	gauge := c.metrics.circuit.WithLabelValues(endpoint)
	b, _ := c.breakers.LoadOrStore(endpoint, newBreaker(c.cfg.BreakerFailures, c.cfg.BreakerOpenFor, c.now,
		func(s int) { gauge.Set(float64(s)) }))
	return b.(*breaker)
}

// attempt is one HTTP exchange's classified outcome.
type attempt struct {
	ok         bool
	permanent  bool
	accepted   bool          // 202: a callback will end the step
	hold       time.Duration // with accepted: the Sas-Heartbeat asked for
	retryAfter time.Duration
	reason     string // metric label for a transient failure
	detail     string
	body       []byte
	status     int // the HTTP status, 0 when none came
	// answer is what the service answered, for an operator: the status
	// and the start of the body, or why no answer came; "" when no call
	// was made (the circuit was open) or the answer is the result.
	answer string
}

// call performs cl at ep until it succeeds, fails for good, or the
// deadline (carried by ctx) comes. Transient faults are retried with
// exponential backoff and full jitter, waiting at least Retry-After, never
// past the deadline.
func (c *caller) call(ctx context.Context, ep *endpoint, cl call) callResult {
	endpoint := cl.action
	deadline, _ := ctx.Deadline()
	br := c.breaker(endpoint)
	last := ""
	for n := 0; ; n++ {
		var a attempt
		if br.allow() {
			a = c.once(ctx, ep, cl, n+1)
			br.record(a.ok || a.permanent || a.accepted)
		} else {
			a = attempt{reason: "circuit_open", detail: "circuit breaker open"}
		}
		if a.answer != "" && ctx.Err() == nil {
			// (An attempt the step's own deadline cut short says nothing
			// of the service: the answer before it stands.)
			last = a.answer
		}
		switch {
		case a.ok:
			return callResult{outcome: callOK, result: a.body}
		case a.accepted:
			return callResult{outcome: callAccepted, lastAnswer: a.answer, hold: a.hold}
		case a.permanent:
			return callResult{outcome: callPermanent, reason: a.detail, lastAnswer: last}
		}
		if ctx.Err() != nil {
			res := c.stopped(ctx)
			res.lastAnswer = last
			return res
		}
		if a.status == http.StatusTooManyRequests && a.retryAfter > 0 && cl.throttled != nil {
			cl.throttled(a.retryAfter)
		}
		// Full jitter: a uniform wait up to the exponential ceiling.
		ceiling := min(c.cfg.RetryMax, c.cfg.RetryBase<<min(n, 20))
		wait := time.Duration(rand.Int64N(int64(ceiling) + 1))
		wait = max(wait, a.retryAfter)
		if !deadline.IsZero() && !c.now().Add(wait).Before(deadline) {
			c.metrics.abandoned.WithLabelValues("deadline").Inc()
			return callResult{outcome: callAbandoned, reason: a.detail, lastAnswer: last}
		}
		c.metrics.retries.WithLabelValues(endpoint, a.reason).Inc()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			res := c.stopped(ctx)
			res.lastAnswer = last
			return res
		case <-t.C:
		}
	}
}

func (c *caller) stopped(ctx context.Context) callResult {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		c.metrics.abandoned.WithLabelValues("deadline").Inc()
		return callResult{outcome: callAbandoned, reason: "deadline passed"}
	}
	return callResult{outcome: callShutdown, reason: "agent stopping"}
}

// once makes one request, the try-th of the call, bounded by the call
// timeout and the deadline. It is a span of the order's trace, whose
// context goes to the remote service in the request's headers.
func (c *caller) once(ctx context.Context, ep *endpoint, cl call, try int) attempt {
	endpoint := cl.action
	ctx, cancel := context.WithTimeout(ctx, ep.timeout)
	defer cancel()
	ctx, span := c.tr.Start(ctx, "call "+endpoint, trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	start := c.now()
	a := c.exchange(ctx, ep, cl)
	tracing.Observe(ctx, c.metrics.callDuration.WithLabelValues(endpoint), c.now().Sub(start).Seconds())
	result := "transient"
	switch {
	case a.ok:
		result = "ok"
	case a.permanent:
		result = "permanent"
	case a.accepted:
		result = "accepted"
	}
	c.metrics.calls.WithLabelValues(endpoint, result).Inc()
	if c.tr.On() {
		span.SetAttributes(attribute.String("sas.action", endpoint), attribute.Int("sas.try", try),
			attribute.String("sas.call_result", result))
		if a.status != 0 {
			span.SetAttributes(attribute.Int("http.response.status_code", a.status))
		}
		if !a.ok {
			span.SetAttributes(attribute.String("sas.retry_reason", a.reason))
			span.SetStatus(codes.Error, a.detail)
		}
	}
	return a
}

func (c *caller) exchange(ctx context.Context, ep *endpoint, cl call) attempt {
	endpoint := cl.action
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.url(cl.action), bytes.NewReader(cl.body))
	if err != nil {
		return attempt{permanent: true, detail: "build request: " + err.Error()}
	}
	for name, vs := range ep.headers {
		req.Header[name] = vs
	}
	req.Header.Set("Content-Type", contract.ContentType)
	req.Header.Set(contract.HeaderIdempotencyKey, cl.key)
	req.Header.Set(contract.HeaderCompleteBy, contract.FormatCompleteBy(cl.completeBy))
	req.Header.Set(contract.HeaderAttempt, strconv.Itoa(cl.attempt))
	if cl.token != "" {
		req.Header.Set(contract.HeaderStepToken, cl.token)
	}
	c.tr.InjectHTTP(ctx, req.Header)
	resp, err := ep.client.Do(req)
	if err != nil {
		reason, answer := "network", "no answer: "+c.redact.String(err.Error())
		if errors.Is(err, context.DeadlineExceeded) {
			reason, answer = "timeout", fmt.Sprintf("no answer in time (the call's timeout is %s)", ep.timeout)
		}
		return attempt{reason: reason, detail: c.redact.String(err.Error()), answer: answer}
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		return attempt{reason: "network", detail: "read response: " + c.redact.String(err.Error())}
	}
	status := resp.StatusCode
	a := c.classify(status, resp.Header, respBody, endpoint)
	a.status = status
	if !a.ok && !a.accepted {
		// The whole body, redacted; the reply's bound cuts it after.
		a.answer = fmt.Sprintf("%d %s: %s", status, http.StatusText(status), c.redact.String(string(respBody)))
	}
	return a
}

// classify turns a response into an attempt's outcome.
func (c *caller) classify(status int, header http.Header, respBody []byte, endpoint string) attempt {
	switch contract.Classify(status) {
	case contract.Accepted:
		a := attempt{accepted: true, answer: fmt.Sprintf("%d %s: waiting for the callback", status, http.StatusText(status))}
		if h := header.Get(contract.HeaderHeartbeat); h != "" {
			a.hold = contract.Heartbeat(h, c.now())
		}
		if s := bytes.TrimSpace(respBody); len(s) > 0 {
			a.answer = fmt.Sprintf("%d %s: %s", status, http.StatusText(status), c.snippet(s))
		}
		return a
	case contract.OK:
		if int64(len(respBody)) > c.cfg.MaxResponseBytes {
			return attempt{permanent: true, detail: fmt.Sprintf("%s answered more than %d bytes (SAS_AGENT_MAX_RESPONSE_BYTES)", endpoint, c.cfg.MaxResponseBytes)}
		}
		if len(bytes.TrimSpace(respBody)) == 0 {
			return attempt{ok: true} // done, with no result to pass on
		}
		if !json.Valid(respBody) || bytes.TrimSpace(respBody)[0] != '{' {
			return attempt{permanent: true, detail: endpoint + " answered something that is not a JSON object"}
		}
		// What the scheduler's decoder and the state store would refuse
		// fails the step here, with the true reason, instead of a reply
		// no scheduler takes.
		if err := messages.CheckResult(respBody, int(c.cfg.MaxResponseBytes)); err != nil {
			de, _ := messages.AsDecodeError(err)
			return attempt{permanent: true, detail: fmt.Sprintf("%s answered %d with a result the state store cannot keep (%s): %s",
				endpoint, status, de.Reason, de.Detail)}
		}
		return attempt{ok: true, body: respBody}
	case contract.Permanent:
		if status >= 300 && status < 400 {
			return attempt{permanent: true, detail: fmt.Sprintf("%s answered %d, a redirect to %s: the agent follows no redirect (an endpoint may allow a 307 or 308 to its own origin with redirects: same_origin)",
				endpoint, status, c.location(header.Get("Location")))}
		}
		return attempt{permanent: true, detail: fmt.Sprintf("%s answered %d: %s", endpoint, status, c.snippet(respBody))}
	}
	a := attempt{reason: "5xx", detail: fmt.Sprintf("%s answered %d: %s", endpoint, status, c.snippet(respBody))}
	switch status {
	case http.StatusTooManyRequests:
		a.reason, a.detail = "429", "rate limited"
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly:
		a.reason = strconv.Itoa(status)
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		a.retryAfter = contract.RetryAfter(header.Get(contract.HeaderRetryAfter), c.now())
	}
	return a
}

// location is a redirect's Location for a failure's reason: redacted
// (no user info, no endpoint secret in any encoding), then cut to at
// most 300 bytes.
func (c *caller) location(loc string) string {
	if loc == "" {
		return "nowhere (no Location)"
	}
	return strconv.Quote(messages.BoundText(c.redact.String(loc), 300))
}

// snippet is the start of a response body, for a failure's reason: the
// remote's "error" field if it has one; redacted, then cut to 200 bytes,
// so that no part of a secret is left by the cut.
func (c *caller) snippet(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		body = []byte(e.Error)
	}
	s := c.redact.String(strings.ToValidUTF8(string(body), "?"))
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	return s
}
