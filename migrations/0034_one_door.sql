-- One door for every change of a step's or an order's state.
--
-- step_moves and order_moves are the moves a step and an order may make
-- (internal/workflow/shapes.go declares them, with the shapes whose path
-- each is on; TestTheDoorIsTheRegistry keeps these rows the same). Every
-- statement that changes a step's process_state, or an order's status,
-- says so by counting the row's moves (moves = moves + 1: the key to the
-- door; a change of state without it is refused), and passes a trigger
-- (steps_moved, orders_moved: once per statement, set-based, over the
-- rows it changed): a move the table does
-- not hold fails the statement; each move allowed is written to the
-- history, with who made it and why (the row's moved_by and moved_why,
-- which the statement sets). A step's move that changes no state (a
-- service's 202 holding its attempt open) bumps the row's moves and is
-- written too. No other code writes a step's or an order's history of
-- moves (their creation is no move: the submitter writes it).
CREATE TABLE step_moves (
    from_state text NOT NULL,
    to_state   text NOT NULL,
    -- via: a move made in one write that the history tells as two (a step
    -- made pending and claimed by the same statement), and why the first.
    via        text,
    via_why    text,
    PRIMARY KEY (from_state, to_state)
);

CREATE TABLE order_moves (
    from_status text NOT NULL,
    to_status   text NOT NULL,
    PRIMARY KEY (from_status, to_status)
);

-- Each move with the paths it is on (internal/workflow/shapes.go names
-- them by shape).
INSERT INTO step_moves (from_state, to_state, via, via_why) VALUES
    -- becoming runnable: the step before ended, or every step it needs
    ('waiting', 'pending', NULL, NULL),
    ('waiting', 'delayed', NULL, NULL),
    ('delayed', 'pending', NULL, NULL),
    -- a step sas performs itself, as it becomes runnable (no claim): a
    -- wait begins to wait, a timer alone ends
    ('waiting', 'awaiting', NULL, NULL),
    ('delayed', 'awaiting', NULL, NULL),
    ('delayed', 'processed', NULL, NULL),
    -- made pending and claimed by the reply that ended the step before
    ('waiting', 'processing', 'pending', 'previous step processed'),
    -- claimed; handed back (broker unreachable) or reset (complete_by passed)
    ('pending', 'processing', NULL, NULL),
    ('processing', 'pending', NULL, NULL),
    -- ended by its reply, or by what it is (a when false, a list, a wait,
    -- a child order)
    ('processing', 'processed', NULL, NULL),
    ('processing', 'error', NULL, NULL),
    ('processing', 'skipped', NULL, NULL),
    ('processing', 'expanded', NULL, NULL),
    ('processing', 'awaiting', NULL, NULL),
    -- a service's 202 or first heartbeat holds its attempt open
    ('processing', 'processing', NULL, NULL),
    -- a wait or a child order ends
    ('awaiting', 'processed', NULL, NULL),
    ('awaiting', 'error', NULL, NULL),
    ('awaiting', 'skipped', NULL, NULL),
    -- a for_each step's instances all ended
    ('expanded', 'processed', NULL, NULL),
    -- the order is undone or no longer runs
    ('waiting', 'cancelled', NULL, NULL),
    ('delayed', 'cancelled', NULL, NULL),
    ('pending', 'cancelled', NULL, NULL),
    ('processing', 'cancelled', NULL, NULL),
    ('awaiting', 'cancelled', NULL, NULL),
    ('expanded', 'cancelled', NULL, NULL),
    -- an operator's resubmit: a failed step again, or an ended action run
    -- again with what depends on it
    ('error', 'pending', NULL, NULL),
    ('processed', 'pending', NULL, NULL),
    ('skipped', 'pending', NULL, NULL),
    ('waiting', 'waiting', NULL, NULL),
    ('delayed', 'waiting', NULL, NULL),
    ('awaiting', 'waiting', NULL, NULL),
    ('processed', 'waiting', NULL, NULL),
    ('skipped', 'waiting', NULL, NULL),
    ('expanded', 'waiting', NULL, NULL),
    ('error', 'waiting', NULL, NULL),
    ('cancelled', 'waiting', NULL, NULL);

INSERT INTO order_moves (from_status, to_status) VALUES
    ('received', 'processing'),
    ('received', 'completed'),
    ('received', 'compensating'),
    ('received', 'failed'),
    ('received', 'error'),
    ('processing', 'completed'),
    ('processing', 'compensating'),
    ('processing', 'failed'),
    ('processing', 'error'),
    ('compensating', 'failed'),
    ('compensating', 'error'),
    ('error', 'processing'),
    ('error', 'compensating'),
    ('error', 'failed');

-- moved_for: the attempt a reply that ends an attempt was for (a claim
-- clears it); the history names it, so that a reply applied to an attempt
-- it was not for would show.
ALTER TABLE steps
    ADD COLUMN moved_by  text,
    ADD COLUMN moved_why text,
    ADD COLUMN moved_for integer,
    ADD COLUMN moves     integer NOT NULL DEFAULT 0;
ALTER TABLE orders
    ADD COLUMN moved_by  text,
    ADD COLUMN moved_why text,
    ADD COLUMN moves     integer NOT NULL DEFAULT 0;

-- Stand-ins: their text is internal/statestore/sql/05_guards.sql's.
CREATE OR REPLACE FUNCTION steps_moved() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE OR REPLACE FUNCTION orders_moved() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

-- The doors: one per statement, over the rows it changed.
CREATE TRIGGER steps_moved AFTER UPDATE ON steps
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION steps_moved();
CREATE TRIGGER orders_moved AFTER UPDATE ON orders
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION orders_moved();

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_operator', 'sas_console', 'sas_api'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON step_moves, order_moves TO %I', v_role);
        END IF;
    END LOOP;
END
$$;
