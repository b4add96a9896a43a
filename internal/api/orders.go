package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/statestore"
)

// maxSmallBody bounds a body that is not an order (a signal, a re-run,
// a resubmit, a bulk filter): a payload and a little more.
const maxSmallBody = messages.MaxPayloadBytes + 4<<10

// readBody reads a JSON body of at most maxBytes by the rules every
// message of sas is read by (valid UTF-8, no key twice, bounded depth and
// numbers): nil and true for an empty body when optional. It answers the
// problem itself and returns false.
func readBody(w http.ResponseWriter, r *http.Request, maxBytes int, optional bool) ([]byte, bool) {
	body, ok := readRaw(w, r, maxBytes, optional)
	if !ok || body == nil {
		return body, ok
	}
	if err := messages.CheckJSON(body, maxBytes); err != nil {
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return nil, false
	}
	return body, true
}

// readRaw reads a body of at most maxBytes sent as application/json,
// without looking into it.
func readRaw(w http.ResponseWriter, r *http.Request, maxBytes int, optional bool) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(maxBytes)))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeProblem(w, r, http.StatusRequestEntityTooLarge, probTooLarge, fmt.Sprintf("the body is more than %d bytes", maxBytes), withReason(messages.ReasonTooLarge))
		return nil, false
	case err != nil:
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "the body could not be read: "+err.Error())
		return nil, false
	case len(body) == 0 && optional:
		return nil, true
	case len(body) == 0:
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "a JSON body is required", withReason(messages.ReasonNotJSON))
		return nil, false
	}
	if err := messages.CheckContentType(r.Header.Get("Content-Type")); err != nil {
		writeProblem(w, r, http.StatusUnsupportedMediaType, probMediaType, "send the body as application/json", withReason(messages.ReasonWrongContentType))
		return nil, false
	}
	return body, true
}

// writeDecodeProblem answers a body the decoder refused: 413 when too
// large, 422 for a payload its workflow refuses, else 400; the reason is
// the decoder's.
func writeDecodeProblem(w http.ResponseWriter, r *http.Request, status int, err error) {
	reason := messages.ReasonInvalidValue
	if de, ok := messages.AsDecodeError(err); ok {
		reason = de.Reason
	}
	kind := probBadRequest
	switch reason {
	case messages.ReasonTooLarge:
		status, kind = http.StatusRequestEntityTooLarge, probTooLarge
	case messages.ReasonInvalidPayload:
		status, kind = http.StatusUnprocessableEntity, probInvalid
	}
	writeProblem(w, r, status, kind, err.Error(), withReason(reason))
}

// decodeInto reads body (checked by readBody) into dst, refusing fields
// dst does not have.
func decodeInto(w http.ResponseWriter, r *http.Request, body []byte, dst any) bool {
	if body == nil {
		return true
	}
	dec := json.NewDecoder(bytesReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "the body does not fit: "+err.Error(), withReason(messages.ReasonInvalidValue))
		return false
	}
	return true
}

// orderID reads the path's order id; a malformed one is a 400.
func orderID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id, ok := messages.CanonicalID(r.PathValue("id"))
	if !ok {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("%q is not an order id (a UUID)", orderfilter.Clip(r.PathValue("id"), 40)))
		return "", false
	}
	return id, true
}

// reaches reads the order id of the path and answers 404 unless the
// caller may see that order: one of its namespaces', and for a submitter
// token one it submitted. Every route of an order goes through it before
// its handler (route.order). The orders the caller may not see are "not
// found", as those that do not exist, so that it learns nothing of them.
func (s *server) reaches(w http.ResponseWriter, r *http.Request, c caller) bool {
	id, ok := orderID(w, r)
	if !ok {
		return false
	}
	// A caller of every namespace (in a deployment of the default
	// namespace only, every token) but a submitter sees every order: the
	// handler answers for one that does not exist, as it always did.
	ok, err := s.mayReach(r.Context(), c, id, c.may(statestore.TokenSubmitter))
	if err != nil {
		s.unavailable(w, r, err)
		return false
	}
	if !ok {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "order "+id+" does not exist, or is not this token's to see",
			withReason(statestore.SignalUnknownOrder))
	}
	return ok
}

