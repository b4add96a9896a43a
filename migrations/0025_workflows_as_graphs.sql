-- Workflows as graphs: a step of a graph workflow runs once the steps it
-- needs have ended, not after the step before it. A list's steps keep
-- these columns NULL and run as they always have.
--
--   needs      the step numbers that must have ended (processed or
--              skipped; for a compensation: processed, cancelled or
--              skipped) before the step may run; NULL: a list's step
--   ancestors  the actions whose results the step's request carries
--   spec       the step's when, for_each, input, max_parallel, max_items
--              and id, as the workflow says them
--   parent     for an instance of a for_each step, that step's number
--              (for an instance's compensation, the compensation's)
--   item_index, item  the instance's position and element of the list
--
-- Two step states: skipped (its when was false: it did nothing, is not
-- undone, and counts as ended) and expanded (a for_each step whose
-- instances run; it is processed when they all are).
ALTER TABLE steps
    ADD COLUMN needs      integer[],
    ADD COLUMN ancestors  integer[],
    ADD COLUMN spec       jsonb,
    ADD COLUMN parent     integer,
    ADD COLUMN item_index integer CHECK (item_index >= 0),
    ADD COLUMN item       jsonb;

ALTER TABLE steps DROP CONSTRAINT steps_process_state_check;
ALTER TABLE steps ADD CONSTRAINT steps_process_state_check
    CHECK (process_state IN ('waiting', 'pending', 'processing', 'processed', 'error', 'cancelled', 'skipped', 'expanded'));
