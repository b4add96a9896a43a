package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// confirmData is an action's confirmation page: what will happen, and the
// form that does it.
type confirmData struct {
	Question string
	Details  []string
	Action   string // the form's target
	Fields   map[string]string
	Button   string
	Back     string
	Danger   bool
	// Payload, when set, labels a field for a JSON payload, filled with
	// PayloadValue.
	Payload      string
	PayloadValue string
	// StepChoice adds a field for a step number.
	StepChoice bool
	// Where are a bulk action's search attribute conditions, and Count
	// the orders its filter selects now.
	Where []string
	Count int
	// Inputs are fields to fill in (a change of limits).
	Inputs []confirmInput
}

// confirmInput is one labelled text field of a confirmation's form.
type confirmInput struct {
	Name, Label, Value string
}

// claimedBy is the name the history records for the console's user (the
// database records the console's own login beside it).
func claimedBy(rq *request) string { return "console:" + rq.user.Name }

// mayAct answers a confirmation page to whoever may not act.
func (s *server) mayAct(w http.ResponseWriter, r *http.Request, rq *request) bool {
	if s.canAct(rq) {
		return true
	}
	if s.cfg.ReadOnly {
		s.fail(w, r, rq, http.StatusForbidden, "The console is read-only.")
	} else {
		s.fail(w, r, rq, http.StatusForbidden, "Your role ("+rq.user.Role+") may only look.")
	}
	return false
}

// stepParam reads an optional step number (0: none given).
func stepParam(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > messages.MaxStep {
		return 0, fmt.Errorf("step %q is not a step number", orderfilter.Clip(v, 20))
	}
	return n, nil
}

func (s *server) confirmResubmit(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	step, err := stepParam(r.URL.Query().Get("step"))
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	which := "its step in error"
	what := "The step goes back to pending with its failure count at 0, and the order back to work."
	if step != 0 {
		st, ok := s.stepOf(w, r, rq, d, step)
		if !ok {
			return
		}
		which = fmt.Sprintf("step %d (%s)", step, st.Name)
		if mayRunAgain(st) {
			what = "The step runs again, and so does every step that depends on it; those processed get a new " +
				"idempotency key, so their services do them again. The first run is not undone."
		}
	}
	id := d.Order.OrderID
	fields := map[string]string{}
	if step != 0 {
		fields["step"] = strconv.Itoa(step)
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Resubmit", confirmData{
		Question: fmt.Sprintf("Resubmit %s of order %s?", which, id),
		Details: []string{"The order is " + d.Order.Status + ".",
			what,
			"The history records it as done by " + rq.user.Name + "."},
		Action: "/orders/" + id + "/resubmit", Fields: fields,
		Button: "Resubmit", Back: "/orders/" + id,
	})
}

func (s *server) resubmit(w http.ResponseWriter, r *http.Request, rq *request) {
	id := r.PathValue("id")
	if !validID(id) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
		return
	}
	step, err := stepParam(r.PostForm.Get("step"))
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	steps, err := s.stores.Of(r.Context(), id).Resubmit(r.Context(), id, step, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	s.logger.Info("console: order resubmitted", "user", rq.user.Name, "order_id", id, "steps", steps)
	s.redirect(w, r, "/orders/"+id, "resubmitted")
}

func (s *server) confirmCancel(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	id := d.Order.OrderID
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Cancel", confirmData{
		Question: "Cancel order " + id + "?",
		Details: []string{"The order is " + d.Order.Status + ".",
			"Its unfinished actions are cancelled and those attempted are compensated, last first; it ends failed.",
			"This cannot be undone. The history records it as done by " + rq.user.Name + "."},
		Action: "/orders/" + id + "/cancel", Button: "Cancel the order", Back: "/orders/" + id, Danger: true,
	})
}

func (s *server) cancel(w http.ResponseWriter, r *http.Request, rq *request) {
	id := r.PathValue("id")
	if !validID(id) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
		return
	}
	status, err := s.stores.Of(r.Context(), id).CancelOrder(r.Context(), id, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	s.logger.Info("console: order cancelled", "user", rq.user.Name, "order_id", id, "status", status)
	s.redirect(w, r, "/orders/"+id, "cancelled")
}

