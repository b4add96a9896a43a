-- Archival before retention, and signals by key. The leading supervisor reads an ended
-- order's whole record (its signals, payloads and search attributes
-- too) to write it to the archive before it deletes it (purge_orders).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT ON signals, order_payloads, order_attributes TO sas_supervisor;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT ON signals TO sas_operator;
    END IF;
    -- A signal by business key on the signals queue: the scheduler finds
    -- its orders by their search attributes.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT SELECT ON order_attributes TO sas_scheduler;
    END IF;
END
$$;
