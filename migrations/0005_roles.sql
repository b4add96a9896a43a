-- Least privilege. The migrating user owns the tables; each service gets a
-- role with only the rights its statements need (NOLOGIN: give a login
-- user membership, e.g. CREATE ROLE scheduler_1 LOGIN PASSWORD '...' IN
-- ROLE sas_scheduler). Nobody but the owner may delete, alter the schema,
-- or rewrite history.
--
--   sas_submitter   writes new orders with their steps, history and events
--   sas_scheduler   claims and moves steps and orders, publishes the outbox
--   sas_supervisor  sweeps expired steps, holds the leader lease
--   sas_operator    sasctl: reads everything, resubmits and cancels orders
--
-- Roles belong to the whole cluster, grants to this schema. Roles are
-- created only if the migrating user may (a managed database may not allow
-- it: create them once by hand, then run migrate again).
DO $$
DECLARE
    v_role text;
    v_can_create boolean;
    v_schema text := current_schema();
BEGIN
    SELECT rolsuper OR rolcreaterole INTO v_can_create FROM pg_roles WHERE rolname = current_user;
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_supervisor', 'sas_operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) AND v_can_create THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by a migration of another schema
            END;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', v_schema, v_role);
            EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO %I', v_schema, v_role);
            EXECUTE format('GRANT SELECT ON schema_migrations TO %I', v_role);
            EXECUTE format('GRANT INSERT ON transitions TO %I', v_role);
            EXECUTE format('GRANT INSERT ON outbox TO %I', v_role);
            CASE v_role
            WHEN 'sas_submitter' THEN
                EXECUTE format('GRANT SELECT, INSERT ON orders, steps TO %I', v_role);
            WHEN 'sas_scheduler' THEN
                EXECUTE format('GRANT SELECT, UPDATE ON orders, steps, outbox TO %I', v_role);
            WHEN 'sas_supervisor' THEN
                EXECUTE format('GRANT SELECT, UPDATE ON orders, steps TO %I', v_role);
                EXECUTE format('GRANT SELECT, INSERT, UPDATE ON leases TO %I', v_role);
                EXECUTE format('GRANT SELECT ON outbox TO %I', v_role);
            WHEN 'sas_operator' THEN
                EXECUTE format('GRANT SELECT ON orders, steps, transitions, outbox, leases TO %I', v_role);
                EXECUTE format('GRANT UPDATE ON orders, steps TO %I', v_role);
            END CASE;
        END IF;
    END LOOP;
END;
$$;
