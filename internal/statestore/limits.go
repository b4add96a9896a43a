package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// Limits are an agent kind's limits: at most MaxInFlight steps processing
// at once, at most Rate claims a second with bursts of Burst, and, when a
// service's 429 lowers the rate, not below MinRate. A nil field is no
// such limit (Burst: a tenth of the rate, at least 1; MinRate: a tenth of
// the rate).
type Limits struct {
	MaxInFlight *int     `json:"max_in_flight,omitempty"`
	Rate        *float64 `json:"rate,omitempty"`
	Burst       *int     `json:"burst,omitempty"`
	MinRate     *float64 `json:"min_rate,omitempty"`
}

// Any reports whether l limits anything.
func (l Limits) Any() bool { return l.MaxInFlight != nil || l.Rate != nil }

// LimitsOf converts a workflows file's limits (0: none).
func LimitsOf(l workflow.Limits) Limits {
	var out Limits
	if l.MaxInFlight > 0 {
		out.MaxInFlight = &l.MaxInFlight
	}
	if l.Rate > 0 {
		out.Rate = &l.Rate
	}
	if l.Burst > 0 {
		out.Burst = &l.Burst
	}
	if l.MinRate > 0 {
		out.MinRate = &l.MinRate
	}
	return out
}

// String says the limits as sasctl and the logs show them, e.g.
// "max_in_flight=20 rate=50/s burst=5"; "none" for none.
func (l Limits) String() string {
	s := LimitChange{MaxInFlight: l.MaxInFlight, Rate: l.Rate, Burst: l.Burst, MinRate: l.MinRate}.String()
	if s == "" {
		return "none"
	}
	return s
}

// SyncLimits stores the workflows file's limits of the kinds a scheduler
// claims (none for a kind the file gives none): what a claim of the kind
// obeys unless an operator set others.
func (s *Store) SyncLimits(ctx context.Context, kinds []string, file map[string]Limits) error {
	if len(kinds) == 0 {
		return nil
	}
	var maxes, bursts []*int32
	var rates, mins []*float64
	for _, k := range kinds {
		l := file[k]
		maxes, bursts = append(maxes, int32p(l.MaxInFlight)), append(bursts, int32p(l.Burst))
		rates, mins = append(rates, l.Rate), append(mins, l.MinRate)
	}
	// Only rows that change are written: every scheduler does this at
	// start, and an unchanged row need not be locked.
	_, err := s.pool.Exec(ctx, `
INSERT INTO agent_limits AS a (agent, file_max_in_flight, file_rate, file_burst, file_min_rate)
SELECT * FROM unnest($1::text[], $2::int[], $3::float8[], $4::int[], $5::float8[])
ON CONFLICT (agent) DO UPDATE SET file_max_in_flight = EXCLUDED.file_max_in_flight, file_rate = EXCLUDED.file_rate,
    file_burst = EXCLUDED.file_burst, file_min_rate = EXCLUDED.file_min_rate, updated_at = now(), in_flight_bound = NULL
WHERE (a.file_max_in_flight, a.file_rate, a.file_burst, a.file_min_rate)
      IS DISTINCT FROM (EXCLUDED.file_max_in_flight, EXCLUDED.file_rate, EXCLUDED.file_burst, EXCLUDED.file_min_rate)`,
		kinds, maxes, rates, bursts, mins)
	if err != nil {
		return fmt.Errorf("store the file's limits: %w", classify(err))
	}
	return nil
}

func int32p(v *int) *int32 {
	if v == nil {
		return nil
	}
	n := int32(*v)
	return &n
}

