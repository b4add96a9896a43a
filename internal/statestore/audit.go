package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// AuditOrder is everything the store knows of one order, for invariant
// checks after a fault run.
type AuditOrder struct {
	OrderID   string
	Status    string
	UpdatedAt time.Time
	Alerts    int
	Steps     []AuditStep
	History   []Transition
	// ParentOrder and ParentStep are, for a sub-process's child, the
	// order and step that started it ("" and 0 otherwise).
	ParentOrder string
	ParentStep  int
}

// AuditStep is one step row.
type AuditStep struct {
	Step           int
	Name           string
	Kind           string
	Compensates    int
	ProcessState   string
	Attempt        int
	FailureCount   int
	MaxFailures    int
	IdempotencyKey string
	// In a graph: the steps it needs, the for_each step an instance is
	// of (0: none), and whether it is a for_each step itself (it calls
	// no service; its instances do); Join, the rule by which it waits
	// for its needs.
	Needs []int
	workflow.Join
	Parent  int
	ForEach bool
	// InSystem: sas performs the step itself (a wait, a timer alone, a
	// sub-process and its undo): it calls no service.
	InSystem bool
	// DueAt is when a delayed step (or a wait's timeout) fell due, if it
	// had one; Wait and Child say the step is a wait or a sub-process;
	// Signals is how many signals (or callbacks) ended the step.
	DueAt   *time.Time
	Wait    bool
	Child   bool
	Signals int
	// UnsentAttempts are the attempts sas answered itself before any
	// request for them left: an action with Attempt <= UnsentAttempts
	// never reached its service.
	UnsentAttempts int
}

// Audit is the whole store, read in one snapshot.
type Audit struct {
	Orders      []AuditOrder
	Unpublished int // outbox messages never published
}

// ReadAudit reads every order with its steps, history and alert count, in
// one repeatable-read snapshot. Meant for test and fault-run sizes.
func (s *Store) ReadAudit(ctx context.Context) (Audit, error) {
	var a Audit
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		byID := map[string]int{}
		rows, err := tx.Query(ctx, `SELECT o.order_id::text, o.status, o.updated_at,
			(SELECT count(*) FROM alerts a WHERE a.order_id = o.order_id), coalesce(o.parent_order::text, ''), coalesce(o.parent_step, 0)
			FROM orders o ORDER BY o.order_id`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var o AuditOrder
			if err := rows.Scan(&o.OrderID, &o.Status, &o.UpdatedAt, &o.Alerts, &o.ParentOrder, &o.ParentStep); err != nil {
				rows.Close()
				return err
			}
			byID[o.OrderID] = len(a.Orders)
			a.Orders = append(a.Orders, o)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT order_id::text, step, name, kind, coalesce(compensates, 0), process_state, attempt,
			failure_count, max_failures, idempotency_key, needs, coalesce(spec, '{}'), coalesce(parent, 0),
			coalesce(spec ? 'for_each', false), agent = '', due_at, coalesce(spec ? 'wait', false), coalesce(spec ? 'workflow', false),
			(SELECT count(*) FROM signals g WHERE g.order_id = steps.order_id AND g.step = steps.step), unsent_attempts
			FROM steps ORDER BY order_id, step`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var st AuditStep
			if err := rows.Scan(&id, &st.Step, &st.Name, &st.Kind, &st.Compensates, &st.ProcessState, &st.Attempt,
				&st.FailureCount, &st.MaxFailures, &st.IdempotencyKey, &st.Needs, &st.Join, &st.Parent, &st.ForEach,
				&st.InSystem, &st.DueAt, &st.Wait, &st.Child, &st.Signals, &st.UnsentAttempts); err != nil {
				rows.Close()
				return err
			}
			if i, ok := byID[id]; ok {
				a.Orders[i].Steps = append(a.Orders[i].Steps, st)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT order_id::text, id, step, coalesce(from_state, ''), to_state, attempt, actor, reason, at
			FROM transitions ORDER BY order_id, id`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var t Transition
			if err := rows.Scan(&id, &t.ID, &t.Step, &t.From, &t.To, &t.Attempt, &t.Actor, &t.Reason, &t.At); err != nil {
				rows.Close()
				return err
			}
			if i, ok := byID[id]; ok {
				a.Orders[i].History = append(a.Orders[i].History, t)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&a.Unpublished)
	})
	if err != nil {
		return a, fmt.Errorf("read audit: %w", err)
	}
	return a, nil
}
