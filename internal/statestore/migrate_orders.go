package statestore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"sas/internal/workflow"
)

// MigrationVerdict says whether an order can move to another version of
// its workflow, and why not; Moved is set once it has.
type MigrationVerdict struct {
	OrderID string `json:"order_id"`
	From    string `json:"from_version"`
	To      string `json:"to_version"`
	CanMove bool   `json:"can_move"`
	Why     string `json:"why,omitempty"`
	Moved   bool   `json:"moved"`
	// Added and Dropped name the actions the move adds (not in the old
	// version) and drops (not yet run, not in the new one).
	Added   []string `json:"added,omitempty"`
	Dropped []string `json:"dropped,omitempty"`
}

// migrationRow is one step row of the new version, as order_migrate
// writes it: Old is the step it continues (0: a new row, written
// waiting).
type migrationRow struct {
	Old            int             `json:"old"`
	Step           int             `json:"step"`
	Name           string          `json:"name"`
	Kind           string          `json:"kind"`
	Compensates    int             `json:"compensates"`
	Agent          string          `json:"agent"`
	TimeoutMs      int64           `json:"timeout_ms"`
	MaxFailures    int             `json:"max_failures"`
	BackoffBaseMs  int64           `json:"backoff_base_ms"`
	BackoffMaxMs   int64           `json:"backoff_max_ms"`
	Needs          []int           `json:"needs"`
	Ancestors      []int           `json:"ancestors"`
	Spec           json.RawMessage `json:"spec"`
	IdempotencyKey string          `json:"idempotency_key"`
}

// refOf is what a step is known by across versions: its id, else its
// action.
func refOf(name string, spec []byte) string {
	var s struct {
		ID string `json:"id"`
	}
	if len(spec) > 0 && json.Unmarshal(spec, &s) == nil && s.ID != "" {
		return s.ID
	}
	return name
}

// planMigration decides whether an order (its status and steps) can move
// to the steps of another version, and how: every action it has begun
// (any state but waiting) must be in the new version, known by the same
// id or action, with the same action and agent, at the same position
// (replies, callbacks, children and the history name a step by its
// position: a step in flight, or one with a history); it must run (received or
// processing), have no for_each instances, and no compensation begun.
// Actions not yet begun and absent from the new version are dropped; the
// new version's other actions come waiting, and its compensations
// replace the old ones.
func planMigration(orderID, status string, cur []Step, next []NewStep) (rows []migrationRow, v MigrationVerdict) {
	v.OrderID = orderID
	refuse := func(format string, args ...any) ([]migrationRow, MigrationVerdict) {
		v.Why = fmt.Sprintf(format, args...)
		return nil, v
	}
	if status != OrderReceived && status != OrderProcessing {
		return refuse("it is %s: only an order that runs (received, processing) moves", status)
	}
	old := map[string]Step{}
	for _, st := range cur {
		switch {
		case st.Parent > 0:
			return refuse("its for_each step %d has instances", st.Parent)
		case st.Kind == KindCompensation && st.ProcessState != StepWaiting:
			return refuse("its compensation %s (step %d) has begun", st.Name, st.Step)
		case st.Kind == KindAction:
			old[cmp.Or(st.ID, st.Name)] = st
		}
	}
	seen := map[string]bool{}
	for i, ns := range next {
		kind := cmp.Or(ns.Kind, KindAction)
		r := migrationRow{Step: i + 1, Name: ns.Name, Kind: kind, Compensates: ns.Compensates, Agent: ns.Agent,
			TimeoutMs: ns.Timeout.Milliseconds(), MaxFailures: ns.MaxFailures, BackoffBaseMs: ns.BackoffBase.Milliseconds(),
			BackoffMaxMs: ns.BackoffMax.Milliseconds(), Needs: ns.Needs, Ancestors: ns.Ancestors, Spec: json.RawMessage(ns.Spec),
			IdempotencyKey: IdempotencyKey(orderID, i+1, ns.Name)}
		if kind == KindAction {
			ref := refOf(ns.Name, ns.Spec)
			if st, ok := old[ref]; ok {
				seen[ref] = true
				if st.ProcessState != StepWaiting && (st.Name != ns.Name || st.Agent != ns.Agent) {
					return refuse("step %s has begun (%s) as action %s of agent %s; the new version makes it action %s of agent %s",
						ref, st.ProcessState, st.Name, st.Agent, ns.Name, ns.Agent)
				}
				if st.ProcessState != StepWaiting && st.Step != i+1 {
					return refuse("step %s has begun (%s) at position %d, which the new version moves to %d (replies, callbacks, children and the history name a step by its position)",
						ref, st.ProcessState, st.Step, i+1)
				}
				r.Old = st.Step
				r.IdempotencyKey = st.IdempotencyKey
			} else {
				v.Added = append(v.Added, ref)
			}
		}
		rows = append(rows, r)
	}
	for ref, st := range old {
		if seen[ref] {
			continue
		}
		if st.ProcessState != StepWaiting {
			return refuse("step %s has begun (%s) and the new version has no step %s", ref, st.ProcessState, ref)
		}
		v.Dropped = append(v.Dropped, ref)
	}
	v.CanMove = true
	return rows, v
}

