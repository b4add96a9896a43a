package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/contract"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/secrets"
	"sas/internal/service"
)

// syncBuffer is a log sink several goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// seen is what a service was called with.
type seen struct {
	path    string
	header  http.Header
	request contract.Request
}

func recorder(calls chan<- seen, answer string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req contract.Request
		_ = json.Unmarshal(body, &req)
		calls <- seen{path: r.URL.Path, header: r.Header.Clone(), request: req}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer))
	}
}

// TestEachKindCallsItsOwnService: one agent process serves two kinds,
// each at its own service: one over TLS with a CA file, a path of its own
// for its action and headers from a file; the other over HTTP with
// headers from a variable. Every call carries the contract's headers and
// the request's payload and results; no log line shows a header's value.
func TestEachKindCallsItsOwnService(t *testing.T) {
	// Not parallel: t.Setenv sets the variable the headers come from.
	alphaCalls, betaCalls := make(chan seen, 4), make(chan seen, 4)
	alpha := httptest.NewTLSServer(recorder(alphaCalls, `{"alpha":"done"}`))
	t.Cleanup(alpha.Close)
	beta := httptest.NewServer(recorder(betaCalls, `{"beta":"done"}`))
	t.Cleanup(beta.Close)

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: alpha.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	const alphaToken, betaToken = "Bearer alpha-Top/Secret#1", "beta-key-Xy9@Qz"
	headersFile := filepath.Join(dir, "alpha.headers")
	if err := os.WriteFile(headersFile, []byte("# credentials\nAuthorization: "+alphaToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envVar := "SAS_TEST_BETA_HEADERS_" + testenv.RandomSuffix(6)
	t.Setenv(envVar, "X-Api-Key: "+betaToken)
	endpoints := filepath.Join(dir, "endpoints.yaml")
	if err := os.WriteFile(endpoints, []byte(fmt.Sprintf(`endpoints:
  alpha:
    url: %s/api
    paths: {open_account: /accounts/open}
    headers_file: %s
    ca_file: %s
    timeout: 2s
  beta:
    url: %s
    headers_env: %s
`, alpha.URL, headersFile, caFile, beta.URL, envVar)), 0o600); err != nil {
		t.Fatal(err)
	}

	prefix := testenv.Prefix(t)
	topo := broker.Topology{Prefix: prefix, DeliveryLimit: 10,
		Inputs: []string{messages.RepliesQueue, messages.RequestsQueue("alpha"), messages.RequestsQueue("beta")}}
	testenv.Broker(t, topo)
	var logs syncBuffer
	logger, err := service.NewLogger(&logs, "debug", secrets.New())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Common: service.Common{AMQPURL: testenv.AMQPURL(), QueuePrefix: prefix, DeliveryLimit: 10, ShutdownTimeout: 5 * time.Second},
		MetricsAddr: "127.0.0.1:0", Kinds: []string{"alpha", "beta"}, Concurrency: 4, Prefetch: 4, RemoteURL: "http://127.0.0.1:1",
		EndpointsFile: endpoints, CallTimeout: time.Second, SafetyMargin: 10 * time.Millisecond, RetryBase: 10 * time.Millisecond,
		RetryMax: 100 * time.Millisecond, BreakerFailures: 5, BreakerOpenFor: time.Second, MaxResponseBytes: 1 << 14}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})

	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	id := messages.NewID()
	completeBy := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	send := func(kind, action string, step, attempt int) {
		body, err := messages.Encode(messages.StepRequest{SchemaVersion: messages.StepRequestVersion, OrderID: id, Step: step, Name: action,
			Agent: kind, Attempt: attempt, IdempotencyKey: fmt.Sprintf("%s/%d/%s", id, step, action), CompleteBy: completeBy,
			Payload: json.RawMessage(`{"tenant":"acme"}`), Results: json.RawMessage(`{"earlier":{"id":7}}`)})
		if err != nil {
			t.Fatal(err)
		}
		// Published with a confirm, and again until one comes: a quorum
		// queue just declared on a busy broker may refuse a message, which
		// a publish without a confirm would lose without a word.
		testenv.Eventually(t, 30*time.Second, "the request to "+kind+" confirmed", func() bool {
			ch, err := conn.Channel()
			if err != nil {
				return false
			}
			defer ch.Close()
			if err := ch.Confirm(false); err != nil {
				return false
			}
			returned := ch.NotifyReturn(make(chan amqp.Return, 1))
			dc, err := ch.PublishWithDeferredConfirm("", topo.Queue(messages.RequestsQueue(kind)), true, false,
				amqp.Publishing{ContentType: messages.ContentType, Type: messages.TypeStepRequest, Body: body})
			if err != nil {
				return false
			}
			acked := dc.Wait()
			select {
			case <-returned:
				return false // the queue is not there yet
			default:
			}
			return acked
		})
	}
	send("alpha", "open_account", 1, 3)
	send("beta", "notify", 2, 1)

	got := func(calls chan seen) seen {
		select {
		case s := <-calls:
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("no call; logs:\n%s", logs.String())
		}
		return seen{}
	}
	a, b := got(alphaCalls), got(betaCalls)
	if a.path != "/api/accounts/open" || a.header.Get("Authorization") != alphaToken || a.header.Get(contract.HeaderAttempt) != "3" ||
		a.header.Get(contract.HeaderIdempotencyKey) != id+"/1/open_account" || a.request.Action != "open_account" {
		t.Fatalf("alpha was called %+v", a)
	}
	if by, err := contract.ParseCompleteBy(a.header.Get(contract.HeaderCompleteBy)); err != nil || !by.Equal(completeBy) {
		t.Fatalf("alpha's deadline header %q (%v), want %v", a.header.Get(contract.HeaderCompleteBy), err, completeBy)
	}
	if b.path != "/v1/notify" || b.header.Get("X-Api-Key") != betaToken || b.header.Get("Authorization") != "" ||
		string(b.request.Payload) != `{"tenant":"acme"}` || string(b.request.Results) != `{"earlier":{"id":7}}` {
		t.Fatalf("beta was called %+v (payload %s, results %s)", b, b.request.Payload, b.request.Results)
	}
	// Both replies come back ok with their service's answer.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(topo.Queue(messages.RepliesQueue), "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	results := map[int]string{}
	for len(results) < 2 {
		select {
		case d := <-msgs:
			r, err := messages.DecodeStepReply(d.Body)
			if err != nil || r.Outcome != messages.OutcomeOK {
				t.Fatalf("reply %s: %v", d.Body, err)
			}
			results[r.Step] = string(r.Result)
		case <-time.After(30 * time.Second):
			t.Fatalf("replies %v; logs:\n%s", results, logs.String())
		}
	}
	if results[1] != `{"alpha":"done"}` || results[2] != `{"beta":"done"}` {
		t.Fatalf("results %v", results)
	}
	for _, secret := range []string{"alpha-Top/Secret#1", betaToken} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("a log line shows %q", secret)
		}
	}
	if !strings.Contains(logs.String(), "agent kind served") {
		t.Fatalf("the agent did not say where each kind goes:\n%s", logs.String())
	}
}

// TestEndpointsFileMistakesAreRefused: an agent does not start with an
// endpoints file it cannot follow, and says where the mistake is.
func TestEndpointsFileMistakesAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct{ file, want string }{
		{"endpoints:\n  alpha: {url: ftp://x}\n", "url must be http"},
		{"endpoints:\n  alpha: {url: 'http://user:pw@x'}\n", "no credentials"},
		{"endpoints:\n  alpha: {url: http://x, timout: 2s}\n", "timout"},
		{"endpoints:\n  gamma: {url: http://x}\n", "does not serve kind \"gamma\""},
		{"endpoints:\n  alpha: {url: http://x, headers_env: SAS_TEST_NO_SUCH_VARIABLE}\n", "is not set"},
		{"endpoints:\n  alpha: {url: http://x, paths: {a: nope}}\n", "must start with /"},
	} {
		path := filepath.Join(dir, testenv.RandomSuffix(6)+".yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := loadEndpoints(Config{Kinds: []string{"alpha"}, EndpointsFile: path, RemoteURL: "http://127.0.0.1:9105", CallTimeout: time.Second})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.file, err, tc.want)
		}
	}
}
