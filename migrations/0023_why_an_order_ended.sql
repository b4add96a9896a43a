-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Why an order ended, said to the application and the operator.
--
-- steps.last_answer is the last answer the step's service gave (its HTTP
-- status and a bounded, redacted excerpt of its body, or "no answer: …"
-- when none came): an agent sends it with a failed reply, and, when it
-- gives up retrying before complete_by, in a reply of its own that
-- changes nothing else. An ok reply clears it. It is shown wherever the
-- step's last error is, so that "complete_by passed" can be told apart:
-- slow (no answer in time), down (503, connection refused), refusing.
ALTER TABLE steps ADD COLUMN last_answer text;

-- apply_reply keeps a failed reply's last answer.
DROP FUNCTION apply_reply(uuid, integer, integer, boolean, jsonb, text, text, timestamptz, timestamptz, bigint, boolean);
CREATE FUNCTION apply_reply(
    p_order uuid, p_step integer, p_attempt integer, p_ok boolean, p_result jsonb, p_error text, p_actor text,
    p_started timestamptz, p_sent timestamptz, p_call_us bigint, p_fenced boolean, p_answer text,
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
        last_answer = CASE WHEN p_ok THEN NULL ELSE coalesce(NULLIF(p_answer, ''), last_answer) END,
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

-- The event that ends an order badly (failed, error) says why: the step
-- that failed (failed_step, its number in step), what happened to it
-- (reason: refused, when its service refused it; timed_out, when its
-- complete_by passed as often as it may; cancelled, when an operator
-- cancelled the order), the step's last error and its service's last
-- answer (detail), and the actions whose effects were undone (undone),
-- whose results the event still carries. p_undone_step is a compensation
-- the calling statement processed, which it cannot read back yet.
DROP FUNCTION status_event_body(uuid, text, integer, jsonb);
CREATE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer, p_more_results jsonb, p_undone_step integer)
RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
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
    SELECT coalesce(jsonb_object_agg(name, result), '{}'::jsonb) INTO v_results
    FROM steps WHERE order_id = p_order_id AND kind = 'action' AND result IS NOT NULL;
    v_results := v_results || coalesce(p_more_results, '{}'::jsonb);
    IF v_results <> '{}'::jsonb THEN
        IF octet_length(v_results::text) <= 32768 THEN
            v_body := v_body || jsonb_build_object('results', v_results);
        ELSE
            v_body := v_body || jsonb_build_object('results_truncated', true);
        END IF;
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

    SELECT jsonb_agg(a.name ORDER BY a.step) INTO v_undone
    FROM steps c JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
    WHERE c.order_id = p_order_id AND c.kind = 'compensation'
      AND (c.process_state = 'processed' OR c.step = p_undone_step);
    IF v_undone IS NOT NULL THEN
        v_body := v_body || jsonb_build_object('undone', v_undone);
    END IF;
    RETURN v_body;
END;
$$;

-- The three-argument form stays one SQL expression (inlined into the
-- statements that call it) for the events that carry no results.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer) RETURNS jsonb
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_status IN ('completed', 'failed', 'error')
        THEN status_event_body(p_order_id, p_status, p_step, NULL, NULL)
        ELSE jsonb_build_object(
            'schema_version', 1,
            'order_id', p_order_id,
            'status', p_status,
            'step', p_step,
            'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    END
$$;

-- The scheduler and the supervisor end orders, and status_event_body
-- reads the history for whether an operator's cancel began the undoing.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT SELECT ON transitions TO sas_scheduler';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        EXECUTE 'GRANT SELECT ON transitions TO sas_supervisor';
    END IF;
END;
$$;
