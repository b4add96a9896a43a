-- The HTTP API (cmd/api): applications and operators over JSON.
--
-- api_tokens: who may call it. A token is shown once, when made (sasctl
-- api token create); only the SHA-256 of its secret is kept. Names are
-- never reused, so the name an order's history records (api:NAME) always
-- means one token. A revoked token stays, for the history that names it.
CREATE TABLE api_tokens (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text        NOT NULL UNIQUE CHECK (name ~ '^[a-zA-Z0-9][a-zA-Z0-9._-]{0,63}$'),
    role         text        NOT NULL CHECK (role IN ('submitter', 'viewer', 'operator')),
    secret_hash  bytea       NOT NULL CHECK (length(secret_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text        NOT NULL,
    revoked_at   timestamptz,
    revoked_by   text,
    last_used_at timestamptz
);

-- order_attributes: a workflow's search attributes, extracted from the
-- payload at submit (a CEL expression each) and stored typed, one row per
-- order and name. Each type's index serves an equality or a range on the
-- value with the orders list's keyset order (created_at, order_id), so a
-- page of "customer = 42" costs the same over millions of orders as over
-- a few. As steps and history, both tables go with their order (the
-- triggers orders_delete_history and orders_truncate_rows), not by a
-- foreign key.
CREATE TABLE order_attributes (
    order_id   uuid        NOT NULL,
    name       text        NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    created_at timestamptz NOT NULL,
    v_text     text        CHECK (length(v_text) <= 256),
    v_num      double precision,
    v_bool     boolean,
    v_time     timestamptz,
    CHECK (num_nonnulls(v_text, v_num, v_bool, v_time) = 1),
    PRIMARY KEY (order_id, name)
);
CREATE INDEX order_attributes_text_idx ON order_attributes (name, v_text, created_at DESC, order_id DESC) WHERE v_text IS NOT NULL;
CREATE INDEX order_attributes_num_idx ON order_attributes (name, v_num, created_at DESC, order_id DESC) WHERE v_num IS NOT NULL;
CREATE INDEX order_attributes_bool_idx ON order_attributes (name, v_bool, created_at DESC, order_id DESC) WHERE v_bool IS NOT NULL;
CREATE INDEX order_attributes_time_idx ON order_attributes (name, v_time, created_at DESC, order_id DESC) WHERE v_time IS NOT NULL;

-- order_payloads: the payloads an order had before a re-run with a
-- corrected one replaced it, and who replaced each.
CREATE TABLE order_payloads (
    order_id    uuid        NOT NULL,
    replaced_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload     jsonb       NOT NULL,
    replaced_by text        NOT NULL,
    PRIMARY KEY (order_id, replaced_at)
);

-- bulk_jobs: a resubmit or cancel of every order a filter selected. The
-- orders are chosen when the job is made (bulk_job_orders, pending) and
-- each is acted on in the transaction that marks it done, so a job taken
-- over after a crash acts on none twice. An API replica runs a job while
-- it holds its lease (locked_by, locked_until on the database clock).
CREATE TABLE bulk_jobs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action       text        NOT NULL CHECK (action IN ('resubmit', 'cancel')),
    filter       jsonb       NOT NULL,
    state        text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'stopped', 'done')),
    total        integer     NOT NULL CHECK (total >= 0),
    done         integer     NOT NULL DEFAULT 0,
    failed       integer     NOT NULL DEFAULT 0,
    created_by   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    stopped_by   text,
    locked_by    text,
    locked_until timestamptz
);
CREATE INDEX bulk_jobs_running_idx ON bulk_jobs (id) WHERE state = 'running';

CREATE TABLE bulk_job_orders (
    job_id   bigint      NOT NULL REFERENCES bulk_jobs (id) ON DELETE CASCADE,
    order_id uuid        NOT NULL,
    outcome  text        CHECK (outcome IN ('done', 'failed')),
    detail   text        NOT NULL DEFAULT '' CHECK (length(detail) <= 1000),
    at       timestamptz,
    PRIMARY KEY (job_id, order_id)
);
CREATE INDEX bulk_job_orders_pending_idx ON bulk_job_orders (job_id, order_id) WHERE outcome IS NULL;

