-- One scheduler listens: of the schedulers that claim the same agent
-- kinds, the one holding the listener lease of those kinds listens for
-- the notifications of new work (sas_pending, sas_outbox); the others are
-- woken on sas_pending_more when it claims a whole batch, and otherwise
-- poll and wake their own loops. Before, every new order woke every
-- scheduler, and all but one of them then claimed nothing.
--
-- The leases are rows like the supervisor's, in a table of their own, so
-- that the scheduler's role may hold them and still not the supervisor's.
CREATE TABLE listener_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT SELECT, INSERT, UPDATE ON listener_leases TO sas_scheduler';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        EXECUTE 'GRANT SELECT ON listener_leases TO sas_operator';
    END IF;
END;
$$;
