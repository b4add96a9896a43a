-- A service that answers a call 202 Accepted ends the step later, by a
-- callback carrying the step's token (Sas-Step-Token): a signal with the
-- token, applied as the attempt's reply and fenced as one. The token is an
-- HMAC of order, step and attempt (internal/steptoken) under the key made
-- here, once, at random; only the schedulers read it.
CREATE TABLE step_token_key (
    id  smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    key text     NOT NULL CHECK (length(key) >= 32)
);
INSERT INTO step_token_key (key) VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

-- An attempt its service holds open (a 202 or a heartbeat): held_attempt
-- is that attempt, held_since when it was claimed. Each hold pushes
-- complete_by out from the clock, never past held_since plus the step's
-- max_duration (step_hold). A claim leaves both: they speak only for the
-- attempt they name.
ALTER TABLE steps ADD COLUMN held_attempt integer, ADD COLUMN held_since timestamptz;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        EXECUTE 'GRANT SELECT ON step_token_key TO sas_scheduler';
    END IF;
END
$$;
