// Command remote is the demo remote service agents call: inventory,
// payment and shipping endpoints with an idempotency-key ledger and fault
// injection. Configuration comes from SAS_ environment variables; see the
// README.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/remote"
	"sas/internal/service"
)

func main() {
	var cfg remote.Config
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "remote: configuration:", err)
		os.Exit(2)
	}
	logger, err := service.NewLogger(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "remote: configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := remote.Run(ctx, cfg, logger); err != nil {
		logger.Error("remote failed", "err", err)
		os.Exit(1)
	}
}
