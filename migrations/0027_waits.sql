-- Waits and signals: a step of a graph may wait for a signal instead of
-- calling a service. Such a step, and a timer alone (a step with a delay
-- and no agent), is in the system's hands: it has no agent ('').
--
-- A wait step whose needs ended is awaiting, with its timeout's due_at;
-- a signal of its name for its order ends it (processed, the signal's
-- payload its result); at due_at it fails for good, or is skipped.
--
-- signals keeps every signal an order received, by its id (the same id
-- twice is applied once); step is the wait step it ended, NULL while it
-- is kept for a wait that has not begun. Like steps and transitions it has
-- no foreign key to orders (0009, 0010): deleting or truncating orders
-- deletes or truncates it too (orders_delete_history,
-- orders_truncate_rows).
ALTER TABLE steps DROP CONSTRAINT steps_agent_check;
ALTER TABLE steps ADD CONSTRAINT steps_agent_check CHECK (length(agent) <= 100);

ALTER TABLE steps DROP CONSTRAINT steps_process_state_check;
ALTER TABLE steps ADD CONSTRAINT steps_process_state_check
    CHECK (process_state IN ('waiting', 'pending', 'processing', 'processed', 'error', 'cancelled', 'skipped', 'expanded',
                             'delayed', 'awaiting'));
ALTER TABLE steps DROP CONSTRAINT steps_delayed_has_due_at;
ALTER TABLE steps ADD CONSTRAINT steps_delayed_has_due_at
    CHECK (process_state NOT IN ('delayed', 'awaiting') OR due_at IS NOT NULL);

DROP INDEX steps_due_idx;
CREATE INDEX steps_due_idx ON steps (due_at) WHERE process_state IN ('delayed', 'awaiting');

CREATE TABLE signals (
    order_id    uuid        NOT NULL,
    signal_id   text        NOT NULL CHECK (length(signal_id) BETWEEN 1 AND 200),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    payload     jsonb,
    actor       text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    step        integer,
    PRIMARY KEY (order_id, signal_id)
);
CREATE INDEX signals_kept_idx ON signals (order_id, name, received_at) WHERE step IS NULL;

-- Signals come through the signal queue, which the schedulers consume.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT SELECT, INSERT, UPDATE ON signals TO sas_scheduler';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        EXECUTE 'GRANT SELECT ON signals TO sas_operator';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        EXECUTE 'GRANT SELECT ON signals TO sas_supervisor';
    END IF;
END
$$;
