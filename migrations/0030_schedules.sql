-- Schedules: the workflows file's schedules start an order of a workflow
-- at every tick of a cron expression. The supervisors copy the file's
-- schedules here (a changed one starts its ticks afresh: version); the
-- one that leads starts the due ticks' orders, each with an id derived
-- from the schedule and the tick, in the transaction that moves the
-- schedule's ticks on (so a failover mid-tick cannot start two).
-- schedules_due_idx reads the next due schedule.
CREATE TABLE schedules (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    workflow   text        NOT NULL,
    cron       text        NOT NULL,
    timezone   text        NOT NULL,
    payload    jsonb       NOT NULL,
    overlap    text        NOT NULL CHECK (overlap IN ('skip', 'allow')),
    catch_up   text        NOT NULL CHECK (catch_up IN ('none', 'last', 'all')),
    version    text        NOT NULL,
    -- false: the workflows file no longer has it; it starts nothing
    in_file    boolean     NOT NULL DEFAULT true,
    paused     boolean     NOT NULL DEFAULT false,
    paused_by  text,
    next_tick  timestamptz NOT NULL,
    last_tick  timestamptz,
    last_order uuid,
    -- an operator's trigger, started by the leader as soon as it looks
    trigger_at timestamptz,
    trigger_by text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_due_idx ON schedules (next_tick) WHERE in_file AND NOT paused;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        EXECUTE 'GRANT SELECT, INSERT, UPDATE ON schedules TO sas_supervisor';
        EXECUTE 'GRANT INSERT ON orders, steps TO sas_supervisor';
        EXECUTE 'GRANT SELECT, INSERT ON workflow_versions TO sas_supervisor';
    END IF;
    -- An operator pauses, resumes and triggers a schedule (sasctl
    -- schedules), each recorded with record_operator_action.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        EXECUTE 'GRANT SELECT ON schedules TO sas_operator';
        EXECUTE 'GRANT UPDATE (paused, paused_by, next_tick, trigger_at, trigger_by, updated_at) ON schedules TO sas_operator';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        EXECUTE 'GRANT SELECT ON schedules TO sas_console';
        EXECUTE 'GRANT UPDATE (paused, paused_by, next_tick, trigger_at, trigger_by, updated_at) ON schedules TO sas_console';
    END IF;
END
$$;
