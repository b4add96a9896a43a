-- Notifications and guards: the triggers' functions.

-- notify_pending: wakes the schedulers when new steps are pending. An
-- order whose first step waits (a delay, a start time, a signal) is
-- claimed by nobody now, whose claim would nudge the relay to publish its
-- received event: the relay is woken instead, and the supervisor's timer
-- loop is told of the timer if it falls due before the loop looks next
-- (timer_set).
CREATE OR REPLACE FUNCTION notify_pending()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows WHERE process_state = 'pending') THEN
        PERFORM pg_notify('sas_pending', current_schema());
    END IF;
    IF EXISTS (SELECT 1 FROM new_rows WHERE process_state IN ('delayed', 'awaiting')) THEN
        PERFORM pg_notify('sas_outbox', current_schema());
        PERFORM timer_set((SELECT min(due_at) FROM new_rows WHERE process_state IN ('delayed', 'awaiting')));
    END IF;
    RETURN NULL;
END;
$function$;

-- timer_set: a timer due at p_due was set. The shared lock is held to
-- the writer's commit, so that the loop's look (timers_watch, which takes
-- the lock alone) either sees this timer or was recorded before it was
-- read here.
CREATE OR REPLACE FUNCTION timer_set(p_due timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('sas.timers.' || current_schema(), 0));
    IF p_due < (SELECT next_look FROM timer_watch) THEN
        PERFORM pg_notify('sas_timers', current_schema());
    END IF;
END;
$function$;

-- steps_timer_set: a step became a timer by an update (trigger
-- steps_timer_set, whose WHEN clause picks the rows).
CREATE OR REPLACE FUNCTION steps_timer_set()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM timer_set(NEW.due_at);
    RETURN NULL;
END;
$function$;

-- deadline_timer_set: an order's deadline was written (trigger
-- order_deadlines_timer_set): a timer like any other.
CREATE OR REPLACE FUNCTION deadline_timer_set()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM timer_set(NEW.due_at);
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
    DELETE FROM order_deadlines d USING gone g WHERE d.order_id = g.order_id;
    DELETE FROM order_pauses p USING gone g WHERE p.order_id = g.order_id;
    RETURN NULL;
END;
$function$;

-- orders_truncate_rows: truncating orders truncates steps and history.
CREATE OR REPLACE FUNCTION orders_truncate_rows()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    TRUNCATE steps, transitions, signals, order_attributes, order_payloads, order_deadlines, order_pauses;
    RETURN NULL;
END;
$function$;

-- The door (migration 0034): every change of a step's process_state or an
-- order's status counts the row's moves (moves = moves + 1) and names who
-- made it and why (moved_by, moved_why); these triggers check each move
-- against step_moves or order_moves and write it to the history. Nothing
-- else writes a move's history. They run as the schema's owner: a role
-- that may move a step (through a function or a grant) need not be able
-- to write the history itself.

-- sas_refuse_move: fails the statement that made a move the tables do not
-- hold, or changed a state without counting the move.
CREATE OR REPLACE FUNCTION sas_refuse_move(p_what text, p_from text, p_to text, p_counted boolean)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NOT p_counted THEN
        RAISE EXCEPTION 'the % changed from % to % without passing the door (moves = moves + 1)', p_what, p_from, p_to
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'a % may not move from % to %', p_what, p_from, p_to
        USING ERRCODE = 'check_violation';
END;
$function$;

-- step_event_body: the step event (messages.StepEvent) a step's move
-- tells, p_row the step as the move left it and p_event the move's event
-- (step_moves.event): a compensation that ended well is told compensated.
CREATE OR REPLACE FUNCTION step_event_body(p_row steps, p_event text)
 RETURNS jsonb
 LANGUAGE sql
AS $function$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'schema_version', 1, 'order_id', p_row.order_id, 'step', p_row.step,
        'name', coalesce(p_row.spec->>'id', p_row.name), 'kind', p_row.kind,
        'event', CASE WHEN p_event = 'processed' AND p_row.kind = 'compensation' THEN 'compensated' ELSE p_event END,
        'state', p_row.process_state, 'attempt', p_row.attempt,
        'wait', CASE WHEN p_row.process_state = 'awaiting' THEN p_row.spec->'wait'->>'signal' END,
        'at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'reason', left(p_row.moved_why, 500)))
$function$;

