package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
)

// The live-work gauges are read from the store at most every
// StatsInterval, however often the sweeps run.
func TestReportEveryStatsInterval(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	store := statestore.New(pool)
	ctx := context.Background()
	addOrder := func() {
		t.Helper()
		id := messages.NewID()
		h := sha256.Sum256([]byte(id))
		o := statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{"customer":"c"}`), PayloadHash: h[:], Actor: "test", FailurePolicy: statestore.PolicyHold,
			Steps: []statestore.NewStep{{Name: "s", Agent: "a", Timeout: time.Minute, MaxFailures: 3}}}
		if _, err := store.InsertOrder(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	pending := func(s *sweeper) float64 {
		return testutil.ToFloat64(s.metrics.steps.WithLabelValues(statestore.StepPending))
	}
	newSweeper := func(every time.Duration) *sweeper {
		return &sweeper{store: store, cfg: Config{StatsInterval: every}, me: "test",
			logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
	}
	slow, fast := newSweeper(time.Hour), newSweeper(0)
	addOrder()
	slow.report(ctx)
	fast.report(ctx)
	if pending(slow) != 1 || pending(fast) != 1 {
		t.Fatalf("first reading: %v and %v pending, want 1", pending(slow), pending(fast))
	}
	addOrder()
	slow.report(ctx)
	fast.report(ctx)
	if pending(slow) != 1 {
		t.Fatalf("read again within the interval: %v pending", pending(slow))
	}
	if pending(fast) != 2 {
		t.Fatalf("with no interval: %v pending, want 2", pending(fast))
	}
}

// logSink is a log the sweeper's goroutines write to while the test reads.
type logSink struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A leader whose store goes away for a moment (a restart, a cut
// connection) fires the timers that fell due meanwhile as soon as the
// store is back, not at its next lease renewal: the failed renewal does
// not make it give up, and its firing, fenced by the lease, is retried
// at once.
func TestTimersFireAsSoonAsTheStoreIsBack(t *testing.T) {
	t.Parallel()
	dbURL, pool := testenv.Database(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	proxied, proxy := testenv.Proxied(t, dbURL)
	through, err := pgxpool.New(ctx, proxied)
	if err != nil {
		t.Fatal(err)
	}
	defer through.Close()
	direct := statestore.New(pool)
	var logs logSink
	s := &sweeper{store: statestore.New(through), me: "test",
		cfg:     Config{Interval: 3 * time.Second, LeaseTTL: time.Hour, TimerPoll: 200 * time.Millisecond, Batch: 100, StatsInterval: time.Hour},
		logger:  slog.New(slog.NewTextHandler(&logs, nil)),
		metrics: newMetrics(prometheus.NewRegistry())}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the sweeper's log:\n%s", logs.String())
		}
	})
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testenv.Eventually(t, 10*time.Second, "the sweeper to lead", func() bool { return s.lead.Load() })

	proxy.SetDown(true)
	testenv.Eventually(t, 10*time.Second, "a lease renewal to fail", func() bool {
		return strings.Contains(logs.String(), "lease renewal failed")
	})
	// Far enough ahead that the insert comes before it on a loaded
	// machine: an order inserted after its start_at starts at once, with
	// no timer to fall due (it took more than 200 ms under make test).
	id, _ := startingIn(t, pool, direct, time.Second)
	testenv.Eventually(t, 10*time.Second, "the timer to fall due", func() bool {
		d, ok, err := direct.NextTimer(ctx)
		return err == nil && ok && d <= 0
	})
	proxy.SetDown(false)
	back := time.Now()
	testenv.Eventually(t, 10*time.Second, "the timer to fire", func() bool {
		var state string
		return pool.QueryRow(ctx, `SELECT process_state FROM steps WHERE order_id = $1`, id).Scan(&state) == nil && state != statestore.StepDelayed
	})
	if took := time.Since(back); took > time.Second {
		t.Fatalf("the timer fired %v after the store came back, want within a second (the lease renews every %v)\n%s", took, s.cfg.Interval, logs.String())
	}
}

// The limited kinds' gauges say each kind's limits and use, and the keys
// with the most work theirs; a kind whose limits are gone leaves them.
func TestReportLimitsAndKeys(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	store := statestore.New(pool)
	ctx := context.Background()
	rate, maxInFlight := 50.0, 2
	if err := store.SyncLimits(ctx, []string{"pay"}, map[string]statestore.Limits{"pay": {Rate: &rate, MaxInFlight: &maxInFlight}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		id := messages.NewID()
		h := sha256.Sum256([]byte(id))
		o := statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{}`), PayloadHash: h[:], Actor: "test", FailurePolicy: statestore.PolicyHold,
			Steps: []statestore.NewStep{{Name: "s", Agent: "pay", Timeout: time.Minute, MaxFailures: 3}}}
		if i < 3 {
			o.Key = &statestore.ConcurrencyKey{Key: "tenant-a"}
		}
		if _, err := store.InsertOrder(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	s := &sweeper{store: store, cfg: Config{}, me: "test", logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
	s.report(ctx)
	m := s.metrics
	if got := []float64{testutil.ToFloat64(m.limitRate.WithLabelValues("pay")), testutil.ToFloat64(m.limitMaxInFlight.WithLabelValues("pay")),
		testutil.ToFloat64(m.limitWaiting.WithLabelValues("pay")), testutil.ToFloat64(m.keyWaiting.WithLabelValues("pay", "default", "tenant-a"))}; got[0] != 50 || got[1] != 2 || got[2] != 5 || got[3] != 3 {
		t.Fatalf("rate, max_in_flight, waiting, tenant-a waiting = %v, want [50 2 5 3]", got)
	}
	// A namespace's own limits on the kind, and its key, are its own.
	if _, err := store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	one := 1
	if _, err := store.SetNamespaceLimits(ctx, "team-a", "pay", statestore.LimitChange{MaxInFlight: &one}, ""); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		id := messages.NewID()
		h := sha256.Sum256([]byte(id))
		if _, err := store.InsertOrder(ctx, statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{}`), PayloadHash: h[:], Actor: "test",
			FailurePolicy: statestore.PolicyHold, Namespace: "team-a", Key: &statestore.ConcurrencyKey{Key: "tenant-a"},
			Steps: []statestore.NewStep{{Name: "s", Agent: "pay", Timeout: time.Minute, MaxFailures: 3}}}); err != nil {
			t.Fatal(err)
		}
	}
	s.report(ctx)
	if got := []float64{testutil.ToFloat64(m.nsLimitMaxInFlight.WithLabelValues("pay", "team-a")), testutil.ToFloat64(m.nsLimitWaiting.WithLabelValues("pay", "team-a")),
		testutil.ToFloat64(m.keyWaiting.WithLabelValues("pay", "team-a", "tenant-a")), testutil.ToFloat64(m.keyWaiting.WithLabelValues("pay", "default", "tenant-a"))}; got[0] != 1 || got[1] != 2 || got[2] != 2 || got[3] != 3 {
		t.Fatalf("team-a's max_in_flight, waiting, its key's waiting, default's key's waiting = %v, want [1 2 2 3]", got)
	}
	if err := store.ResetNamespaceLimits(ctx, "team-a", "pay", ""); err != nil {
		t.Fatal(err)
	}
	if err := store.SyncLimits(ctx, []string{"pay"}, nil); err != nil {
		t.Fatal(err)
	}
	s.report(ctx)
	if n := testutil.CollectAndCount(m.nsLimitMaxInFlight); n != 0 {
		t.Fatalf("%d namespace max_in_flight series once its limits are gone", n)
	}
	if n := testutil.CollectAndCount(m.limitRate); n != 0 {
		t.Fatalf("%d rate series once the limits are gone", n)
	}
}

// A leader's timer loop sleeps until its earliest timer, however far off
// (here the whole TimerPoll, an hour, with none waiting), and a timer set
// meanwhile for sooner wakes it through ChannelTimers: the timer fires at
// its due time, not at the next poll.
func TestTimersFireWhenToldWhileTheLoopSleeps(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store := statestore.New(pool)
	s := &sweeper{store: store, me: "test",
		cfg:     Config{Interval: 3 * time.Second, LeaseTTL: time.Hour, TimerPoll: time.Hour, Batch: 100, StatsInterval: time.Hour},
		logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics: newMetrics(prometheus.NewRegistry())}
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testenv.Eventually(t, 10*time.Second, "the sweeper to lead and hear of timers", func() bool { return s.lead.Load() && s.timersHeard.Load() })
	// Two timers one after the other: once the first has fired the loop
	// finds none waiting and sleeps the whole TimerPoll unless told.
	for i := range 2 {
		id, startAt := startingIn(t, pool, store, 300*time.Millisecond)
		testenv.Eventually(t, 10*time.Second, "the timer to fire", func() bool {
			var state string
			return pool.QueryRow(ctx, `SELECT process_state FROM steps WHERE order_id = $1`, id).Scan(&state) == nil && state != statestore.StepDelayed
		})
		var late float64
		if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM updated_at - $2::timestamptz) FROM steps WHERE order_id = $1`, id, startAt).Scan(&late); err != nil {
			t.Fatal(err)
		}
		if late < 0 || late > 2 {
			t.Fatalf("timer %d fired %.3fs after its due time, want within 2s (told, not polled)", i+1, late)
		}
	}
}

// startingIn inserts an order of one step that starts after, on the
// database clock, and returns its id and start time.
func startingIn(t *testing.T, pool *pgxpool.Pool, store *statestore.Store, after time.Duration) (string, time.Time) {
	t.Helper()
	ctx := context.Background()
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	id := messages.NewID()
	h := sha256.Sum256([]byte(id))
	startAt := dbNow.Add(after)
	o := statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{}`), PayloadHash: h[:], Actor: "test", FailurePolicy: statestore.PolicyHold,
		StartAt: &startAt, Steps: []statestore.NewStep{{Name: "s", Agent: "a", Timeout: time.Minute, MaxFailures: 3}}}
	if _, err := store.InsertOrder(ctx, o); err != nil {
		t.Fatal(err)
	}
	return id, startAt
}
