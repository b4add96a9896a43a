// Package client is how a Go application uses sas: Submit posts an order
// to the submit queue, confirmed by the broker and safe to repeat (the same
// id with the same payload is one order); Await waits for its outcome and
// Watch streams its status events. Both read a reply queue of the client's
// own, named in every order it submits, so the client consumes nothing
// meant for anyone else.
//
// The reply queue is durable and outlives a dropped connection (the client
// reconnects and consumes it again), and the broker deletes it once no
// client has used it for Config.ReplyQueueTTL. Events are delivered at
// least once; the client drops the repeats.
//
// From a module of your own: sas's module path is "sas", which no module
// proxy serves, so require it and replace it with a checkout of sas in
// your go.mod, then go mod tidy:
//
//	require sas v0.0.0-00010101000000-000000000000
//	replace sas => ../sas
//
// examples/ownmodule is such a module; make test builds and runs it.
package client

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
)

// Config says how to reach sas.
type Config struct {
	// URL is the RabbitMQ URL (amqps:// for TLS).
	URL string
	// CAFile is a PEM file of CA certificates to trust besides the
	// system's.
	CAFile string
	// QueuePrefix is the deployment's SAS_QUEUE_PREFIX; "" means "sas.".
	QueuePrefix string
	// SubmitExchange, when set, is where submits go instead of the
	// submit queue's own exchange: a partitioned deployment's routing
	// exchange (its layout's exchange), which takes the order id as
	// routing key and sends each order to its partition. Status events
	// come back to this client's reply queue from whichever partition
	// holds the order.
	SubmitExchange string
	// ReplyQueueTTL is how long the reply queue lives unused (after the
	// client is gone); 0 means 30 minutes.
	ReplyQueueTTL time.Duration
	// Logger receives connection trouble; nil discards it.
	Logger *slog.Logger
}

// Order is what Submit posts.
type Order struct {
	// ID is the order's id, a UUID; "" makes one. Submitting the same id
	// with the same workflow and payload again is harmless.
	ID string
	// Workflow names a workflow of the deployment's workflows file.
	Workflow string
	// Payload is the order's data: any value that marshals to a JSON
	// object (a struct, a map, or a json.RawMessage).
	Payload any
	// Priority is 0 (default) to 9.
	Priority int
	// PlacedAt is kept with the order for the record.
	PlacedAt *time.Time
	// StartAt, when later than the order is written (on the database
	// clock), holds its first steps until then: an order that starts later.
	StartAt *time.Time
}

// Status is one status event of an order.
type Status struct {
	OrderID string
	// Status is received, processing, completed, compensating, failed or
	// error (held for an operator).
	Status string
	Step   *int
	At     time.Time
	// Results are, on the event that ends an order, its actions' results
	// by action name; ResultsTruncated says they were too large to send.
	Results          json.RawMessage
	ResultsTruncated bool
	// On the event that ends an order failed or in error, why: Reason is
	// refused (a step's service refused it for good), timed_out (a step's
	// complete_by passed as often as it may) or cancelled (an operator
	// cancelled the order); FailedStep names the step that failed (Step
	// is its number); Detail holds its last error and its service's last
	// answer, in their words; Undone names the actions whose effects
	// were undone, whose results Results still shows.
	Reason     string
	FailedStep string
	Detail     string
	Undone     []string
	// Skipped names, on the event that ends an order of a graph, the
	// steps that did not run because their when was false.
	Skipped []string
}

// Ended reports whether the order ended (completed or failed) or is held
// in error for an operator.
func (s Status) Ended() bool {
	return s.Status == messages.StatusCompleted || s.Status == messages.StatusFailed || s.Status == messages.StatusError
}

// RejectedError is a submit the submitter dead-lettered: the order does
// not exist. Reason is the dead letter's x-error-reason (e.g.
// invalid_payload, unknown_workflow, conflict), Detail its sentence.
type RejectedError struct {
	OrderID string
	Reason  string
	Detail  string
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("order %s was rejected (%s): %s", e.OrderID, e.Reason, e.Detail)
}

// ErrClosed is what Await returns once the client is closed.
var ErrClosed = errors.New("client: closed")