// ManagedKinds says, of the agent kinds whose keyed steps are claimed
// through ClaimLimited, whether the kind's own limits (the file's or an
// operator's) hold all its steps (true: every step of it is claimed
// there), or only keys do (false: a workflow's concurrency_key, or a
// namespace's limits or key, on keyed steps pending; its unkeyed steps
// are bounded by nothing and may be claimed as an unlimited kind's).
func (s *Store) ManagedKinds(ctx context.Context) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, `
SELECT agent, bool_or(limited) FROM (
    SELECT agent, true AS limited FROM agent_limits
    WHERE CASE WHEN set_by IS NULL THEN num_nonnulls(file_max_in_flight, file_rate) ELSE num_nonnulls(set_max_in_flight, set_rate) END > 0
    UNION ALL
    SELECT agent, false FROM namespace_limits
    UNION ALL
    SELECT k, false FROM (
        WITH RECURSIVE kinds(k) AS (
            (SELECT agent FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL ORDER BY agent LIMIT 1)
            UNION ALL
            SELECT (SELECT agent FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL AND agent > kinds.k ORDER BY agent LIMIT 1)
            FROM kinds WHERE kinds.k IS NOT NULL
        ) SELECT k FROM kinds WHERE k IS NOT NULL) keyed
) m GROUP BY agent`)
	if err != nil {
		return nil, fmt.Errorf("read limited kinds: %w", classify(err))
	}
	out := map[string]bool{}
	var kind string
	var limited bool
	if _, err := pgx.ForEachRow(rows, []any{&kind, &limited}, func() error {
		out[kind] = limited
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read limited kinds: %w", classify(err))
	}
	return out, nil
}

// Held says what held a limited claim back.
const (
	HeldRate     = "rate"      // the token bucket was empty
	HeldInFlight = "in_flight" // max_in_flight steps were processing
	// HeldNamespace: a namespace's own limits on the kind held some of
	// its steps back (the kind's held none); Retry is set for a rate.
	HeldNamespace = "namespace"
)

// LimitedClaim is what ClaimLimited did: the steps claimed (each with
// how long it had waited pending), and, when the limits held it back,
// why and how soon a token comes.
type LimitedClaim struct {
	Steps []ClaimedStep
	Held  string
	Retry time.Duration
}

// ClaimLimited claims up to room pending steps of kind for lockedBy as
// ClaimKinds does, within the kind's limits and round robin across its
// keys (limited_pick), in one transaction: the picked steps are claimed
// before the kind's limits row is let go.
func (s *Store) ClaimLimited(ctx context.Context, lockedBy, kind string, room int) (LimitedClaim, error) {
	var out LimitedClaim
	if lockedBy == "" || kind == "" || room <= 0 {
		return out, fmt.Errorf("claim pending: need a claimer id, a kind and room")
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ids []string
		var steps []int32
		var waited []float64
		var retryMS int32
		if err := tx.QueryRow(ctx, `SELECT order_ids::text[], steps, waited, held, retry_ms FROM limited_pick($1, $2)`, kind, room).
			Scan(&ids, &steps, &waited, &out.Held, &retryMS); err != nil {
			return err
		}
		out.Retry = time.Duration(retryMS) * time.Millisecond
		if len(ids) == 0 {
			return nil
		}
		rows, err := tx.Query(ctx, claimPickedSQL, lockedBy, ids, steps)
		if err != nil {
			return err
		}
		out.Steps, err = collectClaimed(rows)
		if err != nil {
			return err
		}
		waits := make(map[stepRef]time.Duration, len(ids))
		for i, id := range ids {
			waits[stepRef{id, int(steps[i])}] = time.Duration(waited[i] * float64(time.Second))
		}
		for i := range out.Steps {
			out.Steps[i].Waited = waits[stepRef{out.Steps[i].OrderID, out.Steps[i].Step}]
		}
		return nil
	})
	if err != nil {
		return LimitedClaim{}, fmt.Errorf("claim pending %s: %w", kind, classify(err))
	}
	return out, nil
}

type stepRef struct {
	order string
	step  int
}

// claimPickedSQL claims the steps limited_pick picked (and locked): $2
// the orders, $3 the steps.
const claimPickedSQL = `
WITH picked AS (
    SELECT * FROM unnest($2::uuid[], $3::int[]) AS p(order_id, step)
)` + claimRestSQL

