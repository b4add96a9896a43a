-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Compensation: every action step has a compensating step (kind
-- 'compensation', created waiting with the order) that undoes it. They are
-- numbered in reverse: for N actions, the one undoing action i is step
-- 2N+1-i, so running "the next step" after each processed compensation
-- undoes the actions last to first.
--
-- The order's failure policy says what a failed action step leads to:
-- 'compensate' (undo what was done; the order ends failed) or 'hold' (the
-- order waits in error for an operator to resubmit or cancel).

ALTER TABLE orders ADD COLUMN failure_policy text NOT NULL DEFAULT 'compensate'
    CHECK (failure_policy IN ('compensate', 'hold'));

ALTER TABLE steps ADD COLUMN compensates integer;
ALTER TABLE steps ADD CONSTRAINT steps_compensates_kind
    CHECK ((kind = 'compensation') = (compensates IS NOT NULL));

-- order_transition moves an order to p_to with its history entry and a
-- status event. The caller holds the order's row lock.
CREATE FUNCTION order_transition(p_order uuid, p_to text, p_step integer, p_actor text, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_from text;
    v_reply_to text;
BEGIN
    SELECT status, reply_to INTO v_from, v_reply_to FROM orders WHERE order_id = p_order;
    UPDATE orders SET status = p_to, updated_at = now() WHERE order_id = p_order;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, NULL, v_from, p_to, p_actor, p_reason);
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    VALUES ('status_event', p_order, v_reply_to, status_event_body(p_order, p_to, p_step));
END;
$$;

CREATE FUNCTION raise_alert(p_order uuid, p_step integer, p_reason text, p_failure_count integer)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO outbox (message_type, order_id, body)
    VALUES ('operator_alert', p_order, operator_alert_body(p_order, p_step, p_reason, p_failure_count));
$$;

-- begin_compensation stops an order's forward work and starts undoing it:
-- actions not finished are cancelled (a reply still on its way is then
-- stale); the compensations of actions that were never attempted are
-- cancelled (nothing to undo); the first remaining compensation becomes
-- pending and the order compensating, or the order is failed at once if
-- nothing was ever attempted. The caller holds the order's row lock.
-- Returns the order's new status.
CREATE FUNCTION begin_compensation(p_order uuid, p_step integer, p_actor text, p_reason text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_first integer;
BEGIN
    WITH dead AS (
        SELECT c.step, c.attempt FROM steps c
        JOIN steps a ON a.order_id = c.order_id AND a.step = c.compensates
        WHERE c.order_id = p_order AND c.kind = 'compensation' AND c.process_state = 'waiting' AND a.attempt = 0
        FOR UPDATE OF c
    ), upd AS (
        UPDATE steps s SET process_state = 'cancelled', updated_at = now()
        FROM dead WHERE s.order_id = p_order AND s.step = dead.step
    )
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT p_order, step, 'waiting', 'cancelled', attempt, p_actor, 'its action never ran' FROM dead;

    WITH old AS (
        SELECT step, process_state, attempt FROM steps
        WHERE order_id = p_order AND kind = 'action' AND process_state IN ('waiting', 'pending', 'processing')
        FOR UPDATE
    ), upd AS (
        UPDATE steps s SET process_state = 'cancelled', locked_by = NULL, complete_by = NULL, updated_at = now()
        FROM old WHERE s.order_id = p_order AND s.step = old.step
    )
    INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
    SELECT p_order, step, process_state, 'cancelled', attempt, p_actor, p_reason FROM old;

    SELECT min(step) INTO v_first FROM steps
    WHERE order_id = p_order AND kind = 'compensation' AND process_state = 'waiting';
    IF v_first IS NULL THEN
        PERFORM order_transition(p_order, 'failed', p_step, p_actor, p_reason || '; nothing to undo');
        RETURN 'failed';
    END IF;
    UPDATE steps SET process_state = 'pending', available_at = now(), updated_at = now()
    WHERE order_id = p_order AND step = v_first;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, v_first, 'waiting', 'pending', p_actor, 'compensation started');
    PERFORM order_transition(p_order, 'compensating', p_step, p_actor, p_reason);
    RETURN 'compensating';
END;
$$;

-- step_processed moves an order on after its step p_step was processed:
-- the next step of the same kind becomes pending, or, after the last one,
-- the order ends (completed after its actions, failed after its
-- compensations). Returns the step made pending (0 if none) and the
-- order's new status ('' if unchanged).
CREATE FUNCTION step_processed(p_order uuid, p_step integer, p_actor text, OUT next_step integer, OUT order_status text)
LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
    v_status text;
BEGIN
    next_step := 0;
    order_status := '';
    SELECT kind INTO v_kind FROM steps WHERE order_id = p_order AND step = p_step;
    SELECT status INTO v_status FROM orders WHERE order_id = p_order FOR UPDATE;
    IF (v_kind = 'action' AND v_status NOT IN ('received', 'processing'))
       OR (v_kind = 'compensation' AND v_status <> 'compensating') THEN
        RETURN;
    END IF;
    UPDATE steps SET process_state = 'pending', available_at = now(), updated_at = now()
    WHERE order_id = p_order AND step = p_step + 1 AND kind = v_kind AND process_state = 'waiting'
    RETURNING step INTO next_step;
    IF next_step IS NOT NULL THEN
        INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
        VALUES (p_order, next_step, 'waiting', 'pending', p_actor, 'previous step processed');
        RETURN;
    END IF;
    next_step := 0;
    IF v_kind = 'action' THEN
        order_status := 'completed';
        PERFORM order_transition(p_order, 'completed', NULL, p_actor, 'last step processed');
    ELSE
        order_status := 'failed';
        PERFORM order_transition(p_order, 'failed', NULL, p_actor, 'every compensation processed');
    END IF;
END;
$$;

-- step_failed reacts to a step that went to error (a failed reply, or the
-- supervisor's threshold). A failed action: per the order's policy, hold
-- the order in error with an alert, or start compensating. A failed
-- compensation: the order is partly undone and needs a person: error and
-- an alert. Returns the order's new status.
CREATE FUNCTION step_failed(p_order uuid, p_step integer, p_actor text, p_reason text, p_failure_count integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_policy text;
    v_kind text;
BEGIN
    SELECT status, failure_policy INTO v_status, v_policy FROM orders WHERE order_id = p_order FOR UPDATE;
    SELECT kind INTO v_kind FROM steps WHERE order_id = p_order AND step = p_step;
    IF v_kind = 'compensation' THEN
        IF v_status <> 'compensating' THEN
            RETURN v_status;
        END IF;
        PERFORM order_transition(p_order, 'error', p_step, p_actor,
            'compensation step ' || p_step || ' failed: ' || p_reason);
        PERFORM raise_alert(p_order, p_step, 'compensation failed, the order is partly undone: ' || p_reason, p_failure_count);
        RETURN 'error';
    END IF;
    IF v_status NOT IN ('received', 'processing') THEN
        RETURN v_status;
    END IF;
    IF v_policy = 'hold' THEN
        PERFORM order_transition(p_order, 'error', p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
        PERFORM raise_alert(p_order, p_step, p_reason, p_failure_count);
        RETURN 'error';
    END IF;
    RETURN begin_compensation(p_order, p_step, p_actor, 'step ' || p_step || ' failed: ' || p_reason);
END;
$$;
