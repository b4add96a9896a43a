-- Steps: what comes next when one ends (graph_advance; a list is the graph whose steps each need the one before, with order_next as the batched reply's fast path), and the steps sas answers for at a claim.

-- order_next: what comes next for an order of a list when one of its
-- steps ends, as graph_advance would decide it for the list's chain (each
-- step needs the one before of its kind): the batched reply statement's
-- fast path (statestore/reply.go), and step_failed's word on a failure
-- for lists and graphs alike. Its answers:
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

-- step_processed: a step was processed, in a list or a graph: what
-- graph_advance does.
CREATE OR REPLACE FUNCTION step_processed(p_order uuid, p_step integer, p_actor text, OUT next_step integer, OUT order_status text)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
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
BEGIN
    SELECT status, failure_policy INTO v_status, v_policy FROM orders WHERE order_id = p_order FOR UPDATE;
    SELECT kind INTO v_kind FROM steps WHERE order_id = p_order AND step = p_step;
    IF v_kind = 'action' AND v_status IN ('received', 'processing') AND joins_spare(p_order, p_step, p_actor) THEN
        -- an N-of-M join can do without it: the order goes on
        RETURN coalesce(nullif((SELECT ga.order_status FROM graph_advance(p_order, p_actor) ga), ''), v_status);
    END IF;
    CASE order_next(v_kind, false, v_status, v_policy, false)
    WHEN 'none' THEN
        -- a branch in flight ended while the order is undone: its
        -- compensation may run now (a list's step in flight was
        -- cancelled, so nothing changes there)
        RETURN coalesce(nullif((SELECT ga.order_status FROM graph_advance(p_order, p_actor) ga), ''), v_status);
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

-- joins_spare: an action of a graph failed for good (p_step, in error);
-- can the order do without it? The steps that can no longer run are it
-- and, again until none is added, every waiting step that needs one of
-- them, but an N-of-M join (spec needs_any) that can still reach its N
-- with its other needs. The order can do without them when each leads
-- into such a join: none of them is a step nothing needs (a leaf of the
-- graph, whose end the order's own needs). Then the failed step and the
-- steps that can no longer run are cancelled, and it returns true; else
-- it changes nothing. A branch a join spared keeps its last_error and
-- its history, and is compensated, as every action that ran (its
-- attempts not all unsent), if the order is undone.
CREATE OR REPLACE FUNCTION joins_spare(p_order uuid, p_step integer, p_actor text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_dead integer[] := ARRAY[p_step];
    v_more integer[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'action' AND spec ? 'needs_any') THEN
        RETURN false;
    END IF;
    LOOP
        SELECT array_agg(s.step) INTO v_more FROM steps s
        WHERE s.order_id = p_order AND s.kind = 'action' AND s.parent IS NULL AND s.process_state = 'waiting'
          AND s.step <> ALL(v_dead) AND s.needs && v_dead
          AND (SELECT count(*) FROM steps n WHERE n.order_id = p_order AND n.step = ANY(s.needs)
                 AND (n.step = ANY(v_dead) OR n.process_state = 'cancelled'))
              > cardinality(s.needs) - coalesce((s.spec->>'needs_any')::int, cardinality(s.needs));
        EXIT WHEN v_more IS NULL;
        v_dead := v_dead || v_more;
    END LOOP;
    IF EXISTS (SELECT 1 FROM steps d WHERE d.order_id = p_order AND d.step = ANY(v_dead)
                 AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.order_id = p_order AND s.kind = 'action'
                                   AND s.parent IS NULL AND d.step = ANY(s.needs))) THEN
        RETURN false;
    END IF;
    UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                     moved_why = CASE WHEN step = p_step THEN 'failed for good; a join can do without it'
                                      ELSE 'a join no longer needs it' END
    WHERE order_id = p_order AND step = ANY(v_dead) AND process_state IN ('waiting', 'error');
    RETURN true;
END;
$function$;

-- graph_advance: what comes next for an order, once one of its steps
-- changed; decided here and nowhere else. A list is the graph whose steps
-- each need the one before of their kind (its rows' needs are NULL:
-- step_needs), so that its actions run one by one and its compensations,
-- which come after them last action first, undo them last first; the
-- batched reply statement is a list's fast path (order_next). It locks
-- the order row first, so its
-- later statements see what every transaction that held the row before
-- committed: of two branches ending at once, the one that ends last sees
-- the other ended, and its join runs once.
-- While the order runs:
--   a for_each step whose instances all ended is processed, its result
--   the list of theirs in item order; up to max_parallel instances of
--   each for_each step run; every waiting action whose needs all ended
--   (processed or skipped), or for an N-of-M join (spec needs_any) that
--   many of them, becomes pending (delayed, due after its delay, if it
--   has one: fire_timers); with no action left to end, the order
--   completes (a branch a join spared and the steps after it, cancelled,
--   have ended: joins_spare).
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
        FOR v_parent IN SELECT step, coalesce((spec->>'max_parallel')::int, 1) AS max_parallel
                        FROM steps WHERE order_id = p_order AND process_state = 'expanded' LOOP
            SELECT count(*) FILTER (WHERE process_state <> 'processed'),
                   count(*) FILTER (WHERE process_state IN ('pending', 'processing', 'error')),
                   array_agg(step ORDER BY item_index) FILTER (WHERE process_state = 'waiting')
            INTO v_open, v_busy, v_waiting
            FROM steps WHERE order_id = p_order AND parent = v_parent.step AND kind = 'action';
            IF v_open = 0 THEN
                UPDATE steps SET process_state = 'processed', updated_at = clock_timestamp(),
                    result = (SELECT coalesce(jsonb_agg(coalesce(i.result, 'null'::jsonb) ORDER BY i.item_index), '[]'::jsonb)
                              FROM steps i WHERE i.order_id = p_order AND i.parent = v_parent.step AND i.kind = 'action'),
                    moves = moves + 1, moved_by = p_actor, moved_why = 'every instance processed'
                WHERE order_id = p_order AND step = v_parent.step;
            ELSIF v_busy < v_parent.max_parallel THEN
                next_step := steps_made_pending(p_order, v_waiting[1:v_parent.max_parallel - v_busy], next_step,
                                                p_actor, 'an instance may run');
            END IF;
        END LOOP;

        -- A wait whose signal had come ends as it begins: what needed it
        -- may run too, so again until no step ends so.
        LOOP
            SELECT array_agg(s.step) INTO v_steps FROM steps s
            WHERE s.order_id = p_order AND s.kind = 'action' AND s.process_state = 'waiting' AND s.parent IS NULL
              AND CASE WHEN s.spec ? 'needs_any'
                       THEN (SELECT count(*) FROM steps n WHERE n.order_id = p_order AND n.step = ANY(s.needs)
                                                            AND n.process_state IN ('processed', 'skipped')) >= (s.spec->>'needs_any')::int
                       ELSE NOT EXISTS (SELECT 1 FROM steps n WHERE n.order_id = p_order AND n.step = ANY(step_needs(s.needs, s.step))
                                                                AND n.kind = 'action' AND n.process_state NOT IN ('processed', 'skipped')) END;
            next_step := steps_made_pending(p_order, v_steps, next_step, p_actor, 'every step it needs ended');
            EXIT WHEN v_steps IS NULL
                OR NOT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND step = ANY(v_steps) AND process_state = 'processed');
        END LOOP;

        -- While the order runs, an action is cancelled only where a join
        -- spared it (joins_spare).
        IF NOT EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'action'
                         AND process_state NOT IN ('processed', 'skipped', 'cancelled')) THEN
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
            UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp(),
                             moves = moves + 1, moved_by = p_actor, moved_why = 'its action never ran'
            WHERE order_id = p_order AND step = ANY(v_steps) AND process_state = 'waiting';
        END IF;

        SELECT array_agg(c.step) INTO v_steps FROM steps c
        JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting'
          AND a.process_state IN ('processed', 'error', 'cancelled')
          AND NOT EXISTS (SELECT 1 FROM steps n WHERE n.order_id = p_order AND n.step = ANY(step_needs(c.needs, c.step))
                                                  AND n.kind = 'compensation' AND n.process_state NOT IN ('processed', 'cancelled', 'skipped'));
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