-- steps_moved: the door of steps, once per statement over the rows it
-- changed. A move counted is checked and written: one history row, or two
-- for a move the table tells by way of another state (waiting to
-- processing by way of pending: made pending and claimed at once). A move
-- out of processing is written for the attempt a reply named (moved_for,
-- which a claim clears), else for the row's. The rows are written as the
-- join yields them: in the order the statement changed them, or by order
-- and step; either way a step's move comes after the moves of the steps
-- before it that one statement made (a reply's, then its claim of the next
-- step), and the two rows of a move by way of another state in their
-- order. No sort: it was a tenth of the door's cost.
--
-- While step events are heard (status_routes holds 'step' with its mark
-- passed: a listener said it binds step.#, statestore.HearStepEvents, and
-- the broker has not returned one lately), each move that tells one
-- (step_moves.event) is also written to the outbox as a step_event, and
-- the relay is woken. Else, as until anyone asks for them, this costs one
-- look at status_routes a statement.
CREATE OR REPLACE FUNCTION steps_moved()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_few boolean;
    v_step_events boolean;
    v_webhooks boolean;
    v_events integer;
BEGIN
    -- What the door asks before it writes, in one statement: how many
    -- rows moved, whether a listener asked for step events, whether any
    -- workflow version declares webhooks.
    SELECT (SELECT count(*) FROM new_rows) <= 16,
           EXISTS (SELECT 1 FROM status_routes r WHERE r.status = 'step' AND r.unheard_until <= now()),
           EXISTS (SELECT 1 FROM webhook_versions)
      INTO v_few, v_step_events, v_webhooks;
    -- The join of new_rows and old_rows is planned once a session, for
    -- the rows of the first statement that ran it: a nested loop, the
    -- cheapest for the one or few rows most statements move, and
    -- quadratic for the hundreds a claim or a batch of replies moves
    -- (15 ms for 300 steps). A statement that moved more than 16 rows
    -- runs the same insert from a second place, whose plan is made for
    -- such a statement: the rows hashed.
    IF v_few THEN
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT n.order_id, n.step, h.from_state, h.to_state, coalesce(h.attempt, n.attempt), n.moved_by, h.reason
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id AND o.step = n.step
        LEFT JOIN step_moves d ON d.from_state = o.process_state AND d.to_state = n.process_state
        CROSS JOIN LATERAL (VALUES (1, o.process_state, d.via, o.attempt, d.via_why),
                                   (2, coalesce(d.via, o.process_state), n.process_state,
                                    CASE WHEN o.process_state = 'processing' THEN n.moved_for END, n.moved_why))
            AS h(seq, from_state, to_state, attempt, reason)
        WHERE (n.moves <> o.moves OR n.process_state <> o.process_state)
          AND (h.seq = 2 OR d.via IS NOT NULL)
          AND CASE WHEN d.from_state IS NOT NULL AND n.moves = o.moves + 1 THEN true
                   ELSE sas_refuse_move('step', o.process_state, n.process_state, n.moves = o.moves + 1) END;
    ELSE
        INSERT INTO transitions (order_id, step, from_state, to_state, attempt, actor, reason)
        SELECT n.order_id, n.step, h.from_state, h.to_state, coalesce(h.attempt, n.attempt), n.moved_by, h.reason
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id AND o.step = n.step
        LEFT JOIN step_moves d ON d.from_state = o.process_state AND d.to_state = n.process_state
        CROSS JOIN LATERAL (VALUES (1, o.process_state, d.via, o.attempt, d.via_why),
                                   (2, coalesce(d.via, o.process_state), n.process_state,
                                    CASE WHEN o.process_state = 'processing' THEN n.moved_for END, n.moved_why))
            AS h(seq, from_state, to_state, attempt, reason)
        WHERE (n.moves <> o.moves OR n.process_state <> o.process_state)
          AND (h.seq = 2 OR d.via IS NOT NULL)
          AND CASE WHEN d.from_state IS NOT NULL AND n.moves = o.moves + 1 THEN true
                   ELSE sas_refuse_move('step', o.process_state, n.process_state, n.moves = o.moves + 1) END;
    END IF;
    IF v_step_events THEN
        INSERT INTO outbox (message_type, order_id, body)
        SELECT 'step_event', n.order_id, step_event_body(n, d.event)
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id AND o.step = n.step
        JOIN step_moves d ON d.from_state = o.process_state AND d.to_state = n.process_state
        WHERE d.event IS NOT NULL AND n.moves = o.moves + 1;
        GET DIAGNOSTICS v_events = ROW_COUNT;
        IF v_events > 0 THEN
            PERFORM pg_notify('sas_outbox', current_schema());
        END IF;
    END IF;
    -- Webhooks told of step events (migration 0039): a delivery for each
    -- webhook of the order's workflow version whose events name it, and
    -- whose namespace is the order's (none: default; '*': every one).
    -- The versions that declare webhooks are noted in webhook_versions
    -- (0053): an install without them reads an empty table.
    IF v_webhooks THEN
        INSERT INTO webhook_deliveries (order_id, workflow, url, secret_env, event, body)
        SELECT n.order_id, ord.workflow, hook->>'url', hook->>'secret_env', 'step.' || (ev.body->>'event'), ev.body
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id AND o.step = n.step
        JOIN step_moves d ON d.from_state = o.process_state AND d.to_state = n.process_state AND d.event IS NOT NULL
        JOIN orders ord ON ord.order_id = n.order_id
        JOIN webhook_versions w ON w.name = ord.workflow AND w.version = ord.workflow_version
        JOIN workflow_versions v ON v.name = w.name AND v.version = w.version
        CROSS JOIN LATERAL (SELECT step_event_body(n, d.event) AS body) ev
        CROSS JOIN LATERAL jsonb_array_elements(v.definition->'webhooks') hook
        WHERE n.moves = o.moves + 1 AND hook->'events' ? ('step.' || (ev.body->>'event'))
          AND coalesce(hook->>'namespace', 'default') IN (ord.namespace, '*');
    END IF;
    RETURN NULL;
