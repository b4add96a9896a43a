-- Waits and timers: signals, delays, start_at and wait timeouts on the database clock.

-- fire_timers: the timers that fell due (due_at passed on the database
-- clock), earliest first, at most p_limit of each sort, if p_holder holds
-- the lease p_lease (so a supervisor that lost the lead fires nothing),
-- for orders that still run and are not paused (a held order's timers
-- wait for its resubmit, a paused one's for its resume; an order undone
-- or cancelled cancelled its steps):
--   a delayed step becomes pending, or, if sas performs it itself
--   (step_settles), a timer alone ends there and a wait begins to wait
--   (and its order goes on: graph_advance), with no claim;
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
    v_orders uuid[];
    v_steps integer[];
    v_late float8[];
    v_settled uuid[];
    v_order uuid;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = p_lease AND l.holder = p_holder AND l.expires_at > now()) THEN
        RETURN;
    END IF;
    WITH due AS (
        SELECT s.order_id, s.step, s.due_at, step_settles(s.kind, s.agent, s.parent, s.spec) AS settles
        FROM steps s JOIN orders o ON o.order_id = s.order_id
        WHERE s.process_state = 'delayed' AND s.due_at <= clock_timestamp() AND o.status IN ('received', 'processing')
          AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id)
        ORDER BY s.due_at
        LIMIT p_limit
        FOR UPDATE OF s SKIP LOCKED
    ), upd AS (
        UPDATE steps s
        SET process_state = CASE due.settles WHEN 'timer' THEN 'processed' WHEN 'wait' THEN 'awaiting' ELSE 'pending' END,
            due_at = CASE WHEN due.settles = 'wait'
                          THEN clock_timestamp() + make_interval(secs => (s.spec->'wait'->>'timeout_ms')::float8 / 1000)
                          ELSE s.due_at END,
            available_at = now(), updated_at = clock_timestamp(),
            moves = s.moves + 1, moved_by = p_holder,
            moved_why = CASE due.settles
                            WHEN 'timer' THEN 'its timer ended'
                            WHEN 'wait' THEN 'its delay ended; waiting for signal ' || (s.spec->'wait'->>'signal') || ' until '
                                             || to_char((clock_timestamp() + make_interval(secs => (s.spec->'wait'->>'timeout_ms')::float8 / 1000))
                                                        AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                            ELSE 'its delay ended' END
        FROM due WHERE s.order_id = due.order_id AND s.step = due.step AND s.process_state = 'delayed'
        RETURNING s.order_id, s.step, due.due_at AS was_due, due.settles
    )
    SELECT array_agg(u.order_id), array_agg(u.step), array_agg(extract(epoch FROM clock_timestamp() - u.was_due)::float8),
           array_agg(DISTINCT u.order_id) FILTER (WHERE u.settles <> '')
    INTO v_orders, v_steps, v_late, v_settled
    FROM upd u;
    RETURN QUERY SELECT * FROM unnest(v_orders, v_steps, v_late);
    -- What a timer's end or a wait's beginning lets run, runs.
    FOREACH v_order IN ARRAY coalesce(v_settled, '{}') LOOP
        PERFORM waits_kept(v_order, p_holder);
        PERFORM graph_advance(v_order, p_holder);
    END LOOP;

    FOR r IN SELECT s.order_id, s.step, s.attempt, s.due_at, s.spec->'wait' AS w FROM steps s JOIN orders o ON o.order_id = s.order_id
             WHERE s.process_state = 'awaiting' AND s.due_at <= clock_timestamp() AND o.status IN ('received', 'processing')
               AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id)
             ORDER BY s.due_at
             LIMIT p_limit
             FOR UPDATE OF s SKIP LOCKED LOOP
        v_reason := 'no signal ' || (r.w->>'signal') || ' came within its timeout of '
                    || duration_text((r.w->>'timeout_ms')::bigint);
        IF r.w->>'on_timeout' = 'skip' THEN
            UPDATE steps s SET process_state = 'skipped', updated_at = clock_timestamp(),
                               moves = s.moves + 1, moved_by = p_holder, moved_why = v_reason || ': skipped (on_timeout: skip)'
            WHERE s.order_id = r.order_id AND s.step = r.step;
            PERFORM graph_advance(r.order_id, p_holder);
        ELSE
            UPDATE steps s SET process_state = 'error', failure_count = s.max_failures, last_error = v_reason,
                               updated_at = clock_timestamp(), moves = s.moves + 1, moved_by = p_holder, moved_why = v_reason
            WHERE s.order_id = r.order_id AND s.step = r.step;
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

