package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"sas/internal/contract"
	"sas/internal/messages"
	"sas/internal/steptoken"
)

// checkCall is one call of the conformance check.
type checkCall struct {
	url        string // "" for the action's
	key        string
	body       []byte
	completeBy time.Time
	token      string // Sas-Step-Token
	attempt    int
}

type checkAnswer struct {
	status    int
	body      string
	heartbeat string // a 202's Sas-Heartbeat
	err       error
}

func (a checkAnswer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(snippetOf(a.body)))
}

func snippetOf(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// agentChecker calls one action of a service as an agent would, and the
// compensation that undoes it.
type agentChecker struct {
	client     *http.Client
	url        string
	action     string
	undoURL    string
	undoAction string
	payload    json.RawMessage
	headers    http.Header
	// tokens mints the calls' step tokens, under a key of the check's
	// own: a callback with one is the check's, never a step of sas's.
	tokens steptoken.Key
}

func (c *agentChecker) newCall() checkCall {
	id := messages.NewID()
	body, _ := json.Marshal(contract.Request{OrderID: id, Step: 1, Action: c.action, Payload: c.payload})
	return checkCall{key: fmt.Sprintf("%s/1/%s", id, c.action), body: body, completeBy: time.Now().Add(30 * time.Second),
		token: c.tokens.Mint(steptoken.Ref{OrderID: id, Step: 1, Attempt: 1}), attempt: 1}
}

// nextAttempt is cl's next attempt: the same key and body, a new token.
func (c *agentChecker) nextAttempt(cl checkCall) checkCall {
	ref, _ := c.tokens.Read(cl.token)
	ref.Attempt++
	cl.token, cl.attempt = c.tokens.Mint(ref), ref.Attempt
	return cl
}

// undoCall is the call of the compensation that undoes the action of key,
// whose answer was result ("" when it never ran), under a key of its own.
func (c *agentChecker) undoCall(key, result string) checkCall {
	id := messages.NewID()
	req := contract.Request{OrderID: id, Step: 2, Action: c.undoAction, Payload: c.payload, Undoes: key}
	if result != "" && json.Valid([]byte(result)) {
		req.UndoneResult = json.RawMessage(result)
	}
	body, _ := json.Marshal(req)
	return checkCall{url: c.undoURL, key: fmt.Sprintf("%s/2/%s", id, c.undoAction), body: body, completeBy: time.Now().Add(30 * time.Second)}
}

func (c *agentChecker) do(ctx context.Context, cl checkCall) checkAnswer {
	url := cl.url
	if url == "" {
		url = c.url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(cl.body))
	if err != nil {
		return checkAnswer{err: err}
	}
	for name, vs := range c.headers {
		req.Header[name] = vs
	}
	req.Header.Set("Content-Type", contract.ContentType)
	req.Header.Set(contract.HeaderIdempotencyKey, cl.key)
	req.Header.Set(contract.HeaderCompleteBy, contract.FormatCompleteBy(cl.completeBy))
	req.Header.Set(contract.HeaderAttempt, strconv.Itoa(max(cl.attempt, 1)))
	if cl.token != "" {
		req.Header.Set(contract.HeaderStepToken, cl.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return checkAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return checkAnswer{status: resp.StatusCode, body: string(b), heartbeat: resp.Header.Get(contract.HeaderHeartbeat), err: err}
}

// settle calls until the answer is not transient (a 409 while the first
// call is in flight, a 429 or 503), for at most 20 s.
func (c *agentChecker) settle(ctx context.Context, cl checkCall) checkAnswer {
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := c.do(ctx, cl)
		if a.err != nil || contract.Classify(a.status) != contract.Transient || time.Now().After(deadline) {
			return a
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

// agentCheck checks that the service at a URL keeps the remote-service
// contract (docs/remote-service.openapi.yaml).
func (a *app) agentCheck(ctx context.Context, args []string) error {
	fs := a.flags()
	action := fs.String("action", "sas_check", "the action to call: POST URL/v1/ACTION (calls apply it, under new keys)")
	path := fs.String("path", "", "call URL+PATH instead of URL/v1/ACTION")
	undoAction := fs.String("undo-action", "", "the compensation that undoes the action (default: undo_ACTION): POST URL/v1/UNDO")
	undoPath := fs.String("undo-path", "", "call URL+PATH for the undo instead of URL/v1/UNDO")
	payload := fs.String("payload", `{"sas_check":true}`, "the payload to send: "+payloadFlagHelp)
	headersFile := fs.String("headers-file", "", "a file of \"Name: value\" lines sent with every call (credentials)")
	concurrent := fs.Int("concurrent", 8, "calls sent at once with one key")
	signalsQueue := fs.String("signals-queue", "", "for a service that answers 202 Accepted: the queue it sends its callbacks to, watched here (point the service at a test queue, never at the schedulers' own)")
	callbackListen := fs.String("callback-listen", "", "for a service that answers 202 Accepted and calls back over HTTP: serve the API's callback routes (POST /api/v1/steps/complete, fail, heartbeat) at this address, and point the service at http://ADDR/api/v1 instead of the sas API")
	callbackWait := fs.Duration("callback-wait", 30*time.Second, "for a service that answers 202 Accepted: how long to wait for its callback")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 || !strings.HasPrefix(rest[0], "http://") && !strings.HasPrefix(rest[0], "https://") {
		return a.usageError(fs, "give the service's base URL (http:// or https://)")
	}
	raw, err := payloadArg(*payload)
	if err != nil {
		return a.usageError(fs, "%v", err)
	}
	// As the agent: a redirect is the answer, never followed.
	c := &agentChecker{client: &http.Client{Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, action: *action, payload: json.RawMessage(raw), headers: http.Header{}}
	if c.tokens, err = steptoken.NewKey(messages.NewID() + messages.NewID()); err != nil {
		return err
	}
	base := strings.TrimRight(rest[0], "/")
	c.url = base + contract.DefaultPath(*action)
	if *path != "" {
		c.url = base + *path
	}
	c.undoAction = cmp.Or(*undoAction, "undo_"+*action)
	c.undoURL = base + contract.DefaultPath(c.undoAction)
	if *undoPath != "" {
		c.undoURL = base + *undoPath
	}
	if *headersFile != "" {
		raw, err := os.ReadFile(*headersFile)
		if err != nil {
			return err
		}
		if c.headers, err = contract.ParseHeaders(raw); err != nil {
			return fmt.Errorf("%s: %w", *headersFile, err)
		}
	}

	failed := 0
	report := func(ok bool, rule, detail string) {
		verdict := "PASS"
		if !ok {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(a.stdout, "%s  %s\n      %s\n", verdict, rule, detail)
	}
	fmt.Fprintf(a.stdout, "checking %s against the sas remote-service contract\n\n", c.url)

	// 1. The same key twice gives the same answer.
	first := c.newCall()
	a1 := c.settle(ctx, first)
	if a1.err == nil && contract.Classify(a1.status) == contract.Accepted {
		c.checkAccepted(ctx, a, first, a1, callbackSources{queue: *signalsQueue, listen: *callbackListen}, *callbackWait, report)
		if failed > 0 {
			return fmt.Errorf("%d of %d rules failed", failed, acceptedRules)
		}
		fmt.Fprintln(a.stdout, "\nevery rule passed")
		return nil
	}
	a2 := c.settle(ctx, first)
	okFirst := a1.err == nil && contract.Classify(a1.status) == contract.OK
	report(okFirst, "a call is done (2xx, a JSON object or nothing)", "answered "+a1.String())
	report(okFirst && a2.err == nil && a2.status/100 == 2 && sameJSON(a1.body, a2.body),
		"the same key twice gives the same answer (a replay)", "first "+a1.String()+"; again "+a2.String())

	// 2. The same key with another body is refused with 422.
	other := first
	other.body = bytes.Replace(first.body, []byte(`"step":1`), []byte(`"step":2`), 1)
	a3 := c.do(ctx, other)
	report(a3.err == nil && a3.status == http.StatusUnprocessableEntity,
		"the same key with another body gives 422", "answered "+a3.String())

	// 3. Calls at once with one key: one result, no second application.
	conc := c.newCall()
	answers := make([]checkAnswer, max(*concurrent, 2))
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = c.do(ctx, conc) })
	}
	wg.Wait()
	final := c.settle(ctx, conc)
	var oks, conflicts, others []string
	agree := final.err == nil && final.status/100 == 2
	for _, ans := range answers {
		switch {
		case ans.err == nil && ans.status/100 == 2:
			oks = append(oks, ans.body)
			agree = agree && sameJSON(ans.body, final.body)
		case ans.err == nil && ans.status == http.StatusConflict:
			conflicts = append(conflicts, "409")
		default:
			others = append(others, ans.String())
		}
	}
	report(agree && len(others) == 0 && len(oks) >= 1,
		fmt.Sprintf("%d calls at once with one key give one result (the others 409 or a replay)", len(answers)),
		fmt.Sprintf("%d answered 2xx with the same result as a later replay, %d answered 409, others: %v; replay %s",
			len(oks), len(conflicts), others, final.String()))

	// 4. A call past its deadline is refused, or harmless: nothing the
	// key's next call does not replay.
	late := c.newCall()
	late.completeBy = time.Now().Add(-time.Second)
	a4 := c.do(ctx, late)
	switch {
	case a4.err != nil:
		report(false, "a call past its deadline is refused or harmless", a4.err.Error())
	case contract.Classify(a4.status) != contract.OK:
		report(true, "a call past its deadline is refused or harmless", "refused: "+a4.String())
	default:
		live := late
		live.completeBy = time.Now().Add(30 * time.Second)
		a5 := c.settle(ctx, live)
		report(a5.err == nil && a5.status/100 == 2 && sameJSON(a4.body, a5.body),
			"a call past its deadline is refused or harmless",
			"accepted ("+a4.String()+"); the key's next call in time answered "+a5.String()+" (must be the same: a replay)")
	}

	// 5. A call it cannot read is refused for good (a 4xx, not a 5xx
	// that sas would retry until the step's time runs out), and the
	// refusal is not kept as the key's answer: it applied nothing, and a
	// resubmit after the cause is fixed comes with the same key.
	bad := c.newCall()
	good := bad
	bad.body = []byte(`this is not the JSON of a request`)
	a6 := c.do(ctx, bad)
	a7 := c.settle(ctx, good)
	report(a6.err == nil && contract.Classify(a6.status) == contract.Permanent && a6.status/100 == 4,
		"a call it cannot read is refused for good (a 4xx)", "answered "+a6.String())
	report(a7.err == nil && a7.status/100 == 2,
		"a refusal is not kept as the key's answer: the key's next call, readable, is done",
		"then answered "+a7.String()+" (a service that replays its refusal blocks the step's resubmit for ever)")

	// 6. Undo. The undo of a done action is done; the undo of an action
	// that never ran is done too (nothing to undo), and the action
	// cannot happen after it.
	done := c.newCall()
	a8 := c.settle(ctx, done)
	a9 := c.settle(ctx, c.undoCall(done.key, a8.body))
	report(a8.err == nil && a8.status/100 == 2 && a9.err == nil && a9.status/100 == 2,
		"the undo of a done action is done", fmt.Sprintf("the action answered %s; %s %s", a8, c.undoAction, a9))
	never := c.newCall()
	a10 := c.settle(ctx, c.undoCall(never.key, ""))
	a11 := c.settle(ctx, never)
	report(a10.err == nil && a10.status/100 == 2 && a11.err == nil && contract.Classify(a11.status) == contract.Permanent,
		"the undo of an action that never ran is done, and the action cannot happen after it",
		fmt.Sprintf("%s answered %s; the action then %s (want a refusal for good, such as 410)", c.undoAction, a10, a11))

	const rules = 9
	if failed > 0 {
		return fmt.Errorf("%d of %d rules failed", failed, rules)
	}
	fmt.Fprintln(a.stdout, "\nevery rule passed")
	return nil
}
