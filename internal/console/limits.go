package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// limitsData is the limits page's: each kind's limits, and the
// namespaces' own limits on kinds.
type limitsData struct {
	Kinds  []kindLimits
	Scoped []scopedLimits
	// Partitioned: each row lists every partition's share.
	Partitioned bool
}

// limitsPage shows each agent kind's limits and their use, then the
// namespaces' own.
func (s *server) limitsPage(w http.ResponseWriter, r *http.Request, rq *request) {
	rows, err := s.listLimits(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "limits")
		return
	}
	scoped, err := s.listScoped(r.Context(), "")
	if err != nil {
		s.storeError(w, r, rq, err, "limits")
		return
	}
	s.render(w, r, rq, http.StatusOK, "limits.html", "Limits", limitsData{rows, scoped, s.stores.Layout != nil})
}

// scopedOf reads the kind the path names and the namespace the query or
// form names ("" when none), and that namespace's limits on the kind
// (nil when it has none); a kind or namespace out of their rules is 400.
func (s *server) scopedOf(w http.ResponseWriter, r *http.Request, rq *request) (kind, ns string, now *statestore.NamespaceLimits, ok bool) {
	kind = r.PathValue("kind")
	ns = strings.TrimSpace(r.FormValue("for_namespace"))
	if err := workflow.CheckKind(kind); err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return "", "", nil, false
	}
	if ns == "" {
		return kind, "", nil, true
	}
	if err := statestore.CheckNamespace(ns); err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, "namespace: "+err.Error())
		return "", "", nil, false
	}
	rows, err := s.listScoped(r.Context(), ns)
	if err != nil {
		s.storeError(w, r, rq, err, "limits")
		return "", "", nil, false
	}
	for i := range rows {
		if rows[i].Agent == kind {
			return kind, ns, &rows[i].NamespaceLimits, true
		}
	}
	return kind, ns, nil, true
}

// confirmScoped asks for a namespace's own limits on a kind: the
// namespace's now when the query names one that has them.
func (s *server) confirmScoped(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	kind, ns, now, ok := s.scopedOf(w, r, rq)
	if !ok {
		return
	}
	var l statestore.Limits
	details := []string{"A namespace's own limits hold its steps of the kind within the kind's: the other namespaces' steps are claimed beside them. The default namespace has none of its own. Empty: no such limit."}
	if now != nil {
		l = now.Limits
		details = append([]string{"Now: " + l.String() + ", " + scopedFrom(*now) + "."}, details...)
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Limits of "+kind+" in a namespace", confirmData{
		Question: "Set a namespace's own limits on agent " + kind + "?",
		Details:  details,
		Inputs: []confirmInput{
			{Name: "for_namespace", Label: "Namespace", Value: ns},
			{Name: "rate", Label: "Rate (e.g. 50/s, 600/m)", Value: rateText(l.Rate)},
			{Name: "burst", Label: "Burst (claims at once above the rate)", Value: countText(l.Burst)},
			{Name: "max_in_flight", Label: "Max in flight", Value: countText(l.MaxInFlight)},
		},
		Action: "/limits/" + kind + "/namespace", Button: "Set", Back: "/limits",
	})
}

func (s *server) setScoped(w http.ResponseWriter, r *http.Request, rq *request) {
	kind, ns, _, ok := s.scopedOf(w, r, rq)
	if !ok {
		return
	}
	if ns == "" {
		s.fail(w, r, rq, http.StatusBadRequest, "Name the namespace whose limits these are.")
		return
	}
	c, err := limitChange(r)
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	c.ClearMinRate = false // a namespace has none
	if err := s.eachShare(r.Context(), c, func(st *statestore.Store, share statestore.LimitChange) error {
		_, err := st.SetNamespaceLimits(r.Context(), ns, kind, share, claimedBy(rq))
		return err
	}); err != nil {
		s.storeError(w, r, rq, err, "limits of "+kind+" in namespace "+ns)
		return
	}
	s.logger.Info("console: namespace limits set", "user", rq.user.Name, "kind", kind, "namespace", ns, "change", c.String())
	s.redirect(w, r, "/limits", "limits changed")
}

