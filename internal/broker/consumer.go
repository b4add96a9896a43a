package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Rejection is a handler's verdict that a message can never be processed.
type Rejection struct {
	Reason string // short, machine-readable: becomes x-error-reason and a metric label
	Detail string // a human-readable sentence: becomes x-error-detail
	// Namespace is the namespace the message was found to be of (its
	// publisher was granted it), "" when none was: becomes
	// x-sas-namespace, whose dead letters that namespace's operators see.
	Namespace string
}

// InNamespace marks err, when it is a Rejection, as of namespace ns
// (nothing for ""); it returns err.
func InNamespace(err error, ns string) error {
	var rej *Rejection
	if ns != "" && errors.As(err, &rej) {
		rej.Namespace = ns
	}
	return err
}

func (r *Rejection) Error() string { return r.Reason + ": " + r.Detail }

// Reject returns the error a Handler returns to dead-letter a message.
func Reject(reason, detail string) error {
	return &Rejection{Reason: reason, Detail: detail}
}

// Reasoned is an error that knows its dead-letter reason (the messages
// package's DecodeError is one).
type Reasoned interface {
	error
	DeadLetterReason() (reason, detail string)
}

// RejectFor dead-letters for err: with its own reason if it has one
// (errors.As finds a Reasoned), otherwise with fallback.
func RejectFor(err error, fallback string) error {
	var r Reasoned
	if errors.As(err, &r) {
		reason, detail := r.DeadLetterReason()
		return Reject(reason, detail)
	}
	return Reject(fallback, err.Error())
}

// ReasonHandlerPanic is the dead-letter reason of a message whose handler
// panicked.
const ReasonHandlerPanic = "handler_panic"

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Input is the unprefixed name of an input queue of the topology.
	Input string
	// Reasons are the dead-letter reasons the handler may give: their
	// series of sas_dead_lettered_total exist from the start, at zero, so
	// that a rule sees the first one (ReasonHandlerPanic is added).
	Reasons []string
	// Prefetch is how many unacked deliveries the broker may hand over.
	Prefetch int
	// Workers is how many deliveries are handled at once.
	Workers int
}

// Consumer consumes one input queue with manual acks, and consumes again
// after its channel or connection drops.
type Consumer struct {
	conn    *Conn
	pub     *Publisher
	cfg     ConsumerConfig
	handler Handler
	logger  *slog.Logger
	metrics *Metrics
	dlx     string // the dead-letter exchange: sas's own copies come through it

	mu      sync.Mutex
	running bool
}

// NewConsumer returns a consumer of handler, which it wraps in Recover;
// the service chains its other middleware (Chain). pub is used to
// dead-letter.
func NewConsumer(conn *Conn, pub *Publisher, cfg ConsumerConfig, handler Handler, logger *slog.Logger, metrics *Metrics) *Consumer {
	cfg.Prefetch = max(cfg.Prefetch, 1)
	cfg.Workers = max(cfg.Workers, 1)
	queue := conn.Topology().Queue(cfg.Input)
	reasons := append([]string{ReasonHandlerPanic}, cfg.Reasons...)
	if conn.Topology().Classic() {
		reasons = append(reasons, ReasonDeliveryLimit) // counted here, not by RabbitMQ
	}
	for _, reason := range reasons {
		metrics.deadLettered.WithLabelValues(queue, reason)
	}
	for _, result := range []string{"ack", "requeue", "dead_letter"} {
		metrics.consumed.WithLabelValues(queue, result)
	}
	panics := metrics.panics.WithLabelValues(queue)
	metrics.ackFrames.WithLabelValues(queue)
	handler = Chain(handler, Recover(logger, queue, panics.Inc))
	return &Consumer{conn: conn, pub: pub, cfg: cfg, handler: handler, logger: logger, metrics: metrics, dlx: conn.Topology().DeadLetterExchange()}
}

// Running reports whether the consumer is subscribed now.
func (c *Consumer) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

func (c *Consumer) setRunning(v bool) {
	c.mu.Lock()
	c.running = v
	c.mu.Unlock()
}

// Run consumes until ctx is done, then stops taking deliveries, lets the
// handlers in progress finish and returns nil.
func (c *Consumer) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := c.consume(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrClosed) {
			return err
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		c.logger.Warn("consumer stopped, subscribing again", "queue", c.cfg.Input, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(jitter(backoff)):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

// consume subscribes once and handles deliveries until the channel closes
// or ctx is done.
func (c *Consumer) consume(ctx context.Context) error {
	ch, err := c.conn.Channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	// Declare again on every subscribe, not only on connect: a queue
	// deleted under a live connection comes back here.
	if err := c.conn.Topology().Declare(ch); err != nil {
		return err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("set prefetch: %w", err)
	}
	topo := c.conn.Topology()
	queue := topo.Queue(c.cfg.Input)
	if topo.Classic() {
		// The way back in for a delivery the consumer counts (redeliver).
		if err := ch.QueueBind(queue, queue, topo.DeadLetterExchange(), false, nil); err != nil {
			return fmt.Errorf("bind %s to %s: %w", queue, topo.DeadLetterExchange(), err)
		}
	}
	tag := fmt.Sprintf("%s-%p", queue, ch)
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", queue, err)
	}
	c.setRunning(true)
	defer c.setRunning(false)

	// Stop the subscription when ctx is done; the library then closes
	// deliveries and the workers drain what was already handed over.
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			_ = ch.Cancel(tag, false)
		case <-stopped:
		}
	}()

	// The acks go through one acker, grouped; it sends what it holds
	// once the workers are done, before the channel closes.
	settled := make(chan settlement, c.cfg.Prefetch)
	ack := newAcker(ch, c.cfg.Prefetch, func() { c.metrics.ackFrames.WithLabelValues(queue).Inc() }, func(err error) {
		// The channel is gone; the broker will redeliver, and the
		// handlers' work is idempotent.
		c.logger.Warn("ack failed", "queue", queue, "err", err)
	})
	ackerDone := make(chan struct{})
	go func() {
		defer close(ackerDone)
		ack.run(settled)
	}()
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for d := range deliveries {
				settled <- c.handle(ctx, queue, d)
			}
		})
	}
	wg.Wait()
	close(settled)
	<-ackerDone
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("delivery channel closed")
}

