package supervisor

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// Webhooks: the supervisors post each delivery the door of orders wrote
// (an order's end, for each webhook of its workflow told of that end),
// signed, and try again with backoff until it is taken or dead.

// HeaderSignature carries a delivery's signature: t=UNIX,v1=HEX, HEX the
// HMAC-SHA256 under the webhook's secret of "UNIX.BODY" (as Stripe signs:
// the receiver checks it, and that UNIX is recent, before it believes
// the body).
const HeaderSignature = "Sas-Signature"

// HeaderWebhookID names the delivery: the same on every try of it, so a
// receiver takes it once.
const HeaderWebhookID = "Sas-Webhook-Id"

// webhookStore is what the sender needs of the state store.
type webhookStore interface {
	ClaimWebhooks(ctx context.Context, limit int, lease time.Duration) ([]statestore.WebhookDelivery, error)
	WebhookTried(ctx context.Context, t statestore.WebhookTry) (string, error)
}

// webhookSender posts deliveries.
type webhookSender struct {
	store  webhookStore
	client *http.Client
	cfg    Config
	// env reads a secret from the supervisor's environment.
	env func(string) (string, bool)
	// now is the clock a signature's time comes from.
	now    func() time.Time
	logger logger
	sent   func(outcome string)
}

type logger interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
}

// webhookBatch is how many deliveries a sender takes at once; it holds
// them for the time it may take to try them all.
const webhookBatch = 5

func newWebhookClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout,
		// A redirect is an answer, never followed: the signature and the
		// body go only to the address the file names.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// envelope is the body a webhook gets.
type envelope struct {
	ID      int64           `json:"id"`
	Type    string          `json:"type"`
	OrderID string          `json:"order_id"`
	At      time.Time       `json:"at"`
	Data    json.RawMessage `json:"data"`
}

// sign is a delivery's signature header: t=UNIX,v1=HEX.
func sign(secret string, at time.Time, body []byte) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte(ts))
	h.Write([]byte("."))
	h.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(h.Sum(nil))
}

// run tries what is due until ctx ends: at once after a round that found
// work, else after a wait that doubles from SAS_SUPERVISOR_WEBHOOK_POLL
// up to 8 of it.
func (w *webhookSender) run(ctx context.Context) {
	wait := w.cfg.WebhookPoll
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := w.round(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			w.logger.Warn("webhooks: a round failed", "err", err)
			wait = w.cfg.WebhookPoll
		case n > 0:
			wait = 0
		case wait == 0:
			wait = w.cfg.WebhookPoll
		default:
			wait = min(2*wait, 8*w.cfg.WebhookPoll)
		}
		t.Reset(wait)
	}
}

// round claims what is due and tries each; it returns how many it tried.
func (w *webhookSender) round(ctx context.Context) (int, error) {
	lease := time.Duration(webhookBatch+1) * w.cfg.WebhookTimeout
	due, err := w.store.ClaimWebhooks(ctx, webhookBatch, lease)
	if err != nil {
		return 0, err
	}
	for _, d := range due {
		ok, why := w.try(ctx, d)
		state, err := w.store.WebhookTried(ctx, statestore.WebhookTry{ID: d.ID, OK: ok, Why: why, MaxAttempts: w.cfg.WebhookAttempts,
			Backoff: w.cfg.WebhookBackoff, BackoffMax: w.cfg.WebhookBackoffMax})
		if err != nil {
			return len(due), err
		}
		w.sent(state)
		if state == statestore.WebhookDead {
			w.logger.Warn("webhook delivery dead: an operator may replay it (sasctl webhooks replay)", "id", d.ID, "order_id", d.OrderID,
				"url", d.URL, "attempts", d.Attempts+1, "last_error", why)
		}
	}
	return len(due), nil
}

// try posts one delivery; it reports whether the endpoint took it (2xx),
// else why not.
func (w *webhookSender) try(ctx context.Context, d statestore.WebhookDelivery) (bool, string) {
	secret, ok := w.env(d.SecretEnv)
	if !ok || secret == "" {
		return false, "the supervisor's environment has no " + d.SecretEnv + " (the webhook's secret_env): not sent"
	}
	at := w.now()
	kind := "order." + d.Event
	if strings.HasPrefix(d.Event, "step.") {
		kind = d.Event // a step event: step.awaiting, ...
	}
	body, err := json.Marshal(envelope{ID: d.ID, Type: kind, OrderID: d.OrderID, At: at.UTC(), Data: d.Body})
	if err != nil {
		return false, "the body could not be written: " + err.Error()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		return false, "the request could not be made: " + err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sas-webhooks/1")
	req.Header.Set(HeaderWebhookID, strconv.FormatInt(d.ID, 10))
	req.Header.Set(HeaderSignature, sign(secret, at, body))
	resp, err := w.client.Do(req)
	if err != nil {
		return false, "not sent: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode/100 == 2:
		return true, ""
	case resp.StatusCode/100 == 3:
		return false, fmt.Sprintf("answered %s (a redirect is not followed: the signed body goes only to the address the file names)", resp.Status)
	}
	return false, "answered " + resp.Status
}

// lookupEnv reads the supervisor's environment.
func lookupEnv(name string) (string, bool) { return os.LookupEnv(name) }

// hasWebhooks reports whether a workflow of reg names a webhook: a
// supervisor without any sends none and never looks.
func hasWebhooks(reg *workflow.Registry) bool {
	if reg == nil {
		return false
	}
	for _, wf := range reg.All() {
		if len(wf.Webhooks) > 0 {
			return true
		}
	}
	return false
}
