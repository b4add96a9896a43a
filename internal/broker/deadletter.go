package broker

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers set on a dead-lettered message.
const (
	HeaderErrorReason   = "x-error-reason"
	HeaderErrorDetail   = "x-error-detail"
	HeaderOriginalQueue = "x-original-queue"
)

// maxDetail keeps a detail short: it is for a person reading a queue, and
// it may quote input.
const maxDetail = 512

// DeadLetter republishes d, body and properties unchanged, to input's
// dead-letter queue with the reason, a detail and the input queue's name in
// its headers, and waits for the broker's confirm. The caller acks d
// afterwards.
func (p *Publisher) DeadLetter(ctx context.Context, topo Topology, input string, d amqp.Delivery, reason, detail string) error {
	if len(detail) > maxDetail {
		detail = detail[:maxDetail] + "…"
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[HeaderErrorReason] = reason
	headers[HeaderErrorDetail] = detail
	headers[HeaderOriginalQueue] = topo.Queue(input)
	headers[HeaderDeadLetteredAt] = time.Now().UTC()
	msgID := d.MessageId
	if msgID == "" {
		// The publisher tracks returns by message id.
		msgID = fmt.Sprintf("dead-letter-%d-%d", time.Now().UnixNano(), d.DeliveryTag)
	}
	err := p.Publish(ctx, topo.DeadLetterExchange(), topo.DeadLetterQueue(input), republished(d, headers, msgID))
	if err != nil {
		return fmt.Errorf("dead-letter to %s: %w", topo.DeadLetterQueue(input), err)
	}
	return nil
}

// republished is d to publish again elsewhere: its body and properties
// as they were, with headers and a message id (the publisher tracks
// returns by it).
func republished(d amqp.Delivery, headers amqp.Table, msgID string) amqp.Publishing {
	return amqp.Publishing{
		Headers:         headers,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       msgID,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Priority:        d.Priority,
		Body:            d.Body,
	}
}
