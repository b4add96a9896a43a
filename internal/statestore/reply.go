package statestore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/failpoint"
)

// Reply is an agent's answer for one attempt of a step.
type Reply struct {
	OrderID string
	Step    int
	Attempt int
	// OK is true for outcome ok; false means failed for good (the agent
	// saw a permanent fault).
	OK     bool
	Result []byte // JSON, for OK replies; nil otherwise
	Error  string // the reason, for failed replies
	// LastAnswer is the service's last answer that was not a result (see
	// migration 0023), for failed replies; "" keeps the one noted before.
	LastAnswer string
	// Actor is who applies the reply (the scheduler's id).
	Actor string
	// The agent's clock readings, if it sent them (see migration 0006):
	// they are stored with the step for the latency breakdown only.
	AgentStartedAt, AgentSentAt *time.Time
	AgentCallMicros             int64
}

// ApplyResult says what an applied reply changed.
type ApplyResult struct {
	// StepState is the step's new state: processed or error.
	StepState string
	// StepName is the step's name (e.g. charge_payment).
	StepName string
	// NextStep is the step made pending by this reply, or 0.
	NextStep int
	// OrderStatus is the order's status after the reply if it changed it
	// (completed, compensating, failed, error), or "" (for a failed reply,
	// the status it has after the policy was applied).
	OrderStatus string
	// StepTook is the time from the step's claim to this reply, and
	// OrderTook, when the reply ended the order, the time from its
	// submission (both on the database clock).
	StepTook  time.Duration
	OrderTook time.Duration
	// OrderNamespace is, when the reply ended the order, its namespace.
	OrderNamespace string
	// Claimed is the next step when the same statement claimed it for the
	// reply's actor (ApplyRepliesClaiming): its request is the caller's to
	// send, as after a claim. NextStep is then its number too.
	Claimed *ClaimedStep
	// Event is, when the reply ended the order and the statement held
	// its status event for the caller (ApplyRepliesPublishing), that
	// event: the caller's to publish and then forget (ForgetPublished).
	Event *OutboxMessage
}

// Kinds of stale reply, few and fixed (they label a metric).
const (
	StaleUnknownStep   = "unknown_step"   // no such order or step
	StaleSuperseded    = "superseded"     // a later attempt owns the step
	StaleNotProcessing = "not_processing" // the step already left processing (e.g. a duplicate reply)
	StaleLate          = "late"           // complete_by had passed
	StaleRace          = "race"           // the step changed while the reply was applied
)

// StaleReplyError says why a reply was not applied. It wraps ErrStale.
type StaleReplyError struct {
	OrderID string
	Step    int
	Attempt int
	Kind    string // one of the Stale constants
	Reason  string // a sentence for logs
}

func (e *StaleReplyError) Error() string {
	return fmt.Sprintf("stale reply for order %s step %d attempt %d: %s", e.OrderID, e.Step, e.Attempt, e.Reason)
}

func (e *StaleReplyError) Unwrap() error { return ErrStale }

// applyReplySQL applies one reply in one round trip (the apply_reply
// function, sql/30_replies.sql): the fenced update, its history, and the
// order moving on or reacting to a failure.
const applyReplySQL = `SELECT applied, step_state, step_name, took_s, next_step, order_status, order_took_s, order_namespace
FROM apply_reply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`

func (r Reply) args() []any {
	// The fault suite's negative control turns the fence off.
	fenced := !failpoint.Broken("unfenced-replies")
	return []any{r.OrderID, r.Step, r.Attempt, r.OK, r.Result, r.Error, r.Actor,
		r.AgentStartedAt, r.AgentSentAt, r.AgentCallMicros, fenced, r.LastAnswer}
}

func scanApplied(row pgx.Row) (ApplyResult, bool, error) {
	var res ApplyResult
	var applied bool
	var took, orderTook float64
	err := row.Scan(&applied, &res.StepState, &res.StepName, &took, &res.NextStep, &res.OrderStatus, &orderTook, &res.OrderNamespace)
	res.StepTook = time.Duration(took * float64(time.Second))
	res.OrderTook = time.Duration(orderTook * float64(time.Second))
	return res, applied, err
}

