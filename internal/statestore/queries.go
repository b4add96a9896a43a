package statestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// Order is an order row.
type Order struct {
	OrderID  string `json:"order_id"`
	Workflow string `json:"workflow"`
	Status   string `json:"status"`
	Priority int    `json:"priority"`
	// WorkflowVersion is "" for an order written before versions were
	// kept.
	WorkflowVersion string          `json:"workflow_version,omitempty"`
	Payload         json.RawMessage `json:"payload"`
	ReplyTo         string          `json:"reply_to,omitempty"`
	PlacedAt        *time.Time      `json:"placed_at,omitempty"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	// TraceID is the order's trace (OpenTelemetry), "" when it was
	// written with tracing off.
	TraceID string `json:"trace_id,omitempty"`
	// FailurePolicy is what a step failing for good leads to:
	// PolicyCompensate or PolicyHold.
	FailurePolicy string `json:"failure_policy"`
	// Namespace is the tenant the order belongs to.
	Namespace string `json:"namespace"`
}

// Step is a step state row.
type Step struct {
	Step int    `json:"step"`
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Compensates is, for a compensation, the step it undoes (else 0).
	Compensates    int        `json:"compensates,omitempty"`
	Agent          string     `json:"agent"`
	ProcessState   string     `json:"process_state"`
	LockedBy       string     `json:"locked_by,omitempty"`
	CompleteBy     *time.Time `json:"complete_by,omitempty"`
	FailureCount   int        `json:"failure_count"`
	MaxFailures    int        `json:"max_failures"`
	Attempt        int        `json:"attempt"`
	IdempotencyKey string     `json:"idempotency_key"`
	AvailableAt    time.Time  `json:"available_at"`
	LastError      string     `json:"last_error,omitempty"`
	// LastAnswer is the last answer its service gave that was not a
	// result (migration 0023): shown with LastError.
	LastAnswer string          `json:"last_answer,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
	UpdatedAt  time.Time       `json:"updated_at"`
	// In a graph: Needs, the steps that must end before this one; ID,
	// the step's id where its action is used twice; Parent, Index and
	// Item, for an instance of a for_each step (or its compensation),
	// that step, the instance's position and element of the list;
	// Join, the rule by which it waits for its needs (read from its
	// spec as a whole: a join's keys are the workflow package's).
	Needs []int `json:"needs,omitempty"`
	workflow.Join
	ID     string          `json:"id,omitempty"`
	Parent int             `json:"parent,omitempty"`
	Index  *int            `json:"index,omitempty"`
	Item   json.RawMessage `json:"item,omitempty"`
	// DueAt is, for a delayed step, when it may run, and for one
	// awaiting a signal, when its wait times out (database clock).
	DueAt *time.Time `json:"due_at,omitempty"`
	// Wait is, for a wait step, the signal it waits for.
	Wait string `json:"wait,omitempty"`
	// Workflow is, for a sub-process, the workflow of its child order.
	Workflow string `json:"workflow,omitempty"`
}

// The states a step is shown in that are not its own (ShownStates).
const (
	// StateUndone: an action whose compensation ran.
	StateUndone = "undone"
	// StateNotRun: a step still waiting in an order that ended, which
	// will never run (a compensation of a completed order, an action
	// after the one that failed).
	StateNotRun = "not-run"
)

// ShownStates is each step's state (by step number) as the console and
// sasctl show it: its own, but StateNotRun for a step still waiting in an
// order that completed or failed, and StateUndone for an action whose
// compensation ran.
func (d OrderDetail) ShownStates() map[int]string {
	undone := map[int]bool{}
	for _, st := range d.Steps {
		if st.Kind == KindCompensation && st.ProcessState == StepProcessed {
			undone[st.Compensates] = true
		}
	}
	ended := d.Order.Status == OrderCompleted || d.Order.Status == OrderFailed
	shown := make(map[int]string, len(d.Steps))
	for _, st := range d.Steps {
		switch {
		case ended && st.ProcessState == StepWaiting:
			shown[st.Step] = StateNotRun
		case st.Kind == KindAction && undone[st.Step]:
			shown[st.Step] = StateUndone
		default:
			shown[st.Step] = st.ProcessState
		}
	}
	return shown
}

