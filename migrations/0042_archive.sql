-- Archival before retention: the leading supervisor reads an ended
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
END
$$;
