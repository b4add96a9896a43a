-- Limits that protect the services sas calls, and fairness between keys.
--
-- agent_limits: per agent kind, at most max_in_flight steps processing at
-- once and rate claims a second (a token bucket of burst), held here so
-- that every scheduler replica shares them. The workflows file's limits
-- (file_*) are kept by the schedulers; an operator's (set_*, sasctl limits
-- set, the console) replace them while set_by is set. A service's 429
-- lowers the rate to lowered_rate until lowered_until (not below
-- min_rate). A claim of a limited kind locks its row, so that two
-- schedulers never both take the last room; fair_cursor is the last key
-- it served, where the next claim's round starts.
CREATE TABLE agent_limits (
    agent              text        PRIMARY KEY CHECK (length(agent) BETWEEN 1 AND 100),
    file_max_in_flight integer     CHECK (file_max_in_flight >= 1),
    file_rate          double precision CHECK (file_rate > 0),
    file_burst         integer     CHECK (file_burst >= 1),
    file_min_rate      double precision CHECK (file_min_rate > 0),
    set_max_in_flight  integer     CHECK (set_max_in_flight >= 1),
    set_rate           double precision CHECK (set_rate > 0),
    set_burst          integer     CHECK (set_burst >= 1),
    set_min_rate       double precision CHECK (set_min_rate > 0),
    set_by             text,
    set_at             timestamptz,
    tokens             double precision NOT NULL DEFAULT 0,
    refilled_at        timestamptz NOT NULL DEFAULT now(),
    lowered_rate       double precision CHECK (lowered_rate > 0),
    lowered_until      timestamptz,
    lowered_at         timestamptz,
    lowered_count      bigint      NOT NULL DEFAULT 0,
    fair_cursor        text,
    -- at least the kind's processing steps: the last count plus the
    -- claims since (steps enter processing only by a claim); NULL when
    -- unknown. A claim counts again when the bound leaves too little
    -- room, or it is a second old.
    in_flight_bound    integer,
    counted_at         timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- A workflow's concurrency_key, read from the payload at submit, is
-- written on each of its order's steps, with its max_per_key. Keyed
-- pending steps have an index of their own, by kind and key, so that a
-- claim finds each key's next step in one probe whatever the backlog of
-- another key; the unkeyed pending index leaves them out. Keyed
-- processing steps are counted by key for max_per_key.
ALTER TABLE steps
    ADD COLUMN fair_key text CHECK (length(fair_key) <= 256),
    ADD COLUMN fair_max integer CHECK (fair_max >= 1);
DROP INDEX steps_pending_agent_idx;
CREATE INDEX steps_pending_agent_idx ON steps (agent, priority DESC, available_at, order_id, step)
    WHERE process_state = 'pending' AND fair_key IS NULL;
CREATE INDEX steps_fair_pending_idx ON steps (agent, fair_key, priority DESC, available_at, order_id, step)
    WHERE process_state = 'pending' AND fair_key IS NOT NULL;
CREATE INDEX steps_fair_processing_idx ON steps (agent, fair_key)
    WHERE process_state = 'processing' AND fair_key IS NOT NULL;

DO $$
BEGIN
    -- Schedulers keep the file's limits, claim under them and lower a
    -- rate on a service's 429; the supervisor reports them.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT SELECT, INSERT, UPDATE ON agent_limits TO sas_scheduler;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT ON agent_limits TO sas_supervisor;
    END IF;
    -- An operator (sasctl limits, the console) sets and resets a kind's
    -- limits, each change recorded with record_operator_action.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT, INSERT ON agent_limits TO sas_operator;
        GRANT UPDATE (set_max_in_flight, set_rate, set_burst, set_min_rate, set_by, set_at, updated_at, in_flight_bound) ON agent_limits TO sas_operator;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        GRANT SELECT, INSERT ON agent_limits TO sas_console;
        GRANT UPDATE (set_max_in_flight, set_rate, set_burst, set_min_rate, set_by, set_at, updated_at, in_flight_bound) ON agent_limits TO sas_console;
    END IF;
END
$$;
