package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClaimedStep is a step a scheduler now owns for one attempt, with what it
// needs to build the agent's request.
type ClaimedStep struct {
	OrderID        string
	Step           int
	Name           string
	Agent          string
	Attempt        int
	FailureCount   int
	IdempotencyKey string
	CompleteBy     time.Time
	// Budget is complete_by minus now() on the database clock at claim
	// time: what is left to spend, free of any process clock's drift.
	Budget   time.Duration
	Priority int
	ReplyTo  string
	// Kind is KindAction or KindCompensation; for a compensation, Undoes
	// is the idempotency key of the action it undoes.
	Kind   string
	Undoes string
	// Payload is the order's payload (a JSON object); Results the results
	// of the order's earlier actions by action name (a JSON object, nil
	// when none); UndoneResult, for a compensation, the result of the
	// action it undoes (nil when none).
	Payload      []byte
	Results      []byte
	UndoneResult []byte
	// Traceparent is the order's trace context (W3C), "" when it has
	// none.
	Traceparent string
	// Spec is, for a step of a graph, what the workflow says of it
	// beyond a list's keys (when, for_each, input, max_items: StepSpec);
	// nil for a list's step.
	Spec []byte
	// Item and Index are, for an instance of a for_each step, its
	// element of the list and its position (Index nil otherwise).
	Item  []byte
	Index *int
	// Waited is, for a step claimed under its kind's limits
	// (ClaimLimited), how long it was pending before this claim.
	Waited time.Duration
	// Told is whether the outbox may hold something for the relay since
	// this claim: it wrote the order's processing event (its first claim,
	// the event heard or the order with a reply_to), or received events
	// are heard, which the submitter wrote for orders this claim started.
	Told bool
}

// A claim statement claims up to $2 due pending steps for $1: the
// rows are picked with FOR UPDATE SKIP LOCKED so concurrent schedulers never
// pick the same row, their attempt is bumped (the fencing epoch) and their
// deadline set from the database clock. Orders whose first step this is move
// from received to processing. Every change is written to the history.
//
// A step of a paused order or agent kind (migration 0041) is passed over;
// while nothing is paused, one look at each table (an InitPlan) says so.
// Whether status events are heard is asked once a statement too, not once
// a row (status_heard in a scalar subquery).
//
// An order's first step (step 1, never attempted: its order is received)
// is picked only if its order's row can be locked at once too, since the
// claim moves that order on: an order row held by a stuck transaction
// would otherwise hold up the whole claim, and every claim after it.
const (
	// claimKindsSQL claims, in one statement, up to $4[i] steps of each
	// agent kind $3[i], each kind read from its own part of the index.
	claimKindsSQL = `
WITH picked AS (
    SELECT p.order_id, p.step
    FROM unnest($3::text[], $4::int[]) AS k(agent, room)
    CROSS JOIN LATERAL (
        SELECT order_id, step
        FROM steps
        WHERE process_state = 'pending' AND agent = k.agent AND fair_key IS NULL AND available_at <= now()
          AND NOT EXISTS (SELECT 1 FROM kind_pauses kp WHERE kp.agent = k.agent)
          AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = steps.order_id))
          AND (attempt > 0 OR step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = steps.order_id FOR UPDATE SKIP LOCKED))
        ORDER BY agent, priority DESC, available_at, order_id, step
        LIMIT k.room
        FOR UPDATE SKIP LOCKED
    ) p
    LIMIT $2
)` + claimRestSQL
	// claimAnySQL claims steps of any kind ($3 is '').
	claimAnySQL = `
WITH picked AS (
    SELECT order_id, step
    FROM steps
    WHERE process_state = 'pending' AND fair_key IS NULL AND available_at <= now() AND $3::text = ''
      AND ((SELECT NOT EXISTS (SELECT 1 FROM kind_pauses)) OR NOT EXISTS (SELECT 1 FROM kind_pauses kp WHERE kp.agent = steps.agent))
      AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = steps.order_id))
      AND (attempt > 0 OR step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = steps.order_id FOR UPDATE SKIP LOCKED))
    ORDER BY priority DESC, available_at, order_id, step
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)` + claimRestSQL
)

