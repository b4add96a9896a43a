-- The current text of every database function of the state store: the
-- one place to read what happens to an order when a step ends.
--
-- `sasctl migrate` (statestore.Migrate) applies this file with CREATE OR
-- REPLACE after the schema migrations, in the same lock, whenever it
-- differs from what was applied last. Migrations carry schema changes only
-- (tables, columns, indexes, triggers, roles and grants); a function is
-- changed here, and TestFunctionsFileIsTheDefinition fails when a function
-- in the database has another text than this file's, or is not in it.
-- A new function's grants (and REVOKE from PUBLIC) go in a migration, as
-- they are schema; a function dropped from this file is dropped by one.

-- ======================================================================
-- The order's state machine: what happens when a step ends
-- ======================================================================

-- apply_reply: applies one agent reply, fenced by attempt, state and
-- complete_by: the step's new state and history, then step_processed or
-- step_failed. Failed replies come here; ok replies come here only when
-- their batched statement (statestore/reply.go) could not apply them.
CREATE OR REPLACE FUNCTION apply_reply(p_order uuid, p_step integer, p_attempt integer, p_ok boolean, p_result jsonb, p_error text, p_actor text, p_started timestamp with time zone, p_sent timestamp with time zone, p_call_us bigint, p_fenced boolean, p_answer text, OUT applied boolean, OUT step_state text, OUT step_name text, OUT took_s double precision, OUT next_step integer, OUT order_status text, OUT order_took_s double precision)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_failures integer;
    v_attempt integer;
    v_agent text;
BEGIN
    applied := false;
    next_step := 0;
    order_status := '';
    took_s := 0;
    order_took_s := 0;
    PERFORM 1 FROM steps WHERE order_id = p_order AND step = p_step FOR UPDATE;
    UPDATE steps
    SET process_state = CASE WHEN p_ok THEN 'processed' ELSE 'error' END,
        failure_count = CASE WHEN p_ok THEN failure_count ELSE failure_count + 1 END,
        result = p_result,
        last_error = NULLIF(p_error, ''),
        last_answer = CASE WHEN p_ok THEN NULL ELSE coalesce(NULLIF(p_answer, ''), last_answer) END,
        agent_started_at = p_started, agent_sent_at = p_sent, agent_call_us = NULLIF(p_call_us, 0),
        updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step
      AND (NOT p_fenced OR (attempt = p_attempt AND process_state = 'processing' AND complete_by >= clock_timestamp()))
    RETURNING process_state, failure_count, name, attempt,
              coalesce(extract(epoch FROM clock_timestamp()
                               - CASE WHEN held_attempt = attempt THEN held_since ELSE complete_by - timeout END), 0), agent
    INTO step_state, v_failures, step_name, v_attempt, took_s, v_agent;
    IF NOT FOUND THEN
        step_state := '';
        step_name := '';
        took_s := 0;
        RETURN;
    END IF;
    applied := true;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', step_state, v_attempt, p_actor,
            CASE WHEN p_ok AND v_agent = '' THEN 'its timer ended'
                 WHEN p_ok THEN 'agent replied ok' ELSE 'agent replied failed: ' || p_error END);
    IF p_ok THEN
        SELECT sp.next_step, sp.order_status INTO next_step, order_status FROM step_processed(p_order, p_step, p_actor) sp;
    ELSE
        order_status := step_failed(p_order, p_step, p_actor, 'agent replied failed: ' || p_error, v_failures);
    END IF;
    IF order_status IN ('completed', 'failed', 'error') THEN
        SELECT extract(epoch FROM clock_timestamp() - created_at) INTO order_took_s FROM orders WHERE order_id = p_order;
    END IF;
END;
$function$;

-- sas_refuse_late_apply: fails the batched reply statement when a step it
-- wrote had passed complete_by meanwhile, so the batch goes reply by
-- reply through apply_reply, which locks before it reads.
CREATE OR REPLACE FUNCTION sas_refuse_late_apply(late boolean)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF late THEN
        RAISE EXCEPTION 'a reply waited for a row lock past its complete_by; applying the batch reply by reply'
            USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN true;
END;
$function$;

