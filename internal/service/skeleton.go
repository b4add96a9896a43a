package service

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/broker"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// Setup is what a service's skeleton opens for it.
type Setup struct {
	// Name is the service's name (spans' service is "sas-" + Name); Me its
	// instance id.
	Name, Me string
	Common   Common
	// OpsAddr is where /metrics, /healthz and /readyz are served.
	OpsAddr string
	// Registry takes the ops server's and the broker's metrics.
	Registry *prometheus.Registry
	// DBMaxConns is the database pool's size; 0 opens no database.
	DBMaxConns int32
	// DBKeyed: every statement of the service finds its rows by key or
	// index (statestore.Options.Keyed).
	DBKeyed bool
	// Topology is declared on the broker; nil opens no broker.
	Topology *broker.Topology
	// Traced sets up the process's tracing (OpenTracing); otherwise
	// Tracing is off.
	Traced bool
	// Redact hides secrets in what the spans export (nil: the
	// configuration's, Common.Redactor).
	Redact *secrets.Redactor
}

// database is the pool s asks for.
func (s Setup) database() statestore.Options {
	db := s.Common.Database(s.DBMaxConns)
	db.Keyed = s.DBKeyed
	return db
}

// Skeleton is a service's lifecycle, written once: its ops server, its
// database and broker (Open), its tracing, a work context, and the
// background loops started under it. Run runs the service's loops;
// Close stops and waits for everything, the last opened first.
type Skeleton struct {
	Ops     *OpsServer
	Deps    *Deps
	Tracing *tracing.Tracing
	// WorkCtx carries work in hand: it outlives SIGTERM, so that work
	// finishes, and ends when the shutdown timeout passes or at Close.
	WorkCtx context.Context

	cancelWork context.CancelFunc
	background sync.WaitGroup
	closers    []func()
	logger     *slog.Logger
}

// Start opens what s asks for, in order: the ops server (answering
// /readyz "starting", then what it waits for), the database and the
// broker, tracing. On error it closes what it had opened.
func Start(ctx context.Context, s Setup, logger *slog.Logger) (sk *Skeleton, err error) {
	sk = &Skeleton{logger: logger, Tracing: tracing.Off()}
	defer func() {
		if err != nil {
			sk.Close()
		}
	}()
	var gather prometheus.Gatherer = s.Registry
	if s.Common.Partition != "" {
		gather = labelled{g: s.Registry, name: "partition", value: s.Common.Partition}
	}
	if sk.Ops, err = listenOps(s.OpsAddr, s.Registry, gather, NotReady("starting"), logger); err != nil {
		return sk, err
	}
	sk.OnClose(func() { _ = sk.Ops.Close() })
	if s.Topology != nil {
		sk.Deps, err = Open(ctx, s.Common, s.Me, s.database(), *s.Topology, s.Registry, sk.Ops, logger)
	} else {
		sk.Deps = &Deps{}
		if s.DBMaxConns > 0 {
			var closeStore func()
			sk.Deps.Store, closeStore, err = OpenDatabase(ctx, s.database(), sk.Ops, logger)
			if err == nil {
				sk.Deps.close = append(sk.Deps.close, closeStore)
			}
		}
	}
	if err != nil {
		sk.Deps = nil
		return sk, err
	}
	sk.OnClose(sk.Deps.Close)
	if s.Traced {
		red := s.Redact
		if red == nil {
			red = s.Common.Redactor()
		}
		tr, closeTracing, err := OpenTracing(ctx, s.Name, s.Me, red, logger)
		if err != nil {
			return sk, err
		}
		sk.Tracing = tr
		sk.OnClose(closeTracing)
	}
	sk.WorkCtx, sk.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	return sk, nil
}

// Go runs loop in the background under WorkCtx: a loop the service's
// handlers depend on until they return (a batcher's Run). Close ends
// WorkCtx once Run has returned, and waits for it.
func (sk *Skeleton) Go(loop func(ctx context.Context)) {
	sk.background.Go(func() { loop(sk.WorkCtx) })
}

// OnClose adds f to what Close runs, after the background loops have
// ended, the last added first.
func (sk *Skeleton) OnClose(f func()) { sk.closers = append(sk.closers, f) }

// Run marks the service ready (ready answers /readyz from now on) and
// runs loops until ctx is done or one fails (RunAll): on SIGTERM they
// finish what they hold within shutdownTimeout, then WorkCtx is cut.
func (sk *Skeleton) Run(ctx context.Context, shutdownTimeout time.Duration, ready func(context.Context) error, loops ...func(context.Context) error) error {
	sk.Ops.SetReady(ready)
	return RunAll(ctx, shutdownTimeout, sk.cancelWork, sk.logger, loops...)
}

// Close ends WorkCtx, waits for the background loops and closes what
// Start opened, the last first. Call it once, after Run (Start calls it
// itself when it fails, before WorkCtx exists).
func (sk *Skeleton) Close() {
	if sk.cancelWork != nil {
		sk.cancelWork()
	}
	sk.background.Wait()
	for i := len(sk.closers) - 1; i >= 0; i-- {
		sk.closers[i]()
	}
}
