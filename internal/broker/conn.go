// Package broker is sas's layer over RabbitMQ: a connection that recovers
// by itself after the broker drops it or restarts, the topology declared
// idempotently on every (re)connect, a publisher that waits for publisher
// confirms and treats returned (unroutable) messages as failures, consumers
// with manual acknowledgements and prefetch, and dead-lettering with a
// reason.
package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/secrets"
)

// ErrClosed is returned once the Conn has been closed.
var ErrClosed = errors.New("broker connection closed")

// Conn is a RabbitMQ connection that reconnects on its own. Channels are
// opened from whichever connection is current; when it drops, users of a
// channel see it close and ask for a new one.
type Conn struct {
	// urls are the nodes to try, in turn (SAS_AMQP_URL: a comma-separated
	// list); next is where the next dial starts: the node that answered
	// last, so a reconnect tries it first and moves on if it is gone.
	urls    []string
	next    int
	url     string // urls as given, for messages
	name    string
	tls     *tls.Config // nil: the library's default for amqps
	topo    Topology
	logger  *slog.Logger
	metrics *Metrics

	// failFast: at Open, a refused login ends it at once and retries are
	// not logged (a command-line tool's behaviour; services keep trying).
	failFast bool
	// declareNothing: the topology is the services'; a client only uses it.
	declareNothing bool
	typeSettled    bool              // the first dial looked for queues of another type
	redact         *secrets.Redactor // removes url's password from errors

	// restored gets a value (if it has none) each time a dropped
	// connection is replaced: see Restored.
	restored chan struct{}

	mu      sync.Mutex
	conn    *amqp.Connection
	ready   chan struct{} // closed while conn is usable
	closed  bool
	stop    chan struct{}
	stopped chan struct{}
}

// Option changes how Open connects.
type Option func(*Conn) error

// WithCAFile trusts the PEM certificates in path (besides the system's) for
// an amqps:// URL; "" changes nothing.
func WithCAFile(path string) Option {
	return func(c *Conn) error {
		if path == "" {
			return nil
		}
		pem, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read CA file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("CA file %s holds no PEM certificate", path)
		}
		c.tls = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		return nil
	}
}

// FailFast makes Open give up at once when the broker refuses the login
// (it cannot succeed by trying again) and keep its retries out of the log:
// for a command-line tool, which should fail with one clear line; the
// caller bounds the wait with ctx.
func FailFast() Option {
	return func(c *Conn) error {
		c.failFast = true
		return nil
	}
}

// DeclareNothing makes the connection declare no queue or exchange: for an
// application's client, whose login may only publish orders and use its
// own reply queue.
func DeclareNothing() Option {
	return func(c *Conn) error {
		c.declareNothing = true
		return nil
	}
}

// IsAuthFailure reports whether err is the broker refusing the login.
func IsAuthFailure(err error) bool {
	var ae *amqp.Error
	return errors.Is(err, amqp.ErrCredentials) || errors.As(err, &ae) && ae.Code == amqp.AccessRefused
}

// SplitURLs reads SAS_AMQP_URL: one URL, or several separated by commas
// (the nodes of a cluster, tried in turn).
func SplitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// Open connects to url (or the first node of a comma-separated list of
// URLs that answers), retrying until ctx is done, declares topo, and keeps
// the connection up until Close: after a drop it reconnects with backoff and
// declares topo again. name labels the connection in the broker's UI.
func Open(ctx context.Context, url, name string, topo Topology, logger *slog.Logger, metrics *Metrics, opts ...Option) (*Conn, error) {
	c := &Conn{
		urls:     SplitURLs(url),
		url:      url,
		name:     name,
		topo:     topo,
		logger:   logger,
		metrics:  metrics,
		ready:    make(chan struct{}),
		stop:     make(chan struct{}),
		stopped:  make(chan struct{}),
		restored: make(chan struct{}, 1),
	}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	if len(c.urls) == 0 {
		return nil, errors.New("no broker URL")
	}
	for _, u := range c.urls {
		if err := secrets.CheckURL("the broker URL", u); err != nil {
			return nil, err
		}
	}
	c.redact = secrets.New(c.urls...)
	// At start a topology that clashes with the broker's (a queue declared
	// with other arguments) is a configuration error: report it at once.
	conn, err := c.dialUntil(ctx, true)
	if err != nil {
		return nil, err
	}
	c.setConn(conn)
	go c.watch(conn)
	return c, nil
}

// topologyError marks a failure to declare the topology on a connection
// that was otherwise fine.
type topologyError struct{ err error }

func (e *topologyError) Error() string { return e.err.Error() }
func (e *topologyError) Unwrap() error { return e.err }