-- fire_deadlines: the orders' deadlines that fell due (due_at passed on
-- the database clock), earliest first, at most p_limit, if p_holder holds
-- the lease p_lease. Each is fired once (taken FOR UPDATE SKIP LOCKED, its
-- outcome written; a paused order's waits for its resume, which moves it
-- on by the time paused): order_deadline_passed applies it to an order that
-- still runs; an order that ended, or is being undone, by then is left as
-- it is (outcome 'ended'). It returns each deadline fired, whether it was
-- applied, and how late, in seconds.
CREATE OR REPLACE FUNCTION fire_deadlines(p_holder text, p_lease text, p_limit integer)
 RETURNS TABLE(deadline_order uuid, deadline_workflow text, deadline_how text, deadline_applied boolean, deadline_late_s double precision)
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leases l WHERE l.name = p_lease AND l.holder = p_holder AND l.expires_at > now()) THEN
        RETURN;
    END IF;
    FOR r IN SELECT d.order_id, d.due_at, d.deadline_ms, d.on_deadline FROM order_deadlines d
             WHERE d.outcome IS NULL AND d.due_at <= clock_timestamp()
               AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = d.order_id)
             ORDER BY d.due_at
             LIMIT p_limit
             FOR UPDATE OF d SKIP LOCKED LOOP
        deadline_order := r.order_id;
        deadline_how := r.on_deadline;
        deadline_late_s := extract(epoch FROM clock_timestamp() - r.due_at)::float8;
        deadline_applied := order_deadline_passed(r.order_id, r.on_deadline, r.deadline_ms, p_holder);
        SELECT o.workflow INTO deadline_workflow FROM orders o WHERE o.order_id = r.order_id;
        UPDATE order_deadlines d SET outcome = CASE WHEN deadline_applied THEN r.on_deadline ELSE 'ended' END, passed_at = clock_timestamp()
        WHERE d.order_id = r.order_id;
        RETURN NEXT;
    END LOOP;
END;
$function$;

-- order_deadline_passed: an order's deadline of p_ms passed. An order that
-- still runs (received, processing; or held in error, unless what holds
-- it is a failed compensation, or p_how is hold) has its steps in flight
-- fenced out (a reply or callback still to come finds its attempt no
-- longer processing), and then, by p_how:
--   compensate  its open actions are cancelled and what was done is undone
--               (begin_compensation), a step in flight as one that ran
--   fail        its open actions and its compensations are cancelled and
--               it fails, nothing undone
--   hold        its steps pending or in flight are held in error, an
--               operator is alerted, and a resubmit puts them back to work
--               (its delays and waits keep their due times, and fire once
--               it runs again)
-- The history's reason starts "deadline passed", which the ending event
-- reads (status_event_body). The order's step rows are locked before the
-- order, as a reply locks them, so that a reply racing the deadline
-- waits for it (or it for the reply) and exactly one of them acts. It
-- returns whether the deadline was applied.
CREATE OR REPLACE FUNCTION order_deadline_passed(p_order uuid, p_how text, p_ms bigint, p_actor text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_status text;
    v_reason text := 'deadline passed: the order''s deadline of ' || duration_text(p_ms) || ' ended (on_deadline: ' || p_how || ')';
BEGIN
    PERFORM 1 FROM steps WHERE order_id = p_order ORDER BY step FOR UPDATE;
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND OR v_status NOT IN ('received', 'processing', 'error')
       OR v_status = 'error' AND (p_how = 'hold' OR EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error')) THEN
        RETURN false;
    END IF;
    IF p_how = 'hold' THEN
        UPDATE steps SET process_state = 'error', last_error = v_reason, locked_by = NULL, complete_by = NULL, updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = p_actor, moved_why = v_reason
        WHERE order_id = p_order AND kind = 'action' AND process_state IN ('pending', 'processing');
        PERFORM order_transition(p_order, 'error', NULL, p_actor, v_reason);
        PERFORM raise_alert(p_order, NULL, v_reason, 0, p_actor);
        RETURN true;
    END IF;
    UPDATE steps SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, due_at = NULL, updated_at = clock_timestamp(),
                     moves = moves + 1, moved_by = p_actor, moved_why = v_reason
    WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'processing', 'delayed', 'awaiting', 'expanded');
    IF EXISTS (SELECT 1 FROM orders WHERE parent_order = p_order) THEN
        PERFORM children_cancel(p_order, p_actor);
    END IF;
    IF p_how = 'fail' THEN
        UPDATE steps SET process_state = 'cancelled', updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = p_actor, moved_why = v_reason || ': nothing is undone'
        WHERE order_id = p_order AND kind = 'compensation' AND process_state IN ('waiting', 'pending', 'delayed');
        PERFORM order_transition(p_order, 'failed', NULL, p_actor, v_reason);
    ELSE
        PERFORM begin_compensation(p_order, NULL, p_actor, v_reason);
    END IF;
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema());
    RETURN true;
END;
$function$;

-- duration_text: a duration of p_ms milliseconds as a person writes it
-- (2 h, 10 min, 20 s, 1.5 s, 200 ms).
CREATE OR REPLACE FUNCTION duration_text(p_ms bigint)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_ms >= 3600000 AND p_ms % 3600000 = 0 THEN (p_ms / 3600000)::text || ' h'
                WHEN p_ms >= 60000 AND p_ms % 60000 = 0 THEN (p_ms / 60000)::text || ' min'
                WHEN p_ms < 1000 THEN p_ms::text || ' ms'
                ELSE trim_scale(p_ms / 1000.0)::text || ' s' END
