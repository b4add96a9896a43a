package console

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"

	"sas/internal/orderfilter"
	"sas/internal/partition"
	"sas/internal/statestore"
)

// Bulk actions: an operator resubmits or cancels every order the orders
// list's filter selects. The confirmation shows how many that is now (a
// dry run); the job is made here, with the orders it chose, and run by
// the API's replicas (cmd/api), a batch at a time under a lease, so that
// it survives a restart of either. Its page shows its progress.

type bulkData struct {
	Jobs []statestore.BulkJob
}

type bulkJobData struct {
	Job    statestore.BulkJob
	ToGo   int // orders not reached yet
	Filter orderfilter.Filter
	Orders []statestore.BulkOrder
	// Orders is the orders list with the job's filter.
	OrdersURL template.URL
}

// bulkAction reads the action of /bulk/{action}.
func bulkAction(r *http.Request) (string, bool) {
	a := r.PathValue("action")
	return a, statestore.IsBulkAction(a)
}

// bulkQuery reads the filter of a bulk action (the URL's query on the
// confirmation, the form on the action) into the store's query.
func (s *server) bulkQuery(w http.ResponseWriter, r *http.Request, rq *request, f orderfilter.Filter) (statestore.OrderQuery, bool) {
	if f.Empty() {
		s.fail(w, r, rq, http.StatusBadRequest, "A bulk action needs a filter: it never acts on every order. Filter the orders list first.")
		return statestore.OrderQuery{}, false
	}
	q, err := f.Query(s.workflows)
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return statestore.OrderQuery{}, false
	}
	return q, true
}

func (s *server) confirmBulk(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	action, ok := bulkAction(r)
	if !ok {
		s.notFound(w, r)
		return
	}
	f := orderfilter.FromValues(r.URL.Query())
	f.Namespaces = rq.namespaces()
	q, ok := s.bulkQuery(w, r, rq, f)
	if !ok {
		return
	}
	n, err := s.stores.CountSelected(r.Context(), q, s.cfg.BulkMax)
	if err != nil {
		s.storeError(w, r, rq, err, "such orders")
		return
	}
	back := "/orders?" + f.Values().Encode()
	if n > s.cfg.BulkMax {
		s.fail(w, r, rq, http.StatusBadRequest, fmt.Sprintf("The filter selects more than %d orders, the most one bulk job may act on (SAS_CONSOLE_BULK_MAX): narrow it.", s.cfg.BulkMax))
		return
	}
	fields := map[string]string{}
	for k, v := range f.Values() {
		if k != "where" {
			fields[k] = v[0]
		}
	}
	d := confirmData{Back: back, Action: "/bulk/" + action, Fields: fields, Where: f.Where, Count: n}
	if action == statestore.BulkResubmit {
		d.Question = fmt.Sprintf("Resubmit the %d orders this filter selects?", n)
		d.Details = []string{"Each order held in error goes back to work, its failed step(s) pending again; an order no longer held when the job reaches it is left as it is and listed as failed.",
			"The job works in batches and survives a restart; its page shows its progress, and it can be stopped.",
			"Every order it touches records it as done by " + rq.user.Name + "."}
		d.Button = fmt.Sprintf("Resubmit %d orders", n)
	} else if action == statestore.BulkPause || action == statestore.BulkResume {
		verb := map[string]string{statestore.BulkPause: "Pause", statestore.BulkResume: "Resume"}[action]
		d.Question = fmt.Sprintf("%s the %d orders this filter selects?", verb, n)
		d.Details = []string{"A paused order has nothing new claimed: its steps in flight end normally, its timers and deadline wait; resumed, it runs on, its deadline moved on by the time it was paused. An order that does not run, or is not paused, is left as it is.",
			"The job works in batches; its page shows its progress, and it can be stopped.",
			"Every order it touches records it as done by " + rq.user.Name + "."}
		d.Button = fmt.Sprintf("%s %d orders", verb, n)
	} else {
		d.Question = fmt.Sprintf("Cancel the %d orders this filter selects?", n)
		d.Details = []string{"Each order's unfinished actions are cancelled and those attempted are compensated, last first; it ends failed. An order that ended meanwhile is left as it is.",
			"This cannot be undone. The job works in batches; its page shows its progress, and it can be stopped.",
			"Every order it touches records it as done by " + rq.user.Name + "."}
		d.Button = fmt.Sprintf("Cancel %d orders", n)
		d.Danger = true
	}
	if n == 0 {
		d.Details = []string{"No order matches this filter now: there is nothing to do."}
		d.Button = ""
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Bulk "+action, d)
}

func (s *server) bulkCreate(w http.ResponseWriter, r *http.Request, rq *request) {
	action, ok := bulkAction(r)
	if !ok {
		s.notFound(w, r)
		return
	}
	f := orderfilter.FromValues(r.PostForm)
	// The view's namespace, whatever the form said.
	f.Namespaces = rq.namespaces()
	q, ok := s.bulkQuery(w, r, rq, f)
	if !ok {
		return
	}
	filter, _ := json.Marshal(f)
	// One job in every partition, shown as one.
	job, err := s.stores.CreateBulkJob(r.Context(), action, q, filter, claimedBy(rq), s.cfg.BulkMax)
	if err != nil {
		s.storeError(w, r, rq, err, "such orders")
		return
	}
	s.logger.Info("console: bulk job made", "user", rq.user.Name, "job", job.ID, "action", action, "orders", job.Total)
	s.redirect(w, r, "/bulk/jobs/"+strconv.FormatInt(job.ID, 10), "bulk")
}

func (s *server) bulkJobs(w http.ResponseWriter, r *http.Request, rq *request) {
	all, err := s.stores.BulkJobs(r.Context(), 50)
	if err != nil {
		s.storeError(w, r, rq, err, "bulk job")
		return
	}
	jobs := slices.DeleteFunc(all, func(j statestore.BulkJob) bool { return !jobInView(rq, j) })
	s.render(w, r, rq, http.StatusOK, "bulk.html", "Bulk jobs", bulkData{Jobs: jobs})
}

// jobOf reads the job of /bulk/jobs/{id}, as one, and its share in each
// partition.
func (s *server) jobOf(w http.ResponseWriter, r *http.Request, rq *request) (statestore.BulkJob, []partition.BulkShare, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		s.fail(w, r, rq, http.StatusNotFound, "There is no bulk job "+orderfilter.Clip(r.PathValue("id"), 20)+".")
		return statestore.BulkJob{}, nil, false
	}
	job, shares, err := s.stores.BulkJob(r.Context(), id)
	if err == nil && !jobInView(rq, job) {
		err = statestore.ErrNotFound // made in another namespace
	}
	if err != nil {
		s.storeError(w, r, rq, err, fmt.Sprintf("bulk job %d", id))
		return job, nil, false
	}
	return job, shares, true
}

