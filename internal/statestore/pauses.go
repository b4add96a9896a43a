package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// What pausing or resuming did.
const (
	Paused        = "paused"     // paused now
	AlreadyPaused = "already"    // it was paused
	Resumed       = "resumed"    // resumed now
	NotPaused     = "not_paused" // it was not paused
)

// Pause is why and since when something is paused: an order (by itself,
// or with its workflow), a workflow or an agent kind.
type Pause struct {
	// Scope is "order", "workflow" or "kind"; for an order paused with
	// its workflow, "workflow".
	Scope  string    `json:"scope"`
	Target string    `json:"target"`
	Since  time.Time `json:"paused_at"`
	By     string    `json:"paused_by"`
	Reason string    `json:"reason,omitempty"`
}

// PauseOrder pauses an order that runs (received, processing or
// compensating): nothing of it is claimed, its timers and deadline do not
// fire and the supervisor does not expire its steps until ResumeOrder;
// its steps in flight end normally. Unknown ids give ErrNotFound, an order
// that does not run ErrInvalidState. It returns Paused or AlreadyPaused.
func (s *Store) PauseOrder(ctx context.Context, orderID, reason, claimed string) (string, error) {
	var outcome string
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT pause_order($1, $2, $3)`, orderID, reason, claimed).Scan(&outcome)
	}); err != nil {
		return "", fmt.Errorf("pause: %w", operatorError(err))
	}
	return outcome, nil
}

// ResumeOrder resumes a paused order: its pending steps are due at once,
// its timers that fell due meanwhile fire, and its deadline has moved on
// by the time it was paused. It returns Resumed or NotPaused.
func (s *Store) ResumeOrder(ctx context.Context, orderID, claimed string) (string, error) {
	var outcome string
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT resume_order($1, $2)`, orderID, claimed).Scan(&outcome)
	}); err != nil {
		return "", fmt.Errorf("resume: %w", operatorError(err))
	}
	return outcome, nil
}

// PauseWorkflow pauses a workflow: every order of it that runs, and every
// order of it written until ResumeWorkflow (they wait, received and
// paused). It returns how many running orders it paused.
func (s *Store) PauseWorkflow(ctx context.Context, name, reason, claimed string) (int, error) {
	if err := workflow.CheckName("workflow", name, 64); err != nil {
		return 0, fmt.Errorf("pause workflow: %v: %w", err, ErrInvalidData)
	}
	var n int
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT pause_workflow($1, $2, $3)`, name, reason, claimed).Scan(&n)
	}); err != nil {
		return 0, fmt.Errorf("pause workflow: %w", operatorError(err))
	}
	return n, nil
}

// ResumeWorkflow resumes a paused workflow and the orders paused with it
// (one paused on its own stays paused). It returns how many it resumed,
// and ErrInvalidState when the workflow was not paused.
func (s *Store) ResumeWorkflow(ctx context.Context, workflow, claimed string) (int, error) {
	var n int
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT resume_workflow($1, $2)`, workflow, claimed).Scan(&n)
	}); err != nil {
		return 0, fmt.Errorf("resume workflow: %w", operatorError(err))
	}
	if n < 0 {
		return 0, fmt.Errorf("resume workflow: %s is not paused: %w", workflow, ErrInvalidState)
	}
	return n, nil
}

// PauseKind pauses an agent kind: none of its steps is claimed, in any
// order, until ResumeKind. It returns Paused or AlreadyPaused.
func (s *Store) PauseKind(ctx context.Context, kind, reason, claimed string) (string, error) {
	if err := workflow.CheckKind(kind); err != nil {
		return "", fmt.Errorf("pause kind: %v: %w", err, ErrInvalidData)
	}
	var outcome string
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT pause_kind($1, $2, $3)`, kind, reason, claimed).Scan(&outcome)
	}); err != nil {
		return "", fmt.Errorf("pause kind: %w", operatorError(err))
	}
	return outcome, nil
}

// ResumeKind resumes a paused agent kind. It returns Resumed or NotPaused.
func (s *Store) ResumeKind(ctx context.Context, kind, claimed string) (string, error) {
	var outcome string
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT resume_kind($1, $2)`, kind, claimed).Scan(&outcome)
	}); err != nil {
		return "", fmt.Errorf("resume kind: %w", operatorError(err))
	}
	return outcome, nil
}