// confirmPause asks before pausing (or resuming) an order.
func (s *server) confirmPause(pause bool) func(http.ResponseWriter, *http.Request, *request) {
	return func(w http.ResponseWriter, r *http.Request, rq *request) {
		if !s.mayAct(w, r, rq) {
			return
		}
		d, ok := s.readOrder(w, r, rq)
		if !ok {
			return
		}
		id := d.Order.OrderID
		c := confirmData{Back: "/orders/" + id}
		if pause {
			c.Question = "Pause order " + id + "?"
			c.Details = []string{"The order is " + d.Order.Status + ".",
				"Its steps in flight end normally, but nothing of it is claimed, its timers and deadline wait and the supervisor does not expire its steps until it is resumed.",
				"The history records it as done by " + rq.user.Name + "."}
			c.Action, c.Button = "/orders/"+id+"/pause", "Pause the order"
		} else {
			c.Question = "Resume order " + id + "?"
			c.Details = []string{"Its pending steps are claimed at once and its timers that fell due meanwhile fire; its deadline has moved on by the time it was paused.",
				"The history records it as done by " + rq.user.Name + "."}
			c.Action, c.Button = "/orders/"+id+"/resume", "Resume the order"
		}
		s.render(w, r, rq, http.StatusOK, "confirm.html", map[bool]string{true: "Pause", false: "Resume"}[pause], c)
	}
}

// pause pauses (or resumes) an order.
func (s *server) pause(pause bool) func(http.ResponseWriter, *http.Request, *request) {
	return func(w http.ResponseWriter, r *http.Request, rq *request) {
		id := r.PathValue("id")
		if !validID(id) {
			s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
			return
		}
		var err error
		done := "order-paused"
		if pause {
			_, err = s.stores.Of(r.Context(), id).PauseOrder(r.Context(), id, "paused in the console", claimedBy(rq))
		} else {
			done = "order-resumed"
			_, err = s.stores.Of(r.Context(), id).ResumeOrder(r.Context(), id, claimedBy(rq))
		}
		if err != nil {
			s.storeError(w, r, rq, err, "order "+id)
			return
		}
		s.logger.Info("console: order "+done, "user", rq.user.Name, "order_id", id)
		s.redirect(w, r, "/orders/"+id, done)
	}
}

