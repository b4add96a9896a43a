-- Sub-processes: a step of a graph may run another workflow as a child
-- order (workflow: NAME). The child knows its parent order and the step
-- that started it, and its depth (a submitted order is 0); its end ends
-- that step (child_ended, a trigger on the status of an order that has a
-- parent). orders_parent_idx finds an order's children: to link them, and
-- to undo them with their parent.
ALTER TABLE orders ADD COLUMN parent_order uuid, ADD COLUMN parent_step integer,
    ADD COLUMN depth smallint NOT NULL DEFAULT 0 CHECK (depth BETWEEN 0 AND 5);
ALTER TABLE orders ADD CONSTRAINT orders_parent_step_check CHECK ((parent_order IS NULL) = (parent_step IS NULL));
CREATE INDEX orders_parent_idx ON orders (parent_order) WHERE parent_order IS NOT NULL;

-- Its text is internal/statestore/sql/'s, applied after the migrations; this
-- stand-in lets the trigger be made first.
CREATE OR REPLACE FUNCTION child_ended() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER orders_child_ended AFTER UPDATE OF status ON orders
    FOR EACH ROW WHEN (NEW.parent_order IS NOT NULL AND NEW.status IN ('completed', 'failed') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION child_ended();

-- Schedulers start children (they write orders, steps, their history and
-- the workflow versions the children run).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT INSERT ON orders, steps TO sas_scheduler';
        EXECUTE 'GRANT SELECT, INSERT ON workflow_versions TO sas_scheduler';
    END IF;
END
$$;
