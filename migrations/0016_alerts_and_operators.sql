-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Operator alerts kept as rows, and operator actions recorded with an
-- identity that cannot be forged.
--
-- Alerts. An alert is written to the outbox (to be published to the
-- alerts exchange) and, in the same transaction, to alerts, where it stays
-- open until an operator acknowledges it: reading alerts never consumes
-- them (sasctl alerts list, tail). The outbox no longer keeps published
-- alerts: alerts is their record.
--
-- Operators. An operator's resubmit, cancel, acknowledgement or purge goes
-- through a SECURITY DEFINER function of this file: it records the
-- database login that called it (session_user: set by the server at
-- login, not by the client) as the actor, "operator:<login>", and in the
-- history's db_user column, with the name the operator gave as claimed_by
-- (a label, not a proof). The operator role no longer writes the tables
-- itself, so nothing else can write an operator's history.

CREATE TABLE alerts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the outbox message that publishes it: the same message_id on the wire
    message_id    uuid        NOT NULL UNIQUE,
    order_id      uuid        NOT NULL,
    step          integer,
    reason        text        NOT NULL,
    failure_count integer     NOT NULL,
    raised_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    raised_by     text        NOT NULL,
    acked_at      timestamptz,
    acked_by      text,     -- the database login that acknowledged it
    acked_as      text,     -- the name that login gave
    CHECK ((acked_at IS NULL) = (acked_by IS NULL))
);

CREATE INDEX alerts_open_idx ON alerts (id) WHERE acked_at IS NULL;
CREATE INDEX alerts_order_idx ON alerts (order_id);
CREATE INDEX alerts_raised_idx ON alerts (raised_at);

INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_at, raised_by)
SELECT message_id, order_id, (body->>'step')::integer, body->>'reason', (body->>'failure_count')::integer,
       created_at, 'unknown (raised before migration 0016)'
FROM outbox WHERE message_type = 'operator_alert'
ORDER BY created_at;
DELETE FROM outbox WHERE message_type = 'operator_alert' AND published_at IS NOT NULL;

DROP FUNCTION raise_alert(uuid, integer, text, integer);

CREATE FUNCTION raise_alert(p_order uuid, p_step integer, p_reason text, p_failure_count integer, p_actor text)
RETURNS void LANGUAGE sql AS $$
    WITH msg AS (
        INSERT INTO outbox (message_type, order_id, body)
        VALUES ('operator_alert', p_order, operator_alert_body(p_order, p_step, p_reason, p_failure_count))
        RETURNING message_id, body
    )
    INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_at, raised_by)
    SELECT message_id, p_order, p_step, p_reason, p_failure_count, (body->>'at')::timestamptz, p_actor FROM msg;
$$;