const claimRestSQL = `, claimed AS (
    UPDATE steps s
    SET process_state = 'processing',
        locked_by = $1,
        attempt = s.attempt + 1,
        complete_by = clock_timestamp() + s.timeout,
        updated_at = now(),
        moves = s.moves + 1, moved_by = $1, moved_why = 'claimed', moved_for = NULL
    FROM picked
    WHERE s.order_id = picked.order_id AND s.step = picked.step
    RETURNING s.order_id, s.step, s.name, s.agent, s.attempt, s.failure_count,
              s.idempotency_key, s.complete_by, s.priority, s.kind, s.compensates,
              s.ancestors, s.spec, s.item, s.item_index
), started AS (
    -- Each order found by its key: its status is compared as an
    -- expression no index serves, so that no plan walks every received
    -- order (a backlog of them) to find the few this claim started.
    UPDATE orders o
    SET status = 'processing', updated_at = now(),
        moves = o.moves + 1, moved_by = $1, moved_why = 'first step claimed'
    FROM (SELECT DISTINCT order_id FROM claimed) c
    WHERE o.order_id = c.order_id AND (o.status = 'received') IS TRUE
    RETURNING o.order_id, o.reply_to
), order_ev AS (
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    SELECT 'status_event', order_id, reply_to, status_event_body(started.order_id, 'processing', NULL)
    FROM started
    WHERE reply_to IS NOT NULL OR (SELECT status_heard('processing'))
    RETURNING order_id
)
SELECT c.order_id::text, c.step, c.name, c.agent, c.attempt, c.failure_count, c.idempotency_key,
       c.complete_by, (extract(epoch FROM c.complete_by - clock_timestamp()) * 1000)::bigint, c.priority,
       coalesce(o.reply_to, ''), o.payload, ` + resultsSQL + `, a.result, c.kind, coalesce(a.idempotency_key, ''),
       coalesce(o.traceparent, ''), c.spec, c.item, c.item_index,
       EXISTS (SELECT 1 FROM order_ev e WHERE e.order_id = c.order_id) OR (SELECT status_heard('received'))
FROM claimed c
JOIN orders o ON o.order_id = c.order_id
LEFT JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
ORDER BY c.priority DESC, c.order_id, c.step`

// resultsSQL reads the results of the actions before step c of its
// order, by action name (NULL when none); compensations come after every
// action, so they get all of them. A step of a graph reads those of its
// ancestors (the steps it needs, transitively), by id or action.
const resultsSQL = `CASE WHEN c.ancestors IS NOT NULL THEN (SELECT jsonb_object_agg(coalesce(p.spec->>'id', p.name), p.result) FROM steps p
        WHERE p.order_id = c.order_id AND p.step = ANY(c.ancestors) AND p.result IS NOT NULL)
    WHEN c.step > 1 THEN (SELECT jsonb_object_agg(p.name, p.result) FROM steps p
        WHERE p.order_id = c.order_id AND p.step < c.step AND p.kind = 'action' AND p.result IS NOT NULL) END`

// ClaimPending claims up to limit due pending steps for the scheduler
// lockedBy and returns them; agent, when not "", limits the claim to steps
// of that agent kind. A step is never handed to two claimers in the same
// attempt.
func (s *Store) ClaimPending(ctx context.Context, lockedBy string, limit int, agent string) ([]ClaimedStep, error) {
	if lockedBy == "" || limit <= 0 {
		return nil, fmt.Errorf("claim pending: need a claimer id and a positive limit")
	}
	if agent != "" {
		return s.ClaimKinds(ctx, lockedBy, map[string]int{agent: limit})
	}
	return s.claim(ctx, claimAnySQL, lockedBy, limit, agent)
}

// ClaimKinds claims, in one statement, up to rooms[kind] due pending steps
// of each agent kind for the scheduler lockedBy, as ClaimPending would
// kind by kind.
func (s *Store) ClaimKinds(ctx context.Context, lockedBy string, rooms map[string]int) ([]ClaimedStep, error) {
	var kinds []string
	var limits []int32
	total := 0
	for k, n := range rooms {
		if n > 0 {
			kinds, limits = append(kinds, k), append(limits, int32(n))
			total += n
		}
	}
	if lockedBy == "" || total == 0 {
		return nil, fmt.Errorf("claim pending: need a claimer id and room for some kind")
	}
	return s.claim(ctx, claimKindsSQL, lockedBy, total, kinds, limits)
}

func (s *Store) claim(ctx context.Context, sql string, args ...any) ([]ClaimedStep, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim pending: %w", err)
	}
	steps, err := collectClaimed(rows)
	if err != nil {
		return nil, fmt.Errorf("claim pending: %w", err)
	}
	return steps, nil
}

// collectClaimed reads the rows of a claim statement (claimRestSQL).
func collectClaimed(rows pgx.Rows) ([]ClaimedStep, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ClaimedStep, error) {
		var c ClaimedStep
		var budgetMS int64
		var prio int16
		err := row.Scan(&c.OrderID, &c.Step, &c.Name, &c.Agent, &c.Attempt, &c.FailureCount, &c.IdempotencyKey,
			&c.CompleteBy, &budgetMS, &prio, &c.ReplyTo, &c.Payload, &c.Results, &c.UndoneResult, &c.Kind, &c.Undoes, &c.Traceparent,
			&c.Spec, &c.Item, &c.Index, &c.Told)
		c.setBudgetPriority(budgetMS, prio)
		return c, err
	})
}

// setBudgetPriority sets the budget and priority read as a claim statement
// returns them (milliseconds, smallint).
func (c *ClaimedStep) setBudgetPriority(budgetMS int64, prio int16) {
	c.Budget = time.Duration(budgetMS) * time.Millisecond
	c.Priority = int(prio)
}
