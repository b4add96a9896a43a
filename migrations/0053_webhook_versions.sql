-- webhook_versions: the workflow versions whose definitions declare
-- webhooks, noted by a trigger as they are stored (a stored version never
-- changes). The doors of steps and orders asked at every statement whether
-- any version declares webhooks by reading every version's definition:
-- the partial index meant to answer it (0039) was never chosen, the
-- definitions living out of line where the planner does not count them,
-- so that the cost of each move grew with every version ever stored
-- (15 ms a statement with 1,000 versions of a thirty-step workflow). They
-- read this table instead, empty in an install without webhooks, and
-- find an order's version in it by its key.
CREATE TABLE webhook_versions (
    name    text NOT NULL,
    version text NOT NULL,
    PRIMARY KEY (name, version)
);
INSERT INTO webhook_versions (name, version)
SELECT name, version FROM workflow_versions WHERE definition ? 'webhooks';
DROP INDEX workflow_versions_webhooks_idx;

-- Stand-in: its text is internal/statestore/sql/05_guards.sql's.
CREATE OR REPLACE FUNCTION workflow_versions_hooked() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER workflow_versions_hooked AFTER INSERT ON workflow_versions
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_versions_hooked();
