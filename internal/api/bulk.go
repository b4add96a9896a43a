package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/statestore"

	"golang.org/x/sync/errgroup"
)

// bulkBody is the body of POST /bulk/resubmit, /bulk/cancel, /bulk/pause and /bulk/resume.
type bulkBody struct {
	Filter orderfilter.Filter `json:"filter"`
	// DryRun counts the orders the filter selects and changes nothing.
	DryRun bool `json:"dry_run"`
}

// dryRun is the answer to a dry run.
type dryRun struct {
	Action string             `json:"action"`
	Filter orderfilter.Filter `json:"filter"`
	// Count is how many orders a job would act on now; TooMany says the
	// filter selects more than a job may take (SAS_API_BULK_MAX), and
	// Count is then that limit plus one.
	Count   int  `json:"count"`
	TooMany bool `json:"too_many,omitempty"`
}

func (s *server) bulkCreate(w http.ResponseWriter, r *http.Request, c caller) {
	action := r.PathValue("id")
	if !statestore.IsBulkAction(action) {
		writeProblem(w, r, http.StatusNotFound, probNotFound, fmt.Sprintf("POST %s/bulk/%s: the bulk actions are resubmit, cancel, pause and resume", prefix, orderfilter.Clip(action, 20)))
		return
	}
	body, ok := readBody(w, r, maxSmallBody, false)
	var b bulkBody
	if !ok || !decodeInto(w, r, body, &b) {
		return
	}
	if b.Filter.Empty() {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "a bulk action needs a filter (status, workflow, from, to, id or where): it never acts on every order")
		return
	}
	// The caller's namespaces, whatever the body said.
	b.Filter.Namespaces = c.namespaces()
	q, err := b.Filter.Query(s.workflows)
	if err != nil {
		var problems orderfilter.Problems
		errors.As(err, &problems)
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, err.Error(), withErrors(problems))
		return
	}
	if b.DryRun || len(s.parts) > 1 {
		// Every partition's count; across partitions, the job is not
		// made when together they pass the bound.
		counts := make([]int, len(s.parts))
		err := s.everyPart(r.Context(), func(ctx context.Context, i int, p *part) (err error) {
			counts[i], err = p.store.CountSelected(ctx, q, s.cfg.BulkMax)
			return err
		})
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		n := 0
		for _, k := range counts {
			n += k
		}
		n = min(n, s.cfg.BulkMax+1)
		if b.DryRun {
			writeJSON(w, http.StatusOK, dryRun{Action: action, Filter: b.Filter, Count: n, TooMany: n > s.cfg.BulkMax})
			return
		}
		if n > s.cfg.BulkMax {
			writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid,
				fmt.Sprintf("the filter selects more than %d orders across the partitions: narrow it (a bulk job acts on at most %d)", s.cfg.BulkMax, s.cfg.BulkMax))
			return
		}
	}
	filter, _ := json.Marshal(b.Filter)
	job, err := s.createJob(r.Context(), action, q, filter, c.actor())
	if errors.Is(err, statestore.ErrInvalidData) {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, err.Error())
		return
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	s.logger.Info("api: bulk job made", "token", c.token.Name, "job", job.ID, "action", action, "orders", job.Total)
	href := prefix + "/bulk/" + strconv.FormatInt(job.ID, 10)
	w.Header().Set("Location", href)
	writeJSON(w, http.StatusAccepted, job)
}

// jobID reads the path's job id.
func jobID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("%q is not a bulk job id (a number)", orderfilter.Clip(r.PathValue("id"), 20)))
		return 0, false
	}
	return id, true
}

func (s *server) bulkGet(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	job, _, err := s.jobOf(r.Context(), id)
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) || !s.jobVisible(w, r, c, job) {
		return
	}
	writeJSON(w, http.StatusOK, job)
}

// jobVisible answers 404 unless the caller may see the job: a caller of
// every namespace sees every job, another only the jobs made in its
// namespaces.
func (s *server) jobVisible(w http.ResponseWriter, r *http.Request, c caller, job statestore.BulkJob) bool {
	ok, err := s.maySeeJob(r, c, job)
	if err != nil {
		s.unavailable(w, r, err)
		return false
	}
	if !ok {
		writeProblem(w, r, http.StatusNotFound, probNotFound, fmt.Sprintf("bulk job %d does not exist", job.ID))
	}
	return ok
}