END;
$function$;

-- orders_moved: the door of orders, once per statement over the orders
-- it changed, as steps_moved. An order's move comes after the moves of
-- its steps that led to it: in a function, its own statement after
-- theirs; in the claim's and the batched reply's one statement, the
-- orders' update ends after the steps' (TestAnOrdersMoveIsWrittenAfterItsSteps).
CREATE OR REPLACE FUNCTION orders_moved()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_few boolean;
    v_webhooks boolean;
BEGIN
    -- (One statement that asks, and twice the same insert, as in
    -- steps_moved.)
    SELECT (SELECT count(*) FROM new_rows) <= 16, EXISTS (SELECT 1 FROM webhook_versions)
      INTO v_few, v_webhooks;
    IF v_few THEN
        INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
        SELECT n.order_id, NULL, o.status, n.status, n.moved_by, n.moved_why
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id
        LEFT JOIN order_moves m ON m.from_status = o.status AND m.to_status = n.status
        WHERE (n.moves <> o.moves OR n.status <> o.status)
          AND CASE WHEN m.from_status IS NOT NULL AND n.moves = o.moves + 1 THEN true
                   ELSE sas_refuse_move('order', o.status, n.status, n.moves = o.moves + 1) END;
    ELSE
        INSERT INTO transitions (order_id, step, from_state, to_state, actor, reason)
        SELECT n.order_id, NULL, o.status, n.status, n.moved_by, n.moved_why
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id
        LEFT JOIN order_moves m ON m.from_status = o.status AND m.to_status = n.status
        WHERE (n.moves <> o.moves OR n.status <> o.status)
          AND CASE WHEN m.from_status IS NOT NULL AND n.moves = o.moves + 1 THEN true
                   ELSE sas_refuse_move('order', o.status, n.status, n.moves = o.moves + 1) END;
    END IF;
    -- Webhooks (migration 0039): a delivery for each webhook of an
    -- ended order's workflow version told of that end, of the order's
    -- namespace (none: default; '*': every one), as in steps_moved.
    IF v_webhooks THEN
        INSERT INTO webhook_deliveries (order_id, workflow, url, secret_env, event, body)
        SELECT n.order_id, n.workflow, hook->>'url', hook->>'secret_env', n.status, status_event_body(n.order_id, n.status, NULL)
        FROM new_rows n
        JOIN old_rows o ON o.order_id = n.order_id
        JOIN webhook_versions w ON w.name = n.workflow AND w.version = n.workflow_version
        JOIN workflow_versions v ON v.name = w.name AND v.version = w.version
        CROSS JOIN LATERAL jsonb_array_elements(v.definition->'webhooks') hook
        WHERE n.status <> o.status AND n.status IN ('completed', 'failed', 'error') AND hook->'events' ? n.status
          AND coalesce(hook->>'namespace', 'default') IN (n.namespace, '*');
    END IF;
    RETURN NULL;
END;
$function$;

-- workflow_versions_hooked: notes the versions just stored that declare
-- webhooks in webhook_versions (migration 0053), which the doors read.
CREATE OR REPLACE FUNCTION workflow_versions_hooked()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
BEGIN
    INSERT INTO webhook_versions (name, version)
    SELECT name, version FROM new_rows WHERE definition ? 'webhooks'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$function$;