// confirmMigrate says whether an order can move to its workflow's version
// in the console's file, and why not, before it moves.
func (s *server) confirmMigrate(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	id := d.Order.OrderID
	wf, ok := s.workflows.Lookup(d.Order.Workflow)
	if !ok || wf.Name != d.Order.Workflow {
		s.fail(w, r, rq, http.StatusNotFound, "The console's workflows file has no workflow "+d.Order.Workflow+".")
		return
	}
	v, err := s.stores.Of(r.Context(), id).MigrateOrder(r.Context(), id, wf, false, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	c := confirmData{Back: "/orders/" + id, Question: "Move order " + id + " to version " + wf.Version() + " of " + wf.Name + "?"}
	if !v.CanMove {
		c.Details = []string{"It cannot move: " + v.Why + "."}
	} else {
		c.Details = []string{fmt.Sprintf("What ran keeps its state and results; the new version adds %v and drops %v (actions not begun).", v.Added, v.Dropped),
			"The history records it as done by " + rq.user.Name + "."}
		c.Action, c.Button = "/orders/"+id+"/migrate", "Move the order"
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Move", c)
}

// migrate moves an order to its workflow's version in the console's file.
func (s *server) migrate(w http.ResponseWriter, r *http.Request, rq *request) {
	id := r.PathValue("id")
	if !validID(id) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
		return
	}
	d, err := s.stores.Of(r.Context(), id).GetOrder(r.Context(), id)
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	wf, ok := s.workflows.Lookup(d.Order.Workflow)
	if !ok || wf.Name != d.Order.Workflow {
		s.fail(w, r, rq, http.StatusNotFound, "The console's workflows file has no workflow "+d.Order.Workflow+".")
		return
	}
	v, err := s.stores.Of(r.Context(), id).MigrateOrder(r.Context(), id, wf, true, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	if !v.Moved {
		s.fail(w, r, rq, http.StatusConflict, "Order "+id+" was not moved: "+v.Why+".")
		return
	}
	s.logger.Info("console: order moved", "user", rq.user.Name, "order_id", id, "to", v.To)
	s.redirect(w, r, "/orders/"+id, "migrated")
}

func (s *server) confirmAck(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	id, ok := alertID(r)
	if !ok {
		s.fail(w, r, rq, http.StatusNotFound, "There is no alert "+orderfilter.Clip(r.PathValue("id"), 20)+".")
		return
	}
	// Alert ids are each partition's own: ?partition= names it.
	store, ok := s.stores.Named(r.URL.Query().Get("partition"))
	if !ok {
		s.fail(w, r, rq, http.StatusNotFound, "There is no partition "+orderfilter.Clip(r.URL.Query().Get("partition"), 40)+".")
		return
	}
	alerts, err := store.ListAlerts(r.Context(), statestore.AlertFilter{AfterID: id - 1, Limit: 1, Oldest: true, Namespaces: rq.namespaces()})
	if err != nil {
		s.storeError(w, r, rq, err, "alert")
		return
	}
	if len(alerts) == 0 || alerts[0].ID != id {
		s.fail(w, r, rq, http.StatusNotFound, fmt.Sprintf("There is no alert %d.", id))
		return
	}
	a := alerts[0]
	details := []string{"Order " + a.OrderID + ": " + a.Reason}
	if a.AckedAt != nil {
		details = append(details, "It was acknowledged already, by "+a.AckedBy+" ("+a.AckedAs+").")
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Acknowledge", confirmData{
		Question: fmt.Sprintf("Acknowledge alert %d?", id), Details: details,
		Action: fmt.Sprintf("/alerts/%d/ack", id) + partitionQuery(r.URL.Query().Get("partition")), Button: "Acknowledge", Back: "/alerts",
	})
}

// partitionQuery is the query naming an alert's partition ("" for none).
func partitionQuery(name string) string {
	if name == "" {
		return ""
	}
	return "?" + url.Values{"partition": {name}}.Encode()
}

func (s *server) ack(w http.ResponseWriter, r *http.Request, rq *request) {
	id, ok := alertID(r)
	if !ok {
		s.fail(w, r, rq, http.StatusNotFound, "There is no alert "+orderfilter.Clip(r.PathValue("id"), 20)+".")
		return
	}
	store, ok := s.stores.Named(r.URL.Query().Get("partition"))
	if !ok {
		s.fail(w, r, rq, http.StatusNotFound, "There is no partition "+orderfilter.Clip(r.URL.Query().Get("partition"), 40)+".")
		return
	}
	_, already, err := store.AckAlert(r.Context(), id, claimedBy(rq), rq.namespaces())
	if err != nil {
		s.storeError(w, r, rq, err, fmt.Sprintf("alert %d", id))
		return
	}
	s.logger.Info("console: alert acknowledged", "user", rq.user.Name, "alert", id, "already", already)
	back := "/alerts"
	if next := r.PostForm.Get("back"); strings.HasPrefix(next, "/orders/") && validID(strings.TrimPrefix(next, "/orders/")) {
		back = next
	}
	s.redirect(w, r, back, "acknowledged")
}

// stepOf finds the order's step numbered step, answering 404 when it has
// none.
func (s *server) stepOf(w http.ResponseWriter, r *http.Request, rq *request, d orderData, step int) (statestore.Step, bool) {
	i := slices.IndexFunc(d.OrderDetail.Steps, func(st statestore.Step) bool { return st.Step == step })
	if i < 0 {
		s.fail(w, r, rq, http.StatusNotFound, fmt.Sprintf("Order %s has no step %d.", d.Order.OrderID, step))
		return statestore.Step{}, false
	}
	return d.OrderDetail.Steps[i], true
}

// awaitingStep reads the order's step given by the step parameter, which
// must await a signal.
func (s *server) awaitingStep(w http.ResponseWriter, r *http.Request, rq *request, d orderData, v string) (statestore.Step, bool) {
	step, err := stepParam(v)
	if err != nil || step == 0 {
		s.fail(w, r, rq, http.StatusBadRequest, "Say which step: ?step=N.")
		return statestore.Step{}, false
	}
	st, ok := s.stepOf(w, r, rq, d, step)
	if !ok {
		return statestore.Step{}, false
	}
	if st.ProcessState != statestore.StepAwaiting || st.Wait == "" {
		s.fail(w, r, rq, http.StatusConflict, fmt.Sprintf("Step %d of order %s is %s: it awaits no signal.", step, d.Order.OrderID, st.ProcessState))
		return statestore.Step{}, false
	}
	return st, true
}

func (s *server) confirmRerun(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	id := d.Order.OrderID
	if d.Order.Status != statestore.OrderError {
		s.fail(w, r, rq, http.StatusConflict, "Order "+id+" is "+d.Order.Status+": only an order held in error can be re-run with a corrected payload.")
		return
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Re-run", confirmData{
		Question: "Re-run order " + id + " with a corrected payload?",
		Details: []string{"The payload is checked against workflow " + d.Order.Workflow + "'s schema as a submit's is; the one it had is kept in its history, with who replaced it.",
			"Its failed step (or the step you name, and the steps after it) runs again with the corrected payload, under a new idempotency key.",
			"The history records it as done by " + rq.user.Name + "."},
		Action: "/orders/" + id + "/rerun", Payload: "Corrected payload (JSON)", PayloadValue: pretty(d.Order.Payload), StepChoice: true,
		Button: "Re-run", Back: "/orders/" + id,
	})
}

