package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// Store is one partition's open state store.
type Store struct {
	// Name is the partition's ("" for the store of a deployment that is
	// not partitioned).
	Name  string
	Store *statestore.Store
}

// Stores is a deployment's state stores as one: a partitioned
// deployment's, each partition's in the layout's order, or one store
// alone (Layout nil). What concerns one order goes to the store its id's
// bucket names; lists merge every store's; what concerns the whole
// deployment (a workflow or an agent kind paused, a bulk job) is done in
// every store.
type Stores struct {
	Layout *Layout
	Parts  []Store
	// follower keeps the layout following the first store's moved
	// buckets; nil in a Stores made by hand.
	follower *Follower
}

// Follower keeps a layout owning the buckets as a store's
// partition_buckets says (every partition's store holds the same
// moves), looking again at most every followEvery.
type Follower struct {
	layout *Layout
	owners func(context.Context) (map[int]statestore.BucketOwner, error)
	mu     sync.Mutex
	at     time.Time
}

// followEvery bounds how stale a process's view of moved buckets is.
const followEvery = 2 * time.Second

// NewFollower keeps l following st's moved buckets.
func NewFollower(l *Layout, st *statestore.Store) *Follower {
	return &Follower{layout: l, owners: st.BucketOwners}
}

// Now makes the layout own the buckets as the store says now.
func (f *Follower) Now(ctx context.Context) error {
	owners, err := f.owners(ctx)
	if err != nil {
		return err
	}
	names := make(map[int]string, len(owners))
	for b, o := range owners {
		names[b] = o.Owner
	}
	f.mu.Lock()
	f.at = time.Now()
	f.mu.Unlock()
	return f.layout.Follow(names)
}

// Fresh follows the store's moves when the last look is older than
// followEvery; an error leaves the layout as it was, to look again on
// the next call after followEvery.
func (f *Follower) Fresh(ctx context.Context) {
	f.mu.Lock()
	stale := time.Since(f.at) >= followEvery
	if stale {
		f.at = time.Now()
	}
	f.mu.Unlock()
	if stale {
		_ = f.Now(ctx)
	}
}

// NewStores is the stores of partitioned deployment l, each partition's
// in l's order: each writes only the orders of the buckets its
// partition owns (statestore.Store.FenceAs), and l follows the moved
// buckets.
func NewStores(l *Layout, parts []Store) Stores {
	for _, p := range parts {
		p.Store.FenceAs(p.Name, l.BucketOf)
	}
	return Stores{Layout: l, Parts: parts, follower: NewFollower(l, parts[0].Store)}
}

// One is the stores of a deployment that is not partitioned.
func One(s *statestore.Store) Stores { return Stores{Parts: []Store{{Store: s}}} }

// Follow makes the layout own the buckets as the stores say now.
func (s Stores) Follow(ctx context.Context) error {
	if s.follower == nil {
		return nil
	}
	return s.Parts[0].Named(s.follower.Now(ctx))
}

// follow follows the stores' moves when the last look is stale.
func (s Stores) follow(ctx context.Context) {
	if s.follower != nil {
		s.follower.Fresh(ctx)
	}
}

