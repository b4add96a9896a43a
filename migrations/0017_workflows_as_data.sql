-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Workflows as data: any process, not only the demo order.
--
-- workflow_versions keeps every workflow definition an order was submitted
-- with, keyed by its name and content hash (internal/workflow's Version);
-- an order names its version, and its step rows (written at submit, with
-- each step's agent, budget, threshold and backoff) pin what it runs, so
-- changing the workflows file never changes an order in flight.
--
-- The order's payload becomes one opaque jsonb object: the demo order's
-- customer, items, amount and currency move into it. Every existing row is
-- converted (this rewrites the orders table once). Orders written before
-- this migration have no workflow_version. There is no foreign key from
-- orders to workflow_versions: the submitter stores its file's versions
-- before it takes an order, and the key check would lock the version's row
-- in every order insert.
--
-- Results flow: the status event that ends an order carries the results of
-- its actions (by action name), when they fit in 32 KiB.

CREATE TABLE workflow_versions (
    name       text        NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    version    text        NOT NULL CHECK (version ~ '^[0-9a-f]{16}$'),
    definition jsonb       NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
    created_by text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (name, version)
);

ALTER TABLE orders ADD COLUMN payload jsonb, ADD COLUMN workflow_version text;
UPDATE orders SET payload = jsonb_build_object('customer', customer, 'items', items, 'amount', amount, 'currency', currency);
ALTER TABLE orders
    ALTER COLUMN payload SET NOT NULL,
    ADD CONSTRAINT orders_payload_is_object CHECK (jsonb_typeof(payload) = 'object'),
    DROP COLUMN customer,
    DROP COLUMN items,
    DROP COLUMN amount,
    DROP COLUMN currency;

-- A step's own supervisor backoff (NULL: the supervisor's settings).
ALTER TABLE steps
    ADD COLUMN backoff_base interval CHECK (backoff_base > interval '0'),
    ADD COLUMN backoff_max  interval CHECK (backoff_max > interval '0');

-- status_event_body with results: for an order that ends (completed,
-- failed, error), the results of its actions so far, merged with
-- p_more_results (results written by the same statement, which it cannot
-- read yet); over 32 KiB, only "results_truncated": true.
CREATE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer, p_more_results jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_body    jsonb;
    v_results jsonb;
BEGIN
    v_body := jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'status', p_status,
        'step', p_step,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
    IF p_status IN ('completed', 'failed', 'error') THEN
        SELECT coalesce(jsonb_object_agg(name, result), '{}'::jsonb) INTO v_results
        FROM steps WHERE order_id = p_order_id AND kind = 'action' AND result IS NOT NULL;
        v_results := v_results || coalesce(p_more_results, '{}'::jsonb);
        IF v_results <> '{}'::jsonb THEN
            IF octet_length(v_results::text) <= 32768 THEN
                v_body := v_body || jsonb_build_object('results', v_results);
            ELSE
                v_body := v_body || jsonb_build_object('results_truncated', true);
            END IF;
        END IF;
    END IF;
    RETURN v_body;
END;
$$;

-- The three-argument form stays one SQL expression (inlined into the
-- statements that call it) for the events that carry no results.
CREATE OR REPLACE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer) RETURNS jsonb
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_status IN ('completed', 'failed', 'error')
        THEN status_event_body(p_order_id, p_status, p_step, NULL)
        ELSE jsonb_build_object(
            'schema_version', 1,
            'order_id', p_order_id,
            'status', p_status,
            'step', p_step,
            'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_submitter') THEN
        EXECUTE 'GRANT SELECT, INSERT ON workflow_versions TO sas_submitter';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        EXECUTE 'GRANT SELECT ON workflow_versions TO sas_operator';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT SELECT ON workflow_versions TO sas_scheduler';
    END IF;
END;
$$;
