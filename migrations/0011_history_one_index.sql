-- The history's two indexes become one.
--
-- Every history row went into two indexes: the primary key (id) and
-- (order_id, id), by which every reader asks for an order's history, in
-- order. A three-step order writes about 17 history rows, so the two
-- indexes made about 30 of the 145 WAL records such an order costs, a
-- fifth of them (pg_walinspect under load; docs/BENCHMARKS.md). Nothing
-- looks a row up by id alone. The primary key is now (order_id, id): it
-- answers the same questions, and id, an identity column, still numbers
-- the rows in the order they were written.
ALTER TABLE transitions DROP CONSTRAINT transitions_pkey;
DROP INDEX transitions_order_idx;
ALTER TABLE transitions ADD CONSTRAINT transitions_pkey PRIMARY KEY (order_id, id);
