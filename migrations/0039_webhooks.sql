-- Signed webhooks: a workflow's webhooks (workflow_versions.definition's
-- "webhooks": url, secret_env, events) are told of its orders' ends, and
-- of the step events their events name (step.awaiting, ...). The doors
-- (orders_moved, steps_moved) write a delivery for each webhook of an
-- order's workflow version whose events name what happened, in the
-- transaction that did it: none is lost, and none is sent for a change
-- that did not commit. The leading supervisor posts them,
-- signed (HMAC-SHA256 under the secret in its environment variable
-- secret_env: the secret is never stored), with backoff between tries; a
-- delivery that failed SAS_SUPERVISOR_WEBHOOK_ATTEMPTS times is dead, for
-- an operator to see and replay (sasctl webhooks).
CREATE TABLE webhook_deliveries (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL,
    workflow   text        NOT NULL,
    url        text        NOT NULL CHECK (length(url) <= 2048),
    secret_env text        NOT NULL CHECK (secret_env ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    event      text        NOT NULL CHECK (event IN ('completed', 'failed', 'error', 'step.claimed', 'step.awaiting', 'step.processed',
                                                     'step.compensated', 'step.failed', 'step.skipped', 'step.cancelled')),
    body       jsonb       NOT NULL,
    state      text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts   integer     NOT NULL DEFAULT 0,
    next_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error text        CHECK (length(last_error) <= 1000),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at    timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_order_idx ON webhook_deliveries (order_id);

-- The versions that have webhooks: the door looks here first, so orders
-- of workflows without any pay one index probe a statement.
CREATE INDEX workflow_versions_webhooks_idx ON workflow_versions (name, version) WHERE definition ? 'webhooks';

DO $$
DECLARE
    v_role text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT, UPDATE ON webhook_deliveries TO sas_supervisor;
        GRANT DELETE ON webhook_deliveries TO sas_supervisor;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT ON webhook_deliveries TO sas_operator;
        GRANT UPDATE (state, attempts, next_at, last_error) ON webhook_deliveries TO sas_operator;
    END IF;
    FOREACH v_role IN ARRAY ARRAY['sas_console', 'sas_api'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON webhook_deliveries TO %I', v_role);
        END IF;
    END LOOP;
END
$$;
