-- Progress events nobody hears. A status event that only says where an
-- order has got to (received, processing, compensating) and that no queue
-- is bound for is dropped by RabbitMQ, after it was written, read,
-- published, confirmed and deleted: at low load most of what relaying an
-- order's events costs. When the broker returns such an event, the relay
-- records its status here as unheard for a while (SAS_SKIP_UNHEARD_EVENTS);
-- meanwhile its writers do not write it unless the order has a reply_to.
-- Once the while has passed, events of that status are written again, and
-- the first one returned marks it again: a queue bound for them hears
-- them within that while. Events that end an order are always written.
-- A listener of sas's own (the API, for the orders it follows) clears the
-- marks as soon as it has bound (statestore.HearStatusEvents).
CREATE TABLE status_routes (
    status text PRIMARY KEY,
    unheard_until timestamptz NOT NULL
);

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['sas_submitter', 'sas_supervisor', 'sas_operator', 'sas_console'] LOOP
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            EXECUTE format('GRANT SELECT ON status_routes TO %I', v_role);
        END IF;
    END LOOP;
    -- the relay marks; the API clears the marks
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_scheduler') THEN
        GRANT SELECT, INSERT, UPDATE ON status_routes TO sas_scheduler;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_api') THEN
        GRANT SELECT, UPDATE ON status_routes TO sas_api;
    END IF;
END
$$;