$function$;

-- next_timer: seconds until the earliest timer fire_timers would fire
-- (a delay, a wait's timeout, of an order that runs) or deadline
-- fire_deadlines would (of any order: it is fired once) falls due on the
-- database clock (zero or less: due now, fallen due since the last
-- firing; NULL: none). It walks the due-time index from its start past
-- the timers of held orders, which wait for a resubmit.
CREATE OR REPLACE FUNCTION next_timer()
 RETURNS double precision
 LANGUAGE sql
 STABLE
AS $function$
    SELECT least(
        (SELECT extract(epoch FROM s.due_at - clock_timestamp())::float8
         FROM steps s JOIN orders o ON o.order_id = s.order_id
         WHERE s.process_state IN ('delayed', 'awaiting') AND o.status IN ('received', 'processing')
           AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id)
         ORDER BY s.due_at
         LIMIT 1),
        (SELECT extract(epoch FROM min(d.due_at) - clock_timestamp())::float8 FROM order_deadlines d
         WHERE d.outcome IS NULL AND NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = d.order_id)))
$function$;

-- timers_watch: the leading supervisor's look before it sleeps. Seconds
-- until the earliest timer (next_timer) or schedule tick still to come
-- (NULL: none); and, when it could take the timers' lock alone, it
-- records in timer_watch that it looks next then, at most p_longest_s
-- from now, so that a timer set meanwhile for sooner is told to it
-- (timer_set). The lock is only tried: a writer that read the last
-- record and has not committed holds it shared, and the loop then looks
-- again soon rather than wait for that writer (watched false). Once the
-- lock is taken, every such writer has committed, and this look sees its
-- timer.
CREATE OR REPLACE FUNCTION timers_watch(p_longest_s double precision, OUT next_s double precision, OUT watched boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    watched := pg_try_advisory_xact_lock(hashtextextended('sas.timers.' || current_schema(), 0));
    next_s := least(next_timer(),
                    (SELECT extract(epoch FROM min(next_tick) - clock_timestamp())::float8 FROM schedules
                     WHERE in_file AND NOT paused AND next_tick > clock_timestamp()));
    IF watched THEN
        UPDATE timer_watch SET next_look = clock_timestamp()
                                           + make_interval(secs => greatest(least(coalesce(next_s, p_longest_s), p_longest_s), 0));
    END IF;
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
                         updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                         moved_why = 'signal ' || (v_wait->>'signal') || ' (id ' || v_signal || ') had come before the wait began'
        WHERE order_id = p_order AND step = p_step;
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    v_due := clock_timestamp() + make_interval(secs => (v_wait->>'timeout_ms')::float8 / 1000);
    UPDATE steps SET process_state = 'awaiting', due_at = v_due, locked_by = NULL, complete_by = NULL,
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                     moved_why = 'waiting for signal ' || (v_wait->>'signal') || ' until '
                                 || to_char(v_due AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
    WHERE order_id = p_order AND step = p_step;
END;
$function$;

-- waits_kept: the waits of p_order that began with no claim (they became
-- awaiting as they became runnable: steps_made_pending, fire_timers) and
-- whose signal the order kept (it came before the wait began) end with it
-- at once, its payload the step's result, as step_await does for a
-- claimed wait. It returns how many ended; the caller lets the order go
-- on (graph_advance).
CREATE OR REPLACE FUNCTION waits_kept(p_order uuid, p_actor text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
    v_signal text;
    v_payload jsonb;
    v_n integer := 0;
BEGIN
    FOR r IN SELECT s.step, s.spec->'wait'->>'signal' AS name FROM steps s
             WHERE s.order_id = p_order AND s.process_state = 'awaiting' AND s.spec ? 'wait'
               AND EXISTS (SELECT 1 FROM signals g WHERE g.order_id = p_order AND g.step IS NULL AND g.name = s.spec->'wait'->>'signal')
             ORDER BY s.step LOOP
        SELECT g.signal_id, g.payload INTO v_signal, v_payload FROM signals g
        WHERE g.order_id = p_order AND g.name = r.name AND g.step IS NULL
        ORDER BY g.received_at LIMIT 1 FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        UPDATE signals SET step = r.step WHERE order_id = p_order AND signal_id = v_signal;
        UPDATE steps SET process_state = 'processed', result = v_payload, due_at = NULL, updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = p_actor,
                         moved_why = 'signal ' || r.name || ' (id ' || v_signal || ') had come before the wait began'
        WHERE order_id = p_order AND step = r.step;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
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
        UPDATE steps s SET process_state = 'processed', result = p_payload, updated_at = clock_timestamp(),
                           moves = s.moves + 1, moved_by = p_actor, moved_why = 'signal ' || p_name || ' (id ' || p_signal_id || ')'
        WHERE s.order_id = p_order AND s.step = v_step;
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
