package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/broker"
	"sas/internal/statestore"
	"sas/migrations"
)

// BrokerWait and DatabaseWait bound how long a command-line tool (sasctl,
// its benchmark) tries to reach the broker and the database before it
// gives up with one line; a service keeps trying instead.
const (
	BrokerWait   = 5 * time.Second
	DatabaseWait = 5 * time.Second
)

// ToolPool opens a pool as o says and checks, within DatabaseWait, that
// the database answers, saying which setting to fix when it does not.
func ToolPool(ctx context.Context, o statestore.Options) (*pgxpool.Pool, error) {
	pool, err := statestore.Open(o)
	if err != nil {
		return nil, fmt.Errorf("SAS_DATABASE_URL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, DatabaseWait)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if statestore.IsAuthFailure(err) {
			return nil, fmt.Errorf("the database refused the login (check the user and password in SAS_DATABASE_URL, SAS_DATABASE_PASSWORD): %w", err)
		}
		return nil, fmt.Errorf("cannot reach the database within %v (SAS_DATABASE_URL): %w", DatabaseWait, err)
	}
	return pool, nil
}

// MigrateAndOpen applies the migrations to cfg's database and returns a
// store on a small pool, and the func that closes it.
func MigrateAndOpen(ctx context.Context, cfg Common) (*statestore.Store, func(), error) {
	migrateCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	o := cfg.Database(4)
	o.LockTimeout = 0
	pool, err := ToolPool(migrateCtx, o)
	if err != nil {
		return nil, nil, err
	}
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err == nil {
		_, err = statestore.Migrate(migrateCtx, pool, ms)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return statestore.New(pool), pool.Close, nil
}

// ToolBroker connects a tool to the broker of cfg, failing within
// BrokerWait, with the topology of inputs (declared when they are not
// there).
func ToolBroker(ctx context.Context, cfg Common, name string, logger *slog.Logger, inputs ...string) (*broker.Conn, *broker.Publisher, broker.Topology, error) {
	topo := broker.Topology{Prefix: cfg.QueuePrefix, DeliveryLimit: cfg.DeliveryLimit, QueueType: cfg.QueueType, Inputs: inputs}
	url, err := cfg.BrokerURL()
	if err != nil {
		return nil, nil, topo, err
	}
	dialCtx, cancel := context.WithTimeout(ctx, BrokerWait)
	defer cancel()
	bm := broker.NewMetrics(nil)
	conn, err := broker.Open(dialCtx, url, name, topo, logger, bm, broker.WithCAFile(cfg.AMQPCAFile), broker.FailFast())
	if err != nil {
		return nil, nil, topo, fmt.Errorf("cannot use the broker (SAS_AMQP_URL): %w", err)
	}
	return conn, broker.NewPublisher(conn, bm), topo, nil
}
