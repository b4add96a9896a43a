-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- The steps' foreign key to orders, off the hot path, as the history's
-- was in 0009.
--
-- Steps are written by one statement only, the order insert, and only for
-- the orders that statement has just inserted, so the key check never
-- found anything wrong; it ran a query and locked the order's row for
-- every step row: six per three-step order (pg_stat_statements under
-- load: 44,106 checks in 20 s, about 4 % of PostgreSQL's time;
-- docs/BENCHMARKS.md).
--
-- What the keys also did is kept: deleting an order deletes its steps with
-- it, by the trigger of 0009, which now deletes both; truncating orders
-- truncates both (the keys made a plain TRUNCATE orders fail).
ALTER TABLE steps DROP CONSTRAINT steps_order_id_fkey;

CREATE OR REPLACE FUNCTION orders_delete_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM steps s USING gone g WHERE s.order_id = g.order_id;
    DELETE FROM transitions t USING gone g WHERE t.order_id = g.order_id;
    RETURN NULL;
END;
$$;

CREATE FUNCTION orders_truncate_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE steps, transitions;
    RETURN NULL;
END;
$$;

CREATE TRIGGER orders_truncate_rows AFTER TRUNCATE ON orders
    FOR EACH STATEMENT EXECUTE FUNCTION orders_truncate_rows();
