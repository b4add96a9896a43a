package e2e

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"sas/internal/broker"
	"sas/internal/harness/chaos"
	"sas/internal/harness/testenv"
)

func chaosConfig(t *testing.T, seed uint64, orders int) chaos.Config {
	t.Helper()
	testenv.Database(t) // skips or fails, as for every test, when the services are away
	return chaos.Config{
		BinDir: binDir, DatabaseURL: testenv.DatabaseURL(), AMQPURL: testenv.AMQPURL(),
		// One local RabbitMQ node: its shape's default, classic queues.
		QueueType: broker.QueueClassic,
		Orders:    orders, Rate: 40, Seed: seed, Faults: chaos.ShortFaults(),
		StepTimeout: 2 * time.Second,
		HealTimeout: 2 * time.Minute, LogDir: t.TempDir(),
	}
}

func runChaos(t *testing.T, cfg chaos.Config) chaos.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("fault run: %v", err)
	}
	var b strings.Builder
	rep.Print(&b)
	t.Log("\n" + b.String())
	return rep
}

// TestChaosShortRun is the short fault run of make test: every fault kind
// but broker and database restarts (they would disturb the tests running
// beside it), on a fixed seed, and every invariant must hold.
func TestChaosShortRun(t *testing.T) {
	t.Parallel()
	rep := runChaos(t, chaosConfig(t, 42, 400))
	if !rep.OK() {
		t.Fatal("invariants broken under faults (report above)")
	}
	if rep.Confirmed != 400 || rep.Malformed == 0 || len(rep.Faults) < 4 {
		t.Fatalf("the run did not do what it should: %+v", rep)
	}
}

// The checker fails runs of deliberately broken builds (negative
// controls). Each control is a test of its own: subtests that call
// t.Parallel start only after every other test of the package has been
// let go (go test resumes them after their parent's body), so two 50 s
// controls as subtests ran last, side by side, in a suite otherwise
// done.

// TestChaosCatchesUnfencedReplies: without the fence, replies a frozen
// scheduler held are applied after the step was reset and claimed again.
func TestChaosCatchesUnfencedReplies(t *testing.T) {
	t.Parallel()
	catchesBrokenBuild(t, "unfenced-replies", chaos.FaultStop, "scheduler", 4)
}

// TestChaosCatchesAckBeforeCommit: a submitter that acks before it
// commits loses orders when killed.
func TestChaosCatchesAckBeforeCommit(t *testing.T) {
	t.Parallel()
	catchesBrokenBuild(t, "ack-before-commit", chaos.FaultKill, "submitter", 1)
}

// catchesBrokenBuild runs the build broken as named, with one fault
// striking one role, and wants the checker to fail the run on the
// invariant given.
func catchesBrokenBuild(t *testing.T, broken, fault, role string, invariant int) {
	t.Helper()
	cfg := chaosConfig(t, 7, 300)
	cfg.Faults, cfg.KillRoles, cfg.StopRoles = []string{fault}, []string{role}, []string{role}
	cfg.Env = []string{"SAS_BROKEN=" + broken}
	// The broken builds leave orders that never end (lost, or stuck in
	// processing): the run waits out the whole heal, and what it catches
	// is in the history and the broker's confirms, which more waiting
	// does not change.
	cfg.HealTimeout = 10 * time.Second
	rep := runChaos(t, cfg)
	if rep.OK() {
		t.Fatalf("the checker passed a build with %s", broken)
	}
	for _, v := range rep.Result.Violations {
		if v.Invariant == invariant {
			return
		}
	}
	t.Fatalf("no violation of invariant %d with %s: %v", invariant, broken, rep.Result.Violations)
}

// TestChaosAcrossPartitions is the short fault run across two
// partitions: every order published through the routing exchange, every
// fault striking either partition's processes (the network fault either
// partition's database), and every invariant checked in each partition
// and across them: each order in exactly one store, the one its id
// names.
func TestChaosAcrossPartitions(t *testing.T) {
	t.Parallel()
	cfg := chaosConfig(t, 54, 200)
	cfg.Partitions = 2
	rep := runChaos(t, cfg)
	if !rep.OK() {
		t.Fatal("invariants broken under faults across partitions (report above)")
	}
	if rep.Confirmed != 200 || rep.Malformed == 0 || len(rep.Faults) < 4 || rep.Result.Completed+rep.Result.Failed+rep.Result.HeldError < 200 {
		t.Fatalf("the run did not do what it should: %+v", rep)
	}
}
