-- Orders: their status, the events and alerts they send.

-- order_transition: moves an order to a new status through the door
-- (orders_moved writes its history row), with its status event in the
-- outbox.
CREATE OR REPLACE FUNCTION order_transition(p_order uuid, p_to text, p_step integer, p_actor text, p_reason text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_reply_to text;
BEGIN
    SELECT reply_to INTO v_reply_to FROM orders WHERE order_id = p_order;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % does not exist', p_order USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE orders SET status = p_to, updated_at = now(), moves = moves + 1, moved_by = p_actor, moved_why = p_reason
    WHERE order_id = p_order;
    IF v_reply_to IS NOT NULL OR status_heard(p_to) THEN
        INSERT INTO outbox (message_type, order_id, reply_to, body)
        VALUES ('status_event', p_order, v_reply_to, status_event_body(p_order, p_to, p_step));
    END IF;
END;
$function$;

-- status_heard: whether a status event of this status is to be written
-- for an order without a reply_to: always for one that ends an order; for
-- a progress event (received, processing, compensating) unless the relay
-- found lately that no queue is bound for it (status_routes, 0036).
-- PL/pgSQL, whose plan a session keeps: the claim and the submitter's
-- insert call it, and an SQL function with a subquery is not inlined but
-- planned again at every execution of the statement that calls it.
CREATE OR REPLACE FUNCTION status_heard(p_status text)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN p_status NOT IN ('received', 'processing', 'compensating')
        OR NOT EXISTS (SELECT 1 FROM status_routes WHERE status = p_status AND unheard_until > now());
END;
$function$;

-- await_writers: waits until every transaction that held a write lock on
-- p_table when it was called has ended, for p_timeout at most (false:
-- some were still open then). statestore.HearStatusEvents and
-- HearStepEvents call it on orders and steps once they cleared a mark: a
-- writer open then may have read the mark before it was cleared, written
-- no event, and commit after a listener read the store; a writer takes
-- its table's lock before its statement's snapshot, so every later one
-- reads the mark cleared. It reads pg_locks, and so neither holds writers
-- back nor waits for a vacuum, as a lock on the table would.
CREATE OR REPLACE FUNCTION await_writers(p_table regclass, p_timeout interval)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_writers text[];
    v_until timestamptz := clock_timestamp() + p_timeout;
BEGIN
    SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') INTO v_writers
    FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.relation = p_table AND l.mode = 'RowExclusiveLock' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.pid <> pg_backend_pid();
    WHILE EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'virtualxid' AND l.virtualxid = ANY (v_writers)) LOOP
        IF clock_timestamp() > v_until THEN
            RETURN false;
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    RETURN true;
END;
$function$;

-- status_event_body: the body of a status event, as the outbox publishes
-- it; an ended order's event comes from the five-argument form below.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer)
 RETURNS jsonb
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN p_status IN ('completed', 'failed', 'error')
        THEN status_event_body(p_order_id, p_status, p_step, NULL, NULL)
        ELSE jsonb_build_object(
            'schema_version', 1,
            'order_id', p_order_id,
            'status', p_status,
            'step', p_step,
            'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    END
$function$;

-- status_event_body: the body of a status event with what an ended order
-- says: its results, the step that failed, the reason, what was undone.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer, p_more_results jsonb, p_undone_step integer)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
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
    v_deadline  text;
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
    SELECT coalesce(jsonb_object_agg(coalesce(spec->>'id', name), result), '{}'::jsonb) INTO v_results
    FROM steps WHERE order_id = p_order_id AND kind = 'action' AND result IS NOT NULL AND parent IS NULL;
    v_results := v_results || coalesce(p_more_results, '{}'::jsonb);
    IF v_results <> '{}'::jsonb THEN
        IF octet_length(v_results::text) <= 32768 THEN
            v_body := v_body || jsonb_build_object('results', v_results);
        ELSE
            v_body := v_body || jsonb_build_object('results_truncated', true);
        END IF;
    END IF;
    -- In a graph, the steps whose when was false.
    SELECT jsonb_agg(coalesce(spec->>'id', name) ORDER BY step) INTO v_undone
    FROM steps WHERE order_id = p_order_id AND kind = 'action' AND process_state = 'skipped';
    IF v_undone IS NOT NULL THEN
        v_body := v_body || jsonb_build_object('skipped', v_undone);
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

    -- The order's deadline, when it is what ended or held it.
    SELECT t.reason INTO v_deadline FROM transitions t
    WHERE t.order_id = p_order_id AND t.step IS NULL AND t.to_state IN ('compensating', 'failed', 'error') AND t.reason LIKE 'deadline passed%'
    ORDER BY t.id DESC LIMIT 1;

    IF v_deadline IS NOT NULL THEN
        v_reason := 'deadline';
        v_detail := substr(v_deadline, length('deadline passed: ') + 1);
        IF v_step IS NOT NULL AND v_error NOT LIKE 'deadline passed%' THEN
            v_detail := v_detail || '; ' || v_name || ' (step ' || v_step || ') had failed' || coalesce(': ' || v_error, '');
        END IF;
    ELSIF v_step IS NOT NULL AND NOT (p_status = 'failed' AND v_cancelled IS NOT NULL) THEN
        -- A step whose time ran out (complete_by) and a wait that no
        -- signal ended in its time (fire_timers) timed out; every other
        -- failure was a refusal.
        v_reason := CASE WHEN v_error LIKE 'complete_by passed%' OR v_error LIKE 'no signal % came within its timeout of %'
                         THEN 'timed_out' ELSE 'refused' END;
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

    -- Each action once (the instances of a for_each step are one), in
    -- the order of the steps.
    SELECT jsonb_agg(u.name ORDER BY u.first) INTO v_undone FROM (
        SELECT coalesce(a.spec->>'id', a.name) AS name, min(a.step) AS first
        FROM steps c JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order_id AND c.kind = 'compensation'
          AND (c.process_state = 'processed' OR c.step = p_undone_step)
        GROUP BY 1) u;
    IF v_undone IS NOT NULL THEN
        v_body := v_body || jsonb_build_object('undone', v_undone);
    END IF;
    RETURN v_body;