func (s *server) rerun(w http.ResponseWriter, r *http.Request, rq *request) {
	id := r.PathValue("id")
	if !validID(id) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no order "+orderfilter.Clip(id, 40)+".")
		return
	}
	step, err := stepParam(strings.TrimSpace(r.PostForm.Get("step")))
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	payload := []byte(strings.TrimSpace(r.PostForm.Get("payload")))
	if len(payload) == 0 || payload[0] != '{' {
		s.fail(w, r, rq, http.StatusBadRequest, "The corrected payload must be a JSON object.")
		return
	}
	steps, err := intake.Rerun(r.Context(), s.store, s.workflows, id, step, payload, claimedBy(rq))
	var ref *intake.Refusal
	switch {
	case errors.As(err, &ref) && ref.Reason == intake.ReasonUnknownWorkflow:
		s.fail(w, r, rq, http.StatusConflict, ref.Detail+".")
		return
	case errors.As(err, &ref):
		s.fail(w, r, rq, http.StatusUnprocessableEntity, "The corrected payload is refused: "+ref.Detail+" ("+ref.Reason+").")
		return
	case err != nil:
		s.storeError(w, r, rq, err, "order "+id)
		return
	}
	s.logger.Info("console: order re-run with a corrected payload", "user", rq.user.Name, "order_id", id, "steps", steps)
	s.redirect(w, r, "/orders/"+id, "rerun")
}

func (s *server) confirmSignal(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	st, ok := s.awaitingStep(w, r, rq, d, r.URL.Query().Get("step"))
	if !ok {
		return
	}
	id := d.Order.OrderID
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Signal", confirmData{
		Question: fmt.Sprintf("Send the signal %s for step %d (%s) of order %s?", st.Wait, st.Step, st.Name, id),
		Details: []string{"The step ends with it, its payload the step's result, and the order goes on.",
			"The payload is JSON (any value), checked against the wait's schema if it has one; leave it empty for none.",
			"The history records it as sent by " + rq.user.Name + "."},
		Action: "/orders/" + id + "/signal", Fields: map[string]string{"step": strconv.Itoa(st.Step)},
		Button: "Send the signal", Back: "/orders/" + id, Payload: "Payload",
	})
}

// signal sends a signal for an awaiting step through the signals queue,
// as any sender does; a scheduler applies it (or refuses it: then it is
// in the signals dead-letter queue, with why).
func (s *server) signal(w http.ResponseWriter, r *http.Request, rq *request) {
	d, ok := s.readOrder(w, r, rq)
	if !ok {
		return
	}
	st, ok := s.awaitingStep(w, r, rq, d, r.PostForm.Get("step"))
	if !ok {
		return
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: messages.NewID(), OrderID: d.Order.OrderID, Name: st.Wait,
		By: "console:" + rq.user.Name}
	if v := strings.TrimSpace(r.PostForm.Get("payload")); v != "" {
		if !json.Valid([]byte(v)) {
			s.fail(w, r, rq, http.StatusBadRequest, "The payload is not JSON: write a JSON value, such as {\"by\": \"ann\"}, or leave it empty.")
			return
		}
		sig.Payload = json.RawMessage(v)
	}
	body, err := messages.Encode(sig)
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, "Not a signal: "+err.Error())
		return
	}
	// Refused here as the API and sasctl refuse it: a payload the wait's
	// schema refuses would only reach the dead letters.
	check, err := s.stores.Of(r.Context(), sig.OrderID).SignalCheckPayload(r.Context(), sig.OrderID, sig.Name, sig.Payload)
	if err != nil {
		s.storeError(w, r, rq, err, "order "+sig.OrderID)
		return
	}
	if check.Outcome != "" {
		s.fail(w, r, rq, http.StatusUnprocessableEntity, "Not sent: "+check.Detail+" ("+check.Outcome+").")
		return
	}
	conn, pub, _ := s.broker()
	if conn == nil {
		s.brokerError(w, r, rq, errNoBroker)
		return
	}
	err = pub.Publish(r.Context(), "", broker.Topology{Prefix: s.prefixOf(r.Context(), sig.OrderID)}.Queue(messages.SignalsQueue), amqp.Publishing{
		ContentType: messages.ContentType, Type: messages.TypeSignal, MessageId: sig.SignalID, Timestamp: time.Now(),
		DeliveryMode: amqp.Persistent, Body: body, Headers: amqp.Table{"schema_version": int32(messages.SignalVersion)}})
	if err != nil {
		s.brokerError(w, r, rq, err)
		return
	}
	s.logger.Info("console: signal sent", "user", rq.user.Name, "order_id", sig.OrderID, "step", st.Step, "signal", sig.Name, "signal_id", sig.SignalID)
	s.redirect(w, r, "/orders/"+sig.OrderID, "signalled")
}

