package scheduler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// countingReader is a depthReader that counts its reads.
type countingReader struct {
	ready int
	err   error
	reads int
}

func (r *countingReader) Ready(context.Context, string) (int, error) {
	r.reads++
	return r.ready, r.err
}

// A queue's depth is read from the broker at most every depthTTL; in
// between, what was sent since counts as still waiting.
func TestClaimerReadsQueueDepthsSparingly(t *testing.T) {
	t.Parallel()
	r := &countingReader{ready: 7}
	c := &claimer{depths: r, known: map[string]queueDepth{}, metrics: newMetrics(prometheus.NewRegistry())}
	ctx := context.Background()
	for range 5 {
		if n, err := c.ready(ctx, "inventory", "q", 10); err != nil || n != 7 {
			t.Fatalf("ready %d, %v; want 7", n, err)
		}
	}
	if r.reads != 1 {
		t.Fatalf("%d reads of the broker within %v, want 1", r.reads, depthTTL)
	}
	d := c.known["inventory"]
	d.sent += 3
	c.known["inventory"] = d
	if n, _ := c.ready(ctx, "inventory", "q", 10); n != 10 {
		t.Fatalf("ready %d after 3 sent, want 10", n)
	}
	// Another kind has its own reading.
	if n, _ := c.ready(ctx, "payment", "q2", 10); n != 7 || r.reads != 2 {
		t.Fatalf("another kind: ready %d after %d reads", n, r.reads)
	}
	// An old reading is read again.
	d = c.known["inventory"]
	d.at = d.at.Add(-depthTTL)
	c.known["inventory"] = d
	r.ready = 2
	if n, _ := c.ready(ctx, "inventory", "q", 10); n != 2 || r.reads != 3 {
		t.Fatalf("after %v: ready %d after %d reads, want 2 after 3", depthTTL, n, r.reads)
	}
	// A failed read is not remembered.
	r.err = errors.New("channel closed")
	d = c.known["inventory"]
	d.at = time.Now().Add(-depthTrust)
	c.known["inventory"] = d
	if _, err := c.ready(ctx, "inventory", "q", 10); err == nil {
		t.Fatal("a failed read gave a depth")
	}
	r.err = nil
	if n, _ := c.ready(ctx, "inventory", "q", 10); n != 2 || r.reads != 5 {
		t.Fatalf("after a failed read: ready %d after %d reads", n, r.reads)
	}
}

// A reading of a queue far below its limit stands for longer than
// depthTTL, up to depthTrust, until what was sent since brings it near a
// quarter of the limit.
func TestClaimerTrustsANearlyEmptyQueueLonger(t *testing.T) {
	t.Parallel()
	r := &countingReader{ready: 5}
	c := &claimer{depths: r, known: map[string]queueDepth{}, metrics: newMetrics(prometheus.NewRegistry())}
	ctx := context.Background()
	age := func(by time.Duration) {
		d := c.known["inventory"]
		d.at = time.Now().Add(-by)
		c.known["inventory"] = d
	}
	if n, err := c.ready(ctx, "inventory", "q", 100); err != nil || n != 5 || r.reads != 1 {
		t.Fatalf("ready %d after %d reads, %v", n, r.reads, err)
	}
	age(2 * depthTTL)
	if n, _ := c.ready(ctx, "inventory", "q", 100); n != 5 || r.reads != 1 {
		t.Fatalf("a reading of 5 of 100, %v old: ready %d after %d reads, want 5 after 1", 2*depthTTL, n, r.reads)
	}
	// The same reading, near its limit, is read again.
	if n, _ := c.ready(ctx, "inventory", "q", 12); n != 5 || r.reads != 2 {
		t.Fatalf("a reading of 5 of 12, %v old: %d reads, want 2", 2*depthTTL, r.reads)
	}
	// Sends since the reading count towards the quarter.
	age(2 * depthTTL)
	d := c.known["inventory"]
	d.sent = 21
	c.known["inventory"] = d
	r.ready = 3
	if n, _ := c.ready(ctx, "inventory", "q", 100); n != 3 || r.reads != 3 {
		t.Fatalf("5 + 21 sent of 100: ready %d after %d reads, want 3 after 3", n, r.reads)
	}
	// And no reading stands past depthTrust.
	age(depthTrust)
	if _, _ = c.ready(ctx, "inventory", "q", 100); r.reads != 4 {
		t.Fatalf("a reading %v old: %d reads, want 4", depthTrust, r.reads)
	}
}

// The replier claims next steps only of the kinds whose queue, by a
// recent reading and what was sent since, has room for a batch more.
func TestClaimerOpenKinds(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := &claimer{kinds: []string{"inventory", "payment", "shipping", "unread"}, maxQueued: 100, known: map[string]queueDepth{
		"inventory": {ready: 10, at: now},
		"payment":   {ready: 80, sent: 5, at: now},            // room 15
		"shipping":  {ready: 0, at: now.Add(-2 * handOffTTL)}, // too old
	}}
	if got := c.openKinds(20); len(got) != 1 || got[0] != "inventory" {
		t.Fatalf("open kinds %v, want [inventory]", got)
	}
	if got := c.openKinds(15); len(got) != 2 || got[1] != "payment" {
		t.Fatalf("open kinds for a margin of 15: %v, want [inventory payment]", got)
	}
	// A limited kind is never claimed with a reply: only a claim under
	// its limits takes its steps. A kind managed by keys alone is: its
	// unkeyed steps are bounded by nothing (the hand-off leaves keyed
	// steps pending).
	c.managed = map[string]bool{"payment": true}
	if got := c.openKinds(15); len(got) != 1 || got[0] != "inventory" {
		t.Fatalf("open kinds with payment limited: %v, want [inventory]", got)
	}
	c.managed = map[string]bool{"payment": false}
	if got := c.openKinds(15); len(got) != 2 || got[1] != "payment" {
		t.Fatalf("open kinds with payment keyed: %v, want [inventory payment]", got)
	}
	c.managed = nil
	for range 71 {
		c.countSent("inventory")
	}
	if got := c.openKinds(20); len(got) != 0 {
		t.Fatalf("open kinds after 71 more sent to inventory: %v, want none", got)
	}
}