// mayReach reports whether caller c may act on order id: true without a
// read for a caller of every namespace (unless ownOnly), else when the
// order exists in one of c's namespaces, and with ownOnly was submitted
// by c.
func (s *server) mayReach(ctx context.Context, c caller, id string, ownOnly bool) (bool, error) {
	if !ownOnly {
		all, err := s.coversAll(ctx, c)
		if err != nil || all {
			return all, err
		}
	}
	own, found, err := s.partOf(ctx, id).store.OwnerOf(ctx, id)
	if err != nil {
		return false, err
	}
	return found && c.token.In(own.Namespace) && (!ownOnly || own.SubmittedBy == c.actor()), nil
}

// visible reads the order id of the path, which reaches has let through.
func (s *server) visible(w http.ResponseWriter, r *http.Request, _ caller) (string, bool) {
	return orderID(w, r)
}

// accepted is the answer to a submit.
type accepted struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
	// Outcome is inserted (a new order) or duplicate (the same order was
	// submitted before; nothing changed).
	Outcome string `json:"outcome"`
	Href    string `json:"href"`
}

// submit takes a SubmitOrder document, as the submit queue does: 202 for
// a new order, 200 for the same order again, 409 for another one with
// its id.
func (s *server) submit(w http.ResponseWriter, r *http.Request, c caller) {
	// The decoder applies every rule itself, naming each refusal as the
	// submit queue's dead letters do.
	body, ok := readRaw(w, r, messages.MaxBodyBytes, false)
	if !ok {
		return
	}
	// The namespace first, so that every order counted is counted in one
	// the token may act in (the label's values are those namespaces).
	ns, ok := s.submitNamespace(w, r, c)
	if !ok {
		return
	}
	o, err := messages.DecodeSubmitOrder(body)
	if err != nil {
		s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return
	}
	s.acceptOrder(w, r, o, c.actor(), ns, c)
}

// submitNamespace is the namespace a submit goes to: the Sas-Namespace
// header's, or the token's first (the default one for a token of every
// namespace); one the token may not act in is refused, and so is one
// that does not exist.
func (s *server) submitNamespace(w http.ResponseWriter, r *http.Request, c caller) (string, bool) {
	ns := requestNamespace(r)
	if ns == "" {
		ns = statestore.DefaultNamespace
		if c.scoped() && len(c.token.Namespaces) > 0 {
			ns = c.token.Namespaces[0]
		}
	}
	if err := statestore.CheckNamespace(ns); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "Sas-Namespace: "+err.Error(), withReason(messages.ReasonInvalidValue))
		return "", false
	}
	if !c.token.In(ns) {
		writeProblem(w, r, http.StatusForbidden, probForbidden, fmt.Sprintf("this token may not submit to namespace %q", ns))
		return "", false
	}
	if ns == statestore.DefaultNamespace {
		return ns, true
	}
	known, err := s.namespaces.Exists(r.Context(), ns)
	if err != nil {
		s.unavailable(w, r, err)
		return "", false
	}
	if !known {
		writeProblem(w, r, http.StatusNotFound, probNotFound, fmt.Sprintf("there is no namespace %q (sasctl namespaces add)", ns))
		return "", false
	}
	return ns, true
}

