-- Operators (SECURITY DEFINER: the only way an operator changes state), retention and the console's sample.

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
                UPDATE steps SET process_state = 'waiting', updated_at = clock_timestamp(), moves = moves + 1, moved_by = v_actor,
                                 moved_why = 'operator resubmit of step ' || p_step || ': its for_each step runs again'
                WHERE order_id = p_order AND step = ANY(v_steps) AND process_state = 'cancelled';
            END IF;
        END IF;
        WITH reset AS (
            UPDATE steps s
            SET process_state = CASE WHEN s.step = p_step THEN 'pending' ELSE 'waiting' END,
                failure_count = 0, result = NULL, locked_by = NULL, complete_by = NULL, due_at = NULL,
                idempotency_key = CASE WHEN s.process_state IN ('processed', 'expanded')
                                       THEN regexp_replace(s.idempotency_key, '/rerun-[0-9]+$', '') || '/rerun-' || s.attempt
                                       ELSE s.idempotency_key END,
                available_at = now(), updated_at = clock_timestamp(),
                moves = s.moves + 1, moved_by = v_actor,
                moved_why = CASE WHEN s.step = p_step THEN 'operator resubmit: run again'
                                 ELSE 'operator resubmit of step ' || p_step || ': it depends on it' END
            WHERE s.order_id = p_order AND s.step = ANY(v_rerun)
            RETURNING s.step
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
                available_at = now(), updated_at = clock_timestamp(),
                moves = moves + 1, moved_by = v_actor, moved_why = 'operator resubmit'
            WHERE order_id = p_order AND process_state = 'error' AND (coalesce(p_step, 0) = 0 OR step = p_step OR v_graph)
              AND (NOT v_undoing OR kind = 'compensation')
            RETURNING step, attempt, kind
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
    -- The order's timers, held with it, count again.
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema()), pg_notify('sas_timers', current_schema());
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
-- a time (retention), as purge_orders does, the oldest first.
CREATE OR REPLACE FUNCTION purge_ended_orders(p_older_than interval, p_statuses text[], p_limit integer, OUT orders_deleted bigint, OUT steps_deleted bigint, OUT transitions_deleted bigint, OUT alerts_deleted bigint)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
BEGIN
    SELECT p.orders_deleted, p.steps_deleted, p.transitions_deleted, p.alerts_deleted
    INTO orders_deleted, steps_deleted, transitions_deleted, alerts_deleted
    FROM purge_orders((SELECT array_agg(order_id) FROM (
                           SELECT order_id FROM orders
                           WHERE created_at < now() - p_older_than AND updated_at < now() - p_older_than AND status = ANY(p_statuses)
                           ORDER BY created_at
                           LIMIT p_limit) o),
                      p_older_than, p_statuses) p;
END;
$function$;

-- purge_orders: deletes the orders of p_ids that ended (p_statuses, of
-- completed and failed) more than p_older_than ago, with their steps,
-- history and alerts (their other rows go with them: orders_delete_history):
-- the orders an archive confirmed it keeps, or a batch of retention's.
-- Rows another transaction holds are left for later.
CREATE OR REPLACE FUNCTION purge_orders(p_ids uuid[], p_older_than interval, p_statuses text[], OUT orders_deleted bigint, OUT steps_deleted bigint, OUT transitions_deleted bigint, OUT alerts_deleted bigint)
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
        WHERE order_id = ANY(p_ids) AND created_at < now() - p_older_than AND updated_at < now() - p_older_than AND status = ANY(p_statuses)
        ORDER BY created_at
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
    -- (The pending steps in the two halves their partial indexes hold.)
    INSERT INTO overview_minutes AS m (minute, workflow, pending)
    SELECT v_now, o.workflow, count(*)
    FROM (SELECT order_id FROM steps WHERE process_state = 'pending' AND fair_key IS NULL
          UNION ALL
          SELECT order_id FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL) s
    JOIN orders o ON o.order_id = s.order_id
    GROUP BY o.workflow
    ON CONFLICT (minute, workflow) DO UPDATE SET pending = excluded.pending;
    GET DIAGNOSTICS v_pending = ROW_COUNT;
    UPDATE overview_minutes m SET pending = 0
    WHERE m.minute = v_now AND m.pending > 0 AND m.workflow NOT IN (
        SELECT o.workflow
        FROM (SELECT order_id FROM steps WHERE process_state = 'pending' AND fair_key IS NULL
              UNION ALL
              SELECT order_id FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL) s
        JOIN orders o ON o.order_id = s.order_id);
    DELETE FROM overview_minutes WHERE minute < v_now - interval '2 hours';
    RETURN v_ended + v_pending;