// ApplyReply applies an agent's reply, fenced by attempt, state and
// complete_by, and in the same transaction moves the order on (the next
// step, or the order's end) or reacts to the failure (the order's failure
// policy), as the order_next function decides. An ok reply goes through
// the batched statement as a batch of one (ApplyReplies); a failed one
// through the apply_reply function. A reply that is not for the current
// attempt, or comes after the step left processing or after complete_by,
// changes nothing and returns a *StaleReplyError (errors.Is(err,
// ErrStale)).
func (s *Store) ApplyReply(ctx context.Context, r Reply) (ApplyResult, error) {
	if r.OK {
		res, errs := s.ApplyReplies(ctx, []Reply{r})
		return res[0], errs[0]
	}
	return s.applyReplyFunc(ctx, r)
}

// applyReplyFunc applies one reply through the apply_reply function.
func (s *Store) applyReplyFunc(ctx context.Context, r Reply) (ApplyResult, error) {
	res, applied, err := scanApplied(s.pool.QueryRow(ctx, applyReplySQL, r.args()...))
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
	}
	if !applied {
		return ApplyResult{}, s.staleReason(ctx, r)
	}
	return res, nil
}

// applyOKRepliesSQL applies ok replies, one or many, in one statement, as
// apply_reply does one by one: the fenced update of each step with its
// history and timings; then, with each order's row locked, what the
// order_next function (sql/20_steps.sql) decides: the next step of the
// same kind made pending, or, after the last, the order ended (completed
// after its actions, failed after its compensations) with its history and
// status event; an order that moved on meanwhile (cancelled, compensating)
// is left as it is. Replies come as
// parallel arrays, at most one per order (and for a list's steps only: a
// graph's go through apply_reply); $8 is the actor, $9 the fence
// (always true but in the fault suite's negative control), $10 the agent
// kinds whose next steps are claimed for $8 in the same statement, $11
// how many milliseconds an ended order's status event is held for $8 to
// publish (0: not held, the relay's). It returns a row for each reply
// applied, by 1-based index, with the step it claimed and the event it
// held, if any.
const applyOKRepliesSQL = `
WITH r AS (
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::jsonb[], $5::timestamptz[], $6::timestamptz[], $7::bigint[])
        WITH ORDINALITY AS r(order_id, step, attempt, result, started, sent, call_us, idx)
), cur AS (
    UPDATE steps s
    SET process_state = 'processed', result = r.result, last_error = NULL, last_answer = NULL,
        agent_started_at = r.started, agent_sent_at = r.sent, agent_call_us = NULLIF(r.call_us, 0),
        updated_at = clock_timestamp(), moves = s.moves + 1, moved_by = $8, moved_why = 'agent replied ok',
        moved_for = r.attempt
    FROM r
    WHERE s.order_id = r.order_id AND s.step = r.step AND s.needs IS NULL
      AND (NOT $9 OR (s.attempt = r.attempt AND s.process_state = 'processing' AND s.complete_by >= clock_timestamp()))
    RETURNING s.order_id, s.step, s.attempt, s.kind, s.name, r.idx, r.result,
              coalesce(extract(epoch FROM clock_timestamp()
                               - CASE WHEN s.held_attempt = s.attempt THEN s.held_since ELSE s.complete_by - s.timeout END), 0) AS took,
              $9 AND s.complete_by < clock_timestamp() AS late
), in_time AS (
    -- The fence read each row before waiting for its lock: a row only
    -- locked meanwhile is not read again. A step that is late by the
    -- time it is written fails the statement (and the batch goes reply by
    -- reply through apply_reply, which locks first).
    SELECT sas_refuse_late_apply(coalesce(bool_or(late), false)) AS ok FROM cur
), ord AS (
    SELECT o.order_id, o.status, o.reply_to, o.created_at, o.namespace, o.traceparent FROM orders o
    WHERE o.order_id IN (SELECT order_id FROM cur)
    FOR UPDATE
), dec AS (
    -- What comes next for each order: order_next decides, as it does for
    -- one reply (step_processed).
    SELECT cur.order_id, cur.step, cur.kind, ord.reply_to, ord.created_at, ord.status, ord.namespace, ord.traceparent,
           -- a paused order's next step, or any while a kind is paused,
           -- becomes pending, for a claim to pass over or take
           (SELECT NOT EXISTS (SELECT 1 FROM kind_pauses))
               AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses))
                    OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = cur.order_id)) AS may_claim,
           order_next(cur.kind, true, ord.status, NULL,
                      EXISTS (SELECT 1 FROM steps s WHERE s.order_id = cur.order_id AND s.step = cur.step + 1
                                                      AND s.kind = cur.kind AND s.process_state = 'waiting')) AS next,
           -- this reply's result, which the statement's snapshot cannot read back
           CASE WHEN cur.kind = 'action' AND cur.result IS NOT NULL
                THEN jsonb_build_object(cur.name, cur.result) ELSE '{}'::jsonb END AS new_result
    FROM cur JOIN ord ON ord.order_id = cur.order_id
), nxt AS (
    -- The next step becomes pending; if its agent kind is in $10 (and
    -- it has no key: keyed steps are claimed by key), it is claimed for
    -- $8 at once instead, as a claim would.
    UPDATE steps s SET
        process_state = CASE WHEN g.may_claim AND s.agent = ANY($10::text[]) AND s.fair_key IS NULL THEN 'processing' ELSE 'pending' END,
        locked_by = CASE WHEN g.may_claim AND s.agent = ANY($10::text[]) AND s.fair_key IS NULL THEN $8 ELSE s.locked_by END,
        attempt = CASE WHEN g.may_claim AND s.agent = ANY($10::text[]) AND s.fair_key IS NULL THEN s.attempt + 1 ELSE s.attempt END,
        complete_by = CASE WHEN g.may_claim AND s.agent = ANY($10::text[]) AND s.fair_key IS NULL THEN clock_timestamp() + s.timeout ELSE s.complete_by END,
        available_at = now(), updated_at = clock_timestamp(),
        moves = s.moves + 1, moved_by = $8, moved_for = NULL,
        moved_why = CASE WHEN g.may_claim AND s.agent = ANY($10::text[]) AND s.fair_key IS NULL THEN 'claimed' ELSE 'previous step processed' END
    FROM dec g
    WHERE g.next = 'next' AND s.order_id = g.order_id AND s.step = g.step + 1 AND s.kind = g.kind AND s.process_state = 'waiting'
    RETURNING s.order_id, s.step, s.process_state, s.name, s.agent, s.attempt, s.failure_count,
              s.idempotency_key, s.complete_by, s.priority, s.kind, s.compensates
), ended AS (
    SELECT g.order_id, g.reply_to, g.status AS from_status, g.created_at, g.namespace, g.new_result, g.next AS to_status,
           CASE WHEN g.kind = 'compensation' THEN g.step END AS undone_step
    FROM dec g
    WHERE g.next IN ('completed', 'failed')
), ord_upd AS (
    -- (the doors write the history: sql/05_guards.sql)
    UPDATE orders o SET status = e.to_status, updated_at = clock_timestamp(),
                        moves = o.moves + 1, moved_by = $8,
                        moved_why = CASE WHEN e.to_status = 'completed' THEN 'last step processed' ELSE 'every compensation processed' END
    FROM ended e WHERE o.order_id = e.order_id
), ord_ev AS (
    -- Held for $11 ms, for the caller to publish at once, when the
    -- outbox held nothing as the statement began (no event of any order
    -- waits before it): see ApplyRepliesPublishing.
    INSERT INTO outbox (message_type, order_id, reply_to, body, held_until)
    SELECT 'status_event', order_id, reply_to, status_event_body(order_id, to_status, NULL, new_result, undone_step),
           CASE WHEN $11 > 0 AND (SELECT id FROM outbox ORDER BY id LIMIT 1) IS NULL
                THEN clock_timestamp() + $11 * interval '1 millisecond' END
    FROM ended
    RETURNING id, message_id, order_id, reply_to, body, held_until IS NOT NULL AS held
)
SELECT cur.idx::int, cur.name, cur.took::float8, coalesce(nxt.step, 0), coalesce(e.to_status, ''),
       coalesce(extract(epoch FROM clock_timestamp() - e.created_at), 0)::float8,
       -- the next step, when claimed here: what its request needs
       coalesce(nxt.process_state = 'processing', false), coalesce(nxt.name, ''), coalesce(nxt.agent, ''),
       coalesce(nxt.attempt, 0), coalesce(nxt.failure_count, 0), coalesce(nxt.idempotency_key, ''), nxt.complete_by,
       coalesce((extract(epoch FROM nxt.complete_by - clock_timestamp()) * 1000)::bigint, 0), coalesce(nxt.priority, 0::smallint),
       coalesce(o.reply_to, ''), o.payload,
       CASE WHEN nxt.process_state = 'processing' THEN
           nullif(coalesce((SELECT jsonb_object_agg(p.name, p.result) FROM steps p
                            WHERE p.order_id = nxt.order_id AND p.step < nxt.step AND p.kind = 'action' AND p.result IS NOT NULL),
                           '{}'::jsonb) || g.new_result, '{}'::jsonb)
       END,
       a.result, coalesce(nxt.kind, ''), coalesce(a.idempotency_key, ''), coalesce(o.traceparent, ''), coalesce(e.namespace, ''),
       -- the order's status event, when held for the caller to publish
       coalesce(ev.id, 0), coalesce(ev.message_id::text, ''), coalesce(ev.reply_to, ''), ev.body, coalesce(g.traceparent, '')
FROM cur CROSS JOIN in_time LEFT JOIN nxt ON nxt.order_id = cur.order_id LEFT JOIN ended e ON e.order_id = cur.order_id
LEFT JOIN dec g ON g.order_id = cur.order_id
LEFT JOIN ord_ev ev ON ev.order_id = cur.order_id AND ev.held
LEFT JOIN orders o ON o.order_id = nxt.order_id AND nxt.process_state = 'processing'
LEFT JOIN steps a ON a.order_id = nxt.order_id AND a.step = nxt.compensates AND nxt.process_state = 'processing'`