// acceptOrder writes a checked order in namespace ns as a submit does
// (the same checks and idempotency as the submit queue) and answers with
// what came of it. An order id already taken in a namespace the caller
// may not see is refused without a word of that order.
func (s *server) acceptOrder(w http.ResponseWriter, r *http.Request, o messages.SubmitOrder, actor, ns string, c caller) {
	nw, err := intake.Prepare(s.workflows, o, ns, s.cfg.StepTimeout, actor)
	if err != nil {
		s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
		var rf *intake.Refusal
		if errors.As(err, &rf) {
			writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, rf.Detail, withReason(rf.Reason))
			return
		}
		s.unavailable(w, r, err)
		return
	}
	// The order's trace continues the caller's traceparent, if it sent one.
	ctx, span := s.tr.Start(s.tr.ExtractHTTP(r.Context(), r.Header), "submit "+nw.Workflow, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("sas.order_id", nw.OrderID), attribute.String("sas.workflow", nw.Workflow)))
	defer span.End()
	nw.Traceparent = s.tr.Traceparent(ctx)
	nw.Namespace = ns
	// Written in the partition owning the id, as the submit queue's
	// routing exchange would send it; an order written before is read
	// where it is.
	p := s.partOf(r.Context(), nw.OrderID)
	quotas, err := s.namespaces.Quotas(ctx, ns)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	var outcome statestore.InsertOutcome
	if quotas {
		if empty, wait := s.rateEmpty(ns); empty {
			// Its bucket is empty until then: a new order is refused
			// as the admission would; one that exists is answered as
			// always (a duplicate takes nothing of the quotas).
			_, found, err := p.store.OwnerOf(ctx, nw.OrderID)
			if err != nil {
				s.unavailable(w, r, err)
				return
			}
			if !found {
				s.quotaRefused(w, r, ns, &statestore.QuotaRefusal{Quota: statestore.QuotaSubmitRate, RetryAfter: wait,
					Detail: fmt.Sprintf("namespace %s's submit rate quota has room for no other order for %v", ns, wait.Round(time.Millisecond))})
				return
			}
		}
	}
	var refused *statestore.QuotaRefusal
	outcome, refused, err = s.insert(ctx, nw, quotas)
	if err == nil && refused != nil {
		if refused.Quota == statestore.QuotaSubmitRate {
			s.noteRateEmpty(ns, refused.RetryAfter)
		}
		s.quotaRefused(w, r, ns, refused)
		return
	}
	if err == nil && outcome == statestore.Duplicate || errors.Is(err, statestore.ErrConflict) {
		p = s.partOf(r.Context(), nw.OrderID) // where the first write is
	}
	if c.scoped() && (err == nil && outcome == statestore.Duplicate || errors.Is(err, statestore.ErrConflict)) {
		own, found, oerr := p.store.OwnerOf(r.Context(), nw.OrderID)
		if oerr != nil {
			s.unavailable(w, r, oerr)
			return
		}
		if found && !c.token.In(own.Namespace) {
			s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
			writeProblem(w, r, http.StatusConflict, probConflict, fmt.Sprintf("order_id %s cannot be used: choose another", nw.OrderID),
				withReason(intake.ReasonConflict))
			return
		}
	}
	switch {
	case errors.Is(err, statestore.ErrConflict):
		s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
		writeProblem(w, r, http.StatusConflict, probConflict, fmt.Sprintf("order_id %s was already submitted with other content", nw.OrderID),
			withReason(intake.ReasonConflict))
		return
	case errors.Is(err, statestore.ErrInvalidData):
		s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, err.Error(), withReason(messages.ReasonInvalidValue))
		return
	case err != nil:
		s.unavailable(w, r, err)
		return
	}
	s.metrics.orders.WithLabelValues(ns, outcome.String()).Inc()
	href := prefix + "/orders/" + nw.OrderID
	w.Header().Set("Location", href)
	if outcome == statestore.Duplicate {
		status, _, err := p.store.StatusEventOf(r.Context(), nw.OrderID)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, accepted{OrderID: nw.OrderID, Status: status, Outcome: outcome.String(), Href: href})
		return
	}
	writeJSON(w, http.StatusAccepted, accepted{OrderID: nw.OrderID, Status: messages.StatusReceived, Outcome: outcome.String(), Href: href})
}

// quotaRefused answers a submit its namespace's quota refused: 413 for a
// payload past the namespace's size, else 429 with Retry-After.
func (s *server) quotaRefused(w http.ResponseWriter, r *http.Request, ns string, q *statestore.QuotaRefusal) {
	s.metrics.orders.WithLabelValues(ns, "rejected").Inc()
	s.metrics.quotaRefusals.WithLabelValues(ns, q.Quota).Inc()
	reason := "quota_" + q.Quota
	if q.Quota == statestore.QuotaPayloadBytes {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, probQuota, q.Detail, withReason(reason))
		return
	}
	writeProblem(w, r, http.StatusTooManyRequests, probQuota, q.Detail, withReason(reason), retryAfter(q.RetryAfter))
}

// orderView is an order as GET /orders/{id} shows it.
type orderView struct {
	statestore.OrderDetail
	Attributes map[string]any             `json:"attributes,omitempty"`
	Payloads   []statestore.PayloadChange `json:"payload_history,omitempty"`
	Results    json.RawMessage            `json:"results,omitempty"`
	Event      json.RawMessage            `json:"status_event,omitempty"`
}

