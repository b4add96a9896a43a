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
	// HeaderNamespace is the namespace sas found the message to be of
	// (Rejection.Namespace); sas sets it, and removes one a publisher
	// set, so that nobody puts a message in another's view.
	HeaderNamespace = "x-sas-namespace"
)

// maxDetail keeps a detail short: it is for a person reading a queue, and
// it may quote input.
const maxDetail = 512

// DeadLetter republishes d, body and properties unchanged, to input's
// dead-letter queue with the rejection's reason, detail and namespace and
// the input queue's name in its headers, and waits for the broker's
// confirm. The caller acks d afterwards.
func (p *Publisher) DeadLetter(ctx context.Context, topo Topology, input string, d amqp.Delivery, rej Rejection) error {
	reason, detail := rej.Reason, rej.Detail
	if len(detail) > maxDetail {
		detail = detail[:maxDetail] + "…"
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	carry(headers, d, topo.DeadLetterExchange())
	if rej.Namespace != "" {
		headers[HeaderNamespace] = rej.Namespace
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

// Provenance headers: what RabbitMQ verified when a message first came
// in, carried by the copies sas makes of it (a classic queue's counted
// redelivery, a dead letter, a requeue), which sas publishes itself and
// so lose both the route and the user-id.
const (
	// HeaderVia is the exchange the message was first published to.
	HeaderVia = "x-sas-via"
	// HeaderUserID is the user-id it was first published with.
	HeaderUserID = "x-sas-user-id"
)

// ViaUnknown is the route of a message RabbitMQ dead-lettered: where it
// came in first is not known for sure (its x-death headers may be the
// publisher's), so it is taken for an application's.
const ViaUnknown = "(dead-lettered by RabbitMQ)"

// origin is where d first came in and who sent it: the exchange it was
// published to ("" for the default exchange) and its user-id, as
// RabbitMQ verified them. A message that came through the default or
// the dead-letter exchange, which no application may write to (sasctl
// broker users), is one of sas's own publishers' or a copy sas made: a
// copy says its original's provenance in its headers, set by sas on every
// copy (a publisher's own replaced). In a deployment whose applications
// share the services' login, the route proves nothing.
func origin(d amqp.Delivery, dlx string) (via, user string) {
	via, user = d.Exchange, d.UserId
	if via != "" && via != dlx {
		return via, user
	}
	if _, ok := d.Headers["x-death"]; ok {
		return ViaUnknown, user
	}
	via = ""
	if v, ok := d.Headers[HeaderVia].(string); ok {
		via = v
	}
	if u, ok := d.Headers[HeaderUserID].(string); ok && user == "" {
		user = u
	}
	return via, user
}

// carry writes d's provenance into the headers of a copy of it, in
// place of every header of sas's own that d carried (a publisher may
// have written any of them; a dead letter sets its namespace after).
func carry(headers amqp.Table, d amqp.Delivery, dlx string) {
	delete(headers, HeaderVia)
	delete(headers, HeaderUserID)
	delete(headers, HeaderNamespace)
	via, user := origin(d, dlx)
	if via != "" {
		headers[HeaderVia] = via
	}
	if user != "" {
		headers[HeaderUserID] = user
	}
}
