package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/contract"
	"sas/internal/messages"
)

// acceptedRules is how many rules checkAccepted reports.
const acceptedRules = 5

// checkAccepted checks a service that answered the check's first call
// 202 Accepted (a1): the path of a step ended later by a callback. It
// returns how many rules failed.
func (c *agentChecker) checkAccepted(ctx context.Context, a *app, first checkCall, a1 checkAnswer, signalsQueue string, wait time.Duration,
	report func(ok bool, rule, detail string)) int {
	failed := 0
	rep := func(ok bool, rule, detail string) {
		if !ok {
			failed++
		}
		report(ok, rule, detail)
	}
	fmt.Fprintf(a.stdout, "the service answered 202 Accepted: checking the callback path\n\n")
	hbOK := a1.heartbeat == "" || contract.Heartbeat(a1.heartbeat, time.Now()) > 0
	hb := "none"
	if a1.heartbeat != "" {
		hb = fmt.Sprintf("%q", a1.heartbeat)
	}
	rep(hbOK, "a call is accepted (202), its Sas-Heartbeat, if any, seconds or an HTTP date in the future",
		fmt.Sprintf("answered %s; Sas-Heartbeat %s", a1, hb))

	// The same key again, as a message delivered twice: never a second
	// piece of work, so 202 again, 409 or the result.
	a2 := c.do(ctx, first)
	rep(a2.err == nil && (a2.status == http.StatusAccepted || a2.status == http.StatusConflict || a2.status/100 == 2),
		"the same key again is not worked on anew (202, 409 or the result)", "answered "+a2.String())

	// A later attempt: the same key with a new token, after the step's
	// time ran out. The service takes it, and calls back with its token.
	later := c.nextAttempt(first)
	a3 := c.do(ctx, later)
	rep(a3.err == nil && (a3.status == http.StatusAccepted || a3.status/100 == 2 || a3.status == http.StatusConflict),
		"a later attempt of the key (a new Sas-Step-Token) is taken (202, 409 or the result)", "answered "+a3.String())

	bad := c.newCall()
	bad.body = []byte(`this is not the JSON of a request`)
	a4 := c.do(ctx, bad)
	rep(a4.err == nil && contract.Classify(a4.status) == contract.Permanent && a4.status/100 == 4,
		"a call it cannot read is refused for good (a 4xx)", "answered "+a4.String())

	const rule = "the callback comes, with the newest token of the key (complete with a JSON object or nothing, or fail with a reason)"
	if signalsQueue == "" {
		rep(false, rule, "not watched: give --signals-queue, the queue the service sends its callbacks to (a test queue)")
		return failed
	}
	got, detail := c.watchCallback(ctx, a, signalsQueue, first, wait)
	rep(got, rule, detail)
	return failed
}

// watchCallback reads signalsQueue until a callback for first's key (any
// of its tokens) ends its step, or wait passes. Every message read is
// taken off the queue.
func (c *agentChecker) watchCallback(ctx context.Context, a *app, signalsQueue string, first checkCall, wait time.Duration) (bool, string) {
	conn, _, _, err := a.openBroker(ctx)
	if err != nil {
		return false, "could not reach the broker: " + err.Error()
	}
	defer conn.Close()
	ch, err := conn.Channel(ctx)
	if err != nil {
		return false, "could not open a channel: " + err.Error()
	}
	if _, err := ch.QueueDeclarePassive(signalsQueue, false, false, false, false, nil); err != nil {
		// The passive declare closed the channel: a test queue is made.
		if ch, err = conn.Channel(ctx); err != nil {
			return false, "could not open a channel: " + err.Error()
		}
		if _, err := ch.QueueDeclare(signalsQueue, false, false, false, false, nil); err != nil {
			return false, "could not declare " + signalsQueue + ": " + err.Error()
		}
	}
	defer ch.Close()
	deliveries, err := ch.ConsumeWithContext(ctx, signalsQueue, "", true, true, false, false, nil)
	if err != nil {
		return false, "could not read " + signalsQueue + ": " + err.Error()
	}
	ref, _ := c.tokens.Read(first.token)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var seen []string
	heartbeats := 0
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return false, ctx.Err().Error()
		case <-timer.C:
			return false, fmt.Sprintf("none came on %s within %s (heartbeats %d; other messages: %s)", signalsQueue, wait, heartbeats, orNone(seen))
		case d, ok = <-deliveries:
			if !ok {
				return false, "the broker closed " + signalsQueue
			}
		}
		sig, err := messages.DecodeSignal(d.Body)
		if err != nil {
			seen = append(seen, "unreadable: "+err.Error())
			continue
		}
		got, err := c.tokens.Read(sig.Token)
		if err != nil || got.OrderID != ref.OrderID || got.Step != ref.Step {
			seen = append(seen, fmt.Sprintf("a %q signal not for the check's call", sig.Name))
			continue
		}
		switch sig.Name {
		case messages.CallbackHeartbeat:
			heartbeats++
			continue
		}
		newest := got.Attempt == 2
		detail := fmt.Sprintf("%s with the token of attempt %d (the newest is 2), after %d heartbeats", sig.Name, got.Attempt, heartbeats)
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
