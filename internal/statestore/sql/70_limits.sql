-- Limits per agent kind and fairness between keys.

-- limited_pick: picks, for a claim of up to p_room steps of agent kind
-- p_agent, the steps its limits allow now, and locks them (FOR UPDATE
-- SKIP LOCKED) for the claim statement that follows in the same
-- transaction. The kind's agent_limits row is locked first, so claims of
-- one kind by every scheduler take turns: each sees the steps the last
-- one claimed. The room is cut to the token bucket's whole tokens (rate,
-- burst; a service's 429 may have lowered the rate for a while) and to
-- max_in_flight less the steps processing. Keyed steps are served round
-- robin by key (each key at most its max_per_key processing), the round
-- starting after the last key served; unkeyed steps take a place in
-- every round. Within a key, priority then age decide. A claim reads at
-- most as many keys as it has room for, and of each its share of the
-- room, so its cost follows its room, not the backlog or the keys. held says which
-- limit cut the room ('rate', 'in_flight', or '' when none did), and for
-- 'rate' retry_ms how soon the bucket holds a whole token again.
-- A namespace's own limits on the kind (namespace_limits) cut its steps'
-- share of the room the same way, its steps being keyed by it
-- (step_fair_key): a namespace with no room left is passed over in the
-- round (its keys are probed, at most 256 beyond the room, never its
-- steps), the round goes on past it, and the claim takes the others'.
-- held is then 'namespace' when the kind's own limits held nothing, with
-- retry_ms for a namespace's rate.
-- Its plans are made for each call's values (how much room, which
-- cursor), and never compiled: with a backlog of thousands the planner's
-- estimates pass jit_above_cost, and compiling them took a second of CPU
-- for a claim that runs in a millisecond.
CREATE OR REPLACE FUNCTION limited_pick(p_agent text, p_room integer, OUT order_ids uuid[], OUT steps integer[], OUT waited double precision[], OUT held text, OUT retry_ms integer)
 RETURNS record
 LANGUAGE plpgsql
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
DECLARE
    l agent_limits;
    v_now timestamptz;
    v_rate double precision;
    v_max integer;
    v_burst double precision;
    v_tokens double precision;
    v_allowed integer := p_room;
    v_in_flight integer;
    v_counted timestamptz;
    v_cursor text;
    v_nl record;
    v_ns text[] := '{}';
    v_ns_room integer[] := '{}';
    v_ns_tokens double precision[] := '{}';
    v_ns_rate double precision[] := '{}';
    v_held_ns text[] := '{}';
    v_room integer;
    v_tok double precision;
    v_picked_ns text[];
