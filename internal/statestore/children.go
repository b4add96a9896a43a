package statestore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// StepsOf lays a workflow out as a new order's steps (workflow.Rows); a
// stepTimeout other than 0 replaces every step's timeout.
func StepsOf(wf workflow.Workflow, stepTimeout time.Duration) []NewStep {
	rows := wf.Rows()
	steps := make([]NewStep, len(rows))
	for i, r := range rows {
		kind := KindAction
		if r.Compensates > 0 {
			kind = KindCompensation
		}
		steps[i] = NewStep{Name: r.Name, Agent: r.Agent, Kind: kind, Compensates: r.Compensates,
			Timeout: cmp.Or(stepTimeout, r.Timeout), MaxFailures: r.MaxFailures, BackoffBase: r.BackoffBase, BackoffMax: r.BackoffMax,
			Needs: r.Needs, Ancestors: r.Ancestors, Spec: r.Spec()}
	}
	return steps
}

// DerivedHash is the payload hash of an order sas starts itself (a
// sub-process's child, a schedule's): its workflow and payload, so that
// the same order started again is a duplicate.
func DerivedHash(workflowName string, payload []byte) []byte {
	h := sha256.New()
	h.Write([]byte("derived\x00" + workflowName + "\x00"))
	h.Write(payload)
	return h.Sum(nil)
}

// insertOwnOrder writes, in tx, an order sas starts itself (a child, a
// schedule's) with the workflow version it runs, as the submitter writes
// one; it reports whether the order is new (false: its id was written
// before, and nothing changed).
func insertOwnOrder(ctx context.Context, tx pgx.Tx, o NewOrder, version WorkflowVersion) (bool, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO workflow_versions (name, version, definition, created_by) VALUES ($1, $2, $3, $4)
		ON CONFLICT (name, version) DO NOTHING`, version.Name, version.Version, string(version.Definition), version.CreatedBy); err != nil {
		return false, err
	}
	a := insertArrays{}
	a.add(o, 1)
	idxs, err := runInsert(ctx, tx, &a)
	if err != nil {
		return false, fmt.Errorf("insert order %s: %w", o.OrderID, classify(err))
	}
	return len(idxs) == 1, nil
}

// ErrTooDeep is why a child is not started: its parent is at the deepest
// depth a child may have (workflow.MaxDepth) already.
var ErrTooDeep = errors.New("too deep")

// StartChild starts the child order of a claimed sub-process step, in
// one transaction, fenced as a reply is: the child (its id derived from
// the step, so that a retried claim finds the same one) is written with
// the workflow version it runs, linked to its parent and step, and the
// step awaits its end. An order that no longer runs cancels the claim
// instead; a parent at workflow.MaxDepth gives ErrTooDeep and changes
// nothing. A claim that is no longer the step's gives a *StaleReplyError.
func (s *Store) StartChild(ctx context.Context, c ClaimedStep, child NewOrder, version WorkflowVersion, actor string) (GraphResult, error) {
	var res GraphResult
	stale := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var verdict string
		var depth int
		if err := tx.QueryRow(ctx, `SELECT verdict, depth, next_step, order_status FROM step_child_check($1, $2, $3, $4)`,
			c.OrderID, c.Step, c.Attempt, actor).Scan(&verdict, &depth, &res.NextStep, &res.OrderStatus); err != nil {
			return err
		}
		switch {
		case verdict == "stale":
			stale = true
			return nil
		case verdict == "cancelled":
			return nil
		case depth+1 > workflow.MaxDepth:
			return ErrTooDeep
		}
		// A child is in its parent's namespace.
		if err := tx.QueryRow(ctx, `SELECT namespace FROM orders WHERE order_id = $1`, c.OrderID).Scan(&child.Namespace); err != nil {
			return err
		}
		if _, err := insertOwnOrder(ctx, tx, child, version); err != nil {
			return err
		}
		var applied bool
		return tx.QueryRow(ctx, `SELECT applied, next_step, order_status FROM step_start_child($1, $2, $3, $4, $5)`,
			c.OrderID, c.Step, c.Attempt, child.OrderID, actor).Scan(&applied, &res.NextStep, &res.OrderStatus)
	})
	switch {
	case errors.Is(err, ErrTooDeep):
		return GraphResult{}, err
	case err != nil:
		return GraphResult{}, fmt.Errorf("start the child of order %s step %d: %w", c.OrderID, c.Step, classify(err))
	case stale:
		return GraphResult{}, s.staleReason(ctx, Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt})
	}
	return res, nil
}

// UndoChild begins a claimed compensation of a sub-process step: the
// step's child is undone (a completed child too) and the compensation
// awaits its end, or, with nothing to undo, is processed at once. A claim
// that is no longer the step's gives a *StaleReplyError.
func (s *Store) UndoChild(ctx context.Context, c ClaimedStep, actor string) (GraphResult, error) {
	return s.answerFor(ctx, c, "undo the child of", `step_undo_child($1, $2, $3, $4)`, actor)
}

// ChildRef is an order's parent or one of its children.
type ChildRef struct {
	OrderID string
	// Step is the parent's step that started the child.
	Step     int
	Workflow string
	Status   string
}

// Family reads an order's parent (nil for an order submitted) and its
// children, oldest first.
func (s *Store) Family(ctx context.Context, orderID string) (*ChildRef, []ChildRef, error) {
	parent, children, err := family(ctx, s.pool, orderID)
	if err != nil {
		return nil, nil, fmt.Errorf("read the family of order %s: %w", orderID, classify(err))
	}
	return parent, children, nil
}

func family(ctx context.Context, q querier, orderID string) (*ChildRef, []ChildRef, error) {
	var parent *ChildRef
	var p ChildRef
	err := q.QueryRow(ctx, `SELECT p.order_id::text, o.parent_step, p.workflow, p.status FROM orders o JOIN orders p ON p.order_id = o.parent_order
		WHERE o.order_id = $1`, orderID).Scan(&p.OrderID, &p.Step, &p.Workflow, &p.Status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, nil, err
	default:
		parent = &p
	}
	rows, err := q.Query(ctx, `SELECT order_id::text, parent_step, workflow, status FROM orders WHERE parent_order = $1 ORDER BY created_at, order_id`, orderID)
	if err != nil {
		return nil, nil, err
	}
	children, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChildRef, error) {
		var c ChildRef
		err := r.Scan(&c.OrderID, &c.Step, &c.Workflow, &c.Status)
		return c, err
	})
	if err != nil {
		return nil, nil, err
	}
	return parent, children, nil
}
