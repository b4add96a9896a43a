package statestore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// NewOrder is an order as the submitter writes it.
type NewOrder struct {
	OrderID  string
	Workflow string
	Customer string
	// Items is the order's items as a JSON array.
	Items    []byte
	Amount   int64
	Currency string
	Priority int
	ReplyTo  string
	PlacedAt *time.Time
	// PayloadHash identifies the payload: a resubmission of the same
	// order_id with the same hash is a duplicate, with another a conflict.
	PayloadHash []byte
	// FailurePolicy is PolicyCompensate or PolicyHold.
	FailurePolicy string
	// Steps in step order: the actions first (the first is created
	// pending, the others waiting), then the compensations (waiting), the
	// one undoing the last action first.
	Steps []NewStep
	// Actor is who wrote the order (e.g. "submitter:host-123"), recorded in
	// the history.
	Actor string
}

// Failure policies.
const (
	PolicyCompensate = "compensate" // a failed action starts the compensations
	PolicyHold       = "hold"       // a failed action holds the order in error for an operator
)

// Step kinds.
const (
	KindAction       = "action"
	KindCompensation = "compensation"
)

// NewStep is one step of a new order.
type NewStep struct {
	Name  string
	Agent string
	// Kind is KindAction (the default) or KindCompensation.
	Kind string
	// Compensates is, for a compensation, the step number of the action
	// it undoes.
	Compensates int
	// Timeout is the budget a claim gives the step (complete_by = now() +
	// Timeout on the database clock).
	Timeout time.Duration
	// MaxFailures is the failure threshold: the supervisor marks the step
	// error when failure_count reaches it.
	MaxFailures int
}

// InsertOutcome says what InsertOrder did.
type InsertOutcome int

const (
	// Inserted: the order, its steps and their history were written.
	Inserted InsertOutcome = iota + 1
	// Duplicate: the same order with the same payload was already there;
	// nothing changed.
	Duplicate
)

func (o InsertOutcome) String() string {
	switch o {
	case Inserted:
		return "inserted"
	case Duplicate:
		return "duplicate"
	}
	return "unknown"
}

// IdempotencyKey is a step's key, stable across all its attempts, that
// agents send to the remote service.
func IdempotencyKey(orderID string, step int, name string) string {
	return fmt.Sprintf("%s/%d/%s", orderID, step, name)
}

// insertOrderSQL writes the order, its steps, the history of their creation
// and a "received" status event in one statement, and so in one
// transaction. ON CONFLICT DO NOTHING makes a resubmission write nothing; the
// caller then compares payload hashes.
const insertOrderSQL = `
WITH ins AS (
    INSERT INTO orders (order_id, workflow, customer, items, amount, currency, priority, reply_to, placed_at, payload_hash, failure_policy)
    VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9, $10, $17)
    ON CONFLICT (order_id) DO NOTHING
    RETURNING order_id, reply_to
), st AS (
    INSERT INTO steps (order_id, step, name, kind, compensates, agent, process_state, priority, timeout, max_failures, idempotency_key)
    SELECT ins.order_id, s.step, s.name, s.kind, NULLIF(s.compensates, 0), s.agent,
           CASE WHEN s.step = 1 THEN 'pending' ELSE 'waiting' END,
           $7, make_interval(secs => s.timeout_ms / 1000.0), s.max_failures, s.idempotency_key
    FROM ins,
         unnest($11::text[], $12::text[], $13::bigint[], $14::int[], $16::text[], $18::text[], $19::int[]) WITH ORDINALITY
             AS s(name, agent, timeout_ms, max_failures, idempotency_key, kind, compensates, step)
    RETURNING order_id, step, process_state
), hist AS (
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    SELECT order_id, NULL, NULL, 'received', $15, 'submitted' FROM ins
    UNION ALL
    SELECT order_id, step, NULL, process_state, $15, 'submitted' FROM st
), ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    SELECT 'status_event', order_id, reply_to, status_event_body(ins.order_id, 'received', NULL)
    FROM ins
)
SELECT count(*) FROM ins`

