package api

import (
	"encoding/json"
	"fmt"
	"net/http"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// keySignal is the body of POST /signals: a signal that names its order
// by business key.
type keySignal struct {
	SignalID string          `json:"signal_id"`
	Workflow string          `json:"workflow"`
	Where    map[string]any  `json:"where"`
	Name     string          `json:"name"`
	Payload  json.RawMessage `json:"payload"`
	All      bool            `json:"all"`
}

// keySignalSent is the answer: the orders the signal was sent to.
type keySignalSent struct {
	SignalID string   `json:"signal_id"`
	Name     string   `json:"name"`
	Orders   []string `json:"orders"`
}

// signalByKey sends a signal to the running order of a workflow whose
// search attributes have the given values (each match with all); none is
// 404 no_match, several without all 409 ambiguous. A submitter token
// reaches only the orders it submitted. Each order gets it under the id
// SIGNAL_ID:ORDER_ID, as the signals queue's by-key signals do.
func (s *server) signalByKey(w http.ResponseWriter, r *http.Request, c caller) {
	body, ok := readBody(w, r, maxSmallBody, false)
	var b keySignal
	if !ok || !decodeInto(w, r, body, &b) {
		return
	}
	if b.SignalID == "" {
		b.SignalID = messages.NewID()
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: b.SignalID, Workflow: b.Workflow, Where: b.Where,
		Name: b.Name, Payload: b.Payload, All: b.All, By: c.actor()}
	if sig.Where == nil {
		sig.Where = map[string]any{}
	}
	if err := sig.Validate(); err != nil {
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return
	}
	mine := ""
	if c.may(statestore.TokenSubmitter) {
		mine = c.actor()
	}
	s.sendByKey(w, r, b, c.actor(), mine, c.namespaces())
}

// sendByKey sends a checked signal by business key to its orders (only
// those mine submitted, when set; only those of namespaces, when not
// nil) and answers with the orders reached.
func (s *server) sendByKey(w http.ResponseWriter, r *http.Request, b keySignal, by, mine string, namespaces []string) {
	limit := 2
	if b.All {
		limit = 1000
	}
	// Every partition's orders with those values.
	ids, err := s.stores.OrdersByKeyIn(r.Context(), b.Workflow, b.Where, limit, namespaces)
	if err != nil {
		s.operatorRefusal(w, r, err)
		return
	}
	if mine != "" {
		kept := ids[:0]
		for _, id := range ids {
			owner, err := s.partOf(r.Context(), id).store.SubmittedBy(r.Context(), id)
			if err != nil {
				s.unavailable(w, r, err)
				return
			}
			if owner == mine {
				kept = append(kept, id)
			}
		}
		ids = kept
	}
	switch {
	case len(ids) == 0:
		writeProblem(w, r, http.StatusNotFound, probNotFound,
			fmt.Sprintf("no running order of workflow %s has those search attribute values", b.Workflow), withReason(statestore.SignalNoMatch))
		return
	case len(ids) > 1 && !b.All:
		writeProblem(w, r, http.StatusConflict, probConflict,
			fmt.Sprintf("several running orders of workflow %s have those search attribute values; name one, or send \"all\": true", b.Workflow),
			withReason(statestore.SignalAmbiguous))
		return
	}
	for _, id := range ids {
		out, err := s.partOf(r.Context(), id).store.SignalCheckPayload(r.Context(), id, b.Name, b.Payload)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		if out.Outcome != "" {
			status, kind := http.StatusConflict, probConflict
			if out.Outcome == statestore.SignalInvalidPayload {
				status, kind = http.StatusUnprocessableEntity, probInvalid
			}
			writeProblem(w, r, status, kind, "order "+id+": "+out.Detail, withReason(out.Outcome))
			return
		}
	}
	for _, id := range ids {
		one := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: b.SignalID + ":" + id, OrderID: id, Name: b.Name,
			Payload: b.Payload, By: by}
		if !s.publishSignal(w, r, one) {
			return
		}
	}
	s.logger.Info("api: signal by key", "by", by, "workflow", b.Workflow, "name", b.Name, "orders", len(ids))
	writeJSON(w, http.StatusAccepted, keySignalSent{SignalID: b.SignalID, Name: b.Name, Orders: ids})
}
