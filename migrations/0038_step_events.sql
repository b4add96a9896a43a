-- Step events: a subscriber that binds step.# (or step.awaiting, ...) on
-- the status exchange hears each step's moves that matter to an
-- application: claimed, awaiting (a signal or a child order), processed
-- (compensated, for a compensation), failed, skipped, cancelled. The door
-- of steps (steps_moved) writes them to the outbox with the history, as
-- step_event messages, while they are heard: as for progress events, the
-- relay marks them unheard (status_routes, status 'step') when the broker
-- returns one, and they are not written for a while.
ALTER TABLE outbox DROP CONSTRAINT outbox_message_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_message_type_check
    CHECK (message_type IN ('status_event', 'operator_alert', 'step_event'));

-- event: the step event a move tells (NULL: none), as
-- internal/workflow/shapes.go declares it.
ALTER TABLE step_moves ADD COLUMN event text
    CHECK (event IN ('claimed', 'awaiting', 'processed', 'failed', 'skipped', 'cancelled'));
UPDATE step_moves SET event = CASE
    WHEN to_state = 'processing' AND from_state <> 'processing' THEN 'claimed'
    WHEN to_state = 'awaiting' THEN 'awaiting'
    WHEN to_state = 'processed' THEN 'processed'
    WHEN to_state = 'error' THEN 'failed'
    WHEN to_state = 'skipped' THEN 'skipped'
    WHEN to_state = 'cancelled' THEN 'cancelled'
END;

-- The API says it hears step events when it binds step.# for a follower
-- (statestore.HearStepEvents): it may add the mark's row.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_api') THEN
        GRANT INSERT ON status_routes TO sas_api;
    END IF;
END
$$;