func (s *server) maySeeJob(r *http.Request, c caller, job statestore.BulkJob) (bool, error) {
	all, err := s.coversAll(r.Context(), c)
	if err != nil || all {
		return all, err
	}
	var f orderfilter.Filter
	if json.Unmarshal(job.Filter, &f) != nil || f.Namespaces == nil {
		return false, nil
	}
	for _, ns := range f.Namespaces {
		if !c.token.In(ns) {
			return false, nil
		}
	}
	return true, nil
}

func (s *server) bulkList(w http.ResponseWriter, r *http.Request, c caller) {
	jobs, err := s.jobs(r.Context(), 100)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	seen := []statestore.BulkJob{}
	for _, j := range jobs {
		ok, err := s.maySeeJob(r, c, j)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		if ok {
			seen = append(seen, j)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": seen})
}

// bulkOrders lists what a job did to each order, by order id, a page at
// a time (?after=the last id of the page before).
func (s *server) bulkOrders(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	after := r.URL.Query().Get("after")
	if after != "" {
		canon, ok := messages.CanonicalID(after)
		if !ok {
			writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("after %q is not an order id", orderfilter.Clip(after, 40)))
			return
		}
		after = canon
	}
	job, shares, err := s.jobOf(r.Context(), id)
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) || !s.jobVisible(w, r, c, job) {
		return
	}
	const page = 500
	orders, err := s.jobOrders(r.Context(), shares, after, page)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	out := map[string]any{"orders": orders}
	if orders == nil {
		out["orders"] = []statestore.BulkOrder{}
	}
	if len(orders) == page {
		out["next"] = orders[len(orders)-1].OrderID
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) bulkStop(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := jobID(w, r)
	if !ok {
		return
	}
	if _, ok := readBody(w, r, maxSmallBody, true); !ok {
		return
	}
	job, shares, err := s.jobOf(r.Context(), id)
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) || !s.jobVisible(w, r, c, job) {
		return
	}
	for i := range shares {
		sh := &shares[i]
		if sh.job, err = sh.p.store.StopBulkJob(r.Context(), sh.job.ID, c.actor()); err != nil {
			s.unavailable(w, r, sh.p.inPartition(err))
			return
		}
	}
	job = merged(shares)
	s.logger.Info("api: bulk job stopped", "token", c.token.Name, "job", id, "state", job.State)
	writeJSON(w, http.StatusOK, job)
}

// runBulk works on bulk jobs until ctx ends: it takes the oldest running
// job no live replica holds, acts on its orders a batch at a time,
// renewing its lease between batches, and looks for another every poll.
func (s *server) runBulk(ctx context.Context, poll time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, p := range s.parts {
			for s.bulkStep(ctx, p) {
			}
		}
		t.Reset(poll)
	}
}

// bulkStep takes (or renews) a job and acts on one batch of it; true
// while there is more to do at once.
func (s *server) bulkStep(ctx context.Context, p *part) bool {
	job, ok, err := p.store.TakeBulkJob(ctx, s.me, s.cfg.BulkLease)
	if err != nil || !ok {
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("api: taking a bulk job", "err", p.inPartition(err))
		}
		return false
	}
	n, err := p.store.RunBulkBatch(ctx, job, s.me, fmt.Sprintf("bulk job %d by %s", job.ID, job.CreatedBy), s.cfg.BulkBatch)
	if n > 0 {
		after, err := p.store.BulkJobOf(ctx, job.ID)
		if err == nil {
			s.metrics.bulk.WithLabelValues(job.Action, "done").Add(float64(after.Done - job.Done))
			s.metrics.bulk.WithLabelValues(job.Action, "failed").Add(float64(after.Failed - job.Failed))
		}
	}
	switch {
	case statestore.ErrLeaseLost(err):
		return true // another job, or none
	case err != nil:
		if ctx.Err() == nil {
			s.logger.Warn("api: bulk job", "job", job.ID, "err", p.inPartition(err))
		}
		return false
	case n == 0:
		s.logger.Info("api: bulk job done", "job", job.ID, "action", job.Action, "partition", p.name)
	}
	return true
}

// share is one partition's part of a bulk job.
type share struct {
	p   *part
	job statestore.BulkJob
}

