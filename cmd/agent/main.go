// Command agent performs the steps of orders: it consumes step requests,
// calls the remote service with retries and replies. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/agent"
	"sas/internal/service"
)

func main() {
	var cfg agent.Config
	if err := envconfig.Process("sas", &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "agent: configuration:", err)
		os.Exit(2)
	}
	logger, err := service.NewLogger(os.Stderr, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent: configuration:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := agent.Run(ctx, cfg, logger); err != nil {
		logger.Error("agent failed", "err", err)
		os.Exit(1)
	}
}