func (s *server) get(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := s.visible(w, r, c)
	if !ok {
		return
	}
	ctx := r.Context()
	st := s.partOf(r.Context(), id).store
	d, err := st.GetOrder(ctx, id)
	if s.readFailed(w, r, err, "order "+id) {
		return
	}
	v := orderView{OrderDetail: d}
	attrs, err := st.Attributes(ctx, id)
	if err == nil {
		v.Payloads, err = st.PayloadHistory(ctx, id)
	}
	if err == nil {
		_, v.Event, err = st.StatusEventOf(ctx, id)
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if len(attrs) > 0 {
		v.Attributes = map[string]any{}
		for _, a := range attrs {
			v.Attributes[a.Name] = a.Value()
		}
	}
	var ev struct {
		Results json.RawMessage `json:"results"`
	}
	if json.Unmarshal(v.Event, &ev) == nil {
		v.Results = ev.Results
	}
	writeJSON(w, http.StatusOK, v)
}

// orderList is a page of orders.
type orderList struct {
	Orders []statestore.OrderRow `json:"orders"`
	// Next is the cursor of the next page (after=...); absent on the last.
	Next string `json:"next,omitempty"`
}

func (s *server) list(w http.ResponseWriter, r *http.Request, c caller) {
	qv := r.URL.Query()
	f := orderfilter.FromValues(qv)
	f.Namespaces = c.namespaces()
	q, err := f.Query(s.workflows)
	var problems orderfilter.Problems
	errors.As(err, &problems)
	q.Limit = 50
	if l := qv.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			problems = append(problems, fmt.Sprintf("limit %q is not a number from 1 to 500", orderfilter.Clip(l, 20)))
		}
		q.Limit = n
	}
	if q.After, err = orderfilter.DecodeCursor(qv.Get("after")); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, problems.Error(), withErrors(problems))
		return
	}
	rows, next, err := s.stores.OrderPage(r.Context(), q)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if rows == nil {
		rows = []statestore.OrderRow{}
	}
	writeJSON(w, http.StatusOK, orderList{Orders: rows, Next: orderfilter.EncodeCursor(next)})
}

// ended reports whether a status is one an awaiting client waits for:
// completed, failed, or held in error for an operator.
func ended(status string) bool {
	return status == messages.StatusCompleted || status == messages.StatusFailed || status == messages.StatusError
}

// awaitTimeout reads ?timeout= (a Go duration, or seconds), 30s by
// default, at most max.
func awaitTimeout(v string, max time.Duration) (time.Duration, error) {
	if v == "" {
		return min(30*time.Second, max), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		secs, err2 := strconv.ParseFloat(v, 64)
		if err2 != nil || secs != secs {
			return 0, fmt.Errorf("timeout %q is not a duration such as 30s", orderfilter.Clip(v, 20))
		}
		if secs < 0 || secs > max.Seconds() {
			return 0, fmt.Errorf("timeout %q is not between 0 and %s (SAS_API_AWAIT_MAX)", orderfilter.Clip(v, 20), max)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 || d > max {
		return 0, fmt.Errorf("timeout %s is not between 0 and %s (SAS_API_AWAIT_MAX)", d, max)
	}
	return d, nil
}

// await answers the order's status event once it ends (completed,
// failed, or held in error), or its current one when the timeout passes
// first (ended false in the Sas-Ended header: ask again).
func (s *server) await(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := s.visible(w, r, c)
	if !ok {
		return
	}
	timeout, err := awaitTimeout(r.URL.Query().Get("timeout"), s.cfg.AwaitMax)
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, err.Error())
		return
	}
	p := s.partOf(r.Context(), id)
	f, stop, ready := p.hub.follow(id, false)
	defer stop()
	if err := await(r.Context(), ready, followBindWait); err != nil {
		s.unavailable(w, r, err)
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		status, body, err := p.store.StatusEventOf(r.Context(), id)
		if s.readFailed(w, r, err, "order "+id) {
			return
		}
		if ended(status) {
			writeEvent(w, body, true)
			return
		}
	wait:
		for {
			select {
			case ev := <-f.events:
				if ended(ev.Status) {
					b, err := messages.Encode(ev)
					if err == nil {
						writeEvent(w, b, true)
						return
					}
					break wait
				}
			case <-f.lost:
				break wait // read the store again
			case <-deadline.C:
				_, body, err := p.store.StatusEventOf(r.Context(), id)
				if err != nil {
					s.unavailable(w, r, err)
					return
				}
				writeEvent(w, body, false)
				return
			case <-r.Context().Done():
				return
			}
		}
	}
}