BEGIN
    held := '';
    retry_ms := 0;
    SELECT * INTO l FROM agent_limits a WHERE a.agent = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_limits (agent) VALUES (p_agent) ON CONFLICT DO NOTHING;
        SELECT * INTO l FROM agent_limits a WHERE a.agent = p_agent FOR UPDATE;
    END IF;
    -- A paused kind has nothing claimed.
    IF EXISTS (SELECT 1 FROM kind_pauses kp WHERE kp.agent = p_agent) THEN
        held := 'paused';
        RETURN;
    END IF;
    -- Read once the row is ours: a claim that waited for it must not
    -- count the time the one before already refilled.
    v_now := clock_timestamp();
    IF l.set_by IS NULL THEN
        v_rate := l.file_rate;
        v_max := l.file_max_in_flight;
        v_burst := l.file_burst;
    ELSE
        v_rate := l.set_rate;
        v_max := l.set_max_in_flight;
        v_burst := l.set_burst;
    END IF;
    -- A kind without limits of its own is claimed here for its keyed
    -- steps alone (the regular claim takes the others): with none
    -- pending there is nothing to plan the pick for.
    IF v_rate IS NULL AND v_max IS NULL
       AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL) THEN
        RETURN;
    END IF;
    IF v_rate IS NOT NULL AND l.lowered_until > v_now THEN
        v_rate := least(v_rate, l.lowered_rate);
    END IF;
    IF v_rate IS NOT NULL THEN
        v_burst := coalesce(v_burst, greatest(1, ceil(v_rate / 10)));
        v_tokens := least(v_burst, l.tokens + v_rate * greatest(extract(epoch FROM v_now - l.refilled_at), 0));
        IF floor(v_tokens) < v_allowed THEN
            v_allowed := greatest(floor(v_tokens)::integer, 0);
            held := 'rate';
        END IF;
    END IF;
    IF v_max IS NOT NULL AND v_allowed > 0 THEN
        -- Counting the kind's processing steps reads each of them: it is
        -- done when the bound (the last count plus the claims since)
        -- leaves less room than this claim's, or is a second old (a step
        -- that ended makes it high, never low).
        IF l.in_flight_bound IS NULL OR l.counted_at < v_now - interval '1 second' OR l.in_flight_bound + v_allowed > v_max THEN
            v_in_flight := (SELECT count(*) FROM steps s WHERE s.process_state = 'processing' AND s.agent = p_agent);
            v_counted := v_now;
        ELSE
            v_in_flight := l.in_flight_bound;
            v_counted := l.counted_at;
        END IF;
        IF v_max - v_in_flight < v_allowed THEN
            v_allowed := greatest(v_max - v_in_flight, 0);
            held := 'in_flight';
        END IF;
    END IF;
    IF v_allowed > 0 THEN
        -- Each namespace's room under its own limits on the kind.
        FOR v_nl IN SELECT nl.namespace,
                           CASE WHEN nl.set_by IS NULL THEN nl.file_max_in_flight ELSE nl.set_max_in_flight END AS max_in_flight,
                           CASE WHEN nl.set_by IS NULL THEN nl.file_rate ELSE nl.set_rate END AS rate,
                           CASE WHEN nl.set_by IS NULL THEN nl.file_burst ELSE nl.set_burst END AS burst,
                           nl.tokens, nl.refilled_at
                    FROM namespace_limits nl WHERE nl.agent = p_agent ORDER BY nl.namespace LOOP
            v_room := v_allowed;
            v_tok := NULL;
            IF v_nl.rate IS NOT NULL THEN
                v_tok := least(coalesce(v_nl.burst, greatest(1, ceil(v_nl.rate / 10))),
                               v_nl.tokens + v_nl.rate * greatest(extract(epoch FROM v_now - v_nl.refilled_at), 0));
                v_room := least(v_room, greatest(floor(v_tok)::integer, 0));
            END IF;
            IF v_nl.max_in_flight IS NOT NULL AND v_room > 0 THEN
                v_room := least(v_room, greatest(v_nl.max_in_flight - (SELECT count(*) FROM steps s
                    WHERE s.agent = p_agent AND s.namespace = v_nl.namespace AND s.process_state = 'processing')::integer, 0));
            END IF;
            v_ns := v_ns || v_nl.namespace;
            v_ns_room := v_ns_room || v_room;
            v_ns_tokens := v_ns_tokens || v_tok;
            v_ns_rate := v_ns_rate || v_nl.rate;
            IF v_room = 0 THEN
                v_held_ns := v_held_ns || v_nl.namespace;
            END IF;
        END LOOP;
    END IF;
    IF v_allowed > 0 THEN
        -- The keys with pending steps, each found by one probe of the
        -- keyed index: those after the last one served, then from the
        -- first, at most v_allowed in all (each gets a turn before any
        -- gets two), with their max_per_key and namespace. Keys of a
        -- namespace with no room (v_held_ns) take no turn (d counts the
        -- others), and at most 256 of them are probed beyond the room (t
        -- counts every key, its place in the round).
        WITH RECURSIVE keys(k, m, ns, d, t) AS (
            (SELECT s.fair_key, s.fair_max, s.namespace, CASE WHEN s.namespace = ANY(v_held_ns) THEN 0 ELSE 1 END, 1 FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
               AND (l.fair_cursor IS NULL OR s.fair_key > l.fair_cursor)
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, n.namespace, keys.d + CASE WHEN n.namespace = ANY(v_held_ns) THEN 0 ELSE 1 END, keys.t + 1
            FROM keys
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max, s.namespace FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key > keys.k
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE keys.d < v_allowed AND keys.t < v_allowed + 256
        ), wrapped(k, m, ns, d, t) AS (
            (SELECT s.fair_key, s.fair_max, s.namespace,
                    (SELECT coalesce(max(keys.d), 0) FROM keys)::integer + CASE WHEN s.namespace = ANY(v_held_ns) THEN 0 ELSE 1 END,
                    (SELECT coalesce(max(keys.t), 0) FROM keys)::integer + 1
             FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key <= l.fair_cursor
               AND (SELECT coalesce(max(keys.d), 0) FROM keys) < v_allowed AND (SELECT coalesce(max(keys.t), 0) FROM keys) < v_allowed + 256
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, n.namespace, wrapped.d + CASE WHEN n.namespace = ANY(v_held_ns) THEN 0 ELSE 1 END, wrapped.t + 1
            FROM wrapped
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max, s.namespace FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
                                  AND s.fair_key > wrapped.k AND s.fair_key <= l.fair_cursor
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE wrapped.d < v_allowed AND wrapped.t < v_allowed + 256
        ), ring AS (
            SELECT k, m, ns, t AS pos, coalesce(ns = ANY(v_held_ns), false) AS held,
                   ceil(v_allowed::numeric / greatest(count(*) FILTER (WHERE NOT coalesce(ns = ANY(v_held_ns), false)) OVER (), 1))::integer AS share
            FROM (SELECT * FROM keys UNION ALL SELECT * FROM wrapped) x
        ), room AS (
            SELECT ring.k, ring.ns, ring.pos, CASE WHEN ring.held THEN 0 ELSE greatest(0, least(ring.share, coalesce(
                       ring.m - (SELECT count(*) FROM steps s WHERE s.agent = p_agent AND s.process_state = 'processing'
                                                                 AND s.fair_key IS NOT NULL AND s.fair_key = ring.k)::integer,
                       v_allowed), coalesce(v_ns_room[array_position(v_ns, ring.ns)], v_allowed))) END AS n
            FROM ring
        ), keyed AS (
            SELECT c.order_id, c.step, c.available_at, room.k, room.pos, c.namespace AS ns,
                   row_number() OVER (PARTITION BY room.k ORDER BY c.priority DESC, c.available_at, c.order_id, c.step) AS r
            FROM room
            CROSS JOIN LATERAL (
                SELECT s.order_id, s.step, s.available_at, s.priority, s.namespace FROM steps s
                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key = room.k
                  AND s.available_at <= now()
                  AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id))
                  AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                LIMIT room.n
                FOR UPDATE SKIP LOCKED) c
        ), plain AS (
            SELECT u.order_id, u.step, u.available_at, NULL::text AS k, 0::bigint AS pos, NULL::text AS ns,
                   row_number() OVER (ORDER BY u.priority DESC, u.available_at, u.order_id, u.step) AS r
            FROM (SELECT s.order_id, s.step, s.available_at, s.priority FROM steps s
                  WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NULL AND s.available_at <= now()
                    AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id))
                    AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                  ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                  LIMIT CASE WHEN EXISTS (SELECT 1 FROM ring WHERE NOT ring.held) THEN (SELECT max(share) FROM ring) ELSE v_allowed END
                  FOR UPDATE SKIP LOCKED) u
        ), cut AS (
            -- A namespace's steps beyond its room (its keys each had it).
            SELECT x.*, row_number() OVER (PARTITION BY x.ns ORDER BY x.r, x.pos) AS nr
            FROM (SELECT * FROM keyed UNION ALL SELECT * FROM plain) x
        ), chosen AS (
            SELECT * FROM cut
            WHERE cut.ns IS NULL OR cut.nr <= coalesce(v_ns_room[array_position(v_ns, cut.ns)], v_allowed)
            ORDER BY cut.r, cut.pos LIMIT v_allowed
        )
        SELECT array_agg(c.order_id ORDER BY c.r, c.pos), array_agg(c.step ORDER BY c.r, c.pos),
               array_agg(greatest(extract(epoch FROM v_now - c.available_at), 0)::float8 ORDER BY c.r, c.pos),
               -- The round goes on after the last key served, or passed
               -- over in the last round served.
               (SELECT z.k FROM (SELECT c2.k, c2.r, c2.pos FROM chosen c2 WHERE c2.k IS NOT NULL
                                 UNION ALL
                                 SELECT ring.k, coalesce((SELECT max(c3.r) FROM chosen c3 WHERE c3.k IS NOT NULL), 1), ring.pos
                                 FROM ring WHERE ring.held) z
                ORDER BY z.r DESC, z.pos DESC LIMIT 1),
               array_agg(c.ns) FILTER (WHERE c.ns IS NOT NULL)
        INTO order_ids, steps, waited, v_cursor, v_picked_ns
        FROM chosen c;
    END IF;
    IF held = '' AND cardinality(v_ns) > 0 THEN
        -- A namespace's limits held some of its steps back: one with no
        -- room for a step it has pending, or that took all its room.
        SELECT CASE WHEN count(*) > 0 THEN 'namespace' ELSE '' END,
               coalesce(min(ceil((1 - (x.tok - x.took)) / x.rate * 1000)::integer) FILTER (WHERE x.rate IS NOT NULL AND x.tok - x.took < 1), 0)
        INTO held, retry_ms
        FROM (SELECT u.ns, u.room, u.tok, u.rate,
                     (SELECT count(*) FROM unnest(v_picked_ns) p WHERE p = u.ns)::integer AS took
              FROM unnest(v_ns, v_ns_room, v_ns_tokens, v_ns_rate) AS u(ns, room, tok, rate)) x
        WHERE x.took >= x.room AND x.room < v_allowed
          AND EXISTS (SELECT 1 FROM steps s WHERE s.agent = p_agent AND s.namespace = x.ns AND s.process_state = 'pending'
                                              AND s.available_at <= now() AND s.fair_key IS NOT NULL LIMIT 1);
    END IF;
    IF cardinality(v_ns_tokens) > 0 THEN
        UPDATE namespace_limits nl SET
            tokens = u.tok - (SELECT count(*) FROM unnest(v_picked_ns) p WHERE p = u.ns),
            refilled_at = v_now
        FROM unnest(v_ns, v_ns_tokens) AS u(ns, tok)
        WHERE nl.agent = p_agent AND nl.namespace = u.ns AND u.tok IS NOT NULL;
    END IF;
    IF held = 'rate' THEN
        retry_ms := ceil((1 - (v_tokens - coalesce(cardinality(order_ids), 0))) / v_rate * 1000)::integer;
    END IF;
    IF v_rate IS NOT NULL OR v_cursor IS NOT NULL OR v_in_flight IS NOT NULL THEN
        UPDATE agent_limits a SET
            tokens = CASE WHEN v_rate IS NULL THEN a.tokens ELSE v_tokens - coalesce(cardinality(order_ids), 0) END,
            refilled_at = CASE WHEN v_rate IS NULL THEN a.refilled_at ELSE v_now END,
            fair_cursor = coalesce(v_cursor, a.fair_cursor),
            in_flight_bound = CASE WHEN v_in_flight IS NULL THEN a.in_flight_bound ELSE v_in_flight + coalesce(cardinality(order_ids), 0) END,
            counted_at = coalesce(v_counted, a.counted_at)
        WHERE a.agent = p_agent;
    END IF;
