package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/contract"
	"sas/internal/messages"
)

// acceptedRules is how many rules checkAccepted reports.
const acceptedRules = 5

// callbackSources are where the check hears a 202 service's callback:
// a test queue of signals, or the API's callback routes served here.
type callbackSources struct {
	queue  string // --signals-queue
	listen string // --callback-listen
}

// checkAccepted checks a service that answered the check's first call
// 202 Accepted (a1): the path of a step ended later by a callback. Each
// rule is reported once, by report.
func (c *agentChecker) checkAccepted(ctx context.Context, a *app, first checkCall, a1 checkAnswer, from callbackSources, wait time.Duration,
	report func(ok bool, rule, detail string)) {
	fmt.Fprintf(a.stdout, "the service answered 202 Accepted: checking the callback path\n\n")
	hbOK := a1.heartbeat == "" || contract.Heartbeat(a1.heartbeat, time.Now()) > 0
	hb := "none"
	if a1.heartbeat != "" {
		hb = fmt.Sprintf("%q", a1.heartbeat)
	}
	report(hbOK, "a call is accepted (202), its Sas-Heartbeat, if any, seconds or an HTTP date in the future",
		fmt.Sprintf("answered %s; Sas-Heartbeat %s", a1, hb))

	// The same key again, as a message delivered twice: never a second
	// piece of work, so 202 again, 409 or the result.
	a2 := c.do(ctx, first)
	report(a2.err == nil && (a2.status == http.StatusAccepted || a2.status == http.StatusConflict || a2.status/100 == 2),
		"the same key again is not worked on anew (202, 409 or the result)", "answered "+a2.String())

	// The callback routes are served before the later attempt is called:
	// a service may call back at once.
	var heard <-chan heardCallback
	if from.listen != "" {
		h, stop, err := c.serveCallbacks(from.listen, first)
		if err != nil {
			report(false, callbackRule, "could not serve the callback routes on "+from.listen+": "+err.Error())
			return
		}
		defer stop()
		heard = h
	}

	// A later attempt: the same key with a new token, after the step's
	// time ran out. The service takes it, and calls back with its token.
	later := c.nextAttempt(first)
	a3 := c.do(ctx, later)
	report(a3.err == nil && (a3.status == http.StatusAccepted || a3.status/100 == 2 || a3.status == http.StatusConflict),
		"a later attempt of the key (a new Sas-Step-Token) is taken (202, 409 or the result)", "answered "+a3.String())

	bad := c.newCall()
	bad.body = []byte(`this is not the JSON of a request`)
	a4 := c.do(ctx, bad)
	report(a4.err == nil && contract.Classify(a4.status) == contract.Permanent && a4.status/100 == 4,
		"a call it cannot read is refused for good (a 4xx)", "answered "+a4.String())

	if from.queue == "" && from.listen == "" {
		report(false, callbackRule, "not watched: give --callback-listen ADDR (the service calls back over HTTP to http://ADDR/api/v1/steps/...) "+
			"or --signals-queue, the queue it sends its callbacks to (a test queue)")
		return
	}
	got, detail := c.watchCallback(ctx, a, from, heard, first, wait)
	report(got, callbackRule, detail)
}

// callbackRule is the rule the callback itself is checked by.
const callbackRule = "the callback comes, with the newest token of the key (complete with a JSON object or nothing, or fail with a reason)"

// heardCallback is a callback the check heard, or what was wrong with a
// message or request that came instead.
type heardCallback struct {
	name, token string
	wrong       string
}

