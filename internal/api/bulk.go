package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/statestore"
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
	if b.DryRun {
		// Every partition's count, summed.
		n, err := s.stores.CountSelected(r.Context(), q, s.cfg.BulkMax)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, dryRun{Action: action, Filter: b.Filter, Count: n, TooMany: n > s.cfg.BulkMax})
		return
	}
	filter, _ := json.Marshal(b.Filter)
	// One job in every partition, reported as one.
	job, err := s.stores.CreateBulkJob(r.Context(), action, q, filter, c.actor(), s.cfg.BulkMax)
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
	job, _, err := s.stores.BulkJob(r.Context(), id)
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
	jobs, err := s.stores.BulkJobs(r.Context(), 100)
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
	job, shares, err := s.stores.BulkJob(r.Context(), id)
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) || !s.jobVisible(w, r, c, job) {
		return
	}
	const page = 500
	orders, err := s.stores.BulkJobOrders(r.Context(), shares, after, page)
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
	job, shares, err := s.stores.BulkJob(r.Context(), id)
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) || !s.jobVisible(w, r, c, job) {
		return
	}
	job, err = s.stores.StopBulkJob(r.Context(), shares, c.actor())
	if s.readFailed(w, r, err, fmt.Sprintf("bulk job %d", id)) {
		return
	}
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
		for i := range s.stores.Parts {
			for s.bulkStep(ctx, i) {
			}
		}
		t.Reset(poll)
	}
}

// bulkStep takes (or renews) a job and acts on one batch of it; true
// while there is more to do at once.
func (s *server) bulkStep(ctx context.Context, i int) bool {
	p := s.stores.Parts[i]
	job, ok, err := p.Store.TakeBulkJob(ctx, s.me, s.cfg.BulkLease)
	if err != nil || !ok {
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("api: taking a bulk job", "err", s.stores.Parts[i].Named(err))
		}
		return false
	}
	n, err := p.Store.RunBulkBatch(ctx, job, s.me, fmt.Sprintf("bulk job %d by %s", job.ID, job.CreatedBy), s.cfg.BulkBatch)
	if n > 0 {
		after, err := p.Store.BulkJobOf(ctx, job.ID)
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
			s.logger.Warn("api: bulk job", "job", job.ID, "err", s.stores.Parts[i].Named(err))
		}
		return false
	case n == 0:
		s.logger.Info("api: bulk job done", "job", job.ID, "action", job.Action, "partition", p.Name)
	}
	return true
}