END;
$function$;

-- operator_alert_body: the body of an operator alert, with its order's
-- namespace when that is not the default one (a paging integration
-- routes by it; the default's body is as it was before namespaces).
CREATE OR REPLACE FUNCTION operator_alert_body(p_order_id uuid, p_step integer, p_reason text, p_failure_count integer)
 RETURNS jsonb
 LANGUAGE sql
AS $function$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'step', p_step,
        'reason', p_reason,
        'failure_count', p_failure_count,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        || coalesce((SELECT jsonb_build_object('namespace', o.namespace) FROM orders o
                     WHERE o.order_id = p_order_id AND o.namespace <> 'default'), '{}'::jsonb)
$function$;

-- raise_alert: records an operator alert and queues it for publishing.
CREATE OR REPLACE FUNCTION raise_alert(p_order uuid, p_step integer, p_reason text, p_failure_count integer, p_actor text)
 RETURNS void
 LANGUAGE sql
AS $function$
    WITH msg AS (
        INSERT INTO outbox (message_type, order_id, body)
        VALUES ('operator_alert', p_order, operator_alert_body(p_order, p_step, p_reason, p_failure_count))
        RETURNING message_id, body
    )
    INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_at, raised_by)
    SELECT message_id, p_order, p_step, p_reason, p_failure_count, (body->>'at')::timestamptz, p_actor FROM msg;
$function$;

-- namespace_quotas_read: what namespace row n's payload and rate quotas
-- say of an order of p_bytes payload bytes at p_now: '' or the quota
-- that refuses ('payload_bytes' first, then 'submit_rate'), what to say
-- and in how many milliseconds to try again, and the rate's bucket then
-- (tokens, NULL without a rate: a bucket of max_submit_burst, default
-- the rate rounded up, refilled at max_submit_rate a second). It reads
-- nothing but n: namespace_precheck and namespace_admit share it.
CREATE OR REPLACE FUNCTION namespace_quotas_read(n namespaces, p_bytes integer, p_now timestamptz,
                                                 OUT quota text, OUT detail text, OUT retry_ms integer, OUT tokens double precision)
 RETURNS record
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    v_burst double precision;
BEGIN
    quota := '';
    detail := '';
    retry_ms := 0;
    IF n.max_submit_rate IS NOT NULL THEN
        v_burst := coalesce(n.max_submit_burst, ceil(n.max_submit_rate));
        tokens := least(v_burst, coalesce(n.rate_tokens, v_burst)
                                 + n.max_submit_rate * greatest(extract(epoch FROM p_now - coalesce(n.rate_at, p_now)), 0));
    END IF;
    IF n.max_payload_bytes IS NOT NULL AND p_bytes > n.max_payload_bytes THEN
        quota := 'payload_bytes';
        detail := format('namespace %s takes payloads of at most %s bytes; this one has %s', n.name, n.max_payload_bytes, p_bytes);
    ELSIF tokens < 1 THEN
        quota := 'submit_rate';
        detail := format('namespace %s submits at most %s orders a second', n.name, n.max_submit_rate);
        retry_ms := least(ceil(1000 * (1 - tokens) / n.max_submit_rate), 86400000)::integer; -- a day at most
    END IF;