// serveCallbacks serves the HTTP API's callback routes (POST
// /api/v1/steps/complete, fail, heartbeat, with the token in
// Sas-Step-Token) on addr, answering as sas would for the check's key:
// 200 for a token of its newest attempt (2), 409 stale_token for an
// earlier one, 403 invalid_token for any other. stop shuts the server and
// waits for it.
func (c *agentChecker) serveCallbacks(addr string, first checkCall) (<-chan heardCallback, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	ref, _ := c.tokens.Read(first.token)
	heard := make(chan heardCallback, 64)
	tell := func(h heardCallback) {
		select {
		case heard <- h:
		default: // the check has what it needs
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/steps/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		sig := messages.Signal{SchemaVersion: messages.SignalVersion, Token: r.Header.Get(contract.HeaderStepToken), Name: name}
		switch name {
		case messages.CallbackComplete:
			if len(body) > 0 {
				sig.Payload = body
			}
		case messages.CallbackFail:
			var fb struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(body, &fb); err != nil {
				tell(heardCallback{wrong: "a fail whose body is not {\"error\": \"why\"}: " + err.Error()})
				http.Error(w, `{"reason":"invalid_value"}`, http.StatusBadRequest)
				return
			}
			sig.Error = fb.Error
		}
		if err := sig.Validate(); err != nil {
			tell(heardCallback{wrong: fmt.Sprintf("a %q callback sas would refuse: %v", clip(name, 20), err)})
			http.Error(w, `{"reason":"invalid_value"}`, http.StatusBadRequest)
			return
		}
		got, err := c.tokens.Read(sig.Token)
		if err != nil || got.OrderID != ref.OrderID || got.Step != ref.Step {
			tell(heardCallback{wrong: fmt.Sprintf("a %q callback not for the check's call", name)})
			http.Error(w, `{"reason":"invalid_token"}`, http.StatusForbidden)
			return
		}
		tell(heardCallback{name: name, token: sig.Token})
		if got.Attempt != 2 {
			http.Error(w, `{"reason":"stale_token"}`, http.StatusConflict)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"outcome": "applied", "callback": name, "order_id": got.OrderID, "step": got.Step,
			"attempt": got.Attempt})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
	return heard, stop, nil
}

// watchCallback waits until a callback for first's key (any of its
// tokens) ends its step, or wait passes: on the test queue from.queue
// (every message read is taken off it) and on heard, the callbacks the
// served routes took.
func (c *agentChecker) watchCallback(ctx context.Context, a *app, from callbackSources, heard <-chan heardCallback, first checkCall,
	wait time.Duration) (bool, string) {
	var deliveries <-chan amqp.Delivery
	if from.queue != "" {
		conn, _, _, err := a.openBroker(ctx)
		if err != nil {
			return false, "could not reach the broker: " + err.Error()
		}
		defer conn.Close()
		ch, err := conn.Channel(ctx)
		if err != nil {
			return false, "could not open a channel: " + err.Error()
		}
		if _, err := ch.QueueDeclarePassive(from.queue, false, false, false, false, nil); err != nil {
			// The passive declare closed the channel: a test queue is made.
			if ch, err = conn.Channel(ctx); err != nil {
				return false, "could not open a channel: " + err.Error()
			}
			if _, err := ch.QueueDeclare(from.queue, false, false, false, false, nil); err != nil {
				return false, "could not declare " + from.queue + ": " + err.Error()
			}
		}
		defer ch.Close()
		if deliveries, err = ch.ConsumeWithContext(ctx, from.queue, "", true, true, false, false, nil); err != nil {
			return false, "could not read " + from.queue + ": " + err.Error()
		}
	}
	var places []string
	if from.queue != "" {
		places = append(places, from.queue)
	}
	if from.listen != "" {
		places = append(places, "http://"+from.listen+"/api/v1/steps/")
	}
	where := strings.Join(places, " or ")
	ref, _ := c.tokens.Read(first.token)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var seen []string
	heartbeats := 0
	for {
		var h heardCallback
		select {
		case <-ctx.Done():
			return false, ctx.Err().Error()
		case <-timer.C:
			return false, fmt.Sprintf("none came on %s within %s (heartbeats %d; other messages: %s)", where, wait, heartbeats, orNone(seen))
		case d, ok := <-deliveries:
			if !ok {
				return false, "the broker closed " + from.queue
			}
			sig, err := messages.DecodeSignal(d.Body)
			if err != nil {
				h.wrong = "unreadable: " + err.Error()
			} else if got, err := c.tokens.Read(sig.Token); err != nil || got.OrderID != ref.OrderID || got.Step != ref.Step {
				h.wrong = fmt.Sprintf("a %q signal not for the check's call", sig.Name)
			} else {
				h = heardCallback{name: sig.Name, token: sig.Token}
			}
		case h = <-heard:
		}
		if h.wrong != "" {
			seen = append(seen, h.wrong)
			continue
		}
		if h.name == messages.CallbackHeartbeat {
			heartbeats++
			continue
		}
		got, _ := c.tokens.Read(h.token)
		newest := got.Attempt == 2
		detail := fmt.Sprintf("%s with the token of attempt %d (the newest is 2), after %d heartbeats", h.name, got.Attempt, heartbeats)
		if !newest {
			detail += ": sas would refuse it (stale_token); call back with the token of the latest call of the key"
		}
		return newest, detail
	}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "; ")
}