// LowerRate lowers kind's rate for a while because its service answered
// 429 with a Retry-After of retryAfter (limit_lower). It reports the
// rate now, and false when nothing changed: the kind has no rate, or it
// was lowered less than a second ago.
func (s *Store) LowerRate(ctx context.Context, kind string, retryAfter time.Duration) (float64, bool, error) {
	var rate *float64
	err := s.pool.QueryRow(ctx, `SELECT limit_lower($1, $2)`, kind, retryAfter.Milliseconds()).Scan(&rate)
	if err != nil {
		return 0, false, fmt.Errorf("lower the rate of %s: %w", kind, classify(err))
	}
	if rate == nil {
		return 0, false, nil
	}
	return *rate, true, nil
}

// LowerRateOf lowers the rate of the kind of an order's step (the step a
// service answered 429 for), as LowerRate does, in one statement; kind
// is that step's ("" when there is no such step).
func (s *Store) LowerRateOf(ctx context.Context, orderID string, step int, retryAfter time.Duration) (kind string, rate float64, lowered bool, err error) {
	var r *float64
	err = s.pool.QueryRow(ctx, `SELECT s.agent, limit_lower(s.agent, $3) FROM steps s WHERE s.order_id = $1 AND s.step = $2`,
		orderID, step, retryAfter.Milliseconds()).Scan(&kind, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, fmt.Errorf("lower the rate of order %s step %d: %w", orderID, step, classify(err))
	}
	if r == nil {
		return kind, 0, false, nil
	}
	return kind, *r, true, nil
}

// KindLimits is an agent kind's limits and their use, as sasctl, the
// console and the supervisor's gauges show them.
type KindLimits struct {
	Agent string `json:"agent"`
	// File are the workflows file's; Effective what claims obey now (an
	// operator's, if SetBy is set, with the rate as a 429 lowered it).
	File      Limits     `json:"file"`
	Effective Limits     `json:"effective"`
	SetBy     string     `json:"set_by,omitempty"`
	SetAt     *time.Time `json:"set_at,omitempty"`
	// LoweredUntil is set while a service's 429 holds the rate lowered.
	LoweredUntil *time.Time `json:"lowered_until,omitempty"`
	LoweredCount int64      `json:"lowered_count"`
	// InFlight are the kind's steps processing; Waiting its due pending
	// steps, the oldest of them pending for OldestWait; Overdue those
	// pending longer than their step's timeout.
	InFlight   int     `json:"in_flight"`
	Waiting    int     `json:"waiting"`
	OldestWait float64 `json:"oldest_wait_s"`
	Overdue    int     `json:"overdue"`
}

// listLimitsSQL reads every kind with limits, and its use: the pending
// steps in the two halves the partial indexes hold them in, and those
// processing, of the limited kinds only.
const listLimitsSQL = `
WITH use AS (
    SELECT agent,
           count(*) FILTER (WHERE process_state = 'processing') AS in_flight,
           count(*) FILTER (WHERE process_state = 'pending' AND available_at <= now()) AS waiting,
           coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE process_state = 'pending' AND available_at <= now())), 0) AS oldest,
           count(*) FILTER (WHERE process_state = 'pending' AND available_at + timeout < now()) AS overdue
    FROM (SELECT agent, process_state, available_at, timeout FROM steps
          WHERE process_state = 'pending' AND fair_key IS NULL AND agent IN (SELECT agent FROM agent_limits)
          UNION ALL
          SELECT agent, process_state, available_at, timeout FROM steps
          WHERE process_state = 'pending' AND fair_key IS NOT NULL AND agent IN (SELECT agent FROM agent_limits)
          UNION ALL
          SELECT agent, process_state, available_at, timeout FROM steps
          WHERE process_state = 'processing' AND agent IN (SELECT agent FROM agent_limits)) live
    GROUP BY agent
)
SELECT a.agent, a.file_max_in_flight, a.file_rate, a.file_burst, a.file_min_rate,
       CASE WHEN a.set_by IS NULL THEN a.file_max_in_flight ELSE a.set_max_in_flight END,
       CASE WHEN a.set_by IS NULL THEN a.file_rate ELSE a.set_rate END,
       CASE WHEN a.set_by IS NULL THEN a.file_burst ELSE a.set_burst END,
       CASE WHEN a.set_by IS NULL THEN a.file_min_rate ELSE a.set_min_rate END,
       coalesce(a.set_by, ''), a.set_at, CASE WHEN a.lowered_until > clock_timestamp() THEN a.lowered_until END,
       CASE WHEN a.lowered_until > clock_timestamp() THEN a.lowered_rate END, a.lowered_count,
       coalesce(u.in_flight, 0)::int, coalesce(u.waiting, 0)::int, coalesce(u.oldest, 0)::float8, coalesce(u.overdue, 0)::int
FROM agent_limits a LEFT JOIN use u ON u.agent = a.agent
ORDER BY a.agent`