// ApplyReplies applies many replies, each as ApplyReply would; results and
// errors are by index. The ok replies (at most one per order) are applied
// by one statement, so its fixed costs are paid once per batch; failed
// replies, and any second reply for the same order, go one by one. If the
// statement fails (a database error, a deadlock with a concurrent change),
// every reply is applied on its own, so one reply's trouble never holds up
// the others.
func (s *Store) ApplyReplies(ctx context.Context, rs []Reply) ([]ApplyResult, []error) {
	return s.ApplyRepliesClaiming(ctx, rs, nil)
}

// ApplyRepliesClaiming applies replies as ApplyReplies does and, for each
// ok reply applied in the batch whose next step is of one of the agent
// kinds claimFor, claims that step for the replies' actor in the same
// statement, as ClaimKinds would (attempt, complete_by, history), and
// returns it in the result's Claimed: one statement and one row version
// fewer than the step becoming pending and then claimed.
func (s *Store) ApplyRepliesClaiming(ctx context.Context, rs []Reply, claimFor []string) ([]ApplyResult, []error) {
	return s.applyReplies(ctx, rs, claimFor, 0)
}

// ApplyRepliesPublishing applies replies as ApplyRepliesClaiming does and,
// when the outbox held nothing as the batch's statement began, holds the
// status event of each order it ended for hold: a relay publishes
// nothing from that event on until the hold ends, and the caller publishes
// it (the result's Event) and forgets it (ForgetPublished). An order's
// end is then told without a relay's round of two transactions, and its
// events still go out in the order they were written. A held event its
// caller never forgot is the relay's once the hold has passed.
func (s *Store) ApplyRepliesPublishing(ctx context.Context, rs []Reply, claimFor []string, hold time.Duration) ([]ApplyResult, []error) {
	return s.applyReplies(ctx, rs, claimFor, max(hold.Milliseconds(), 1))
}