// maxMovedAtOnce bounds the running orders one move of a workflow's
// orders looks at, the oldest first: the same move again goes on with
// the next ones.
const maxMovedAtOnce = 1000

// workflowMove reads the workflow the path names from the console's
// file and its running orders on other versions (the oldest
// maxMovedAtOnce), and says of each whether it moves (apply: moves it).
func (s *server) workflowMove(w http.ResponseWriter, r *http.Request, rq *request, apply bool) (workflow.Workflow, []statestore.MigrationVerdict, bool) {
	name := r.PathValue("name")
	wf, ok := s.workflows.Lookup(name)
	if !ok || wf.Name != name {
		s.fail(w, r, rq, http.StatusNotFound, "The console's workflows file has no workflow "+orderfilter.Clip(name, 64)+".")
		return workflow.Workflow{}, nil, false
	}
	ids, err := s.stores.RunningOrders(r.Context(), wf.Name, wf.Version(), maxMovedAtOnce)
	if err != nil {
		s.storeError(w, r, rq, err, "workflow "+wf.Name)
		return workflow.Workflow{}, nil, false
	}
	verdicts, err := s.stores.MigrateOrders(r.Context(), ids, wf, apply, claimedBy(rq))
	if err != nil {
		s.storeError(w, r, rq, err, "order of workflow "+wf.Name)
		return workflow.Workflow{}, nil, false
	}
	return wf, verdicts, true
}

// moveSummary says how many orders move (or can) and, by reason, how
// many stay.
func moveSummary(verdicts []statestore.MigrationVerdict, apply bool) (moving int, details []string) {
	whys := map[string]int{}
	for _, v := range verdicts {
		if v.Moved || (!apply && v.CanMove) {
			moving++
		} else {
			whys[v.Why]++
		}
	}
	for _, why := range slices.Sorted(maps.Keys(whys)) {
		details = append(details, fmt.Sprintf("%d stay: %s.", whys[why], why))
	}
	return moving, details
}

// confirmWorkflowMove is the dry run of moving a workflow's running
// orders to its version in the console's file: how many can move, and
// why the others cannot.
func (s *server) confirmWorkflowMove(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	wf, verdicts, ok := s.workflowMove(w, r, rq, false)
	if !ok {
		return
	}
	can, stay := moveSummary(verdicts, false)
	c := confirmData{Back: "/workflows", Question: fmt.Sprintf("Move %d running orders of %s to version %s?", can, wf.Name, wf.Version())}
	c.Details = append([]string{fmt.Sprintf("%d running orders run another version (the oldest %d looked at).", len(verdicts), maxMovedAtOnce)}, stay...)
	if can > 0 {
		c.Details = append(c.Details, "Each order moves in one transaction: what ran keeps its state and results; its history records the move as done by "+rq.user.Name+".")
		c.Action, c.Button, c.Count = "/workflows/"+wf.Name+"/migrate", "Move them", can
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Move", c)
}

// workflowMoveAction moves a workflow's running orders that can move to
// its version in the console's file, and says how many moved and why the
// others stayed.
func (s *server) workflowMoveAction(w http.ResponseWriter, r *http.Request, rq *request) {
	wf, verdicts, ok := s.workflowMove(w, r, rq, true)
	if !ok {
		return
	}
	moved, stay := moveSummary(verdicts, true)
	s.logger.Info("console: orders moved", "user", rq.user.Name, "workflow", wf.Name, "to", wf.Version(), "moved", moved, "stayed", len(verdicts)-moved)
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Moved", confirmData{Back: "/workflows",
		Question: fmt.Sprintf("%d orders of %s moved to version %s.", moved, wf.Name, wf.Version()), Details: stay})
}
