package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outbox message types.
const (
	OutboxStatusEvent   = "status_event"
	OutboxOperatorAlert = "operator_alert"
	// OutboxStepEvent is a step's move told to subscribers
	// (messages.StepEvent), written while step events are heard.
	OutboxStepEvent = "step_event"
)

// OutboxMessage is a message written with a state change, to be published.
type OutboxMessage struct {
	ID        int64
	MessageID string
	Type      string // OutboxStatusEvent, OutboxOperatorAlert or OutboxStepEvent
	OrderID   string
	ReplyTo   string // the order's status queue, or ""
	Body      []byte
	// CorrelationID is the submission a "received" or "rejected" event
	// answers (its submit's correlation_id), "" for any other.
	CorrelationID string
	// Traceparent is the order's trace context (W3C), read only by a
	// store that keeps traces (TraceOrders); "" otherwise.
	Traceparent string
}

// ErrRelayBusy: another process is relaying the outbox right now.
var ErrRelayBusy = errors.New("another relay holds the outbox")

// ErrRelayHeld: the outbox's first message is held by its writer, who is
// publishing it (ApplyRepliesPublishing); nothing was relayed.
var ErrRelayHeld = fmt.Errorf("%w: its first message is held by its writer", ErrRelayBusy)

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
//
// A round is two round trips to the database, each a pipeline: the
// transaction's start, the lock and the read, then the delete and the
// commit. At low load every order's events take a round of their own, so
// the round trips, each waking a PostgreSQL backend and this process, are
// most of what relaying costs.
func (s *Store) RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []OutboxMessage) (int, error)) (int, error) {
	return s.RelayOutboxHeard(ctx, limit, 0, func(ctx context.Context, msgs []OutboxMessage) (int, []string, error) {
		n, err := publish(ctx, msgs)
		return n, nil, err
	})
}

// RelayOutboxHeard is RelayOutbox with a publish that also reports the
// statuses of progress events the broker returned (no queue was bound for
// them): in the transaction that deletes what was published, each is
// recorded as unheard for unheardFor (0: none is), and until then the
// store writes no progress event of that status for an order without a
// reply_to (status_heard, migration 0036).
func (s *Store) RelayOutboxHeard(ctx context.Context, limit int, unheardFor time.Duration, publish func(context.Context, []OutboxMessage) (int, []string, error)) (int, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("relay outbox: %w", err)
	}
	// A connection given back inside a transaction (an error half way) is
	// closed by the pool, never reused; relay ends its transaction itself
	// otherwise.
	defer conn.Release()
	done, publishErr, err := relay(ctx, conn.Conn(), s.traces, limit, unheardFor, publish)
	if err != nil {
		if !errors.Is(err, ErrRelayHeld) {
			done = 0
		}
		return done, fmt.Errorf("relay outbox: %w", err)
	}
	if publishErr != nil {
		return done, fmt.Errorf("relay outbox: publish: %w", publishErr)
	}
	return done, nil
}

// relayLockKey is the key of the relay's advisory lock: one a schema.
const relayLockKey = `hashtextextended('sas.outbox.' || current_schema(), 0)`

// relayLock tries the relay's lock (never waiting for it) and remembers
// whether it got it for the rest of the transaction; the commit will not
// wait for its WAL to reach disk: a delete lost in a crash only publishes
// its messages again, under the same message_id, which consumers take as
// repeats (as they must anyway: a confirmed publish whose delete then fails
// is the same). At low load that is one disk flush an order fewer. The
// read and the delete use their generic plans (see genericPlansExpr).
const relayLock = `
SELECT set_config('sas.relay_locked', pg_try_advisory_xact_lock(` + relayLockKey + `)::text, true) = 'true',
       set_config('synchronous_commit', 'off', true),
       ` + genericPlansExpr

// relayRead reads the messages to relay, only in a transaction that holds
// the lock. It must be a statement of its own, after relayLock's: a
// statement sees what was committed when it began, and one that began
// before it got the lock would miss the deletes of the relay that held it
// until then, and take its messages again.
//
// Each message says whether its writer still holds it (outbox.held_until,
// migration 0055: ApplyRepliesPublishing): the relay takes only the
// messages before the first one held, so that no event overtakes one its
// writer is publishing.
const relayRead = `
SELECT id, message_id::text, message_type, order_id::text, coalesce(reply_to, ''), body, coalesce(correlation_id, ''),
       coalesce(held_until > now(), false)
FROM outbox WHERE current_setting('sas.relay_locked') = 'true' ORDER BY id LIMIT $1`