// insertArgs are insertOrderSQL's arguments for o.
func insertArgs(o NewOrder) ([]any, error) {
	if len(o.Steps) == 0 {
		return nil, fmt.Errorf("insert order %s: no steps", o.OrderID)
	}
	names := make([]string, len(o.Steps))
	agents := make([]string, len(o.Steps))
	timeouts := make([]int64, len(o.Steps))
	maxFailures := make([]int32, len(o.Steps))
	keys := make([]string, len(o.Steps))
	kinds := make([]string, len(o.Steps))
	compensates := make([]int32, len(o.Steps))
	for i, st := range o.Steps {
		names[i], agents[i] = st.Name, st.Agent
		timeouts[i] = st.Timeout.Milliseconds()
		maxFailures[i] = int32(st.MaxFailures)
		keys[i] = IdempotencyKey(o.OrderID, i+1, st.Name)
		kinds[i] = cmp.Or(st.Kind, KindAction)
		compensates[i] = int32(st.Compensates)
	}
	policy := cmp.Or(o.FailurePolicy, PolicyCompensate)
	return []any{o.OrderID, o.Workflow, o.Customer, o.Items, o.Amount, o.Currency, o.Priority, o.ReplyTo, o.PlacedAt, o.PayloadHash,
		names, agents, timeouts, maxFailures, o.Actor, keys, policy, kinds, compensates}, nil
}

// InsertOrder writes an order with its steps and their history in one
// transaction. The same order id with the same payload hash is a Duplicate
// and writes nothing; with another hash it is ErrConflict.
func (s *Store) InsertOrder(ctx context.Context, o NewOrder) (InsertOutcome, error) {
	args, err := insertArgs(o)
	if err != nil {
		return 0, err
	}
	var inserted int64
	if err := s.pool.QueryRow(ctx, insertOrderSQL, args...).Scan(&inserted); err != nil {
		return 0, fmt.Errorf("insert order %s: %w", o.OrderID, classify(err))
	}
	if inserted == 1 {
		return Inserted, nil
	}
	return s.existing(ctx, o)
}

// InsertOrders writes many orders in one transaction and one round trip,
// each as InsertOrder would; outcomes and errors are by index. If the
// transaction fails as a whole (one order's data refused, a database
// error), every order is written again on its own, so one bad order never
// holds up the others.
func (s *Store) InsertOrders(ctx context.Context, os []NewOrder) ([]InsertOutcome, []error) {
	outcomes := make([]InsertOutcome, len(os))
	errs := make([]error, len(os))
	inserted := make([]int64, len(os))
	batch := &pgx.Batch{}
	for i, o := range os {
		args, err := insertArgs(o)
		if err != nil {
			errs[i] = err
			continue
		}
		batch.Queue(insertOrderSQL, args...)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		br := tx.SendBatch(ctx, batch)
		for i := range os {
			if errs[i] != nil {
				continue
			}
			if err := br.QueryRow().Scan(&inserted[i]); err != nil {
				br.Close()
				return err
			}
		}
		return br.Close()
	})
	if err != nil {
		for i, o := range os {
			if errs[i] == nil {
				outcomes[i], errs[i] = s.InsertOrder(ctx, o)
			}
		}
		return outcomes, errs
	}
	for i, o := range os {
		switch {
		case errs[i] != nil:
		case inserted[i] == 1:
			outcomes[i] = Inserted
		default:
			outcomes[i], errs[i] = s.existing(ctx, o)
		}
	}
	return outcomes, errs
}

// existing tells a duplicate from a conflict for an order whose insert
// wrote nothing.
func (s *Store) existing(ctx context.Context, o NewOrder) (InsertOutcome, error) {
	// The statement's snapshot may predate a concurrent insert of the same
	// id that it waited for, so read the existing row in a new statement.
	var hash []byte
	err := s.pool.QueryRow(ctx, `SELECT payload_hash FROM orders WHERE order_id = $1`, o.OrderID).Scan(&hash)
	if errors.Is(err, pgx.ErrNoRows) {
		// Deleted between the two statements (retention): nothing of ours
		// was written, so let the caller retry.
		return 0, fmt.Errorf("insert order %s: existing row vanished, retry", o.OrderID)
	}
	if err != nil {
		return 0, fmt.Errorf("read existing order %s: %w", o.OrderID, err)
	}
	if !bytes.Equal(hash, o.PayloadHash) {
		return 0, fmt.Errorf("insert order %s: %w", o.OrderID, ErrConflict)
	}
	return Duplicate, nil
}