// Index is the index in Parts of the store holding order id: its
// bucket's owner, or, for a bucket moved since the file split them, the
// store that holds it (an order stays where it was written), else the
// owner.
func (s Stores) Index(ctx context.Context, id string) int {
	if s.Layout == nil {
		return 0
	}
	s.follow(ctx)
	b := BucketOf(id, s.Layout.Buckets)
	owner := s.Layout.Owner(b)
	if !s.Layout.Moved(b) {
		return owner
	}
	order := append([]int{owner}, slices.DeleteFunc(seq(len(s.Parts)), func(i int) bool { return i == owner })...)
	for _, i := range order {
		if found, err := s.Parts[i].Store.HasOrder(ctx, id); err == nil && found {
			return i
		}
	}
	return owner
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Of is the store holding order id.
func (s Stores) Of(ctx context.Context, id string) *statestore.Store {
	return s.Parts[s.Index(ctx, id)].Store
}

// Owner is the store that writes order id now (its bucket's owner, as
// last followed), and its index in Parts.
func (s Stores) Owner(ctx context.Context, id string) (int, *statestore.Store) {
	if s.Layout == nil {
		return 0, s.Parts[0].Store
	}
	s.follow(ctx)
	i := s.Layout.Owner(BucketOf(id, s.Layout.Buckets))
	return i, s.Parts[i].Store
}

// Named names the partition in an error of a partitioned deployment.
func (p Store) Named(err error) error {
	if err == nil || p.Name == "" {
		return err
	}
	return fmt.Errorf("partition %s: %w", p.Name, err)
}

// Each runs f on every store at once and joins their errors, each naming
// its partition.
func (s Stores) Each(ctx context.Context, f func(ctx context.Context, i int, st *statestore.Store) error) error {
	if len(s.Parts) == 1 {
		return f(ctx, 0, s.Parts[0].Store)
	}
	var g errgroup.Group
	errs := make([]error, len(s.Parts))
	for i, p := range s.Parts {
		g.Go(func() error {
			errs[i] = p.Named(f(ctx, i, p.Store))
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// OrderPage is a page of every store's orders: each store's page after
// the same cursor, merged newest first, each row naming its partition
// (statestore.MergeOrderPages).
func (s Stores) OrderPage(ctx context.Context, q statestore.OrderQuery) ([]statestore.OrderRow, *statestore.OrderCursor, error) {
	if len(s.Parts) == 1 {
		return s.Parts[0].Store.OrderPage(ctx, q)
	}
	pages := make([][]statestore.OrderRow, len(s.Parts))
	more := make([]bool, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) error {
		rows, next, err := st.OrderPage(ctx, q)
		for j := range rows {
			rows[j].Partition = s.Parts[i].Name
		}
		pages[i], more[i] = rows, next != nil
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, next := statestore.MergeOrderPages(pages, slices.Contains(more, true), q.Limit)
	return rows, next, nil
}

// Named is the store of the partition named name ("" or, unpartitioned,
// the only one: the first).
func (s Stores) Named(name string) (*statestore.Store, bool) {
	if name == "" {
		return s.Parts[0].Store, true
	}
	i := slices.IndexFunc(s.Parts, func(p Store) bool { return p.Name == name })
	if i < 0 {
		return nil, false
	}
	return s.Parts[i].Store, true
}

// ListAlerts lists every store's alerts f selects, newest first, each
// naming its partition, at most f.Limit.
func (s Stores) ListAlerts(ctx context.Context, f statestore.AlertFilter) ([]statestore.Alert, error) {
	if len(s.Parts) == 1 {
		return s.Parts[0].Store.ListAlerts(ctx, f)
	}
	lists := make([][]statestore.Alert, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		lists[i], err = st.ListAlerts(ctx, f)
		for j := range lists[i] {
			lists[i][j].Partition = s.Parts[i].Name
		}
		return err
	})
	all := slices.Concat(lists...)
	slices.SortStableFunc(all, func(x, y statestore.Alert) int { return y.RaisedAt.Compare(x.RaisedAt) })
	if f.Limit > 0 {
		all = all[:min(len(all), f.Limit)]
	}
	return all, err
}

// CountSelected is the orders q selects in every store, up to max+1.
func (s Stores) CountSelected(ctx context.Context, q statestore.OrderQuery, max int) (int, error) {
	counts := make([]int, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		counts[i], err = st.CountSelected(ctx, q, max)
		return err
	})
	n := 0
	for _, k := range counts {
		n += k
	}
	return min(n, max+1), err
}

// PauseWorkflow pauses a workflow in every store; it returns how many
// running orders it paused in all.
func (s Stores) PauseWorkflow(ctx context.Context, name, reason, by string) (int, error) {
	return s.sum(ctx, func(ctx context.Context, st *statestore.Store) (int, error) {
		return st.PauseWorkflow(ctx, name, reason, by)
	})
}

// ResumeWorkflow resumes a workflow in every store where it is paused:
// ErrInvalidState only when it is paused in none.
func (s Stores) ResumeWorkflow(ctx context.Context, name, by string) (int, error) {
	notPaused := make([]bool, len(s.Parts))
	counts := make([]int, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		counts[i], err = st.ResumeWorkflow(ctx, name, by)
		if errors.Is(err, statestore.ErrInvalidState) && len(s.Parts) > 1 {
			notPaused[i], err = true, nil
		}
		return err
	})
	if err == nil && !slices.Contains(notPaused, false) {
		err = fmt.Errorf("resume workflow: %s is not paused: %w", name, statestore.ErrInvalidState)
	}
	n := 0
	for _, k := range counts {
		n += k
	}
	return n, err
}

// PauseKind pauses an agent kind in every store: Paused when any store
// paused it now, else AlreadyPaused.
func (s Stores) PauseKind(ctx context.Context, kind, reason, by string) (string, error) {
	return s.outcome(ctx, statestore.Paused, func(ctx context.Context, st *statestore.Store) (string, error) {
		return st.PauseKind(ctx, kind, reason, by)
	})
}

// ResumeKind resumes an agent kind in every store: Resumed when any store
// resumed it now, else NotPaused.
func (s Stores) ResumeKind(ctx context.Context, kind, by string) (string, error) {
	return s.outcome(ctx, statestore.Resumed, func(ctx context.Context, st *statestore.Store) (string, error) {
		return st.ResumeKind(ctx, kind, by)
	})
}

func (s Stores) outcome(ctx context.Context, change string, f func(context.Context, *statestore.Store) (string, error)) (string, error) {
	outcomes := make([]string, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		outcomes[i], err = f(ctx, st)
		return err
	})
	if slices.Contains(outcomes, change) {
		return change, err
	}
	return outcomes[0], err
}

func (s Stores) sum(ctx context.Context, f func(context.Context, *statestore.Store) (int, error)) (int, error) {
	counts := make([]int, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		counts[i], err = f(ctx, st)
		return err
	})
	n := 0
	for _, k := range counts {
		n += k
	}
	return n, err
}

// PausesIn lists what is paused in every store (orders of namespaces
// only, when not nil), a workflow or kind paused in several once, at
// most limit.
func (s Stores) PausesIn(ctx context.Context, limit int, namespaces []string) ([]statestore.Pause, error) {
	lists := make([][]statestore.Pause, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		lists[i], err = st.PausesIn(ctx, limit, namespaces)
		return err
	})
	var out []statestore.Pause
	seen := map[[2]string]bool{}
	for _, l := range lists {
		for _, p := range l {
			if k := [2]string{p.Scope, p.Target}; !seen[k] && len(out) < limit {
				seen[k] = true
				out = append(out, p)
			}
		}
	}
	return out, err
}