END;
$function$;

-- namespace_precheck: whether an order of p_bytes payload bytes to
-- namespace p_ns would be refused by its quotas as they read now, without
-- waiting for the namespace's row or changing it: a submit it refuses is
-- not written at all (a noisy tenant's refused orders cost a read, not an
-- insert rolled back). It reads the payload's size and the submit rate
-- (namespace_quotas_read); the orders in flight are namespace_admit's to
-- count. Answers as namespace_admit does; '' does not admit
-- (namespace_admit, after the write, has the last word).
CREATE OR REPLACE FUNCTION namespace_precheck(p_ns text, p_bytes integer, OUT quota text, OUT detail text, OUT retry_ms integer)
 RETURNS record
 LANGUAGE sql
 STABLE
 SECURITY DEFINER
AS $function$
    SELECT coalesce(q.quota, ''), coalesce(q.detail, ''), coalesce(q.retry_ms, 0)
    FROM (SELECT 1) one
    LEFT JOIN namespaces n ON n.name = p_ns
    LEFT JOIN LATERAL namespace_quotas_read(n, p_bytes, clock_timestamp()) q ON n.name IS NOT NULL
$function$;

-- namespace_admit: whether namespace p_ns, whose order of p_bytes payload
-- bytes the calling transaction has just written, may keep it by the
-- namespace's quotas (a NULL quota is none): the size of a payload, the
-- orders in flight (this one among them) and the rate of submits (a
-- bucket of max_submit_burst, default the rate rounded up, refilled at
-- max_submit_rate a second on the database clock; the order takes one).
-- It locks the namespace's row until the transaction ends, so admissions
-- to one namespace are one at a time across every replica and each counts
-- the orders the ones before it wrote. The orders in flight are counted
-- when the bound (in_flight_bound: the last count plus the admissions
-- since; cleared by any other writer of the namespace's orders) leaves no
-- room or is a second old, so that a backlog is not read at every
-- admission. It answers '' or the quota that
-- refuses ('payload_bytes', 'in_flight', 'submit_rate'), what to say, and
-- in how many milliseconds to try again (0: not as it is); a refused
-- order is for the caller to roll back.
CREATE OR REPLACE FUNCTION namespace_admit(p_ns text, p_bytes integer, OUT quota text, OUT detail text, OUT retry_ms integer)
 RETURNS record
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    n namespaces%ROWTYPE;
    v_now timestamptz := clock_timestamp();
    v_tokens double precision;
    v_open integer;
    v_counted timestamptz;
    r record;
BEGIN
    quota := '';
    detail := '';
    retry_ms := 0;
    SELECT * INTO n FROM namespaces WHERE name = p_ns FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no namespace %', p_ns USING ERRCODE = '22023';
    END IF;
    r := namespace_quotas_read(n, p_bytes, v_now);
    IF r.quota = 'payload_bytes' THEN
        quota := r.quota;
        detail := r.detail;
        RETURN;
    END IF;
    IF n.max_in_flight IS NOT NULL THEN
        IF n.in_flight_bound IS NULL OR n.counted_at < v_now - interval '1 second' OR n.in_flight_bound + 1 > n.max_in_flight THEN
            -- (this order, written by the calling transaction, among them)
            SELECT count(*) INTO v_open FROM (
                SELECT 1 FROM orders o
                WHERE o.namespace = p_ns AND o.namespace <> 'default' AND o.status IN ('received', 'processing', 'compensating', 'error')
                LIMIT n.max_in_flight + 1) open;
            v_counted := v_now;
        ELSE
            v_open := n.in_flight_bound + 1;
            v_counted := n.counted_at;
        END IF;
        IF v_open > n.max_in_flight THEN
            quota := 'in_flight';
            detail := format('namespace %s has %s orders in flight, its quota', p_ns, n.max_in_flight);
            retry_ms := 1000;
            RETURN;
        END IF;
    END IF;
    IF r.quota = 'submit_rate' THEN
        quota := r.quota;
        detail := r.detail;
        retry_ms := r.retry_ms;
        RETURN;
    END IF;
    v_tokens := r.tokens;
    IF v_tokens IS NOT NULL OR v_open IS NOT NULL THEN
        UPDATE namespaces SET rate_tokens = CASE WHEN v_tokens IS NULL THEN rate_tokens ELSE v_tokens - 1 END,
                              rate_at = CASE WHEN v_tokens IS NULL THEN rate_at ELSE v_now END,
                              in_flight_bound = v_open, counted_at = v_counted
        WHERE name = p_ns;
    END IF;
END;
$function$;
