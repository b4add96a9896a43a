-- Whole-order deadlines: a workflow's deadline (or the order's own, given
-- at submit) is a row here, due at a time on the database clock like
-- every timer, written with the order. The leading supervisor's timer
-- loop fires it (fire_deadlines): when the order still runs, its steps in
-- flight are fenced out and it follows on_deadline (compensate: what was
-- done is undone; hold: held in error for an operator, alerted; fail: it
-- fails with nothing undone). outcome says what happened when it fell
-- due: the on_deadline it followed, or 'ended' when the order had ended
-- (or was being undone) by then. A row goes with its order (retention).
CREATE TABLE order_deadlines (
    order_id    uuid        PRIMARY KEY,
    due_at      timestamptz NOT NULL,
    deadline_ms bigint      NOT NULL CHECK (deadline_ms > 0),
    on_deadline text        NOT NULL CHECK (on_deadline IN ('compensate', 'hold', 'fail')),
    outcome     text        CHECK (outcome IN ('compensate', 'hold', 'fail', 'ended')),
    passed_at   timestamptz
);
CREATE INDEX order_deadlines_due_idx ON order_deadlines (due_at) WHERE outcome IS NULL;

-- A held order's deadline fences its pending steps as its steps in
-- flight: each is held in error, as a failed step is, for a resubmit.
INSERT INTO step_moves (from_state, to_state, via, via_why, event) VALUES ('pending', 'error', NULL, NULL, 'failed');

-- The trigger's stand-in: internal/statestore/sql/05_guards.sql holds
-- deadline_timer_set.
CREATE OR REPLACE FUNCTION deadline_timer_set() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

-- A deadline written tells the timer loop as a timer does (timer_set).
CREATE TRIGGER order_deadlines_timer_set AFTER INSERT ON order_deadlines
    FOR EACH ROW EXECUTE FUNCTION deadline_timer_set();

DO $$
DECLARE
    v_role text;
BEGIN
    -- Whoever writes orders writes their deadlines: submitters, the API,
    -- schedulers (children) and supervisors (scheduled orders).
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_api', 'sas_scheduler', 'sas_supervisor'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT, INSERT ON order_deadlines TO %I', v_role);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT UPDATE (outcome, passed_at) ON order_deadlines TO sas_supervisor;
    END IF;
    FOREACH v_role IN ARRAY ARRAY['sas_operator', 'sas_console'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON order_deadlines TO %I', v_role);
        END IF;
    END LOOP;
END
$$;
