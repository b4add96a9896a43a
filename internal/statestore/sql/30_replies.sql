-- Replies: an agent's answer applied, fenced, and a service's 202 held open.

-- apply_reply: applies one agent reply, fenced by attempt, state and
-- complete_by: the step's new state and history, then step_processed or
-- step_failed. Failed replies come here; ok replies come here only when
-- their batched statement (statestore/reply.go) could not apply them.
-- When the reply ended the order, order_took_s and order_namespace say
-- how long it ran and whose it was. (Dropped first: its results changed
-- with order_namespace, which CREATE OR REPLACE cannot do; this file is
-- applied in one transaction.)
DROP FUNCTION IF EXISTS apply_reply(uuid, integer, integer, boolean, jsonb, text, text, timestamp with time zone, timestamp with time zone, bigint, boolean, text);
CREATE OR REPLACE FUNCTION apply_reply(p_order uuid, p_step integer, p_attempt integer, p_ok boolean, p_result jsonb, p_error text, p_actor text, p_started timestamp with time zone, p_sent timestamp with time zone, p_call_us bigint, p_fenced boolean, p_answer text, OUT applied boolean, OUT step_state text, OUT step_name text, OUT took_s double precision, OUT next_step integer, OUT order_status text, OUT order_took_s double precision, OUT order_namespace text)
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
    order_namespace := '';
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
        SELECT extract(epoch FROM clock_timestamp() - created_at), namespace INTO order_took_s, order_namespace FROM orders WHERE order_id = p_order;
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

-- step_token_mac: the MAC a step token carries (internal/steptoken): the
-- first 16 bytes of HMAC-SHA256 (RFC 2104) of p_body under this store's
-- key. Only the schedulers may read the key; step_callback, which runs as
-- the store's owner, calls this for the other entrances.
CREATE OR REPLACE FUNCTION step_token_mac(p_body text)
 RETURNS bytea
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    v_key bytea;
    v_ipad bytea;
    v_opad bytea;
BEGIN
    SELECT convert_to(k.key, 'UTF8') INTO v_key FROM step_token_key k WHERE k.id = 1;
    IF length(v_key) > 64 THEN
        v_key := sha256(v_key);
    END IF;
    v_key := v_key || decode(repeat('00', 64 - length(v_key)), 'hex');
    v_ipad := v_key;
    v_opad := v_key;
    FOR i IN 0..63 LOOP
        v_ipad := set_byte(v_ipad, i, get_byte(v_key, i) # 54);
        v_opad := set_byte(v_opad, i, get_byte(v_key, i) # 92);
    END LOOP;
    RETURN substring(sha256(v_opad || sha256(v_ipad || convert_to(p_body, 'UTF8'))) FROM 1 FOR 16);
END;
$function$;

-- step_token_read: the order, step and attempt a step token names when
-- this store's key made it (st1.ORDER.STEP.ATTEMPT.MAC, as steptoken.Mint
-- writes it); all NULL for any other text. The MACs are compared by their
-- hashes, so the time taken says nothing of how much of one matched.
CREATE OR REPLACE FUNCTION step_token_read(p_token text, OUT order_id uuid, OUT step integer, OUT attempt integer)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    v_body text;
    v_want text;
    v_step bigint;
    v_attempt bigint;
BEGIN
    IF p_token IS NULL OR length(p_token) > 120
       OR p_token !~ '^st1\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[0-9]{1,10}\.[0-9]{1,10}\.[A-Za-z0-9_-]{22}$' THEN
        RETURN;
    END IF;
    v_body := left(p_token, length(p_token) - 23);
    v_want := rtrim(translate(encode(step_token_mac(v_body), 'base64'), '+/', '-_'), '=');
    IF sha256(convert_to(right(p_token, 22), 'UTF8')) <> sha256(convert_to(v_want, 'UTF8')) THEN
        RETURN;
    END IF;
    v_step := split_part(v_body, '.', 3)::bigint;
    v_attempt := split_part(v_body, '.', 4)::bigint;
    IF v_step NOT BETWEEN 1 AND 2147483647 OR v_attempt NOT BETWEEN 1 AND 2147483647 THEN
        RETURN;
    END IF;
    order_id := split_part(v_body, '.', 2)::uuid;
    step := v_step;
    attempt := v_attempt;
END;
$function$;

-- step_callback: one door for a step's callback from every entrance (the
-- signals queue, the HTTP API, sasctl): the service of a step that
-- answered its call 202 Accepted completes it (p_result, a JSON object or
-- NULL), fails it (p_error) or holds it open (heartbeat), presenting the
-- step's token. The token is read here, with the key only the store's
-- owner and the schedulers may read. A complete or fail is recorded among
-- the order's signals under p_signal_id (default callback:STEP.ATTEMPT:NAME)
-- and applied as the attempt's reply, fenced as one, in one transaction:
-- the same id again is a duplicate that changes nothing. outcome is
-- applied, duplicate, invalid_token (the token is not one this store's
-- key made) or stale_token (its attempt no longer runs; detail says why),
-- and nothing changes unless it is applied. p_notify wakes the schedulers
-- and the relay (an entrance that is not a scheduler).
CREATE OR REPLACE FUNCTION step_callback(p_token text, p_name text, p_signal_id text, p_result jsonb, p_error text, p_actor text, p_fenced boolean, p_notify boolean, OUT outcome text, OUT order_id uuid, OUT step integer, OUT attempt integer, OUT complete_by timestamp with time zone, OUT order_status text, OUT detail text)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_order uuid;
    v_step integer;
    v_attempt integer;
    v_applied boolean := false;
    v_current integer;
    v_state text;
    v_in_time boolean;