// handle handles one delivery and returns what to tell the broker.
func (c *Consumer) handle(ctx context.Context, queue string, d amqp.Delivery) settlement {
	ack, requeue := settlement{tag: d.DeliveryTag}, settlement{tag: d.DeliveryTag, requeue: true}
	if ctx.Err() != nil {
		// Shutting down: hand it back untouched for another consumer.
		c.metrics.consumed.WithLabelValues(queue, "requeue").Inc()
		return requeue
	}
	if d.Redelivered && c.conn.Topology().Classic() {
		return c.redeliver(ctx, queue, d)
	}
	via, user := origin(d, c.dlx)
	err := c.handler(ctx, Message{ID: d.MessageId, CorrelationID: d.CorrelationId, ContentType: d.ContentType, UserID: user, Via: via,
		Headers: d.Headers, Body: d.Body})
	var rej *Rejection
	switch {
	case err == nil:
		c.metrics.consumed.WithLabelValues(queue, "ack").Inc()
		return ack
	case errors.As(err, &rej):
		return c.deadLetter(ctx, queue, d, rej)
	default:
		if ctx.Err() == nil {
			c.logger.Warn("handler failed, requeueing", "queue", queue, "message_id", d.MessageId, "err", err)
		}
		c.metrics.consumed.WithLabelValues(queue, "requeue").Inc()
		return requeue
	}
}

// deadLetter republishes d to its dead-letter queue with the reason and
// acks it once confirmed; if that fails, it requeues d, so that it is
// never lost.
func (c *Consumer) deadLetter(ctx context.Context, queue string, d amqp.Delivery, rej *Rejection) settlement {
	reason, detail := rej.Reason, rej.Detail
	if err := c.pub.DeadLetter(ctx, c.conn.Topology(), c.cfg.Input, d, *rej); err != nil {
		c.logger.Error("dead-letter failed, requeueing", "queue", queue, "message_id", d.MessageId, "reason", reason, "err", err)
		c.metrics.consumed.WithLabelValues(queue, "requeue").Inc()
		return settlement{tag: d.DeliveryTag, requeue: true}
	}
	c.metrics.deadLettered.WithLabelValues(queue, reason).Inc()
	c.logger.Warn("message dead-lettered", "queue", queue, "message_id", d.MessageId, "reason", reason, "detail", detail)
	c.metrics.consumed.WithLabelValues(queue, "dead_letter").Inc()
	return settlement{tag: d.DeliveryTag}
}

// HeaderRedeliveries counts, on a message of a classic queue, its
// deliveries that ended without an ack (a crash, a requeue). A quorum
// queue counts them itself (x-delivery-limit); a classic one only marks
// a delivery redelivered.
const HeaderRedeliveries = "x-sas-redeliveries"

// ReasonDeliveryLimit is the dead-letter reason of a message delivered
// the delivery limit's number of times without an ack: RabbitMQ's own for
// a quorum queue, the consumer's for a classic one.
const ReasonDeliveryLimit = "delivery_limit"

// redeliver counts a redelivered message of a classic queue durably, in
// the message itself: it publishes a copy with the count one higher,
// through the dead-letter exchange to the queue it came from, and acks the
// delivery once the broker confirmed the copy (a failed publish requeues
// it, uncounted). Past the delivery limit it dead-letters the message
// instead, with reason delivery_limit. The copy waits its turn at the
// queue's tail; nothing else sees the difference.
func (c *Consumer) redeliver(ctx context.Context, queue string, d amqp.Delivery) settlement {
	topo := c.conn.Topology()
	n := redeliveries(d.Headers) + 1
	if n >= int64(max(topo.DeliveryLimit, 1)) {
		return c.deadLetter(ctx, queue, d, &Rejection{Reason: ReasonDeliveryLimit,
			Detail: fmt.Sprintf("delivered %d times without an ack (SAS_DELIVERY_LIMIT %d)", n, topo.DeliveryLimit)})
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[HeaderRedeliveries] = n
	carry(headers, d, topo.DeadLetterExchange())
	msgID := d.MessageId
	if msgID == "" {
		msgID = fmt.Sprintf("redelivered-%d-%d", time.Now().UnixNano(), d.DeliveryTag)
	}
	c.metrics.consumed.WithLabelValues(queue, "requeue").Inc()
	if err := c.pub.Publish(ctx, topo.DeadLetterExchange(), queue, republished(d, headers, msgID)); err != nil {
		c.logger.Warn("counting a redelivery failed, requeueing", "queue", queue, "message_id", d.MessageId, "err", err)
		return settlement{tag: d.DeliveryTag, requeue: true}
	}
	return settlement{tag: d.DeliveryTag}
}

// redeliveries reads HeaderRedeliveries: 0 when absent, negative or not a
// whole number (another client may have set it, in any of AMQP's integer
// types).
func redeliveries(h amqp.Table) int64 {
	var n int64
	switch v := h[HeaderRedeliveries].(type) {
	case int64:
		n = v
	case int32:
		n = int64(v)
	case int16:
		n = int64(v)
	case int8:
		n = int64(v)
	case int:
		n = int64(v)
	case uint16:
		n = int64(v)
	case uint8:
		n = int64(v)
	}
	return max(n, 0)
}
