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