-- overview_minutes: the console's charts of the last hour, a row per
-- minute and workflow, written by the leading supervisor
-- (overview_sample): of the orders that came in that minute, how many
-- completed and failed and their submit-to-end latency; and the steps
-- pending at the minute's last sample. Two hours are kept.
CREATE TABLE overview_minutes (
    minute    timestamptz NOT NULL,
    workflow  text        NOT NULL,
    completed integer     NOT NULL DEFAULT 0,
    failed    integer     NOT NULL DEFAULT 0,
    p50_ms    double precision,
    p95_ms    double precision,
    pending   integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, workflow)
);

-- sas_api: the API service's role. It submits as the submitter does,
-- reads as the console does, acts on orders through the operator
-- functions (which record its login and the token's name), reads the
-- tokens, and runs bulk jobs and re-runs.
DO $$
DECLARE
    v_schema text := current_schema();
    v_can_create boolean;
    v_fn text;
BEGIN
    SELECT rolsuper OR rolcreaterole INTO v_can_create FROM pg_roles WHERE rolname = current_user;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_api') AND v_can_create THEN
        BEGIN
            CREATE ROLE sas_api NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created meanwhile by a migration of another schema
        END;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_api') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO sas_api', v_schema);
        EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO sas_api', v_schema);
        GRANT SELECT ON schema_migrations, orders, steps, transitions, alerts, leases, operator_actions, signals,
            schedules, api_tokens, order_payloads, overview_minutes TO sas_api;
        GRANT SELECT, INSERT ON workflow_versions TO sas_api;
        GRANT INSERT ON orders, steps, transitions, outbox TO sas_api;
        GRANT UPDATE (payload, updated_at) ON orders TO sas_api;
        GRANT UPDATE (idempotency_key) ON steps TO sas_api;
        GRANT INSERT ON order_payloads TO sas_api;
        GRANT SELECT, INSERT, DELETE ON order_attributes TO sas_api;
        GRANT UPDATE (last_used_at) ON api_tokens TO sas_api;
        GRANT SELECT, INSERT, UPDATE ON bulk_jobs, bulk_job_orders TO sas_api;
        FOREACH v_fn IN ARRAY ARRAY['operator_resubmit(uuid, integer, text)', 'operator_cancel(uuid, text)',
                                    'record_operator_action(text, text, text, text)'] LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO sas_api', v_fn);
        END LOOP;
    END IF;
    -- Whoever writes orders writes their attributes: submitters, schedulers
    -- (children) and supervisors (scheduled orders).
    FOREACH v_fn IN ARRAY ARRAY['sas_submitter', 'sas_scheduler', 'sas_supervisor'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_fn) THEN
            EXECUTE format('GRANT INSERT ON order_attributes TO %I', v_fn);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON overview_minutes TO sas_supervisor;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT, INSERT, UPDATE ON api_tokens TO sas_operator;
        GRANT SELECT ON order_attributes, order_payloads, bulk_jobs, bulk_job_orders, overview_minutes TO sas_operator;
    END IF;
    -- The console makes bulk jobs (the API's replicas run them) and
    -- stops them, and re-runs an order with a corrected payload as the
    -- API does (statestore.Rerun: the payload and its history, the
    -- attributes, new keys for the failed steps, then operator_resubmit).
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO sas_console', v_schema);
        GRANT SELECT ON order_attributes, order_payloads, overview_minutes TO sas_console;
        GRANT UPDATE (payload, updated_at) ON orders TO sas_console;
        GRANT UPDATE (idempotency_key) ON steps TO sas_console;
        GRANT INSERT ON order_payloads TO sas_console;
        GRANT INSERT, DELETE ON order_attributes TO sas_console;
        GRANT SELECT, INSERT ON bulk_jobs, bulk_job_orders TO sas_console;
        GRANT UPDATE (state, stopped_by, updated_at, total) ON bulk_jobs TO sas_console;
    END IF;
END
$$;
