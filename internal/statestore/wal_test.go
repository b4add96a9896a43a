package statestore_test

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// TestReadWAL: an order written moves the WAL position on by at least its
// rows; a checkpoint is counted.
func TestReadWAL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	before, err := b.store.ReadWAL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.Bytes <= 0 || before.Checkpoints < 0 {
		t.Fatalf("reading %+v", before)
	}
	insert(t, b, order(3, time.Minute, 3))
	after, err := b.store.ReadWAL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The order, its step rows, their history and an event: more than a
	// kilobyte of log, whatever else the cluster does meanwhile.
	if grew := after.Bytes - before.Bytes; grew < 1024 {
		t.Fatalf("the WAL grew by %d bytes for a three-step order", grew)
	}
	if _, err := b.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the checkpoint counted", func() bool {
		r, err := b.store.ReadWAL(ctx)
		return err == nil && r.Checkpoints > after.Checkpoints
	})
}
