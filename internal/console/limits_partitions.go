package console

import (
	"context"
	"time"

	"sas/internal/statestore"
)

// In a partitioned deployment each partition's schedulers hold their
// partition's share of a kind's limits (docs/SCALING.md): the Limits
// page shows the deployment's, each partition's shares summed and their
// use added up, with each partition's beside it, and a change gives each
// partition its share.

// kindLimits is a kind's limits and use in the deployment, and in each
// partition (none when it is not partitioned).
type kindLimits struct {
	statestore.KindLimits
	Parts []partKindLimits
}

type partKindLimits struct {
	Partition string
	statestore.KindLimits
}

// scopedLimits is kindLimits for a namespace's own limits on a kind.
type scopedLimits struct {
	statestore.NamespaceLimits
	Parts []partScopedLimits
}

type partScopedLimits struct {
	Partition string
	statestore.NamespaceLimits
}

// listLimits reads every kind's limits and use across the deployment.
func (s *server) listLimits(ctx context.Context) ([]kindLimits, error) {
	var out []kindLimits
	at := map[string]int{}
	for _, p := range s.stores.Parts {
		rows, err := p.Store.ListLimits(ctx)
		if err != nil {
			return nil, p.Named(err)
		}
		for _, row := range rows {
			i, seen := at[row.Agent]
			if !seen {
				at[row.Agent], i = len(out), len(out)
				out = append(out, kindLimits{KindLimits: row})
			} else {
				k := &out[i].KindLimits
				k.File, k.Effective = sumLimits(k.File, row.File), sumLimits(k.Effective, row.Effective)
				k.SetBy, k.SetAt = firstSet(k.SetBy, k.SetAt, row.SetBy, row.SetAt)
				k.LoweredUntil = laterOf(k.LoweredUntil, row.LoweredUntil)
				k.LoweredCount += row.LoweredCount
				k.InFlight += row.InFlight
				k.Waiting += row.Waiting
				k.Overdue += row.Overdue
				k.OldestWait = max(k.OldestWait, row.OldestWait)
			}
			if s.stores.Layout != nil {
				out[i].Parts = append(out[i].Parts, partKindLimits{p.Name, row})
			}
		}
	}
	return out, nil
}

// listScoped reads the namespaces' own limits (of ns alone when not "")
// across the deployment.
func (s *server) listScoped(ctx context.Context, ns string) ([]scopedLimits, error) {
	var out []scopedLimits
	at := map[[2]string]int{}
	for _, p := range s.stores.Parts {
		rows, err := p.Store.ListNamespaceLimits(ctx, ns)
		if err != nil {
			return nil, p.Named(err)
		}
		for _, row := range rows {
			key := [2]string{row.Agent, row.Namespace}
			i, seen := at[key]
			if !seen {
				at[key], i = len(out), len(out)
				out = append(out, scopedLimits{NamespaceLimits: row})
			} else {
				n := &out[i].NamespaceLimits
				n.File, n.Limits = sumLimits(n.File, row.File), sumLimits(n.Limits, row.Limits)
				n.SetBy, n.SetAt = firstSet(n.SetBy, n.SetAt, row.SetBy, row.SetAt)
				n.InFlight += row.InFlight
				n.Waiting += row.Waiting
				n.OldestWait = max(n.OldestWait, row.OldestWait)
			}
			if s.stores.Layout != nil {
				out[i].Parts = append(out[i].Parts, partScopedLimits{p.Name, row})
			}
		}
	}
	return out, nil
}

// eachShare runs f in every partition's store with its share of c (the
// whole of it, unpartitioned).
func (s *server) eachShare(ctx context.Context, c statestore.LimitChange, f func(*statestore.Store, statestore.LimitChange) error) error {
	share := c.Share(len(s.stores.Parts))
	return s.stores.Each(ctx, func(_ context.Context, _ int, st *statestore.Store) error { return f(st, share) })
}

// sumLimits adds two partitions' shares: a limit is the deployment's
// only when every partition has it.
func sumLimits(a, b statestore.Limits) statestore.Limits {
	var out statestore.Limits
	if a.MaxInFlight != nil && b.MaxInFlight != nil {
		n := *a.MaxInFlight + *b.MaxInFlight
		out.MaxInFlight = &n
	}
	if a.Burst != nil && b.Burst != nil {
		n := *a.Burst + *b.Burst
		out.Burst = &n
	}
	if a.Rate != nil && b.Rate != nil {
		r := *a.Rate + *b.Rate
		out.Rate = &r
	}
	if a.MinRate != nil && b.MinRate != nil {
		r := *a.MinRate + *b.MinRate
		out.MinRate = &r
	}
	return out
}

func firstSet(by string, at *time.Time, by2 string, at2 *time.Time) (string, *time.Time) {
	if by != "" {
		return by, at
	}
	return by2, at2
}

func laterOf(a, b *time.Time) *time.Time {
	if a == nil || b != nil && b.After(*a) {
		return b
	}
	return a
}