func writeEvent(w http.ResponseWriter, body []byte, ended bool) {
	w.Header().Set("Sas-Ended", strconv.FormatBool(ended))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// followBindWait is how long a request that follows an order waits for
// the status queue to be bound (at once when it is; a round trip to the
// broker for the first follower after a quiet while).
const followBindWait = 10 * time.Second

// sseKeepAlive is how often a quiet event stream sends a comment, so
// that proxies keep it open.
const sseKeepAlive = 15 * time.Second

// events streams the order's status events (Server-Sent Events, event
// type "status", data a StatusEvent): its current one first, then each
// as it comes, until the order ends or is held in error. With
// steps=true, its steps' events too (event type "step", data a
// StepEvent): first one for each step claimed or awaiting when the
// stream began, then each move as it comes.
func (s *server) events(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := s.visible(w, r, c)
	if !ok {
		return
	}
	var steps bool
	switch v := r.URL.Query().Get("steps"); v {
	case "", "false":
	case "true":
		steps = true
	default:
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("steps=%q: write true or false", orderfilter.Clip(v, 20)))
		return
	}
	fl, canFlush := w.(http.Flusher)
	if !canFlush {
		writeProblem(w, r, http.StatusInternalServerError, probInternal, "this server cannot stream")
		return
	}
	p := s.partOf(r.Context(), id)
	f, stop, ready := p.hub.follow(id, steps)
	defer stop()
	if err := await(r.Context(), ready, followBindWait); err != nil {
		s.unavailable(w, r, err)
		return
	}
	status, body, err := p.store.StatusEventOf(r.Context(), id)
	if s.readFailed(w, r, err, "order "+id) {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	n := 0
	sendAs := func(kind string, body []byte) {
		n++
		fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", n, kind, body)
		fl.Flush()
	}
	send := func(body []byte) { sendAs("status", body) }
	send(body)
	last := status
	if steps {
		// Where each step is now, so that a follower who came after a
		// wait began still hears of it; later moves come as they happen
		// (one may come twice).
		d, err := p.store.GetOrder(r.Context(), id)
		if err != nil {
			return
		}
		for _, ev := range stepsNow(d) {
			if b, err := messages.Encode(ev); err == nil {
				sendAs("step", b)
			}
		}
	}
	keep := time.NewTicker(sseKeepAlive)
	defer keep.Stop()
	for !ended(last) {
		select {
		case ev := <-f.events:
			b, err := messages.Encode(ev)
			if err != nil {
				continue
			}
			send(b)
			last = ev.Status
		case <-f.lost:
			st, b, err := p.store.StatusEventOf(r.Context(), id)
			if err != nil {
				return
			}
			if st != last {
				send(b)
				last = st
			}
		case ev := <-f.steps:
			if b, err := messages.Encode(ev); err == nil {
				sendAs("step", b)
			}
		case <-keep.C:
			fmt.Fprint(w, ": keep-alive\n\n")
			fl.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// signalSent is the answer to a signal: taken to be applied.
type signalSent struct {
	SignalID string `json:"signal_id"`
	OrderID  string `json:"order_id"`
	Name     string `json:"name"`
}

// signal sends a signal to the order's wait (its body, if any, the
// signal's payload): refused at once, with the reason, when no step of
// the order could take it; else sent to the signals queue as any signal
// (202), applied once by its id (Idempotency-Key, or a new one).
func (s *server) signal(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := s.visible(w, r, c)
	if !ok {
		return
	}
	name := r.PathValue("name")
	if err := messages.CheckName("name", name); err != nil {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, err.Error(), withReason(messages.ReasonInvalidValue))
		return
	}
	payload, ok := readBody(w, r, maxSmallBody, true)
	if !ok {
		return
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: messages.NewID(), OrderID: id, Name: name, By: c.actor(),
		Payload: payload}
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		sig.SignalID = k
	}
	if err := sig.Validate(); err != nil {
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return
	}
	out, err := s.partOf(r.Context(), id).store.SignalCheckPayload(r.Context(), id, name, payload)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if out.Outcome != "" {
		status, kind := http.StatusConflict, probConflict
		switch out.Outcome {
		case statestore.SignalUnknownOrder:
			status, kind = http.StatusNotFound, probNotFound
		case statestore.SignalInvalidPayload:
			status, kind = http.StatusUnprocessableEntity, probInvalid
		}
		writeProblem(w, r, status, kind, out.Detail, withReason(out.Outcome))
		return
	}
	if !s.publishSignal(w, r, sig) {
		return
	}
	writeJSON(w, http.StatusAccepted, signalSent{SignalID: sig.SignalID, OrderID: id, Name: name})
}

// publishSignal publishes a checked signal to the signals queue; it
// answers the request itself when it cannot.
func (s *server) publishSignal(w http.ResponseWriter, r *http.Request, sig messages.Signal) bool {
	body, err := messages.Encode(sig)
	if err != nil {
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return false
	}
	// To the schedulers of the order's partition.
	err = s.pub.Publish(r.Context(), "", s.partOf(r.Context(), sig.OrderID).topo.Queue(messages.SignalsQueue), amqp.Publishing{
		ContentType: messages.ContentType, Type: messages.TypeSignal, MessageId: sig.SignalID, Timestamp: time.Now(),
		DeliveryMode: amqp.Persistent, Body: body, Headers: amqp.Table{"schema_version": int32(messages.SignalVersion)}})
	if err != nil {
		s.unavailable(w, r, err)
		return false
	}
	return true
}

// operatorRefusal answers the store's refusal of an operator's action.
func (s *server) operatorRefusal(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, statestore.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, probNotFound, err.Error())
	case errors.Is(err, statestore.ErrInvalidState):
		writeProblem(w, r, http.StatusConflict, probConflict, err.Error())
	case errors.Is(err, statestore.ErrInvalidData):
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, err.Error())
	default:
		s.unavailable(w, r, err)
	}
}