// relayReadTraced is relayRead with each message's order's traceparent,
// for a process that traces: one primary-key lookup in orders a message.
const relayReadTraced = `
SELECT m.id, m.message_id::text, m.message_type, m.order_id::text, coalesce(m.reply_to, ''), m.body, coalesce(m.correlation_id, ''),
       coalesce(m.held_until > now(), false), coalesce(o.traceparent, '')
FROM (SELECT * FROM outbox WHERE current_setting('sas.relay_locked') = 'true' ORDER BY id LIMIT $1) m
LEFT JOIN orders o ON o.order_id = m.order_id
ORDER BY m.id`

// markUnheard records the statuses $1 as unheard for $2 milliseconds.
const markUnheard = `
INSERT INTO status_routes (status, unheard_until)
SELECT k, clock_timestamp() + $2 * interval '1 millisecond' FROM unnest($1::text[]) k
ON CONFLICT (status) DO UPDATE SET unheard_until = EXCLUDED.unheard_until`

func relay(ctx context.Context, conn *pgx.Conn, traced bool, limit int, unheardFor time.Duration,
	publish func(context.Context, []OutboxMessage) (int, []string, error)) (done int, publishErr, err error) {
	take := &pgx.Batch{}
	take.Queue(`BEGIN`)
	var (
		locked bool
		msgs   []OutboxMessage
		held   = -1 // the index of the first message held, if any
	)
	take.Queue(relayLock).QueryRow(func(row pgx.Row) error { return row.Scan(&locked, nil, nil) })
	read := relayRead
	if traced {
		read = relayReadTraced
	}
	take.Queue(read, limit).Query(func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var m OutboxMessage
			var isHeld bool
			dst := []any{&m.ID, &m.MessageID, &m.Type, &m.OrderID, &m.ReplyTo, &m.Body, &m.CorrelationID, &isHeld}
			if traced {
				dst = append(dst, &m.Traceparent)
			}
			if err := rows.Scan(dst...); err != nil {
				return err
			}
			if isHeld && held < 0 {
				held = len(msgs)
			}
			msgs = append(msgs, m)
		}
		return rows.Err()
	})
	if err := conn.SendBatch(ctx, take).Close(); err != nil {
		return 0, nil, err
	}
	if !locked {
		if err := rollback(ctx, conn); err != nil {
			return 0, nil, err
		}
		return 0, nil, ErrRelayBusy
	}
	if held >= 0 {
		// What comes from the first held message on waits for its writer
		// (or for its hold to pass): another relay round, soon.
		msgs = msgs[:held]
		if len(msgs) == 0 {
			if err := rollback(ctx, conn); err != nil {
				return 0, nil, err
			}
			return 0, nil, ErrRelayHeld
		}
	}
	if len(msgs) == 0 {
		return 0, nil, rollback(ctx, conn)
	}
	// What publish got through is deleted even when it then failed: the
	// rest is tried again next time.
	n, unheard, publishErr := publish(ctx, msgs)
	if n == 0 {
		return 0, publishErr, rollback(ctx, conn)
	}
	// Published messages are deleted, found through the primary key.
	ids := make([]int64, n)
	for i, m := range msgs[:n] {
		ids[i] = m.ID
	}
	end := &pgx.Batch{}
	end.Queue(`DELETE FROM outbox WHERE id = ANY($1)`, ids)
	if len(unheard) > 0 && unheardFor > 0 {
		end.Queue(markUnheard, unheard, unheardFor.Milliseconds())
	}
	end.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, end).Close(); err != nil {
		return 0, publishErr, err
	}
	if held >= 0 && publishErr == nil {
		return n, nil, ErrRelayHeld
	}
	return n, publishErr, nil
}

func rollback(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `ROLLBACK`)
	return err
}

// HearStatusEvents says that a queue was just bound for every status
// event (the API's, for the orders it follows): every status marked
// unheard is heard again. It waits for the relay round in flight, if any:
// that round's returns may be of publishes made before the binding, and
// its marks must not outlive this; every later round publishes to the
// bound queue, and hears no return. It then waits for the transactions
// writing orders at the time (await_writers, sql/10_orders.sql): one of
// them may have read a mark before it was cleared and write no event, so
// a listener that reads an order once this returned sees what such a
// transaction wrote.
func (s *Store) HearStatusEvents(ctx context.Context) error {
	if err := hear(ctx, s.pool, `UPDATE status_routes SET unheard_until = '-infinity' WHERE unheard_until > '-infinity' AND status <> 'step'`,
		"orders"); err != nil {
		return fmt.Errorf("hear status events: %w", err)
	}
	return nil
}

