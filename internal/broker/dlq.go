package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HeaderDeadLetteredAt is when sas dead-lettered a message (an AMQP
// timestamp); RabbitMQ's own dead letters (expired, delivery limit) say
// it in x-death.
const HeaderDeadLetteredAt = "x-dead-lettered-at"

// DeadLetter is a message in a dead-letter queue, as an operator sees it.
type DeadLetter struct {
	DLQ       string `json:"dlq"` // the dead-letter queue it is in
	MessageID string `json:"message_id"`
	Type      string `json:"type,omitempty"`
	// Reason and Detail: why it was dead-lettered: sas's x-error-reason
	// and x-error-detail, or RabbitMQ's x-death reason (expired,
	// delivery_limit, rejected).
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// OriginalQueue is the queue it was taken from: where a requeue
	// publishes it.
	OriginalQueue string `json:"original_queue"`
	// Namespace is the namespace sas found it to be of, "" for none (a
	// dead letter of the deployment's: its operators' alone).
	Namespace string `json:"namespace,omitempty"`
	// At is when it was dead-lettered (zero if unknown).
	At          time.Time `json:"at"`
	ContentType string    `json:"content_type,omitempty"`
	Body        []byte    `json:"body"`
	Redelivered bool      `json:"redelivered"`
}

// deadLetterOf reads a delivery from a dead-letter queue.
func deadLetterOf(dlq string, d amqp.Delivery) DeadLetter {
	dl := DeadLetter{DLQ: dlq, MessageID: d.MessageId, Type: d.Type, ContentType: d.ContentType, Body: d.Body, Redelivered: d.Redelivered}
	str := func(k string) string {
		s, _ := d.Headers[k].(string)
		return s
	}
	dl.Reason, dl.Detail, dl.OriginalQueue = str(HeaderErrorReason), str(HeaderErrorDetail), str(HeaderOriginalQueue)
	dl.Namespace = str(HeaderNamespace)
	if t, ok := d.Headers[HeaderDeadLetteredAt].(time.Time); ok {
		dl.At = t
	}
	// RabbitMQ's own dead-lettering (a request that expired in its queue,
	// a message past its delivery limit) writes x-death, newest first.
	if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
		if death, ok := deaths[0].(amqp.Table); ok {
			if dl.Reason == "" {
				dl.Reason, _ = death["reason"].(string)
				dl.Detail = "dead-lettered by RabbitMQ"
			}
			if dl.OriginalQueue == "" {
				dl.OriginalQueue, _ = death["queue"].(string)
			}
			if t, ok := death["time"].(time.Time); ok && dl.At.IsZero() {
				dl.At = t
			}
		}
	}
	if dl.At.IsZero() {
		dl.At = d.Timestamp
	}
	return dl
}

// DLQAction is what ScanDLQ does with one dead letter.
type DLQAction int

// What ScanDLQ may do with a dead letter.
const (
	// Keep leaves it in the dead-letter queue.
	Keep DLQAction = iota
	// Requeue publishes it to its original queue (with a confirm), then
	// removes it from the dead-letter queue.
	Requeue
	// Drop removes it.
	Drop
)

// maxScan bounds the dead letters one scan holds unacknowledged: the ones
// it keeps stay with it until it ends.
const maxScan = 10000

