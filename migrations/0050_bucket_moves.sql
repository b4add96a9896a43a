-- Past one primary, moving buckets: a partitioned deployment's buckets
-- are first owned as its layout file splits them; a bucket moved since
-- (sasctl partitions move) has a row here, in every partition's store,
-- naming its owner now. 'moving': its new owner holds its submits until
-- the move has copied the ids the old owner wrote; 'moved': the owner
-- writes its orders. An order stays in the store that wrote it.
CREATE TABLE partition_buckets (
    bucket     int         PRIMARY KEY CHECK (bucket BETWEEN 0 AND 4095),
    owner      text        NOT NULL CHECK (owner ~ '^[a-z0-9][a-z0-9-]{0,31}$'),
    state      text        NOT NULL CHECK (state IN ('moving', 'moved')),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The ids (and payload hashes) of the orders a bucket's earlier owners
-- wrote, copied into its new owner's store: a submit retried across the
-- move is a duplicate there (or a conflict), never a second order.
CREATE TABLE moved_orders (
    order_id       uuid  PRIMARY KEY,
    payload_hash   bytea NOT NULL,
    from_partition text  NOT NULL
);

-- Every move and how far it got, kept in the first partition's store.
CREATE TABLE partition_moves (
    id             bigserial   PRIMARY KEY,
    bucket         int         NOT NULL CHECK (bucket BETWEEN 0 AND 4095),
    from_partition text        NOT NULL,
    to_partition   text        NOT NULL,
    state          text        NOT NULL CHECK (state IN ('copying', 'draining', 'done')),
    copied         bigint      NOT NULL DEFAULT 0,
    running        bigint      NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at       timestamptz,
    started_by     text        NOT NULL CHECK (length(started_by) BETWEEN 1 AND 200)
);
-- One move of a bucket copying at a time (a move draining, its new owner
-- writing the bucket's orders, lets the bucket move on).
CREATE UNIQUE INDEX partition_moves_one_at_a_time ON partition_moves (bucket) WHERE state = 'copying';

DO $$
DECLARE
    v_role text;
BEGIN
    -- Whoever writes orders reads who owns a bucket, and a new owner's
    -- copied ids.
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_api', 'sas_console'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON partition_buckets, moved_orders, partition_moves TO %I', v_role);
        END IF;
    END LOOP;
    -- sasctl partitions move, as an operator's login.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT SELECT, INSERT, UPDATE ON partition_buckets, moved_orders, partition_moves TO sas_operator;
        GRANT USAGE ON SEQUENCE partition_moves_id_seq TO sas_operator;
        GRANT SELECT ON orders TO sas_operator;
    END IF;
END
$$;