// Sort is what the step is in a person's words: action, compensation,
// wait, timer or sub-process.
func (st Step) Sort() string {
	switch {
	case st.Kind == KindCompensation:
		return KindCompensation
	case st.Agent != "":
		return "action"
	case st.Wait != "":
		return "wait"
	case st.Workflow != "":
		return "sub-process"
	}
	return "timer"
}

// By is who performs the step: its agent kind, the signal it waits for
// (signal:NAME), the workflow of its child order (workflow:NAME), or ""
// for a timer.
func (st Step) By() string {
	switch {
	case st.Agent != "":
		return st.Agent
	case st.Wait != "":
		return "signal:" + st.Wait
	case st.Workflow != "":
		return "workflow:" + st.Workflow
	}
	return ""
}

// What says what kind of step it is, and who performs it: "action ·
// agent.payments", "compensation of step 2 · agent.payments", "wait for
// signal approved", "sub-process kyc_check", "timer".
func (st Step) What() string {
	what := st.Kind
	if st.Compensates > 0 {
		what += " of step " + strconv.Itoa(st.Compensates)
	}
	switch {
	case st.Agent != "":
		return what + " · agent." + st.Agent
	case st.Wait != "":
		return "wait for signal " + st.Wait
	case st.Workflow != "":
		if st.Kind == KindCompensation {
			return what + " · undoes its child order"
		}
		return "sub-process " + st.Workflow
	case st.Kind == KindCompensation:
		return what
	}
	return "timer"
}

// Transition is one entry of the history.
type Transition struct {
	ID      int64     `json:"id"`
	Step    *int      `json:"step"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Attempt int       `json:"attempt"`
	Actor   string    `json:"actor"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
	// DBUser is, for an operator's action, the database login that did
	// it; ClaimedBy the name the operator gave (a label, not a proof).
	DBUser    string `json:"db_user,omitempty"`
	ClaimedBy string `json:"claimed_by,omitempty"`
}

// OrderDetail is an order with its steps and its full history.
type OrderDetail struct {
	Order   Order        `json:"order"`
	Steps   []Step       `json:"steps"`
	History []Transition `json:"history"`
	// Parent is, for a child order (a sub-process's), the order and step
	// that started it; Children are the orders its sub-process steps
	// started.
	Parent   *ChildRef  `json:"parent,omitempty"`
	Children []ChildRef `json:"children,omitempty"`
	// Deadline is the order's whole-order deadline, if it has one.
	Deadline *Deadline `json:"deadline,omitempty"`
	// Paused says since when and why the order is paused, if it is.
	Paused *Pause `json:"paused,omitempty"`
}

// Deadline is an order's whole-order deadline: due at DueAt (database
// clock), its length, what the order does when it passes, and, once it
// fell due, what it did (Outcome: compensate, hold or fail; "ended" when
// the order had ended by then) and when.
type Deadline struct {
	DueAt      time.Time     `json:"due_at"`
	Length     time.Duration `json:"-"`
	LengthMs   int64         `json:"deadline_ms"`
	OnDeadline string        `json:"on_deadline"`
	Outcome    string        `json:"outcome,omitempty"`
	PassedAt   *time.Time    `json:"passed_at,omitempty"`
}

// ListFilter selects orders for ListOrders.
type ListFilter struct {
	Status   string        // "" for any
	Workflow string        // "" for any
	Since    time.Duration // created within this long (database clock); 0 for any
	Limit    int           // <= 0 for 50
}

const orderColumns = `order_id::text, workflow, coalesce(workflow_version, ''), status, priority, payload,
	coalesce(reply_to, ''), placed_at, created_at, updated_at, coalesce(split_part(traceparent, '-', 2), ''), failure_policy, namespace`

func scanOrder(row pgx.Row) (Order, error) {
	var o Order
	var prio int16
	err := row.Scan(&o.OrderID, &o.Workflow, &o.WorkflowVersion, &o.Status, &prio, &o.Payload,
		&o.ReplyTo, &o.PlacedAt, &o.CreatedAt, &o.UpdatedAt, &o.TraceID, &o.FailurePolicy, &o.Namespace)
	o.Priority = int(prio)
	return o, err
}

