-- Children: a step that runs another workflow as a child order.

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
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                     moved_why = 'waiting for its child order ' || p_child || ' (workflow ' || v_workflow || ') to end'
    WHERE order_id = p_order AND step = p_step;
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
    SELECT max_failures INTO v_max FROM steps
    WHERE order_id = v_parent AND step = v_pstep AND kind = 'action' AND process_state = 'awaiting' FOR UPDATE;
    IF FOUND AND v_status = 'completed' THEN
        SELECT coalesce(jsonb_object_agg(coalesce(spec->>'id', name), result), '{}'::jsonb) INTO v_results
        FROM steps WHERE order_id = p_child AND kind = 'action' AND result IS NOT NULL AND parent IS NULL;
        IF octet_length(v_results::text) > 262144 THEN
            v_results := jsonb_build_object('results_truncated', true);
        END IF;
        UPDATE steps SET process_state = 'processed', result = v_results, due_at = NULL, updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = v_actor, moved_why = 'its child order ' || p_child || ' completed'
        WHERE order_id = v_parent AND step = v_pstep;
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(v_parent, v_actor) ga;
        RETURN;
    ELSIF FOUND THEN
        SELECT 'its child order ' || p_child || ' failed' || coalesce(': ' || s.name || ' (step ' || s.step || ')' || coalesce(': ' || s.last_error, ''), '')
        INTO v_reason FROM (SELECT 1) x
        LEFT JOIN LATERAL (SELECT name, step, last_error FROM steps WHERE order_id = p_child AND process_state = 'error'
                           ORDER BY kind = 'compensation' DESC, step LIMIT 1) s ON true;
        v_reason := left(v_reason, 2000);
        UPDATE steps SET process_state = 'error', failure_count = max_failures, last_error = v_reason, due_at = NULL,
                         updated_at = clock_timestamp(), moves = moves + 1, moved_by = v_actor, moved_why = v_reason
        WHERE order_id = v_parent AND step = v_pstep;
        order_status := step_failed(v_parent, v_pstep, v_actor, v_reason, v_max);
        IF order_status NOT IN ('completed', 'failed', 'error') THEN
            order_status := '';
        END IF;
        RETURN;
    END IF;
    SELECT step INTO v_comp FROM steps
    WHERE order_id = v_parent AND compensates = v_pstep AND kind = 'compensation' AND process_state = 'awaiting' FOR UPDATE;
    IF FOUND AND v_status = 'failed' THEN
        UPDATE steps SET process_state = 'processed', due_at = NULL, updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = v_actor, moved_why = 'its child order ' || p_child || ' is undone'
        WHERE order_id = v_parent AND step = v_comp;
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
        UPDATE steps SET process_state = 'processed', locked_by = NULL, complete_by = NULL, updated_at = clock_timestamp(),
                         moves = moves + 1, moved_by = p_actor, moved_why = v_reason
        WHERE order_id = p_order AND step = p_step;
        SELECT ga.next_step, ga.order_status INTO next_step, order_status FROM graph_advance(p_order, p_actor) ga;
        RETURN;
    END IF;
    UPDATE steps SET process_state = 'awaiting', due_at = clock_timestamp() + interval '100 years', locked_by = NULL, complete_by = NULL,
                     updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor,
                     moved_why = 'waiting for its child order ' || v_child || ' to be undone'
    WHERE order_id = p_order AND step = p_step;
    PERFORM pg_notify('sas_pending', current_schema());
END;
$function$;
