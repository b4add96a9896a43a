package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The states of a webhook delivery.
const (
	WebhookPending = "pending"
	WebhookSent    = "sent"
	WebhookDead    = "dead"
)

// WebhookDelivery is an order's end to tell a workflow's webhook
// (migration 0039): written by the door of orders with the end itself.
type WebhookDelivery struct {
	ID        int64           `json:"id"`
	OrderID   string          `json:"order_id"`
	Workflow  string          `json:"workflow"`
	URL       string          `json:"url"`
	SecretEnv string          `json:"secret_env"`
	Event     string          `json:"event"`
	Body      json.RawMessage `json:"body"`
	State     string          `json:"state"`
	Attempts  int             `json:"attempts"`
	NextAt    time.Time       `json:"next_at"`
	LastError string          `json:"last_error,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	SentAt    *time.Time      `json:"sent_at,omitempty"`
}

const webhookColumns = `id, order_id::text, workflow, url, secret_env, event, body, state, attempts, next_at, coalesce(last_error, ''),
	created_at, sent_at`

func scanWebhook(row pgx.CollectableRow) (WebhookDelivery, error) {
	var w WebhookDelivery
	err := row.Scan(&w.ID, &w.OrderID, &w.Workflow, &w.URL, &w.SecretEnv, &w.Event, &w.Body, &w.State, &w.Attempts, &w.NextAt,
		&w.LastError, &w.CreatedAt, &w.SentAt)
	return w, err
}

// ClaimWebhooks takes up to limit deliveries due (on the database clock),
// oldest first, and holds each for lease: its next try is pushed that far
// out, so that a sender that dies leaves it to be tried again then, and
// no other sender takes it meanwhile.
func (s *Store) ClaimWebhooks(ctx context.Context, limit int, lease time.Duration) ([]WebhookDelivery, error) {
	rows, err := s.pool.Query(ctx, `UPDATE webhook_deliveries d SET next_at = clock_timestamp() + $2 * interval '1 millisecond'
		FROM (SELECT id FROM webhook_deliveries WHERE state = 'pending' AND next_at <= clock_timestamp()
		      ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED) due
		WHERE d.id = due.id
		RETURNING d.id, d.order_id::text, d.workflow, d.url, d.secret_env, d.event, d.body, d.state, d.attempts, d.next_at,
			coalesce(d.last_error, ''), d.created_at, d.sent_at`, limit, lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("claim webhooks: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanWebhook)
	if err != nil {
		return nil, fmt.Errorf("claim webhooks: %w", err)
	}
	return out, nil
}

// WebhookTry is what came of one try of a delivery.
type WebhookTry struct {
	ID int64
	OK bool
	// Why it failed (the endpoint's answer, or the error), for the
	// operator; at most 1,000 characters are kept.
	Why string
	// MaxAttempts: a delivery that failed this many times is dead.
	MaxAttempts int
	// Backoff: the wait before try n+1 is Backoff * 2^(n-1), at most
	// BackoffMax.
	Backoff, BackoffMax time.Duration
}

// WebhookTried records a try: sent, or failed and due again after its
// backoff, or dead at MaxAttempts. It returns the delivery's state.
func (s *Store) WebhookTried(ctx context.Context, t WebhookTry) (string, error) {
	var state string
	err := s.pool.QueryRow(ctx, `UPDATE webhook_deliveries SET attempts = attempts + 1,
		state = CASE WHEN $2 THEN 'sent' WHEN attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END,
		sent_at = CASE WHEN $2 THEN clock_timestamp() END,
		last_error = CASE WHEN $2 THEN NULL ELSE left($3, 1000) END,
		next_at = clock_timestamp() + least($5 * power(2, least(attempts, 30)), $6) * interval '1 millisecond'
		WHERE id = $1 AND state = 'pending' RETURNING state`,
		t.ID, t.OK, t.Why, t.MaxAttempts, t.Backoff.Milliseconds(), t.BackoffMax.Milliseconds()).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("webhook delivery %d: %w", t.ID, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("webhook delivery %d: %w", t.ID, classify(err))
	}
	return state, nil
}

// WebhookFilter selects deliveries to list.
type WebhookFilter struct {
	State   string // "": any
	OrderID string // "": any
	Limit   int
}

// ListWebhooks lists deliveries, newest first.
func (s *Store) ListWebhooks(ctx context.Context, f WebhookFilter) ([]WebhookDelivery, error) {
	var order *string
	if f.OrderID != "" {
		order = &f.OrderID
	}
	rows, err := s.pool.Query(ctx, `SELECT `+webhookColumns+` FROM webhook_deliveries
		WHERE ($1 = '' OR state = $1) AND ($2::uuid IS NULL OR order_id = $2::uuid) ORDER BY id DESC LIMIT $3`,
		f.State, order, max(f.Limit, 1))
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, scanWebhook)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	return out, nil
}

// ReplayWebhook makes a dead delivery due again now, its tries counted
// from 0. Unknown ids give ErrNotFound; one that is not dead
// ErrInvalidState.
func (s *Store) ReplayWebhook(ctx context.Context, id int64) error {
	tag, err := s.pool.Exec(ctx, `UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_at = clock_timestamp(), last_error = NULL
		WHERE id = $1 AND state = 'dead'`, id)
	if err != nil {
		return fmt.Errorf("replay webhook %d: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var state string
	switch err := s.pool.QueryRow(ctx, `SELECT state FROM webhook_deliveries WHERE id = $1`, id).Scan(&state); {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("webhook delivery %d: %w", id, ErrNotFound)
	case err != nil:
		return fmt.Errorf("replay webhook %d: %w", id, err)
	}
	return fmt.Errorf("webhook delivery %d is %s, not dead: %w", id, state, ErrInvalidState)
}