// BulkShare is one store's part of a bulk job.
type BulkShare struct {
	Part int
	Job  statestore.BulkJob
}

// CreateBulkJob makes a bulk job in every store: the first store's gives
// the id, every other's names it as its origin. The bound max holds for
// the sum (counted first; more is ErrInvalidData). When one cannot be
// made, those made are stopped before any order is reached (a runner
// takes a job a poll after it is made at the soonest).
func (s Stores) CreateBulkJob(ctx context.Context, action string, q statestore.OrderQuery, filter []byte, by string, max int) (statestore.BulkJob, error) {
	if len(s.Parts) == 1 {
		return s.Parts[0].Store.CreateBulkJob(ctx, action, q, filter, by, max)
	}
	n, err := s.CountSelected(ctx, q, max)
	if err != nil {
		return statestore.BulkJob{}, err
	}
	if n > max {
		return statestore.BulkJob{}, fmt.Errorf("the filter selects more than %d orders across the partitions: narrow it (a bulk job acts on at most %d): %w",
			max, max, statestore.ErrInvalidData)
	}
	first, err := s.Parts[0].Store.CreateBulkJob(ctx, action, q, filter, by, max)
	if err != nil {
		return first, s.Parts[0].Named(err)
	}
	shares := make([]BulkShare, len(s.Parts))
	shares[0] = BulkShare{0, first}
	err = s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		if i > 0 {
			shares[i].Part = i
			shares[i].Job, err = st.CreateBulkJobPart(ctx, first.ID, action, q, filter, by, max)
		}
		return err
	})
	if err != nil {
		for _, sh := range shares {
			if sh.Job.ID > 0 {
				_, _ = s.Parts[sh.Part].Store.StopBulkJob(context.WithoutCancel(ctx), sh.Job.ID, by)
			}
		}
		return statestore.BulkJob{}, err
	}
	return mergeJob(shares), nil
}

