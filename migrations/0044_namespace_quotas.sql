-- Tenants, second part: a namespace's quotas, each NULL for none. The
-- orders it has in flight (received, processing, compensating or held in
-- error), the rate of its submits (a bucket of max_submit_burst orders
-- refilled at max_submit_rate a second, on the database clock; its level
-- in rate_tokens as of rate_at) and the bytes of one order's payload.
-- namespace_admit (sql/10_orders.sql) applies them as an order is written.
-- The default namespace has none: a deployment that names no namespace
-- writes its orders as before.
ALTER TABLE namespaces
    ADD COLUMN max_in_flight     integer          CHECK (max_in_flight > 0),
    ADD COLUMN max_submit_rate   double precision CHECK (max_submit_rate > 0 AND max_submit_rate <= 1000000),
    ADD COLUMN max_submit_burst  integer          CHECK (max_submit_burst > 0),
    ADD COLUMN max_payload_bytes integer          CHECK (max_payload_bytes > 0),
    ADD COLUMN rate_tokens       double precision,
    ADD COLUMN rate_at           timestamptz,
    ADD COLUMN quotas_by         text,
    ADD COLUMN quotas_at         timestamptz,
    ADD CONSTRAINT namespaces_default_has_no_quotas CHECK (name <> 'default' OR (max_in_flight IS NULL
        AND max_submit_rate IS NULL AND max_submit_burst IS NULL AND max_payload_bytes IS NULL)),
    ADD CONSTRAINT namespaces_burst_has_rate CHECK (max_submit_burst IS NULL OR max_submit_rate IS NOT NULL);

-- The orders in flight of a namespace other than the default, counted at
-- each admission: the default's orders are never in it, so writing them
-- costs what it did.
CREATE INDEX orders_namespace_in_flight_idx ON orders (namespace)
    WHERE namespace <> 'default' AND status IN ('received', 'processing', 'compensating', 'error');

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT UPDATE (max_in_flight, max_submit_rate, max_submit_burst, max_payload_bytes, rate_tokens, rate_at,
                      quotas_by, quotas_at) ON namespaces TO sas_operator;
    END IF;
END
$$;
