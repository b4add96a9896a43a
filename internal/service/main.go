package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/kelseyhightower/envconfig"
)

// Leveled is a configuration that names its log level.
type Leveled interface{ Level() string }

// Level implements Leveled.
func (c Common) Level() string { return c.LogLevel }

// The services keep little live data (a few MiB), so they trade some heap
// for fewer garbage collections: GOGC 400 instead of 100 took an eighth
// off their CPU per order (docs/BENCHMARKS.md). A soft memory limit makes
// the collector work harder before the heap outgrows it. GOGC and
// GOMEMLIMIT in the environment win.
const (
	defaultGCPercent   = 400
	defaultMemoryLimit = 100 << 20
)

// tuneGC applies the defaults above where the environment sets nothing.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
}

// Main is the body of a service's main: it tunes the garbage collector
// (tuneGC), reads the configuration from SAS_ variables, makes a JSON
// logger, serves the profiler if the configuration asks (Debugged), runs
// run until SIGTERM or Ctrl-C, and returns the process's exit status (2:
// bad configuration, 1: run failed).
func Main[C Leveled](name string, run func(context.Context, C, *slog.Logger) error) int {
	tuneGC()
	var cfg C
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	logger, err := NewLogger(os.Stderr, cfg.Level())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: configuration: %v\n", name, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if d, ok := any(cfg).(Debugged); ok && d.DebugAddress() != "" {
		if err := ListenDebug(ctx, d.DebugAddress(), logger); err != nil {
			logger.Error(name+" failed", "err", err)
			return 1
		}
	}
	if err := run(ctx, cfg, logger); err != nil {
		logger.Error(name+" failed", "err", err)
		return 1
	}
	return 0
}
