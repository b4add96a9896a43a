-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- The history's foreign key to orders, off the hot path.
--
-- Every history row is written by a statement that has just changed or
-- locked its order or one of the order's steps, in the same transaction,
-- so the key check never found anything wrong; it cost a query and a
-- row lock on the order for every history row (about 20 per three-step
-- order). CPU profiles of PostgreSQL under load put 16 % of its time in
-- these checks (docs/BENCHMARKS.md).
--
-- What the key also did is kept: deleting an order (a retention job, an
-- operator) deletes its history with it, by the trigger below, and
-- order_transition, the one writer that names an order without changing a
-- step first, refuses an order that does not exist. The steps keep their
-- key to orders.
ALTER TABLE transitions DROP CONSTRAINT transitions_order_id_fkey;

CREATE FUNCTION orders_delete_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM transitions t USING gone g WHERE t.order_id = g.order_id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER orders_delete_history AFTER DELETE ON orders
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION orders_delete_history();

CREATE OR REPLACE FUNCTION order_transition(p_order uuid, p_to text, p_step integer, p_actor text, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_from text;
    v_reply_to text;
BEGIN
    SELECT status, reply_to INTO v_from, v_reply_to FROM orders WHERE order_id = p_order;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % does not exist', p_order USING ERRCODE = 'foreign_key_violation';
    END IF;
    UPDATE orders SET status = p_to, updated_at = now() WHERE order_id = p_order;
    INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
    VALUES (p_order, NULL, v_from, p_to, p_actor, p_reason);
    INSERT INTO outbox (message_type, order_id, reply_to, body)
    VALUES ('status_event', p_order, v_reply_to, status_event_body(p_order, p_to, p_step));
END;
$$;