// readFailed answers a read that failed: 404 naming what when it is not
// there, else 503. It reports whether err was a failure.
func (s *server) readFailed(w http.ResponseWriter, r *http.Request, err error, what string) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, statestore.ErrNotFound):
		writeProblem(w, r, http.StatusNotFound, probNotFound, what+" does not exist")
	default:
		s.unavailable(w, r, err)
	}
	return true
}

// stepBody is the body of a resubmit: the step to run again (none: the
// failed step).
type stepBody struct {
	Step int `json:"step"`
}

type acted struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status,omitempty"`
	Steps   []int  `json:"steps,omitempty"`
}

// stepAction reads an operator action on an order: its id, and its
// JSON body into b (empty allowed when emptyOK), whose step must be 0
// (none) or a step number.
func stepAction(w http.ResponseWriter, r *http.Request, emptyOK bool, b interface{ step() int }) (string, bool) {
	id, ok := orderID(w, r)
	if !ok {
		return "", false
	}
	body, ok := readBody(w, r, maxSmallBody, emptyOK)
	if !ok || !decodeInto(w, r, body, b) {
		return "", false
	}
	if n := b.step(); n < 0 || n > messages.MaxStep {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("step %d is not between 1 and %d", n, messages.MaxStep))
		return "", false
	}
	return id, true
}

func (b *stepBody) step() int  { return b.Step }
func (b *rerunBody) step() int { return b.Step }

func (s *server) resubmit(w http.ResponseWriter, r *http.Request, c caller) {
	var b stepBody
	id, ok := stepAction(w, r, true, &b)
	if !ok {
		return
	}
	steps, err := s.partOf(r.Context(), id).store.Resubmit(r.Context(), id, b.Step, c.actor())
	if err != nil {
		s.operatorRefusal(w, r, err)
		return
	}
	s.logger.Info("api: resubmitted", "token", c.token.Name, "order_id", id, "steps", steps)
	writeJSON(w, http.StatusOK, acted{OrderID: id, Status: messages.StatusProcessing, Steps: steps})
}

