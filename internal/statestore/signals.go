package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Signal is a signal for an order, as it arrives.
type Signal struct {
	OrderID string
	// ID identifies the signal: the same id twice is applied once.
	ID   string
	Name string
	// Payload is a JSON value (nil: none); it becomes the wait step's
	// result.
	Payload []byte
	// Actor is who sent it, for the history.
	Actor string
}

// What became of a signal (SignalOutcome.Outcome).
const (
	SignalApplied   = "applied"   // a step awaiting it ended with it
	SignalKept      = "kept"      // its wait has not begun: kept until it does
	SignalDuplicate = "duplicate" // its id came before; nothing changed
	// Refusals: nothing was kept.
	SignalUnknownOrder   = "unknown_order"
	SignalOrderEnded     = "order_ended"
	SignalNoSuchWait     = "no_such_wait"
	SignalWaitEnded      = "wait_ended"
	SignalInvalidPayload = "invalid_payload"
)

// SignalOutcome is what a signal did.
type SignalOutcome struct {
	Outcome string
	// Step is the wait step it ended (0: none).
	Step int
	// OrderStatus is the order's status when the signal ended it, or "".
	OrderStatus string
	// Detail says, for a refusal, why.
	Detail string
}

// Refused reports whether the signal was refused (nothing kept).
func (o SignalOutcome) Refused() bool {
	switch o.Outcome {
	case SignalApplied, SignalKept, SignalDuplicate:
		return false
	}
	return true
}

