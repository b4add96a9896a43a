// Package service holds what every sas process shares: the common part of
// its configuration, JSON logging, and the operations HTTP server
// (/metrics, /healthz, /readyz).
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sas/internal/broker"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// Common is the configuration every service reads (prefix SAS_).
type Common struct {
	// DatabaseURL is the PostgreSQL URL (SAS_DATABASE_URL). TLS is set
	// with its sslmode and sslrootcert parameters.
	DatabaseURL string `envconfig:"DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/sas?sslmode=disable"`
	// DatabasePassword, when set, is the database password, replacing
	// the URL's: it may hold any character, unencoded.
	DatabasePassword string `envconfig:"DATABASE_PASSWORD"`
	// DBLockTimeout bounds how long a statement waits for a row another
	// transaction holds before it gives up and the work is retried (0:
	// the server's lock_timeout, by default no limit).
	DBLockTimeout time.Duration `envconfig:"DB_LOCK_TIMEOUT" default:"1s"`
	// AMQPURL is the RabbitMQ URL (SAS_AMQP_URL); amqps:// for TLS.
	AMQPURL string `envconfig:"AMQP_URL" default:"amqp://guest:guest@127.0.0.1:5672/"`
	// AMQPPassword, when set, is the broker password, replacing the
	// URL's: it may hold any character, unencoded.
	AMQPPassword string `envconfig:"AMQP_PASSWORD"`
	// AMQPCAFile is a PEM file of CA certificates to trust for amqps://
	// besides the system's.
	AMQPCAFile string `envconfig:"AMQP_CA_FILE"`
	// QueuePrefix goes before every queue and exchange name.
	QueuePrefix string `envconfig:"QUEUE_PREFIX" default:"sas."`
	// DeliveryLimit is how many deliveries without an ack a message of an
	// input queue gets before it is dead-lettered (x-delivery-limit of a
	// quorum queue; counted by the consumer on a classic one).
	DeliveryLimit int `envconfig:"DELIVERY_LIMIT" default:"10"`
	// QueueType is the type of every queue sas declares: quorum
	// (replicated across a cluster) or classic (one node's durable
	// queues, cheaper; the single-node deployments' default).
	QueueType string `envconfig:"QUEUE_TYPE" default:"quorum"`
	// StepMessages is how step requests and replies go through classic
	// queues: transient (in the broker's memory: the state store holds
	// what they carry, and a scheduler whose connection dropped sends its
	// steps again) or persistent (on the broker's disk before the confirm).
	// A quorum queue keeps every message on disk, whatever this says.
	StepMessages string `envconfig:"STEP_MESSAGES" default:"transient"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `envconfig:"LOG_LEVEL" default:"info"`
	// InstanceID names this process in locked_by and the history; empty
	// means host name and process id.
	InstanceID string `envconfig:"INSTANCE_ID"`
	// ShutdownTimeout bounds the wait for in-flight work on SIGTERM.
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"20s"`
	// DebugAddr, when set, serves Go's profiler (/debug/pprof/) there;
	// empty (the default) serves nothing.
	DebugAddr string `envconfig:"DEBUG_ADDR"`
	// Partitioned: a partitioned deployment's layout and this process's
	// partition in it (SAS_PARTITIONS_FILE, SAS_PARTITION).
	Partitioned
}

// SAS_STEP_MESSAGES' values.
const (
	StepsTransient  = "transient"
	StepsPersistent = "persistent"
)

// TransientSteps reports whether step requests and replies are published
// transient: on classic queues, unless SAS_STEP_MESSAGES says persistent.
func (c Common) TransientSteps() bool {
	return c.QueueType == broker.QueueClassic && c.StepMessages != StepsPersistent
}

// Check reports settings that cannot work, naming them: a database or
// broker URL whose password would be misread (see secrets.CheckURL).
func (c Common) Check() error {
	if err := secrets.CheckURL("SAS_DATABASE_URL", c.DatabaseURL); err != nil {
		return err
	}
	for _, u := range broker.SplitURLs(c.AMQPURL) {
		if err := secrets.CheckURL("SAS_AMQP_URL", u); err != nil {
			return err
		}
	}
	if _, err := c.BrokerURL(); err != nil {
		return err
	}
	if err := broker.CheckQueueType(c.QueueType); err != nil {
		return err
	}
	if c.StepMessages != "" && c.StepMessages != StepsTransient && c.StepMessages != StepsPersistent {
		return fmt.Errorf("SAS_STEP_MESSAGES %q: want %s (kept in the broker's memory; the state store holds what they carry) or %s (on its disk)",
			c.StepMessages, StepsTransient, StepsPersistent)
	}
	if c.DBLockTimeout < 0 {
		return fmt.Errorf("SAS_DB_LOCK_TIMEOUT %v is negative", c.DBLockTimeout)
	}
	// A process of one partition must be one of the layout's, under its
	// prefix; one of the whole deployment (the API, the console) needs
	// a layout it can read.
	if c.Partition != "" {
		_, _, err := c.Own(c.QueuePrefix)
		return err
	}
	_, err := c.Layout()
	return err
}