// ListLimits reads every kind with limits or with work, and their use.
func (s *Store) ListLimits(ctx context.Context) ([]KindLimits, error) {
	rows, err := s.pool.Query(ctx, listLimitsSQL)
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KindLimits, error) {
		var k KindLimits
		var fileMax, fileBurst, effMax, effBurst *int32
		var lowered *float64
		err := row.Scan(&k.Agent, &fileMax, &k.File.Rate, &fileBurst, &k.File.MinRate,
			&effMax, &k.Effective.Rate, &effBurst, &k.Effective.MinRate, &k.SetBy, &k.SetAt, &k.LoweredUntil, &lowered, &k.LoweredCount,
			&k.InFlight, &k.Waiting, &k.OldestWait, &k.Overdue)
		k.File.MaxInFlight, k.File.Burst = intp(fileMax), intp(fileBurst)
		k.Effective.MaxInFlight, k.Effective.Burst = intp(effMax), intp(effBurst)
		if lowered != nil && k.Effective.Rate != nil && *lowered < *k.Effective.Rate {
			k.Effective.Rate = lowered
		}
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("read limits: %w", classify(err))
	}
	return out, nil
}

func intp(v *int32) *int {
	if v == nil {
		return nil
	}
	n := int(*v)
	return &n
}

// LimitChange is what an operator changes of a kind's limits: each set
// field replaces the limit now in force (Clear* removes it).
type LimitChange struct {
	MaxInFlight, Burst          *int
	Rate, MinRate               *float64
	ClearMaxInFlight, ClearRate bool
	ClearBurst, ClearMinRate    bool
}

// Share is one partition's share of a change in a deployment of n
// partitions, split as workflow.Limits.Share splits the file's limits.
func (c LimitChange) Share(n int) LimitChange {
	if n <= 1 {
		return c
	}
	out := c
	var l workflow.Limits
	if c.MaxInFlight != nil {
		l.MaxInFlight = *c.MaxInFlight
	}
	if c.Burst != nil {
		l.Burst = *c.Burst
	}
	if c.Rate != nil {
		l.Rate = *c.Rate
	}
	if c.MinRate != nil {
		l.MinRate = *c.MinRate
	}
	sh := l.Share(n)
	if c.MaxInFlight != nil {
		out.MaxInFlight = &sh.MaxInFlight
	}
	if c.Burst != nil {
		out.Burst = &sh.Burst
	}
	if c.Rate != nil {
		out.Rate = &sh.Rate
	}
	if c.MinRate != nil {
		out.MinRate = &sh.MinRate
	}
	return out
}