-- order_next: what comes next for an order when one of its steps ends,
-- decided here and nowhere else. step_processed and step_failed (one
-- reply, and the supervisor's failure path) and the batched reply
-- statement (statestore/reply.go) each act on its answer:
--   none        the order moved on meanwhile (cancelled, compensating,
--               ended): the step's end changes nothing else
--   next        the next step of the same kind becomes pending
--   completed   the last action was processed: the order completed
--   failed      the last compensation was processed: the order failed
--   compensate  an action failed and the order's policy is compensate:
--               what was done is undone, last first (begin_compensation)
--   error       an action failed and the policy is hold, or a
--               compensation failed: the order is held in error and an
--               operator alerted
-- p_has_next: a step of the same kind follows, still waiting. Pure, so
-- the planner inlines it into the batched statement.
CREATE OR REPLACE FUNCTION order_next(p_kind text, p_ok boolean, p_order_status text, p_policy text, p_has_next boolean)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE
        WHEN NOT ((p_kind = 'action' AND p_order_status IN ('received', 'processing'))
                  OR (p_kind = 'compensation' AND p_order_status = 'compensating')) THEN 'none'
        WHEN p_ok AND p_has_next THEN 'next'
        WHEN p_ok AND p_kind = 'action' THEN 'completed'
        WHEN p_ok THEN 'failed'
        WHEN p_kind = 'compensation' OR p_policy = 'hold' THEN 'error'
        ELSE 'compensate'
    END
$function$;

-- step_processed: a step was processed; does what order_next decides
-- (in a graph, what graph_advance does).
CREATE OR REPLACE FUNCTION step_processed(p_order uuid, p_step integer, p_actor text, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_kind text;
    v_graph boolean;
    v_status text;
BEGIN
    next_step := 0;
    order_status := '';
    SELECT kind, needs IS NOT NULL INTO v_kind, v_graph FROM steps WHERE order_id = p_order AND step = p_step;
    IF v_graph THEN
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    CASE order_next(v_kind, true, v_status, NULL,
                    EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND step = p_step + 1
                                                  AND kind = v_kind AND process_state = 'waiting'))
    WHEN 'next' THEN
        UPDATE steps SET process_state = 'pending', available_at = now(), updated_at = now()
        WHERE order_id = p_order AND step = p_step + 1 AND kind = v_kind AND process_state = 'waiting'
        RETURNING step INTO next_step;
        INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
        VALUES (p_order, next_step, 'waiting', 'pending', p_actor, 'previous step processed');
    WHEN 'completed' THEN
        order_status := 'completed';
        PERFORM order_transition(p_order, 'completed', NULL, p_actor, 'last step processed');
    WHEN 'failed' THEN
        order_status := 'failed';
        PERFORM order_transition(p_order, 'failed', NULL, p_actor, 'every compensation processed');
    ELSE
        -- none: the order moved on meanwhile
    END CASE;
END;
$function$;

-- step_failed: a step failed for good (its agent's reply, or the
-- supervisor at the step's max_failures); does what order_next decides
-- and returns the order's status.
CREATE OR REPLACE FUNCTION step_failed(p_order uuid, p_step integer, p_actor text, p_reason text, p_failure_count integer)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_policy text;
    v_kind text;
    v_graph boolean;
BEGIN
    SELECT status, failure_policy INTO v_status, v_policy FROM orders WHERE order_id = p_order FOR UPDATE;
    SELECT kind, needs IS NOT NULL INTO v_kind, v_graph FROM steps WHERE order_id = p_order AND step = p_step;
    CASE order_next(v_kind, false, v_status, v_policy, false)
    WHEN 'none' THEN
        IF v_graph THEN
            -- a branch in flight ended while the order is undone: its
            -- compensation may run now
            RETURN coalesce(nullif((SELECT ga.order_status FROM graph_advance(p_order, p_actor) ga), ''), v_status);
        END IF;
        RETURN v_status;
    WHEN 'error' THEN
        IF v_kind = 'compensation' THEN
            PERFORM order_transition(p_order, 'error', p_step, p_actor,
                'compensation step ' || p_step || ' failed: ' || p_reason);
            PERFORM raise_alert(p_order, p_step, 'compensation failed, the order is partly undone: ' || p_reason, p_failure_count, p_actor);
        ELSE
            PERFORM order_transition(p_order, 'error', p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
            PERFORM raise_alert(p_order, p_step, p_reason, p_failure_count, p_actor);
        END IF;
        RETURN 'error';
    ELSE
        RETURN begin_compensation(p_order, p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
    END CASE;
END;
$function$;

-- begin_compensation: the order begins compensating (order_next's
-- compensate, or an operator's cancel): actions not yet done are
-- cancelled, compensations of actions that never ran too (every attempt
-- answered before a request left: attempt <= unsent_attempts), and the
-- first compensation left becomes pending; with none left, the order
-- fails.
-- In a graph, steps in flight are let end and graph_advance starts every
-- compensation that may run.
CREATE OR REPLACE FUNCTION begin_compensation(p_order uuid, p_step integer, p_actor text, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first integer;
    v_status text;
BEGIN
    IF EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND needs IS NOT NULL) THEN
        -- A graph: what has not started never will; steps in flight are
        -- let end, and each action's compensation runs once it has, after
        -- those of the steps that needed it (graph_advance).
        WITH old AS (
            SELECT step, process_state, attempt FROM steps
            WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'expanded', 'delayed', 'awaiting')
            FOR UPDATE
        ), upd AS (
            UPDATE steps s SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, due_at = NULL, updated_at = now()
            FROM old WHERE s.order_id = p_order AND s.step = old.step
        )
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT p_order, step, process_state, 'cancelled', attempt, p_actor, p_reason FROM old;
        -- Its children that still run are undone with it.
        IF EXISTS (SELECT 1 FROM orders WHERE parent_order = p_order) THEN
            PERFORM children_cancel(p_order, p_actor);
        END IF;
        PERFORM order_transition(p_order, 'compensating', p_step, p_actor, p_reason);
        SELECT ga.order_status INTO v_status FROM graph_advance(p_order, p_actor) ga;
        RETURN coalesce(nullif(v_status, ''), 'compensating');
    END IF;
    WITH dead AS (
        SELECT c.step, c.attempt FROM steps c
        JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting' AND a.attempt <= a.unsent_attempts
        FOR UPDATE OF c
    ), upd AS (
        UPDATE steps s SET process_state = 'cancelled', updated_at = now()
        FROM dead WHERE s.order_id = p_order AND s.step = dead.step
    )
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT p_order, step, 'waiting', 'cancelled', attempt, p_actor, 'its action never ran' FROM dead;

    WITH old AS (
        SELECT step, process_state, attempt FROM steps
        WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'processing')
        FOR UPDATE
    ), upd AS (
        UPDATE steps s SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, updated_at = now()
        FROM old WHERE s.order_id = p_order AND s.step = old.step
    )
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT p_order, step, process_state, 'cancelled', attempt, p_actor, p_reason FROM old;

    SELECT min(step) INTO v_first FROM steps
    WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'waiting';
    IF v_first IS NULL THEN
        PERFORM order_transition(p_order, 'failed', p_step, p_actor, p_reason || '; nothing to undo');
        RETURN 'failed';
    END IF;
    UPDATE steps SET process_state = 'pending', available_at = now(), updated_at = now()
    WHERE order_id = p_order AND step = v_first;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, v_first, 'waiting', 'pending', p_actor, 'compensation started');
    PERFORM order_transition(p_order, 'compensating', p_step, p_actor, p_reason);
    RETURN 'compensating';
END;
$function$;

-- ======================================================================
-- Graphs: steps that run as their needs allow
-- ======================================================================

-- graph_advance: what comes next for an order of a graph workflow, once
-- one of its steps changed; decided here and nowhere else for graphs (a
-- list's order goes by order_next). It locks the order row first, so its
-- later statements see what every transaction that held the row before
-- committed: of two branches ending at once, the one that ends last sees
-- the other ended, and its join runs once.
-- While the order runs:
--   a for_each step whose instances all ended is processed, its result
--   the list of theirs in item order; up to max_parallel instances of
--   each for_each step run; every waiting action whose needs all ended
--   (processed or skipped) becomes pending (delayed, due after its delay,
--   if it has one: fire_timers); with no action left to end,
--   the order completes.
-- While it is undone (compensating):
--   the compensation of an action that never ran (every attempt answered
--   before a request left, attempt <= unsent_attempts: never claimed, or
--   skipped, or failed by its when, for_each or input, or cancelled at
--   its claim; or a for_each step, whose instances have their own) is
--   cancelled; every
--   other waiting compensation becomes pending once its action has ended
--   (an action in flight is let end) and the compensations it needs (those
--   of the actions after its own) have; with nothing left to run or end,
--   the order fails.
-- It returns the lowest step it made pending (0: none) and the order's new
-- status, if it ended ('' otherwise).
CREATE OR REPLACE FUNCTION graph_advance(p_order uuid, p_actor text, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_parent record;
    v_open integer;
    v_busy integer;
    v_waiting integer[];
    v_steps integer[];
BEGIN
    next_step := 0;
    order_status := '';
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF v_status IN ('received', 'processing') THEN
        FOR v_parent IN SELECT step, attempt, coalesce((spec->>'max_parallel')::int, 1) AS max_parallel
                        FROM steps WHERE order_id = p_order AND process_state = 'expanded' LOOP
            SELECT count(*) FILTER (WHERE process_state <> 'processed'),
                   count(*) FILTER (WHERE process_state IN ('pending', 'processing', 'error')),
                   array_agg(step ORDER BY item_index) FILTER (WHERE process_state = 'waiting')
            INTO v_open, v_busy, v_waiting
            FROM steps WHERE order_id = p_order AND parent = v_parent.step AND kind = 'action';
            IF v_open = 0 THEN
                UPDATE steps SET process_state = 'processed', updated_at = clock_timestamp(),
                    result = (SELECT coalesce(jsonb_agg(coalesce(i.result, 'null'::jsonb) ORDER BY i.item_index), '[]'::jsonb)
                              FROM steps i WHERE i.order_id = p_order AND i.parent = v_parent.step AND i.kind = 'action')
                WHERE order_id = p_order AND step = v_parent.step;
                INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
                VALUES (p_order, v_parent.step, 'expanded', 'processed', v_parent.attempt, p_actor, 'every instance processed');
            ELSIF v_busy < v_parent.max_parallel THEN
                next_step := steps_made_pending(p_order, v_waiting[1:v_parent.max_parallel - v_busy], next_step,
                                                p_actor, 'an instance may run');
            END IF;
        END LOOP;

        SELECT array_agg(s.step) INTO v_steps FROM steps s
        WHERE s.order_id = p_order AND s.kind = 'action' AND s.process_state = 'waiting' AND s.parent IS NULL
          AND NOT EXISTS (SELECT 1 FROM steps n WHERE n.order_id = p_order AND n.step = ANY(s.needs)
                                                  AND n.process_state NOT IN ('processed', 'skipped'));
        next_step := steps_made_pending(p_order, v_steps, next_step, p_actor, 'every step it needs ended');

        IF NOT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'action' AND process_state NOT IN ('processed', 'skipped')) THEN
            order_status := 'completed';
            PERFORM order_transition(p_order, 'completed', NULL, p_actor, 'every step ended');
        END IF;
    ELSIF v_status = 'compensating' THEN
        WITH dead AS (
            SELECT c.step FROM steps c
            JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
            WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting'
              AND (a.spec ? 'for_each'
                   OR (a.attempt <= a.unsent_attempts AND a.process_state IN ('waiting', 'pending', 'cancelled', 'skipped', 'error')))
        )
        SELECT array_agg(step) INTO v_steps FROM dead;
        IF v_steps IS NOT NULL THEN
            WITH upd AS (
                UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp()
                WHERE order_id = p_order AND step = ANY(v_steps) AND process_state = 'waiting'
                RETURNING step, attempt
            )
            INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
            SELECT p_order, step, 'waiting', 'cancelled', attempt, p_actor, 'its action never ran' FROM upd;
        END IF;

        SELECT array_agg(c.step) INTO v_steps FROM steps c
        JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting'
          AND a.process_state IN ('processed', 'error', 'cancelled')
          AND NOT EXISTS (SELECT 1 FROM steps n WHERE n.order_id = p_order AND n.step = ANY(c.needs)
                                                  AND n.process_state NOT IN ('processed', 'cancelled', 'skipped'));
        next_step := steps_made_pending(p_order, v_steps, next_step, p_actor, 'compensation started');

        IF NOT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order
                         AND ((kind = 'compensation' AND process_state IN ('waiting', 'pending', 'processing', 'error', 'awaiting'))
                              OR (kind = 'action' AND process_state = 'processing'))) THEN
            order_status := 'failed';
            PERFORM order_transition(p_order, 'failed', NULL, p_actor, 'every compensation processed');
        END IF;
    END IF;
END;
$function$;

-- steps_made_pending: graph_advance's one way to start steps: the given
-- waiting steps of the order become pending, each with its history row;
-- a step with a delay becomes delayed instead, due that long from now on
-- the database clock (fire_timers makes it pending then). It returns the
-- lowest step of p_lowest (0: none) and those it made pending. The steps
-- come as a list, read before, so that the update is a lookup of each by
-- its key whatever the planner guesses of an order's size.
CREATE OR REPLACE FUNCTION steps_made_pending(p_order uuid, p_steps integer[], p_lowest integer, p_actor text, p_reason text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first integer;
BEGIN
    IF p_steps IS NULL OR cardinality(p_steps) = 0 THEN
        RETURN p_lowest;
    END IF;
    WITH upd AS (
        UPDATE steps
        SET process_state = CASE WHEN spec ? 'delay_ms' THEN 'delayed' ELSE 'pending' END,
            due_at = CASE WHEN spec ? 'delay_ms'
                          THEN clock_timestamp() + make_interval(secs => (spec->>'delay_ms')::float8 / 1000) END,
            available_at = now(), updated_at = clock_timestamp()
        WHERE order_id = p_order AND step = ANY(p_steps) AND process_state = 'waiting'
        RETURNING step, process_state, due_at
    ), hist AS (
        INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
        SELECT p_order, step, 'waiting', process_state, p_actor,
               CASE WHEN due_at IS NULL THEN p_reason
                    ELSE p_reason || '; due at ' || to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') END
        FROM upd
    )
    SELECT min(step) FILTER (WHERE process_state = 'pending') INTO v_first FROM upd;
    IF v_first IS NOT NULL AND (p_lowest = 0 OR v_first < p_lowest) THEN
        RETURN v_first;
    END IF;
    RETURN p_lowest;
END;
$function$;

-- fire_timers: the timers that fell due (due_at passed on the database
-- clock), earliest first, at most p_limit of each sort, if p_holder holds
-- the lease p_lease (so a supervisor that lost the lead fires nothing),
-- for orders that still run (a held order's timers wait for its
-- resubmit; an order undone or cancelled cancelled its steps):
--   a delayed step becomes pending;
--   a wait step still awaiting its signal timed out: with on_timeout skip
--   it is skipped, else it fails for good (step_failed: the workflow's
--   policy decides).
-- Two at once never fire one timer twice: rows are taken FOR UPDATE SKIP
-- LOCKED and re-checked. It returns each step fired and how late, in
-- seconds.
CREATE OR REPLACE FUNCTION fire_timers(p_holder text, p_lease text, p_limit integer)
 RETURNS TABLE(order_id uuid, step integer, late_s double precision)
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
    v_reason text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = p_lease AND l.holder = p_holder AND l.expires_at > now()) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT s.order_id, s.step FROM steps s JOIN orders o ON o.order_id = s.order_id
        WHERE s.process_state = 'delayed' AND s.due_at <= clock_timestamp() AND o.status IN ('received', 'processing')
        ORDER BY s.due_at
        LIMIT p_limit
        FOR UPDATE OF s SKIP LOCKED
    ), upd AS (
        UPDATE steps s SET process_state = 'pending', available_at = now(), updated_at = clock_timestamp()
        FROM due WHERE s.order_id = due.order_id AND s.step = due.step AND s.process_state = 'delayed'
        RETURNING s.order_id, s.step, s.attempt, s.due_at
    ), hist AS (
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT u.order_id, u.step, 'delayed', 'pending', u.attempt, p_holder, 'its delay ended' FROM upd u
    )
    SELECT u.order_id, u.step, extract(epoch FROM clock_timestamp() - u.due_at)::float8 FROM upd u;

    FOR r IN SELECT s.order_id, s.step, s.attempt, s.due_at, s.spec->'wait' AS w FROM steps s JOIN orders o ON o.order_id = s.order_id
             WHERE s.process_state = 'awaiting' AND s.due_at <= clock_timestamp() AND o.status IN ('received', 'processing')
             ORDER BY s.due_at
             LIMIT p_limit
             FOR UPDATE OF s SKIP LOCKED LOOP
        v_reason := 'no signal ' || (r.w->>'signal') || ' came within its timeout of '
                    || ((r.w->>'timeout_ms')::bigint / 1000.0)::text || ' s';
        IF r.w->>'on_timeout' = 'skip' THEN
            UPDATE steps s SET process_state = 'skipped', updated_at = clock_timestamp()
            WHERE s.order_id = r.order_id AND s.step = r.step;
            INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
            VALUES (r.order_id, r.step, 'awaiting', 'skipped', r.attempt, p_holder, v_reason || ': skipped (on_timeout: skip)');
            PERFORM graph_advance(r.order_id, p_holder);
        ELSE
            UPDATE steps s SET process_state = 'error', failure_count = s.max_failures, last_error = v_reason,
                               updated_at = clock_timestamp()
            WHERE s.order_id = r.order_id AND s.step = r.step;
            INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
            VALUES (r.order_id, r.step, 'awaiting', 'error', r.attempt, p_holder, v_reason);
            PERFORM step_failed(r.order_id, r.step, p_holder, v_reason,
                                (SELECT s.max_failures FROM steps s WHERE s.order_id = r.order_id AND s.step = r.step));
        END IF;
        order_id := r.order_id;
        step := r.step;
        late_s := extract(epoch FROM clock_timestamp() - r.due_at)::float8;
        RETURN NEXT;
    END LOOP;
END;
$function$;

-- step_await: a claimed wait step begins to wait (fenced as a reply is):
-- a signal of its name its order kept (it came before the wait began)
-- ends it at once, its payload the step's result; otherwise it awaits
-- one until its timeout (due_at), when fire_timers fails or skips it. An
-- order undone or ended since the claim cancels the wait instead.
CREATE OR REPLACE FUNCTION step_await(p_order uuid, p_step integer, p_attempt integer, p_actor text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_wait jsonb;
    v_signal text;
    v_payload jsonb;
    v_due timestamptz;
BEGIN
    applied := graph_step_claimed(p_order, p_step, p_attempt);
    next_step := 0;
    order_status := '';
    IF NOT applied THEN
        RETURN;
    END IF;
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF v_status NOT IN ('received', 'processing', 'error') THEN
        -- The order is being undone (or ended) since the claim: the wait
        -- never begins.
        SELECT c.next_step, c.order_status INTO next_step, order_status FROM claim_cancelled(p_order, p_step, p_attempt, p_actor, v_status) c;
        RETURN;
    END IF;
    SELECT spec->'wait' INTO v_wait FROM steps WHERE order_id = p_order AND step = p_step;
    SELECT g.signal_id, g.payload INTO v_signal, v_payload FROM signals g
    WHERE g.order_id = p_order AND g.name = v_wait->>'signal' AND g.step IS NULL
    ORDER BY g.received_at LIMIT 1 FOR UPDATE;
    IF FOUND THEN
        UPDATE signals SET step = p_step WHERE order_id = p_order AND signal_id = v_signal;
        UPDATE steps SET process_state = 'processed', result = v_payload, locked_by = NULL, complete_by = NULL,
                         updated_at = clock_timestamp()
        WHERE order_id = p_order AND step = p_step;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (p_order, p_step, 'processing', 'processed', p_attempt, p_actor,
                'signal ' || (v_wait->>'signal') || ' (id ' || v_signal || ') had come before the wait began');
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    v_due := clock_timestamp() + make_interval(secs => (v_wait->>'timeout_ms')::float8 / 1000);
    UPDATE steps SET process_state = 'awaiting', due_at = v_due, locked_by = NULL, complete_by = NULL,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'awaiting', p_attempt, p_actor,
            'waiting for signal ' || (v_wait->>'signal') || ' until '
            || to_char(v_due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
END;
$function$;

-- step_hold: the service of an attempt holds it open: it answered the call
-- 202 Accepted (p_answer, what it said) or sent a heartbeat (p_answer
-- NULL). The attempt stays processing, its complete_by pushed out to
-- p_hold_ms from now (0: the step's timeout), never past the attempt's
-- claim plus the step's max_duration (spec max_duration_ms, one hour when
-- the file says none), and never brought in. Fenced as a reply is: a hold
-- of an attempt that is not the step's running one changes nothing. The
-- first hold of an attempt goes into the history.
CREATE OR REPLACE FUNCTION step_hold(p_order uuid, p_step integer, p_attempt integer, p_hold_ms bigint, p_answer text, p_actor text, OUT applied boolean, OUT complete_by timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first boolean;
    v_since timestamptz;
    v_max interval;
BEGIN
    applied := false;
    SELECT s.held_attempt IS DISTINCT FROM s.attempt,
           CASE WHEN s.held_attempt = s.attempt THEN s.held_since ELSE s.complete_by - s.timeout END,
           make_interval(secs => coalesce((s.spec->>'max_duration_ms')::float8, 3600000) / 1000)
    INTO v_first, v_since, v_max
    FROM steps s
    WHERE s.order_id = p_order AND s.step = p_step AND s.attempt = p_attempt
      AND s.process_state = 'processing' AND s.complete_by >= clock_timestamp()
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE steps s
    SET held_attempt = p_attempt, held_since = v_since,
        complete_by = greatest(s.complete_by,
                               least(clock_timestamp() + CASE WHEN p_hold_ms > 0 THEN make_interval(secs => p_hold_ms::float8 / 1000)
                                                              ELSE s.timeout END,
                                     v_since + v_max)),
        last_answer = coalesce(NULLIF(p_answer, ''), s.last_answer),
        updated_at = clock_timestamp()
    WHERE s.order_id = p_order AND s.step = p_step
    RETURNING s.complete_by INTO complete_by;
    applied := true;
    IF v_first THEN
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (p_order, p_step, 'processing', 'processing', p_attempt, p_actor,
                CASE WHEN p_answer IS NULL OR p_answer = '' THEN 'the service sent a heartbeat'
                     ELSE 'the service accepted the call (' || p_answer || ')' END
                || '; waiting for its callback until '
                || to_char(complete_by AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
    END IF;
END;
$function$;

-- order_signal: a signal for an order, by its id (the same id twice is
-- applied once). It answers with what became of it:
--   applied       a step awaiting a signal of its name ended with it (its
--                 payload the result) and the order went on
--   kept          its wait has not begun: kept until it does (step_await)
--   duplicate     this id came before; nothing changed
--   unknown_order, order_ended (the order completed or failed),
--   no_such_wait (no step of the order waits for the name), wait_ended
--   (every step that waits for it has ended): refused, nothing kept
-- with the step it ended (0: none), the order's new status if it ended
-- ('' otherwise), and for a refusal what to say.
CREATE OR REPLACE FUNCTION order_signal(p_order uuid, p_signal_id text, p_name text, p_payload jsonb, p_actor text, OUT outcome text, OUT step integer, OUT order_status text, OUT detail text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_step integer;
    v_waits text;
BEGIN
    step := 0;
    order_status := '';
    detail := '';
    SELECT o.status INTO v_status FROM orders o WHERE o.order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'unknown_order';
        detail := 'order ' || p_order || ' does not exist';
        RETURN;
    END IF;
    SELECT coalesce(g.step, 0) INTO step FROM signals g WHERE g.order_id = p_order AND g.signal_id = p_signal_id;
    IF FOUND THEN
        outcome := 'duplicate';
        RETURN;
    END IF;
    step := 0;
    IF v_status NOT IN ('received', 'processing', 'error') THEN
        outcome := 'order_ended';
        detail := 'order ' || p_order || ' is ' || v_status || ': no step of it waits any more';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM steps s WHERE s.order_id = p_order AND s.spec->'wait'->>'signal' = p_name) THEN
        SELECT string_agg(DISTINCT s.spec->'wait'->>'signal', ', ') INTO v_waits FROM steps s
        WHERE s.order_id = p_order AND s.spec ? 'wait';
        outcome := 'no_such_wait';
        detail := 'no step of order ' || p_order || ' waits for a signal ' || p_name
                  || coalesce(' (its steps wait for ' || v_waits || ')', ' (none of its steps waits for a signal)');
        RETURN;
    END IF;
    SELECT s.step INTO v_step FROM steps s
    WHERE s.order_id = p_order AND s.spec->'wait'->>'signal' = p_name AND s.process_state = 'awaiting'
    ORDER BY s.step LIMIT 1 FOR UPDATE;
    IF FOUND THEN
        INSERT INTO signals (order_id, signal_id, name, payload, actor, step) VALUES (p_order, p_signal_id, p_name, p_payload, p_actor, v_step);
        UPDATE steps s SET process_state = 'processed', result = p_payload, updated_at = clock_timestamp()
        WHERE s.order_id = p_order AND s.step = v_step;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT p_order, v_step, 'awaiting', 'processed', s.attempt, p_actor, 'signal ' || p_name || ' (id ' || p_signal_id || ')'
        FROM steps s WHERE s.order_id = p_order AND s.step = v_step;
        outcome := 'applied';
        step := v_step;
        SELECT ga.order_status INTO order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM steps s WHERE s.order_id = p_order AND s.spec->'wait'->>'signal' = p_name
                                       AND s.process_state IN ('waiting', 'delayed', 'pending', 'processing')) THEN
        INSERT INTO signals (order_id, signal_id, name, payload, actor) VALUES (p_order, p_signal_id, p_name, p_payload, p_actor);
        outcome := 'kept';
        RETURN;
    END IF;
    outcome := 'wait_ended';
    detail := 'every step of order ' || p_order || ' that waits for ' || p_name || ' has ended';
END;
$function$;

-- overview_sample: the leading supervisor's sample for the console's
-- charts (overview_minutes), if p_holder holds the lease p_lease: for each
-- of the last four minutes and each workflow, of the orders that came in
-- that minute, how many completed and failed, and the p50 and p95 of the
-- completed ones' submit-to-end time (an order that ends later than that
-- is not counted); and the steps pending now, in this minute's row. Rows
-- older than two hours go. It returns the rows written.
CREATE OR REPLACE FUNCTION overview_sample(p_holder text, p_lease text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now timestamptz := date_trunc('minute', now());
    v_ended integer;
    v_pending integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = p_lease AND l.holder = p_holder AND l.expires_at > now()) THEN
        RETURN 0;
    END IF;
    INSERT INTO overview_minutes AS m (minute, workflow, completed, failed, p50_ms, p95_ms)
    SELECT date_trunc('minute', o.created_at), o.workflow,
           count(*) FILTER (WHERE o.status = 'completed'), count(*) FILTER (WHERE o.status = 'failed'),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM o.updated_at - o.created_at) * 1000) FILTER (WHERE o.status = 'completed'),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM o.updated_at - o.created_at) * 1000) FILTER (WHERE o.status = 'completed')
    FROM orders o
    WHERE o.status IN ('completed', 'failed') AND o.created_at >= v_now - interval '3 minutes'
    GROUP BY 1, 2
    ON CONFLICT (minute, workflow) DO UPDATE
        SET completed = excluded.completed, failed = excluded.failed, p50_ms = excluded.p50_ms, p95_ms = excluded.p95_ms;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    -- Pending now: this minute's row of each workflow with any, and 0 for
    -- those that had some earlier in the minute.
    INSERT INTO overview_minutes AS m (minute, workflow, pending)
    SELECT v_now, o.workflow, count(*) FROM steps s JOIN orders o ON o.order_id = s.order_id
    WHERE s.process_state = 'pending' GROUP BY o.workflow
    ON CONFLICT (minute, workflow) DO UPDATE SET pending = excluded.pending;
    GET DIAGNOSTICS v_pending = ROW_COUNT;
    UPDATE overview_minutes m SET pending = 0
    WHERE m.minute = v_now AND m.pending > 0
      AND NOT EXISTS (SELECT 1 FROM steps s JOIN orders o ON o.order_id = s.order_id
                      WHERE s.process_state = 'pending' AND o.workflow = m.workflow);
    DELETE FROM overview_minutes WHERE minute < v_now - interval '2 hours';
    RETURN v_ended + v_pending;
