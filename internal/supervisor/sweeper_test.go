package supervisor

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"testing"
	"time"

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
