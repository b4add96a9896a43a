-- N-of-M joins: a step whose needs say {any: N, of: [...]} runs once N of
-- them have ended well (its spec's needs_any; graph_advance). A branch
-- that fails for good while such a join can do without it is spared
-- (joins_spare): it moves from error to cancelled, the order goes on, and
-- its compensation runs if the order is later undone. The door's table
-- learns that move.
INSERT INTO step_moves (from_state, to_state, via, via_why) VALUES
    -- a branch an N-of-M join spared: failed for good, no longer needed
    ('error', 'cancelled', NULL, NULL);
