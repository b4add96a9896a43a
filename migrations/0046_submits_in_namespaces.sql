-- A submit on the queue may name a namespace its broker login is granted
-- (SAS_SUBMITTER_NAMESPACES): the submitter checks that the namespace
-- exists and holds it to its quotas (namespace_admit, granted in the
-- functions' security file).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_submitter') THEN
        GRANT SELECT ON namespaces TO sas_submitter;
    END IF;
END
$$;
