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

	"sas/internal/remote"
)

// callOutcome is how a call with all its retries ended.
type callOutcome int

const (
	callOK        callOutcome = iota + 1 // the remote did it; result holds its answer
	callPermanent                        // the remote refused for good; reason says why
	callAbandoned                        // the deadline came first: say nothing
	callShutdown                         // the agent is stopping: hand the request back
)

type callResult struct {
	outcome callOutcome
	result  json.RawMessage
	reason  string
}

// caller calls the remote service with retries, per-endpoint circuit
// breakers, timeouts and a response-size cap.
type caller struct {
	client   *http.Client
	baseURL  string
	cfg      Config
	metrics  *metrics
	breakers sync.Map // endpoint -> *breaker
	now      func() time.Time
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
	retryAfter time.Duration
	reason     string // metric label for a transient failure
	detail     string
	body       []byte
}

// call performs endpoint for key until it succeeds, fails for good, or
// deadline (carried by ctx) comes. Transient faults are retried with
// exponential backoff and full jitter, waiting at least Retry-After, never
// past the deadline.
func (c *caller) call(ctx context.Context, endpoint, key string, body []byte) callResult {
	deadline, _ := ctx.Deadline()
	br := c.breaker(endpoint)
	for n := 0; ; n++ {
		var a attempt
		if br.allow() {
			a = c.once(ctx, endpoint, key, body)
			br.record(a.ok || a.permanent)
		} else {
			a = attempt{reason: "circuit_open", detail: "circuit breaker open"}
		}
		switch {
		case a.ok:
			return callResult{outcome: callOK, result: a.body}
		case a.permanent:
			return callResult{outcome: callPermanent, reason: a.detail}
		}
		if ctx.Err() != nil {
			return c.stopped(ctx)
		}
		// Full jitter: a uniform wait up to the exponential ceiling.
		ceiling := min(c.cfg.RetryMax, c.cfg.RetryBase<<min(n, 20))
		wait := time.Duration(rand.Int64N(int64(ceiling) + 1))
		wait = max(wait, a.retryAfter)
		if !deadline.IsZero() && !c.now().Add(wait).Before(deadline) {
			c.metrics.abandoned.WithLabelValues("deadline").Inc()
			return callResult{outcome: callAbandoned, reason: a.detail}
		}
		c.metrics.retries.WithLabelValues(endpoint, a.reason).Inc()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return c.stopped(ctx)
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

// once makes one request, bounded by the call timeout and the deadline.
func (c *caller) once(ctx context.Context, endpoint, key string, body []byte) attempt {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	start := c.now()
	a := c.exchange(ctx, endpoint, key, body)
	c.metrics.callDuration.WithLabelValues(endpoint).Observe(c.now().Sub(start).Seconds())
	result := "transient"
	switch {
	case a.ok:
		result = "ok"
	case a.permanent:
		result = "permanent"
	}
	c.metrics.calls.WithLabelValues(endpoint, result).Inc()
	return a
}

func (c *caller) exchange(ctx context.Context, endpoint, key string, body []byte) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/"+endpoint, bytes.NewReader(body))
	if err != nil {
		return attempt{permanent: true, detail: "build request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(remote.HeaderIdempotencyKey, key)
	resp, err := c.client.Do(req)
	if err != nil {
		reason := "network"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		return attempt{reason: reason, detail: err.Error()}
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		return attempt{reason: "network", detail: "read response: " + err.Error()}
	}
	status := resp.StatusCode
	switch {
	case status >= 200 && status < 300:
		if int64(len(respBody)) > c.cfg.MaxResponseBytes {
			return attempt{permanent: true, detail: fmt.Sprintf("%s answered more than %d bytes", endpoint, c.cfg.MaxResponseBytes)}
		}
		if !json.Valid(respBody) {
			return attempt{permanent: true, detail: endpoint + " answered something that is not JSON"}
		}
		return attempt{ok: true, body: respBody}
	case status == http.StatusTooManyRequests:
		return attempt{reason: "429", detail: "rate limited", retryAfter: retryAfter(resp.Header.Get("Retry-After"), c.now())}
	case status == http.StatusRequestTimeout, status == http.StatusConflict:
		return attempt{reason: strconv.Itoa(status), detail: fmt.Sprintf("%s answered %d", endpoint, status)}
	case status >= 400 && status < 500:
		return attempt{permanent: true, detail: fmt.Sprintf("%s answered %d: %s", endpoint, status, snippet(respBody))}
	default:
		return attempt{reason: "5xx", detail: fmt.Sprintf("%s answered %d: %s", endpoint, status, snippet(respBody))}
	}
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// snippet is the start of a response body, for a failure's reason: the
// remote's "error" field if it has one.
func snippet(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		body = []byte(e.Error)
	}
	s := strings.ToValidUTF8(string(body), "?")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
