package api

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"

	"sas/internal/archive"

	"sas/internal/statestore"
)

// pauseBody is the body of a pause: why, for whoever reads it.
type pauseBody struct {
	Reason string `json:"reason"`
}

// paused is the answer to a pause or a resume.
type paused struct {
	// Target is the order id, workflow or agent kind.
	Target string `json:"target"`
	Scope  string `json:"scope"`
	// Outcome is paused, already, resumed or not_paused.
	Outcome string `json:"outcome"`
	// Orders is, for a workflow, how many orders it paused or resumed.
	Orders *int `json:"orders,omitempty"`
}

// maxReason bounds a pause's reason (the store keeps 500 characters).
const maxReason = 500

// pauseReason reads a pause's optional body.
func pauseReason(w http.ResponseWriter, r *http.Request) (string, bool) {
	body, ok := readBody(w, r, maxSmallBody, true)
	if !ok {
		return "", false
	}
	var b pauseBody
	if len(body) > 0 && !decodeInto(w, r, body, &b) {
		return "", false
	}
	if len([]rune(b.Reason)) > maxReason {
		writeProblem(w, r, http.StatusBadRequest, probBadRequest, "reason is longer than 500 characters")
		return "", false
	}
	return b.Reason, true
}

// pauseOrder pauses (or resumes) one order.
func (s *server) pauseOrder(pause bool) handler {
	return func(w http.ResponseWriter, r *http.Request, c caller) {
		id, ok := orderID(w, r)
		if !ok {
			return
		}
		reason, ok := pauseReason(w, r)
		if !ok {
			return
		}
		var outcome string
		var err error
		if pause {
			outcome, err = s.partOf(r.Context(), id).store.PauseOrder(r.Context(), id, reason, c.actor())
		} else {
			outcome, err = s.partOf(r.Context(), id).store.ResumeOrder(r.Context(), id, c.actor())
		}
		if err != nil {
			s.operatorRefusal(w, r, err)
			return
		}
		s.logger.Info("api: "+outcome, "token", c.token.Name, "order_id", id)
		writeJSON(w, http.StatusOK, paused{Target: id, Scope: "order", Outcome: outcome})
	}
}

// pauseWorkflow pauses (or resumes) a workflow and its orders.
func (s *server) pauseWorkflow(pause bool) handler {
	return func(w http.ResponseWriter, r *http.Request, c caller) {
		name := r.PathValue("id")
		reason, ok := pauseReason(w, r)
		if !ok {
			return
		}
		// In every partition: the orders of each, and those written
		// there while it is paused.
		var n int
		var err error
		outcome := statestore.Paused
		if pause {
			n, err = s.stores.PauseWorkflow(r.Context(), name, reason, c.actor())
		} else {
			outcome = statestore.Resumed
			n, err = s.stores.ResumeWorkflow(r.Context(), name, c.actor())
		}
		if err != nil {
			s.operatorRefusal(w, r, err)
			return
		}
		s.logger.Info("api: workflow "+outcome, "token", c.token.Name, "workflow", name, "orders", n)
		writeJSON(w, http.StatusOK, paused{Target: name, Scope: "workflow", Outcome: outcome, Orders: &n})
	}
}

// pauseKind pauses (or resumes) an agent kind.
func (s *server) pauseKind(pause bool) handler {
	return func(w http.ResponseWriter, r *http.Request, c caller) {
		kind := r.PathValue("id")
		reason, ok := pauseReason(w, r)
		if !ok {
			return
		}
		var outcome string
		var err error
		if pause {
			outcome, err = s.stores.PauseKind(r.Context(), kind, reason, c.actor())
		} else {
			outcome, err = s.stores.ResumeKind(r.Context(), kind, c.actor())
		}
		if err != nil {
			s.operatorRefusal(w, r, err)
			return
		}
		s.logger.Info("api: kind "+outcome, "token", c.token.Name, "kind", kind)
		writeJSON(w, http.StatusOK, paused{Target: kind, Scope: "kind", Outcome: outcome})
	}
}

// pauses lists what is paused.
func (s *server) pauses(w http.ResponseWriter, r *http.Request, c caller) {
	ps, err := s.stores.PausesIn(r.Context(), 500, c.namespaces())
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if ps == nil {
		ps = []statestore.Pause{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"pauses": ps})
}

// archived reads an order's record from the archive: an order retention
// deleted.
func (s *server) archived(w http.ResponseWriter, r *http.Request, c caller) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	if s.archive == nil {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "this deployment keeps no archive (SAS_ARCHIVE)")
		return
	}
	doc, err := s.archive.Get(r.Context(), id)
	if errors.Is(err, archive.ErrNotArchived) {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "order "+id+" is not in the archive")
		return
	}
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	// An archive made before namespaces names none: the default one.
	var in struct {
		Order struct {
			Namespace string `json:"namespace"`
		} `json:"order"`
	}
	if json.Unmarshal(doc, &in) != nil || !c.token.In(cmp.Or(in.Order.Namespace, statestore.DefaultNamespace)) {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "order "+id+" is not in the archive")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(doc)
}
