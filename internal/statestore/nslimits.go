package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/workflow"
)

// NamespaceLimits are a namespace's own limits on an agent kind, within
// the kind's (KindLimits): at most MaxInFlight of the namespace's steps
// of the kind processing at once, at most Rate claims of them a second
// (bursts of Burst). The default namespace has none: the kind's limits
// hold its steps.
type NamespaceLimits struct {
	Agent     string `json:"agent"`
	Namespace string `json:"namespace"`
	// File are the workflows file's; Limits what claims obey now (an
	// operator's, if SetBy is set).
	File   Limits     `json:"file"`
	Limits Limits     `json:"limits"`
	SetBy  string     `json:"set_by,omitempty"`
	SetAt  *time.Time `json:"set_at,omitempty"`
	// InFlight are the namespace's steps of the kind processing; Waiting
	// its due pending ones, the oldest pending for OldestWait.
	InFlight   int     `json:"in_flight"`
	Waiting    int     `json:"waiting"`
	OldestWait float64 `json:"oldest_wait_s"`
}

// ListNamespaceLimits reads the namespaces' limits on agent kinds and
// their use, of namespace ns alone when it is not "".
func (s *Store) ListNamespaceLimits(ctx context.Context, ns string) ([]NamespaceLimits, error) {
	rows, err := s.pool.Query(ctx, `
SELECT nl.agent, nl.namespace, nl.file_max_in_flight, nl.file_rate, nl.file_burst,
       CASE WHEN nl.set_by IS NULL THEN nl.file_max_in_flight ELSE nl.set_max_in_flight END,
       CASE WHEN nl.set_by IS NULL THEN nl.file_rate ELSE nl.set_rate END,
       CASE WHEN nl.set_by IS NULL THEN nl.file_burst ELSE nl.set_burst END,
       coalesce(nl.set_by, ''), nl.set_at,
       (SELECT count(*) FROM steps s WHERE s.agent = nl.agent AND s.namespace = nl.namespace AND s.process_state = 'processing')::int,
       u.waiting, u.oldest
FROM namespace_limits nl
CROSS JOIN LATERAL (SELECT count(*)::int AS waiting, coalesce(extract(epoch FROM now() - min(s.available_at)), 0)::float8 AS oldest
                    FROM steps s WHERE s.agent = nl.agent AND s.namespace = nl.namespace AND s.process_state = 'pending'
                                   AND s.available_at <= now()) u
WHERE $1 = '' OR nl.namespace = $1
ORDER BY nl.agent, nl.namespace`, ns)
	if err != nil {
		return nil, fmt.Errorf("read namespace limits: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (NamespaceLimits, error) {
		var n NamespaceLimits
		var fileMax, fileBurst, maxIn, burst *int32
		err := row.Scan(&n.Agent, &n.Namespace, &fileMax, &n.File.Rate, &fileBurst, &maxIn, &n.Limits.Rate, &burst, &n.SetBy, &n.SetAt,
			&n.InFlight, &n.Waiting, &n.OldestWait)
		n.File.MaxInFlight, n.File.Burst = intp(fileMax), intp(fileBurst)
		n.Limits.MaxInFlight, n.Limits.Burst = intp(maxIn), intp(burst)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("read namespace limits: %w", classify(err))
	}
	return out, nil
}

// SetNamespaceLimits changes namespace ns's own limits on kind for an
// operator (claimed: the login the operator claims), from those in force
// (none when it has none), recorded with record_operator_action; claims
// obey them at once, until ResetNamespaceLimits. The limits the change
// leaves must pass the rule a kind's do, and a namespace's have no
// min_rate (a service's 429 lowers the kind's rate): else nothing changes
// and the error, an ErrInvalidData, says why. The default namespace has
// none of its own, and the namespace must exist.
func (s *Store) SetNamespaceLimits(ctx context.Context, ns, kind string, c LimitChange, claimed string) (NamespaceLimits, error) {
	if err := workflow.CheckKind(kind); err != nil {
		return NamespaceLimits{}, fmt.Errorf("set limits: %v: %w", err, ErrInvalidData)
	}
	if c.MinRate != nil {
		return NamespaceLimits{}, fmt.Errorf("the limits of agent %s in namespace %s: a namespace has no min_rate of its own "+
			"(a service's 429 lowers the kind's rate, every namespace's share with it): %w", kind, ns, ErrInvalidData)
	}
	var refused error
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			var now Limits
			var maxIn, burst *int32
			// Two operators at once: the last one's limits stand, each whole.
			err := tx.QueryRow(ctx, `
SELECT CASE WHEN set_by IS NULL THEN file_max_in_flight ELSE set_max_in_flight END,
       CASE WHEN set_by IS NULL THEN file_rate ELSE set_rate END,
       CASE WHEN set_by IS NULL THEN file_burst ELSE set_burst END
FROM namespace_limits WHERE agent = $1 AND namespace = $2`, kind, ns).Scan(&maxIn, &now.Rate, &burst)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			now.MaxInFlight, now.Burst = intp(maxIn), intp(burst)
			next := c.apply(now)
			if err := next.Rule().Check(); err != nil {
				refused = fmt.Errorf("the limits of agent %s in namespace %s: %v: %w", kind, ns, err, ErrInvalidData)
				return refused
			}
			_, err = tx.Exec(ctx, `SELECT namespace_limits_set($1, $2, $3, $4, $5, $6, $7)`,
				ns, kind, int32p(next.MaxInFlight), next.Rate, int32p(next.Burst), c.String(), claimed)
			return err
		})
	})
	if refused != nil {
		return NamespaceLimits{}, refused
	}
	if err != nil {
		return NamespaceLimits{}, fmt.Errorf("set limits of %s in namespace %s: %w", kind, ns, classify(err))
	}
	return s.namespaceLimitsOf(ctx, ns, kind)
}