func (s *server) confirmScopedReset(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	kind, ns, now, ok := s.scopedOf(w, r, rq)
	if !ok {
		return
	}
	if now == nil || now.SetBy == "" {
		s.fail(w, r, rq, http.StatusNotFound, "Namespace "+ns+" has no limits an operator set on agent "+kind+".")
		return
	}
	then := "The kind's limits alone then hold its steps."
	if now.File.Any() {
		then = "The workflows file's then hold its steps: " + now.File.String() + "."
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Limits of "+kind+" in "+ns, confirmData{
		Question: "Remove the limits an operator set on namespace " + ns + "'s steps of agent " + kind + "?",
		Details:  []string{"Now: " + now.Limits.String() + ", " + scopedFrom(*now) + ".", then},
		Fields:   map[string]string{"for_namespace": ns},
		Action:   "/limits/" + kind + "/namespace/reset", Button: "Remove", Back: "/limits", Danger: true,
	})
}

func (s *server) resetScoped(w http.ResponseWriter, r *http.Request, rq *request) {
	kind, ns, _, ok := s.scopedOf(w, r, rq)
	if !ok {
		return
	}
	err := s.stores.Each(r.Context(), func(ctx context.Context, _ int, st *statestore.Store) error {
		return st.ResetNamespaceLimits(ctx, ns, kind, claimedBy(rq))
	})
	if errors.Is(err, statestore.ErrNoLimits) {
		s.fail(w, r, rq, http.StatusNotFound, "Namespace "+ns+" has no limits an operator set on agent "+kind+".")
		return
	}
	if err != nil {
		s.storeError(w, r, rq, err, "limits of "+kind+" in namespace "+ns)
		return
	}
	s.logger.Info("console: namespace limits reset", "user", rq.user.Name, "kind", kind, "namespace", ns)
	s.redirect(w, r, "/limits", "limits reset")
}

// limitsOf reads the kind the path names, answering 404 for one the
// store has no row for.
func (s *server) limitsOf(w http.ResponseWriter, r *http.Request, rq *request) (statestore.KindLimits, bool) {
	kind := r.PathValue("kind")
	rows, err := s.listLimits(r.Context())
	if err != nil {
		s.storeError(w, r, rq, err, "limits")
		return statestore.KindLimits{}, false
	}
	for _, row := range rows {
		if row.Agent == kind {
			return row.KindLimits, true
		}
	}
	s.fail(w, r, rq, http.StatusNotFound, "There is no agent kind "+orderfilter.Clip(kind, 100)+" with limits.")
	return statestore.KindLimits{}, false
}

func (s *server) confirmLimits(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	k, ok := s.limitsOf(w, r, rq)
	if !ok {
		return
	}
	e := k.Effective
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Limits of "+k.Agent, confirmData{
		Question: "Change the limits of agent " + k.Agent + "?",
		Details: []string{"Now: " + e.String() + ", " + from(k) + ".",
			"Every scheduler's next claim of the kind obeys the new limits, on every replica, until they are changed again or reset to the file's. Empty: no such limit."},
		Inputs: []confirmInput{
			{Name: "rate", Label: "Rate (e.g. 50/s, 600/m)", Value: rateText(e.Rate)},
			{Name: "burst", Label: "Burst (claims at once above the rate)", Value: countText(e.Burst)},
			{Name: "max_in_flight", Label: "Max in flight", Value: countText(e.MaxInFlight)},
			{Name: "min_rate", Label: "Min rate (the floor a service's 429 lowers it to)", Value: rateText(e.MinRate)},
		},
		Action: "/limits/" + k.Agent + "/set", Button: "Change", Back: "/limits",
	})
}

