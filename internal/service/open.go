package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/broker"
	"sas/internal/statestore"
)

// Deps is what a service opens at start and closes at the end.
type Deps struct {
	Store   *statestore.Store // nil when the service has no database
	Conn    *broker.Conn
	Pub     *broker.Publisher
	Metrics *broker.Metrics
	close   []func()
}

// Open connects, within a minute, to the database (when dbMaxConns > 0)
// and the broker (declaring topo), registering the broker's metrics on
// reg. On error it closes what it had opened; otherwise the caller closes
// it all with Close.
func Open(ctx context.Context, c Common, me string, dbMaxConns int32, topo broker.Topology, reg prometheus.Registerer, logger *slog.Logger) (*Deps, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d := &Deps{Metrics: broker.NewMetrics(reg)}
	if dbMaxConns > 0 {
		pool, err := statestore.Connect(ctx, c.DatabaseURL, dbMaxConns)
		if err != nil {
			return nil, err
		}
		d.close = append(d.close, pool.Close)
		d.Store = statestore.New(pool)
	}
	conn, err := broker.Open(ctx, c.AMQPURL, me, topo, logger, d.Metrics, broker.WithCAFile(c.AMQPCAFile))
	if err != nil {
		d.Close()
		return nil, err
	}
	d.Conn = conn
	d.Pub = broker.NewPublisher(conn, d.Metrics)
	d.close = append(d.close, func() { conn.Close() }, func() { d.Pub.Close() })
	return d, nil
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