// ResetNamespaceLimits removes an operator's limits of namespace ns on
// kind, recorded as SetNamespaceLimits is: the workflows file's hold
// again, or, when it gives none, the kind's alone. ErrNoLimits when no
// operator had set any.
func (s *Store) ResetNamespaceLimits(ctx context.Context, ns, kind, claimed string) error {
	var had bool
	if err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT namespace_limits_reset($1, $2, $3)`, ns, kind, claimed).Scan(&had)
	}); err != nil {
		return fmt.Errorf("reset limits of %s in namespace %s: %w", kind, ns, classify(err))
	}
	if !had {
		return fmt.Errorf("reset limits of %s in namespace %s: %w", kind, ns, ErrNoLimits)
	}
	return nil
}

func (s *Store) namespaceLimitsOf(ctx context.Context, ns, kind string) (NamespaceLimits, error) {
	all, err := s.ListNamespaceLimits(ctx, ns)
	if err != nil {
		return NamespaceLimits{}, err
	}
	for _, n := range all {
		if n.Agent == kind {
			return n, nil
		}
	}
	return NamespaceLimits{}, fmt.Errorf("limits of %s in namespace %s: %w", kind, ns, ErrNoLimits)
}

// SyncNamespaceLimits stores the workflows file's namespaces' own limits
// on the kinds a scheduler claims (file: kind -> namespace -> limits;
// those of these kinds it does not name are removed, an operator's
// staying), keying the namespaces' steps to match. It returns the
// namespaces named that do not exist yet (their limits hold once they
// do).
func (s *Store) SyncNamespaceLimits(ctx context.Context, kinds []string, file map[string]map[string]Limits) ([]string, error) {
	if len(kinds) == 0 {
		return nil, nil
	}
	var ks, nss []string
	var maxes, bursts []*int32
	var rates []*float64
	for _, k := range kinds {
		for ns, l := range file[k] {
			ks, nss = append(ks, k), append(nss, ns)
			maxes, bursts, rates = append(maxes, int32p(l.MaxInFlight)), append(bursts, int32p(l.Burst)), append(rates, l.Rate)
		}
	}
	var missing []string
	if err := s.pool.QueryRow(ctx, `SELECT namespace_limits_sync($1, $2, $3, $4, $5, $6)`, kinds, ks, nss, maxes, rates, bursts).Scan(&missing); err != nil {
		return nil, fmt.Errorf("store the file's namespace limits: %w", classify(err))
	}
	return missing, nil
}
