-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- The web console (cmd/console).
--
-- Its database login is a member of sas_console: it reads the state
-- tables and calls the operator functions of migration 0016, nothing more.
-- It writes no table itself: a resubmit, a cancel or an acknowledgement
-- goes through those SECURITY DEFINER functions, which record the
-- console's login (session_user) and the console user's name.
--
-- operator_actions records what an operator did outside an order's
-- history: the console's dead-letter requeues and discards (the messages
-- live in RabbitMQ, not here). Its rows are written only through
-- record_operator_action, which takes the login from the session.

CREATE TABLE operator_actions (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    db_user    text        NOT NULL DEFAULT session_user,
    claimed_by text        NOT NULL CHECK (length(claimed_by) BETWEEN 1 AND 100),
    action     text        NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    target     text        NOT NULL CHECK (length(target) <= 512),
    detail     text        NOT NULL DEFAULT '' CHECK (length(detail) <= 2048)
);

CREATE FUNCTION record_operator_action(p_action text, p_target text, p_detail text, p_claimed text)
RETURNS bigint LANGUAGE sql SECURITY DEFINER AS $$
    INSERT INTO operator_actions (db_user, claimed_by, action, target, detail)
    VALUES (session_user, left(p_claimed, 100), p_action, left(p_target, 512), left(coalesce(p_detail, ''), 2048))
    RETURNING id;
$$;

DO $$
DECLARE
    v_schema text := current_schema();
    v_can_create boolean;
    v_fn text;
BEGIN
    EXECUTE format('ALTER FUNCTION record_operator_action(text, text, text, text) SET search_path = %I, pg_temp', v_schema);
    REVOKE ALL ON FUNCTION record_operator_action(text, text, text, text) FROM PUBLIC;
    SELECT rolsuper OR rolcreaterole INTO v_can_create FROM pg_roles WHERE rolname = current_user;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') AND v_can_create THEN
        BEGIN
            CREATE ROLE sas_console NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created meanwhile by a migration of another schema
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO sas_console', v_schema);
        GRANT SELECT ON schema_migrations, orders, steps, transitions, alerts, leases, workflow_versions,
            operator_actions TO sas_console;
        FOREACH v_fn IN ARRAY ARRAY['operator_resubmit(uuid, integer, text)', 'operator_cancel(uuid, text)',
                                    'ack_alert(bigint, text)', 'record_operator_action(text, text, text, text)'] LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO sas_console', v_fn);
        END LOOP;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT ON operator_actions TO sas_operator;
        GRANT EXECUTE ON FUNCTION record_operator_action(text, text, text, text) TO sas_operator;
    END IF;
END;
$$;
