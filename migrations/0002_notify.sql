-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.
-- Wake-ups for schedulers: NOTIFY sas_pending when a statement makes steps
-- pending, and sas_outbox when it writes outbox rows. Notifications are
-- sent at commit and folded within a transaction, so a batch costs one.
-- They only wake; schedulers still poll, so a lost notification delays
-- work by at most one poll interval.

CREATE FUNCTION notify_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE process_state = 'pending') THEN
        PERFORM pg_notify('sas_pending', current_schema());
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER steps_notify_pending_insert AFTER INSERT ON steps
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION notify_pending();

CREATE TRIGGER steps_notify_pending_update AFTER UPDATE ON steps
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION notify_pending();

CREATE FUNCTION notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sas_outbox', current_schema());
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION notify_outbox();
