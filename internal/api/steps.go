package api

import (
	"hash/fnv"
	"net"
	"net/http"
	"time"

	"sas/internal/contract"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/steptoken"
)

// Callbacks over HTTP: the service of a step that answered its call 202
// Accepted completes, fails or holds the step open by presenting the
// step's token (the Sas-Step-Token header of the call) in the same
// header. The token is the credential: it is an HMAC under a key only
// the state store's owner and the schedulers read, names one attempt of
// one step, and can do nothing but end or hold that attempt while it
// runs. SAS_API_CALLBACKS_NEED_TOKEN asks for an API token as well.

// callbackDone answers a callback that was applied.
type callbackDone struct {
	Outcome  string `json:"outcome"`
	Callback string `json:"callback"`
	OrderID  string `json:"order_id"`
	Step     int    `json:"step"`
	Attempt  int    `json:"attempt"`
	// CompleteBy is, for a heartbeat, the attempt's new deadline.
	CompleteBy *time.Time `json:"complete_by,omitempty"`
	// OrderStatus is the order's status when the callback moved it.
	OrderStatus string `json:"order_status,omitempty"`
}

// failBody is the body of a fail: why the step failed.
type failBody struct {
	Error string `json:"error"`
}

// maxCallbackBody bounds a callback's body: a step's result and a little
// more.
const maxCallbackBody = messages.MaxResultBytes + 4<<10

// stepCallback serves POST /steps/{complete,fail,heartbeat}.
func (s *server) stepCallback(name string) handler {
	return func(w http.ResponseWriter, r *http.Request, c caller) {
		token := r.Header.Get(contract.HeaderStepToken)
		if token == "" {
			writeProblem(w, r, http.StatusUnauthorized, probUnauthorized,
				"send the step's token in "+contract.HeaderStepToken+" (the header of the call the service answered 202 Accepted)",
				withReason(statestore.CallbackInvalidToken))
			return
		}
		sig := messages.Signal{SchemaVersion: messages.SignalVersion, Token: token, Name: name, SignalID: r.Header.Get("Idempotency-Key")}
		switch name {
		case messages.CallbackComplete:
			body, ok := readBody(w, r, maxCallbackBody, true)
			if !ok {
				return
			}
			sig.Payload = body
		case messages.CallbackFail:
			body, ok := readBody(w, r, maxSmallBody, false)
			var fb failBody
			if !ok || !decodeInto(w, r, body, &fb) {
				return
			}
			sig.Error = fb.Error
		default:
			if _, ok := readBody(w, r, maxSmallBody, true); !ok {
				return
			}
		}
		if err := sig.Validate(); err != nil {
			writeDecodeProblem(w, r, http.StatusBadRequest, err)
			return
		}
		actor := "callback:api"
		if c.token.Name != "" {
			actor = c.actor()
		}
		if c.token.Name != "" && !s.callbackReaches(w, r, c, token) {
			return
		}
		cb := statestore.Callback{Token: token, Name: name, SignalID: sig.SignalID, Actor: actor, Notify: true}
		if len(sig.Payload) > 0 && string(sig.Payload) != "null" {
			cb.Result = s.redact.JSON(sig.Payload)
		}
		if sig.Error != "" {
			cb.Error = s.redact.String(sig.Error)
		}
		// In the partition of the order the token names (the store
		// checks all of the token there).
		out, err := s.partOf(r.Context(), steptoken.OrderOf(token)).store.Callback(r.Context(), cb)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		switch out.Outcome {
		case statestore.SignalApplied:
			done := callbackDone{Outcome: out.Outcome, Callback: name, OrderID: out.OrderID, Step: out.Step, Attempt: out.Attempt,
				OrderStatus: out.OrderStatus}
			if !out.CompleteBy.IsZero() {
				done.CompleteBy = &out.CompleteBy
			}
			s.logger.Debug("api: callback", "callback", name, "order_id", out.OrderID, "step", out.Step, "attempt", out.Attempt)
			writeJSON(w, http.StatusOK, done)
		case statestore.CallbackInvalidToken:
			s.logger.Info("api: callback refused", "reason", out.Outcome, "remote", clientHost(r))
			writeProblem(w, r, http.StatusForbidden, probForbidden, out.Detail, withReason(out.Outcome))
		default: // stale_token, duplicate
			s.logger.Info("api: callback changed nothing", "reason", out.Outcome, "order_id", out.OrderID, "step", out.Step, "attempt", out.Attempt)
			writeProblem(w, r, http.StatusConflict, probConflict, out.Detail, withReason(out.Outcome))
		}
	}
}

// callbackReaches lets a callback that came with an API token
// (SAS_API_CALLBACKS_NEED_TOKEN) through when that token may act in its
// step's order's namespace; one of another namespace's order is refused
// as a step token that is not valid, and changes nothing. The step token
// names its order in clear; the store still checks all of it.
func (s *server) callbackReaches(w http.ResponseWriter, r *http.Request, c caller, token string) bool {
	if id, ok := messages.CanonicalID(steptoken.OrderOf(token)); ok {
		ok, err := s.mayReach(r.Context(), c, id, false)
		if err != nil {
			s.unavailable(w, r, err)
			return false
		}
		if ok {
			return true
		}
	}
	s.logger.Info("api: callback refused", "reason", statestore.CallbackInvalidToken, "token", c.token.Name, "remote", clientHost(r))
	writeProblem(w, r, http.StatusForbidden, probForbidden, "the step token is not one of a step this API token may act on",
		withReason(statestore.CallbackInvalidToken))
	return false
}

// clientHost is the address a request came from, without its port.
func clientHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// clientLimit is the rate limiter's key for requests that carry no API
// token (callbacks by their step token): one allowance per client
// address, never a token's id (those are positive).
func clientLimit(r *http.Request) int64 {
	h := fnv.New64a()
	h.Write([]byte(clientHost(r)))
	return -int64(h.Sum64()>>1) - 1
}
