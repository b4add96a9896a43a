package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Outbox message types.
const (
	OutboxStatusEvent   = "status_event"
	OutboxOperatorAlert = "operator_alert"
)

// OutboxMessage is a message written with a state change, to be published.
type OutboxMessage struct {
	ID        int64
	MessageID string
	Type      string // OutboxStatusEvent or OutboxOperatorAlert
	OrderID   string
	ReplyTo   string // the order's status queue, or ""
	Body      []byte
}

// ErrRelayBusy: another process is relaying the outbox right now.
var ErrRelayBusy = errors.New("another relay holds the outbox")

// RelayOutbox takes up to limit unpublished outbox messages in id order,
// hands them to publish, and deletes the first n that publish reports
// done (an operator alert's record is its row in alerts). It returns n.
//
// One relay runs at a time (a transaction-level advisory lock; others get
// ErrRelayBusy), so messages are published in the order they were
// committed: events of one order come from transactions that each saw the
// one before committed, so they are never overtaken. The lock and the rows
// are held while publish talks to the broker; that is the price of the
// order, and it touches only the outbox, never a step.
func (s *Store) RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []OutboxMessage) (int, error)) (int, error) {
	done := 0
	var publishErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The commit does not wait for its WAL to reach disk: a delete
		// lost in a crash only publishes its messages again, under the
		// same message_id, which consumers take as repeats (as they must
		// anyway: a confirmed publish whose delete then fails is the
		// same). At low load that is one disk flush an order fewer.
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('sas.outbox.' || current_schema(), 0)),
			set_config('synchronous_commit', 'off', true)`).Scan(&locked, nil); err != nil {
			return err
		}
		if !locked {
			return ErrRelayBusy
		}
		rows, err := tx.Query(ctx, `
			SELECT id, message_id::text, message_type, order_id::text, coalesce(reply_to, ''), body
			FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1`, limit)
		if err != nil {
			return err
		}
		msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OutboxMessage, error) {
			var m OutboxMessage
			err := row.Scan(&m.ID, &m.MessageID, &m.Type, &m.OrderID, &m.ReplyTo, &m.Body)
			return m, err
		})
		if err != nil || len(msgs) == 0 {
			return err
		}
		// What publish got through is marked even when it then failed: the
		// rest is tried again next time.
		var n int
		n, publishErr = publish(ctx, msgs)
		if n == 0 {
			return nil
		}
		// Published messages are deleted, found through the unpublished
		// messages' index.
		ids := make([]int64, n)
		for i, m := range msgs[:n] {
			ids[i] = m.ID
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = ANY($1) AND published_at IS NULL`, ids); err != nil {
			return err
		}
		done = n
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("relay outbox: %w", err)
	}
	if publishErr != nil {
		return done, fmt.Errorf("relay outbox: publish: %w", publishErr)
	}
	return done, nil
}

// OutboxBacklog counts unpublished outbox messages.
func (s *Store) OutboxBacklog(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return n, nil
}

// TellRejected writes a status event for a submit the submitter refused
// (body: a "rejected" StatusEvent, encoded by the caller) to the outbox,
// for the relay to send to replyTo alone, and wakes the relays: the
// application learns its order does not exist, and the submitter needs
// no right to publish anywhere but its own queues.
func (s *Store) TellRejected(ctx context.Context, orderID, replyTo string, body []byte) error {
	_, err := s.pool.Exec(ctx, `
WITH ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body) VALUES ('status_event', $1, $2, $3)
)
SELECT pg_notify($4, current_schema())`, orderID, replyTo, string(body), ChannelOutbox)
	if err != nil {
		return fmt.Errorf("tell rejected order %s: %w", orderID, err)
	}
	return nil
}
