-- Timers: a step of a graph with a delay waits, once its needs ended, in
-- the state delayed until due_at (on the database clock); the supervisor
-- that holds the lead moves due steps to pending (fire_timers). Waiting
-- timers are read only through steps_due_idx, the earliest first, so
-- however many wait they cost no scan.
ALTER TABLE steps ADD COLUMN due_at timestamptz;

ALTER TABLE steps DROP CONSTRAINT steps_process_state_check;
ALTER TABLE steps ADD CONSTRAINT steps_process_state_check
    CHECK (process_state IN ('waiting', 'pending', 'processing', 'processed', 'error', 'cancelled', 'skipped', 'expanded', 'delayed'));
ALTER TABLE steps ADD CONSTRAINT steps_delayed_has_due_at
    CHECK (process_state <> 'delayed' OR due_at IS NOT NULL);

CREATE INDEX steps_due_idx ON steps (due_at) WHERE process_state = 'delayed';

-- An order submitted with start_at: its first steps are delayed until
-- then. Kept on the order for what shows it.
ALTER TABLE orders ADD COLUMN start_at timestamptz;
