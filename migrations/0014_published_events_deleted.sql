-- A status event leaves the outbox once the broker has confirmed it.
--
-- The relay used to mark every published message (published_at) and keep
-- it: three rows per three-step order, kept for good, each rewritten when
-- marked (a new row version with its body and a new primary key entry).
-- Nothing reads a published status event: an order's history is its
-- transitions. So the relay now deletes the status events it published,
-- which writes far less and keeps the outbox as small as its backlog.
-- Operator alerts are still marked and kept: they are the record of
-- which orders were reported to an operator (sasctl, the chaos audit).
--
-- The scheduler's role may delete from the outbox, and from nothing else.
DELETE FROM outbox WHERE message_type = 'status_event' AND published_at IS NOT NULL;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE format('GRANT DELETE ON outbox TO %I', 'sas_scheduler');
    END IF;
END;
$$;