// dialUntil dials and declares the topology, retrying with backoff until it
// succeeds, ctx is done or the Conn is closed. With failOnTopology a
// topology error ends it at once.
func (c *Conn) dialUntil(ctx context.Context, failOnTopology bool) (*amqp.Connection, error) {
	backoff := 100 * time.Millisecond
	for {
		conn, err := c.dial()
		if err == nil {
			return conn, nil
		}
		var te *topologyError
		if failOnTopology && errors.As(err, &te) {
			return nil, fmt.Errorf("declare topology: %w", err)
		}
		if failOnTopology && c.failFast && IsAuthFailure(err) {
			return nil, fmt.Errorf("the broker refused the login (check the user and password in SAS_AMQP_URL, SAS_AMQP_PASSWORD): %w", err)
		}
		if !(failOnTopology && c.failFast) {
			c.logger.Warn("broker connect failed", "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to broker %s: %w (last error: %v)", c.redact.String(c.url), ctx.Err(), err)
		case <-c.stop:
			return nil, ErrClosed
		case <-time.After(jitter(backoff)):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// dial connects to the first node of urls that answers, starting at next,
// and declares the topology there.
func (c *Conn) dial() (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(c.name)
	var conn *amqp.Connection
	var errs []error
	for i := range c.urls {
		at := (c.next + i) % len(c.urls)
		var err error
		conn, err = amqp.DialConfig(c.urls[at], amqp.Config{
			Heartbeat:       10 * time.Second,
			Locale:          "en_US",
			Properties:      props,
			TLSClientConfig: c.tls,
			Dial:            amqp.DefaultDial(5 * time.Second),
		})
		if err == nil {
			c.next = at
			break
		}
		// The library hands back a connection with the error of its
		// handshake (a refused login): it is not usable.
		conn = nil
		if len(c.urls) > 1 {
			err = fmt.Errorf("node %d of %d: %w", at+1, len(c.urls), err)
		}
		errs = append(errs, err)
	}
	if conn == nil {
		return nil, fmt.Errorf("dial: %w", c.redact.Err(errors.Join(errs...)))
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if c.declareNothing {
		return conn, nil
	}
	if !c.typeSettled {
		// Before Open returns, so nothing reads c.topo meanwhile.
		if t := c.topo.existingType(conn); t != "" {
			c.logger.Warn("the queues exist as another type than SAS_QUEUE_TYPE says; keeping theirs (to change it, drain and delete them)",
				"queue", c.topo.Queue(c.topo.Inputs[0]), "existing", t, "SAS_QUEUE_TYPE", c.topo.QueueType)
			c.topo.QueueType = t
		}
		c.typeSettled = true
	}
	if err := c.topo.Declare(ch); err != nil {
		// A connection lost during the declarations is dialled again; a
		// declaration the broker refused on a connection still open (a
		// queue of other arguments, a permission) is the topology's.
		lost := conn.IsClosed()
		conn.Close()
		if lost {
			return nil, fmt.Errorf("declare topology: the connection was lost: %w", err)
		}
		return nil, &topologyError{err}
	}
	return conn, nil
}

// watch waits for conn to drop and replaces it, until Close.
func (c *Conn) watch(conn *amqp.Connection) {
	defer close(c.stopped)
	for {
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		select {
		case <-c.stop:
			return
		case err := <-closed:
			c.mu.Lock()
			c.ready = make(chan struct{})
			c.conn = nil
			c.mu.Unlock()
			c.metrics.connected.Set(0)
			c.logger.Warn("broker connection lost, reconnecting", "err", err)
		}
		// No deadline: keep trying until the broker is back or Close.
		next, err := c.dialUntil(context.Background(), false)
		if err != nil {
			return // closed while reconnecting
		}
		c.metrics.reconnects.Inc()
		c.logger.Info("broker connection restored")
		c.setConn(next)
		conn = next
		select {
		case c.restored <- struct{}{}:
		default:
		}
	}
}

func (c *Conn) setConn(conn *amqp.Connection) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return
	}
	c.conn = conn
	close(c.ready)
	c.metrics.connected.Set(1)
}

// Channel opens a channel on the current connection, waiting for a
// reconnect if there is none.
func (c *Conn) Channel(ctx context.Context) (*amqp.Channel, error) {
	for {
		c.mu.Lock()
		conn, ready, closed := c.conn, c.ready, c.closed
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if conn != nil {
			ch, err := conn.Channel()
			if err == nil {
				return ch, nil
			}
			if !conn.IsClosed() {
				return nil, fmt.Errorf("open channel: %w", err)
			}
			// The connection dropped under us; wait for watch to notice.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ready:
		}
	}
}

// Connected reports whether a connection is up now.
func (c *Conn) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil && !c.conn.IsClosed()
}

// Topology is what this Conn declares on every connect: the queues' type
// is the one they exist as, when it differs from the one asked for.
func (c *Conn) Topology() Topology { return c.topo }

// Server names the broker of the current connection as its handshake
// did ("RabbitMQ 3.10.7"), or "" while there is none.
func (c *Conn) Server() string {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		return ""
	}
	product, _ := conn.Properties["product"].(string)
	version, _ := conn.Properties["version"].(string)
	return strings.TrimSpace(product + " " + version)
}

// Restored receives after a dropped connection was replaced by a new one
// (several drops before it is read are one value): whatever a broker that
// restarted lost, a reader may put back. For one reader.
func (c *Conn) Restored() <-chan struct{} { return c.restored }

// Close closes the connection and stops reconnecting. Safe to call twice.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	conn := c.conn
	c.conn = nil
	close(c.stop)
	c.mu.Unlock()
	<-c.stopped
	c.metrics.connected.Set(0)
	if conn != nil && !conn.IsClosed() {
		return conn.Close()
	}
	return nil
}

// jitter spreads d over [d/2, d) so that replicas do not retry in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}
