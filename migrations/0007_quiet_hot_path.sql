-- NOTIFY serialises commits: PostgreSQL takes one database-wide lock from
-- a notifying transaction's pre-commit until its commit ends. With a
-- notification on every step update and outbox insert, every claim and
-- every reply waited in one line (measured: most active backends in
-- "Lock: object" on COMMIT; see docs/BENCHMARKS.md).
--
-- The hot path now wakes in-process instead: a scheduler that applies a
-- reply or claims a step nudges its own claimer and relay. Notifications
-- remain where another process must be woken: the submitter's inserts (the
-- insert trigger of 0002, one per transaction) and the rare changes by the
-- supervisor and operators, which notify explicitly (statestore.wake).
DROP TRIGGER steps_notify_pending_update ON steps;
DROP TRIGGER outbox_notify ON outbox;