// BrokerURL is SAS_AMQP_URL with SAS_AMQP_PASSWORD set in it, encoded
// (in each of its URLs, when it lists a cluster's nodes).
func (c Common) BrokerURL() (string, error) {
	urls := broker.SplitURLs(c.AMQPURL)
	if len(urls) == 0 {
		return "", errors.New("SAS_AMQP_URL is empty")
	}
	for i, raw := range urls {
		u, err := secrets.WithPassword(raw, c.AMQPPassword)
		if err != nil {
			return "", fmt.Errorf("SAS_AMQP_PASSWORD: %w", err)
		}
		urls[i] = u
	}
	return strings.Join(urls, ","), nil
}

// Database returns the pool options for a pool of maxConns connections.
func (c Common) Database(maxConns int32) statestore.Options {
	return statestore.Options{URL: c.DatabaseURL, Password: c.DatabasePassword, MaxConns: maxConns, LockTimeout: c.DBLockTimeout}
}

// Redactor removes the configuration's secrets from text.
func (c Common) Redactor() *secrets.Redactor {
	return secrets.New(c.DatabaseURL, c.DatabasePassword, c.AMQPURL, c.AMQPPassword)
}

// Instance returns the configured instance id or host-pid.
func (c Common) Instance(role string) string {
	if c.InstanceID != "" {
		return c.InstanceID
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%s:%d", role, host, os.Getpid())
}

// NewLogger returns a JSON logger at level writing to w. Every line goes
// through red (nil: through secrets.Scrub only), so no password reaches a
// log whatever the text around it; durations are written as text
// ("retry_in":"100ms"), not as nanoseconds. A logger's With costs little
// until it writes (lazyHandler).
func NewLogger(w io.Writer, level string, red *secrets.Redactor) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(lazy(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
			return a
		}
		return red.Attr(a)
	}}))), nil
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors, for one process.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// OpsServer serves /metrics, /healthz (the process is alive) and /readyz
// (the readiness check reports nil when the process can do its work).
type OpsServer struct {
	srv    *http.Server
	ln     net.Listener
	served chan struct{} // closed when Serve has returned

	mu    sync.Mutex
	ready func(context.Context) error
}

// NotReady is a readiness check that always says why not.
func NotReady(why string) func(context.Context) error {
	return func(context.Context) error { return errors.New(why) }
}

// ListenOps starts the operations server on addr (":0" picks a port) with
// the readiness check ready; SetReady replaces it, so that a process can
// serve /healthz while it waits for its dependencies. It registers
// sas_ready on reg: the readiness check's answer at each scrape.
func ListenOps(addr string, reg *prometheus.Registry, ready func(context.Context) error, logger *slog.Logger) (*OpsServer, error) {
	return listenOps(addr, reg, reg, ready, logger)
}

// listenOps is ListenOps serving what gather gathers (reg's, with labels
// added).
func listenOps(addr string, reg *prometheus.Registry, gather prometheus.Gatherer, ready func(context.Context) error, logger *slog.Logger) (*OpsServer, error) {
	s := &OpsServer{ready: ready}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sas_ready",
		Help: "1 when the process can do its work (what /readyz answers: database and broker reachable, consuming), 0 when not.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s.check(ctx) != nil {
			return 0
		}
		return 1
	}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.check(ctx); err != nil {
			http.Error(w, "not ready: "+secrets.Scrub(err.Error()), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.ln = ln
	s.served = make(chan struct{})
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("ops server stopped", "err", err)
		}
	}()
	logger.Info("ops server listening", "addr", ln.Addr().String())
	return s, nil
}

// check runs the current readiness check.
func (s *OpsServer) check(ctx context.Context) error {
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	return ready(ctx)
}

// SetReady replaces the readiness check.
func (s *OpsServer) SetReady(ready func(context.Context) error) {
	s.mu.Lock()
	s.ready = ready
	s.mu.Unlock()
}

// Addr is the address the server listens on.
func (s *OpsServer) Addr() string { return s.ln.Addr().String() }

// Close stops the server, letting requests in progress finish briefly,
// and returns once it has stopped serving.
func (s *OpsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	<-s.served
	return err
}

// WorkflowsFile is the setting of the services that read the workflows
// file; embed it in their configuration.
type WorkflowsFile struct {
	// WorkflowsFile is the YAML file of workflows (SAS_WORKFLOWS_FILE);
	// empty means the built-in one (deploy/workflows.yaml).
	WorkflowsFile string `envconfig:"WORKFLOWS_FILE"`
}

// Workflows loads and checks the workflows file.
func (w WorkflowsFile) Workflows() (*workflow.Registry, error) {
	return workflow.LoadOrBuiltin(w.WorkflowsFile)
}