// MigrateOrder moves an order to wf's version (stored first, if it is
// not yet), or with apply false only says whether it can
// (planMigration's rules) and what would change. Moving is one
// transaction: the order's steps follow the new version (what ran keeps
// its state, results and keys), its history records the move, and it is
// pinned to the new version; what the new version lets run becomes
// pending. An order that cannot move is left as it is.
func (s *Store) MigrateOrder(ctx context.Context, orderID string, wf workflow.Workflow, apply bool, claimed string) (MigrationVerdict, error) {
	d, err := s.getOrder(ctx, orderID, false)
	if err != nil {
		return MigrationVerdict{}, err
	}
	if d.Order.Workflow != wf.Name {
		return MigrationVerdict{OrderID: orderID, Why: fmt.Sprintf("it runs workflow %s, not %s", d.Order.Workflow, wf.Name)}, nil
	}
	rows, v := planMigration(orderID, d.Order.Status, d.Steps, StepsOf(wf, 0))
	v.From, v.To = d.Order.WorkflowVersion, wf.Version()
	if v.CanMove && v.From == v.To {
		v.CanMove, v.Why = false, "it runs that version already"
	}
	if v.CanMove && !wf.In(d.Order.Namespace) {
		v.CanMove, v.Why = false, fmt.Sprintf("that version does not run in namespace %s, the order's", d.Order.Namespace)
	}
	if !apply || !v.CanMove {
		return v, nil
	}
	plan, err := json.Marshal(rows)
	if err != nil {
		return v, err
	}
	var why string
	err = againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT order_migrate($1, $2, $3, $4, $5, $6, $7)`, orderID, v.From, v.To, string(wf.Definition()), string(plan),
			strings.Join(v.Added, ", "), claimed).Scan(&why)
	})
	if err == nil && why != "" {
		v.CanMove, v.Why = false, why
	}
	if err != nil {
		var r *refusal
		if errors.As(operatorError(err), &r) {
			v.CanMove, v.Why = false, r.msg
			return v, nil
		}
		return v, fmt.Errorf("migrate order %s: %w", orderID, err)
	}
	v.Moved = v.CanMove
	return v, nil
}

// migrateAtOnce is how many orders MigrateOrders moves at once: each
// order is its own transaction, so a few at a time keep a bulk move of
// thousands of orders within seconds without taking the pool.
const migrateAtOnce = 4

// MigrateOrders is MigrateOrder for each of ids (canonical order ids),
// a few at a time; the verdicts come in ids' order. The first error
// stops what has not begun and is returned with no verdicts: orders
// already moved stay moved (each move is its own transaction), and a
// run again looks at them as at any other order.
func (s *Store) MigrateOrders(ctx context.Context, ids []string, wf workflow.Workflow, apply bool, claimed string) ([]MigrationVerdict, error) {
	verdicts := make([]MigrationVerdict, len(ids))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(migrateAtOnce)
	for i, id := range ids {
		g.Go(func() error {
			v, err := s.MigrateOrder(gctx, id, wf, apply, claimed)
			verdicts[i] = v
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return verdicts, nil
}

// RunningOrders lists, oldest first, at most limit orders of workflow
// that run (received, processing) on another version than version: the
// orders a migration to it looks at.
func (s *Store) RunningOrders(ctx context.Context, workflow, version string, limit int) ([]string, error) {
	return s.RunningOrdersIn(ctx, workflow, version, limit, nil)
}

// RunningOrdersIn is RunningOrders among the orders of namespaces only
// (nil: every namespace).
func (s *Store) RunningOrdersIn(ctx context.Context, workflow, version string, limit int, namespaces []string) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT order_id::text FROM orders
		WHERE workflow = $1 AND status IN ('received', 'processing') AND workflow_version IS DISTINCT FROM $2
		  AND ($4::text[] IS NULL OR namespace = ANY($4))
		ORDER BY created_at, order_id LIMIT $3`, workflow, version, limit, namespaces)
	if err != nil {
		return nil, fmt.Errorf("running orders: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("running orders: %w", err)
	}
	return ids, nil
}
