package broker

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology names sas's queues and exchanges under one prefix and declares
// them. Declaring is idempotent: every service declares what it uses on
// every connect, and a declaration that matches what exists changes nothing.
type Topology struct {
	// Prefix goes before every name, so that several deployments or tests
	// can share one broker (e.g. "sas.").
	Prefix string
	// DeliveryLimit is x-delivery-limit on every input queue: after that
	// many deliveries without an ack, RabbitMQ dead-letters the message
	// itself. It guards against a message that kills its consumer.
	DeliveryLimit int
	// Inputs are the unprefixed names of the queues sas consumes (e.g.
	// "submit"); each gets a dead-letter queue.
	Inputs []string
	// Entrances are inputs that also get a fanout exchange of their own
	// name bound to them: the way in for a publisher whose login may
	// write to that exchange only (an application's, which may not use the
	// default exchange, since that reaches every queue).
	Entrances []string
}

// Queue returns the full name of an input queue.
func (t Topology) Queue(name string) string { return t.Prefix + name }

// DeadLetterQueue returns the full name of an input's dead-letter queue.
func (t Topology) DeadLetterQueue(name string) string { return t.Prefix + name + ".dlq" }

// DeadLetterExchange returns the full name of the dead-letter exchange.
func (t Topology) DeadLetterExchange() string { return t.Prefix + "dlx" }

// StatusExchange is the topic exchange status events are published to,
// with the order's new status as routing key.
func (t Topology) StatusExchange() string { return t.Prefix + "status" }

// AlertsExchange is the fanout exchange operator alerts are published to,
// for whoever binds a queue to it (a paging integration); the state
// store keeps every alert (sasctl alerts).
func (t Topology) AlertsExchange() string { return t.Prefix + "alerts" }

// Declare declares the dead-letter exchange and, for every input, a durable
// quorum queue with its delivery limit and a durable quorum dead-letter
// queue bound to the exchange under its own name.
func (t Topology) Declare(ch *amqp.Channel) error {
	dlx := t.DeadLetterExchange()
	for _, ex := range []struct{ name, kind string }{
		{dlx, amqp.ExchangeDirect},
		{t.StatusExchange(), amqp.ExchangeTopic},
		{t.AlertsExchange(), amqp.ExchangeFanout},
	} {
		if err := ch.ExchangeDeclare(ex.name, ex.kind, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", ex.name, err)
		}
	}
	for _, in := range t.Inputs {
		dlq := t.DeadLetterQueue(in)
		if _, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum,
		}); err != nil {
			return fmt.Errorf("declare queue %s: %w", dlq, err)
		}
		if err := ch.QueueBind(dlq, dlq, dlx, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", dlq, err)
		}
		q := t.Queue(in)
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
			"x-delivery-limit":          int64(t.DeliveryLimit),
			"x-dead-letter-exchange":    dlx,
			"x-dead-letter-routing-key": dlq,
		}); err != nil {
			return fmt.Errorf("declare queue %s (if it exists with other arguments, delete it or change the prefix): %w", q, err)
		}
	}
	for _, in := range t.Entrances {
		name := t.Queue(in)
		if err := ch.ExchangeDeclare(name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", name, err)
		}
		if err := ch.QueueBind(name, "", name, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to its exchange: %w", name, err)
		}
	}
	return nil
}

// Delete removes every queue and exchange of the topology. For tests and
// teardown; never called by services.
func (t Topology) Delete(ch *amqp.Channel) error {
	for _, in := range t.Inputs {
		for _, q := range []string{t.Queue(in), t.DeadLetterQueue(in)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return fmt.Errorf("delete queue %s: %w", q, err)
			}
		}
	}
	exchanges := []string{t.DeadLetterExchange(), t.StatusExchange(), t.AlertsExchange()}
	for _, in := range t.Entrances {
		exchanges = append(exchanges, t.Queue(in))
	}
	for _, ex := range exchanges {
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			return fmt.Errorf("delete exchange %s: %w", ex, err)
		}
	}
	return nil
}