// BulkJob reads bulk job id as one, and its share in every store holding
// one.
func (s Stores) BulkJob(ctx context.Context, id int64) (statestore.BulkJob, []BulkShare, error) {
	first, err := s.Parts[0].Store.BulkJobOf(ctx, id)
	if err != nil {
		return first, nil, s.Parts[0].Named(err)
	}
	shares := []BulkShare{{0, first}}
	if len(s.Parts) == 1 {
		return first, shares, nil
	}
	others := make([]map[int64]statestore.BulkJob, len(s.Parts))
	if err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		if i > 0 {
			others[i], err = st.BulkJobsOf(ctx, []int64{id})
		}
		return err
	}); err != nil {
		return statestore.BulkJob{}, nil, err
	}
	for i, o := range others {
		if j, ok := o[id]; ok {
			shares = append(shares, BulkShare{i, j})
		}
	}
	return mergeJob(shares), shares, nil
}

// BulkJobs lists the newest bulk jobs, newest first, each as one.
func (s Stores) BulkJobs(ctx context.Context, limit int) ([]statestore.BulkJob, error) {
	firsts, err := s.Parts[0].Store.BulkJobs(ctx, limit)
	if err != nil || len(s.Parts) == 1 || len(firsts) == 0 {
		return firsts, s.Parts[0].Named(err)
	}
	ids := make([]int64, len(firsts))
	for i, j := range firsts {
		ids[i] = j.ID
	}
	others := make([]map[int64]statestore.BulkJob, len(s.Parts))
	if err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		if i > 0 {
			others[i], err = st.BulkJobsOf(ctx, ids)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out := make([]statestore.BulkJob, len(firsts))
	for k, first := range firsts {
		shares := []BulkShare{{0, first}}
		for i, o := range others {
			if j, ok := o[first.ID]; ok {
				shares = append(shares, BulkShare{i, j})
			}
		}
		out[k] = mergeJob(shares)
	}
	return out, nil
}

// StopBulkJob stops every share of a job.
func (s Stores) StopBulkJob(ctx context.Context, shares []BulkShare, by string) (statestore.BulkJob, error) {
	stopped := slices.Clone(shares)
	for i := range stopped {
		sh := &stopped[i]
		var err error
		if sh.Job, err = s.Parts[sh.Part].Store.StopBulkJob(ctx, sh.Job.ID, by); err != nil {
			return statestore.BulkJob{}, s.Parts[sh.Part].Named(err)
		}
	}
	return mergeJob(stopped), nil
}

// BulkJobOrders is a page of what a job did to its orders in every store,
// by order id from after: each share's page after the same id, merged.
func (s Stores) BulkJobOrders(ctx context.Context, shares []BulkShare, after string, limit int) ([]statestore.BulkOrder, error) {
	lists := make([][]statestore.BulkOrder, len(shares))
	var g errgroup.Group
	for i, sh := range shares {
		g.Go(func() (err error) {
			lists[i], err = s.Parts[sh.Part].Store.BulkJobOrders(ctx, sh.Job.ID, after, limit)
			return s.Parts[sh.Part].Named(err)
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	all := slices.Concat(lists...)
	slices.SortFunc(all, func(x, y statestore.BulkOrder) int { return strings.Compare(x.OrderID, y.OrderID) })
	return all[:min(len(all), limit)], nil
}

// mergeJob is a job as one: the first store's, its counts summed over
// every share, running while any share runs, else stopped when one was.
func mergeJob(shares []BulkShare) statestore.BulkJob {
	j := shares[0].Job
	for _, sh := range shares[1:] {
		o := sh.Job
		j.Total += o.Total
		j.Done += o.Done
		j.Failed += o.Failed
		if o.UpdatedAt.After(j.UpdatedAt) {
			j.UpdatedAt = o.UpdatedAt
		}
		if j.StoppedBy == "" {
			j.StoppedBy = o.StoppedBy
		}
		switch {
		case o.State == statestore.BulkRunning:
			j.State = statestore.BulkRunning
		case o.State == statestore.BulkStopped && j.State == statestore.BulkDone:
			j.State = statestore.BulkStopped
		}
	}
	return j
}

// RunningOrders is the oldest running orders of a workflow on another
// version than version in every store, an even share of limit from each.
func (s Stores) RunningOrders(ctx context.Context, wf, version string, limit int) ([]string, error) {
	share := (limit + len(s.Parts) - 1) / len(s.Parts)
	lists := make([][]string, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		lists[i], err = st.RunningOrders(ctx, wf, version, share)
		return err
	})
	ids := slices.Concat(lists...)
	return ids[:min(len(ids), limit)], err
}

// MigrateOrders moves each order in its own store (statestore.Store's
// MigrateOrders), the verdicts in ids' order.
func (s Stores) MigrateOrders(ctx context.Context, ids []string, wf workflow.Workflow, apply bool, by string) ([]statestore.MigrationVerdict, error) {
	if len(s.Parts) == 1 {
		return s.Parts[0].Store.MigrateOrders(ctx, ids, wf, apply, by)
	}
	verdicts := make([]statestore.MigrationVerdict, len(ids))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) error {
		var at []int
		var mine []string
		for k, id := range ids {
			if s.Index(ctx, id) == i {
				at, mine = append(at, k), append(mine, id)
			}
		}
		if len(mine) == 0 {
			return nil
		}
		vs, err := st.MigrateOrders(ctx, mine, wf, apply, by)
		for k, v := range vs {
			verdicts[at[k]] = v
		}
		return err
	})
	return verdicts, err
}

// OrdersByKeyIn is the running orders of a workflow with those search
// attribute values in every store, at most limit.
func (s Stores) OrdersByKeyIn(ctx context.Context, wf string, where map[string]any, limit int, namespaces []string) ([]string, error) {
	lists := make([][]string, len(s.Parts))
	err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		lists[i], err = st.OrdersByKeyIn(ctx, wf, where, limit, namespaces)
		return err
	})
	ids := slices.Concat(lists...)
	return ids[:min(len(ids), limit)], err
}

