-- Compensation: an order undone.

-- begin_compensation: the order begins compensating (order_next's
-- compensate, or an operator's cancel): actions not yet done are
-- cancelled, compensations of actions that never ran too (every attempt
-- answered before a request left: attempt <= unsent_attempts), and
-- graph_advance starts the compensations that may run (a list's: the
-- first left, undoing the last action); with none left, the order fails.
-- In a list the step in flight is cancelled; in a graph steps in flight
-- are let end.
CREATE OR REPLACE FUNCTION begin_compensation(p_order uuid, p_step integer, p_actor text, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_first integer;
    v_status text;
BEGIN
    IF EXISTS (SELECT 1 FROM steps WHERE order_id = p_order AND needs IS NOT NULL) THEN
        -- A graph: what has not started never will; steps in flight are
        -- let end, and each action's compensation runs once it has, after
        -- those of the steps that needed it (graph_advance).
        UPDATE steps SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, due_at = NULL, updated_at = now(),
                         moves = moves + 1, moved_by = p_actor, moved_why = p_reason
        WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'expanded', 'delayed', 'awaiting');
        -- Its children that still run are undone with it.
        IF EXISTS (SELECT 1 FROM orders WHERE parent_order = p_order) THEN
            PERFORM children_cancel(p_order, p_actor);
        END IF;
        PERFORM order_transition(p_order, 'compensating', p_step, p_actor, p_reason);
        SELECT ga.order_status INTO v_status FROM graph_advance(p_order, p_actor) ga;
        RETURN coalesce(nullif(v_status, ''), 'compensating');
    END IF;
    -- The actions first: this waits for a claim of one that has not
    -- committed yet, so that the next statement, which reads the actions'
    -- attempts without locking them, sees that claim (a compensation
    -- cancelled as "never ran" while its action's request went out would
    -- leave the action done and never undone).
    UPDATE steps SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, updated_at = now(),
                     moves = moves + 1, moved_by = p_actor, moved_why = p_reason
    WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'processing');

    UPDATE steps c SET process_state = 'cancelled', updated_at = now(),
                       moves = c.moves + 1, moved_by = p_actor, moved_why = 'its action never ran'
    FROM steps a
    WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting'
      AND a.order_id = c.order_id AND a.step = c.compensates AND a.attempt <= a.unsent_attempts;

    SELECT min(step) INTO v_first FROM steps
    WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'waiting';
    IF v_first IS NULL THEN
        PERFORM order_transition(p_order, 'failed', p_step, p_actor, p_reason || '; nothing to undo');
        RETURN 'failed';
    END IF;
    PERFORM order_transition(p_order, 'compensating', p_step, p_actor, p_reason);
    SELECT ga.order_status INTO v_status FROM graph_advance(p_order, p_actor) ga;
    RETURN coalesce(nullif(v_status, ''), 'compensating');
END;
$function$;