// ListOrders returns the newest orders first, by (created_at, order_id)
// descending as every keyset list of orders.
func (s *Store) ListOrders(ctx context.Context, f ListFilter) ([]Order, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	rows, err := s.pool.Query(ctx, `SELECT `+orderColumns+` FROM orders
		WHERE ($1 = '' OR status = $1)
		  AND ($3 = '' OR workflow = $3)
		  AND ($4::float8 = 0 OR created_at >= now() - make_interval(secs => $4::float8))
		ORDER BY created_at DESC, order_id DESC
		LIMIT $2`, f.Status, limit, f.Workflow, f.Since.Seconds())
	if err != nil {
		return nil, fmt.Errorf("list orders: %w", err)
	}
	orders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Order, error) { return scanOrder(row) })
	if err != nil {
		return nil, fmt.Errorf("list orders: %w", err)
	}
	return orders, nil
}

// GetOrder returns an order with its steps and history, or ErrNotFound.
func (s *Store) GetOrder(ctx context.Context, orderID string) (OrderDetail, error) {
	return s.getOrder(ctx, orderID, true)
}

// getOrder is GetOrder; without all, it reads the order and its steps
// only (no history, family, deadline or pause), as a migration needs.
func (s *Store) getOrder(ctx context.Context, orderID string, all bool) (OrderDetail, error) {
	var d OrderDetail
	// One repeatable-read snapshot so steps and history agree with the order.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		d.Order, err = scanOrder(tx.QueryRow(ctx, `SELECT `+orderColumns+` FROM orders WHERE order_id = $1`, orderID))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("order %s: %w", orderID, ErrNotFound)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT step, name, kind, coalesce(compensates, 0), agent, process_state, coalesce(locked_by, ''), complete_by,
			failure_count, max_failures, attempt, idempotency_key, available_at, coalesce(last_error, ''), coalesce(last_answer, ''),
			result, updated_at, needs, coalesce(spec, '{}'), coalesce(spec->>'id', ''), coalesce(parent, 0), item_index, item,
			CASE WHEN process_state IN ('delayed', 'awaiting') AND NOT coalesce(spec ? 'workflow', false) THEN due_at END,
			coalesce(spec->'wait'->>'signal', ''), coalesce(spec->>'workflow', '')
			FROM steps WHERE order_id = $1 ORDER BY step`, orderID)
		if err != nil {
			return err
		}
		d.Steps, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Step, error) {
			var st Step
			err := row.Scan(&st.Step, &st.Name, &st.Kind, &st.Compensates, &st.Agent, &st.ProcessState, &st.LockedBy, &st.CompleteBy,
				&st.FailureCount, &st.MaxFailures, &st.Attempt, &st.IdempotencyKey, &st.AvailableAt, &st.LastError,
				&st.LastAnswer, &st.Result, &st.UpdatedAt, &st.Needs, &st.Join, &st.ID, &st.Parent, &st.Index, &st.Item, &st.DueAt, &st.Wait, &st.Workflow)
			return st, err
		})
		if err != nil || !all {
			return err
		}
		d.History, err = s.history(ctx, tx, orderID)
		if err != nil {
			return err
		}
		d.Parent, d.Children, err = family(ctx, tx, orderID)
		if err != nil {
			return err
		}
		if d.Deadline, err = deadlineOf(ctx, tx, orderID); err != nil {
			return err
		}
		d.Paused, err = pauseOf(ctx, tx, orderID)
		return err
	})
	if err != nil {
		return d, fmt.Errorf("get order: %w", err)
	}
	return d, nil
}

// Describe says the deadline as a person reads it: its length, when it
// falls due and what the order does then; or, once it fell due, what
// became of it.
func (d Deadline) Describe() string {
	due := d.DueAt.UTC().Format("2006-01-02T15:04:05Z")
	length := d.Length.String()
	switch {
	case d.Length%(24*time.Hour) == 0:
		length = strconv.FormatInt(int64(d.Length/(24*time.Hour)), 10) + "d"
	case d.Length%time.Hour == 0:
		length = strconv.FormatInt(int64(d.Length/time.Hour), 10) + "h"
	case d.Length%time.Minute == 0:
		length = strings.TrimSuffix(length, "0s")
	}
	switch d.Outcome {
	case "":
		return fmt.Sprintf("%s, due %s; then the order will %s", length, due, d.OnDeadline)
	case "ended":
		return fmt.Sprintf("%s, due %s: met (the order had ended, or was being undone, by then)", length, due)
	}
	at := due
	if d.PassedAt != nil {
		at = d.PassedAt.UTC().Format("2006-01-02T15:04:05Z")
	}
	return fmt.Sprintf("%s, due %s: passed while the order ran; at %s it followed on_deadline %s", length, due, at, d.Outcome)
}

// deadlineOf reads an order's deadline; nil when it has none.
func deadlineOf(ctx context.Context, q querier, orderID string) (*Deadline, error) {
	var d Deadline
	err := q.QueryRow(ctx, `SELECT due_at, deadline_ms, on_deadline, coalesce(outcome, ''), passed_at FROM order_deadlines WHERE order_id = $1`,
		orderID).Scan(&d.DueAt, &d.LengthMs, &d.OnDeadline, &d.Outcome, &d.PassedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d.Length = time.Duration(d.LengthMs) * time.Millisecond
	return &d, nil
}

// History returns an order's transitions in the order they were written.
func (s *Store) History(ctx context.Context, orderID string) ([]Transition, error) {
	h, err := s.history(ctx, s.pool, orderID)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return h, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) history(ctx context.Context, q querier, orderID string) ([]Transition, error) {
	rows, err := q.Query(ctx, `SELECT id, step, coalesce(from_state, ''), to_state, attempt, actor, reason, at,
		coalesce(db_user, ''), coalesce(claimed_by, '')
		FROM transitions WHERE order_id = $1 ORDER BY id`, orderID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Transition, error) {
		var t Transition
		err := row.Scan(&t.ID, &t.Step, &t.From, &t.To, &t.Attempt, &t.Actor, &t.Reason, &t.At, &t.DBUser, &t.ClaimedBy)
		return t, err
	})
}

// StatusEventOf is the status event of an order's current status, as the
// outbox would send it (with its results, and why it ended, when it
// ended): what an awaiting client is answered with. ErrNotFound for an
// unknown order.
func (s *Store) StatusEventOf(ctx context.Context, orderID string) (string, json.RawMessage, error) {
	var status string
	var body json.RawMessage
	err := s.pool.QueryRow(ctx, `SELECT status, status_event_body(order_id, status, NULL) FROM orders WHERE order_id = $1`, orderID).
		Scan(&status, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, fmt.Errorf("order %s: %w", orderID, ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("status of order %s: %w", orderID, classify(err))
	}
	// jsonb's text has a space after each colon and comma; events sent
	// on the exchange do not, and one order's event reads the same
	// either way.
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil {
		return "", nil, fmt.Errorf("status of order %s: %w", orderID, err)
	}
	return status, compact.Bytes(), nil
}

// Owner is who an order belongs to: its namespace and who submitted it.
type Owner struct {
	Namespace, SubmittedBy string
}

// OwnerOf reads an order's namespace and submitter in one read; found is
// false for an order that does not exist.
func (s *Store) OwnerOf(ctx context.Context, orderID string) (o Owner, found bool, err error) {
	err = s.pool.QueryRow(ctx, `SELECT o.namespace, coalesce((SELECT actor FROM transitions t WHERE t.order_id = o.order_id AND t.step IS NULL ORDER BY t.id LIMIT 1), '')
		FROM orders o WHERE o.order_id = $1`, orderID).Scan(&o.Namespace, &o.SubmittedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return Owner{}, false, nil
	}
	if err != nil {
		return Owner{}, false, fmt.Errorf("who owns order %s: %w", orderID, classify(err))
	}
	return o, true, nil
}

// NamespaceOf is an order's namespace; false for an unknown order.
func (s *Store) NamespaceOf(ctx context.Context, orderID string) (string, bool, error) {
	var ns string
	err := s.pool.QueryRow(ctx, `SELECT namespace FROM orders WHERE order_id = $1`, orderID).Scan(&ns)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("namespace of order %s: %w", orderID, classify(err))
	}
	return ns, true, nil
}

// SubmittedBy is the actor that wrote an order (its history's first
// row), "" for an unknown order.
func (s *Store) SubmittedBy(ctx context.Context, orderID string) (string, error) {
	var actor string
	err := s.pool.QueryRow(ctx, `SELECT actor FROM transitions WHERE order_id = $1 AND step IS NULL ORDER BY id LIMIT 1`, orderID).Scan(&actor)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("who submitted order %s: %w", orderID, classify(err))
	}
	return actor, nil
}
