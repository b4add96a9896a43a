package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"sas/internal/archive"
	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/oidcauth"
	"sas/internal/partition"
	"sas/internal/service"
	"sas/internal/statestore"
)

// Run serves the API until ctx ends, then lets the requests in hand
// finish (within the shutdown timeout).
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	me := cfg.Instance("api")
	logger = logger.With("service", "api", "instance", me)
	workflows, err := cfg.Workflows()
	if err != nil {
		return err
	}
	reg := service.NewRegistry()
	m := newMetrics(reg)
	// The API sends signals to the schedulers' queue and reads the status
	// exchange: it declares both, as the schedulers do.
	topo := broker.Topology{Prefix: cfg.QueuePrefix, DeliveryLimit: cfg.DeliveryLimit, QueueType: cfg.QueueType, Inputs: []string{messages.SignalsQueue}}
	sk, err := service.Start(ctx, service.Setup{Name: "api", Me: me, Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		DBMaxConns: cfg.DBMaxConns, Topology: &topo, Traced: true}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	store := sk.Deps.Store
	if err := service.RetryDB(ctx, logger, "checking the schema", func() error { return store.CheckSchema(ctx) }); err != nil {
		return err
	}
	if err := intake.StoreVersions(ctx, store, workflows, me, logger); err != nil {
		return err
	}
	layout, err := cfg.Layout()
	if err != nil {
		return err
	}
	stores := partition.One(store)
	if layout != nil {
		// Every partition's store, each holding its own orders; the
		// API's own (SAS_DATABASE_URL) keeps tokens and namespaces.
		var closeParts func()
		if stores, closeParts, err = service.OpenPartitions(ctx, layout, cfg.Database(cfg.DBMaxConns), sk.Ops, logger); err != nil {
			return err
		}
		sk.OnClose(closeParts)
	}
	var parts []*part
	for i, ps := range stores.Parts {
		pt := topo
		if layout != nil {
			pt.Prefix = layout.Partitions[i].QueuePrefix
			if err := intake.StoreVersions(ctx, ps.Store, workflows, me, logger.With("partition", ps.Name)); err != nil {
				return ps.Named(err)
			}
		}
		parts = append(parts, &part{name: ps.Name, store: ps.Store, topo: pt})
	}
	for _, p := range parts {
		st := p.store
		p.inserts = batch.New(cfg.Batch, cfg.BatchLinger, func(ctx context.Context, orders []statestore.NewOrder) ([]statestore.InsertOutcome, []error) {
			return st.InsertOrders(ctx, orders)
		})
		sk.Go(func(ctx context.Context) { p.inserts.Run(ctx, cfg.Writers) })
		p.hub = newHub(logger.With("partition", p.name), p.topo.StatusExchange(), st.HearStatusEvents, st.HearStepEvents)
		sk.Go(func(ctx context.Context) { p.hub.run(ctx, sk.Deps.Conn) })
	}
	arch, err := archive.Open(cfg.Config)
	if err != nil {
		return err
	}
	var idp *oidcauth.Provider
	if cfg.OIDC.On() {
		if idp, err = oidcauth.NewProvider(cfg.OIDC, nil, oidcRoles...); err != nil {
			return err
		}
	}
	s := &server{cfg: cfg, idp: idp, me: me, store: store, workflows: workflows, archive: arch, tokens: newTokens(store, cfg.TokenCache, cfg.Rate, cfg.Burst),
		namespaces: intake.NewNamespaces(store.Namespaces),
		stores:     stores, parts: parts, pub: sk.Deps.Pub, topo: topo, tr: sk.Tracing, redact: cfg.Redactor(), logger: logger, metrics: m}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("SAS_API_ADDR: listen on %s: %w", cfg.Addr, err)
	}
	hs := &http.Server{Handler: s.mux(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 1 << 20}
	serve := func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() {
			var err error
			if cfg.TLSCertFile != "" {
				err = hs.ServeTLS(ln, cfg.TLSCertFile, cfg.TLSKeyFile)
			} else {
				err = hs.Serve(ln)
			}
			errc <- err
		}()
		logger.Info("api listening", "addr", ln.Addr().String(), "tls", cfg.TLSCertFile != "", "workflows", workflows.Source)
		select {
		case err := <-errc:
			return fmt.Errorf("api server: %w", err)
		case <-ctx.Done():
		}
		shutCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		err := hs.Shutdown(shutCtx)
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		return err
	}
	bulk := func(ctx context.Context) error {
		s.runBulk(ctx, time.Second)
		return nil
	}
	touch := func(ctx context.Context) error {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if err := s.tokens.flushUsed(ctx); err != nil && ctx.Err() == nil {
					logger.Warn("api: recording token use", "err", err)
				}
			}
		}
	}
	return sk.Run(ctx, cfg.ShutdownTimeout, sk.Deps.Ready(), serve, bulk, touch)
}
