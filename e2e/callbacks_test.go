package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/client"
	"sas/internal/contract"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// asyncService is a service that answers build_export 202 Accepted and
// ends each step later by a callback, as the test decides; it answers
// notify at once.
type asyncService struct {
	mu sync.Mutex
	// tokens are the tokens each order's build_export calls brought, in
	// the order they came (one per attempt).
	tokens map[string][]string
	calls  chan string // an order whose build_export was called
}

func (s *asyncService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req contract.Request
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":"unreadable"}`, http.StatusBadRequest)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/notify") {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"notified":true}`))
		return
	}
	// A call again with a token already seen is the agent's retry of the
	// same attempt (its answer lost or late): answered 202 again, as an
	// idempotent service does, and not served twice.
	token := r.Header.Get(contract.HeaderStepToken)
	s.mu.Lock()
	seen := slices.Contains(s.tokens[req.OrderID], token)
	if !seen {
		s.tokens[req.OrderID] = append(s.tokens[req.OrderID], token)
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"queued":true}`))
	if !seen {
		s.calls <- req.OrderID
	}
}

func (s *asyncService) tokensOf(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tokens[id])
}

// TestServicesAnswerLaterByCallback: the export example of
// docs/YOUR-PROCESS.md runs; its service answers 202 Accepted to
// 300 steps and completes each later with a callback carrying the step's
// token: 240 soon; 40 after heartbeats past the step's timeout (10 s),
// which hold it open; 20 after letting the first attempt run out, so
// that the step is called again with a new token, and then replaying the
// first attempt's token (refused, stale_token, nothing changes) before
// completing with the new one. Every order completes once with the
// result of its valid callback; a forged token is refused (invalid_token)
// and told to its sender. (The timeout is long enough that an attempt
// does not run out between its claim and its call on a loaded machine;
// a call again is answered with its own token all the same. The
// heartbeat orders are submitted once the others have been called.)
func TestServicesAnswerLaterByCallback(t *testing.T) {
	t.Parallel()
	svc := &asyncService{tokens: map[string][]string{}, calls: make(chan string, 1000)}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	// The example of docs/YOUR-PROCESS.md, its durations shortened.
	file := strings.NewReplacer("timeout: 30s", "timeout: 10s", "max_duration: 2h", "max_duration: 60s").
		Replace(docBlock(t, "yaml", "# export.yaml"))
	if !strings.Contains(file, "timeout: 10s") || !strings.Contains(file, "max_duration: 60s") {
		t.Fatalf("the example changed; shorten its durations here:\n%s", file)
	}
	g := runFile(t, "export.yaml", file, pipelineOpts{supervisors: 1, agents: 1, schedulers: 1,
		agentEnv: []string{"SAS_REMOTE_URL=" + srv.URL}, submitterEnv: []string{"SAS_STEP_TIMEOUT=0s"}}) // the file's timeouts
	p := g.pipeline
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: testenv.AMQPURL(), QueuePrefix: p.topo.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// The heartbeat orders go in a second wave, once every order of the
	// first has been called: claimed on a drained pipeline, their calls
	// come early in their attempts even on a loaded machine.
	const orders, heartbeats = 300, 40
	heartbeat := map[string]bool{}
	replayed := map[string]bool{}
	wave1, wave2 := make([]string, orders-heartbeats), make([]string, heartbeats)
	for i := range wave1 {
		wave1[i] = messages.NewID()
		if i < 20 {
			replayed[wave1[i]] = true
		}
	}
	for i := range wave2 {
		wave2[i] = messages.NewID()
		heartbeat[wave2[i]] = true
	}
	result := func(id string, attempt int) map[string]any {
		return map[string]any{"file": "export-" + id, "attempt": attempt}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var refusedIDs []string // callbacks that must come back refused, stale_token
	var errs []string
	fail := func(format string, args ...any) {
		mu.Lock()
		errs = append(errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	complete := func(id, token string, attempt int) {
		if _, err := c.Complete(ctx, token, result(id, attempt)); err != nil {
			fail("complete %s: %v", id, err)
		}
	}
	// timeLeft: whether an order's running attempt has at least d
	// before its complete_by, by the database's clock.
	timeLeft := func(id string, d time.Duration) bool {
		var ok bool
		err := p.pool.QueryRow(ctx, `SELECT coalesce(bool_and(complete_by - clock_timestamp() >= $2::interval), false)
			FROM steps WHERE order_id = $1 AND name = 'build_export' AND process_state = 'processing'`, id, d.String()).Scan(&ok)
		if err != nil {
			fail("read the attempt of %s: %v", id, err)
		}
		return ok
	}
	late := 0 // heartbeat orders called too late in their attempt to hold it
	// serve answers each call as the test decides. A call again after
	// an attempt ran out (on a loaded machine an attempt can run out
	// between its claim and its call) is completed with its own token.
	serve := func(id string) {
		tokens := svc.tokensOf(id)
		n := len(tokens)
		switch {
		case heartbeat[id] && n == 1 && !timeLeft(id, 4*time.Second):
			// The call came so late in its attempt (on a loaded
			// machine) that no heartbeat could reach the store in
			// time: served as any other order, and not counted among
			// the heartbeat orders.
			delete(heartbeat, id)
			late++
			wg.Go(func() { complete(id, tokens[0], 1) })
		case heartbeat[id] && n == 1:
			// Hold the step past its timeout with a heartbeat at once
			// and every 2 s after, then complete.
			wg.Go(func() {
				tick := time.NewTicker(2 * time.Second)
				defer tick.Stop()
				for i := range 8 {
					if i > 0 {
						<-tick.C
					}
					if _, err := c.Heartbeat(ctx, tokens[0]); err != nil {
						fail("heartbeat %s: %v", id, err)
					}
				}
				complete(id, tokens[0], 1)
			})
		case replayed[id] && n == 1:
			// Say nothing: the attempt runs out and the step is called
			// again.
		case replayed[id] && n == 2:
			wg.Go(func() {
				cbID, err := c.Complete(ctx, tokens[0], map[string]any{"file": "stale"})
				if err != nil {
					fail("replay %s: %v", id, err)
				}
				mu.Lock()
				refusedIDs = append(refusedIDs, cbID)
				mu.Unlock()
				complete(id, tokens[1], 2)
			})
		default:
			wg.Go(func() { complete(id, tokens[n-1], n) })
		}
	}
	stopServing := make(chan struct{})
	var serving sync.WaitGroup
	serving.Go(func() {
		for {
			select {
			case id := <-svc.calls:
				serve(id)
			case <-stopServing:
				return
			}
		}
	})
	start := time.Now()
	g.submitIDs(t, "export", wave1, slices.Repeat([]string{`{}`}, len(wave1)))
	testenv.Eventually(t, 2*time.Minute, "every order of the first wave to be called", func() bool {
		for _, id := range wave1 {
			if len(svc.tokensOf(id)) == 0 {
				return false
			}
		}
		return true
	})
	g.submitIDs(t, "export", wave2, slices.Repeat([]string{`{}`}, heartbeats))
	ids := append(wave1, wave2...)
	testenv.Eventually(t, 2*time.Minute, "every step to be called (the replayed ones twice)", func() bool {
		for _, id := range ids {
			if n := len(svc.tokensOf(id)); n == 0 || replayed[id] && n < 2 {
				return false
			}
		}
		return true
	})
	t.Logf("every step called (the replayed ones twice) %v after the submits", time.Since(start).Round(time.Millisecond))
	// A forged token: refused and told.
	forged := strings.Replace(svc.tokensOf(ids[100])[0], ".1.1.", ".2.1.", 1)
	forgedID, err := c.Complete(ctx, forged, map[string]any{"file": "forged"})
	if err != nil {
		t.Fatal(err)
	}
	p.waitTerminal(t, ids, 3*time.Minute)
	t.Logf("every order ended %v after the submits", time.Since(start).Round(time.Millisecond))
	close(stopServing)
	serving.Wait()
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d callbacks not sent: %v", len(errs), errs[:min(5, len(errs))])
	}
	// The service here is the test's, not the demo's: its calls are
	// counted here, the orders read from the store.
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != orders {
		var why []string
		rows, _ := p.pool.Query(ctx, `SELECT o.order_id::text || ': ' || o.status || ' ' || coalesce(s.last_error, '') FROM orders o
			JOIN steps s ON s.order_id = o.order_id AND s.step = 1 WHERE o.order_id = ANY($1::uuid[]) AND o.status <> 'completed' LIMIT 5`, ids)
		for rows.Next() {
			var w string
			_ = rows.Scan(&w)
			why = append(why, fmt.Sprintf("%s (heartbeats %v, replayed %v)", w, heartbeat[w[:36]], replayed[w[:36]]))
		}
		rows.Close()
		t.Fatalf("%d of %d orders completed; for example:\n%s", n, orders, strings.Join(why, "\n"))
	}
	// Every step's result is its valid callback's, from its last call:
	// the heartbeat orders' from their only call, the replayed ones' from
	// their second.
	again := 0
	for _, id := range ids {
		calls := len(svc.tokensOf(id))
		switch {
		case heartbeat[id] && calls != 1:
			t.Fatalf("order %s: its heartbeats did not hold its step; called %d times", id, calls)
		case replayed[id] && calls < 2:
			t.Fatalf("order %s: its first attempt ran out but it was called %d times", id, calls)
		case !replayed[id] && calls > 1:
			again++
		}
		var res string
		var attempt int
		if err := p.pool.QueryRow(ctx, `SELECT result::text, attempt FROM steps WHERE order_id = $1 AND name = 'build_export'`, id).
			Scan(&res, &attempt); err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		_ = json.Unmarshal([]byte(res), &got)
		if got["file"] != "export-"+id || got["attempt"] != float64(calls) || attempt != calls {
			t.Fatalf("order %s (replayed %v, heartbeats %v): result %s at attempt %d, want attempt %d", id, replayed[id], heartbeat[id], res, attempt, calls)
		}
	}
	t.Logf("%d other orders were called again after an attempt ran out; %d heartbeat orders were called too late to hold their attempt", again, late)
	if len(heartbeat) < 20 {
		t.Fatalf("only %d of 40 heartbeat orders were called in time to hold their attempt", len(heartbeat))
	}
	// The heartbeats held their steps past the first timeout.
	var held int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM steps s WHERE s.order_id = ANY($1::uuid[]) AND s.name = 'build_export'
		AND s.attempt = 1 AND s.held_attempt = 1
		AND (SELECT max(at) FROM transitions x WHERE x.order_id = s.order_id AND x.step = s.step AND x.to_state = 'processed')
		    > s.held_since + interval '4 seconds'`, keysOf(heartbeat)).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != len(heartbeat) {
		t.Fatalf("%d of %d heartbeat steps ended on their first attempt more than 11 s after their 202", held, len(heartbeat))
	}
	// Each refusal came back to the client with its reason.
	testenv.Eventually(t, 30*time.Second, "the refusals to come back", func() bool {
		for _, id := range append(slices.Clone(refusedIDs), forgedID) {
			if c.SignalRefusal(id) == nil {
				return false
			}
		}
		return true
	})
	for _, id := range refusedIDs {
		if r := c.SignalRefusal(id); r.Reason != "stale_token" {
			t.Fatalf("a replayed token was refused with %q (%s), want stale_token", r.Reason, r.Detail)
		}
	}
	if r := c.SignalRefusal(forgedID); r.Reason != "invalid_token" {
		t.Fatalf("a forged token was refused with %q (%s), want invalid_token", r.Reason, r.Detail)
	}
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND (result::text LIKE '%stale%' OR result::text LIKE '%forged%')`, ids); n != 0 {
		t.Fatalf("%d steps took a refused callback's result", n)
	}
	if len(refusedIDs) != len(replayed) {
		t.Fatalf("%d replays sent, want %d", len(refusedIDs), len(replayed))
	}
	// One callback kept per step (the replays and the forgery were not).
	if n := p.count(t, `SELECT count(*) FROM signals WHERE order_id = ANY($1::uuid[])`, ids); n != orders {
		t.Fatalf("%d callbacks kept, want %d", n, orders)
	}
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