// SetLimits changes kind's limits for an operator (claimed: the login
// the operator claims, as the console's users), from those in force now,
// recorded with record_operator_action; claims obey them at once, until
// ResetLimits. A kind not seen before is added. The limits the change
// leaves in force must pass the rule a workflows file's do
// (workflow.Limits.Check): else nothing changes and the error, an
// ErrInvalidData, says why in the rule's words. A rate a service's 429
// lowered is the operator's again.
func (s *Store) SetLimits(ctx context.Context, kind string, c LimitChange, claimed string) (KindLimits, error) {
	if err := workflow.CheckKind(kind); err != nil {
		return KindLimits{}, fmt.Errorf("set limits: %v: %w", err, ErrInvalidData)
	}
	detail := c.String()
	var refused error
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO agent_limits (agent) VALUES ($1) ON CONFLICT DO NOTHING`, kind); err != nil {
				return err
			}
			var now Limits
			var maxIn, burst *int32
			if err := tx.QueryRow(ctx, `
SELECT CASE WHEN set_by IS NULL THEN file_max_in_flight ELSE set_max_in_flight END,
       CASE WHEN set_by IS NULL THEN file_rate ELSE set_rate END,
       CASE WHEN set_by IS NULL THEN file_burst ELSE set_burst END,
       CASE WHEN set_by IS NULL THEN file_min_rate ELSE set_min_rate END
FROM agent_limits WHERE agent = $1 FOR UPDATE`, kind).Scan(&maxIn, &now.Rate, &burst, &now.MinRate); err != nil {
				return err
			}
			now.MaxInFlight, now.Burst = intp(maxIn), intp(burst)
			next := c.apply(now)
			if err := next.Rule().Check(); err != nil {
				refused = fmt.Errorf("the limits of agent %s: %v: %w", kind, err, ErrInvalidData)
				return refused
			}
			_, err := tx.Exec(ctx, `
UPDATE agent_limits a SET set_max_in_flight = $2, set_rate = $3, set_burst = $4, set_min_rate = $5,
    set_by = 'operator:' || session_user || coalesce(' as ' || NULLIF($6, ''), ''),
    set_at = clock_timestamp(), updated_at = clock_timestamp(), in_flight_bound = NULL,
    lowered_rate = NULL, lowered_until = NULL
WHERE a.agent = $1`, kind, int32p(next.MaxInFlight), next.Rate, int32p(next.Burst), next.MinRate, claimed)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `SELECT record_operator_action('limits set', $1, $2, $3)`, kind, detail, claimed)
			return err
		})
	})
	if refused != nil {
		return KindLimits{}, refused
	}
	if err != nil {
		return KindLimits{}, fmt.Errorf("set limits of %s: %w", kind, classify(err))
	}
	return s.limitsOf(ctx, kind)
}

// apply is l with c's changes.
func (c LimitChange) apply(l Limits) Limits {
	if c.MaxInFlight != nil {
		l.MaxInFlight = c.MaxInFlight
	}
	if c.Rate != nil {
		l.Rate = c.Rate
	}
	if c.Burst != nil {
		l.Burst = c.Burst
	}
	if c.MinRate != nil {
		l.MinRate = c.MinRate
	}
	if c.ClearMaxInFlight {
		l.MaxInFlight = nil
	}
	if c.ClearRate {
		l.Rate = nil
	}
	if c.ClearBurst {
		l.Burst = nil
	}
	if c.ClearMinRate {
		l.MinRate = nil
	}
	return l
}

// Rule is l as the workflows file's limits are (0: none), for their rule
// (workflow.Limits.Check): a limit given as 0 or less is out of range,
// not none.
func (l Limits) Rule() workflow.Limits {
	var w workflow.Limits
	given := func(v float64) float64 {
		if v <= 0 || v != v {
			return -1
		}
		return v
	}
	if l.MaxInFlight != nil {
		w.MaxInFlight = int(given(float64(*l.MaxInFlight)))
	}
	if l.Rate != nil {
		w.Rate = given(*l.Rate)
	}
	if l.Burst != nil {
		w.Burst = int(given(float64(*l.Burst)))
	}
	if l.MinRate != nil {
		w.MinRate = given(*l.MinRate)
	}
	return w
}

// ResetLimits puts kind back under the workflows file's limits, recorded
// as SetLimits is; a rate a service's 429 lowered is the file's again.
func (s *Store) ResetLimits(ctx context.Context, kind, claimed string) (KindLimits, error) {
	if err := workflow.CheckKind(kind); err != nil {
		return KindLimits{}, fmt.Errorf("reset limits: %v: %w", err, ErrInvalidData)
	}
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE agent_limits SET set_max_in_flight = NULL, set_rate = NULL, set_burst = NULL, set_min_rate = NULL,
				set_by = NULL, set_at = NULL, updated_at = clock_timestamp(), in_flight_bound = NULL,
				lowered_rate = NULL, lowered_until = NULL WHERE agent = $1`, kind)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return ErrNoLimits
			}
			_, err = tx.Exec(ctx, `SELECT record_operator_action('limits reset', $1, '', $2)`, kind, claimed)
			return err
		})
	})
	if err != nil {
		return KindLimits{}, fmt.Errorf("reset limits of %s: %w", kind, classify(err))
	}
	return s.limitsOf(ctx, kind)
}