func (s *Store) applyReplies(ctx context.Context, rs []Reply, claimFor []string, holdMS int64) ([]ApplyResult, []error) {
	if claimFor == nil {
		claimFor = []string{}
	}
	results := make([]ApplyResult, len(rs))
	errs := make([]error, len(rs))
	var ids []string
	var steps, attempts []int32
	var resultsJSON []*string
	var started, sent []*time.Time
	var calls []int64
	var batched []int // indexes of the replies in the statement
	var alone []int
	actor := ""
	seen := make(map[string]bool, len(rs))
	for i, r := range rs {
		if !r.OK || seen[r.OrderID] || (actor != "" && r.Actor != actor) {
			alone = append(alone, i)
			continue
		}
		seen[r.OrderID], actor = true, r.Actor
		batched = append(batched, i)
		ids = append(ids, r.OrderID)
		steps = append(steps, int32(r.Step))
		attempts = append(attempts, int32(r.Attempt))
		var res *string
		if r.Result != nil {
			v := string(r.Result)
			res = &v
		}
		resultsJSON = append(resultsJSON, res)
		started = append(started, r.AgentStartedAt)
		sent = append(sent, r.AgentSentAt)
		calls = append(calls, r.AgentCallMicros)
	}
	if len(batched) > 0 {
		applied := make(map[int]bool, len(batched))
		// One implicit transaction (a batch is): the reply statement on
		// its generic plan (genericPlansExpr).
		b := &pgx.Batch{}
		b.Queue(`SELECT ` + genericPlansExpr)
		b.Queue(applyOKRepliesSQL, ids, steps, attempts, resultsJSON, started, sent, calls, actor,
			!failpoint.Broken("unfenced-replies"), claimFor, holdMS)
		br := s.pool.SendBatch(ctx, b)
		_, err := br.Exec()
		var rows pgx.Rows
		if err == nil {
			rows, err = br.Query()
		}
		if err == nil {
			for rows.Next() {
				var idx int
				var res ApplyResult
				var took, orderTook float64
				var claimed bool
				var c ClaimedStep
				var completeBy *time.Time
				var budgetMS int64
				var prio int16
				var ev OutboxMessage
				if err = rows.Scan(&idx, &res.StepName, &took, &res.NextStep, &res.OrderStatus, &orderTook,
					&claimed, &c.Name, &c.Agent, &c.Attempt, &c.FailureCount, &c.IdempotencyKey, &completeBy,
					&budgetMS, &prio, &c.ReplyTo, &c.Payload, &c.Results, &c.UndoneResult, &c.Kind, &c.Undoes, &c.Traceparent, &res.OrderNamespace,
					&ev.ID, &ev.MessageID, &ev.ReplyTo, &ev.Body, &ev.Traceparent); err != nil {
					break
				}
				if idx < 1 || idx > len(batched) {
					err = fmt.Errorf("apply replies: row for reply %d of %d", idx, len(batched))
					break
				}
				if claimed && completeBy != nil {
					c.OrderID, c.Step, c.CompleteBy = ids[idx-1], res.NextStep, *completeBy
					c.setBudgetPriority(budgetMS, prio)
					res.Claimed = &c
				}
				if ev.ID != 0 {
					ev.Type, ev.OrderID = OutboxStatusEvent, ids[idx-1]
					res.Event = &ev
				}
				res.StepState = StepProcessed
				res.StepTook = time.Duration(took * float64(time.Second))
				res.OrderTook = time.Duration(orderTook * float64(time.Second))
				results[batched[idx-1]] = res
				applied[idx-1] = true
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			if ctx.Err() != nil {
				for i, r := range rs {
					results[i], errs[i] = ApplyResult{}, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
				}
				return results, errs
			}
			// One reply's trouble (most often a row another transaction
			// holds: the statement gave up after the lock timeout) must not
			// hold up the others: each is applied on its own, at once, and
			// one that finds its rows still held gives up quickly; the
			// caller tries it again, on its own (IsLockTimeout).
			clear(results)
			s.applyEach(ctx, rs, batched, results, errs, func(ctx context.Context, r Reply) (ApplyResult, error) {
				return s.applyReplyWithin(ctx, r, fallbackLockTimeout)
			})
		} else {
			// A reply the statement did not apply is stale, or for a step
			// of a graph, which the statement leaves to apply_reply (its
			// joins need the order's row locked before they are read).
			var rest []int
			for j, i := range batched {
				if !applied[j] {
					rest = append(rest, i)
				}
			}
			s.applyEach(ctx, rs, rest, results, errs, s.applyReplyFunc)
		}
	}
	s.applyEach(ctx, rs, alone, results, errs, s.ApplyReply)
	return results, errs
}

// fallbackLockTimeout is how long a reply applied on its own after its
// batch failed waits for a row lock: the batch already waited the pool's
// lock timeout, so a row still held is held by something stuck.
const fallbackLockTimeout = 100 * time.Millisecond

// applyEach applies the replies rs[idx] one by one with apply, a few at
// a time, and sets their results and errors.
func (s *Store) applyEach(ctx context.Context, rs []Reply, idx []int, results []ApplyResult, errs []error,
	apply func(context.Context, Reply) (ApplyResult, error)) {
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, i := range idx {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i], errs[i] = apply(ctx, rs[i])
		})
	}
	wg.Wait()
}

