// Command scheduler claims pending steps, sends them to agents and applies
// their replies, and publishes status events. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/scheduler"
	"sas/internal/service"
)

func main() {
	var cfg scheduler.Config
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler: configuration:", err)
		os.Exit(2)
	}
	logger, err := service.NewLogger(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler: configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := scheduler.Run(ctx, cfg, logger); err != nil {
		logger.Error("scheduler failed", "err", err)
		os.Exit(1)
	}
}
