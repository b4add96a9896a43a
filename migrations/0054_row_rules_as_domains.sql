-- The rules of one column of steps and orders become domains over the
-- column's type, keeping their names. PostgreSQL reads every CHECK
-- constraint of a table back from its stored node text, and prepares it,
-- at each statement that writes a row of the table (steps: twenty, 12.8
-- KB of text; orders: ten, 8.0 KB): at a few orders a second, where a
-- statement writes one row, that was an eighth of PostgreSQL's CPU. A
-- domain's rules are read once a session and checked only where a
-- statement assigns the column. The rules of several columns, the state
-- lists (read by triggers and partial indexes) and the step's number (a
-- column of the key) stay CHECK constraints, the lists written as one
-- array constant (a third of the text).
--
-- Each column first takes a domain without rules (no rewrite of the
-- table), then its domain takes the rule NOT VALID: the rows have kept
-- the same rule as a CHECK until this transaction, so no scan of the
-- table is needed for them, and every value written after is checked.

CREATE DOMAIN steps_name AS text;
CREATE DOMAIN steps_agent AS text;
CREATE DOMAIN steps_fair_key AS text;
CREATE DOMAIN steps_priority AS smallint;
CREATE DOMAIN steps_timeout AS interval;
CREATE DOMAIN steps_backoff_base AS interval;
CREATE DOMAIN steps_backoff_max AS interval;
CREATE DOMAIN steps_max_failures AS integer;
CREATE DOMAIN steps_failure_count AS integer;
CREATE DOMAIN steps_attempt AS integer;
CREATE DOMAIN steps_unsent_attempts AS integer;
CREATE DOMAIN steps_item_index AS integer;
CREATE DOMAIN steps_fair_max AS integer;
CREATE DOMAIN steps_agent_call_us AS bigint;

CREATE DOMAIN orders_reply_to AS text;
CREATE DOMAIN orders_traceparent AS text;
CREATE DOMAIN orders_failure_policy AS text;
CREATE DOMAIN orders_namespace AS text;
CREATE DOMAIN orders_priority AS smallint;
CREATE DOMAIN orders_depth AS smallint;
CREATE DOMAIN orders_payload AS jsonb;
CREATE DOMAIN orders_payload_hash AS bytea;

ALTER TABLE steps
    DROP CONSTRAINT steps_name_check,
    DROP CONSTRAINT steps_agent_check,
    DROP CONSTRAINT steps_fair_key_check,
    DROP CONSTRAINT steps_priority_check,
    DROP CONSTRAINT steps_timeout_check,
    DROP CONSTRAINT steps_backoff_base_check,
    DROP CONSTRAINT steps_backoff_max_check,
    DROP CONSTRAINT steps_max_failures_check,
    DROP CONSTRAINT steps_failure_count_check,
    DROP CONSTRAINT steps_attempt_check,
    DROP CONSTRAINT steps_unsent_attempts_check,
    DROP CONSTRAINT steps_item_index_check,
    DROP CONSTRAINT steps_fair_max_check,
    DROP CONSTRAINT steps_agent_call_us_check,
    DROP CONSTRAINT steps_process_state_check,
    DROP CONSTRAINT steps_delayed_has_due_at,
    DROP CONSTRAINT steps_kind_check,
    ALTER COLUMN name TYPE steps_name,
    ALTER COLUMN agent TYPE steps_agent,
    ALTER COLUMN fair_key TYPE steps_fair_key,
    ALTER COLUMN priority TYPE steps_priority,
    ALTER COLUMN timeout TYPE steps_timeout,
    ALTER COLUMN backoff_base TYPE steps_backoff_base,
    ALTER COLUMN backoff_max TYPE steps_backoff_max,
    ALTER COLUMN max_failures TYPE steps_max_failures,
    ALTER COLUMN failure_count TYPE steps_failure_count,
    ALTER COLUMN attempt TYPE steps_attempt,
    ALTER COLUMN unsent_attempts TYPE steps_unsent_attempts,
    ALTER COLUMN item_index TYPE steps_item_index,
    ALTER COLUMN fair_max TYPE steps_fair_max,
    ALTER COLUMN agent_call_us TYPE steps_agent_call_us;

