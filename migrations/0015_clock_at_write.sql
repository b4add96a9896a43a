-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- The history and the fence read the clock when they write, not when
-- their transaction began.
--
-- now() is the start of the transaction. A statement that waited for a
-- row lock (another session held an order's rows for 30 s) kept that
-- start time: the history recorded the apply 30 s before it committed, a
-- reply was applied although its step's complete_by had passed by the
-- time it was written, and the next step claimed with it got a deadline
-- already partly spent. Lock waits are now bounded (SAS_DB_LOCK_TIMEOUT),
-- and where a time decides or is recorded, it is clock_timestamp(): the
-- time of the write.
--
-- A statement judges a row when it reads it, before it waits for the
-- row's lock, and a row that was only locked (not changed) meanwhile is
-- not judged again: so apply_reply locks the step first and judges it
-- after, and the batched apply (statestore.ApplyRepliesClaiming) fails as
-- a whole, to be applied reply by reply through apply_reply, when it
-- finds it wrote a step whose complete_by had passed by then
-- (sas_refuse_late_apply).
--
-- A failed reply (the agent saw a permanent refusal) also counts as a
-- failure of its step: failure_count goes up by one, so that the alert it
-- raises says how many times the step failed.

ALTER TABLE transitions ALTER COLUMN at SET DEFAULT clock_timestamp();

CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer) RETURNS jsonb
LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'status', p_status,
        'step', p_step,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;

CREATE OR REPLACE FUNCTION operator_alert_body(p_order_id uuid, p_step integer, p_reason text, p_failure_count integer) RETURNS jsonb
LANGUAGE sql VOLATILE AS $$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'step', p_step,
        'reason', p_reason,
        'failure_count', p_failure_count,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;

CREATE OR REPLACE FUNCTION apply_reply(
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
    PERFORM 1 FROM steps WHERE order_id = p_order AND step = p_step FOR UPDATE;
    UPDATE steps
    SET process_state = CASE WHEN p_ok THEN 'processed' ELSE 'error' END,
        failure_count = CASE WHEN p_ok THEN failure_count ELSE failure_count + 1 END,
        result = p_result,
        last_error = NULLIF(p_error, ''),
        agent_started_at = p_started, agent_sent_at = p_sent, agent_call_us = NULLIF(p_call_us, 0),
        updated_at = clock_timestamp()
    WHERE order_id = p_order AND step = p_step
      AND (NOT p_fenced OR (attempt = p_attempt AND process_state = 'processing' AND complete_by >= clock_timestamp()))
    RETURNING process_state, failure_count, name, attempt,
              coalesce(extract(epoch FROM clock_timestamp() - (complete_by - timeout)), 0)
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
        SELECT extract(epoch FROM clock_timestamp() - created_at) INTO order_took_s FROM orders WHERE order_id = p_order;
    END IF;
END;
$$;

-- sas_refuse_late_apply fails the statement that calls it when late is
-- true: the batched apply calls it when it wrote a step whose complete_by
-- had passed by the time of the write (it waited for the row's lock).
CREATE FUNCTION sas_refuse_late_apply(late boolean) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF late THEN
        RAISE EXCEPTION 'a reply waited for a row lock past its complete_by; applying the batch reply by reply'
            USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN true;
END;
$$;
