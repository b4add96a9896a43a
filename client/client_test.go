package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/client"
	"sas/internal/harness/netproxy"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

func demoOrder(i int) client.Order {
	return client.Order{Workflow: "single", Payload: map[string]any{
		"customer": fmt.Sprintf("customer %d", i), "items": []map[string]any{{"sku": "SKU-1", "qty": 1}}, "amount": i, "currency": "EUR"}}
}

func connect(t *testing.T, amqpURL string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: amqpURL, QueuePrefix: os.Getenv("SAS_QUEUE_PREFIX"), ReplyQueueTTL: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSubmitAndAwaitAcrossAConnectionCut: 1,000 orders submitted and
// awaited through a proxy whose connections are cut twice on the way:
// every order is submitted once (no repeat makes a second order), every
// one completes, and every Await returns it.
func TestSubmitAndAwaitAcrossAConnectionCut(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(os.Getenv("SAS_AMQP_URL"))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := netproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	u.Host = proxy.Addr()
	c := connect(t, u.String())

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const n = 1000
	ids := make([]string, n)
	var submitted atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id, err := c.Submit(ctx, demoOrder(i))
			if err != nil {
				errs <- err
				return
			}
			ids[i] = id
			submitted.Add(1)
		})
		if i == n/3 || i == 2*n/3 {
			if severed := proxy.Sever(); severed == 0 {
				t.Fatal("no connection to cut")
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ended := map[string]int{}
	for _, id := range ids {
		st, err := c.Await(ctx, id)
		if err != nil {
			t.Fatalf("await %s: %v", id, err)
		}
		ended[st.Status]++
	}
	if ended["completed"] != n {
		t.Fatalf("outcomes %v", ended)
	}
	pool, err := statestore.Connect(ctx, os.Getenv("SAS_TEST_CLIENT_DATABASE_URL"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, ids).Scan(&rows); err != nil || rows != n {
		t.Fatalf("%d orders in the store (%v), want %d", rows, err, n)
	}
}

// TestTwoClientsGetOnlyTheirOwnEvents: each client's reply queue receives
// the events of its own orders only.
func TestTwoClientsGetOnlyTheirOwnEvents(t *testing.T) {
	t.Parallel()
	a, b := connect(t, os.Getenv("SAS_AMQP_URL")), connect(t, os.Getenv("SAS_AMQP_URL"))
	if a.ReplyQueue() == b.ReplyQueue() {
		t.Fatal("two clients share a reply queue")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var aIDs, bIDs []string
	for i := range 20 {
		id, err := a.Submit(ctx, demoOrder(i))
		if err != nil {
			t.Fatal(err)
		}
		aIDs = append(aIDs, id)
		if id, err = b.Submit(ctx, demoOrder(i)); err != nil {
			t.Fatal(err)
		}
		bIDs = append(bIDs, id)
	}
	for i := range aIDs {
		if st, err := a.Await(ctx, aIDs[i]); err != nil || st.Status != "completed" {
			t.Fatalf("a: %+v %v", st, err)
		}
		if st, err := b.Await(ctx, bIDs[i]); err != nil || st.Status != "completed" {
			t.Fatalf("b: %+v %v", st, err)
		}
	}
	// What a received of b's orders: nothing, so watching one waits.
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	for st := range a.Watch(short, bIDs[0]) {
		t.Fatalf("client a got an event of client b's order: %+v", st)
	}
	// And each has every event of its own: received, processing, completed.
	var seen []string
	for st := range b.Watch(ctx, bIDs[3]) {
		seen = append(seen, st.Status)
	}
	if strings.Join(seen, ",") != "received,processing,completed" {
		t.Fatalf("b's events of its order: %v", seen)
	}
}

// TestRejectedSubmitsAreReported: a submit of an unknown workflow, and one
// whose payload breaks its workflow's schema, come back as a
// *RejectedError with the dead letter's reason and detail.
func TestRejectedSubmitsAreReported(t *testing.T) {
	t.Parallel()
	c := connect(t, os.Getenv("SAS_AMQP_URL"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var good []string
	for i, tc := range []struct {
		order          client.Order
		reason, detail string
	}{
		{client.Order{Workflow: "teleport", Payload: map[string]any{}}, "unknown_workflow", `workflow "teleport" is not defined`},
		{client.Order{Workflow: "order", Payload: map[string]any{"customer": "c", "items": []any{}, "amount": 1, "currency": "EUR"}},
			"invalid_payload", "at /items:"},
	} {
		// A valid order before each bad one completes all the same.
		id, err := c.Submit(ctx, demoOrder(i))
		if err != nil {
			t.Fatal(err)
		}
		good = append(good, id)
		id, err = c.Submit(ctx, tc.order)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Await(ctx, id)
		var rej *client.RejectedError
		if !errors.As(err, &rej) || rej.OrderID != id || rej.Reason != tc.reason || !strings.HasPrefix(rej.Detail, tc.detail) {
			t.Fatalf("%s: %v, want rejected with %s: %s…", tc.order.Workflow, err, tc.reason, tc.detail)
		}
	}
	for _, id := range good {
		if st, err := c.Await(ctx, id); err != nil || st.Status != "completed" {
			t.Fatalf("valid order %s among the bad ones: %+v %v", id, st, err)
		}
	}
	// A payload that cannot be an object, or is too large, is refused
	// before it is sent.
	if _, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: []int{1}}); err == nil {
		t.Fatal("an array payload was submitted")
	}
	if _, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: map[string]any{"note": strings.Repeat("x", 40000)}}); err == nil ||
		!strings.Contains(err.Error(), "limit 32768") {
		t.Fatalf("an oversized payload: %v", err)
	}
}

// TestExampleProgramSubmitsAHundredOrders runs examples/submit100 against
// the stack.
func TestExampleProgramSubmitsAHundredOrders(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "run", "-trimpath", "../examples/submit100").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "100 completed, 0 failed, 0 held in error, 0 not known") {
		t.Fatalf("submit100: %v\n%s", err, out)
	}
}