// HearStepEvents says that a queue was just bound for step events (step.#
// on the status exchange): the door of steps writes them from now on
// (they are written only once some listener has said so), until the
// broker returns one, and again, as progress events are, once that mark
// has passed. It waits for the relay round in flight and then for the
// transactions writing steps at the time, as HearStatusEvents does for
// orders.
func (s *Store) HearStepEvents(ctx context.Context) error {
	if err := hear(ctx, s.pool, `INSERT INTO status_routes (status, unheard_until) VALUES ('step', '-infinity')
ON CONFLICT (status) DO UPDATE SET unheard_until = '-infinity' WHERE status_routes.unheard_until > '-infinity'`, "steps"); err != nil {
		return fmt.Errorf("hear step events: %w", err)
	}
	return nil
}

// hearWritersWait bounds how long clearing a mark waits for the writers
// in flight: a listener that gives up binds again.
const hearWritersWait = 10 * time.Second

// hear clears a mark (clear), after the relay round in flight, then waits
// for the transactions that were writing table when it was cleared.
func hear(ctx context.Context, pool *pgxpool.Pool, clear, table string) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+relayLockKey+`)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, clear)
		return err
	})
	if err != nil {
		return err
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT await_writers($1::regclass, $2 * interval '1 millisecond')`, table,
		hearWritersWait.Milliseconds()).Scan(&gone); err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("transactions writing %s were still open after %s", table, hearWritersWait)
	}
	return nil
}

// forgetPublished deletes the held messages $1 their writer published;
// the commit does not wait for its WAL to reach disk (a delete lost in a
// crash publishes the message again once its hold has passed, under the
// same message_id, as a relay's lost delete does). It says whether the
// outbox still holds a message that is not held among its first three (a
// relay's to take; two writers forgetting at once each see the other's
// held message first, and the one after it too).
const forgetPublished = `
WITH gone AS (DELETE FROM outbox WHERE id = ANY($1) AND held_until IS NOT NULL)
SELECT set_config('synchronous_commit', 'off', true) IS NOT NULL
       AND EXISTS (SELECT 1 FROM (SELECT held_until FROM outbox WHERE id <> ALL($1) ORDER BY id LIMIT 3) m
                   WHERE m.held_until IS NULL OR m.held_until <= now())`

// ForgetPublished deletes the messages ids, held for their writer
// (ApplyRepliesPublishing), once it published them, and reports whether
// the outbox holds messages a relay should take now (the writer wakes
// one): those written after a held message waited for it.
func (s *Store) ForgetPublished(ctx context.Context, ids []int64) (bool, error) {
	var more bool
	if err := s.pool.QueryRow(ctx, forgetPublished, ids).Scan(&more); err != nil {
		return false, fmt.Errorf("forget published outbox messages: %w", err)
	}
	return more, nil
}

// OutboxBacklog counts unpublished outbox messages.
func (s *Store) OutboxBacklog(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	return n, nil
}

// TellRejected writes a status event for a submit the submitter refused
// (body: a "rejected" StatusEvent, encoded by the caller) to the outbox,
// for the relay to send to replyTo alone with the submit's correlationID
// (or none), and wakes the relays: the application learns its order does
// not exist, and the submitter needs no right to publish anywhere but its
// own queues. A refusal of a message that named no order (orderID "")
// is kept under the nil UUID, which no order has.
func (s *Store) TellRejected(ctx context.Context, orderID, replyTo, correlationID string, body []byte) error {
	_, err := s.pool.Exec(ctx, `
WITH ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body, correlation_id)
    VALUES ('status_event', coalesce(NULLIF($1, '')::uuid, '00000000-0000-0000-0000-000000000000'), $2, $3, NULLIF($5, ''))
)
SELECT pg_notify($4, current_schema())`, orderID, replyTo, string(body), ChannelOutbox, correlationID)
	if err != nil {
		return fmt.Errorf("tell rejected order %s: %w", orderID, err)
	}
	return nil
}