// queueReader is a depthReader with a depth per queue.
type queueReader map[string]int

func (r queueReader) Ready(_ context.Context, queue string) (int, error) {
	n, ok := r[queue]
	if !ok {
		return 0, errors.New("no such queue")
	}
	return n, nil
}

// While the replies queue holds maxReplies or more, the claimer claims
// nothing (its store is nil here: a claim would panic) and says it was
// held back; below the limit, or with no limit, it goes on to the agent
// queues.
func TestClaimerStopsWhileRepliesWait(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{Prefix: "p."}
	replies := topo.Queue(messages.RepliesQueue)
	inventory := topo.Queue(messages.RequestsQueue("inventory"))
	newClaimer := func(depths queueReader, maxReplies int) *claimer {
		return &claimer{depths: depths, topo: topo, kinds: []string{"inventory"}, batch: 10, maxQueued: 100, maxReplies: maxReplies,
			known: map[string]queueDepth{}, logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
	}

	c := newClaimer(queueReader{replies: 500, inventory: 0}, 500)
	if soon, _ := c.drain(context.Background()); soon == 0 {
		t.Fatal("drain with 500 replies waiting (limit 500) was not held back")
	}
	if got := testutil.ToFloat64(c.metrics.repliesFull); got != 1 {
		t.Fatalf("sas_scheduler_throttled_by_replies_total = %v, want 1", got)
	}
	if _, ok := c.known[repliesKey]; !ok {
		t.Fatal("the replies queue's reading was not kept")
	}
	// An unreadable replies queue holds claims back too.
	c = newClaimer(queueReader{inventory: 0}, 500)
	if soon, _ := c.drain(context.Background()); soon == 0 {
		t.Fatal("drain with the replies queue unreadable was not held back")
	}

	// Below the limit, or with none, the agent queues decide: here every
	// one is full, so no claim is made either, but for that reason.
	for _, limit := range []int{501, 0} {
		c = newClaimer(queueReader{replies: 500, inventory: 100}, limit)
		if soon, _ := c.drain(context.Background()); soon == 0 {
			t.Fatalf("limit %d: drain with a full agent queue was not held back", limit)
		}
		if got := testutil.ToFloat64(c.metrics.repliesFull); got != 0 {
			t.Fatalf("limit %d: held back by the replies %v times, want 0", limit, got)
		}
		if got := testutil.ToFloat64(c.metrics.throttled.WithLabelValues("inventory")); got != 1 {
			t.Fatalf("limit %d: held back by the inventory queue %v times, want 1", limit, got)
		}
	}
}

// The relay is nudged after a claim only when the claim says the outbox
// may hold something: a round that finds it empty is a transaction for
// nothing.
func TestClaimerWakesTheRelayOnlyForEvents(t *testing.T) {
	t.Parallel()
	nudged := 0
	c := &claimer{wakeRelay: func() { nudged++ }}
	c.wakeRelayIfTold([]statestore.ClaimedStep{{OrderID: "a"}, {OrderID: "b"}})
	if nudged != 0 {
		t.Fatalf("nudged %d times for a claim that wrote no event", nudged)
	}
	c.wakeRelayIfTold([]statestore.ClaimedStep{{OrderID: "a"}, {OrderID: "b", Told: true}})
	if nudged != 1 {
		t.Fatalf("nudged %d times for a claim that wrote an event, want 1", nudged)
	}
}

// A claimer whose looks keep finding nothing waits longer between them,
// up to claimerIdleLongest intervals, and one interval again once woken
// or once it claims; backing off it never waits past the moment the
// earliest pending step becomes available, and a step available now
// that it did not claim is looked at again after one interval.
func TestClaimerAtRestLooksLessOften(t *testing.T) {
	t.Parallel()
	const poll = 500 * time.Millisecond
	w := idleWait{poll: poll}
	w.reset()
	var waits []time.Duration
	for range 5 {
		waits = append(waits, w.next(0, false))
		w.grow()
	}
	want := []time.Duration{poll, 2 * poll, 4 * poll, 8 * poll, 8 * poll}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if d := w.next(1500*time.Millisecond, true); d != 1500*time.Millisecond {
		t.Fatalf("with a step available in 1.5 s the claimer waits %v", d)
	}
	if d := w.next(time.Minute, true); d != 8*poll {
		t.Fatalf("with a step available in a minute the claimer waits %v, want %v", d, 8*poll)
	}
	if d := w.next(-time.Second, true); d != poll {
		t.Fatalf("with a step available and not claimed the claimer waits %v, want %v", d, poll)
	}
	if d := w.next(time.Microsecond, true); d != minLimitRecheck {
		t.Fatalf("with a step available in 1 µs the claimer waits %v, want %v", d, minLimitRecheck)
	}
	w.reset()
	if d := w.next(time.Minute, true); d != poll {
		t.Fatalf("once woken the claimer waits %v, want %v", d, poll)
	}
}
