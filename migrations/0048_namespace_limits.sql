-- Tenants, limits: a namespace's own limits on an agent kind, within the
-- kind's. The kind's limits (agent_limits) bound every namespace's steps
-- together; a namespace's (namespace_limits) bound its steps alone, so
-- that one namespace at its limit leaves the rest of the kind's capacity
-- to the others. The default namespace has none: its steps are bounded by
-- the kind's limits.
--
-- A step of an order of a namespace other than the default carries the
-- namespace (steps.namespace, NULL for the default's: no row of a
-- deployment without namespaces changes). Its fair_key, when it has one,
-- begins with the namespace and a unit separator: its order's concurrency
-- key (a tenant's key is never another's), or none but the prefix when the
-- namespace has limits on the step's kind (step_fair_key): such steps are
-- claimed by key (limited_pick), each namespace one more key of the
-- kind's round robin, and never by the regular claim.
ALTER TABLE steps ADD COLUMN namespace text;

-- The namespace (63), the separator and a key of 256.
ALTER TABLE steps DROP CONSTRAINT steps_fair_key_check,
    ADD CONSTRAINT steps_fair_key_check CHECK (length(fair_key) <= 320);

-- A namespace's live steps by kind: its processing ones counted for its
-- max_in_flight at each claim, and those to key when it gets limits.
CREATE INDEX steps_namespace_live_idx ON steps (agent, namespace, process_state)
    WHERE namespace IS NOT NULL AND process_state IN ('waiting', 'pending', 'delayed', 'awaiting', 'processing');

-- The live steps of orders written before this migration.
UPDATE steps s SET namespace = o.namespace,
                   fair_key = CASE WHEN s.fair_key IS NOT NULL THEN o.namespace || E'\x1f' || s.fair_key END
FROM orders o
WHERE o.order_id = s.order_id AND o.namespace <> 'default'
  AND s.process_state IN ('waiting', 'pending', 'delayed', 'awaiting', 'processing');

-- A namespace's limits on a kind: at most max_in_flight of its steps of
-- the kind processing, at most rate claims of them a second (a token
-- bucket of burst, its level in tokens as of refilled_at), each NULL for
-- none. The workflows file's (file_*, kept by the schedulers of the kind)
-- hold unless an operator set others (set_*, sasctl limits set
-- --namespace, the console), recorded in set_by and set_at. A row with
-- neither is removed. The namespace need not exist yet: a file may name
-- one before sasctl namespaces add makes it.
CREATE TABLE namespace_limits (
    agent              text             NOT NULL CHECK (length(agent) BETWEEN 1 AND 100),
    namespace          text             NOT NULL CHECK (namespace ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$' AND namespace <> 'default'),
    file_max_in_flight integer          CHECK (file_max_in_flight >= 1),
    file_rate          double precision CHECK (file_rate > 0),
    file_burst         integer          CHECK (file_burst >= 1),
    set_max_in_flight  integer          CHECK (set_max_in_flight >= 1),
    set_rate           double precision CHECK (set_rate > 0),
    set_burst          integer          CHECK (set_burst >= 1),
    set_by             text,
    set_at             timestamptz,
    tokens             double precision NOT NULL DEFAULT 0,
    refilled_at        timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (agent, namespace),
    CHECK (file_burst IS NULL OR file_rate IS NOT NULL),
    CHECK (set_burst IS NULL OR set_rate IS NOT NULL),
    CHECK ((set_by IS NULL) = (set_at IS NULL))
);

-- A namespace's orders in flight, as namespace_admit last counted them
-- (counted_at) plus the orders it admitted since: at least the orders in
-- flight, since an order that ends only makes it high. An admission
-- counts again when the bound leaves no room, or is a second old; a
-- writer of the namespace's orders that is not admitted (sas's own: a
-- child, a schedule's, an inbound route's) clears it. Counting read every
-- order in flight, at each admission.
ALTER TABLE namespaces ADD COLUMN in_flight_bound integer, ADD COLUMN counted_at timestamptz;

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['sas_api', 'sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_operator', 'sas_console'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT UPDATE (in_flight_bound) ON namespaces TO %I', v_role);
        END IF;
    END LOOP;
    -- Every writer of steps keys a namespace's steps by its limits
    -- (step_fair_key); the schedulers spend its tokens.
    FOREACH v_role IN ARRAY ARRAY['sas_api', 'sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_operator', 'sas_console'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON namespace_limits TO %I', v_role);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT UPDATE (tokens, refilled_at) ON namespace_limits TO sas_scheduler;
    END IF;
    -- Operators set and reset them through namespace_limits_set and
    -- namespace_limits_reset, the schedulers keep the file's through
    -- namespace_limits_sync (sql/70_limits.sql): each keys the steps.
END
$$;