// Client submits orders and follows them. It is safe for concurrent use.
type Client struct {
	cfg        Config
	conn       *broker.Conn
	pub        *broker.Publisher
	submit     string
	signals    string
	replyQueue string
	logger     *slog.Logger

	mu     sync.Mutex
	orders map[string]*tracked
	// refusedSignals: the refusals of signals this client sent, by id.
	refusedSignals map[string]*RejectedError
	closed         bool

	stop    context.CancelFunc
	stopped chan struct{}
}

// tracked is what the client knows of one order: its events so far, what
// became of each time it was submitted, and whoever waits for more.
type tracked struct {
	seen   map[string]bool // message ids, to drop repeats
	events []Status
	// subs are the order's submissions by this client, in order; each
	// carried a correlation id of its own, which the event answering it
	// ("received" or "rejected") brings back.
	subs []*submission
	// rejected is a refusal that names no submission of this client's (a
	// sas that sends no correlation id): it answers any not answered yet.
	rejected *RejectedError
	changed  chan struct{} // closed and replaced at every new event
}

// submission is one Submit of an order: its correlation id, the hash of
// what it submitted, and the answer to it, once known.
type submission struct {
	token    string
	hash     [32]byte
	accepted bool // the order was written from it ("received")
	rejected *RejectedError
}

// verdict is what Await answers for the order's last submission: its
// refusal, or whether the order's events are that submission's. An order
// id submitted again with other content gets a conflict, never the first
// order's outcome; submitted again after a refusal, the new submission's
// answer, never the old refusal.
func (t *tracked) verdict() (rejected *RejectedError, eventsAreIts bool) {
	if len(t.subs) == 0 {
		return t.rejected, true // an order this client did not submit: Watch's
	}
	last := t.subs[len(t.subs)-1]
	if last.rejected != nil {
		return last.rejected, false
	}
	if last.accepted {
		return nil, true
	}
	// Events reach this client's queue only from an order one of its own
	// submissions wrote; they are the last one's when every submission
	// that may have written it had the last one's content.
	for _, s := range t.subs[:len(t.subs)-1] {
		if s.hash != last.hash && s.rejected == nil {
			// Its order (other content) may be the one there is: wait
			// for the answers; the last one's will be a conflict if so.
			return nil, false
		}
	}
	if t.rejected != nil {
		return t.rejected, false
	}
	return nil, true
}