BEGIN
    outcome := 'invalid_token';
    order_status := '';
    detail := '';
    SELECT t.order_id, t.step, t.attempt INTO v_order, v_step, v_attempt FROM step_token_read(p_token) t;
    IF v_order IS NULL THEN
        detail := 'the token is not a step token this deployment made (the Sas-Step-Token of a call)';
        RETURN;
    END IF;
    order_id := v_order;
    step := v_step;
    attempt := v_attempt;
    IF p_name = 'heartbeat' THEN
        SELECT h.applied, h.complete_by INTO v_applied, complete_by FROM step_hold(v_order, v_step, v_attempt, 0, NULL, p_actor) h;
    ELSIF p_name IN ('complete', 'fail') THEN
        BEGIN
            INSERT INTO signals (order_id, signal_id, name, payload, actor, step)
            VALUES (v_order, coalesce(NULLIF(p_signal_id, ''), format('callback:%s.%s:%s', v_step, v_attempt, p_name)),
                    p_name, p_result, p_actor, v_step)
            ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                outcome := 'duplicate';
                detail := format('this %s of step %s attempt %s of order %s was received before: nothing changed', p_name, v_step, v_attempt, v_order);
                RETURN;
            END IF;
            SELECT r.applied, r.order_status INTO v_applied, order_status
            FROM apply_reply(v_order, v_step, v_attempt, p_name = 'complete', p_result, coalesce(p_error, ''), p_actor,
                             NULL, NULL, 0, p_fenced, NULL) r;
            IF NOT v_applied THEN
                RAISE EXCEPTION 'the attempt no longer runs' USING ERRCODE = 'SASNA';
            END IF;
        EXCEPTION WHEN SQLSTATE 'SASNA' THEN
            v_applied := false;
            order_status := '';
        END;
    ELSE
        RAISE EXCEPTION 'a callback is complete, fail or heartbeat, not %', left(p_name, 40) USING ERRCODE = '22023';
    END IF;
    IF v_applied THEN
        outcome := 'applied';
        IF p_notify THEN
            PERFORM pg_notify('sas_pending', current_schema()), pg_notify('sas_outbox', current_schema());
        END IF;
        RETURN;
    END IF;
    outcome := 'stale_token';
    complete_by := NULL;
    SELECT s.attempt, s.process_state, coalesce(s.complete_by >= clock_timestamp(), false)
    INTO v_current, v_state, v_in_time
    FROM steps s WHERE s.order_id = v_order AND s.step = v_step;
    detail := format('step %s attempt %s of order %s no longer runs (%s): the callback changed nothing', v_step, v_attempt, v_order,
                     CASE WHEN v_state IS NULL THEN 'no such step'
                          WHEN v_current <> v_attempt THEN format('attempt superseded, current attempt %s', v_current)
                          WHEN v_state <> 'processing' THEN 'step is ' || v_state
                          WHEN NOT v_in_time THEN 'complete_by has passed'
                          ELSE 'step changed concurrently' END);
END;
$function$;
