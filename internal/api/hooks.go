package api

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// hook turns a foreign JSON event posted to /hooks/WORKFLOW/NAME into an
// order of the workflow or a signal to one of its orders, as the
// workflow's inbound route NAME maps it. Its credential is the sender's
// signature (HMAC-SHA256 of the body under the secret in the API's
// environment variable the route names), not an API token; requests
// without one are limited per client address as callbacks are.
func (s *server) hook(w http.ResponseWriter, r *http.Request, _ caller) {
	wfName, name := r.PathValue("id"), r.PathValue("name")
	wf, ok := s.workflows.Lookup(wfName)
	var in workflow.Inbound
	if ok {
		in, ok = wf.InboundRoute(name)
	}
	if !ok || wfName == "" {
		writeProblem(w, r, http.StatusNotFound, probNotFound, "no workflow of this API's workflows file has an inbound route by that name")
		return
	}
	body, ok := readRaw(w, r, messages.MaxBodyBytes, false)
	if !ok {
		return
	}
	secret := os.Getenv(in.SecretEnv)
	if secret == "" {
		writeProblem(w, r, http.StatusServiceUnavailable, probUnavailable, "this route's secret is not set in the API's environment ("+in.SecretEnv+")")
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get(in.SignatureHeader), in.SignaturePrefix)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	want := hex.EncodeToString(mac.Sum(nil))
	if !ok || !hmac.Equal([]byte(strings.ToLower(got)), []byte(want)) {
		writeProblem(w, r, http.StatusUnauthorized, probUnauthorized, "the body's signature ("+in.SignatureHeader+") is missing or wrong")
		return
	}
	if err := messages.CheckJSON(body, messages.MaxBodyBytes); err != nil {
		writeDecodeProblem(w, r, http.StatusBadRequest, err)
		return
	}
	actor := "hook:" + wf.Name + "/" + in.Name
	// The route's orders and signals are of its namespace alone.
	ns := cmp.Or(in.Namespace, statestore.DefaultNamespace)
	if ns != statestore.DefaultNamespace {
		known, err := s.namespaces.Exists(r.Context(), ns)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		if !known {
			writeProblem(w, r, http.StatusNotFound, probNotFound, fmt.Sprintf("the route's namespace %q does not exist (sasctl namespaces add)", ns))
			return
		}
	}
	if st := in.Start; st != nil {
		key, payload, err := st.StartOf(body)
		if err != nil {
			writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, "the event does not map to an order: "+err.Error(),
				withReason(messages.ReasonInvalidValue))
			return
		}
		o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.DerivedID(actor + ":" + key),
			Workflow: wf.Name, Payload: payload}
		if err := o.Validate(); err != nil {
			writeDecodeProblem(w, r, http.StatusUnprocessableEntity, err)
			return
		}
		s.acceptOrder(w, r, o, actor, ns, caller{token: statestore.APIToken{Namespaces: []string{ns}}})
		return
	}
	where, payload, err := in.Signal.SignalOf(body)
	if err != nil {
		writeProblem(w, r, http.StatusUnprocessableEntity, probInvalid, "the event does not map to a signal: "+err.Error(),
			withReason(messages.ReasonInvalidValue))
		return
	}
	sum := sha256.Sum256(body)
	b := keySignal{SignalID: "hook-" + hex.EncodeToString(sum[:12]), Workflow: wf.Name, Where: where, Name: in.Signal.Name,
		Payload: payload, All: in.Signal.All}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: b.SignalID, Workflow: b.Workflow, Where: b.Where,
		Name: b.Name, Payload: b.Payload, All: b.All, By: actor}
	if err := sig.Validate(); err != nil {
		writeDecodeProblem(w, r, http.StatusUnprocessableEntity, err)
		return
	}
	s.sendByKey(w, r, b, actor, "", []string{ns})
}
