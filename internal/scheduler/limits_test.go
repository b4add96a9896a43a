package scheduler

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// TestAPartitionKeepsItsShareOfALimit: a scheduler of one of three
// partitions keeps a third of the file's limits of a kind in its store,
// so that the partitions together hold the kind's limits, not three
// times them; one of no partitioned deployment keeps them whole.
func TestAPartitionKeepsItsShareOfALimit(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("limited.yaml", []byte(`
limits:
  payment: {rate: 90/s, burst: 30, max_in_flight: 20}
workflows:
  - name: pay
    steps:
      - {action: charge, agent: payment, timeout: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		partitions, inFlight, burst int
		rate                        float64
	}{{1, 20, 30, 90}, {3, 6, 10, 30}} {
		_, pool := testenv.Database(t)
		store := statestore.New(pool)
		if err := storeLimits(context.Background(), store, reg, []string{"payment"}, tc.partitions, logger); err != nil {
			t.Fatal(err)
		}
		kinds, err := store.ListLimits(context.Background())
		if err != nil || len(kinds) != 1 {
			t.Fatalf("%d partitions: %+v %v", tc.partitions, kinds, err)
		}
		f := kinds[0].File
		if f.MaxInFlight == nil || *f.MaxInFlight != tc.inFlight || f.Rate == nil || *f.Rate != tc.rate || f.Burst == nil || *f.Burst != tc.burst {
			t.Fatalf("%d partitions: the store keeps %s, want max_in_flight %d, rate %v/s, burst %d", tc.partitions, f, tc.inFlight, tc.rate, tc.burst)
		}
	}
}
