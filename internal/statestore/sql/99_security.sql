-- Security: every SECURITY DEFINER function's search_path pinned.

-- Every SECURITY DEFINER function runs with its search_path pinned to the
-- schema it lives in (and pg_temp last), so that a caller's search_path
-- cannot put its own tables or functions in front of the state store's.
-- CREATE OR REPLACE resets the setting, so it is set again here.
DO $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN SELECT p.oid::regprocedure FROM pg_proc p
                WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', v_fn, current_schema());
    END LOOP;
END
$$;

-- step_callback is every entrance's door for a step's callback: run as
-- the store's owner (it reads the step tokens' key), called only by the
-- roles of the entrances (the schedulers for the signals queue, the API,
-- operators through sasctl).
DO $$
DECLARE
    v_role text;
BEGIN
    REVOKE EXECUTE ON FUNCTION step_callback(text, text, text, jsonb, text, text, boolean, boolean) FROM PUBLIC;
    FOREACH v_role IN ARRAY ARRAY['sas_scheduler', 'sas_api', 'sas_operator'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION step_callback(text, text, text, jsonb, text, text, boolean, boolean) TO %I', v_role);
        END IF;
    END LOOP;
END
$$;

-- Pause and resume: operators' doors, as cancel is.
DO $$
DECLARE
    v_role text;
    v_fn text;
BEGIN
    FOREACH v_fn IN ARRAY ARRAY['pause_order(uuid, text, text)', 'resume_order(uuid, text)', 'pause_workflow(text, text, text)',
                                'resume_workflow(text, text)', 'pause_kind(text, text, text)', 'resume_kind(text, text)',
                                'order_migrate(uuid, text, text, jsonb, jsonb, text, text)'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn);
        FOREACH v_role IN ARRAY ARRAY['sas_operator', 'sas_console', 'sas_api'] LOOP
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- purge_orders is retention's door, as purge_ended_orders, which calls it.
DO $$
DECLARE
    v_role text;
BEGIN
    REVOKE ALL ON FUNCTION purge_orders(uuid[], interval, text[]) FROM PUBLIC;
    FOREACH v_role IN ARRAY ARRAY['sas_operator', 'sas_supervisor'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION purge_orders(uuid[], interval, text[]) TO %I', v_role);
        END IF;
    END LOOP;
END
$$;

-- namespace_admit is the writers' door to a namespace's quotas: the roles
-- of the entrances that write orders of namespaces other than the default
-- (the API, the submitter) and operators'.
DO $$
DECLARE
    v_role text;
BEGIN
    REVOKE ALL ON FUNCTION namespace_admit(text, integer) FROM PUBLIC;
    REVOKE ALL ON FUNCTION namespace_precheck(text, integer) FROM PUBLIC;
    FOREACH v_role IN ARRAY ARRAY['sas_api', 'sas_submitter', 'sas_operator'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION namespace_admit(text, integer) TO %I', v_role);
            EXECUTE format('GRANT EXECUTE ON FUNCTION namespace_precheck(text, integer) TO %I', v_role);
        END IF;
    END LOOP;
END
$$;

-- A namespace's limits: operators' doors (they key the namespace's steps).
DO $$
DECLARE
    v_role text;
    v_fn text;
BEGIN
    FOREACH v_fn IN ARRAY ARRAY['namespace_limits_set(text, text, integer, double precision, integer, text, text)',
                                'namespace_limits_reset(text, text, text)'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn);
        FOREACH v_role IN ARRAY ARRAY['sas_operator', 'sas_console'] LOOP
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
                EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_fn, v_role);
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- namespace_limits_sync is the schedulers' door to the file's
-- namespaces' limits (it keys their steps).
DO $$
BEGIN
    REVOKE ALL ON FUNCTION namespace_limits_sync(text[], text[], text[], integer[], double precision[], integer[]) FROM PUBLIC;
    REVOKE ALL ON FUNCTION namespace_limits_unkey(text, text) FROM PUBLIC;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT EXECUTE ON FUNCTION namespace_limits_sync(text[], text[], text[], integer[], double precision[], integer[]) TO sas_scheduler;
    END IF;
END
$$;
