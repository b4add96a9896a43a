package remote

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sas/internal/service"
)

// Config is the remote service's configuration (environment prefix SAS_).
type Config struct {
	// Addr serves the API, /metrics, /healthz and /readyz.
	Addr string `envconfig:"REMOTE_ADDR" default:":9105"`
	// Faults is the initial FaultConfig as JSON, e.g.
	// {"*":{"error_rate":0.1},"charge_payment":{"latency_min_ms":5,"latency_max_ms":50}}.
	Faults string `envconfig:"REMOTE_FAULTS" default:"{}"`
	// Seed makes fault injection repeatable; 0 picks one at random.
	Seed uint64 `envconfig:"REMOTE_SEED" default:"0"`
	// KeepRequests keeps the body of each key's applying call in the
	// ledger (GET /ledger), for tests to read what every step was given;
	// off, the ledger stays small over long runs.
	KeepRequests bool   `envconfig:"REMOTE_KEEP_REQUESTS" default:"false"`
	LogLevel     string `envconfig:"LOG_LEVEL" default:"info"`
	// DebugAddr, when set, serves Go's profiler there.
	DebugAddr string `envconfig:"DEBUG_ADDR"`
}

// Level implements service.Leveled.
func (c Config) Level() string { return c.LogLevel }

// DebugAddress implements service.Debugged.
func (c Config) DebugAddress() string { return c.DebugAddr }

// Run serves until ctx is done.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	logger = logger.With("service", "remote")
	faults, err := ParseFaultConfig([]byte(cfg.Faults))
	if err != nil {
		return err
	}
	reg := service.NewRegistry()
	svc := New(faults, cfg.Seed, reg, logger)
	svc.KeepRequests = cfg.KeepRequests
	tr, closeTracing, err := service.OpenTracing(ctx, "remote", "remote", nil, logger)
	if err != nil {
		return err
	}
	defer closeTracing()
	svc.Tracing = tr
	mux := http.NewServeMux()
	mux.Handle("/", svc.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	ok := func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	logger.Info("remote service listening", "addr", ln.Addr().String(), "faults", cfg.Faults)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	logger.Info("remote service stopped")
	return nil
}
