package console

import (
	"context"
	"encoding/json"
	"errors"
	"html/template"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// overviewWindow is the recent window of the overview's throughput and
// latency.
const overviewWindow = 5 * time.Minute

type queueCount struct {
	Queue string // unprefixed input name
	Count int
	Error string
	// Partition names the partition whose queue it is, in a
	// partitioned deployment ("" otherwise).
	Partition string
}

type overviewData struct {
	Overview statestore.Overview
	Alerts   []statestore.Alert
	Queues   []queueCount
	Broker   bool
	Actions  []statestore.OperatorAction
	Statuses []string
	// Charts are the last hour of the busiest workflows.
	Charts []workflowCharts
}

func (s *server) readOverview(ctx context.Context) (overviewData, error) {
	d := overviewData{Statuses: statestore.OrderStatuses()}
	var err error
	if d.Overview, err = s.stores.ReadOverview(ctx, overviewWindow, statestore.SupervisorLease); err != nil {
		return d, err
	}
	if d.Alerts, err = s.stores.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: true, Limit: 10}); err != nil {
		return d, err
	}
	if d.Actions, err = s.store.OperatorActions(ctx, 10); err != nil {
		return d, err
	}
	d.Queues, d.Broker = s.deadLetterCounts(ctx)
	rows, now, err := s.store.OverviewMinutes(ctx, chartMinutes*time.Minute)
	if err != nil {
		return d, err
	}
	d.Charts = buildCharts(rows, now)
	return d, nil
}

func (s *server) overview(w http.ResponseWriter, r *http.Request, rq *request) {
	if !rq.everywhere() {
		// The overview is the deployment's: a namespace's view starts
		// at its orders.
		http.Redirect(w, r, "/orders", http.StatusSeeOther)
		return
	}
	d, err := s.readOverview(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "overview")
		return
	}
	s.render(w, r, rq, http.StatusOK, "overview.html", "Overview", d)
}

// overviewLive is the overview's live part alone, polled by the page.
func (s *server) overviewLive(w http.ResponseWriter, r *http.Request, rq *request) {
	d, err := s.readOverview(r.Context())
	if err != nil {
		s.logger.Error("overview", "err", err)
		http.Error(w, "the state store did not answer", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	serverTiming(w, r)
	if err := s.pages["overview.html"].ExecuteTemplate(w, "live", page{Data: d, CanAct: s.canAct(rq)}); err != nil {
		s.logger.Error("render", "page", "overview live", "err", err)
	}
}

type ordersData struct {
	orderfilter.Filter
	Statuses  []string
	Workflows []string
	// Attributes are the search attributes the workflows declare, for
	// the where field's hints.
	Attributes []string
	Orders     []statestore.OrderRow
	Next       string // the next page's query, "" at the end
	First      bool
	FirstURL   string
	// BulkResubmit and BulkCancel are the bulk actions' links, with the
	// filter (a URL as it is: html/template would escape a query's = and
	// & written into a link's query).
	BulkResubmit, BulkCancel, BulkPause, BulkResume template.URL
	Error                                           string
	// Partitioned: the deployment is, and each row names its partition.
	Partitioned bool
}

// orders lists orders, newest first, a page at a time by keyset; every
// filter (search attributes too) is read as the API reads it, and
// checked before the query.
func (s *server) orders(w http.ResponseWriter, r *http.Request, rq *request) {
	q := r.URL.Query()
	f := orderfilter.FromValues(q)
	f.Where = slices.DeleteFunc(slices.Clone(f.Where), func(w string) bool { return strings.TrimSpace(w) == "" })
	d := ordersData{Filter: f, Statuses: statestore.OrderStatuses(), First: q.Get("after") == "", Attributes: s.attributeNames(),
		Partitioned: s.stores.Layout != nil}
	versions, err := s.store.WorkflowVersions(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "workflow")
		return
	}
	for _, v := range versions {
		if !slices.Contains(d.Workflows, v.Name) {
			d.Workflows = append(d.Workflows, v.Name)
		}
	}
	sort.Strings(d.Workflows)
	oq, err := f.Query(s.workflows)
	var problems orderfilter.Problems
	errors.As(err, &problems)
	if oq.After, err = orderfilter.DecodeCursor(q.Get("after")); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		d.Error = problems.Error()
		s.render(w, r, rq, http.StatusBadRequest, "orders.html", "Orders", d)
		return
	}
	oq.Limit = pageSize
	oq.Namespaces = rq.namespaces()
	var next *statestore.OrderCursor
	d.Orders, next, err = s.stores.OrderPage(r.Context(), oq)
	if err != nil {
		s.storeError(w, r, rq, err, "such page")
		return
	}
	nq := f.Values()
	query := nq.Encode()
	d.FirstURL = "/orders?" + query
	d.BulkResubmit = template.URL("/bulk/" + statestore.BulkResubmit + "?" + query)
	d.BulkCancel = template.URL("/bulk/" + statestore.BulkCancel + "?" + query)
	d.BulkPause = template.URL("/bulk/" + statestore.BulkPause + "?" + query)
	d.BulkResume = template.URL("/bulk/" + statestore.BulkResume + "?" + query)
	if next != nil {
		nq.Set("after", orderfilter.EncodeCursor(next))
		d.Next = "/orders?" + nq.Encode()
	}
	s.render(w, r, rq, http.StatusOK, "orders.html", "Orders", d)
}