END;
$function$;

-- next_timer: seconds until the earliest waiting timer (a delay, a
-- wait's timeout) falls due on the database clock (negative: overdue,
-- which a held order's timers may be; NULL: none), read from the
-- due-time index alone.
CREATE OR REPLACE FUNCTION next_timer()
 RETURNS double precision
 LANGUAGE sql
 STABLE
AS $function$
    SELECT extract(epoch FROM min(due_at) - clock_timestamp())::float8 FROM steps WHERE process_state IN ('delayed', 'awaiting')
$function$;

-- graph_step_claimed: fences a scheduler's own answer for a step it
-- claimed (skipped, expanded), as a reply is fenced: the attempt must be
-- the step's, still processing and in time. It locks the step row.
CREATE OR REPLACE FUNCTION graph_step_claimed(p_order uuid, p_step integer, p_attempt integer)
 RETURNS boolean
 LANGUAGE sql
AS $function$
    SELECT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND step = p_step AND attempt = p_attempt
                                          AND process_state = 'processing' AND complete_by >= clock_timestamp()
                   FOR UPDATE)
$function$;

-- ======================================================================
-- Sub-processes: a step that runs another workflow as a child order
-- ======================================================================

-- step_child_check: a claimed step of a sub-process may start its child
-- (fenced as a reply is, with the order's row locked until the child is
-- written): 'ok' with the order's depth; 'stale' (the claim is no longer
-- the step's: nothing changes); 'cancelled' (the order no longer runs:
-- the claim is cancelled, claim_cancelled, and no child starts).
CREATE OR REPLACE FUNCTION step_child_check(p_order uuid, p_step integer, p_attempt integer, p_actor text, OUT verdict text, OUT depth integer, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
BEGIN
    next_step := 0;
    order_status := '';
    depth := 0;
    IF NOT graph_step_claimed(p_order, p_step, p_attempt) THEN
        verdict := 'stale';
        RETURN;
    END IF;
    SELECT o.status, o.depth INTO v_status, depth FROM orders o WHERE o.order_id = p_order FOR UPDATE;
    IF v_status NOT IN ('received', 'processing', 'error') THEN
        SELECT c.next_step, c.order_status INTO next_step, order_status FROM claim_cancelled(p_order, p_step, p_attempt, p_actor, v_status) c;
        verdict := 'cancelled';
        RETURN;
    END IF;
    verdict := 'ok';
END;
$function$;

-- step_start_child: the child order p_child of a claimed sub-process step
-- was written in this transaction (after step_child_check said ok): it
-- is linked to its parent and step, one level deeper, and the step awaits
-- its end (child_settle). A child that had ended already (the step was
-- resubmitted and its child, known by the step's key, is the same) ends
-- the step at once.
CREATE OR REPLACE FUNCTION step_start_child(p_order uuid, p_step integer, p_attempt integer, p_child uuid, p_actor text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_child_status text;
    v_workflow text;
BEGIN
    applied := true;
    next_step := 0;
    order_status := '';
    UPDATE orders SET parent_order = p_order, parent_step = p_step,
                      depth = (SELECT p.depth + 1 FROM orders p WHERE p.order_id = p_order)
    WHERE order_id = p_child AND parent_order IS NULL;
    SELECT status, workflow INTO v_child_status, v_workflow FROM orders WHERE order_id = p_child;
    UPDATE steps SET process_state = 'awaiting', due_at = clock_timestamp() + interval '100 years', locked_by = NULL, complete_by = NULL,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'awaiting', p_attempt, p_actor,
            'waiting for its child order ' || p_child || ' (workflow ' || v_workflow || ') to end');
    IF v_child_status IN ('completed', 'failed') THEN
        SELECT cs.next_step, cs.order_status INTO next_step, order_status FROM child_settle(p_child) cs;
    END IF;
    PERFORM pg_notify('sas_pending', current_schema());
END;
$function$;

-- child_ended: the trigger of an order with a parent that completed or
-- failed (orders_child_ended): its parent's step ends with it.
CREATE OR REPLACE FUNCTION child_ended()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM child_settle(NEW.order_id);
    RETURN NULL;
END;
$function$;

-- child_settle: the child order p_child ended, completed or failed. The
-- step of its parent that awaits it ends: completed, processed with the
-- child's results (by step, as its ending event has them) as its result;
-- failed, failed for good (the parent's policy decides). A compensation
-- of its parent that awaits the child's undoing ends once the child has
-- failed. Anything else of the parent (a step cancelled meanwhile) is
-- left as it is. The parent's row is locked first, as graph_advance does.
CREATE OR REPLACE FUNCTION child_settle(p_child uuid, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_parent uuid;
    v_pstep integer;
    v_status text;
    v_actor text := 'child:' || p_child;
    v_attempt integer;
    v_max integer;
    v_comp integer;
    v_results jsonb;
    v_reason text;
BEGIN
    next_step := 0;
    order_status := '';
    SELECT parent_order, parent_step, status INTO v_parent, v_pstep, v_status FROM orders WHERE order_id = p_child;
    IF v_parent IS NULL OR v_status NOT IN ('completed', 'failed') THEN
        RETURN;
    END IF;
    PERFORM 1 FROM orders WHERE order_id = v_parent FOR UPDATE;
    SELECT attempt, max_failures INTO v_attempt, v_max FROM steps
    WHERE order_id = v_parent AND step = v_pstep AND kind = 'action' AND process_state = 'awaiting' FOR UPDATE;
    IF FOUND AND v_status = 'completed' THEN
        SELECT coalesce(jsonb_object_agg(coalesce(spec->>'id', name), result), '{}'::jsonb) INTO v_results
        FROM steps WHERE order_id = p_child AND kind = 'action' AND result IS NOT NULL AND parent IS NULL;
        IF octet_length(v_results::text) > 262144 THEN
            v_results := jsonb_build_object('results_truncated', true);
        END IF;
        UPDATE steps SET process_state = 'processed', result = v_results, due_at = NULL, updated_at = clock_timestamp()
        WHERE order_id = v_parent AND step = v_pstep;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (v_parent, v_pstep, 'awaiting', 'processed', v_attempt, v_actor, 'its child order ' || p_child || ' completed');
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(v_parent, v_actor) ga;
        RETURN;
    ELSIF FOUND THEN
        SELECT 'its child order ' || p_child || ' failed' || coalesce(': ' || s.name || ' (step ' || s.step || ')' || coalesce(': ' || s.last_error, ''), '')
        INTO v_reason FROM (SELECT 1) x
        LEFT JOIN LATERAL (SELECT name, step, last_error FROM steps WHERE order_id = p_child AND process_state = 'error'
                           ORDER BY kind = 'compensation' DESC, step LIMIT 1) s ON true;
        v_reason := left(v_reason, 2000);
        UPDATE steps SET process_state = 'error', failure_count = max_failures, last_error = v_reason, due_at = NULL,
                         updated_at = clock_timestamp()
        WHERE order_id = v_parent AND step = v_pstep;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (v_parent, v_pstep, 'awaiting', 'error', v_attempt, v_actor, v_reason);
        order_status := step_failed(v_parent, v_pstep, v_actor, v_reason, v_max);
        IF order_status NOT IN ('completed', 'failed', 'error') THEN
            order_status := '';
        END IF;
        RETURN;
    END IF;
    SELECT step, attempt INTO v_comp, v_attempt FROM steps
    WHERE order_id = v_parent AND compensates = v_pstep AND kind = 'compensation' AND process_state = 'awaiting' FOR UPDATE;
    IF FOUND AND v_status = 'failed' THEN
        UPDATE steps SET process_state = 'processed', due_at = NULL, updated_at = clock_timestamp()
        WHERE order_id = v_parent AND step = v_comp;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (v_parent, v_comp, 'awaiting', 'processed', v_attempt, v_actor, 'its child order ' || p_child || ' is undone');
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(v_parent, v_actor) ga;
    END IF;
END;
$function$;

-- children_cancel: the children of p_order that still run are undone
-- with it (begin_compensation); a child held with a failed compensation
-- waits for an operator, as its own cancel would.
CREATE OR REPLACE FUNCTION children_cancel(p_order uuid, p_actor text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT o.order_id FROM orders o
             WHERE o.parent_order = p_order AND o.status IN ('received', 'processing', 'error')
               AND NOT EXISTS (SELECT 1 FROM steps c WHERE c.order_id = o.order_id AND c.kind = 'compensation' AND c.process_state = 'error')
             ORDER BY o.order_id
             FOR UPDATE OF o LOOP
        PERFORM begin_compensation(r.order_id, NULL, p_actor, 'its parent order ' || p_order || ' is undone');
    END LOOP;
END;
$function$;

-- step_undo_child: a claimed compensation of a sub-process step undoes
-- the step's child (fenced as a reply is). A child that completed, or
-- still runs, is undone (begin_compensation) and the compensation awaits
-- its end (child_settle); one that failed, or never started, has nothing
-- left to undo: the compensation is processed at once.
CREATE OR REPLACE FUNCTION step_undo_child(p_order uuid, p_step integer, p_attempt integer, p_actor text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_action integer;
    v_child uuid;
    v_child_status text;
    v_reason text;
BEGIN
    applied := graph_step_claimed(p_order, p_step, p_attempt);
    next_step := 0;
    order_status := '';
    IF NOT applied THEN
        RETURN;
    END IF;
    PERFORM 1 FROM orders WHERE order_id = p_order FOR UPDATE;
    SELECT compensates INTO v_action FROM steps WHERE order_id = p_order AND step = p_step;
    SELECT o.order_id, o.status INTO v_child, v_child_status FROM orders o
    WHERE o.parent_order = p_order AND o.parent_step = v_action
    ORDER BY o.created_at DESC LIMIT 1
    FOR UPDATE;
    IF v_child IS NOT NULL AND v_child_status IN ('completed', 'received', 'processing', 'error')
       AND NOT EXISTS (SELECT 1 FROM steps c WHERE c.order_id = v_child AND c.kind = 'compensation' AND c.process_state = 'error') THEN
        v_child_status := begin_compensation(v_child, NULL, p_actor, 'its parent order ' || p_order || ' is undone');
    END IF;
    IF v_child IS NULL OR v_child_status = 'failed' THEN
        v_reason := CASE WHEN v_child IS NULL THEN 'no child order started: nothing to undo'
                         ELSE 'its child order ' || v_child || ' is undone' END;
        UPDATE steps SET process_state = 'processed', locked_by = NULL, complete_by = NULL, updated_at = clock_timestamp()
        WHERE order_id = p_order AND step = p_step;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (p_order, p_step, 'processing', 'processed', p_attempt, p_actor, v_reason);
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    UPDATE steps SET process_state = 'awaiting', due_at = clock_timestamp() + interval '100 years', locked_by = NULL, complete_by = NULL,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'awaiting', p_attempt, p_actor, 'waiting for its child order ' || v_child || ' to be undone');
    PERFORM pg_notify('sas_pending', current_schema());
END;
$function$;

-- step_skip: a claimed step's when was false: it is skipped (it does
-- nothing, is not undone, and counts as ended for the steps that need
-- it), and the order goes on (graph_advance).
CREATE OR REPLACE FUNCTION step_skip(p_order uuid, p_step integer, p_attempt integer, p_actor text, p_reason text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    applied := graph_step_claimed(p_order, p_step, p_attempt);
    next_step := 0;
    order_status := '';
    IF NOT applied THEN
        RETURN;
    END IF;
    UPDATE steps SET process_state = 'skipped', locked_by = NULL, complete_by = NULL, unsent_attempts = unsent_attempts + 1,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'skipped', p_attempt, p_actor, p_reason);
    SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
END;
$function$;

-- step_fail_unsent: a claimed step failed for good before any request
-- for it left (its when, for_each list or input failed; its child's
-- payload was refused): fenced as a reply is, it fails as a failed reply
-- does (apply_reply), and its attempt is counted as unsent, so that its
-- compensation never runs for an action that never ran.
CREATE OR REPLACE FUNCTION step_fail_unsent(p_order uuid, p_step integer, p_attempt integer, p_actor text, p_reason text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    next_step := 0;
    order_status := '';
    UPDATE steps SET unsent_attempts = unsent_attempts + 1
    WHERE order_id = p_order AND step = p_step AND attempt = p_attempt
      AND process_state = 'processing' AND complete_by >= clock_timestamp();
    IF NOT FOUND THEN
        applied := false;
        RETURN;
    END IF;
    SELECT ar.applied, ar.next_step, ar.order_status INTO applied, next_step, order_status
    FROM apply_reply(p_order, p_step, p_attempt, false, NULL, p_reason, p_actor, NULL, NULL, 0, true, NULL) ar;
END;
$function$;

-- claim_cancelled: a claimed step of an order that no longer runs (its
-- status p_status) is cancelled rather than begun (its attempt sent
-- nothing), and the order goes on (graph_advance: its undoing may end).
CREATE OR REPLACE FUNCTION claim_cancelled(p_order uuid, p_step integer, p_attempt integer, p_actor text, p_status text, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    UPDATE steps SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, unsent_attempts = unsent_attempts + 1,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'cancelled', p_attempt, p_actor, 'the order is ' || p_status);
    SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
END;
$function$;

-- step_expand: a claimed for_each step's list was read: one instance of
-- the step per item, numbered after the order's last step, each with its
-- idempotency key (the step's, then /index), its item and index, waiting;
-- graph_advance starts up to max_parallel. With a compensation, each
-- instance gets its own, in the place of the step's: the compensations
-- that needed the step's need all of theirs. The step is expanded until
-- its instances end. An order no longer running cancels the step instead.
CREATE OR REPLACE FUNCTION step_expand(p_order uuid, p_step integer, p_attempt integer, p_items jsonb, p_actor text, OUT applied boolean, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_last integer;
    v_n integer := jsonb_array_length(p_items);
    v_comp steps%ROWTYPE;
    v_comps integer[];
BEGIN
    applied := graph_step_claimed(p_order, p_step, p_attempt);
    next_step := 0;
    order_status := '';
    IF NOT applied THEN
        RETURN;
    END IF;
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF v_status NOT IN ('received', 'processing') THEN
        SELECT c.next_step, c.order_status INTO next_step, order_status FROM claim_cancelled(p_order, p_step, p_attempt, p_actor, v_status) c;
        RETURN;
    END IF;
    SELECT max(step) INTO v_last FROM steps WHERE order_id = p_order;
    INSERT INTO steps (order_id, step, name, kind, agent, process_state, priority, timeout, max_failures, idempotency_key,
                       backoff_base, backoff_max, needs, ancestors, spec, parent, item_index, item)
    SELECT p.order_id, v_last + 1 + it.i, p.name, 'action', p.agent, 'waiting', p.priority, p.timeout, p.max_failures,
           p.idempotency_key || '/' || it.i, p.backoff_base, p.backoff_max, '{}', p.ancestors,
           p.spec - 'for_each' - 'when' - 'delay_ms', p.step, it.i, it.item
    FROM steps p, jsonb_array_elements(p_items) WITH ORDINALITY AS it0(item, n), LATERAL (SELECT (it0.n - 1)::int AS i, it0.item) it
    WHERE p.order_id = p_order AND p.step = p_step;
    SELECT * INTO v_comp FROM steps WHERE order_id = p_order AND compensates = p_step;
    IF FOUND THEN
        INSERT INTO steps (order_id, step, name, kind, compensates, agent, process_state, priority, timeout, max_failures,
                           idempotency_key, backoff_base, backoff_max, needs, ancestors, parent, item_index, item)
        SELECT v_comp.order_id, v_last + 1 + v_n + i.item_index, v_comp.name, 'compensation', i.step, v_comp.agent, 'waiting',
               v_comp.priority, v_comp.timeout, v_comp.max_failures, v_comp.idempotency_key || '/' || i.item_index,
               v_comp.backoff_base, v_comp.backoff_max, v_comp.needs, v_comp.ancestors, v_comp.step, i.item_index, i.item
        FROM steps i WHERE i.order_id = p_order AND i.parent = p_step AND i.kind = 'action';
        SELECT coalesce(array_agg(step ORDER BY step), '{}') INTO v_comps FROM steps
        WHERE order_id = p_order AND parent = v_comp.step AND kind = 'compensation';
        UPDATE steps SET needs = array_remove(needs, v_comp.step) || v_comps
        WHERE order_id = p_order AND kind = 'compensation' AND v_comp.step = ANY(needs);
        UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp()
        WHERE order_id = p_order AND step = v_comp.step;
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        VALUES (p_order, v_comp.step, 'waiting', 'cancelled', v_comp.attempt, p_actor,
                'each of the ' || v_n || ' instances of step ' || p_step || ' has its own compensation');
    END IF;
    UPDATE steps SET process_state = 'expanded', locked_by = NULL, complete_by = NULL, unsent_attempts = unsent_attempts + 1,
                     updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', 'expanded', p_attempt, p_actor, v_n || ' instances');
    SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
END;
$function$;

-- step_halted: an action of a graph the supervisor reset (its attempt
-- expired) while its order no longer runs: it is not tried again but
-- cancelled, so that its compensation may run (graph_advance).
CREATE OR REPLACE FUNCTION step_halted(p_order uuid, p_step integer, p_actor text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
BEGIN
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF v_status IN ('received', 'processing') THEN
        RETURN v_status;
    END IF;
    WITH upd AS (
        UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp()
        WHERE order_id = p_order AND step = p_step AND kind = 'action' AND needs IS NOT NULL AND process_state = 'pending'
        RETURNING attempt
    )
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT p_order, p_step, 'pending', 'cancelled', attempt, p_actor, 'the order is ' || v_status FROM upd;
    RETURN coalesce(nullif((SELECT ga.order_status FROM graph_advance(p_order, p_actor) ga), ''), v_status);
END;
$function$;

-- order_transition: moves an order to a new status, with its history row
-- and its status event in the outbox.
CREATE OR REPLACE FUNCTION order_transition(p_order uuid, p_to text, p_step integer, p_actor text, p_reason text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_from text;
    v_reply_to text;
BEGIN
    SELECT status, reply_to INTO v_from, v_reply_to FROM orders WHERE order_id = p_order;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % does not exist', p_order USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE orders SET status = p_to, updated_at = now() WHERE order_id = p_order;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, NULL, v_from, p_to, p_actor, p_reason);
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    VALUES ('status_event', p_order, v_reply_to, status_event_body(p_order, p_to, p_step));
END;
$function$;

-- ======================================================================
-- Events and alerts
-- ======================================================================

-- status_event_body: the body of a status event, as the outbox publishes
-- it; an ended order's event comes from the five-argument form below.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer)
 RETURNS jsonb
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN p_status IN ('completed', 'failed', 'error')
        THEN status_event_body(p_order_id, p_status, p_step, NULL, NULL)
        ELSE jsonb_build_object(
            'schema_version', 1,
            'order_id', p_order_id,
            'status', p_status,
            'step', p_step,
            'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    END
$function$;

-- status_event_body: the body of a status event with what an ended order
-- says: its results, the step that failed, the reason, what was undone.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer, p_more_results jsonb, p_undone_step integer)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_body      jsonb;
    v_results   jsonb;
    v_undone    jsonb;
    v_step      integer;
    v_name      text;
    v_error     text;
    v_answer    text;
    v_cancelled text;
    v_reason    text;
    v_detail    text;
BEGIN
    v_body := jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'status', p_status,
        'step', p_step,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
    IF p_status NOT IN ('completed', 'failed', 'error') THEN
        RETURN v_body;
    END IF;
    SELECT coalesce(jsonb_object_agg(coalesce(spec->>'id', name), result), '{}'::jsonb) INTO v_results
    FROM steps WHERE order_id = p_order_id AND kind = 'action' AND result IS NOT NULL AND parent IS NULL;
    v_results := v_results || coalesce(p_more_results, '{}'::jsonb);
    IF v_results <> '{}'::jsonb THEN
        IF octet_length(v_results::text) <= 32768 THEN
            v_body := v_body || jsonb_build_object('results', v_results);
        ELSE
            v_body := v_body || jsonb_build_object('results_truncated', true);
        END IF;
    END IF;
    -- In a graph, the steps whose when was false.
    SELECT jsonb_agg(coalesce(spec->>'id', name) ORDER BY step) INTO v_undone
    FROM steps WHERE order_id = p_order_id AND kind = 'action' AND process_state = 'skipped';
    IF v_undone IS NOT NULL THEN
        v_body := v_body || jsonb_build_object('skipped', v_undone);
    END IF;
    IF p_status = 'completed' THEN
        RETURN v_body;
    END IF;

    -- The step that failed: a compensation before an action (it is why
    -- an order is held partly undone). Its last error says how: the
    -- supervisor writes "complete_by passed …", a failed reply the
    -- agent's reason.
    SELECT s.step, s.name, s.last_error, s.last_answer
    INTO v_step, v_name, v_error, v_answer
    FROM steps s
    WHERE s.order_id = p_order_id AND s.process_state = 'error'
    ORDER BY s.kind = 'compensation' DESC, s.step
    LIMIT 1;
    -- An operator's cancel, when it is what began the undoing.
    SELECT coalesce(t.claimed_by, t.actor) INTO v_cancelled FROM transitions t
    WHERE t.order_id = p_order_id AND t.step IS NULL AND t.to_state IN ('compensating', 'failed') AND t.reason LIKE 'operator cancel%'
    ORDER BY t.id DESC LIMIT 1;

    IF v_step IS NOT NULL AND NOT (p_status = 'failed' AND v_cancelled IS NOT NULL) THEN
        v_reason := CASE WHEN v_error LIKE 'complete_by passed%' THEN 'timed_out' ELSE 'refused' END;
        v_detail := v_name || ' (step ' || v_step || ')' || coalesce(': ' || v_error, '')
                    || coalesce('; the service''s last answer: ' || v_answer, '');
        v_body := v_body || jsonb_build_object('failed_step', v_name, 'step', coalesce(p_step, v_step));
    ELSIF v_cancelled IS NOT NULL THEN
        v_reason := 'cancelled';
        v_detail := 'cancelled by ' || v_cancelled;
        IF v_step IS NOT NULL THEN
            v_detail := v_detail || ' after ' || v_name || ' (step ' || v_step || ') failed' || coalesce(': ' || v_error, '');
        END IF;
    END IF;
    IF v_reason IS NOT NULL THEN
        -- At most 500 characters: 2,000 bytes, the event's bound.
        v_body := v_body || jsonb_build_object('reason', v_reason, 'detail',
            CASE WHEN length(v_detail) > 500 THEN left(v_detail, 499) || '…' ELSE v_detail END);
    END IF;

    -- Each action once (the instances of a for_each step are one), in
    -- the order of the steps.
    SELECT jsonb_agg(u.name ORDER BY u.first) INTO v_undone FROM (
        SELECT coalesce(a.spec->>'id', a.name) AS name, min(a.step) AS first
        FROM steps c JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order_id AND c.kind = 'compensation'
          AND (c.process_state = 'processed' OR c.step = p_undone_step)
        GROUP BY 1) u;
    IF v_undone IS NOT NULL THEN
        v_body := v_body || jsonb_build_object('undone', v_undone);
    END IF;
    RETURN v_body;
END;
$function$;

-- operator_alert_body: the body of an operator alert.
CREATE OR REPLACE FUNCTION operator_alert_body(p_order_id uuid, p_step integer, p_reason text, p_failure_count integer)
 RETURNS jsonb
 LANGUAGE sql
AS $function$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'step', p_step,
        'reason', p_reason,
        'failure_count', p_failure_count,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$function$;

-- raise_alert: records an operator alert and queues it for publishing.
CREATE OR REPLACE FUNCTION raise_alert(p_order uuid, p_step integer, p_reason text, p_failure_count integer, p_actor text)
 RETURNS void
 LANGUAGE sql
AS $function$
    WITH msg AS (
        INSERT INTO outbox (message_type, order_id, body)
        VALUES ('operator_alert', p_order, operator_alert_body(p_order, p_step, p_reason, p_failure_count))
        RETURNING message_id, body
    )
    INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_at, raised_by)
    SELECT message_id, p_order, p_step, p_reason, p_failure_count, (body->>'at')::timestamptz, p_actor FROM msg;
$function$;

-- ======================================================================
-- Notifications and guards
-- ======================================================================

-- notify_pending: wakes the schedulers when a step becomes pending.
CREATE OR REPLACE FUNCTION notify_pending()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE process_state = 'pending') THEN
        PERFORM pg_notify('sas_pending', current_schema());
    END IF;
    RETURN NULL;
END;
$function$;

-- notify_outbox: wakes the relay when a message is queued.
CREATE OR REPLACE FUNCTION notify_outbox()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('sas_outbox', current_schema());
    RETURN NULL;
END;
$function$;

-- transitions_append_only: the history is appended to, never changed.
CREATE OR REPLACE FUNCTION transitions_append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'transitions is append-only';
END;
$function$;

-- orders_delete_history: deleting orders deletes their steps and history
-- (retention).
CREATE OR REPLACE FUNCTION orders_delete_history()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM steps s USING gone g WHERE s.order_id = g.order_id;
    DELETE FROM transitions t USING gone g WHERE t.order_id = g.order_id;
    DELETE FROM signals n USING gone g WHERE n.order_id = g.order_id;
    DELETE FROM order_attributes a USING gone g WHERE a.order_id = g.order_id;
    DELETE FROM order_payloads p USING gone g WHERE p.order_id = g.order_id;
    RETURN NULL;
END;
$function$;

-- orders_truncate_rows: truncating orders truncates steps and history.
CREATE OR REPLACE FUNCTION orders_truncate_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    TRUNCATE steps, transitions, signals, order_attributes, order_payloads;
    RETURN NULL;
END;
$function$;

-- ======================================================================
-- Operators (SECURITY DEFINER: the only way an operator changes state)
-- ======================================================================

-- operator_begin: marks the transaction as an operator's action (the
-- history rows it writes record the database user) and returns the
-- actor's name.
CREATE OR REPLACE FUNCTION operator_begin(p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM set_config('sas.operator_action', 'on', true);
    PERFORM set_config('sas.claimed_by', coalesce(left(p_claimed, 100), ''), true);
    RETURN 'operator:' || session_user;
END;
$function$;

-- operator_resubmit: puts an order held in error back to work. With no
-- step, or a step in error: its failed step(s) go back to pending, with
-- their idempotency keys, as a retry of a refused call keeps its key.
-- With an action that ended (processed or skipped): that action is run
-- again and so is every action that depends on it (in a graph the steps
-- that need it, directly or not; in a list the steps after it), each
-- that had been processed with a new idempotency key (a re-run must not
-- be answered from the service's memory of the first run), the instances
-- of a for_each step among them dropped (their history stays) so that
-- the list is read again. An action re-run is not undone first: its
-- compensation, if the order is later undone, runs once.
CREATE OR REPLACE FUNCTION operator_resubmit(p_order uuid, p_step integer, p_claimed text)
 RETURNS SETOF integer
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_status text;
    v_state text;
    v_kind text;
    v_parent integer;
    v_graph boolean;
    v_last integer;
    v_steps integer[];
    v_rerun integer[];
    v_gone integer[];
    v_busy text;
    v_compensation boolean;
    v_undoing boolean;
    v_may text;
BEGIN
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF p_step IS NOT NULL AND p_step <> 0 THEN
        SELECT process_state, kind, parent INTO v_state, v_kind, v_parent
        FROM steps WHERE order_id = p_order AND step = p_step;
        IF NOT FOUND THEN
            SELECT max(step) INTO v_last FROM steps WHERE order_id = p_order;
            RAISE EXCEPTION 'order % has no step % (its steps are 1 to %)', p_order, p_step, v_last USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF v_status <> 'error' THEN
        RAISE EXCEPTION 'order % is %, only an order in error can be resubmitted', p_order, v_status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_state IS NOT NULL AND NOT (v_state = 'error'
                                    OR (v_state IN ('processed', 'skipped') AND v_kind = 'action' AND v_parent IS NULL)) THEN
        RAISE EXCEPTION 'order % step % is %: a step in error can be resubmitted, or an action that ended (processed or skipped, not one instance of a for_each step: choose the step) to run it again and what depends on it',
            p_order, p_step, v_state USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_undoing := EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error');
    IF v_undoing AND v_kind = 'action' THEN
        SELECT string_agg(step::text, ', ' ORDER BY step) INTO v_may FROM steps
        WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error';
        RAISE EXCEPTION 'order % is partly undone (a compensation failed): resubmit its failed compensation (step %), not action step %',
            p_order, v_may, p_step USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_graph := EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND needs IS NOT NULL);
    IF v_state IN ('processed', 'skipped') THEN
        SELECT array_agg(step ORDER BY step) INTO v_rerun FROM steps
        WHERE order_id = p_order AND kind = 'action' AND parent IS NULL
          AND (step = p_step OR (v_graph AND p_step = ANY(ancestors)) OR (NOT v_graph AND step > p_step));
        SELECT string_agg(format('step %s is %s', step, process_state), ', ' ORDER BY step) INTO v_busy FROM steps
        WHERE order_id = p_order AND kind = 'action' AND (step = ANY(v_rerun) OR parent = ANY(v_rerun))
          AND process_state IN ('pending', 'processing');
        IF v_busy IS NOT NULL THEN
            RAISE EXCEPTION 'order % cannot run step % again while what depends on it still runs (%): resubmit once it ended',
                p_order, p_step, v_busy USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        -- The instances of a for_each step to run again go, with their own
        -- compensations; the step's compensation takes their place again.
        WITH inst AS (
            DELETE FROM steps WHERE order_id = p_order AND kind = 'action' AND parent = ANY(v_rerun) RETURNING step
        )
        SELECT array_agg(step) INTO v_gone FROM inst;
        IF v_gone IS NOT NULL THEN
            WITH comp AS (
                DELETE FROM steps WHERE order_id = p_order AND kind = 'compensation' AND compensates = ANY(v_gone)
                RETURNING step, parent
            )
            SELECT array_agg(step), array_agg(DISTINCT parent) INTO v_gone, v_steps FROM comp;
            IF v_gone IS NOT NULL THEN
                UPDATE steps SET needs = ARRAY(SELECT n FROM unnest(needs) n WHERE n <> ALL(v_gone)) || v_steps
                WHERE order_id = p_order AND kind = 'compensation' AND needs && v_gone;
                WITH back AS (
                    UPDATE steps SET process_state = 'waiting', updated_at = clock_timestamp()
                    WHERE order_id = p_order AND step = ANY(v_steps) AND process_state = 'cancelled'
                    RETURNING step, attempt
                )
                INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
                SELECT p_order, step, 'cancelled', 'waiting', attempt, v_actor,
                       'operator resubmit of step ' || p_step || ': its for_each step runs again' FROM back;
            END IF;
        END IF;
        WITH reset AS (
            UPDATE steps s
            SET process_state = CASE WHEN s.step = p_step THEN 'pending' ELSE 'waiting' END,
                failure_count = 0, result = NULL, locked_by = NULL, complete_by = NULL, due_at = NULL,
                idempotency_key = CASE WHEN s.process_state IN ('processed', 'expanded')
                                       THEN regexp_replace(s.idempotency_key, '/rerun-[0-9]+$', '') || '/rerun-' || s.attempt
                                       ELSE s.idempotency_key END,
                available_at = now(), updated_at = clock_timestamp()
            FROM steps old
            WHERE s.order_id = p_order AND s.step = ANY(v_rerun) AND old.order_id = s.order_id AND old.step = s.step
            RETURNING s.step, s.attempt, old.process_state AS was, s.process_state AS now
        ), hist AS (
            INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
            SELECT p_order, step, was, now, attempt, v_actor,
                   CASE WHEN step = p_step THEN 'operator resubmit: run again'
                        ELSE 'operator resubmit of step ' || p_step || ': it depends on it' END FROM reset
        )
        SELECT array_agg(step ORDER BY step) INTO v_steps FROM reset;
    END IF;
    -- Every failed step goes back to pending: the one chosen, or with none
    -- chosen all of them; in a graph all of them whatever was chosen, as
    -- each branch that failed holds the order (a branch left in error
    -- would keep it from ever ending).
    IF v_state IS DISTINCT FROM 'processed' AND v_state IS DISTINCT FROM 'skipped' OR v_graph THEN
        WITH reset AS (
            UPDATE steps
            SET process_state = 'pending', failure_count = 0, locked_by = NULL, complete_by = NULL,
                available_at = now(), updated_at = clock_timestamp()
            WHERE order_id = p_order AND process_state = 'error' AND (coalesce(p_step, 0) = 0 OR step = p_step OR v_graph)
              AND (NOT v_undoing OR kind = 'compensation')
            RETURNING step, attempt, kind
        ), hist AS (
            INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
            SELECT p_order, step, 'error', 'pending', attempt, v_actor, 'operator resubmit' FROM reset
        )
        SELECT coalesce(v_steps, '{}') || array_agg(step ORDER BY step), coalesce(bool_or(kind = 'compensation'), false)
        INTO v_steps, v_compensation FROM reset;
        IF v_steps IS NULL OR cardinality(v_steps) = 0 THEN
            RAISE EXCEPTION 'order % has no step in error', p_order USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
    END IF;
    PERFORM order_transition(p_order, CASE WHEN v_compensation THEN 'compensating' ELSE 'processing' END,
                             NULL, v_actor, 'operator resubmit');
    -- In a graph, steps whose needs ended while the order was held start now.
    IF v_graph THEN
        PERFORM graph_advance(p_order, v_actor);
    END IF;
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema());
    RETURN QUERY SELECT n FROM unnest(v_steps) n ORDER BY n;
END;
$function$;

-- operator_cancel: cancels an order that has not ended: what was done is
-- undone (begin_compensation).
CREATE OR REPLACE FUNCTION operator_cancel(p_order uuid, p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_status text;
BEGIN
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF v_status = 'error' AND EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error') THEN
        RAISE EXCEPTION 'order %: a compensation failed; fix the cause and resubmit it', p_order
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_status NOT IN ('received', 'processing', 'error') THEN
        RAISE EXCEPTION 'order % is % already; only an order that has not ended can be cancelled', p_order, v_status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_status := begin_compensation(p_order, NULL, v_actor, 'operator cancel');
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema());
    RETURN v_status;
END;
$function$;

-- ack_alert: acknowledges an alert, once.
CREATE OR REPLACE FUNCTION ack_alert(p_id bigint, p_claimed text, OUT acked_at timestamp with time zone, OUT acked_by text, OUT acked_as text, OUT already boolean)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
BEGIN
    already := false;
    UPDATE alerts a SET acked_at = clock_timestamp(), acked_by = session_user, acked_as = nullif(left(p_claimed, 100), '')
    WHERE a.id = p_id AND a.acked_at IS NULL
    RETURNING a.acked_at, a.acked_by, a.acked_as INTO acked_at, acked_by, acked_as;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT a.acked_at, a.acked_by, a.acked_as INTO acked_at, acked_by, acked_as FROM alerts a WHERE a.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'alert % not found', p_id USING ERRCODE = 'no_data_found';
    END IF;
    already := true;
END;
$function$;

-- record_operator_action: records an operator's action in operator_actions
-- (the console's and sasctl's audit). An operator who claims no name (no
-- --as and no $USER) is recorded by the database login alone.
CREATE OR REPLACE FUNCTION record_operator_action(p_action text, p_target text, p_detail text, p_claimed text)
 RETURNS bigint
 LANGUAGE sql
 SECURITY DEFINER
AS $function$
    INSERT INTO operator_actions (db_user, claimed_by, action, target, detail)
    VALUES (session_user, coalesce(NULLIF(left(p_claimed, 100), ''), session_user), p_action, left(p_target, 512), left(coalesce(p_detail, ''), 2048))
    RETURNING id;
$function$;

-- purge_ended_orders: deletes ended orders older than a limit, a batch at
-- a time (retention).
CREATE OR REPLACE FUNCTION purge_ended_orders(p_older_than interval, p_statuses text[], p_limit integer, OUT orders_deleted bigint, OUT steps_deleted bigint, OUT transitions_deleted bigint, OUT alerts_deleted bigint)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_ids uuid[];
BEGIN
    IF p_older_than < interval '0' THEN
        RAISE EXCEPTION 'the age % is negative', p_older_than USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_statuses IS NULL OR cardinality(p_statuses) = 0 OR NOT p_statuses <@ ARRAY['completed', 'failed'] THEN
        RAISE EXCEPTION 'only completed and failed orders are purged, not %', p_statuses USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(order_id) INTO v_ids FROM (
        SELECT order_id FROM orders
        WHERE created_at < now() - p_older_than AND updated_at < now() - p_older_than AND status = ANY(p_statuses)
        ORDER BY created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ) o;
    orders_deleted := 0;
    steps_deleted := 0;
    transitions_deleted := 0;
    alerts_deleted := 0;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    DELETE FROM steps WHERE order_id = ANY(v_ids);
    GET DIAGNOSTICS steps_deleted = ROW_COUNT;
    DELETE FROM transitions WHERE order_id = ANY(v_ids);
    GET DIAGNOSTICS transitions_deleted = ROW_COUNT;
    DELETE FROM alerts WHERE order_id = ANY(v_ids);
    GET DIAGNOSTICS alerts_deleted = ROW_COUNT;
    DELETE FROM orders WHERE order_id = ANY(v_ids);
    GET DIAGNOSTICS orders_deleted = ROW_COUNT;
END;
$function$;

-- Every SECURITY DEFINER function runs with its search_path pinned to the
-- schema it lives in (and pg_temp last), so that a caller's search_path
-- cannot put its own tables or functions in front of the state store's.
-- CREATE OR REPLACE resets the setting, so it is set again here.
DO $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN SELECT p.oid::regprocedure FROM pg_proc p
                WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', v_fn, current_schema());
    END LOOP;
END
$$;

-- ======================================================================
-- Limits per agent kind and fairness between keys
-- ======================================================================

-- limited_pick: picks, for a claim of up to p_room steps of agent kind
-- p_agent, the steps its limits allow now, and locks them (FOR UPDATE
-- SKIP LOCKED) for the claim statement that follows in the same
-- transaction. The kind's agent_limits row is locked first, so claims of
-- one kind by every scheduler take turns: each sees the steps the last
-- one claimed. The room is cut to the token bucket's whole tokens (rate,
-- burst; a service's 429 may have lowered the rate for a while) and to
-- max_in_flight less the steps processing. Keyed steps are served round
-- robin by key (each key at most its max_per_key processing), the round
-- starting after the last key served; unkeyed steps take a place in
-- every round. Within a key, priority then age decide. A claim reads at
-- most as many keys as it has room for, and of each its share of the
-- room, so its cost follows its room, not the backlog or the keys. held says which
-- limit cut the room ('rate', 'in_flight', or '' when none did), and for
-- 'rate' retry_ms how soon the bucket holds a whole token again.
-- Its plans are made for each call's values (how much room, which
-- cursor), and never compiled: with a backlog of thousands the planner's
-- estimates pass jit_above_cost, and compiling them took a second of CPU
-- for a claim that runs in a millisecond.
CREATE OR REPLACE FUNCTION limited_pick(p_agent text, p_room integer, OUT order_ids uuid[], OUT steps integer[], OUT waited double precision[], OUT held text, OUT retry_ms integer)
 RETURNS record
 LANGUAGE plpgsql
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
DECLARE
    l agent_limits;
    v_now timestamptz;
    v_rate double precision;
    v_max integer;
    v_burst double precision;
    v_tokens double precision;
    v_allowed integer := p_room;
    v_in_flight integer;
    v_counted timestamptz;
    v_cursor text;
BEGIN
    held := '';
    retry_ms := 0;
    SELECT * INTO l FROM agent_limits a WHERE a.agent = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_limits (agent) VALUES (p_agent) ON CONFLICT DO NOTHING;
        SELECT * INTO l FROM agent_limits a WHERE a.agent = p_agent FOR UPDATE;
    END IF;
    -- Read once the row is ours: a claim that waited for it must not
    -- count the time the one before already refilled.
    v_now := clock_timestamp();
    IF l.set_by IS NULL THEN
        v_rate := l.file_rate;
        v_max := l.file_max_in_flight;
        v_burst := l.file_burst;
    ELSE
        v_rate := l.set_rate;
        v_max := l.set_max_in_flight;
        v_burst := l.set_burst;
    END IF;
    IF v_rate IS NOT NULL AND l.lowered_until > v_now THEN
        v_rate := least(v_rate, l.lowered_rate);
    END IF;
    IF v_rate IS NOT NULL THEN
        v_burst := coalesce(v_burst, greatest(1, ceil(v_rate / 10)));
        v_tokens := least(v_burst, l.tokens + v_rate * greatest(extract(epoch FROM v_now - l.refilled_at), 0));
        IF floor(v_tokens) < v_allowed THEN
            v_allowed := greatest(floor(v_tokens)::integer, 0);
            held := 'rate';
        END IF;
    END IF;
    IF v_max IS NOT NULL AND v_allowed > 0 THEN
        -- Counting the kind's processing steps reads each of them: it is
        -- done when the bound (the last count plus the claims since)
        -- leaves less room than this claim's, or is a second old (a step
        -- that ended makes it high, never low).
        IF l.in_flight_bound IS NULL OR l.counted_at < v_now - interval '1 second' OR l.in_flight_bound + v_allowed > v_max THEN
            v_in_flight := (SELECT count(*) FROM steps s WHERE s.process_state = 'processing' AND s.agent = p_agent);
            v_counted := v_now;
        ELSE
            v_in_flight := l.in_flight_bound;
            v_counted := l.counted_at;
        END IF;
        IF v_max - v_in_flight < v_allowed THEN
            v_allowed := greatest(v_max - v_in_flight, 0);
            held := 'in_flight';
        END IF;
    END IF;
    IF v_allowed > 0 THEN
        -- The keys with pending steps, each found by one probe of the
        -- keyed index: those after the last one served, then from the
        -- first, at most v_allowed in all (each gets a turn before any
        -- gets two), with their max_per_key.
        WITH RECURSIVE keys(k, m, d) AS (
            (SELECT s.fair_key, s.fair_max, 1 FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
               AND (l.fair_cursor IS NULL OR s.fair_key > l.fair_cursor)
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, keys.d + 1 FROM keys
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key > keys.k
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE keys.d < v_allowed
        ), wrapped(k, m, d) AS (
            (SELECT s.fair_key, s.fair_max, (SELECT count(*) FROM keys)::integer + 1 FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key <= l.fair_cursor
               AND (SELECT count(*) FROM keys) < v_allowed
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, wrapped.d + 1 FROM wrapped
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
                                  AND s.fair_key > wrapped.k AND s.fair_key <= l.fair_cursor
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE wrapped.d < v_allowed
        ), ring AS (
            SELECT k, m, d AS pos, ceil(v_allowed::numeric / count(*) OVER ())::integer AS share
            FROM (SELECT * FROM keys UNION ALL SELECT * FROM wrapped) x
        ), room AS (
            SELECT ring.k, ring.pos, greatest(0, least(ring.share, coalesce(
                       ring.m - (SELECT count(*) FROM steps s WHERE s.agent = p_agent AND s.process_state = 'processing'
                                                                 AND s.fair_key IS NOT NULL AND s.fair_key = ring.k)::integer,
                       v_allowed))) AS n
            FROM ring
        ), keyed AS (
            SELECT c.order_id, c.step, c.available_at, room.k, room.pos,
                   row_number() OVER (PARTITION BY room.k ORDER BY c.priority DESC, c.available_at, c.order_id, c.step) AS r
            FROM room
            CROSS JOIN LATERAL (
                SELECT s.order_id, s.step, s.available_at, s.priority FROM steps s
                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key = room.k
                  AND s.available_at <= now()
                  AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                LIMIT room.n
                FOR UPDATE SKIP LOCKED) c
        ), plain AS (
            SELECT u.order_id, u.step, u.available_at, NULL::text AS k, 0::bigint AS pos,
                   row_number() OVER (ORDER BY u.priority DESC, u.available_at, u.order_id, u.step) AS r
            FROM (SELECT s.order_id, s.step, s.available_at, s.priority FROM steps s
                  WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NULL AND s.available_at <= now()
                    AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                  ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                  LIMIT CASE WHEN EXISTS (SELECT 1 FROM ring) THEN (SELECT max(share) FROM ring) ELSE v_allowed END
                  FOR UPDATE SKIP LOCKED) u
        ), chosen AS (
            SELECT * FROM (SELECT * FROM keyed UNION ALL SELECT * FROM plain) x ORDER BY x.r, x.pos LIMIT v_allowed
        )
        SELECT array_agg(c.order_id ORDER BY c.r, c.pos), array_agg(c.step ORDER BY c.r, c.pos),
               array_agg(greatest(extract(epoch FROM v_now - c.available_at), 0)::float8 ORDER BY c.r, c.pos),
               (array_agg(c.k ORDER BY c.r DESC, c.pos DESC) FILTER (WHERE c.k IS NOT NULL))[1]
        INTO order_ids, steps, waited, v_cursor
        FROM chosen c;
    END IF;
    IF held = 'rate' THEN
        retry_ms := ceil((1 - (v_tokens - coalesce(cardinality(order_ids), 0))) / v_rate * 1000)::integer;
    END IF;
    IF v_rate IS NOT NULL OR v_cursor IS NOT NULL OR v_in_flight IS NOT NULL THEN
        UPDATE agent_limits a SET
            tokens = CASE WHEN v_rate IS NULL THEN a.tokens ELSE v_tokens - coalesce(cardinality(order_ids), 0) END,
            refilled_at = CASE WHEN v_rate IS NULL THEN a.refilled_at ELSE v_now END,
            fair_cursor = coalesce(v_cursor, a.fair_cursor),
            in_flight_bound = CASE WHEN v_in_flight IS NULL THEN a.in_flight_bound ELSE v_in_flight + coalesce(cardinality(order_ids), 0) END,
            counted_at = coalesce(v_counted, a.counted_at)
        WHERE a.agent = p_agent;
    END IF;
END;
$function$;

-- limit_lower: a service answered a step of kind p_agent 429 with a
-- Retry-After of p_retry_ms: the kind's rate, when it has one, is halved
-- (from what it is now, lowered or not; never below its min_rate, by
-- default a tenth of its rate, and never above its rate) until the
-- Retry-After, at least 10 s and at most an hour (contract.MaxRetryAfter:
-- a service asking for a year is read as asking an hour), has passed.
-- Many calls get their 429 at once: the rate is halved at most once a
-- second. An operator's limits set or reset ends the lowering. It returns
-- the lowered rate, or NULL when nothing changed.
CREATE OR REPLACE FUNCTION limit_lower(p_agent text, p_retry_ms bigint)
 RETURNS double precision
 LANGUAGE sql
AS $function$
    UPDATE agent_limits a SET
        lowered_rate = least(CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END, greatest(
            coalesce(CASE WHEN a.set_by IS NULL THEN a.file_min_rate ELSE a.set_min_rate END,
                     CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END / 10),
            CASE WHEN a.lowered_until > clock_timestamp()
                 THEN least(a.lowered_rate, CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END)
                 ELSE CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END END / 2)),
        lowered_until = least(greatest(coalesce(a.lowered_until, clock_timestamp()),
                                       clock_timestamp() + make_interval(secs => least(greatest(p_retry_ms, 10000), 3600000) / 1000.0)),
                              clock_timestamp() + interval '1 hour'),
        lowered_at = clock_timestamp(),
        lowered_count = a.lowered_count + 1,
        updated_at = clock_timestamp()
    WHERE a.agent = p_agent AND CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END IS NOT NULL
      AND (a.lowered_at IS NULL OR a.lowered_at < clock_timestamp() - interval '1 second')
    RETURNING a.lowered_rate
$function$;
