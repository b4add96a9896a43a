// Command sasctl is sas's operator and developer tool: it migrates the
// state store, submits orders, and lists, shows and resubmits orders.
// Configuration comes from the same SAS_ environment variables as the
// services; see the README.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/secrets"
	"sas/internal/service"
)

const usage = `usage: sasctl <command> [flags]

commands:
  migrate                          apply the state store's migrations
  submit --file FILE               publish one order (JSON; "-" for stdin) to the submit queue
  submit --count N [flags]         publish N generated sample orders
  orders list [--status S]         list orders, newest first
  orders show ID [--json]          an order with its steps and full history
  orders resubmit ID [--step N]    put an order's failed step back to pending
  orders cancel ID                 end an order that has not ended: undo what was done, then failed
  alerts tail [--count N]          print operator alerts as they arrive on the alerts queue
  dev [--orders N]                 run every service locally, push orders through, show progress and a summary
  bench [--rate R] [--workflow W]  run every service locally under load and report throughput, latency, CPU, memory, queues
  probe URL                        exit 0 if URL answers 200 (container healthchecks)
  broker users                     print the rabbitmqctl commands for one least-privilege user per service
  db users                         create or update a login per service role from SAS_DB_PASSWORD_<SERVICE>

Run "sasctl <command> -h" for a command's flags.
`

// errUsage marks a mistake in the command line (exit status 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	red := secrets.FromEnviron(os.Environ())
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, red)
	switch {
	case err == nil:
	case errors.Is(err, errUsage), errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sasctl:", red.String(err.Error()))
		os.Exit(1)
	}
}

// app is what every command gets.
type app struct {
	cfg    service.Common
	stdout io.Writer
	stderr io.Writer
	logger *slog.Logger
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, red *secrets.Redactor) error {
	var cfg service.Common
	if err := envconfig.Process("sas", &cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := cfg.Check(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	logger, err := service.NewLogger(stderr, cfg.LogLevel, red)
	if err != nil {
		return err
	}
	a := &app{cfg: cfg, stdout: stdout, stderr: stderr, logger: logger}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "migrate":
		return a.migrate(ctx, rest)
	case "submit":
		return a.submit(ctx, rest)
	case "orders":
		return a.orders(ctx, rest)
	case "alerts":
		return a.alerts(ctx, rest)
	case "dev":
		return a.dev(ctx, rest)
	case "bench":
		return a.bench(ctx, rest)
	case "probe":
		return a.probe(ctx, rest)
	case "broker":
		return a.brokerUsers(ctx, rest)
	case "db":
		return a.dbUsers(ctx, rest)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "sasctl: unknown command %q\n\n%s", cmd, usage)
		return errUsage
	}
}

// flags returns a flag set that reports errors on stderr.
func (a *app) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sasctl "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	return fs
}

func (a *app) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	return nil
}