func (s *server) bulkJob(w http.ResponseWriter, r *http.Request, rq *request) {
	job, shares, ok := s.jobOf(w, r, rq)
	if !ok {
		return
	}
	d := bulkJobData{Job: job, ToGo: max(job.Total-job.Done-job.Failed, 0)}
	if err := json.Unmarshal(job.Filter, &d.Filter); err == nil {
		d.OrdersURL = template.URL("/orders?" + d.Filter.Values().Encode())
	}
	var err error
	if d.Orders, err = s.stores.BulkJobOrders(r.Context(), shares, "", 100); err != nil {
		s.storeError(w, r, rq, err, "bulk job")
		return
	}
	s.render(w, r, rq, http.StatusOK, "bulkjob.html", fmt.Sprintf("Bulk job %d", job.ID), d)
}

func (s *server) confirmBulkStop(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	job, _, ok := s.jobOf(w, r, rq)
	if !ok {
		return
	}
	href := fmt.Sprintf("/bulk/jobs/%d", job.ID)
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Stop", confirmData{
		Question: fmt.Sprintf("Stop bulk job %d (%s)?", job.ID, job.Action),
		Details: []string{fmt.Sprintf("It has acted on %d of its %d orders; the others stay as they are.", job.Done+job.Failed, job.Total),
			"A stopped job does not start again."},
		Action: href + "/stop", Button: "Stop the job", Back: href, Danger: true,
	})
}

func (s *server) bulkStop(w http.ResponseWriter, r *http.Request, rq *request) {
	job, shares, ok := s.jobOf(w, r, rq)
	if !ok {
		return
	}
	after, err := s.stores.StopBulkJob(r.Context(), shares, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, fmt.Sprintf("bulk job %d", job.ID))
		return
	}
	if after.StoppedBy != claimedBy(rq) || after.State != statestore.BulkStopped {
		s.fail(w, r, rq, http.StatusConflict, fmt.Sprintf("Bulk job %d is %s: there is nothing to stop.", job.ID, after.State))
		return
	}
	s.logger.Info("console: bulk job stopped", "user", rq.user.Name, "job", job.ID)
	s.redirect(w, r, fmt.Sprintf("/bulk/jobs/%d", job.ID), "stopped")
}
