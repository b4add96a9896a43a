package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/broker"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// Deps is what a service opens at start and closes at the end.
type Deps struct {
	Store   *statestore.Store // nil when the service has no database
	Conn    *broker.Conn
	Pub     *broker.Publisher
	Metrics *broker.Metrics
	close   []func()
}

// Open connects to the database (when dbMaxConns > 0) and the broker
// (declaring topo), registering the broker's metrics on reg. Neither has
// to be up when the service starts: each is tried again with backoff,
// one log line per try, until it answers or ctx ends (SIGTERM), while ops
// serves /healthz and answers /readyz with what is awaited. On error it
// closes what it had opened; otherwise the caller closes it all with
// Close.
func Open(ctx context.Context, c Common, me string, db statestore.Options, topo broker.Topology, reg prometheus.Registerer, ops *OpsServer, logger *slog.Logger) (*Deps, error) {
	d := &Deps{Metrics: broker.NewMetrics(reg)}
	if db.MaxConns > 0 {
		store, closeStore, err := OpenDatabase(ctx, db, ops, logger)
		if err != nil {
			return nil, err
		}
		d.Store = store
		d.close = append(d.close, closeStore)
	}
	url, err := c.BrokerURL()
	if err != nil {
		d.Close()
		return nil, err
	}
	ops.SetReady(NotReady("waiting for the broker"))
	conn, err := broker.Open(ctx, url, me, topo, logger, d.Metrics, broker.WithCAFile(c.AMQPCAFile))
	if err != nil {
		d.Close()
		return nil, err
	}
	d.Conn = conn
	d.Pub = broker.NewPublisher(conn, d.Metrics)
	d.close = append(d.close, func() { conn.Close() }, func() { d.Pub.Close() })
	return d, nil
}

// OpenDatabase opens the database pool and waits until the database
// answers, trying again with backoff (100 ms doubling to 5 s, one log line
// per try) until ctx ends; meanwhile ops answers /readyz with the last
// error. It returns the store and the function that closes its pool.
func OpenDatabase(ctx context.Context, db statestore.Options, ops *OpsServer, logger *slog.Logger) (*statestore.Store, func(), error) {
	pool, err := statestore.Open(db)
	if err != nil {
		return nil, nil, fmt.Errorf("SAS_DATABASE_URL: %w", err)
	}
	ops.SetReady(NotReady("waiting for the database"))
	backoff := 100 * time.Millisecond
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.Ping(pingCtx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			pool.Close()
			return nil, nil, fmt.Errorf("waiting for the database: %w", ctx.Err())
		}
		ops.SetReady(NotReady("waiting for the database: " + err.Error()))
		args := []any{"err", err, "retry_in", backoff}
		if statestore.IsAuthFailure(err) {
			args = append(args, "hint", "the database refuses the login: check SAS_DATABASE_URL and SAS_DATABASE_PASSWORD")
		}
		logger.Warn("database not reachable; waiting for it", args...)
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			pool.Close()
			return nil, nil, fmt.Errorf("waiting for the database: %w", ctx.Err())
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	logger.Info("database reachable")
	return statestore.New(pool), pool.Close, nil
}

// Ready is a service's readiness check (/readyz): its database answers
// (when it has one), its broker connection is up, and every consumer is
// subscribed.
func (d *Deps) Ready(consumers ...*broker.Consumer) func(context.Context) error {
	return func(ctx context.Context) error {
		if d.Store != nil {
			if err := d.Store.Ping(ctx); err != nil {
				return fmt.Errorf("database: %w", err)
			}
		}
		if !d.Conn.Connected() {
			return errors.New("not connected to the broker")
		}
		for _, c := range consumers {
			if !c.Running() {
				return errors.New("not consuming every input queue")
			}
		}
		return nil
	}
}

// Close closes everything Open opened, last opened first.
func (d *Deps) Close() {
	for i := len(d.close) - 1; i >= 0; i-- {
		d.close[i]()
	}
}

// OpenTracing sets up the process's traces (tracing.Setup: off unless the
// OTEL_* variables ask for them), every span's texts through red, and
// returns them with the function that exports what is left at the end,
// within a few seconds.
func OpenTracing(ctx context.Context, name, me string, red *secrets.Redactor, logger *slog.Logger) (*tracing.Tracing, func(), error) {
	tr, err := tracing.Setup(ctx, "sas-"+name, me, red.String)
	if err != nil {
		return nil, nil, err
	}
	if tr.On() {
		logger.Info("tracing on: spans go over OTLP/HTTP (OTEL_EXPORTER_OTLP_*)")
	}
	return tr, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(sctx); err != nil {
			logger.Warn("exporting the last spans failed", "err", err)
		}
	}, nil
}
