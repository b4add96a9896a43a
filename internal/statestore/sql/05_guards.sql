-- Notifications and guards: the triggers' functions.

-- notify_pending: wakes the schedulers when a step becomes pending.
CREATE OR REPLACE FUNCTION notify_pending()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE process_state = 'pending') THEN
        PERFORM pg_notify('sas_pending', current_schema());
    END IF;
    RETURN NULL;
END;
$function$;

-- notify_outbox: wakes the relay when a message is queued.
CREATE OR REPLACE FUNCTION notify_outbox()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('sas_outbox', current_schema());
    RETURN NULL;
END;
$function$;

-- transitions_append_only: the history is appended to, never changed.
CREATE OR REPLACE FUNCTION transitions_append_only()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'transitions is append-only';
END;
$function$;

-- orders_delete_history: deleting orders deletes their steps and history
-- (retention).
CREATE OR REPLACE FUNCTION orders_delete_history()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM steps s USING gone g WHERE s.order_id = g.order_id;
    DELETE FROM transitions t USING gone g WHERE t.order_id = g.order_id;
    DELETE FROM signals n USING gone g WHERE n.order_id = g.order_id;
    DELETE FROM order_attributes a USING gone g WHERE a.order_id = g.order_id;
    DELETE FROM order_payloads p USING gone g WHERE p.order_id = g.order_id;
    RETURN NULL;
END;
$function$;

-- orders_truncate_rows: truncating orders truncates steps and history.
CREATE OR REPLACE FUNCTION orders_truncate_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    TRUNCATE steps, transitions, signals, order_attributes, order_payloads;
    RETURN NULL;
END;
$function$;
