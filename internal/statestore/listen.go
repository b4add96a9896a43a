package statestore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Notification channels.
const (
	// ChannelPending is notified when new orders' steps are written and
	// when the supervisor or an operator makes steps pending. A scheduler's
	// own claims and replies do not notify (see migration 0007): it wakes
	// its own loops.
	ChannelPending = "sas_pending"
	// ChannelOutbox is notified when the supervisor or an operator writes
	// outbox messages.
	ChannelOutbox = "sas_outbox"
)

// wake notifies both channels at the commit of tx, for changes made
// outside a scheduler (sweeps, operator actions).
func wake(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, current_schema()), pg_notify($2, current_schema())`, ChannelPending, ChannelOutbox)
	return err
}

// Listener holds a dedicated connection that LISTENs on channels.
type Listener struct {
	conn *pgx.Conn
}

// Listen opens a connection of its own, with the pool's settings, and
// listens on channels.
func (s *Store) Listen(ctx context.Context, channels ...string) (*Listener, error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("listen: connect: %w", err)
	}
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			conn.Close(ctx)
			return nil, fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return &Listener{conn: conn}, nil
}

// Wait blocks until a notification arrives and returns its channel. The
// payload is the schema that sent it: a notification for another schema
// (another deployment or test in the same database) is skipped.
func (l *Listener) Wait(ctx context.Context, schema string) (string, error) {
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			return "", err
		}
		if schema == "" || n.Payload == schema {
			return n.Channel, nil
		}
	}
}

// Schema returns the connection's current schema, as notifications carry it.
func (l *Listener) Schema(ctx context.Context) (string, error) {
	var s string
	err := l.conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&s)
	return s, err
}

// Close closes the connection.
func (l *Listener) Close(ctx context.Context) error {
	return l.conn.Close(ctx)
}