// applyReplyWithin is ApplyReply in a transaction whose statements wait at
// most lockTimeout for a row lock.
func (s *Store) applyReplyWithin(ctx context.Context, r Reply, lockTimeout time.Duration) (ApplyResult, error) {
	var res ApplyResult
	var applied bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(lockTimeout.Milliseconds(), 10)); err != nil {
			return err
		}
		var err error
		res, applied, err = scanApplied(tx.QueryRow(ctx, applyReplySQL, r.args()...))
		return err
	})
	if err != nil {
		return ApplyResult{}, fmt.Errorf("apply reply for order %s step %d: %w", r.OrderID, r.Step, err)
	}
	if !applied {
		return ApplyResult{}, s.staleReason(ctx, r)
	}
	return res, nil
}

// staleReason explains a reply that matched no row. It only informs: the
// decision was made by the fenced update.
func (s *Store) staleReason(ctx context.Context, r Reply) error {
	stale := &StaleReplyError{OrderID: r.OrderID, Step: r.Step, Attempt: r.Attempt}
	var attempt int
	var state string
	var inTime bool
	err := s.pool.QueryRow(ctx,
		`SELECT attempt, process_state, coalesce(complete_by >= clock_timestamp(), false) FROM steps WHERE order_id = $1 AND step = $2`,
		r.OrderID, r.Step).Scan(&attempt, &state, &inTime)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		stale.Kind, stale.Reason = StaleUnknownStep, "no such step"
	case err != nil:
		stale.Kind, stale.Reason = StaleRace, "unknown ("+err.Error()+")"
	case attempt != r.Attempt:
		stale.Kind, stale.Reason = StaleSuperseded, fmt.Sprintf("attempt superseded (current attempt %d)", attempt)
	case state != StepProcessing:
		stale.Kind, stale.Reason = StaleNotProcessing, "step is "+state
	case !inTime:
		stale.Kind, stale.Reason = StaleLate, "complete_by has passed"
	default:
		stale.Kind, stale.Reason = StaleRace, "step changed concurrently"
	}
	return stale
}

// NoteAnswer keeps a service's last answer with the step of an attempt
// its agent gave up on before complete_by (an abandoned reply), fenced as
// a reply is: only while that attempt is the step's and still running.
// It reports whether it was kept; nothing else changes.
func (s *Store) NoteAnswer(ctx context.Context, orderID string, step, attempt int, answer string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE steps SET last_answer = $4, updated_at = clock_timestamp()
WHERE order_id = $1 AND step = $2 AND attempt = $3 AND process_state = 'processing'`, orderID, step, attempt, answer)
	if err != nil {
		return false, fmt.Errorf("note answer for order %s step %d: %w", orderID, step, err)
	}
	return tag.RowsAffected() == 1, nil
}
