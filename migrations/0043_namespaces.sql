-- Tenants, first part: every order belongs to a namespace, and an API
-- token acts only in the namespaces granted to it. Every order there is
-- is in 'default', and so is every token there is: a deployment that
-- names no namespace sees nothing change. A token granted '*' acts in
-- every namespace (the deployment's own operators).
CREATE TABLE namespaces (
    name       text        PRIMARY KEY CHECK (name ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'),
    created_at timestamptz NOT NULL DEFAULT now(),
    created_by text        NOT NULL
);
INSERT INTO namespaces (name, created_by) VALUES ('default', 'migration 0043');

-- A constant default: no row is rewritten.
ALTER TABLE orders ADD COLUMN namespace text NOT NULL DEFAULT 'default'
    CHECK (namespace ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');

ALTER TABLE api_tokens ADD COLUMN namespaces text[] NOT NULL DEFAULT '{default}'
    CHECK (cardinality(namespaces) BETWEEN 1 AND 64);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_api') THEN
        GRANT SELECT ON namespaces TO sas_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        GRANT SELECT ON namespaces TO sas_console;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT, INSERT ON namespaces TO sas_operator;
    END IF;
END
$$;