// ReadOverview is every store's overview as one: counts summed, the
// oldest steps and the latencies the slowest partition's (percentiles do
// not add up), the supervisor leader named for each partition.
func (s Stores) ReadOverview(ctx context.Context, window time.Duration, lease string) (statestore.Overview, error) {
	if len(s.Parts) == 1 {
		return s.Parts[0].Store.ReadOverview(ctx, window, lease)
	}
	ovs := make([]statestore.Overview, len(s.Parts))
	if err := s.Each(ctx, func(ctx context.Context, i int, st *statestore.Store) (err error) {
		ovs[i], err = st.ReadOverview(ctx, window, lease)
		return err
	}); err != nil {
		return statestore.Overview{}, err
	}
	out := statestore.Overview{Live: map[string]int64{}, Recent: map[string]int64{}, Window: window, TotalEstimate: -1,
		Steps: statestore.StepStats{ByState: map[string]int{}, OpenAlertsIn: map[string]int{}, InFlightIn: map[string]statestore.NamespaceLoad{}}}
	var leaders []string
	led := false
	for i, ov := range ovs {
		for k, v := range ov.Live {
			out.Live[k] += v
		}
		for k, v := range ov.Recent {
			out.Recent[k] += v
		}
		out.CompletedPerSecond += ov.CompletedPerSecond
		out.LatencyP50, out.LatencyP95 = max(out.LatencyP50, ov.LatencyP50), max(out.LatencyP95, ov.LatencyP95)
		if ov.TotalEstimate >= 0 {
			out.TotalEstimate = max(out.TotalEstimate, 0) + ov.TotalEstimate
		}
		for k, v := range ov.Steps.ByState {
			out.Steps.ByState[k] += v
		}
		out.Steps.OldestPending = max(out.Steps.OldestPending, ov.Steps.OldestPending)
		out.Steps.OldestProcessing = max(out.Steps.OldestProcessing, ov.Steps.OldestProcessing)
		out.Steps.OpenAlerts += ov.Steps.OpenAlerts
		for k, v := range ov.Steps.OpenAlertsIn {
			out.Steps.OpenAlertsIn[k] += v
		}
		for k, v := range ov.Steps.InFlightIn {
			l := out.Steps.InFlightIn[k]
			l.InFlight += v.InFlight
			if v.MaxInFlight != nil { // each partition's share: together, the quota
				sum := *v.MaxInFlight
				if l.MaxInFlight != nil {
					sum += *l.MaxInFlight
				}
				l.MaxInFlight = &sum
			}
			out.Steps.InFlightIn[k] = l
		}
		leader := ov.Leader
		if leader == "" {
			leader = "none"
		} else {
			led = true
		}
		leaders = append(leaders, s.Parts[i].Name+": "+leader)
		if out.LeaderUntil.IsZero() || !ov.LeaderUntil.IsZero() && ov.LeaderUntil.Before(out.LeaderUntil) {
			out.LeaderUntil = ov.LeaderUntil
		}
		if ov.At.After(out.At) {
			out.At = ov.At
		}
	}
	if led {
		out.Leader = strings.Join(leaders, "; ")
	}
	return out, nil
}