func (s *server) confirmLimitsReset(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	k, ok := s.limitsOf(w, r, rq)
	if !ok {
		return
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", "Limits of "+k.Agent, confirmData{
		Question: "Put agent " + k.Agent + " back under the workflows file's limits?",
		Details:  []string{"Now: " + k.Effective.String() + ", " + from(k) + ".", "The file's: " + k.File.String() + "."},
		Action:   "/limits/" + k.Agent + "/reset", Button: "Reset", Back: "/limits", Danger: true,
	})
}

func (s *server) setLimits(w http.ResponseWriter, r *http.Request, rq *request) {
	k, ok := s.limitsOf(w, r, rq)
	if !ok {
		return
	}
	c, err := limitChange(r)
	if err != nil {
		s.fail(w, r, rq, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.eachShare(r.Context(), c, func(st *statestore.Store, share statestore.LimitChange) error {
		_, err := st.SetLimits(r.Context(), k.Agent, share, claimedBy(rq))
		return err
	}); err != nil {
		s.storeError(w, r, rq, err, "limits of "+k.Agent)
		return
	}
	s.logger.Info("console: limits set", "user", rq.user.Name, "kind", k.Agent, "change", c.String())
	s.redirect(w, r, "/limits", "limits changed")
}

func (s *server) resetLimits(w http.ResponseWriter, r *http.Request, rq *request) {
	k, ok := s.limitsOf(w, r, rq)
	if !ok {
		return
	}
	err := s.stores.Each(r.Context(), func(ctx context.Context, _ int, st *statestore.Store) error {
		_, err := st.ResetLimits(ctx, k.Agent, claimedBy(rq))
		return err
	})
	if errors.Is(err, statestore.ErrNoLimits) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no agent kind "+orderfilter.Clip(k.Agent, 100)+" with limits.")
		return
	}
	if err != nil {
		s.storeError(w, r, rq, err, "limits of "+k.Agent)
		return
	}
	s.logger.Info("console: limits reset", "user", rq.user.Name, "kind", k.Agent)
	s.redirect(w, r, "/limits", "limits reset")
}

// limitChange reads the form: each field replaces its limit, an empty
// one removes it.
func limitChange(r *http.Request) (statestore.LimitChange, error) {
	var c statestore.LimitChange
	rate := func(name string, dst **float64, clear *bool) error {
		v := strings.TrimSpace(r.PostFormValue(name))
		if v == "" {
			*clear = true
			return nil
		}
		x, err := workflow.ParseRate(v)
		if err != nil {
			return fmt.Errorf("%s: %v", strings.ReplaceAll(name, "_", " "), err)
		}
		*dst = &x
		return nil
	}
	count := func(name string, dst **int, clear *bool) error {
		v := strings.TrimSpace(r.PostFormValue(name))
		if v == "" {
			*clear = true
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > workflow.MaxInFlightLimit {
			return fmt.Errorf("%s %q: a whole number from 1 to %d, or empty for none", strings.ReplaceAll(name, "_", " "), orderfilter.Clip(v, 20), workflow.MaxInFlightLimit)
		}
		*dst = &n
		return nil
	}
	// What the limits may be together is the rule's to say (the state
	// store's SetLimits holds every change to it): the form only reads.
	return c, errors.Join(rate("rate", &c.Rate, &c.ClearRate), rate("min_rate", &c.MinRate, &c.ClearMinRate),
		count("burst", &c.Burst, &c.ClearBurst), count("max_in_flight", &c.MaxInFlight, &c.ClearMaxInFlight))
}

func scopedFrom(n statestore.NamespaceLimits) string {
	if n.SetBy == "" {
		return "from the workflows file"
	}
	return "set by " + n.SetBy
}

func from(k statestore.KindLimits) string {
	if k.SetBy == "" {
		return "from the workflows file"
	}
	return "set by " + k.SetBy
}

func rateText(r *float64) string {
	if r == nil {
		return ""
	}
	return strconv.FormatFloat(*r, 'g', -1, 64) + "/s"
}

func countText(n *int) string {
	if n == nil {
		return ""
	}
	return strconv.Itoa(*n)
}