// ErrNoLimits is why a reset found no kind of that name.
var ErrNoLimits = errors.New("no limits stored for that agent kind")

func (s *Store) limitsOf(ctx context.Context, kind string) (KindLimits, error) {
	all, err := s.ListLimits(ctx)
	if err != nil {
		return KindLimits{}, err
	}
	for _, k := range all {
		if k.Agent == kind {
			return k, nil
		}
	}
	return KindLimits{}, fmt.Errorf("limits of %s: %w", kind, ErrNoLimits)
}

// String describes the change for the operator actions' record.
func (c LimitChange) String() string {
	var parts []string
	add := func(name string, clear bool, v string) {
		if clear {
			v = "none"
		}
		if v != "" {
			parts = append(parts, name+"="+v)
		}
	}
	add("max_in_flight", c.ClearMaxInFlight, fmtPtr(c.MaxInFlight, "%d"))
	add("rate", c.ClearRate, fmtPtr(c.Rate, "%g/s"))
	add("burst", c.ClearBurst, fmtPtr(c.Burst, "%d"))
	add("min_rate", c.ClearMinRate, fmtPtr(c.MinRate, "%g/s"))
	return strings.Join(parts, " ")
}

func fmtPtr[T int | float64](v *T, format string) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf(format, *v)
}

// KeyUse is one concurrency key's work on an agent kind, in its
// namespace (a namespace's key is never another's).
type KeyUse struct {
	Agent, Namespace, Key string
	Waiting, InFlight     int
}

// keysInUseSQL reads the keys with the most steps waiting (then in
// flight), at most $1 of them. The keyed steps are read in the two halves
// the partial indexes hold them in (pending and processing, migration
// 0032): one condition on both states matches neither index, and would
// read the whole table, ended steps and all, at every look.
const keysInUseSQL = `
SELECT agent, coalesce(namespace, 'default'), fair_key_base(fair_key, namespace),
       count(*) FILTER (WHERE process_state = 'pending')::int, count(*) FILTER (WHERE process_state = 'processing')::int
FROM (SELECT agent, namespace, fair_key, process_state FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL
      UNION ALL
      SELECT agent, namespace, fair_key, process_state FROM steps WHERE process_state = 'processing' AND fair_key IS NOT NULL) live
WHERE namespace IS NULL OR fair_key <> namespace || E'\x1e'
GROUP BY agent, namespace, fair_key ORDER BY 4 DESC, 5 DESC, 1, 2, 3 LIMIT $1`

// KeysInUse reads the keys with the most steps waiting (then in flight),
// at most limit of them.
func (s *Store) KeysInUse(ctx context.Context, limit int) ([]KeyUse, error) {
	rows, err := s.pool.Query(ctx, keysInUseSQL, limit)
	if err != nil {
		return nil, fmt.Errorf("read keys in use: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyUse, error) {
		var k KeyUse
		return k, row.Scan(&k.Agent, &k.Namespace, &k.Key, &k.Waiting, &k.InFlight)
	})
	if err != nil {
		return nil, fmt.Errorf("read keys in use: %w", classify(err))
	}
	return out, nil
}