func (s *server) cancel(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	if _, ok := readBody(w, r, maxSmallBody, true); !ok {
		return
	}
	status, err := s.partOf(r.Context(), id).store.CancelOrder(r.Context(), id, c.actor())
	if err != nil {
		s.operatorRefusal(w, r, err)
		return
	}
	s.logger.Info("api: cancelled", "token", c.token.Name, "order_id", id, "status", status)
	writeJSON(w, http.StatusOK, acted{OrderID: id, Status: status})
}

// rerunBody is the body of a re-run: the corrected payload, and the step
// to run again from (none: the failed step).
type rerunBody struct {
	Payload json.RawMessage `json:"payload"`
	Step    int             `json:"step"`
}

// rerun re-runs an order held in error with a corrected payload, checked
// against its workflow's schema; the payload it had stays in its history.
func (s *server) rerun(w http.ResponseWriter, r *http.Request, c caller) {
	var b rerunBody
	id, ok := stepAction(w, r, false, &b)
	if !ok {
		return
	}
	if len(b.Payload) == 0 || b.Payload[0] != '{' {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "payload must be the corrected payload, a JSON object", withReason(messages.ReasonMissingField))
		return
	}
	steps, err := intake.Rerun(r.Context(), s.partOf(r.Context(), id).store, s.workflows, id, b.Step, b.Payload, c.actor())
	var ref *intake.Refusal
	if errors.As(err, &ref) {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, ref.Detail, withReason(ref.Reason))
		return
	}
	if err != nil {
		s.operatorRefusal(w, r, err)
		return
	}
	s.logger.Info("api: re-run with a corrected payload", "token", c.token.Name, "order_id", id, "steps", steps)
	writeJSON(w, http.StatusOK, acted{OrderID: id, Status: messages.StatusProcessing, Steps: steps})
}

// stepsNow are the step events that say where an order's running steps
// are: claimed (an attempt runs) or awaiting (a signal, or a child
// order), as of their last move.
func stepsNow(d statestore.OrderDetail) []messages.StepEvent {
	var out []messages.StepEvent
	for _, st := range d.Steps {
		var event string
		switch st.ProcessState {
		case statestore.StepProcessing:
			event = messages.StepClaimed
		case statestore.StepAwaiting:
			event = messages.StepAwaiting
		default:
			continue
		}
		kind := "action"
		if st.Kind == statestore.KindCompensation {
			kind = "compensation"
		}
		out = append(out, messages.StepEvent{SchemaVersion: messages.SchemaVersion, OrderID: d.Order.OrderID, Step: st.Step,
			Name: cmp.Or(st.ID, st.Name), Kind: kind, Event: event, State: st.ProcessState, Attempt: st.Attempt, Wait: st.Wait,
			At: st.UpdatedAt, Reason: "where the step was when the stream began"})
	}
	return out
}

// movingWait is how long a write waits, at most, for a bucket moving to
// its partition (statestore.ErrMoving): a move holds its bucket's
// submits for the time it takes to copy the ids written since it began.
const movingWait = 15 * time.Second

// insert writes a new order in the partition owning its bucket: alone
// within its namespace's quotas (in one transaction with the admission:
// never past them, whichever replica writes), else batched with others.
// A bucket moved away is written where the store says it went; one
// moving here waits for its move (movingWait at most).
func (s *server) insert(ctx context.Context, nw statestore.NewOrder, quotas bool) (statestore.InsertOutcome, *statestore.QuotaRefusal, error) {
	i, _ := s.stores.Owner(ctx, nw.OrderID)
	deadline := time.Now().Add(movingWait)
	for hops := 0; ; {
		p := s.parts[i]
		var outcome statestore.InsertOutcome
		var refused *statestore.QuotaRefusal
		var err error
		if quotas {
			outcome, refused, err = p.store.InsertOrderWithinQuota(ctx, nw)
		} else {
			outcome, err = p.inserts.Do(ctx, nw)
		}
		var away *statestore.ElsewhereError
		switch {
		case errors.As(err, &away) && hops < len(s.parts):
			hops++
			_ = s.stores.Follow(ctx)
			if i = s.stores.Layout.Index(away.Owner); i < 0 {
				return 0, nil, fmt.Errorf("order %s: its bucket is partition %s's, which this API's layout lacks", nw.OrderID, away.Owner)
			}
		case errors.Is(err, statestore.ErrMoving) && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return 0, nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		default:
			return outcome, refused, err
		}
	}
}
