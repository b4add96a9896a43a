package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// TestFollowersSeeEachStep: an application that follows an order's event
// stream with steps=true sees "now awaiting approval" without polling:
// the approval wait awaiting its signal (named; from the stream's first
// look at the order when the wait began before it came), then, once
// signalled, the wait processed and the order completed. A follower of statuses alone gets no step event, and with
// nobody following steps no step event is written.
func TestFollowersSeeEachStep(t *testing.T) {
	t.Parallel()
	g := runFile(t, "api.yaml", apiFile, pipelineOpts{schedulers: 1, agents: 1})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	app := apiToken(t, g.stack, "app", "submitter")

	// Before anyone follows steps, an order writes none.
	quiet := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(quiet, "shop", `{"customer":"c"}`)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	g.pipeline.waitTerminal(t, []string{quiet}, time.Minute)
	if n := g.count(t, `SELECT count(*) FROM outbox WHERE message_type = 'step_event'`); n != 0 {
		t.Fatalf("%d step events written with nobody following steps", n)
	}
	if code, h, b := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + quiet + "/events?steps=maybe", token: app}); code != 400 {
		t.Fatalf("steps=maybe: %d %s", code, b)
	} else {
		problemOf(t, h, b)
	}

	id := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(id, "approval", `{}`)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	type seen struct {
		kind string // status or step
		what string // the status, or step:event
		wait string
	}
	events := make(chan seen, 64)
	follow := func(steps bool) {
		defer close(events)
		path := "/api/v1/orders/" + id + "/events"
		if steps {
			path += "?steps=true"
		}
		req, _ := http.NewRequest("GET", api.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+app)
		resp, err := apiHTTP().Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("follow: %v", err)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		kind := ""
		for sc.Scan() {
			line := sc.Text()
			if k, ok := strings.CutPrefix(line, "event: "); ok {
				kind = k
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			switch kind {
			case "status":
				var ev messages.StatusEvent
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Errorf("a status event %s: %v", data, err)
					return
				}
				events <- seen{"status", ev.Status, ""}
			case "step":
				ev, err := messages.DecodeStepEvent([]byte(data))
				if err != nil || ev.OrderID != id {
					t.Errorf("a step event %s: %v", data, err)
					return
				}
				events <- seen{"step", ev.Name + ":" + ev.Event, ev.Wait}
			}
		}
	}
	var following sync.WaitGroup
	following.Go(func() { follow(true) })
	var got []string
	next := func(what string) seen {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case s, ok := <-events:
				if !ok {
					t.Fatalf("the stream ended before %s; it sent %v", what, got)
				}
				got = append(got, s.kind+" "+s.what)
				if s.what == what {
					return s
				}
			case <-deadline:
				t.Fatalf("no %s within a minute; the stream sent %v", what, got)
			}
		}
	}
	if s := next("approved:awaiting"); s.wait != "approved" {
		t.Fatalf("the awaiting event names the signal %q, want approved", s.wait)
	}
	// The stream began with the order's status as it was then (the score
	// step may have ended before it began).
	if !strings.HasPrefix(got[0], "status ") {
		t.Fatalf("the stream began with %v, not the order's status", got)
	}
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders/" + id + "/signals/approved", token: app, body: `{"by":"ann"}`}); code != 202 {
		t.Fatalf("signal: %d %s", code, b)
	}
	next("approved:processed")
	next("completed")
	following.Wait()

	// A follower who comes after the wait began hears of it first.
	late := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(late, "approval", `{}`)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	testenv.Eventually(t, time.Minute, "the late order's wait to begin", func() bool {
		return g.count(t, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'awaiting'`, late) == 1
	})
	req0, _ := http.NewRequest("GET", api.url+"/api/v1/orders/"+late+"/events?steps=true", nil)
	req0.Header.Set("Authorization", "Bearer "+app)
	resp0, err := apiHTTP().Do(req0)
	if err != nil || resp0.StatusCode != 200 {
		t.Fatalf("follow the late order: %v", err)
	}
	sc0 := bufio.NewScanner(resp0.Body)
	var firstStep string
	for sc0.Scan() && firstStep == "" {
		if data, ok := strings.CutPrefix(sc0.Text(), "data: "); ok && strings.Contains(data, `"event"`) {
			firstStep = data
		}
	}
	resp0.Body.Close()
	if ev, err := messages.DecodeStepEvent([]byte(firstStep)); err != nil || ev.Event != messages.StepAwaiting || ev.Wait != "approved" {
		t.Fatalf("the late follower's first step event: %s (%v)", firstStep, err)
	}

	// A follower of statuses alone, on another order, gets no step event.
	other := messages.NewID()
	if code, _, b := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: app, body: submitBody(other, "shop", `{"customer":"d"}`)}); code != 202 {
		t.Fatalf("submit: %d %s", code, b)
	}
	req, _ := http.NewRequest("GET", api.url+"/api/v1/orders/"+other+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+app)
	resp, err := apiHTTP().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow statuses: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "event: step") {
			t.Fatal("a follower of statuses alone got a step event")
		}
	}
}