// attributeNames are the search attributes the workflows declare, each
// once, sorted.
func (s *server) attributeNames() []string {
	var names []string
	for _, wf := range s.workflows.All() {
		for _, a := range wf.SearchAttributes {
			if !slices.Contains(names, a.Name) {
				names = append(names, a.Name)
			}
		}
	}
	sort.Strings(names)
	return names
}

type orderData struct {
	statestore.OrderDetail
	Steps     []stepView
	Alerts    []statestore.Alert
	CanCancel bool
	// CanPause and CanResume: the order runs and is not paused; it is
	// paused.
	CanPause, CanResume bool
	// MoveTo is the version of its workflow the console's file has, when
	// the order runs another: it may be moved to it.
	MoveTo      string
	CanResubmit bool
	// CanRerun: held in error by a failed action, so it may run again
	// with a corrected payload.
	CanRerun bool
	// Attributes are its search attributes; Payloads the payloads re-runs
	// replaced, oldest first.
	Attributes []statestore.Attribute
	Payloads   []statestore.PayloadChange
	Results    json.RawMessage
	// Graph is a graph order's actions by level (nil for a list's).
	Graph [][]graphNode
	// Why says why a failed or held order failed (whyEnded).
	Why string
	// Timeline draws each step's attempts, waits and timers (buildGantt).
	Timeline *gantt // Drawing is the process as a graph with its edges (orderGraph).
	Drawing  *graphSVG
}

func (s *server) readOrder(w http.ResponseWriter, r *http.Request, rq *request) (orderData, bool) {
	var d orderData
	id := r.PathValue("id")
	if !validID(id) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+": an order id is a UUID.")
		return d, false
	}
	var err error
	// In the partition its id names (the only store, unpartitioned).
	store := s.stores.Of(r.Context(), id)
	d.OrderDetail, err = store.GetOrder(r.Context(), id)
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return d, false
	}
	if d.Alerts, err = store.ListAlerts(r.Context(), statestore.AlertFilter{OrderID: id, Limit: 100}); err != nil {
		s.storeError(w, r, rq, err, "alert")
		return d, false
	}
	for i := range d.Alerts {
		d.Alerts[i].Partition = s.stores.Parts[s.stores.Index(r.Context(), id)].Name
	}
	compensationFailed := false
	for _, st := range d.OrderDetail.Steps {
		if st.Kind == statestore.KindCompensation && st.ProcessState == statestore.StepError {
			compensationFailed = true
		}
	}
	// A failure holds the order when its policy says so, and always when
	// it is a compensation's (the order is then partly undone).
	shown := d.OrderDetail.ShownStates()
	for _, st := range d.OrderDetail.Steps {
		held := d.Order.FailurePolicy == statestore.PolicyHold || st.Kind == statestore.KindCompensation
		v := stepView{Step: st, Timeline: timeline(st, d.History, held), Shown: shown[st.Step],
			Live: st.ProcessState == statestore.StepPending || st.ProcessState == statestore.StepProcessing}
		v.Failures = failures(v.Timeline)
		v.CanResubmit = d.Order.Status == statestore.OrderError && resubmittable(st, compensationFailed)
		v.CanRunAgain = d.Order.Status == statestore.OrderError && !compensationFailed && mayRunAgain(st)
		v.CanSignal = st.ProcessState == statestore.StepAwaiting && st.Wait != ""
		d.CanResubmit = d.CanResubmit || v.CanResubmit
		d.Steps = append(d.Steps, v)
	}
	d.Graph = graphLevels(d.OrderDetail.Steps, shown)
	d.Drawing = orderGraph(d.OrderDetail, shown)
	d.Why = whyEnded(d.Order, d.OrderDetail.Steps)
	if dl := d.OrderDetail.Deadline; d.Why == "" && dl != nil && dl.Outcome != "" && dl.Outcome != "ended" {
		d.Why = "its deadline passed: " + dl.Describe()
	}
	d.Timeline = buildGantt(d.OrderDetail, time.Now())
	switch d.Order.Status {
	case statestore.OrderReceived, statestore.OrderProcessing:
		d.CanCancel = true
	case statestore.OrderError:
		d.CanCancel = !compensationFailed
		d.CanRerun = !compensationFailed
	}
	if wf, ok := s.workflows.Lookup(d.Order.Workflow); ok && wf.Name == d.Order.Workflow && wf.Version() != d.Order.WorkflowVersion &&
		(d.Order.Status == statestore.OrderReceived || d.Order.Status == statestore.OrderProcessing) {
		d.MoveTo = wf.Version()
	}
	switch {
	case d.OrderDetail.Paused != nil:
		d.CanResume = true
	case d.Order.Status == statestore.OrderReceived || d.Order.Status == statestore.OrderProcessing || d.Order.Status == statestore.OrderCompensating:
		d.CanPause = true
	}
	return d, true
}