// TestAnotherModuleUsesTheClient builds and runs examples/ownmodule, a
// module of its own that requires sas and replaces it with this checkout,
// as an application's module does, against the stack.
func TestAnotherModuleUsesTheClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "-trimpath", ".")
	cmd.Dir = "../examples/ownmodule"
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`^order [0-9a-f-]{36} completed\n$`).Match(out) {
		t.Fatalf("examples/ownmodule: %v\n%s", err, out)
	}
}

// TestEveryRefusalReachesItsSender: a refusal whose detail quotes a
// 3,000-byte value still reaches Await, bounded; a payload holding a NUL
// is refused by Submit before it is sent, and, posted by another
// program, refused by the submitter with a "rejected" event to its
// reply_to; and Await answers for the submission it was given: an id
// submitted again with other content is a conflict, even right after the
// first order completed, and an id refused once and submitted again
// corrected completes.
func TestEveryRefusalReachesItsSender(t *testing.T) {
	t.Parallel()
	c := connect(t, os.Getenv("SAS_AMQP_URL"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rej *client.RejectedError

	// (a) A detail over the status event's limit is bounded where made.
	long := demoOrder(1)
	long.Workflow = "order"
	long.Payload.(map[string]any)["currency"] = strings.Repeat("x", 3000)
	id, err := c.Submit(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Await(ctx, id); !errors.As(err, &rej) || rej.Reason != "invalid_payload" || !strings.HasPrefix(rej.Detail, "at /currency") ||
		len(rej.Detail) > 2000 {
		t.Fatalf("a refusal quoting 3,000 bytes: %v (detail %d bytes)", err, len(rej.Detail))
	}

	// (b) A NUL: refused before sending by the client...
	nul := demoOrder(2)
	nul.Payload.(map[string]any)["customer"] = "a\x00b"
	if _, err := c.Submit(ctx, nul); err == nil || !strings.Contains(err.Error(), "invalid_encoding") {
		t.Fatalf("a payload with a NUL: Submit said %v", err)
	}
	// ... and, posted by another program naming this reply queue, by the
	// submitter, which tells the queue.
	conn, err := amqp.Dial(os.Getenv("SAS_AMQP_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	raw := messages.NewID()
	body := fmt.Sprintf(`{"schema_version":2,"order_id":%q,"workflow":"single","reply_to":%q,"payload":{"customer":"a\u0000b","items":[{"sku":"S","qty":1}],"amount":1,"currency":"EUR"}}`,
		raw, c.ReplyQueue())
	if err := ch.PublishWithContext(ctx, "", os.Getenv("SAS_QUEUE_PREFIX")+"submit", false, false,
		amqp.Publishing{ContentType: "application/json", MessageId: raw, Body: []byte(body)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Await(ctx, raw); !errors.As(err, &rej) || rej.Reason != "invalid_encoding" {
		t.Fatalf("a NUL posted by another program: Await said %v", err)
	}

	// (c) The same id with other content, right after the first order
	// completed: the conflict, not the first order's outcome.
	first := demoOrder(3)
	id, err = c.Submit(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Await(ctx, id); err != nil || st.Status != "completed" {
		t.Fatalf("the first order: %+v %v", st, err)
	}
	other := demoOrder(4)
	other.ID = id
	if _, err := c.Submit(ctx, other); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Await(ctx, id); !errors.As(err, &rej) || rej.Reason != "conflict" {
		t.Fatalf("the same id with other content: Await said %+v %v, want the conflict", st, err)
	}
	// The first content again is the first order: its outcome.
	first.ID = id
	if _, err := c.Submit(ctx, first); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Await(ctx, id); err != nil || st.Status != "completed" {
		t.Fatalf("the first content again: %+v %v", st, err)
	}
	// Refused, then corrected: the corrected order's outcome, not the old
	// refusal.
	bad := client.Order{ID: messages.NewID(), Workflow: "teleport", Payload: map[string]any{"customer": "c"}}
	if _, err := c.Submit(ctx, bad); err != nil {
		t.Fatal(err)
	}
	good := demoOrder(5)
	good.ID = bad.ID
	if _, err := c.Submit(ctx, good); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Await(ctx, bad.ID); err != nil || st.Status != "completed" {
		t.Fatalf("refused, then corrected: %+v %v", st, err)
	}
}

// TestSignalRefusalsReachTheClient: a signal for an order that has
// ended is refused; the refusal comes back to the client that sent it,
// and says nothing of the order itself.
func TestSignalRefusalsReachTheClient(t *testing.T) {
	t.Parallel()
	c := connect(t, os.Getenv("SAS_AMQP_URL"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := c.Submit(ctx, demoOrder(0))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Await(ctx, id); err != nil || st.Status != "completed" {
		t.Fatalf("the order: %+v %v", st, err)
	}
	sigID, err := c.Signal(ctx, id, "approved", map[string]any{"by": "ann"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the signal's refusal", func() bool { return c.SignalRefusal(sigID) != nil })
	if rej := c.SignalRefusal(sigID); rej.OrderID != id || rej.Reason != "order_ended" || !strings.Contains(rej.Detail, "is completed") {
		t.Fatalf("refusal %+v, want order_ended: the order is completed", rej)
	}
	if st, err := c.Await(ctx, id); err != nil || st.Status != "completed" {
		t.Fatalf("the order after a refused signal: %+v %v", st, err)
	}
	if _, err := c.Signal(ctx, "not-an-id", "approved", nil); err == nil {
		t.Fatal("a signal for no order id was sent")
	}
}
