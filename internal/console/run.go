// Package console is the web console: the state store and the dead-letter
// queues as an operator sees them, server-rendered with html/template and
// assets embedded in the binary. Everyone logs in (users from a file or
// the environment, bcrypt hashes); a viewer sees, an operator also
// resubmits, cancels, acknowledges and requeues or discards dead letters,
// each behind a confirmation and recorded with the console user's name.
package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"sas/internal/broker"
	"sas/internal/failpoint"
	"sas/internal/oidcauth"
	"sas/internal/service"
	"sas/internal/statestore"
)

// Config is the console's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	service.WorkflowsFile
	// Addr is where the console serves its pages.
	Addr        string `envconfig:"CONSOLE_ADDR" default:":8080"`
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9106"`
	// UsersFile is a file of NAME:ROLE:BCRYPT-HASH lines, read again when
	// it changes; Users the same entries separated by ';'. Either or both.
	UsersFile string `envconfig:"CONSOLE_USERS_FILE"`
	Users     string `envconfig:"CONSOLE_USERS"`
	// ReadOnly turns every action off for everyone.
	ReadOnly bool `envconfig:"CONSOLE_READ_ONLY" default:"false"`
	// SessionTTL logs a session out after this long without a request.
	SessionTTL time.Duration `envconfig:"CONSOLE_SESSION_TTL" default:"8h"`
	// LoginAttempts failed logins within LoginWindow, from one address or
	// for one name, hold further logins until the window has passed.
	LoginAttempts int           `envconfig:"CONSOLE_LOGIN_ATTEMPTS" default:"5"`
	LoginWindow   time.Duration `envconfig:"CONSOLE_LOGIN_WINDOW" default:"5m"`
	// PublicURL is the console's public origin, or several separated by
	// commas (https://console.example.com): requests for any other host
	// are refused, and so are forms from any other origin. Unset: a
	// loopback name or an IP address.
	PublicURL string `envconfig:"CONSOLE_PUBLIC_URL"`
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS.
	TLSCertFile string `envconfig:"CONSOLE_TLS_CERT_FILE"`
	TLSKeyFile  string `envconfig:"CONSOLE_TLS_KEY_FILE"`
	DBMaxConns  int32  `envconfig:"DB_MAX_CONNS" default:"4"`
	// BulkMax is the most orders one bulk job made here may act on.
	BulkMax int `envconfig:"CONSOLE_BULK_MAX" default:"100000"`
	// OIDC signs people in at the company's identity provider.
	OIDC oidcauth.Config `envconfig:"OIDC"`
}

// Check reports settings that cannot work.
func (c Config) Check() error {
	if err := c.Common.Check(); err != nil {
		return err
	}
	if c.UsersFile == "" && c.Users == "" && !c.OIDC.On() {
		return errors.New("SAS_CONSOLE_USERS_FILE or SAS_CONSOLE_USERS must name at least one user (sasctl console user add makes one), or SAS_OIDC_ISSUER an identity provider")
	}
	if err := c.OIDC.Check(true, statestore.CheckNamespace, Viewer, Operator); err != nil {
		return err
	}
	if c.OIDC.On() && c.PublicURL == "" {
		return errors.New("SAS_CONSOLE_PUBLIC_URL must be set for sign-in at the identity provider: the provider sends people back to it")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("SAS_CONSOLE_TLS_CERT_FILE and SAS_CONSOLE_TLS_KEY_FILE go together")
	}
	if _, err := parseOrigins(c.PublicURL); err != nil {
		return err
	}
	if c.LoginAttempts < 1 || c.LoginWindow <= 0 || c.SessionTTL <= 0 {
		return errors.New("SAS_CONSOLE_LOGIN_ATTEMPTS, SAS_CONSOLE_LOGIN_WINDOW and SAS_CONSOLE_SESSION_TTL must be positive")
	}
	if c.BulkMax < 1 {
		return errors.New("SAS_CONSOLE_BULK_MAX must be positive")
	}
	return nil
}

// Run serves the console until ctx ends.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	users, err := newDirectory(cfg.UsersFile, cfg.Users, cfg.OIDC.On())
	if err != nil {
		return err
	}
	reg := service.NewRegistry()
	sk, err := service.Start(ctx, service.Setup{Name: "console", Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		DBMaxConns: cfg.DBMaxConns}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	store, ops := sk.Deps.Store, sk.Ops
	if err := service.RetryDB(ctx, logger, "checking the schema", func() error { return store.CheckSchema(ctx) }); err != nil {
		return err
	}
	srv, err := newServer(cfg, store, users, reg, logger)
	if err != nil {
		return err
	}
	layout, err := cfg.Layout()
	if err != nil {
		return err
	}
	if layout != nil {
		// Every partition's store: an order's pages in its own, the
		// orders list merged (SAS_DATABASE_URL's keeps the rest).
		stores, closeParts, err := service.OpenPartitions(ctx, layout, cfg.Database(cfg.DBMaxConns), ops, logger)
		if err != nil {
			return err
		}
		sk.OnClose(closeParts)
		srv.stores = stores
	}
	// Closed after the dial below has ended (Close waits for it first).
	sk.OnClose(srv.closeBroker)
	url, err := cfg.BrokerURL()
	if err != nil {
		return err
	}
	// The pages of the state store work without the broker; dead letters
	// wait for it. The dial runs under the skeleton: ended and waited for
	// at shutdown.
	sk.Go(func(workCtx context.Context) {
		conn, err := broker.Open(workCtx, url, "console", broker.Topology{Prefix: cfg.QueuePrefix}, logger,
			broker.NewMetrics(reg), broker.WithCAFile(cfg.AMQPCAFile), broker.DeclareNothing())
		if err != nil {
			if workCtx.Err() == nil {
				logger.Error("broker", "err", err)
			}
			return
		}
		srv.setBroker(conn)
	})
	failpoint.Delay("console-slow-to-listen")
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("SAS_CONSOLE_ADDR: listen on %s: %w", cfg.Addr, err)
	}
	// Ready only once the pages' address is bound: a check that passed
	// before would send the first request to a closed port.
	ops.SetReady(func(ctx context.Context) error { return store.Ping(ctx) })
	hs := &http.Server{Handler: srv.routes(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if cfg.TLSCertFile != "" {
			err = hs.ServeTLS(ln, cfg.TLSCertFile, cfg.TLSKeyFile)
		} else {
			err = hs.Serve(ln)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	logger.Info("console listening", "addr", ln.Addr().String(), "read_only", cfg.ReadOnly, "tls", cfg.TLSCertFile != "")
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("console server: %w", err)
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = hs.Shutdown(shutCtx)
	wg.Wait()
	return err
}
