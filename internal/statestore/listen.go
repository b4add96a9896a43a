package statestore

import (
	"context"
	"fmt"
	"slices"
	"strings"

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
	// ChannelMore is notified by the scheduler that listens on the two
	// above when a claim took a whole batch: more may be waiting, and the
	// other schedulers, which do not listen there, help.
	ChannelMore = "sas_pending_more"
	// ChannelTimers tells the leading supervisor's timer loop, which
	// sleeps until the earliest timer it knows of, of a timer set for
	// sooner than it looks next (timer_set, timers_watch), and of an
	// operator's change to schedules or held orders.
	ChannelTimers = "sas_timers"
)

// SchedulerListenerLease names the lease held by the one scheduler, of
// those that claim for the agent kinds kinds, that listens on
// ChannelPending and ChannelOutbox (migration 0021). Schedulers that claim
// for other kinds hold a lease of their own.
func SchedulerListenerLease(kinds []string) string {
	sorted := slices.Clone(kinds)
	slices.Sort(sorted)
	return "scheduler-listener:" + strings.Join(sorted, ",")
}

// NotifyMore notifies ChannelMore.
func (s *Store) NotifyMore(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, current_schema())`, ChannelMore); err != nil {
		return fmt.Errorf("notify %s: %w", ChannelMore, err)
	}
	return nil
}

// wake notifies both channels at the commit of tx, for changes made
// outside a scheduler (sweeps, operator actions).
func wake(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, current_schema()), pg_notify($2, current_schema())`, ChannelPending, ChannelOutbox)
	return err
}

// notifyTimers notifies ChannelTimers at the commit of tx: the
// supervisor's timer loop looks again for its earliest timer.
func notifyTimers(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, current_schema())`, ChannelTimers)
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
	l := &Listener{conn: conn}
	if err := l.Add(ctx, channels...); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return l, nil
}

// Add listens on more channels.
func (l *Listener) Add(ctx context.Context, channels ...string) error {
	for _, ch := range channels {
		if _, err := l.conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return nil
}

// Remove stops listening on channels.
func (l *Listener) Remove(ctx context.Context, channels ...string) error {
	for _, ch := range channels {
		if _, err := l.conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("stop listening on %s: %w", ch, err)
		}
	}
	return nil
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
