package api

import (
	"fmt"
	"net/http"

	"sas/internal/messages"
	"sas/internal/orderfilter"
)

// migrationBody is the body of POST /migrations: move the running orders
// of a workflow (or those ids) to its version in the API's workflows
// file; a dry run unless apply.
type migrationBody struct {
	Workflow  string   `json:"workflow"`
	ToVersion string   `json:"to_version"`
	IDs       []string `json:"ids"`
	Apply     bool     `json:"apply"`
}

// maxMigrated bounds the orders one request looks at: the oldest running
// orders on another version come first, so the same request again goes
// on with the next ones.
const maxMigrated = 1000

// migrate answers each order's verdict: whether it can move and why not,
// and, with apply, whether it moved.
func (s *server) migrate(w http.ResponseWriter, r *http.Request, c caller) {
	body, ok := readBody(w, r, maxSmallBody, false)
	var b migrationBody
	if !ok || !decodeInto(w, r, body, &b) {
		return
	}
	wf, ok := s.workflows.Lookup(b.Workflow)
	if !ok || b.Workflow == "" {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, fmt.Sprintf("workflow %q is not in this API's workflows file", orderfilter.Clip(b.Workflow, 64)))
		return
	}
	if wf.Version() != b.ToVersion {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid,
			fmt.Sprintf("this API's workflows file has version %s of %s, not %q", wf.Version(), wf.Name, orderfilter.Clip(b.ToVersion, 64)))
		return
	}
	ids := b.IDs
	if len(ids) > maxMigrated {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, fmt.Sprintf("%d ids, at most %d a request", len(ids), maxMigrated))
		return
	}
	if len(ids) == 0 {
		// The oldest of every partition, an even share of each.
		var err error
		if ids, err = s.stores.RunningOrders(r.Context(), wf.Name, wf.Version(), maxMigrated); err != nil {
			s.unavailable(w, r, err)
			return
		}
	}
	canonical := make([]string, len(ids))
	for i, raw := range ids {
		id, ok := messages.CanonicalID(raw)
		if !ok {
			writeProblem(w, r, http.StatusBadRequest, probBadRequest, fmt.Sprintf("%q is not an order id", orderfilter.Clip(raw, 64)))
			return
		}
		canonical[i] = id
	}
	// Each partition moves its own; the verdicts keep the ids' order.
	verdicts, err := s.stores.MigrateOrders(r.Context(), canonical, wf, b.Apply, c.actor())
	if err != nil {
		s.operatorRefusal(w, r, err)
		return
	}
	s.logger.Info("api: migration", "token", c.token.Name, "workflow", wf.Name, "to", wf.Version(), "orders", len(verdicts), "apply", b.Apply)
	writeJSON(w, http.StatusOK, map[string]any{"workflow": wf.Name, "to_version": wf.Version(), "applied": b.Apply, "orders": verdicts})
}