ALTER TABLE orders
    DROP CONSTRAINT orders_reply_to_check,
    DROP CONSTRAINT orders_traceparent_check,
    DROP CONSTRAINT orders_failure_policy_check,
    DROP CONSTRAINT orders_namespace_check,
    DROP CONSTRAINT orders_priority_check,
    DROP CONSTRAINT orders_depth_check,
    DROP CONSTRAINT orders_payload_is_object,
    DROP CONSTRAINT orders_payload_hash_check,
    DROP CONSTRAINT orders_status_check,
    ALTER COLUMN reply_to TYPE orders_reply_to,
    ALTER COLUMN traceparent TYPE orders_traceparent,
    ALTER COLUMN failure_policy TYPE orders_failure_policy,
    ALTER COLUMN namespace TYPE orders_namespace,
    ALTER COLUMN priority TYPE orders_priority,
    ALTER COLUMN depth TYPE orders_depth,
    ALTER COLUMN payload TYPE orders_payload,
    ALTER COLUMN payload_hash TYPE orders_payload_hash;

ALTER DOMAIN steps_name ADD CONSTRAINT steps_name_check CHECK (length(VALUE) BETWEEN 1 AND 100) NOT VALID;
ALTER DOMAIN steps_agent ADD CONSTRAINT steps_agent_check CHECK (length(VALUE) <= 100) NOT VALID;
ALTER DOMAIN steps_fair_key ADD CONSTRAINT steps_fair_key_check CHECK (length(VALUE) <= 320) NOT VALID;
ALTER DOMAIN steps_priority ADD CONSTRAINT steps_priority_check CHECK (VALUE BETWEEN 0 AND 9) NOT VALID;
ALTER DOMAIN steps_timeout ADD CONSTRAINT steps_timeout_check CHECK (VALUE > interval '0') NOT VALID;
ALTER DOMAIN steps_backoff_base ADD CONSTRAINT steps_backoff_base_check CHECK (VALUE > interval '0') NOT VALID;
ALTER DOMAIN steps_backoff_max ADD CONSTRAINT steps_backoff_max_check CHECK (VALUE > interval '0') NOT VALID;
ALTER DOMAIN steps_max_failures ADD CONSTRAINT steps_max_failures_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN steps_failure_count ADD CONSTRAINT steps_failure_count_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN steps_attempt ADD CONSTRAINT steps_attempt_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN steps_unsent_attempts ADD CONSTRAINT steps_unsent_attempts_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN steps_item_index ADD CONSTRAINT steps_item_index_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN steps_fair_max ADD CONSTRAINT steps_fair_max_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN steps_agent_call_us ADD CONSTRAINT steps_agent_call_us_check CHECK (VALUE >= 0) NOT VALID;

ALTER DOMAIN orders_reply_to ADD CONSTRAINT orders_reply_to_check CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN orders_traceparent ADD CONSTRAINT orders_traceparent_check CHECK (length(VALUE) <= 128) NOT VALID;
ALTER DOMAIN orders_failure_policy ADD CONSTRAINT orders_failure_policy_check CHECK (VALUE IN ('compensate', 'hold')) NOT VALID;
ALTER DOMAIN orders_namespace ADD CONSTRAINT orders_namespace_check CHECK (VALUE ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$') NOT VALID;
ALTER DOMAIN orders_priority ADD CONSTRAINT orders_priority_check CHECK (VALUE BETWEEN 0 AND 9) NOT VALID;
ALTER DOMAIN orders_depth ADD CONSTRAINT orders_depth_check CHECK (VALUE BETWEEN 0 AND 5) NOT VALID;
ALTER DOMAIN orders_payload ADD CONSTRAINT orders_payload_is_object CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID;
ALTER DOMAIN orders_payload_hash ADD CONSTRAINT orders_payload_hash_check CHECK (length(VALUE) = 32) NOT VALID;

ALTER TABLE steps
    ADD CONSTRAINT steps_process_state_check CHECK (process_state = ANY (
        '{waiting,pending,processing,processed,error,cancelled,skipped,expanded,delayed,awaiting}'::text[])),
    ADD CONSTRAINT steps_delayed_has_due_at CHECK (process_state <> ALL ('{delayed,awaiting}'::text[]) OR due_at IS NOT NULL),
    ADD CONSTRAINT steps_kind_check CHECK (kind = ANY ('{action,compensation}'::text[]));
ALTER TABLE orders
    ADD CONSTRAINT orders_status_check CHECK (status = ANY (
        '{received,processing,completed,compensating,failed,error}'::text[]));
