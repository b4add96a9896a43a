-- A signal on the queue acts in the namespace its header names, when its
-- broker login is granted it (SAS_SUBMITTER_NAMESPACES), else in default:
-- the scheduler checks that the namespace exists and that the order
-- signalled is in it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT SELECT ON namespaces TO sas_scheduler;
    END IF;
END
$$;