// createJob makes a bulk job in every partition: the first partition's
// gives the id, every other's names it as its origin. When one cannot be
// made, those made are stopped before any order is reached (the runner
// takes a job a poll after it is made at the soonest).
func (s *server) createJob(ctx context.Context, action string, q statestore.OrderQuery, filter []byte, by string) (statestore.BulkJob, error) {
	first, err := s.parts[0].store.CreateBulkJob(ctx, action, q, filter, by, s.cfg.BulkMax)
	if err != nil || len(s.parts) == 1 {
		return first, s.parts[0].inPartition(err)
	}
	shares := make([]share, len(s.parts))
	shares[0] = share{s.parts[0], first}
	err = s.everyPart(ctx, func(ctx context.Context, i int, p *part) (err error) {
		if i > 0 {
			shares[i].p = p
			shares[i].job, err = p.store.CreateBulkJobPart(ctx, first.ID, action, q, filter, by, s.cfg.BulkMax)
		}
		return err
	})
	if err != nil {
		for _, sh := range shares {
			if sh.p != nil && sh.job.ID > 0 {
				if _, serr := sh.p.store.StopBulkJob(context.WithoutCancel(ctx), sh.job.ID, by); serr != nil {
					s.logger.Warn("api: stopping a bulk job made in part", "job", first.ID, "err", sh.p.inPartition(serr))
				}
			}
		}
		return statestore.BulkJob{}, err
	}
	return merged(shares), nil
}

// jobOf reads bulk job id and its share in every partition holding one.
func (s *server) jobOf(ctx context.Context, id int64) (statestore.BulkJob, []share, error) {
	first, err := s.parts[0].store.BulkJobOf(ctx, id)
	if err != nil {
		return first, nil, err
	}
	shares := []share{{s.parts[0], first}}
	if len(s.parts) > 1 {
		others := make([]map[int64]statestore.BulkJob, len(s.parts))
		if err := s.everyPart(ctx, func(ctx context.Context, i int, p *part) (err error) {
			if i > 0 {
				others[i], err = p.store.BulkJobsOf(ctx, []int64{id})
			}
			return err
		}); err != nil {
			return statestore.BulkJob{}, nil, err
		}
		for i, o := range others {
			if j, ok := o[id]; ok {
				shares = append(shares, share{s.parts[i], j})
			}
		}
	}
	return merged(shares), shares, nil
}

// jobs lists the newest bulk jobs, newest first, each summed over the
// partitions.
func (s *server) jobs(ctx context.Context, limit int) ([]statestore.BulkJob, error) {
	firsts, err := s.parts[0].store.BulkJobs(ctx, limit)
	if err != nil || len(s.parts) == 1 || len(firsts) == 0 {
		return firsts, s.parts[0].inPartition(err)
	}
	ids := make([]int64, len(firsts))
	for i, j := range firsts {
		ids[i] = j.ID
	}
	others := make([]map[int64]statestore.BulkJob, len(s.parts))
	if err := s.everyPart(ctx, func(ctx context.Context, i int, p *part) (err error) {
		if i > 0 {
			others[i], err = p.store.BulkJobsOf(ctx, ids)
		}
		return err
	}); err != nil {
		return nil, err
	}
	out := make([]statestore.BulkJob, len(firsts))
	for k, first := range firsts {
		shares := []share{{s.parts[0], first}}
		for i, o := range others {
			if j, ok := o[first.ID]; ok {
				shares = append(shares, share{s.parts[i], j})
			}
		}
		out[k] = merged(shares)
	}
	return out, nil
}

// merged is a job as one: the first partition's, its counts summed over
// every share, running while any share runs, else stopped when one was.
func merged(shares []share) statestore.BulkJob {
	j := shares[0].job
	for _, sh := range shares[1:] {
		o := sh.job
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

// jobOrders is a page of what a job did to its orders in every partition,
// by order id from after: each share's page after the same id, merged.
func (s *server) jobOrders(ctx context.Context, shares []share, after string, page int) ([]statestore.BulkOrder, error) {
	lists := make([][]statestore.BulkOrder, len(shares))
	g, gctx := errgroup.WithContext(ctx)
	for i, sh := range shares {
		g.Go(func() (err error) {
			lists[i], err = sh.p.store.BulkJobOrders(gctx, sh.job.ID, after, page)
			return sh.p.inPartition(err)
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	all := slices.Concat(lists...)
	slices.SortFunc(all, func(x, y statestore.BulkOrder) int { return strings.Compare(x.OrderID, y.OrderID) })
	return all[:min(len(all), page)], nil
}
