package statestore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OrderRow is an order as a list shows it: no payload.
type OrderRow struct {
	OrderID         string    `json:"order_id"`
	Workflow        string    `json:"workflow"`
	WorkflowVersion string    `json:"workflow_version,omitempty"`
	Status          string    `json:"status"`
	Priority        int       `json:"priority"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
	// Failure, for an order failed or in error because a step failed, is
	// why: the step's name and last error, and its service's last answer.
	Failure string `json:"failure,omitempty"`
	// Partition, in a partitioned deployment's merged lists, is the
	// partition holding the order (the store leaves it empty).
	Partition string `json:"partition,omitempty"`
}

// OrderCursor is where a page of orders, newest first, ends: the next
// page starts after it. Orders are ordered by (created_at, order_id),
// both descending.
type OrderCursor struct {
	CreatedAt time.Time
	OrderID   string
}

// OrderQuery selects a page of orders, newest first.
type OrderQuery struct {
	Status   string    // "" for any
	Workflow string    // "" for any
	From, To time.Time // created at or after From, before To; zero for no bound
	// Attrs select by search attributes, all of them.
	Attrs []AttrCond
	// IDLow and IDHigh bound the order id (an id prefix turned into the
	// range of ids that start with it); "" for no bound.
	IDLow, IDHigh string
	After         *OrderCursor // nil: the first page
	Limit         int          // 1 to 500
	// Namespaces, when not nil, are the only namespaces whose orders are
	// selected (none, when empty).
	Namespaces []string
}

// OrderPage returns the page of orders q selects, and the cursor of the
// next page (nil at the end). Every filter is a range of an index
// (orders_created_idx, orders_status_created_idx, the primary key), and
// the page is read by keyset, so a page costs the same on millions of
// rows as on a few.
func (s *Store) OrderPage(ctx context.Context, q OrderQuery) ([]OrderRow, *OrderCursor, error) {
	if q.Limit < 1 || q.Limit > 500 {
		return nil, nil, fmt.Errorf("order page: limit %d is not between 1 and 500: %w", q.Limit, ErrInvalidData)
	}
	// Only the filters given are in the statement (each combination its
	// own statement, so a cached generic plan still fits its filters), and
	// each is a range of an index. The keyset condition is written so that
	// its created_at bound is an index condition: created_at <= the
	// cursor's, then the tie broken on the id.
	w, err := newOrderWhere(q)
	if err != nil {
		return nil, nil, fmt.Errorf("order page: %w", err)
	}
	page := `SELECT o.order_id, o.workflow, coalesce(o.workflow_version, '') AS workflow_version, o.status, o.priority, o.created_at, o.updated_at FROM ` + w.sql()
	args := append(w.args, q.Limit+1)
	page += fmt.Sprintf(" ORDER BY %[1]s.created_at DESC, %[1]s.order_id DESC LIMIT $%[2]d", w.k, len(args))
	// Why, for the page's failed and held orders only: their step in
	// error, through its partial index.
	sql := `SELECT o.order_id::text, o.workflow, o.workflow_version, o.status, o.priority, o.created_at, o.updated_at,
	       coalesce(f.name || ': ' || coalesce(f.last_error, 'failed') || coalesce(' (the service''s last answer: ' || f.last_answer || ')', ''), '')
	FROM (` + page + `) o
	LEFT JOIN LATERAL (SELECT s.name, s.last_error, s.last_answer FROM steps s
	                   WHERE s.order_id = o.order_id AND s.process_state = 'error'
	                   ORDER BY s.kind = 'compensation' DESC, s.step LIMIT 1) f ON o.status IN ('failed', 'error')
	ORDER BY o.created_at DESC, o.order_id DESC`
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("order page: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrderRow, error) {
		var o OrderRow
		var prio int16
		err := row.Scan(&o.OrderID, &o.Workflow, &o.WorkflowVersion, &o.Status, &prio, &o.CreatedAt, &o.UpdatedAt, &o.Failure)
		o.Priority = int(prio)
		return o, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("order page: %w", classify(err))
	}
	if len(out) <= q.Limit {
		return out, nil, nil
	}
	out = out[:q.Limit]
	last := out[len(out)-1]
	return out, &OrderCursor{CreatedAt: last.CreatedAt, OrderID: last.OrderID}, nil
}

// MergeOrderPages merges pages of orders read after the same cursor
// from several stores (a partitioned deployment's), each newest first,
// into one page of at most limit, newest first by (created_at, order_id);
// more says some store had rows past its page. The cursor is the last
// row's, nil when no store has more: paging with it never skips nor
// repeats an order of any store, and no store is read past limit+1 rows.
func MergeOrderPages(pages [][]OrderRow, more bool, limit int) ([]OrderRow, *OrderCursor) {
	all := slices.Concat(pages...)
	slices.SortStableFunc(all, func(x, y OrderRow) int {
		if c := y.CreatedAt.Compare(x.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(y.OrderID, x.OrderID)
	})
	if len(all) <= limit && !more {
		return all, nil
	}
	all = all[:min(limit, len(all))]
	if len(all) == 0 {
		return all, nil
	}
	last := all[len(all)-1]
	return all, &OrderCursor{CreatedAt: last.CreatedAt, OrderID: last.OrderID}
}

// Overview is the state store's picture for the console's first page.
type Overview struct {
	// Live counts the orders that have not ended, by status (received,
	// processing, compensating, error): each a range of the status
	// index, so the cost follows the live work.
	Live map[string]int64
	// Recent counts the orders created within Window, by status.
	Recent map[string]int64
	Window time.Duration
	// CompletedPerSecond is the completed orders of Recent over Window;
	// LatencyP50 and LatencyP95 their time from created to completed.
	CompletedPerSecond     float64
	LatencyP50, LatencyP95 time.Duration
	// TotalEstimate is the planner's estimate of the orders kept (no
	// count of the table); -1 before the table was first analyzed.
	TotalEstimate int64
	Steps         StepStats
	// Leader is the supervisor lease's holder, "" when none holds it;
	// LeaderUntil when it expires unless renewed.
	Leader      string
	LeaderUntil time.Time
	At          time.Time // the database clock when read
}

// OrderStatuses returns every status an order can have.
func OrderStatuses() []string {
	return []string{OrderReceived, OrderProcessing, OrderCompensating, OrderError, OrderCompleted, OrderFailed}
}

// LiveOrderStatuses returns the statuses of orders that have not ended.
func LiveOrderStatuses() []string {
	return []string{OrderReceived, OrderProcessing, OrderCompensating, OrderError}
}

// ReadOverview reads the overview in one read-only snapshot. No query
// reads the history (transitions) or counts the ended orders of the whole
// table: the live counts and the recent window are ranges of
// orders_status_created_idx, the steps' figures come from their partial
// indexes (Stats), the total is pg_class's estimate.
func (s *Store) ReadOverview(ctx context.Context, window time.Duration, leaseName string) (Overview, error) {
	ov := Overview{Live: map[string]int64{}, Recent: map[string]int64{}, Window: window}
	st, err := s.Stats(ctx)
	if err != nil {
		return ov, err
	}
	ov.Steps = st
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&ov.At); err != nil {
			return err
		}
		q := overviewSQL(window, leaseName)
		if err := scanCounts(tx.QueryRow(ctx, q[0].sql, q[0].args...), LiveOrderStatuses(), ov.Live); err != nil {
			return err
		}
		if err := scanCounts(tx.QueryRow(ctx, q[1].sql, q[1].args...), OrderStatuses(), ov.Recent); err != nil {
			return err
		}
		var p50, p95 *float64
		if err := tx.QueryRow(ctx, q[2].sql, q[2].args...).Scan(&p50, &p95); err != nil {
			return err
		}
		if p50 != nil {
			ov.LatencyP50 = time.Duration(*p50 * float64(time.Second))
			ov.LatencyP95 = time.Duration(*p95 * float64(time.Second))
		}
		if err := tx.QueryRow(ctx, q[3].sql, q[3].args...).Scan(&ov.TotalEstimate); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, q[4].sql, q[4].args...).Scan(&ov.Leader, &ov.LeaderUntil)
		if err == pgx.ErrNoRows {
			return nil
		}
		return err
	})
	if err != nil {
		return ov, fmt.Errorf("overview: %w", err)
	}
	if window > 0 {
		ov.CompletedPerSecond = float64(ov.Recent["completed"]) / window.Seconds()
	}
	return ov, nil
}

type namedQuery struct {
	name string
	sql  string
	args []any
}

// overviewSQL is every query of ReadOverview, in its order.
func overviewSQL(window time.Duration, leaseName string) []namedQuery {
	return []namedQuery{
		{"live orders by status", countsByStatus(LiveOrderStatuses(), ""), nil},
		{"recent orders by status", countsByStatus(OrderStatuses(), " AND created_at >= now() - make_interval(secs => $1)"),
			[]any{window.Seconds()}},
		{"recent latency", `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.95) WITHIN GROUP (ORDER BY d)
			FROM (SELECT extract(epoch FROM updated_at - created_at) AS d FROM orders
			      WHERE status = 'completed' AND created_at >= now() - make_interval(secs => $1)) c`, []any{window.Seconds()}},
		{"orders kept (estimate)", `SELECT reltuples::bigint FROM pg_class WHERE oid = 'orders'::regclass`, nil},
		{"supervisor leader", `SELECT holder, expires_at FROM leases WHERE name = $1 AND expires_at > now()`, []any{leaseName}},
		{"steps by state, oldest pending and processing, open alerts", statsSQL, nil},
	}
}

// Plan is one query's plan as EXPLAIN (ANALYZE, BUFFERS) prints it.
type Plan struct {
	Name string
	Plan string
}

// ExplainOverview runs every query of ReadOverview under EXPLAIN
// (ANALYZE, BUFFERS): what docs/BENCHMARKS.md shows, and what a test
// checks reads no table whole.
func (s *Store) ExplainOverview(ctx context.Context, window time.Duration, leaseName string) ([]Plan, error) {
	var out []Plan
	for _, q := range overviewSQL(window, leaseName) {
		rows, err := s.pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) `+q.sql, q.args...)
		if err != nil {
			return nil, fmt.Errorf("explain %s: %w", q.name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("explain %s: %w", q.name, err)
		}
		out = append(out, Plan{q.name, strings.Join(lines, "\n")})
	}
	return out, nil
}

