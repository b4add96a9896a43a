-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Fewer round trips and cheaper claims on the hot path.
--
-- apply_reply applies an agent's reply in one call: the fenced update of
-- the step (current attempt, still processing, complete_by not passed on
-- the database clock), its history entry, the agent's timings, and the
-- order moving on (step_processed) or reacting to the failure
-- (step_failed). applied is false when the fence matched nothing; the
-- caller then explains the stale reply and changes nothing.
-- p_fenced is always true in production builds; the fault suite's negative
-- control turns the fence off to prove that its checks would notice.
CREATE FUNCTION apply_reply(
    p_order uuid, p_step integer, p_attempt integer, p_ok boolean, p_result jsonb, p_error text, p_actor text,
    p_started timestamptz, p_sent timestamptz, p_call_us bigint, p_fenced boolean,
    OUT applied boolean, OUT step_state text, OUT step_name text, OUT took_s double precision,
    OUT next_step integer, OUT order_status text, OUT order_took_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    v_failures integer;
    v_attempt integer;
BEGIN
    applied := false;
    next_step := 0;
    order_status := '';
    took_s := 0;
    order_took_s := 0;
    UPDATE steps
    SET process_state = CASE WHEN p_ok THEN 'processed' ELSE 'error' END,
        result = p_result,
        last_error = NULLIF(p_error, ''),
        agent_started_at = p_started, agent_sent_at = p_sent, agent_call_us = NULLIF(p_call_us, 0),
        updated_at = now()
    WHERE order_id = p_order AND step = p_step
      AND (NOT p_fenced OR (attempt = p_attempt AND process_state = 'processing' AND complete_by >= now()))
    RETURNING process_state, failure_count, name, attempt,
              coalesce(extract(epoch FROM now() - (complete_by - timeout)), 0)
    INTO step_state, v_failures, step_name, v_attempt, took_s;
    IF NOT FOUND THEN
        step_state := '';
        step_name := '';
        took_s := 0;
        RETURN;
    END IF;
    applied := true;
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    VALUES (p_order, p_step, 'processing', step_state, v_attempt, p_actor,
            CASE WHEN p_ok THEN 'agent replied ok' ELSE 'agent replied failed: ' || p_error END);
    IF p_ok THEN
        SELECT sp.next_step, sp.order_status INTO next_step, order_status FROM step_processed(p_order, p_step, p_actor) sp;
    ELSE
        order_status := step_failed(p_order, p_step, p_actor, 'agent replied failed: ' || p_error, v_failures);
    END IF;
    IF order_status IN ('completed', 'failed', 'error') THEN
        SELECT extract(epoch FROM now() - created_at) INTO order_took_s FROM orders WHERE order_id = p_order;
    END IF;
END;
$$;

-- Claims are per agent kind: with the kind first in the pending index a
-- claim reads only its kind's due steps instead of stepping over every
-- other kind's.
CREATE INDEX steps_pending_agent_idx ON steps (agent, priority DESC, available_at, order_id, step)
    WHERE process_state = 'pending';
DROP INDEX steps_pending_idx;
