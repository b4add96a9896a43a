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
        -- The keys with pending steps, each found by one probe of the
        -- keyed index: those after the last one served, then from the
        -- first, at most v_allowed in all (each gets a turn before any
        -- gets two), with their max_per_key.
        WITH RECURSIVE keys(k, m, d) AS (
            (SELECT s.fair_key, s.fair_max, 1 FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
               AND (l.fair_cursor IS NULL OR s.fair_key > l.fair_cursor)
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, keys.d + 1 FROM keys
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key > keys.k
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE keys.d < v_allowed
        ), wrapped(k, m, d) AS (
            (SELECT s.fair_key, s.fair_max, (SELECT count(*) FROM keys)::integer + 1 FROM steps s
             WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key <= l.fair_cursor
               AND (SELECT count(*) FROM keys) < v_allowed
             ORDER BY s.fair_key LIMIT 1)
            UNION ALL
            SELECT n.fair_key, n.fair_max, wrapped.d + 1 FROM wrapped
            CROSS JOIN LATERAL (SELECT s.fair_key, s.fair_max FROM steps s
                                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL
                                  AND s.fair_key > wrapped.k AND s.fair_key <= l.fair_cursor
                                ORDER BY s.fair_key LIMIT 1) n
            WHERE wrapped.d < v_allowed
        ), ring AS (
            SELECT k, m, d AS pos, ceil(v_allowed::numeric / count(*) OVER ())::integer AS share
            FROM (SELECT * FROM keys UNION ALL SELECT * FROM wrapped) x
        ), room AS (
            SELECT ring.k, ring.pos, greatest(0, least(ring.share, coalesce(
                       ring.m - (SELECT count(*) FROM steps s WHERE s.agent = p_agent AND s.process_state = 'processing'
                                                                 AND s.fair_key IS NOT NULL AND s.fair_key = ring.k)::integer,
                       v_allowed))) AS n
            FROM ring
        ), keyed AS (
            SELECT c.order_id, c.step, c.available_at, room.k, room.pos,
                   row_number() OVER (PARTITION BY room.k ORDER BY c.priority DESC, c.available_at, c.order_id, c.step) AS r
            FROM room
            CROSS JOIN LATERAL (
                SELECT s.order_id, s.step, s.available_at, s.priority FROM steps s
                WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NOT NULL AND s.fair_key = room.k
                  AND s.available_at <= now()
                  AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id))
                  AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                LIMIT room.n
                FOR UPDATE SKIP LOCKED) c
        ), plain AS (
            SELECT u.order_id, u.step, u.available_at, NULL::text AS k, 0::bigint AS pos,
                   row_number() OVER (ORDER BY u.priority DESC, u.available_at, u.order_id, u.step) AS r
            FROM (SELECT s.order_id, s.step, s.available_at, s.priority FROM steps s
                  WHERE s.agent = p_agent AND s.process_state = 'pending' AND s.fair_key IS NULL AND s.available_at <= now()
                    AND ((SELECT NOT EXISTS (SELECT 1 FROM order_pauses)) OR NOT EXISTS (SELECT 1 FROM order_pauses op WHERE op.order_id = s.order_id))
                    AND (s.attempt > 0 OR s.step > 1 OR EXISTS (SELECT 1 FROM orders o WHERE o.order_id = s.order_id FOR UPDATE SKIP LOCKED))
                  ORDER BY s.priority DESC, s.available_at, s.order_id, s.step
                  LIMIT CASE WHEN EXISTS (SELECT 1 FROM ring) THEN (SELECT max(share) FROM ring) ELSE v_allowed END
                  FOR UPDATE SKIP LOCKED) u
        ), chosen AS (
            SELECT * FROM (SELECT * FROM keyed UNION ALL SELECT * FROM plain) x ORDER BY x.r, x.pos LIMIT v_allowed
        )
        SELECT array_agg(c.order_id ORDER BY c.r, c.pos), array_agg(c.step ORDER BY c.r, c.pos),
               array_agg(greatest(extract(epoch FROM v_now - c.available_at), 0)::float8 ORDER BY c.r, c.pos),
               (array_agg(c.k ORDER BY c.r DESC, c.pos DESC) FILTER (WHERE c.k IS NOT NULL))[1]
        INTO order_ids, steps, waited, v_cursor
        FROM chosen c;
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
