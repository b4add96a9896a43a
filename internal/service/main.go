package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/secrets"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

// Leveled is a configuration that names its log level.
type Leveled interface{ Level() string }

// Level implements Leveled.
func (c Common) Level() string { return c.LogLevel }

// The services keep little live data (a few MiB), so they trade some heap
// for fewer garbage collections: GOGC 400 instead of 100 took an eighth
// off their CPU per order (docs/BENCHMARKS.md). A soft memory limit makes
// the collector work harder before the heap outgrows it.
//
// They wait on their database and broker far more than they compute (a
// scheduler used a sixth of a core at full load), so one goroutine runs at
// a time: with more, every message that wakes a goroutine also wakes an
// idle thread to look for other work, and at 60 single-step orders a
// second that took a fifth of the services' CPU (docs/BENCHMARKS.md). A
// replica that needs more than a core is better split into two replicas.
//
// GOGC, GOMEMLIMIT and GOMAXPROCS in the environment win.
const (
	defaultGCPercent   = 400
	defaultMemoryLimit = 100 << 20
	defaultMaxProcs    = 1
)

// tuneRuntime applies the defaults above where the environment sets
// nothing.
func tuneRuntime() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(defaultMaxProcs)
	}
}

// Checked is a configuration that can report settings that cannot work.
type Checked interface{ Check() error }

// Main is the body of a service's main: it gives its threads their timer
// slack (applyTimerSlack, which may execute the binary again), tunes Go's runtime
// (tuneRuntime), reads every password given as a file (secrets.PasswordFiles),
// reads the configuration from SAS_ variables and checks it
// (Checked), makes a JSON logger that keeps every secret of the
// environment out of the log, serves the profiler if the configuration
// asks (Debugged), runs run until SIGTERM or Ctrl-C, and returns the
// process's exit status (2: bad configuration, 1: run failed). A SIGTERM
// while the service still waits for its database or broker is a clean
// stop.
func Main[C Leveled](name string, run func(context.Context, C, *slog.Logger) error) int {
	slackNote, err := applyTimerSlack()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	tuneRuntime()
	if err := secrets.LoadPasswordFiles(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %s\n", name, secrets.Scrub(err.Error()))
		return 2
	}
	red := secrets.FromEnviron(os.Environ())
	var cfg C
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %s\n", name, red.String(err.Error()))
		return 2
	}
	if c, ok := any(cfg).(Checked); ok {
		if err := c.Check(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: configuration: %s\n", name, red.String(err.Error()))
			return 2
		}
	}
	if w, ok := any(cfg).(interface {
		Workflows() (*workflow.Registry, error)
	}); ok {
		// Every problem of the file, one per line, before anything starts.
		if _, err := w.Workflows(); err != nil {
			fmt.Fprintf(os.Stderr, "%s: workflows file is invalid:\n%s\n", name, red.String(err.Error()))
			return 2
		}
	}
	if _, err := tracing.Enabled(os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	logger, err := NewLogger(os.Stderr, cfg.Level(), red)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	if slackNote != "" {
		logger.Info(slackNote)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if d, ok := any(cfg).(Debugged); ok && d.DebugAddress() != "" {
		stopDebug, err := ListenDebug(d.DebugAddress(), logger)
		if err != nil {
			logger.Error(name+" failed", "err", err)
			return 1
		}
		defer stopDebug()
	}
	if err := run(ctx, cfg, logger); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			logger.Info(name+" stopped before it was ready", "err", err)
			return 0
		}
		logger.Error(name+" failed", "err", err)
		return 1
	}
	return 0
}
