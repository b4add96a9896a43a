-- Pause and resume. A paused order (a row in order_pauses) has nothing new
-- claimed: its steps in flight end normally, its replies and signals are
-- applied, but no step of it is claimed, its delays, waits' timeouts and
-- deadline do not fire, and the supervisor does not expire its steps,
-- until it is resumed. Its deadline's due time moves on by the time it was
-- paused. A paused workflow (workflow_pauses) pauses every order of it
-- that runs, and every order of it written while it is paused (they wait
-- as received). A paused agent kind (kind_pauses) has none of its steps
-- claimed, in any order. Each pause names who made it and why; the
-- operator functions (sql/80_operators.sql) are the only writers.
CREATE TABLE order_pauses (
    order_id   uuid        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by  text        NOT NULL CHECK (length(paused_by) BETWEEN 1 AND 200),
    reason     text        NOT NULL DEFAULT '' CHECK (length(reason) <= 500),
    -- 'order': paused on its own; 'workflow': with its workflow, and
    -- resumed with it
    scope      text        NOT NULL CHECK (scope IN ('order', 'workflow'))
);

CREATE TABLE workflow_pauses (
    workflow  text        PRIMARY KEY CHECK (length(workflow) BETWEEN 1 AND 64),
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by text        NOT NULL CHECK (length(paused_by) BETWEEN 1 AND 200),
    reason    text        NOT NULL DEFAULT '' CHECK (length(reason) <= 500)
);

CREATE TABLE kind_pauses (
    agent     text        PRIMARY KEY CHECK (length(agent) BETWEEN 1 AND 100),
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by text        NOT NULL CHECK (length(paused_by) BETWEEN 1 AND 200),
    reason    text        NOT NULL DEFAULT '' CHECK (length(reason) <= 500)
);

DO $$
DECLARE
    v_role text;
BEGIN
    -- Every claim, timer, sweep and reply reads them; whoever writes
    -- orders pauses those of a paused workflow as it writes them.
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_operator', 'sas_console', 'sas_api'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON order_pauses, workflow_pauses, kind_pauses TO %I', v_role);
        END IF;
    END LOOP;
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_api'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT INSERT ON order_pauses TO %I', v_role);
        END IF;
    END LOOP;
    -- The leader's sweep keeps pauses whole (pauses_settle): it sets the
    -- steps of paused orders aside, drops the pauses of ended orders and
    -- resumes an order its workflow's resume missed.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT UPDATE (available_at) ON steps TO sas_supervisor;
        GRANT DELETE ON order_pauses TO sas_supervisor;
        GRANT UPDATE (due_at) ON order_deadlines TO sas_supervisor;
    END IF;
END
$$;

-- Bulk jobs pause and resume too.
ALTER TABLE bulk_jobs DROP CONSTRAINT bulk_jobs_action_check;
ALTER TABLE bulk_jobs ADD CONSTRAINT bulk_jobs_action_check CHECK (action IN ('resubmit', 'cancel', 'pause', 'resume'));