// Connect connects to the broker, declares the client's reply queue and
// starts consuming it.
func Connect(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.QueuePrefix == "" {
		cfg.QueuePrefix = "sas."
	}
	if cfg.ReplyQueueTTL <= 0 {
		cfg.ReplyQueueTTL = 30 * time.Minute
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	bm := broker.NewMetrics(nil)
	conn, err := broker.Open(ctx, cfg.URL, "sas-client", broker.Topology{Prefix: cfg.QueuePrefix}, logger, bm,
		broker.WithCAFile(cfg.CAFile), broker.DeclareNothing(), broker.FailFast())
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c := &Client{cfg: cfg, conn: conn, pub: broker.NewPublisher(conn, bm), logger: logger,
		submit: cmp.Or(cfg.SubmitExchange, cfg.QueuePrefix+"submit"), signals: cfg.QueuePrefix + messages.SignalsQueue, replyQueue: cfg.QueuePrefix + "client." + messages.NewID(),
		orders: map[string]*tracked{}, refusedSignals: map[string]*RejectedError{}, stopped: make(chan struct{})}
	// The queue exists before the first order names it.
	if err := c.declare(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go c.consume(runCtx)
	return c, nil
}

// ReplyQueue is the name of the client's reply queue.
func (c *Client) ReplyQueue() string { return c.replyQueue }

func (c *Client) declare(ctx context.Context) error {
	ch, err := c.conn.Channel(ctx)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer ch.Close()
	return c.declareOn(ch)
}

func (c *Client) declareOn(ch *amqp.Channel) error {
	_, err := ch.QueueDeclare(c.replyQueue, true, false, false, false,
		amqp.Table{"x-expires": int32(c.cfg.ReplyQueueTTL.Milliseconds())})
	if err != nil {
		return fmt.Errorf("client: declare reply queue %s: %w", c.replyQueue, err)
	}
	return nil
}

// Submit posts an order, waits for the broker's confirm, and returns its
// id. A publish that was not confirmed is sent again (a repeat is the same
// order); an error means the order may or may not have been taken: call
// Submit again with the same ID.
func (c *Client) Submit(ctx context.Context, o Order) (string, error) {
	if o.ID == "" {
		o.ID = messages.NewID()
	}
	payload, err := json.Marshal(o.Payload)
	if err != nil {
		return "", fmt.Errorf("client: payload: %w", err)
	}
	msg := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: o.ID, Workflow: o.Workflow,
		Payload: payload, Priority: o.Priority, ReplyTo: c.replyQueue, PlacedAt: o.PlacedAt, StartAt: o.StartAt}
	body, err := messages.Encode(msg)
	if err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	id := msg.Normalized().OrderID
	sub := &submission{token: messages.NewID(), hash: sha256.Sum256(msg.Canonical())}
	t := c.track(id)
	c.mu.Lock()
	t.subs = append(t.subs, sub)
	close(t.changed)
	t.changed = make(chan struct{})
	c.mu.Unlock()
	// The correlation id comes back with the event that answers this
	// submission ("received" or "rejected"): Await answers for it.
	pub := amqp.Publishing{ContentType: messages.ContentType, Type: messages.TypeSubmitOrder, MessageId: id, CorrelationId: sub.token,
		DeliveryMode: amqp.Persistent, Body: body, Headers: amqp.Table{"schema_version": int32(messages.SubmitOrderVersion)}}
	backoff := 50 * time.Millisecond
	for {
		pub.Timestamp = time.Now()
		// Through the submit queue's own exchange: an application's
		// login may publish there and nowhere else (sasctl broker users).
		// A partitioned deployment's routing exchange takes the order id
		// as routing key; the submit queue's fanout exchange ignores it.
		err = c.pub.Publish(ctx, c.submit, id, pub)
		if err == nil {
			return id, nil
		}
		if ctx.Err() != nil || c.isClosed() {
			return id, fmt.Errorf("client: submit %s: %w", id, err)
		}
		// Unconfirmed, or the connection dropped: the same order again.
		c.logger.Warn("submit not confirmed, publishing again", "order_id", id, "err", err)
		select {
		case <-ctx.Done():
			return id, fmt.Errorf("client: submit %s: %w", id, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Signal sends a signal for an order: it ends the order's step that
// waits for a signal of this name (its payload, any value that marshals
// to JSON, or nil, becomes the step's result); one sent before that wait
// began is kept until it begins. It returns the signal's id, made here:
// a signal sent again with SignalWithID and the same id is applied once.
// A refusal (unknown or ended order, no step waiting for the name, a
// payload the wait's schema refuses) is dead-lettered and told to this
// client's reply queue as a rejected status event.
func (c *Client) Signal(ctx context.Context, orderID, name string, payload any) (string, error) {
	id := messages.NewID()
	return id, c.SignalWithID(ctx, id, orderID, name, payload)
}

// SignalRefusal says why a signal this client sent was refused, once its
// refusal came back (nil: none came, or it was applied or kept). The
// client remembers the last few thousand refusals.
func (c *Client) SignalRefusal(signalID string) *RejectedError {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refusedSignals[signalID]
}

// signalCorrelation starts the correlation id of a signal, so that its
// refusal is told apart from an order's events.
const signalCorrelation = "signal:"

const maxRefusedSignals = 4096

// SignalWithID sends a signal as Signal does, with the caller's id.
func (c *Client) SignalWithID(ctx context.Context, signalID, orderID, name string, payload any) error {
	var raw json.RawMessage
	if payload != nil {
		b, err := json.Marshal(payload)
		if err != nil {
			return fmt.Errorf("client: signal payload: %w", err)
		}
		raw = b
	}
	return c.sendSignal(ctx, messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: signalID, OrderID: orderID,
		Name: name, Payload: raw, ReplyTo: c.replyQueue})
}

// Complete ends, done, the step whose service answered its call 202
// Accepted: token is the call's Sas-Step-Token, result (any value that
// marshals to a JSON object, or nil) the step's result. It returns the
// callback's id: a refusal comes back as a signal's does
// (SignalRefusal): invalid_token for a token sas did not make,
// stale_token for one of an attempt that no longer runs (a later attempt
// called with a new token, or the step ended); either changed nothing.
func (c *Client) Complete(ctx context.Context, token string, result any) (string, error) {
	var raw json.RawMessage
	if result != nil {
		b, err := json.Marshal(result)
		if err != nil {
			return "", fmt.Errorf("client: callback result: %w", err)
		}
		raw = b
	}
	return c.callback(ctx, messages.Signal{Token: token, Name: messages.CallbackComplete, Payload: raw})
}

// Fail ends, failed for good with reason, the step whose service
// answered its call 202 Accepted (as Complete).
func (c *Client) Fail(ctx context.Context, token, reason string) (string, error) {
	return c.callback(ctx, messages.Signal{Token: token, Name: messages.CallbackFail, Error: reason})
}

// Heartbeat holds open the step whose service answered its call 202
// Accepted: its complete_by moves out by the step's timeout, never past
// the step's max_duration (as Complete).
func (c *Client) Heartbeat(ctx context.Context, token string) (string, error) {
	return c.callback(ctx, messages.Signal{Token: token, Name: messages.CallbackHeartbeat})
}

func (c *Client) callback(ctx context.Context, sig messages.Signal) (string, error) {
	sig.SchemaVersion, sig.SignalID, sig.ReplyTo = messages.SignalVersion, messages.NewID(), c.replyQueue
	return sig.SignalID, c.sendSignal(ctx, sig)
}

// sendSignal publishes a signal (or a callback) until the broker confirms
// it; its refusal comes back to this client's reply queue.
func (c *Client) sendSignal(ctx context.Context, sig messages.Signal) error {
	signalID := sig.SignalID
	body, err := messages.Encode(sig)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	pub := amqp.Publishing{ContentType: messages.ContentType, Type: messages.TypeSignal, MessageId: signalID,
		CorrelationId: signalCorrelation + signalID,
		DeliveryMode:  amqp.Persistent, Body: body, Headers: amqp.Table{"schema_version": int32(messages.SignalVersion)}}
	backoff := 50 * time.Millisecond
	for {
		pub.Timestamp = time.Now()
		err = c.pub.Publish(ctx, c.signals, "", pub)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || c.isClosed() {
			return fmt.Errorf("client: signal %s: %w", signalID, err)
		}
		// Unconfirmed, or the connection dropped: the same signal again.
		c.logger.Warn("signal not confirmed, publishing again", "signal_id", signalID, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("client: signal %s: %w", signalID, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Await waits until the order ends (completed or failed) or is held in
// error, and returns that status with its results. It answers for the
// last Submit of the id: a submit the submitter refused returns a
// *RejectedError, even when an earlier submit of the same id (with other
// content) made an order that ended.
func (c *Client) Await(ctx context.Context, id string) (Status, error) {
	t := c.track(id)
	for {
		c.mu.Lock()
		rejected, its := t.verdict()
		if rejected != nil {
			c.mu.Unlock()
			return Status{}, rejected
		}
		for _, ev := range t.events {
			if its && ev.Ended() {
				c.mu.Unlock()
				return ev, nil
			}
		}
		changed, closed := t.changed, c.closed
		c.mu.Unlock()
		if closed {
			return Status{}, ErrClosed
		}
		select {
		case <-ctx.Done():
			return Status{}, fmt.Errorf("client: await %s: %w", id, ctx.Err())
		case <-changed:
		}
	}
}

// Watch sends the order's status events, those seen already first, until
// the order ends or is held in error (the channel is then closed), or ctx
// ends. A rejected submit sends nothing and closes the channel; Await
// tells why.
func (c *Client) Watch(ctx context.Context, id string) <-chan Status {
	out := make(chan Status, 8)
	t := c.track(id)
	go func() {
		defer close(out)
		sent := 0
		for {
			c.mu.Lock()
			events := t.events[sent:]
			r, _ := t.verdict()
			rejected, changed, closed := r != nil, t.changed, c.closed
			c.mu.Unlock()
			for _, ev := range events {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
				sent++
				if ev.Ended() {
					return
				}
			}
			if rejected || closed {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}()
	return out
}

// Forget drops what the client keeps of an order (its events), once the
// application has what it needs.
func (c *Client) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.orders, id)
}

// Close stops consuming and closes the connection. The reply queue is
// left to expire. Safe to call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for _, t := range c.orders {
		close(t.changed)
		t.changed = make(chan struct{})
	}
	c.mu.Unlock()
	c.stop()
	err := c.conn.Close()
	<-c.stopped
	return err
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) track(id string) *tracked {
	if canon, ok := messages.CanonicalID(id); ok {
		id = canon
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.orders[id]
	if !ok {
		t = &tracked{seen: map[string]bool{}, changed: make(chan struct{})}
		c.orders[id] = t
	}
	return t
}

// consume reads the reply queue until Close, again on every new channel
// after a dropped connection.
func (c *Client) consume(ctx context.Context) {
	defer close(c.stopped)
	for ctx.Err() == nil {
		ch, err := c.conn.Channel(ctx)
		if errors.Is(err, broker.ErrClosed) || ctx.Err() != nil {
			return // closed
		}
		if err != nil {
			// Not closed: the connection failed under us. Stopping here
			// would leave every Await waiting for events nobody reads.
			c.logger.Warn("reply queue: no channel; trying again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err := c.consumeOn(ctx, ch); err != nil && ctx.Err() == nil {
			c.logger.Warn("reply queue consumer stopped; consuming again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		ch.Close()
	}
}

func (c *Client) consumeOn(ctx context.Context, ch *amqp.Channel) error {
	if err := c.declareOn(ch); err != nil {
		return err
	}
	if err := ch.Qos(256, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(c.replyQueue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("channel closed")
			}
			c.deliver(d)
			_ = d.Ack(false)
		}
	}
}

func (c *Client) deliver(d amqp.Delivery) {
	ev, err := messages.DecodeStatusEvent(d.Body)
	if err != nil {
		c.logger.Warn("not a status event on the reply queue; dropped", "message_id", d.MessageId, "err", err)
		return
	}
	if id, ok := strings.CutPrefix(d.CorrelationId, signalCorrelation); ok && ev.Status == messages.StatusRejected {
		// A signal's refusal: it says nothing of the order itself.
		c.mu.Lock()
		if len(c.refusedSignals) >= maxRefusedSignals {
			clear(c.refusedSignals)
		}
		c.refusedSignals[id] = &RejectedError{OrderID: ev.OrderID, Reason: ev.Reason, Detail: ev.Detail}
		c.mu.Unlock()
		return
	}
	if ev.OrderID == "" {
		return // the refusal of a message that named no order: none of this client's
	}
	t := c.track(ev.OrderID)
	key := d.MessageId
	if key == "" {
		key = ev.Status + "@" + ev.At.String()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.seen[key] {
		return // a repeat
	}
	t.seen[key] = true
	var sub *submission
	for _, s := range t.subs {
		if d.CorrelationId != "" && s.token == d.CorrelationId {
			sub = s
		}
	}
	switch {
	case ev.Status == messages.StatusRejected && sub != nil:
		sub.rejected = &RejectedError{OrderID: ev.OrderID, Reason: ev.Reason, Detail: ev.Detail}
	case ev.Status == messages.StatusRejected:
		t.rejected = &RejectedError{OrderID: ev.OrderID, Reason: ev.Reason, Detail: ev.Detail}
	case ev.Status == messages.StatusReceived && sub != nil:
		sub.accepted = true
	}
	if ev.Status != messages.StatusRejected {
		t.events = append(t.events, statusOf(ev))
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// statusOf is a status event as the client gives it.
func statusOf(ev messages.StatusEvent) Status {
	return Status{OrderID: ev.OrderID, Status: ev.Status, Step: ev.Step, At: ev.At,
		Results: ev.Results, ResultsTruncated: ev.ResultsTruncated,
		Reason: ev.Reason, FailedStep: ev.FailedStep, Detail: ev.Detail, Undone: ev.Undone, Skipped: ev.Skipped}
}