END;
$function$;

-- limit_lower: a service answered a step of kind p_agent 429 with a
-- Retry-After of p_retry_ms: the kind's rate, when it has one, is halved
-- (from what it is now, lowered or not; never below its min_rate, by
-- default a tenth of its rate, and never above its rate) until the
-- Retry-After, at least 10 s and at most an hour (contract.MaxRetryAfter:
-- a service asking for a year is read as asking an hour), has passed.
-- Many calls get their 429 at once: the rate is halved at most once a
-- second. An operator's limits set or reset ends the lowering. It returns
-- the lowered rate, or NULL when nothing changed.
CREATE OR REPLACE FUNCTION limit_lower(p_agent text, p_retry_ms bigint)
 RETURNS double precision
 LANGUAGE sql
AS $function$
    UPDATE agent_limits a SET
        lowered_rate = least(CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END, greatest(
            coalesce(CASE WHEN a.set_by IS NULL THEN a.file_min_rate ELSE a.set_min_rate END,
                     CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END / 10),
            CASE WHEN a.lowered_until > clock_timestamp()
                 THEN least(a.lowered_rate, CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END)
                 ELSE CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END END / 2)),
        lowered_until = least(greatest(coalesce(a.lowered_until, clock_timestamp()),
                                       clock_timestamp() + make_interval(secs => least(greatest(p_retry_ms, 10000), 3600000) / 1000.0)),
                              clock_timestamp() + interval '1 hour'),
        lowered_at = clock_timestamp(),
        lowered_count = a.lowered_count + 1,
        updated_at = clock_timestamp()
    WHERE a.agent = p_agent AND CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END IS NOT NULL
      AND (a.lowered_at IS NULL OR a.lowered_at < clock_timestamp() - interval '1 second')
    RETURNING a.lowered_rate
