-- Replies: an agent's answer applied, fenced, and a service's 202 held open.

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
        updated_at = clock_timestamp(), moves = moves + 1, moved_by = p_actor, moved_for = p_attempt,
        moved_why = CASE WHEN p_ok AND agent = '' THEN 'its timer ended'
                         WHEN p_ok THEN 'agent replied ok' ELSE 'agent replied failed: ' || p_error END
    WHERE order_id = p_order AND step = p_step
      AND (NOT p_fenced OR (attempt = p_attempt AND process_state = 'processing' AND complete_by >= clock_timestamp()))
    RETURNING process_state, failure_count, name,
              coalesce(extract(epoch FROM clock_timestamp()
                               - CASE WHEN held_attempt = attempt THEN held_since ELSE complete_by - timeout END), 0)
    INTO step_state, v_failures, step_name, took_s;
    IF NOT FOUND THEN
        step_state := '';
        step_name := '';
        took_s := 0;
        RETURN;
    END IF;
    applied := true;
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
    v_until timestamptz;
BEGIN
    applied := false;
    SELECT s.held_attempt IS DISTINCT FROM s.attempt,
           CASE WHEN s.held_attempt = s.attempt THEN s.held_since ELSE s.complete_by - s.timeout END
    INTO v_first, v_since
    FROM steps s
    WHERE s.order_id = p_order AND s.step = p_step AND s.attempt = p_attempt
      AND s.process_state = 'processing' AND s.complete_by >= clock_timestamp()
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT greatest(s.complete_by,
                    least(clock_timestamp() + CASE WHEN p_hold_ms > 0 THEN make_interval(secs => p_hold_ms::float8 / 1000)
                                                   ELSE s.timeout END,
                          v_since + make_interval(secs => coalesce((s.spec->>'max_duration_ms')::float8, 3600000) / 1000)))
    INTO v_until
    FROM steps s WHERE s.order_id = p_order AND s.step = p_step;
    -- The first hold of an attempt is a move (processing to processing).
    UPDATE steps s
    SET held_attempt = p_attempt, held_since = v_since, complete_by = v_until,
        last_answer = coalesce(NULLIF(p_answer, ''), s.last_answer),
        updated_at = clock_timestamp(),
        moves = s.moves + CASE WHEN v_first THEN 1 ELSE 0 END,
        moved_by = CASE WHEN v_first THEN p_actor ELSE s.moved_by END,
        moved_why = CASE WHEN v_first
                         THEN CASE WHEN p_answer IS NULL OR p_answer = '' THEN 'the service sent a heartbeat'
                                   ELSE 'the service accepted the call (' || p_answer || ')' END
                              || '; waiting for its callback until '
                              || to_char(v_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                         ELSE s.moved_why END
    WHERE s.order_id = p_order AND s.step = p_step
    RETURNING s.complete_by INTO complete_by;
    applied := true;
END;
$function$;
