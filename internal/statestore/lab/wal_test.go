package lab_test

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/statestore/lab"
)

// TestReadWAL: orders written move the WAL position on by at least their
// rows; a checkpoint is counted.
func TestReadWAL(t *testing.T) {
	t.Parallel()
	_, pool := testenv.Database(t)
	ctx := ctxFor(t)
	before, err := lab.ReadWAL(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if before.Bytes <= 0 || before.Checkpoints < 0 {
		t.Fatalf("reading %+v", before)
	}
	if _, err := lab.Fill(ctx, pool, 10, 0); err != nil {
		t.Fatal(err)
	}
	after, err := lab.ReadWAL(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	// Ten orders with their steps and history: more than a kilobyte of
	// log, whatever else the cluster does meanwhile.
	if grew := after.Bytes - before.Bytes; grew < 1024 {
		t.Fatalf("the WAL grew by %d bytes for ten orders", grew)
	}
	// The fill's transactions, records and flushes reach the server's
	// counters within about a second of its backend going idle. A server
	// with fsync off (make test's own) flushes nothing and says so.
	var fsync string
	if err := pool.QueryRow(ctx, `SELECT current_setting('fsync')`).Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the fill's transactions and WAL flushes counted", func() bool {
		r, err := lab.ReadWAL(ctx, pool)
		return err == nil && r.Transactions > before.Transactions && r.Records > before.Records && r.Writes > before.Writes &&
			(r.Flushes > before.Flushes) == (fsync == "on")
	})
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the checkpoint counted", func() bool {
		r, err := lab.ReadWAL(ctx, pool)
		return err == nil && r.Checkpoints > after.Checkpoints
	})
}