END;
$function$;

-- Pause and resume (migration 0041): nothing of a paused order, workflow
-- or agent kind is claimed; what is in flight ends normally.

-- pause_order: pauses an order that runs (received, processing,
-- compensating): its pending steps are set aside (available_at 9999-12-31,
-- so that claims do not walk them; a step that becomes pending while it is
-- paused is passed over by the claims' look at order_pauses). Returns
-- 'paused', or 'already' when it was paused.
CREATE OR REPLACE FUNCTION pause_order(p_order uuid, p_reason text, p_claimed text)
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
    IF v_status NOT IN ('received', 'processing', 'compensating') THEN
        RAISE EXCEPTION 'order % is %; only an order that runs (received, processing, compensating) can be paused', p_order, v_status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO order_pauses (order_id, paused_by, reason, scope)
    VALUES (p_order, coalesce(NULLIF(left(p_claimed, 100), ''), session_user) || ' (' || v_actor || ')', left(coalesce(p_reason, ''), 500), 'order')
    ON CONFLICT (order_id) DO UPDATE SET scope = 'order' WHERE order_pauses.scope = 'workflow';
    IF NOT FOUND THEN
        RETURN 'already';
    END IF;
    UPDATE steps SET available_at = '9999-12-31 00:00:00+00' WHERE order_id = p_order AND process_state = 'pending';
    PERFORM record_operator_action('pause', p_order::text, coalesce(p_reason, ''), p_claimed);
    RETURN 'paused';
END;
$function$;

-- order_unpause: takes an order's pause away: its steps set aside are due
-- now, and its deadline moves on by the time it was paused (a budget does
-- not run while paused); the schedulers and the timer loop are told.
-- Returns false when it was not paused.
CREATE OR REPLACE FUNCTION order_unpause(p_order uuid)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_since timestamptz;
    v_due timestamptz;
BEGIN
    DELETE FROM order_pauses WHERE order_id = p_order RETURNING paused_at INTO v_since;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE steps SET available_at = now() WHERE order_id = p_order AND process_state = 'pending' AND available_at = '9999-12-31 00:00:00+00';
    UPDATE order_deadlines SET due_at = due_at + (clock_timestamp() - v_since)
    WHERE order_id = p_order AND outcome IS NULL
    RETURNING due_at INTO v_due;
    IF v_due IS NOT NULL THEN
        PERFORM timer_set(v_due);
    END IF;
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_timers', current_schema());
    RETURN true;
END;
$function$;

-- resume_order: resumes a paused order (order_unpause), what is due of it
-- at once: its steps set aside, its timers that fell due meanwhile.
-- Returns 'resumed', or 'not_paused'.
CREATE OR REPLACE FUNCTION resume_order(p_order uuid, p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
BEGIN
    PERFORM 1 FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF NOT order_unpause(p_order) THEN
        RETURN 'not_paused';
    END IF;
    PERFORM record_operator_action('resume', p_order::text, 'by ' || v_actor, p_claimed);
    RETURN 'resumed';
END;
$function$;

-- pause_workflow: pauses a workflow: every order of it that runs, and
-- every order of it written while it is paused (insertOrdersSQL), until
-- resume_workflow. Returns how many running orders it paused.
CREATE OR REPLACE FUNCTION pause_workflow(p_workflow text, p_reason text, p_claimed text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_by text := coalesce(NULLIF(left(p_claimed, 100), ''), session_user) || ' (' || v_actor || ')';
    v_n integer;
BEGIN
    INSERT INTO workflow_pauses (workflow, paused_by, reason) VALUES (p_workflow, v_by, left(coalesce(p_reason, ''), 500))
    ON CONFLICT (workflow) DO NOTHING;
    v_n := pauses_settle(v_by);
    PERFORM record_operator_action('pause workflow', p_workflow, coalesce(p_reason, ''), p_claimed);
    RETURN v_n;
END;
$function$;

-- resume_workflow: resumes a paused workflow and every order paused with
-- it (an order paused on its own stays paused). Returns how many orders
-- it resumed; -1 when the workflow was not paused.
CREATE OR REPLACE FUNCTION resume_workflow(p_workflow text, p_claimed text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_n integer := 0;
    r record;
BEGIN
    DELETE FROM workflow_pauses WHERE workflow = p_workflow;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    FOR r IN SELECT p.order_id FROM order_pauses p JOIN orders o ON o.order_id = p.order_id
             WHERE p.scope = 'workflow' AND o.workflow = p_workflow
             ORDER BY p.order_id
             FOR UPDATE OF o LOOP
        IF order_unpause(r.order_id) THEN
            v_n := v_n + 1;
        END IF;
    END LOOP;
    PERFORM record_operator_action('resume workflow', p_workflow, v_n || ' orders resumed, by ' || v_actor, p_claimed);
    RETURN v_n;
END;
$function$;

-- pause_kind: pauses an agent kind: none of its steps is claimed, in any
-- order, until resume_kind. Returns 'paused' or 'already'.
CREATE OR REPLACE FUNCTION pause_kind(p_agent text, p_reason text, p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
BEGIN
    INSERT INTO kind_pauses (agent, paused_by, reason)
    VALUES (p_agent, coalesce(NULLIF(left(p_claimed, 100), ''), session_user) || ' (' || v_actor || ')', left(coalesce(p_reason, ''), 500))
    ON CONFLICT (agent) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 'already';
    END IF;
    PERFORM record_operator_action('pause kind', p_agent, coalesce(p_reason, ''), p_claimed);
    RETURN 'paused';
END;
$function$;

-- resume_kind: resumes a paused agent kind. Returns 'resumed' or
-- 'not_paused'.
CREATE OR REPLACE FUNCTION resume_kind(p_agent text, p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
BEGIN
    DELETE FROM kind_pauses WHERE agent = p_agent;
    IF NOT FOUND THEN
        RETURN 'not_paused';
    END IF;
    PERFORM pg_notify('sas_pending', current_schema());
    PERFORM record_operator_action('resume kind', p_agent, 'by ' || v_actor, p_claimed);
    RETURN 'resumed';
END;
$function$;

-- pauses_settle: keeps pauses whole, as a workflow's pause and the
-- leading supervisor's sweep call it: every order of a paused workflow
-- that runs is paused (an order written as the pause began, which the
-- insert could not see, is caught here), and the pending steps of paused
-- orders are set aside (available_at 9999-12-31: a step that became pending
-- while its order was paused), the pauses of orders that ended while
-- paused go, and an order paused with a workflow no longer paused (its
-- insert raced the resume) is resumed. Returns how many orders it paused.
CREATE OR REPLACE FUNCTION pauses_settle(p_by text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_n integer := 0;
    r record;
BEGIN
    IF EXISTS (SELECT 1 FROM workflow_pauses) THEN
        INSERT INTO order_pauses (order_id, paused_at, paused_by, reason, scope)
        SELECT o.order_id, clock_timestamp(), w.paused_by, w.reason, 'workflow'
        FROM workflow_pauses w JOIN orders o ON o.workflow = w.workflow
        WHERE o.status IN ('received', 'processing', 'compensating')
        ON CONFLICT (order_id) DO NOTHING;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    IF EXISTS (SELECT 1 FROM order_pauses) THEN
        -- An order that ended while paused has nothing left to hold.
        DELETE FROM order_pauses p USING orders o
        WHERE o.order_id = p.order_id AND o.status IN ('completed', 'failed');
        -- An order paused with its workflow as the workflow's resume ran
        -- (its insert had not committed) is resumed now.
        FOR r IN SELECT p.order_id FROM order_pauses p JOIN orders o ON o.order_id = p.order_id
                 WHERE p.scope = 'workflow' AND NOT EXISTS (SELECT 1 FROM workflow_pauses w WHERE w.workflow = o.workflow)
                 ORDER BY p.order_id
                 FOR UPDATE OF o SKIP LOCKED LOOP
            PERFORM order_unpause(r.order_id);
        END LOOP;
        -- The pause rows of orders with a step to set aside are locked as
        -- they are read: a resume that deleted one since this statement
        -- began must not find its order's steps set aside after it looked
        -- (order_unpause frees only what it sees at 9999-12-31), and one
        -- deleting it now waits for this to commit. (Only those rows: a
        -- row lock is a write, and most paused orders have nothing new.)
        UPDATE steps s SET available_at = '9999-12-31 00:00:00+00'
        FROM (SELECT p.order_id FROM order_pauses p
              WHERE EXISTS (SELECT 1 FROM steps n WHERE n.order_id = p.order_id AND n.process_state = 'pending'
                                                    AND n.available_at <> '9999-12-31 00:00:00+00')
              FOR SHARE OF p SKIP LOCKED) p
        WHERE s.order_id = p.order_id AND s.process_state = 'pending' AND s.available_at <> '9999-12-31 00:00:00+00';
    END IF;
    RETURN v_n;
END;
$function$;

-- order_migrate: moves a running order to another version of its
-- workflow (statestore.MigrateOrder planned it, from the steps it read,
-- for the version p_from: a plan of the new version's step rows, each
-- continuing an old step (old) or new (old 0), with p_added the actions
-- it adds). The order's step rows are locked before the order, as a
-- reply locks them; the plan is checked again against what it finds (a
-- step it drops has not begun meanwhile, a step that has begun keeps its
-- position, no compensation or for_each instance has begun). Then the
-- steps continued keep their state, results, attempts and keys under
-- their new numbers and definitions, those dropped go, the new version's
-- other actions and its compensations come waiting, the version p_to
-- (p_definition) is stored, the order pinned to it and its history
-- records the move; what may run now becomes pending (graph_advance).
-- Returns '' once moved, or why it did not (nothing changed).
CREATE OR REPLACE FUNCTION order_migrate(p_order uuid, p_from text, p_to text, p_definition jsonb, p_plan jsonb, p_added text, p_claimed text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_status text;
    v_version text;
    v_workflow text;
    v_priority smallint;
    v_fair_key text;
    v_fair_max integer;
    v_ns text;
BEGIN
    PERFORM 1 FROM steps WHERE order_id = p_order ORDER BY step FOR UPDATE;
    SELECT status, coalesce(workflow_version, ''), workflow, priority INTO v_status, v_version, v_workflow, v_priority
    FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF v_version <> p_from OR v_status NOT IN ('received', 'processing') THEN
        RETURN 'it changed since it was read (now ' || v_status || ', version ' || nullif(v_version, '') || '); look again';
    END IF;
    IF EXISTS (SELECT 1 FROM steps s WHERE s.order_id = p_order AND s.kind = 'action' AND s.process_state <> 'waiting'
                 AND NOT EXISTS (SELECT 1 FROM jsonb_to_recordset(p_plan) AS r(old integer) WHERE r.old = s.step)) THEN
        RETURN 'a step it would drop has begun meanwhile; look again';
    END IF;
    IF EXISTS (SELECT 1 FROM steps s JOIN jsonb_to_recordset(p_plan) AS r(old integer, step integer) ON r.old = s.step
               WHERE s.order_id = p_order AND s.process_state <> 'waiting' AND r.step <> r.old) THEN
        RETURN 'a step that has begun would change its position';
    END IF;
    IF EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND (parent IS NOT NULL OR (kind = 'compensation' AND process_state <> 'waiting'))) THEN
        RETURN 'a for_each instance or a compensation has begun meanwhile';
    END IF;
    SELECT NULLIF(o.namespace, 'default') INTO v_ns FROM orders o WHERE o.order_id = p_order;
    SELECT fair_key_base(s.fair_key, v_ns), s.fair_max INTO v_fair_key, v_fair_max FROM steps s
    WHERE s.order_id = p_order AND s.fair_key IS NOT NULL ORDER BY s.fair_key = v_ns || E'\x1e' LIMIT 1;
    INSERT INTO workflow_versions (name, version, definition, created_by) VALUES (v_workflow, p_to, p_definition, v_actor)
    ON CONFLICT (name, version) DO NOTHING;

    -- The steps continued go out of the new numbers' way; the others go.
    UPDATE steps s SET step = s.step + 1000000
    WHERE s.order_id = p_order AND s.kind = 'action' AND EXISTS (SELECT 1 FROM jsonb_to_recordset(p_plan) AS r(old integer) WHERE r.old = s.step);
    DELETE FROM steps WHERE order_id = p_order AND step < 1000000;
    UPDATE steps s SET step = r.step, name = r.name, compensates = NULLIF(r.compensates, 0), agent = r.agent,
                       timeout = make_interval(secs => r.timeout_ms / 1000.0), max_failures = r.max_failures,
                       backoff_base = make_interval(secs => NULLIF(r.backoff_base_ms, 0) / 1000.0),
                       backoff_max = make_interval(secs => NULLIF(r.backoff_max_ms, 0) / 1000.0),
                       needs = r.needs, ancestors = r.ancestors, spec = NULLIF(r.spec, 'null'::jsonb), updated_at = clock_timestamp()
    FROM jsonb_to_recordset(p_plan) AS r(old integer, step integer, name text, compensates integer, agent text, timeout_ms bigint,
                                          max_failures integer, backoff_base_ms bigint, backoff_max_ms bigint, needs integer[],
                                          ancestors integer[], spec jsonb)
    WHERE s.order_id = p_order AND r.old > 0 AND s.step = r.old + 1000000;
    INSERT INTO steps (order_id, step, name, kind, compensates, agent, process_state, priority, timeout, max_failures, idempotency_key,
                       backoff_base, backoff_max, needs, ancestors, spec, fair_key, fair_max, namespace)
    SELECT p_order, r.step, r.name, r.kind, NULLIF(r.compensates, 0), r.agent, 'waiting', v_priority, make_interval(secs => r.timeout_ms / 1000.0),
           r.max_failures, r.idempotency_key, make_interval(secs => NULLIF(r.backoff_base_ms, 0) / 1000.0),
           make_interval(secs => NULLIF(r.backoff_max_ms, 0) / 1000.0), r.needs, r.ancestors, NULLIF(r.spec, 'null'::jsonb),
           step_fair_key(v_ns, r.agent, v_fair_key), CASE WHEN r.agent <> '' THEN v_fair_max END, v_ns
    FROM jsonb_to_recordset(p_plan) AS r(old integer, step integer, name text, kind text, compensates integer, agent text, timeout_ms bigint,
                                          max_failures integer, backoff_base_ms bigint, backoff_max_ms bigint, needs integer[],
                                          ancestors integer[], spec jsonb, idempotency_key text)
    WHERE r.old = 0;
    UPDATE orders SET workflow_version = p_to, updated_at = clock_timestamp() WHERE order_id = p_order;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, NULL, v_status, v_status, v_actor,
            'migrated from version ' || coalesce(nullif(p_from, ''), 'none') || ' to ' || p_to || coalesce(' (added: ' || nullif(p_added, '') || ')', ''));
    PERFORM graph_advance(p_order, v_actor);
    PERFORM record_operator_action('migrate', p_order::text, 'from ' || coalesce(nullif(p_from, ''), 'none') || ' to ' || p_to, p_claimed);
    PERFORM pg_notify('sas_pending', current_schema());
    RETURN '';
END;
$function$;