// countsByStatus counts orders of each status (and cond), one subquery
// per status written with the status as a literal: the planner then reads
// each one's frequency from the column's statistics and takes the status
// index for the rare ones. (Given the status as a parameter, of an unnest,
// it assumed an average share and sometimes read the whole table.) The
// statuses are this package's constants, never input.
func countsByStatus(statuses []string, cond string) string {
	parts := make([]string, len(statuses))
	for i, st := range statuses {
		parts[i] = fmt.Sprintf("(SELECT count(*) FROM orders WHERE status = '%s'%s)", st, cond)
	}
	return "SELECT " + strings.Join(parts, ", ")
}

func scanCounts(row pgx.Row, statuses []string, into map[string]int64) error {
	counts := make([]int64, len(statuses))
	dst := make([]any, len(statuses))
	for i := range counts {
		dst[i] = &counts[i]
	}
	if err := row.Scan(dst...); err != nil {
		return err
	}
	for i, st := range statuses {
		into[st] = counts[i]
	}
	return nil
}

// OperatorAction is one entry of operator_actions: what an operator did
// outside an order's history (a dead letter requeued or discarded).
type OperatorAction struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	DBUser    string    `json:"db_user"`    // the database login that recorded it
	ClaimedBy string    `json:"claimed_by"` // the name it gave: the console's user
	Action    string    `json:"action"`
	Target    string    `json:"target"`
	Detail    string    `json:"detail,omitempty"`
}

// RecordOperatorAction records an operator's action as the session's
// login with claimed as the operator's name.
func (s *Store) RecordOperatorAction(ctx context.Context, action, target, detail, claimed string) error {
	if _, err := s.pool.Exec(ctx, `SELECT record_operator_action($1, $2, $3, $4)`, action, target, detail, claimed); err != nil {
		return fmt.Errorf("record operator action: %w", classify(err))
	}
	return nil
}

// OperatorActions returns the newest recorded operator actions first.
func (s *Store) OperatorActions(ctx context.Context, limit int) ([]OperatorAction, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, at, db_user, claimed_by, action, target, detail
		FROM operator_actions ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("operator actions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OperatorAction, error) {
		var a OperatorAction
		err := row.Scan(&a.ID, &a.At, &a.DBUser, &a.ClaimedBy, &a.Action, &a.Target, &a.Detail)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("operator actions: %w", err)
	}
	return out, nil
}