// ApplySignal applies a signal to its order (see the order_signal
// function): it ends the step awaiting it, or is kept until the wait
// begins, or is refused with a reason. A payload that breaks the wait's
// schema is refused (invalid_payload) before anything changes: checked
// under the schema's budget (workflow.Schema), before the transaction
// that applies it begins, so no lock waits for a validator.
func (s *Store) ApplySignal(ctx context.Context, sig Signal) (SignalOutcome, error) {
	var out SignalOutcome
	var payload *string
	if sig.Payload != nil {
		p := string(sig.Payload)
		payload = &p
	}
	refused, err := s.checkWaitSchema(ctx, sig.OrderID, sig.Name, sig.Payload)
	if err != nil {
		return SignalOutcome{}, fmt.Errorf("signal %s for order %s: %w", sig.Name, sig.OrderID, classify(err))
	}
	if refused.Outcome != "" {
		return refused, nil
	}
	err = againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT outcome, step, order_status, detail FROM order_signal($1, $2, $3, $4, $5)`,
				sig.OrderID, sig.ID, sig.Name, payload, sig.Actor).Scan(&out.Outcome, &out.Step, &out.OrderStatus, &out.Detail)
		})
	})
	if err != nil {
		return SignalOutcome{}, fmt.Errorf("signal %s for order %s: %w", sig.Name, sig.OrderID, classify(err))
	}
	return out, nil
}

// SignalCheck says, without changing anything, whether a signal of name
// for orderID would be refused now and why (an empty outcome: it would
// be taken, applied or kept), for a tool to say so before it sends one.
func (s *Store) SignalCheck(ctx context.Context, orderID, name string) (SignalOutcome, error) {
	var status string
	var waits []string
	var open bool
	err := s.pool.QueryRow(ctx, `SELECT o.status,
		    coalesce((SELECT array_agg(DISTINCT s.spec->'wait'->>'signal') FROM steps s WHERE s.order_id = o.order_id AND s.spec ? 'wait'), '{}'),
		    EXISTS (SELECT 1 FROM steps s WHERE s.order_id = o.order_id AND s.spec->'wait'->>'signal' = $2
		                                    AND s.process_state IN ('waiting', 'delayed', 'pending', 'processing', 'awaiting'))
		FROM orders o WHERE o.order_id = $1`, orderID, name).Scan(&status, &waits, &open)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return SignalOutcome{Outcome: SignalUnknownOrder, Detail: "order " + orderID + " does not exist"}, nil
	case err != nil:
		return SignalOutcome{}, fmt.Errorf("check signal %s for order %s: %w", name, orderID, classify(err))
	case status != OrderReceived && status != OrderProcessing && status != OrderError:
		return SignalOutcome{Outcome: SignalOrderEnded, Detail: "order " + orderID + " is " + status + ": no step of it waits any more"}, nil
	case len(waits) == 0:
		return SignalOutcome{Outcome: SignalNoSuchWait, Detail: "none of the steps of order " + orderID + " waits for a signal"}, nil
	case !slices.Contains(waits, name):
		return SignalOutcome{Outcome: SignalNoSuchWait, Detail: fmt.Sprintf("no step of order %s waits for a signal %s (its steps wait for %s)",
			orderID, name, strings.Join(waits, ", "))}, nil
	case !open:
		return SignalOutcome{Outcome: SignalWaitEnded, Detail: "every step of order " + orderID + " that waits for " + name + " has ended"}, nil
	}
	return SignalOutcome{}, nil
}

// checkWaitSchema refuses (invalid_payload) a signal payload that breaks
// the schema of the wait it is for, if that wait has one.
func (s *Store) checkWaitSchema(ctx context.Context, orderID, name string, payload []byte) (SignalOutcome, error) {
	var schema []byte
	err := s.pool.QueryRow(ctx, `SELECT spec->'wait'->'schema' FROM steps
		WHERE order_id = $1 AND spec->'wait'->>'signal' = $2 AND spec->'wait' ? 'schema' ORDER BY step LIMIT 1`,
		orderID, name).Scan(&schema)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return SignalOutcome{}, nil
	case err != nil:
		return SignalOutcome{}, err
	}
	doc := payload
	if doc == nil {
		doc = []byte("null")
	}
	sch, err := s.schemas.Get(schema)
	if err == nil {
		err = sch.Check(doc)
	}
	if err != nil {
		return SignalOutcome{Outcome: SignalInvalidPayload, Detail: "the signal's payload breaks its wait's schema: " + err.Error()}, nil
	}
	return SignalOutcome{}, nil
}

// SignalCheckPayload is SignalCheck, and then the payload checked
// against the wait's schema: what the HTTP API refuses at once.
func (s *Store) SignalCheckPayload(ctx context.Context, orderID, name string, payload []byte) (SignalOutcome, error) {
	out, err := s.SignalCheck(ctx, orderID, name)
	if err != nil || out.Outcome != "" {
		return out, err
	}
	out, err = s.checkWaitSchema(ctx, orderID, name, payload)
	if err != nil {
		return SignalOutcome{}, fmt.Errorf("check signal %s for order %s: %w", name, orderID, classify(err))
	}
	return out, nil
}

// SignalTaken reads what became of a signal once a scheduler took it:
// the wait step it ended (0: kept until its wait begins), and false while
// no scheduler has (or it was refused: then it never will).
func (s *Store) SignalTaken(ctx context.Context, orderID, signalID string) (int, bool, error) {
	var step *int
	err := s.pool.QueryRow(ctx, `SELECT step FROM signals WHERE order_id = $1 AND signal_id = $2`, orderID, signalID).Scan(&step)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read signal %s of order %s: %w", signalID, orderID, classify(err))
	}
	if step == nil {
		return 0, true, nil
	}
	return *step, true, nil
}

// Why a signal by business key reaches no order (x-error-reason).
const (
	SignalNoMatch   = "no_match"  // no running order of the workflow has those values
	SignalAmbiguous = "ambiguous" // several do, and the signal did not ask for all
)

// OrdersByKey lists, oldest first, at most limit running orders (received,
// processing, or held in error) of workflow whose search attributes have
// every value of where: a string matches a string attribute, a number a
// number one, a boolean a boolean one.
func (s *Store) OrdersByKey(ctx context.Context, workflow string, where map[string]any, limit int) ([]string, error) {
	return s.OrdersByKeyIn(ctx, workflow, where, limit, nil)
}

// OrdersByKeyIn is OrdersByKey among the orders of namespaces only (nil:
// of every namespace).
func (s *Store) OrdersByKeyIn(ctx context.Context, workflow string, where map[string]any, limit int, namespaces []string) ([]string, error) {
	if len(where) == 0 {
		return nil, fmt.Errorf("orders by key: no condition: %w", ErrInvalidData)
	}
	names := make([]string, 0, len(where))
	for k := range where {
		names = append(names, k)
	}
	sort.Strings(names)
	args := []any{workflow, limit, namespaces}
	var conds []string
	for i, k := range names {
		text, num, boolean, err := keyForms(where[k])
		if err != nil {
			return nil, fmt.Errorf("orders by key: %s: %v: %w", k, err, ErrInvalidData)
		}
		args = append(args, k, text, num, boolean)
		n := len(args)
		// A value matches its attribute as written whichever its declared
		// type: "7" a string 7 or a number 7.
		match := fmt.Sprintf("%%[1]s.name = $%d AND (%%[1]s.v_text = $%d OR %%[1]s.v_num = $%d OR %%[1]s.v_bool = $%d)", n-3, n-2, n-1, n)
		if i == 0 {
			conds = append(conds, fmt.Sprintf(match, "a"))
			continue
		}
		conds = append(conds, "EXISTS (SELECT 1 FROM order_attributes x WHERE x.order_id = a.order_id AND "+fmt.Sprintf(match, "x")+")")
	}
	rows, err := s.pool.Query(ctx, `SELECT a.order_id::text FROM order_attributes a JOIN orders o ON o.order_id = a.order_id
		WHERE `+strings.Join(conds, " AND ")+` AND o.workflow = $1 AND o.status IN ('received', 'processing', 'error')
		  AND ($3::text[] IS NULL OR o.namespace = ANY($3))
		ORDER BY a.created_at, a.order_id LIMIT $2`, args...)
	if err != nil {
		return nil, fmt.Errorf("orders by key: %w", classify(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("orders by key: %w", classify(err))
	}
	return ids, nil
}

// keyForms is a business key's value as each typed column may hold it:
// its text, and its number and boolean when it reads as one.
func keyForms(v any) (text string, num *float64, boolean *bool, err error) {
	switch x := v.(type) {
	case string:
		text = x
	case bool:
		text = strconv.FormatBool(x)
	case float64:
		text = strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		text = x.String()
	default:
		return "", nil, nil, fmt.Errorf("must be a string, a number or a boolean")
	}
	if f, err := strconv.ParseFloat(text, 64); err == nil {
		num = &f
	}
	if b, err := strconv.ParseBool(text); err == nil && (text == "true" || text == "false") {
		boolean = &b
	}
	return text, num, boolean, nil
}