CREATE OR REPLACE FUNCTION step_failed(p_order uuid, p_step integer, p_actor text, p_reason text, p_failure_count integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_policy text;
    v_kind text;
BEGIN
    SELECT status, failure_policy INTO v_status, v_policy FROM orders WHERE order_id = p_order FOR UPDATE;
    SELECT kind INTO v_kind FROM steps WHERE order_id = p_order AND step = p_step;
    IF v_kind = 'compensation' THEN
        IF v_status <> 'compensating' THEN
            RETURN v_status;
        END IF;
        PERFORM order_transition(p_order, 'error', p_step, p_actor,
            'compensation step ' || p_step || ' failed: ' || p_reason);
        PERFORM raise_alert(p_order, p_step, 'compensation failed, the order is partly undone: ' || p_reason, p_failure_count, p_actor);
        RETURN 'error';
    END IF;
    IF v_status NOT IN ('received', 'processing') THEN
        RETURN v_status;
    END IF;
    IF v_policy = 'hold' THEN
        PERFORM order_transition(p_order, 'error', p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
        PERFORM raise_alert(p_order, p_step, p_reason, p_failure_count, p_actor);
        RETURN 'error';
    END IF;
    RETURN begin_compensation(p_order, p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
END;
$$;

-- Who did it. Both are NULL for the services' own changes. Inside an
-- operator function (sas.operator_action set for the transaction) every
-- history row takes the session's login, which the client cannot choose,
-- and the name the operator gave.
ALTER TABLE transitions
    ADD COLUMN db_user text DEFAULT (CASE WHEN current_setting('sas.operator_action', true) = 'on' THEN session_user::text END),
    ADD COLUMN claimed_by text DEFAULT nullif(current_setting('sas.claimed_by', true), '');

-- operator_begin marks the transaction as an operator's action and
-- returns the actor to record.
CREATE FUNCTION operator_begin(p_claimed text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('sas.operator_action', 'on', true);
    PERFORM set_config('sas.claimed_by', coalesce(left(p_claimed, 100), ''), true);
    RETURN 'operator:' || session_user;
END;
$$;

-- operator_resubmit puts an order held in error back to work: the step in
-- error (or p_step, which must be in error) goes back to pending with
-- failure_count 0, and the order to processing (compensating, when the
-- step is a compensation). Returns the steps reset.
CREATE FUNCTION operator_resubmit(p_order uuid, p_step integer, p_claimed text)
RETURNS SETOF integer LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_actor text := operator_begin(p_claimed);
    v_status text;
    v_state text;
    v_last integer;
    v_steps integer[];
    v_compensation boolean;
BEGIN
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % not found', p_order USING ERRCODE = 'no_data_found';
    END IF;
    IF p_step IS NOT NULL AND p_step <> 0 THEN
        SELECT process_state INTO v_state FROM steps WHERE order_id = p_order AND step = p_step;
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
    WITH reset AS (
        UPDATE steps
        SET process_state = 'pending', failure_count = 0, locked_by = NULL, complete_by = NULL,
            available_at = now(), updated_at = clock_timestamp()
        WHERE order_id = p_order AND process_state = 'error' AND (coalesce(p_step, 0) = 0 OR step = p_step)
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

-- operator_cancel ends an order that has not ended (received, processing,
-- or held in error with no compensation failed), whatever its policy: its
-- unfinished actions are cancelled and the attempted ones compensated.
-- Returns the order's new status (compensating, or failed when nothing was
-- attempted).
CREATE FUNCTION operator_cancel(p_order uuid, p_claimed text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
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
$$;

-- ack_alert acknowledges an open alert for the session's login. Returns
-- when and by whom it was acknowledged, and whether it already was.
CREATE FUNCTION ack_alert(p_id bigint, p_claimed text, OUT acked_at timestamptz, OUT acked_by text, OUT acked_as text, OUT already boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
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
$$;

-- purge_ended_orders deletes up to p_limit orders that ended (completed or
-- failed; p_statuses may narrow it) before now() - p_older_than, with their
-- steps, history and alerts. Never an order that has not ended, and never
-- one held in error (an operator must decide on it first). Orders whose
-- rows another transaction holds are skipped. Returns how many rows of
-- each table it deleted.
CREATE FUNCTION purge_ended_orders(p_older_than interval, p_statuses text[], p_limit integer,
    OUT orders_deleted bigint, OUT steps_deleted bigint, OUT transitions_deleted bigint, OUT alerts_deleted bigint)
LANGUAGE plpgsql SECURITY DEFINER AS $$
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
        WHERE created_at < now() - p_older_than AND updated_at < now() - p_older_than AND status = ANY(p_statuses)
        ORDER BY created_at
        LIMIT p_limit
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
$$;

-- Privileges. The functions run as their owner (the migrating user) on
-- this schema only, and only the roles named may call them.
DO $$
DECLARE
    v_schema text := current_schema();
    v_fn text;
BEGIN
    FOREACH v_fn IN ARRAY ARRAY['operator_resubmit(uuid, integer, text)', 'operator_cancel(uuid, text)',
                                'ack_alert(bigint, text)', 'purge_ended_orders(interval, text[], integer)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', v_fn, v_schema);
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        EXECUTE 'REVOKE INSERT ON transitions, outbox FROM sas_operator';
        EXECUTE 'REVOKE UPDATE ON orders, steps FROM sas_operator';
        EXECUTE 'GRANT SELECT ON alerts TO sas_operator';
        FOREACH v_fn IN ARRAY ARRAY['operator_resubmit(uuid, integer, text)', 'operator_cancel(uuid, text)',
                                    'ack_alert(bigint, text)', 'purge_ended_orders(interval, text[], integer)'] LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO sas_operator', v_fn);
        END LOOP;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        EXECUTE 'GRANT SELECT, INSERT ON alerts TO sas_supervisor';
        EXECUTE 'GRANT EXECUTE ON FUNCTION purge_ended_orders(interval, text[], integer) TO sas_supervisor';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT INSERT ON alerts TO sas_scheduler';
    END IF;
    FOREACH v_fn IN ARRAY ARRAY['sas_scheduler', 'sas_supervisor'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_fn) THEN
            EXECUTE format('GRANT USAGE ON SEQUENCE alerts_id_seq TO %I', v_fn);
        END IF;
    END LOOP;
END;
$$;