// resubmittable is the state store's rule (operator_resubmit) for a step
// of an order held in error: a step in error, and, once a compensation
// failed (the order is partly undone), only a compensation.
func resubmittable(st statestore.Step, compensationFailed bool) bool {
	return st.ProcessState == statestore.StepError && (!compensationFailed || st.Kind == statestore.KindCompensation)
}

// mayRunAgain: an action that ended, not one instance of a for_each step,
// which an operator may run again with what depends on it.
func mayRunAgain(st statestore.Step) bool {
	return st.Kind == statestore.KindAction && st.Parent == 0 &&
		(st.ProcessState == statestore.StepProcessed || st.ProcessState == statestore.StepSkipped)
}

func (s *server) order(w http.ResponseWriter, r *http.Request, rq *request) {
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	var err error
	if d.Attributes, err = s.stores.Of(r.Context(), d.Order.OrderID).Attributes(r.Context(), d.Order.OrderID); err == nil {
		d.Payloads, err = s.stores.Of(r.Context(), d.Order.OrderID).PayloadHistory(r.Context(), d.Order.OrderID)
	}
	if err != nil {
		s.storeError(w, r, rq, err, "order "+d.Order.OrderID)
		return
	}
	s.render(w, r, rq, http.StatusOK, "order.html", "Order "+d.Order.OrderID, d)
}

type alertsData struct {
	All    bool
	Alerts []statestore.Alert
	// Partitioned: each alert names its partition.
	Partitioned bool
}

func (s *server) alerts(w http.ResponseWriter, r *http.Request, rq *request) {
	all := r.URL.Query().Get("all")
	if all != "" && all != "1" {
		s.fail(w, r, rq, http.StatusBadRequest, "all= takes 1 or nothing.")
		return
	}
	d := alertsData{All: all == "1", Partitioned: s.stores.Layout != nil}
	var err error
	if d.Alerts, err = s.stores.ListAlerts(r.Context(), statestore.AlertFilter{OpenOnly: !d.All, Limit: 200, Namespaces: rq.namespaces()}); err != nil {
		s.storeError(w, r, rq, err, "alert")
		return
	}
	s.render(w, r, rq, http.StatusOK, "alerts.html", "Alerts", d)
}

// alertID reads the {id} of an alert's path.
func alertID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id, err == nil && id > 0
}

type workflowView struct {
	statestore.WorkflowVersion
	Workflow workflow.Workflow
	InFile   bool
	// Drawing is the workflow as a graph with its edges (workflowGraph).
	Drawing *graphSVG
}

type workflowsData struct {
	Source   string
	Versions []workflowView
	FileOnly []workflow.Workflow
}

func (s *server) workflowsPage(w http.ResponseWriter, r *http.Request, rq *request) {
	versions, err := s.store.WorkflowVersions(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "workflow")
		return
	}
	d := workflowsData{Source: s.workflows.Source}
	stored := map[string]bool{}
	for _, v := range versions {
		wv := workflowView{WorkflowVersion: v}
		if err := json.Unmarshal(v.Definition, &wv.Workflow); err != nil {
			s.logger.Warn("a stored workflow definition does not read", "workflow", v.Name, "version", v.Version, "err", err)
		}
		if f, ok := s.workflows.Lookup(v.Name); ok && f.Version() == v.Version {
			wv.InFile = true
		}
		wv.Drawing = workflowGraph(wv.Workflow)
		stored[v.Name+"@"+v.Version] = true
		d.Versions = append(d.Versions, wv)
	}
	for _, wf := range s.workflows.All() {
		if !stored[wf.Name+"@"+wf.Version()] {
			d.FileOnly = append(d.FileOnly, wf)
		}
	}
	s.render(w, r, rq, http.StatusOK, "workflows.html", "Workflows", d)
}

// agentsInUse are the agent kinds of the console's workflows file and of
// every stored version: whose request queues may hold dead letters.
func (s *server) agentsInUse(ctx context.Context) []string {
	kinds := s.workflows.Agents()
	versions, err := s.store.WorkflowVersions(ctx)
	if err != nil {
		s.logger.Warn("workflow versions", "err", err)
	}
	for _, v := range versions {
		var wf workflow.Workflow
		if json.Unmarshal(v.Definition, &wf) != nil {
			continue
		}
		for _, st := range wf.Steps {
			for _, k := range []*workflow.Step{&st, st.Compensation} {
				if k != nil && k.Agent != "" && !slices.Contains(kinds, k.Agent) {
					kinds = append(kinds, k.Agent)
				}
			}
		}
	}
	sort.Strings(kinds)
	return kinds
}

// inputs are the unprefixed names of the queues whose dead letters the
// console shows.
func (s *server) inputs(ctx context.Context) []string {
	return messages.Inputs(s.agentsInUse(ctx))
}

var errNoBroker = errors.New("the console is not connected to the broker yet")