-- step_needs: the steps a step needs: a graph's its needs; a list's
-- (needs NULL) the one before it, which counts only when of its kind (the
-- first action and the first compensation, undoing the last action, need
-- none). Pure, so the planner inlines it.
CREATE OR REPLACE FUNCTION step_needs(p_needs integer[], p_step integer)
 RETURNS integer[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce(p_needs, ARRAY[p_step - 1])
$function$;

-- step_settles: what a step sas performs itself does as it becomes
-- runnable, with no claim: 'wait' (it begins to wait), 'timer' (a timer
-- alone: it ends); '' for a step a scheduler claims (one that calls a
-- service, or whose when, for_each or child order is read at its claim).
CREATE OR REPLACE FUNCTION step_settles(p_kind text, p_agent text, p_parent integer, p_spec jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_kind <> 'action' OR p_agent <> '' OR p_parent IS NOT NULL OR p_spec IS NULL
                     OR p_spec ?| ARRAY['when', 'for_each', 'workflow'] THEN ''
                WHEN p_spec ? 'wait' THEN 'wait'
                ELSE 'timer' END
$function$;

-- steps_made_pending: graph_advance's one way to start steps: the given
-- waiting steps of the order become pending, each with its history row;
-- a step with a delay becomes delayed instead, due that long from now on
-- the database clock (fire_timers makes it pending then); a wait
-- (step_settles) begins to wait at once, awaiting until its timeout, and
-- ends at once if its order kept its signal (waits_kept). It returns the
-- lowest step of p_lowest (0: none) and those it made pending. The steps
-- come as a list, read before, so that the update is a lookup of each by
-- its key whatever the planner guesses of an order's size.
CREATE OR REPLACE FUNCTION steps_made_pending(p_order uuid, p_steps integer[], p_lowest integer, p_actor text, p_reason text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first integer;
    v_waits boolean;
BEGIN
    IF p_steps IS NULL OR cardinality(p_steps) = 0 THEN
        RETURN p_lowest;
    END IF;
    WITH upd AS (
        UPDATE steps
        SET process_state = CASE WHEN spec ? 'delay_ms' THEN 'delayed'
                                 WHEN step_settles(kind, agent, parent, spec) = 'wait' THEN 'awaiting'
                                 ELSE 'pending' END,
            due_at = CASE WHEN spec ? 'delay_ms'
                          THEN clock_timestamp() + make_interval(secs => (spec->>'delay_ms')::float8 / 1000)
                          WHEN step_settles(kind, agent, parent, spec) = 'wait'
                          THEN clock_timestamp() + make_interval(secs => (spec->'wait'->>'timeout_ms')::float8 / 1000) END,
            available_at = now(), updated_at = clock_timestamp(),
            moves = moves + 1, moved_by = p_actor,
            moved_why = CASE WHEN spec ? 'delay_ms'
                             THEN p_reason || '; due at ' || to_char((clock_timestamp() + make_interval(secs => (spec->>'delay_ms')::float8 / 1000))
                                                                     AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                             WHEN step_settles(kind, agent, parent, spec) = 'wait'
                             THEN p_reason || '; waiting for signal ' || (spec->'wait'->>'signal') || ' until '
                                  || to_char((clock_timestamp() + make_interval(secs => (spec->'wait'->>'timeout_ms')::float8 / 1000))
                                             AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                             ELSE p_reason END
        WHERE order_id = p_order AND step = ANY(p_steps) AND process_state = 'waiting'
        RETURNING step, process_state, due_at
    )
    SELECT min(step) FILTER (WHERE process_state = 'pending'), bool_or(process_state = 'awaiting')
    INTO v_first, v_waits FROM upd;
    IF v_waits THEN
        PERFORM waits_kept(p_order, p_actor);
    END IF;
    IF v_first IS NOT NULL AND (p_lowest = 0 OR v_first < p_lowest) THEN
        RETURN v_first;
    END IF;
    RETURN p_lowest;
END;
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
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor, moved_why = p_reason
    WHERE order_id = p_order AND step = p_step;
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
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor, moved_why = 'the order is ' || p_status
    WHERE order_id = p_order AND step = p_step;
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
                       backoff_base, backoff_max, needs, ancestors, spec, parent, item_index, item, fair_key, fair_max, namespace)
    SELECT p.order_id, v_last + 1 + it.i, p.name, 'action', p.agent, 'waiting', p.priority, p.timeout, p.max_failures,
           p.idempotency_key || '/' || it.i, p.backoff_base, p.backoff_max, '{}', p.ancestors,
           p.spec - 'for_each' - 'when' - 'delay_ms', p.step, it.i, it.item, p.fair_key, p.fair_max, p.namespace
    FROM steps p, jsonb_array_elements(p_items) WITH ORDINALITY AS it0(item, n), LATERAL (SELECT (it0.n - 1)::int AS i, it0.item) it
    WHERE p.order_id = p_order AND p.step = p_step;
    SELECT * INTO v_comp FROM steps WHERE order_id = p_order AND compensates = p_step;
    IF FOUND THEN
        INSERT INTO steps (order_id, step, name, kind, compensates, agent, process_state, priority, timeout, max_failures,
                           idempotency_key, backoff_base, backoff_max, needs, ancestors, parent, item_index, item, fair_key, fair_max, namespace)
        SELECT v_comp.order_id, v_last + 1 + v_n + i.item_index, v_comp.name, 'compensation', i.step, v_comp.agent, 'waiting',
               v_comp.priority, v_comp.timeout, v_comp.max_failures, v_comp.idempotency_key || '/' || i.item_index,
               v_comp.backoff_base, v_comp.backoff_max, v_comp.needs, v_comp.ancestors, v_comp.step, i.item_index, i.item,
               v_comp.fair_key, v_comp.fair_max, v_comp.namespace
        FROM steps i WHERE i.order_id = p_order AND i.parent = p_step AND i.kind = 'action';
        SELECT coalesce(array_agg(step ORDER BY step), '{}') INTO v_comps FROM steps
        WHERE order_id = p_order AND parent = v_comp.step AND kind = 'compensation';
        UPDATE steps SET needs = array_remove(needs, v_comp.step) || v_comps
        WHERE order_id = p_order AND kind = 'compensation' AND v_comp.step = ANY(needs);
        UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                         moved_why = 'each of the ' || v_n || ' instances of step ' || p_step || ' has its own compensation'
        WHERE order_id = p_order AND step = v_comp.step;
    END IF;
    UPDATE steps SET process_state = 'expanded', locked_by = NULL, complete_by = NULL, unsent_attempts = unsent_attempts + 1,
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor, moved_why = v_n || ' instances'
    WHERE order_id = p_order AND step = p_step;
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
    UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp(),
                     moves = moves + 1, moved_by = p_actor, moved_why = 'the order is ' || v_status
    WHERE order_id = p_order AND step = p_step AND kind = 'action' AND needs IS NOT NULL AND process_state = 'pending';
    RETURN coalesce(nullif((SELECT ga.order_status FROM graph_advance(p_order, p_actor) ga), ''), v_status);
END;
$function$;
