// Command submitter consumes orders from the submit queue and writes them,
// with their step state rows, to the state store. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/service"
	"sas/internal/submitter"
)

func main() {
	var cfg submitter.Config
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "submitter: configuration:", err)
		os.Exit(2)
	}
	logger, err := service.NewLogger(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "submitter: configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := submitter.Run(ctx, cfg, logger); err != nil {
		logger.Error("submitter failed", "err", err)
		os.Exit(1)
	}
}
