-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- operator_resubmit resets only what may run again. Once a compensation
-- of an order failed, the order is partly undone: only its compensations
-- in error may be resubmitted (an action resubmitted then would run
-- beside the undoing); before that, its actions in error. Without a step
-- (p_step 0) it resets all that may run; a step named that may not is
-- refused, saying which may. The console offers exactly these.
CREATE OR REPLACE FUNCTION operator_resubmit(p_order uuid, p_step integer, p_claimed text)
RETURNS SETOF integer LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_status text;
    v_state text;
    v_kind text;
    v_last integer;
    v_steps integer[];
    v_compensation boolean;
    v_undoing boolean;
    v_may text;
BEGIN
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF p_step IS NOT NULL AND p_step <> 0 THEN
        SELECT process_state, kind INTO v_state, v_kind FROM steps WHERE order_id = p_order AND step = p_step;
        IF NOT FOUND THEN
            SELECT max(step) INTO v_last FROM steps WHERE order_id = p_order;
            RAISE EXCEPTION 'order % has no step % (its steps are 1 to %)', p_order, p_step, v_last USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF v_status <> 'error' THEN
        RAISE EXCEPTION 'order % is %, only an order in error can be resubmitted', p_order, v_status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_state IS NOT NULL AND v_state <> 'error' THEN
        RAISE EXCEPTION 'order % step % is %, only a step in error can be resubmitted', p_order, p_step, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    v_undoing := EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error');
    IF v_undoing AND v_kind = 'action' THEN
        SELECT string_agg(step::text, ', ' ORDER BY step) INTO v_may FROM steps
        WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'error';
        RAISE EXCEPTION 'order % is partly undone (a compensation failed): resubmit its failed compensation (step %), not action step %',
            p_order, v_may, p_step USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    WITH reset AS (
        UPDATE steps
        SET process_state = 'pending', failure_count = 0, locked_by = NULL, complete_by = NULL,
            available_at = now(), updated_at = clock_timestamp()
        WHERE order_id = p_order AND process_state = 'error' AND (coalesce(p_step, 0) = 0 OR step = p_step)
          AND (NOT v_undoing OR kind = 'compensation')
        RETURNING step, attempt, kind
    ), hist AS (
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT p_order, step, 'error', 'pending', attempt, v_actor, 'operator resubmit' FROM reset
    )
    SELECT array_agg(step ORDER BY step), bool_or(kind = 'compensation') INTO v_steps, v_compensation FROM reset;
    IF v_steps IS NULL THEN
        RAISE EXCEPTION 'order % has no step in error', p_order USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM order_transition(p_order, CASE WHEN v_compensation THEN 'compensating' ELSE 'processing' END,
                             NULL, v_actor, 'operator resubmit');
    PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema());
    RETURN QUERY SELECT unnest(v_steps);
END;
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION operator_resubmit(uuid, integer, text) SET search_path = %I, pg_temp', current_schema());
END;
$$;
