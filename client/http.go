package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"sas/internal/messages"
)

// HTTP uses sas through its HTTP API (cmd/api) instead of the broker:
// the same orders, for a program that cannot or would rather not speak
// AMQP. It is safe for concurrent use.
type HTTP struct {
	base  string
	token string
	hc    *http.Client
}

// NewHTTP returns a client of the API at baseURL (e.g.
// https://sas.example.com, without /api/v1) with an API token (sasctl api
// token create); hc nil means http.DefaultClient.
func NewHTTP(baseURL, token string, hc *http.Client) *HTTP {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &HTTP{base: strings.TrimRight(baseURL, "/") + "/api/v1", token: token, hc: hc}
}

// ProblemError is a refusal of the API (an RFC 9457 problem): Status is
// the HTTP status, Reason the same word the submit queue's dead letters
// carry where there is one.
type ProblemError struct {
	Status int
	Type   string
	Reason string
	Detail string
}

func (e *ProblemError) Error() string {
	return fmt.Sprintf("sas api: %d %s: %s", e.Status, strings.TrimPrefix(e.Type, "urn:sas:problem:"), e.Detail)
}

// do sends a request and decodes a 2xx answer into out (if not nil); a
// problem is a *ProblemError.
func (c *HTTP) do(ctx context.Context, method, path string, body []byte, out any, header ...string) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("sas api: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", messages.ContentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sas api: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("sas api: %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var p struct {
			Type, Reason, Detail string
		}
		_ = json.Unmarshal(b, &p)
		return resp.Header, &ProblemError{Status: resp.StatusCode, Type: p.Type, Reason: p.Reason, Detail: p.Detail}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.Header, fmt.Errorf("sas api: %s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// Submit writes an order and returns its id: taken (a new order, or the
// same order again) or refused, as a *RejectedError with the reason
// (invalid_payload, unknown_workflow, conflict, ...). Any other error
// means the order may or may not have been taken: call Submit again with
// the same ID.
func (c *HTTP) Submit(ctx context.Context, o Order) (string, error) {
	if o.ID == "" {
		o.ID = messages.NewID()
	}
	payload, err := json.Marshal(o.Payload)
	if err != nil {
		return "", fmt.Errorf("client: payload: %w", err)
	}
	body, err := messages.Encode(messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: o.ID, Workflow: o.Workflow,
		Payload: payload, Priority: o.Priority, PlacedAt: o.PlacedAt, StartAt: o.StartAt})
	if err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	_, err = c.do(ctx, http.MethodPost, "/orders", body, nil)
	var p *ProblemError
	if errors.As(err, &p) && (p.Status == http.StatusConflict || p.Status == http.StatusUnprocessableEntity || p.Status == http.StatusBadRequest) {
		return o.ID, &RejectedError{OrderID: o.ID, Reason: p.Reason, Detail: p.Detail}
	}
	return o.ID, err
}

// Await waits until the order ends (completed or failed) or is held in
// error, asking the API again every wait (at most its SAS_API_AWAIT_MAX)
// until then or until ctx ends.
func (c *HTTP) Await(ctx context.Context, id string, wait time.Duration) (Status, error) {
	for {
		var ev messages.StatusEvent
		h, err := c.do(ctx, http.MethodGet, fmt.Sprintf("/orders/%s/await?timeout=%s", id, wait), nil, &ev)
		if err != nil {
			return Status{}, err
		}
		if h.Get("Sas-Ended") == "true" {
			return statusOf(ev), nil
		}
		if ctx.Err() != nil {
			return Status{}, fmt.Errorf("client: await %s: %w", id, ctx.Err())
		}
	}
}

// Signal sends a signal for the order's wait (payload any value that
// marshals to JSON, or nil). It is refused at once, as a *ProblemError
// with the reason, when no step of the order could take it. The same
// signalID twice is applied once ("" makes a new one); it returns the id.
func (c *HTTP) Signal(ctx context.Context, orderID, name, signalID string, payload any) (string, error) {
	var body []byte
	if payload != nil {
		b, err := json.Marshal(payload)
		if err != nil {
			return "", fmt.Errorf("client: signal payload: %w", err)
		}
		body = b
	}
	if signalID == "" {
		signalID = messages.NewID()
	}
	_, err := c.do(ctx, http.MethodPost, fmt.Sprintf("/orders/%s/signals/%s", orderID, name), body, nil, "Idempotency-Key", signalID)
	return signalID, err
}
