// Command chaos runs sas under faults and checks that nothing was lost or
// done twice: it starts every component (two replicas of each) from
// binaries built with -tags failpoints, publishes orders, malformed
// messages and repeats while it kills, freezes and trips processes and
// makes the remote service misbehave on a seeded schedule, then heals,
// waits for every order to end, checks the invariants of
// shared/RELIABILITY.md and prints a report. Exit status 1 on a violation.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sas/internal/harness/chaos"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg chaos.Config
	var faults string
	flag.StringVar(&cfg.BinDir, "bin", "bin/failpoints", "directory of the service binaries, built with -tags failpoints")
	flag.StringVar(&cfg.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/sas_test?sslmode=disable", "database the run makes its own schema in")
	flag.StringVar(&cfg.AMQPURL, "amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "broker")
	flag.StringVar(&cfg.QueueType, "queue-type", "classic", "the services' SAS_QUEUE_TYPE: classic (a single node's default, as here) or quorum")
	flag.IntVar(&cfg.Orders, "orders", 1000, "orders to submit")
	flag.Float64Var(&cfg.Rate, "rate", 50, "orders submitted per second")
	flag.Uint64Var(&cfg.Seed, "seed", uint64(time.Now().UnixNano()%1_000_000), "seed of the fault schedule (print it, replay it)")
	flag.StringVar(&faults, "faults", strings.Join(chaos.AllFaults(), ","), "fault kinds: "+strings.Join(chaos.AllFaults(), ","))
	flag.IntVar(&cfg.PortBase, "port-base", 0, "services listen on 127.0.0.1 from this port + 1 (0: free ports)")
	flag.DurationVar(&cfg.StepTimeout, "step-timeout", 2*time.Second, "budget of one attempt")
	flag.DurationVar(&cfg.HealTimeout, "heal-timeout", 3*time.Minute, "how long orders may take to end after the faults stop")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the run's schema and queues")
	flag.IntVar(&cfg.Partitions, "partitions", 1, "run this many partitions (a schema, queue prefix and services each), orders routed by id through the consistent-hash exchange (the broker needs rabbitmq_consistent_hash_exchange); invariants checked in each and across")
	flag.Parse()
	cfg.Faults = strings.Split(faults, ",")
	dir, err := os.MkdirTemp("", "sas-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	cfg.LogDir = dir
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rep, err := chaos.Run(ctx, cfg, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	rep.Print(os.Stdout)
	if !rep.OK() {
		return 1
	}
	return 0
}