$function$;

-- step_fair_key: the fair_key of a step of kind p_agent (none for a step
-- sas performs itself, p_agent '') in an order of namespace p_ns whose
-- concurrency key is p_key (NULL: none). The default namespace's steps
-- carry the key as it is. Another namespace's carry it after the
-- namespace and a unit separator (a tenant's key is never another's);
-- with no key, those of a kind the namespace has limits on carry the
-- namespace and a record separator, so that limited_pick serves them by
-- it; the others none, claimed as the default's are. PL/pgSQL, whose
-- plan a session keeps: the submitter's insert calls it (status_heard
-- says why).
CREATE OR REPLACE FUNCTION step_fair_key(p_ns text, p_agent text, p_key text)
 RETURNS text
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN CASE WHEN p_agent = '' THEN NULL
                WHEN p_ns IS NULL OR p_ns = 'default' THEN p_key
                WHEN p_key IS NOT NULL THEN p_ns || E'\x1f' || p_key
                WHEN EXISTS (SELECT 1 FROM namespace_limits nl WHERE nl.agent = p_agent AND nl.namespace = p_ns) THEN p_ns || E'\x1e'
           END;
END;
$function$;

-- fair_key_base: the concurrency key a fair_key of a step of namespace
-- p_ns (NULL: the default) holds, NULL when none (step_fair_key's
-- inverse).
CREATE OR REPLACE FUNCTION fair_key_base(p_key text, p_ns text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_ns IS NULL OR p_key IS NULL THEN p_key
                WHEN p_key = p_ns || E'\x1e' THEN NULL
                WHEN starts_with(p_key, p_ns || E'\x1f') THEN substr(p_key, length(p_ns) + 2)
                ELSE p_key END
$function$;

-- namespace_limits_set: an operator sets namespace p_ns's limits on kind
-- p_agent (each NULL for none; the caller has applied its change to the
-- limits in force and checked the rule), in place of the file's until
-- namespace_limits_reset, recorded with p_detail; the namespace's live
-- steps of the kind with no key are keyed by it from now (step_fair_key),
-- so that the next claim obeys them.
CREATE OR REPLACE FUNCTION namespace_limits_set(p_ns text, p_agent text, p_max integer, p_rate double precision, p_burst integer,
                                                p_detail text, p_claimed text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
BEGIN
    IF p_ns = 'default' THEN
        RAISE EXCEPTION 'the default namespace has no limits of its own: the kind''s limits hold its steps (sasctl limits set %)', p_agent
            USING ERRCODE = '22023';
    END IF;
    PERFORM 1 FROM namespaces WHERE name = p_ns FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'there is no namespace %', p_ns USING ERRCODE = '22023';
    END IF;
    INSERT INTO namespace_limits AS nl (agent, namespace, set_max_in_flight, set_rate, set_burst, tokens, refilled_at, set_by, set_at)
    VALUES (p_agent, p_ns, p_max, p_rate, p_burst, coalesce(p_burst, greatest(1, ceil(p_rate / 10))), clock_timestamp(),
            v_actor || coalesce(' as ' || NULLIF(left(p_claimed, 100), ''), ''), clock_timestamp())
    ON CONFLICT (agent, namespace) DO UPDATE SET set_max_in_flight = EXCLUDED.set_max_in_flight, set_rate = EXCLUDED.set_rate,
        set_burst = EXCLUDED.set_burst, tokens = least(nl.tokens, coalesce(EXCLUDED.set_burst, greatest(1, ceil(EXCLUDED.set_rate / 10)))),
        set_by = EXCLUDED.set_by, set_at = EXCLUDED.set_at;
    UPDATE steps s SET fair_key = p_ns || E'\x1e'
    WHERE s.agent = p_agent AND s.namespace = p_ns AND s.fair_key IS NULL
      AND s.process_state IN ('waiting', 'pending', 'delayed', 'awaiting', 'processing');
    PERFORM record_operator_action('limits set', p_agent || ' in ' || p_ns, p_detail, p_claimed);
    PERFORM pg_notify('sas_pending', current_schema());
END;
$function$;

-- namespace_limits_unkey: the live steps of namespace p_ns and kind
-- p_agent keyed by the namespace alone lose the key, once the namespace
-- has no limits on the kind: the regular claim takes them again.
CREATE OR REPLACE FUNCTION namespace_limits_unkey(p_ns text, p_agent text)
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE steps s SET fair_key = NULL
    WHERE s.agent = p_agent AND s.namespace = p_ns AND s.fair_key = p_ns || E'\x1e'
      AND s.process_state IN ('waiting', 'pending', 'delayed', 'awaiting', 'processing')
      AND NOT EXISTS (SELECT 1 FROM namespace_limits nl WHERE nl.agent = p_agent AND nl.namespace = p_ns)
$function$;

-- namespace_limits_reset: an operator removes the limits it set on
-- namespace p_ns's steps of kind p_agent: the workflows file's hold
-- again, or, when the file gives none, the kind's alone (and the steps
-- keyed by the namespace alone are unkeyed). Returns false when no
-- operator had set any.
CREATE OR REPLACE FUNCTION namespace_limits_reset(p_ns text, p_agent text, p_claimed text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_actor text := operator_begin(p_claimed);
BEGIN
    UPDATE namespace_limits SET set_max_in_flight = NULL, set_rate = NULL, set_burst = NULL, set_by = NULL, set_at = NULL
    WHERE agent = p_agent AND namespace = p_ns AND set_by IS NOT NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM namespace_limits WHERE agent = p_agent AND namespace = p_ns AND num_nonnulls(file_max_in_flight, file_rate) = 0;
    PERFORM namespace_limits_unkey(p_ns, p_agent);
    PERFORM record_operator_action('limits reset', p_agent || ' in ' || p_ns, 'by ' || v_actor, p_claimed);
    PERFORM pg_notify('sas_pending', current_schema());
    RETURN true;
END;
$function$;

-- namespace_limits_sync: a scheduler keeps the workflows file's
-- namespaces' limits on the kinds it claims (p_agents): for each entry
-- (p_kinds[i], p_ns[i]) its limits, the others of those kinds removed
-- (a row left with an operator's alone stays), the steps keyed or
-- unkeyed to match. Returns the namespaces named that do not exist (yet).
CREATE OR REPLACE FUNCTION namespace_limits_sync(p_agents text[], p_kinds text[], p_ns text[], p_max integer[],
                                                 p_rate double precision[], p_burst integer[])
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $function$
DECLARE
    v_gone record;
    v_missing text[];
BEGIN
    UPDATE namespace_limits nl SET file_max_in_flight = NULL, file_rate = NULL, file_burst = NULL
    WHERE nl.agent = ANY(p_agents) AND num_nonnulls(nl.file_max_in_flight, nl.file_rate) > 0
      AND NOT EXISTS (SELECT 1 FROM unnest(p_kinds, p_ns) AS f(k, n) WHERE f.k = nl.agent AND f.n = nl.namespace);
    FOR v_gone IN DELETE FROM namespace_limits nl
                  WHERE nl.agent = ANY(p_agents) AND nl.set_by IS NULL AND num_nonnulls(nl.file_max_in_flight, nl.file_rate) = 0
                  RETURNING nl.agent, nl.namespace LOOP
        PERFORM namespace_limits_unkey(v_gone.namespace, v_gone.agent);
    END LOOP;
    -- Only rows that change are written: every scheduler does this at
    -- start.
    INSERT INTO namespace_limits AS nl (agent, namespace, file_max_in_flight, file_rate, file_burst, tokens, refilled_at)
    SELECT f.k, f.n, f.m, f.r, f.b, coalesce(f.b, greatest(1, ceil(f.r / 10))), clock_timestamp()
    FROM unnest(p_kinds, p_ns, p_max, p_rate, p_burst) AS f(k, n, m, r, b)
    ON CONFLICT (agent, namespace) DO UPDATE SET file_max_in_flight = EXCLUDED.file_max_in_flight, file_rate = EXCLUDED.file_rate,
        file_burst = EXCLUDED.file_burst
    WHERE (nl.file_max_in_flight, nl.file_rate, nl.file_burst) IS DISTINCT FROM (EXCLUDED.file_max_in_flight, EXCLUDED.file_rate, EXCLUDED.file_burst);
    UPDATE steps s SET fair_key = s.namespace || E'\x1e'
    FROM unnest(p_kinds, p_ns) AS f(k, n)
    WHERE s.agent = f.k AND s.namespace = f.n AND s.fair_key IS NULL
      AND s.process_state IN ('waiting', 'pending', 'delayed', 'awaiting', 'processing');
    SELECT array_agg(DISTINCT f.n ORDER BY f.n) INTO v_missing FROM unnest(p_ns) AS f(n)
    WHERE NOT EXISTS (SELECT 1 FROM namespaces WHERE name = f.n);
    RETURN coalesce(v_missing, '{}');
END;
$function$;
