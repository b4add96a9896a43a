package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publishing errors callers branch on.
var (
	// ErrReturned: the broker could not route the message to any queue
	// (it was published mandatory and came back).
	ErrReturned = errors.New("message returned by the broker: no queue bound")
	// ErrNacked: the broker refused the message.
	ErrNacked = errors.New("message nacked by the broker")
	// ErrUnconfirmed: the channel closed before the broker confirmed; the
	// message may or may not have been stored. Publish again (consumers
	// are idempotent on message ids).
	ErrUnconfirmed = errors.New("message not confirmed: channel closed")
)

// Publisher publishes persistent messages and waits for the broker's
// confirm. Every message is published mandatory: one the broker cannot
// route comes back as ErrReturned instead of vanishing. It is safe for
// concurrent use; concurrent publishes share one channel and wait for their
// confirms independently.
type Publisher struct {
	conn    *Conn
	metrics *Metrics

	// inflight bounds concurrent publishes below returnBuffer, so the
	// library's reader can never block on a full returns buffer while the
	// confirms that would drain it wait behind it.
	inflight chan struct{}

	mu  sync.Mutex
	cur *confirmChannel
}

const (
	maxInflight  = 1024
	returnBuffer = 2 * maxInflight
)

// confirmChannel is a channel in confirm mode and the returns it got.
type confirmChannel struct {
	ch      *amqp.Channel
	returns chan amqp.Return

	mu       sync.Mutex
	returned map[string]amqp.Return // by message id
}

// NewPublisher returns a publisher over conn. It opens its channel on first
// use and again after the channel or connection drops.
func NewPublisher(conn *Conn, metrics *Metrics) *Publisher {
	return &Publisher{conn: conn, metrics: metrics, inflight: make(chan struct{}, maxInflight)}
}

func (p *Publisher) channel(ctx context.Context) (*confirmChannel, error) {
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	if cur != nil && !cur.ch.IsClosed() {
		return cur, nil
	}
	// Open outside the lock: waiting for a reconnect must not hold up
	// other publishers past their own deadlines.
	ch, err := p.conn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	cc := &confirmChannel{
		ch:       ch,
		returns:  ch.NotifyReturn(make(chan amqp.Return, returnBuffer)),
		returned: map[string]amqp.Return{},
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil && !p.cur.ch.IsClosed() {
		ch.Close() // another publisher got there first
		return p.cur, nil
	}
	p.cur = cc
	return cc, nil
}

// retire closes a channel the broker nacked a message on, so that the next
// publish opens a new one. A RabbitMQ 3.10 channel that published to a
// quorum queue while the queue's leader node died was seen to nack every
// later message to that queue for minutes, while a new channel published
// at once (TestBrokerClusterFailover; docs/RELIABILITY.md). Messages still awaiting a confirm on it get
// ErrUnconfirmed and are published again by their callers.
func (p *Publisher) retire(cc *confirmChannel) {
	p.mu.Lock()
	if p.cur == cc {
		p.cur = nil
	}
	p.mu.Unlock()
	cc.ch.Close()
}

// takeReturn reports whether the message id came back. It is called after
// the message's confirm arrived. The library hands a basic.return over (into
// the returns buffer) before it resolves the basic.ack of the same message,
// so the return, if any, is in the buffer or already in the map. No other
// goroutine reads the buffer, so nothing can be in between.
func (cc *confirmChannel) takeReturn(id string) (amqp.Return, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
drain:
	for {
		select {
		case r, ok := <-cc.returns:
			if !ok {
				break drain
			}
			cc.returned[r.MessageId] = r
		default:
			break drain
		}
	}
	r, ok := cc.returned[id]
	if ok {
		delete(cc.returned, id)
	}
	return r, ok
}

// Publish sends msg to exchange with routing key, persistent (unless
// msg.DeliveryMode is amqp.Transient) and mandatory, and waits until the
// broker confirms it. msg.MessageId must be set.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	pending, err := p.Start(ctx, exchange, key, msg)
	if err != nil {
		return err
	}
	return pending.Wait(ctx)
}

// Pending is a published message whose confirm has not been awaited yet.
type Pending struct {
	p         *Publisher
	cc        *confirmChannel
	dc        *amqp.DeferredConfirmation
	id        string
	exchange  string
	key       string
	release   func()
	completed bool
}

// Start publishes msg like Publish but returns without waiting for the
// confirm, so that a caller can have many messages in flight on one channel
// while keeping their order. Every Pending must be waited for.
func (p *Publisher) Start(ctx context.Context, exchange, key string, msg amqp.Publishing) (*Pending, error) {
	if msg.MessageId == "" {
		return nil, errors.New("publish: message id is required")
	}
	// Persistent, unless the caller asked for transient: step requests
	// and replies on classic queues (SAS_STEP_MESSAGES), whose contents
	// the state store holds.
	if msg.DeliveryMode != amqp.Transient {
		msg.DeliveryMode = amqp.Persistent
	}
	select {
	case p.inflight <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("publish: %w", ctx.Err())
	}
	release := func() { <-p.inflight }
	cc, err := p.channel(ctx)
	if err != nil {
		release()
		p.metrics.published.WithLabelValues("failed").Inc()
		return nil, fmt.Errorf("publish: %w", err)
	}
	dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		release()
		p.metrics.published.WithLabelValues("failed").Inc()
		return nil, fmt.Errorf("publish to %q/%q: %w", exchange, key, err)
	}
	return &Pending{p: p, cc: cc, dc: dc, id: msg.MessageId, exchange: exchange, key: key, release: release}, nil
}

// Wait waits for the broker's confirm: nil, or ErrReturned, ErrNacked,
// ErrUnconfirmed or ctx's error.
func (pm *Pending) Wait(ctx context.Context) error {
	if pm.completed {
		return errors.New("publish: confirm already awaited")
	}
	pm.completed = true
	defer pm.release()
	p, cc := pm.p, pm.cc
	acked, err := pm.dc.WaitContext(ctx)
	if err != nil {
		p.metrics.published.WithLabelValues("failed").Inc()
		return fmt.Errorf("publish to %q/%q: wait for confirm: %w", pm.exchange, pm.key, err)
	}
	if r, returned := cc.takeReturn(pm.id); returned {
		p.metrics.published.WithLabelValues("returned").Inc()
		return fmt.Errorf("publish to %q/%q: %w (%d %s)", pm.exchange, pm.key, ErrReturned, r.ReplyCode, r.ReplyText)
	}
	if !acked {
		if cc.ch.IsClosed() {
			p.metrics.published.WithLabelValues("failed").Inc()
			return fmt.Errorf("publish to %q/%q: %w", pm.exchange, pm.key, ErrUnconfirmed)
		}
		p.metrics.published.WithLabelValues("nacked").Inc()
		p.retire(cc)
		return fmt.Errorf("publish to %q/%q: %w", pm.exchange, pm.key, ErrNacked)
	}
	p.metrics.published.WithLabelValues("confirmed").Inc()
	return nil
}

// Close closes the publisher's channel. Safe to call twice.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return nil
	}
	cc := p.cur
	p.cur = nil
	if cc.ch.IsClosed() {
		return nil
	}
	return cc.ch.Close()
}