// ScanDLQ reads the messages of the dead-letter queue dlq, up to how many
// it held when the scan began and at most limit (<= 0: maxScan), and does
// with each what decide says. It never loses a message: a message is
// taken unacknowledged, a requeued one is acknowledged (removed) only after
// the broker confirmed its copy in the original queue, and every message
// kept, or not reached because of an error or a kill, goes back to the
// dead-letter queue when the scan's channel closes. A kill between the
// confirm and the removal leaves the message in both queues: consumers
// are idempotent on message ids. It returns the dead letters it saw, in
// order, with what was done to each.
func (c *Conn) ScanDLQ(ctx context.Context, pub *Publisher, dlq string, limit int, decide func(DeadLetter) DLQAction) ([]DeadLetter, []DLQAction, error) {
	if limit <= 0 || limit > maxScan {
		limit = maxScan
	}
	ch, err := c.Channel(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer ch.Close() // what is not acknowledged goes back to the queue
	// Another reader (a scan that just ended, one killed) holds messages
	// unacknowledged until the broker drops its consumer and puts them
	// back, a little after: count once nobody reads and the count has
	// stopped moving, or they would be missed.
	var q amqp.Queue
	last, stable := -1, 0
	settle := time.Now().Add(10 * time.Second)
	for {
		q, err = ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return nil, nil, nil // never declared: nothing was ever dead-lettered there
		}
		if err != nil {
			return nil, nil, fmt.Errorf("dead-letter queue %s: %w", dlq, err)
		}
		if q.Consumers == 0 && q.Messages == last {
			stable++
		} else {
			stable = 0
		}
		last = q.Messages
		if stable >= 3 || time.Now().After(settle) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	n := min(q.Messages, limit)
	if n == 0 {
		return nil, nil, nil
	}
	if err := ch.Qos(n, 0, false); err != nil {
		return nil, nil, fmt.Errorf("set prefetch: %w", err)
	}
	tag := fmt.Sprintf("sasctl-scan-%d", time.Now().UnixNano())
	deliveries, err := ch.ConsumeWithContext(ctx, dlq, tag, false, false, false, false, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", dlq, err)
	}
	// The acks of a quorum queue reach it apart from the channel's close:
	// closed at once after its last acks, the channel's consumer can be
	// dropped (and those messages put back) before the acks are applied.
	// A cancel goes the same way as the acks and is answered once applied,
	// so the scan cancels before it closes.
	defer func() { _ = ch.Cancel(tag, false) }()
	var seen []DeadLetter
	var done []DLQAction
	type move struct {
		i       int
		d       amqp.Delivery
		pending *Pending
	}
	var moving []move
	// flush waits for the requeued copies' confirms and removes each
	// confirmed one from the dead-letter queue.
	flush := func() error {
		var firstErr error
		for _, m := range moving {
			err := m.pending.Wait(ctx)
			if err == nil {
				err = m.d.Ack(false)
			}
			if err != nil {
				done[m.i] = Keep
				if firstErr == nil {
					firstErr = fmt.Errorf("requeue %s: %w", seen[m.i].MessageID, err)
				}
			}
		}
		moving = moving[:0]
		return firstErr
	}
	idle := time.NewTimer(5 * time.Second)
	defer idle.Stop()
	for len(seen) < n {
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return seen, done, errors.Join(flush(), ctx.Err())
		case <-idle.C:
			// Fewer messages arrived than the queue held: another reader
			// took some. What was seen is what there is.
			return seen, done, flush()
		case d, ok = <-deliveries:
		}
		if !ok {
			return seen, done, errors.Join(flush(), fmt.Errorf("reading %s: the channel closed", dlq))
		}
		idle.Reset(5 * time.Second)
		dl := deadLetterOf(dlq, d)
		action := decide(dl)
		seen, done = append(seen, dl), append(done, action)
		switch action {
		case Drop:
			if err := d.Ack(false); err != nil {
				done[len(done)-1] = Keep
				return seen, done, errors.Join(flush(), fmt.Errorf("drop %s: %w", dl.MessageID, err))
			}
		case Requeue:
			if dl.OriginalQueue == "" {
				done[len(done)-1] = Keep
				continue
			}
			p, err := pub.Start(ctx, "", dl.OriginalQueue, requeued(d))
			if err != nil {
				done[len(done)-1] = Keep
				return seen, done, errors.Join(flush(), fmt.Errorf("requeue %s: %w", dl.MessageID, err))
			}
			moving = append(moving, move{len(seen) - 1, d, p})
			if len(moving) >= 64 {
				if err := flush(); err != nil {
					return seen, done, err
				}
			}
		}
	}
	return seen, done, flush()
}

// requeued is the message a dead letter goes back to its queue as: body
// and properties as they were, without the dead-lettering's headers, and
// with the reason it was dead-lettered for in x-requeued-after.
func requeued(d amqp.Delivery) amqp.Publishing {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if k == HeaderErrorReason || k == HeaderErrorDetail || k == HeaderOriginalQueue || k == HeaderDeadLetteredAt ||
			k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-") || k == "x-delivery-count" || k == HeaderRedeliveries {
			continue
		}
		headers[k] = v
	}
	if r, ok := d.Headers[HeaderErrorReason].(string); ok {
		headers["x-requeued-after"] = r
	}
	// The dead-letter queue's messages come through the dead-letter
	// exchange: their provenance is in their headers, or RabbitMQ's.
	carry(headers, d, d.Exchange)
	msgID := d.MessageId
	if msgID == "" {
		msgID = fmt.Sprintf("requeued-%d-%d", time.Now().UnixNano(), d.DeliveryTag)
	}
	return republished(d, headers, msgID)
}
