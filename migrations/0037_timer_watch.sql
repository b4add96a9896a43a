-- The leading supervisor's timer loop sleeps until the earliest timer it
-- knows of (a delay, a start time, a wait's timeout, a schedule's tick)
-- and records here when it will look next. A statement that sets a timer
-- due before that time notifies sas_timers (timer_set); one due later
-- says nothing, since the loop will look by then. At rest the loop wakes
-- once every SAS_SUPERVISOR_TIMER_POLL instead of five times a second.
CREATE TABLE timer_watch (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    next_look timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO timer_watch DEFAULT VALUES;

-- The trigger's stand-in: internal/statestore/sql/05_guards.sql holds
-- steps_timer_set and timer_set.
CREATE OR REPLACE FUNCTION steps_timer_set() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

-- A step that becomes a timer by an update (a delay after a step ends, a
-- wait that begins, a delay ended into a wait) tells the loop as an
-- inserted one does (notify_pending). The WHEN clause keeps every other
-- update of a step (claims, replies) free of it.
CREATE TRIGGER steps_timer_set AFTER UPDATE OF process_state, due_at ON steps
    FOR EACH ROW
    WHEN (NEW.process_state IN ('delayed', 'awaiting') AND NEW.due_at IS NOT NULL
          AND (OLD.process_state IS DISTINCT FROM NEW.process_state OR OLD.due_at IS DISTINCT FROM NEW.due_at))
    EXECUTE FUNCTION steps_timer_set();

DO $$
DECLARE
    v_role text;
BEGIN
    -- every writer of steps reads when the loop looks next
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_operator', 'sas_console', 'sas_api'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON timer_watch TO %I', v_role);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT, UPDATE ON timer_watch TO sas_supervisor;
    END IF;
END
$$;
