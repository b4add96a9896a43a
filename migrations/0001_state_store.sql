-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- The state store of the Scheduler Agent Supervisor pattern.
--
-- Tables are created unqualified so that the schema is chosen by the
-- connection's search_path: production uses the default schema, tests use
-- one schema each.

-- orders: one row per order, written by the submitter together with its
-- steps in one transaction.
CREATE TABLE orders (
    order_id     uuid        PRIMARY KEY,
    workflow     text        NOT NULL,
    customer     text        NOT NULL CHECK (length(customer) BETWEEN 1 AND 200),
    items        jsonb       NOT NULL CHECK (jsonb_typeof(items) = 'array' AND jsonb_array_length(items) > 0),
    amount       bigint      NOT NULL CHECK (amount >= 0),
    currency     text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    priority     smallint    NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    reply_to     text        CHECK (reply_to IS NULL OR length(reply_to) BETWEEN 1 AND 255),
    placed_at    timestamptz,
    -- SHA-256 of the canonical order payload: a second submission with the
    -- same order_id is a duplicate when it matches and a conflict when not.
    payload_hash bytea       NOT NULL CHECK (length(payload_hash) = 32),
    status       text        NOT NULL DEFAULT 'received'
                 CHECK (status IN ('received', 'processing', 'completed', 'compensating', 'failed', 'error')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_status_created_idx ON orders (status, created_at DESC);
CREATE INDEX orders_created_idx ON orders (created_at DESC);

-- steps: the pattern's state rows, one per (order, step).
CREATE TABLE steps (
    order_id        uuid        NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    step            integer     NOT NULL CHECK (step >= 1),
    name            text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    kind            text        NOT NULL DEFAULT 'action' CHECK (kind IN ('action', 'compensation')),
    agent           text        NOT NULL CHECK (length(agent) BETWEEN 1 AND 100),
    process_state   text        NOT NULL
                    CHECK (process_state IN ('waiting', 'pending', 'processing', 'processed', 'error', 'cancelled')),
    -- copied from the order so the claim index can order by it
    priority        smallint    NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    locked_by       text,
    complete_by     timestamptz,
    -- the budget a claim gives the step: complete_by = now() + timeout
    timeout         interval    NOT NULL CHECK (timeout > interval '0'),
    failure_count   integer     NOT NULL DEFAULT 0 CHECK (failure_count >= 0),
    -- the failure threshold: at failure_count = max_failures the step is error
    max_failures    integer     NOT NULL CHECK (max_failures >= 1),
    -- fencing epoch, +1 on every claim
    attempt         integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    idempotency_key text        NOT NULL UNIQUE,
    available_at    timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    result          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, step),
    -- a step being processed always has an owner and a deadline
    CHECK (process_state <> 'processing' OR (locked_by IS NOT NULL AND complete_by IS NOT NULL))
);

-- The scheduler's claim: pending steps by priority, then by when they became due.
CREATE INDEX steps_pending_idx ON steps (priority DESC, available_at, order_id, step)
    WHERE process_state = 'pending';
-- The supervisor's sweep: processing steps by deadline.
CREATE INDEX steps_processing_idx ON steps (complete_by)
    WHERE process_state = 'processing';
-- Operators looking for held work.
CREATE INDEX steps_error_idx ON steps (order_id) WHERE process_state = 'error';

-- transitions: append-only history of every state change of an order or a
-- step (step IS NULL for order-level changes). The operator's audit trail
-- and the oracle for invariant checks.
CREATE TABLE transitions (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id   uuid        NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    step       integer,
    from_state text,
    to_state   text        NOT NULL,
    attempt    integer     NOT NULL DEFAULT 0,
    actor      text        NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    at         timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX transitions_order_idx ON transitions (order_id, id);

CREATE FUNCTION transitions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'transitions is append-only';
END;
$$;

CREATE TRIGGER transitions_no_update BEFORE UPDATE ON transitions
    FOR EACH ROW EXECUTE FUNCTION transitions_append_only();

-- outbox: messages to publish after commit (status events, operator
-- alerts), written in the same transaction as the state change.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   uuid        NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    message_type text        NOT NULL CHECK (message_type IN ('status_event', 'operator_alert')),
    order_id     uuid        NOT NULL,
    -- the order's private status queue, if it has one
    reply_to     text,
    body         jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0
);

CREATE INDEX outbox_unpublished_idx ON outbox (id) WHERE published_at IS NULL;

-- Bodies of the messages written to the outbox, stamped with the database
-- clock. They match internal/messages' StatusEvent and OperatorAlert.
CREATE FUNCTION status_event_body(p_order_id uuid, p_status text, p_step integer) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'status', p_status,
        'step', p_step,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;

CREATE FUNCTION operator_alert_body(p_order_id uuid, p_step integer, p_reason text, p_failure_count integer) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'schema_version', 1,
        'order_id', p_order_id,
        'step', p_step,
        'reason', p_reason,
        'failure_count', p_failure_count,
        'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;
