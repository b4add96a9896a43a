-- A schedule may start its orders in a namespace: the supervisor, which
-- writes them, checks that the namespace exists.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT ON namespaces TO sas_supervisor;
    END IF;
END
$$;