// Pauses lists what is paused: workflows and agent kinds, then orders
// (those paused with their workflow too), the oldest first, at most limit
// orders.
func (s *Store) Pauses(ctx context.Context, limit int) ([]Pause, error) {
	return s.PausesIn(ctx, limit, nil)
}

// PausesIn is Pauses with only the orders of namespaces (nil: of every
// namespace); workflows and kinds are the deployment's, and listed.
func (s *Store) PausesIn(ctx context.Context, limit int, namespaces []string) ([]Pause, error) {
	rows, err := s.pool.Query(ctx, `
(SELECT 'workflow', workflow, paused_at, paused_by, reason FROM workflow_pauses ORDER BY paused_at)
UNION ALL
(SELECT 'kind', agent, paused_at, paused_by, reason FROM kind_pauses ORDER BY paused_at)
UNION ALL
(SELECT CASE p.scope WHEN 'order' THEN 'order' ELSE 'workflow order' END, p.order_id::text, p.paused_at, p.paused_by, p.reason
 FROM order_pauses p
 WHERE $2::text[] IS NULL OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = p.order_id AND o.namespace = ANY($2))
 ORDER BY p.paused_at LIMIT $1)`, max(limit, 1), namespaces)
	if err != nil {
		return nil, fmt.Errorf("pauses: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := row.Scan(&p.Scope, &p.Target, &p.Since, &p.By, &p.Reason)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("pauses: %w", err)
	}
	return out, nil
}

// PauseStats is what is paused, for the supervisor's gauges: how many of
// each and how long the oldest of each has been paused (database clock).
type PauseStats struct {
	Orders, Workflows, Kinds int
	Oldest                   map[string]time.Duration // by scope: order, workflow, kind
}

// PauseStats counts what is paused.
func (s *Store) PauseStats(ctx context.Context) (PauseStats, error) {
	st := PauseStats{Oldest: map[string]time.Duration{}}
	var o, w, k float64
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM order_pauses)::int, (SELECT count(*) FROM workflow_pauses)::int, (SELECT count(*) FROM kind_pauses)::int,
		coalesce(extract(epoch FROM clock_timestamp() - (SELECT min(paused_at) FROM order_pauses)), 0)::float8,
		coalesce(extract(epoch FROM clock_timestamp() - (SELECT min(paused_at) FROM workflow_pauses)), 0)::float8,
		coalesce(extract(epoch FROM clock_timestamp() - (SELECT min(paused_at) FROM kind_pauses)), 0)::float8`).
		Scan(&st.Orders, &st.Workflows, &st.Kinds, &o, &w, &k)
	if err != nil {
		return st, fmt.Errorf("pause stats: %w", err)
	}
	st.Oldest["order"] = time.Duration(o * float64(time.Second))
	st.Oldest["workflow"] = time.Duration(w * float64(time.Second))
	st.Oldest["kind"] = time.Duration(k * float64(time.Second))
	return st, nil
}

// SettlePauses keeps pauses whole (pauses_settle): the running orders of
// paused workflows paused, the pending steps of paused orders set aside.
// The leading supervisor runs it every sweep; it returns how many orders
// it paused.
func (s *Store) SettlePauses(ctx context.Context, by string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT pauses_settle($1)`, by).Scan(&n); err != nil {
		return 0, fmt.Errorf("settle pauses: %w", err)
	}
	return n, nil
}

// pauseOf reads an order's pause; nil when it is not paused.
func pauseOf(ctx context.Context, q querier, orderID string) (*Pause, error) {
	p := Pause{Target: orderID}
	err := q.QueryRow(ctx, `SELECT scope, paused_at, paused_by, reason FROM order_pauses WHERE order_id = $1`, orderID).
		Scan(&p.Scope, &p.Since, &p.By, &p.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &p, nil
}
