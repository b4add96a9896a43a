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
	// DeliveryLimit is how many deliveries without an ack a message of an
	// input queue gets before it is dead-lettered with reason
	// delivery_limit: x-delivery-limit of a quorum queue (RabbitMQ counts);
	// the consumer counts for a classic one (see Consumer). It guards
	// against a message that kills its consumer.
	DeliveryLimit int
	// QueueType is the type of every queue: QueueQuorum ("" means it too),
	// replicated by Raft across a cluster's nodes, or QueueClassic,
	// durable on the one node it lives on. See docs/RELIABILITY.md.
	QueueType string
	// Inputs are the unprefixed names of the queues sas consumes (e.g.
	// "submit"); each gets a dead-letter queue.
	Inputs []string
	// Entrances are inputs that also get a fanout exchange of their own
	// name bound to them: the way in for a publisher whose login may
	// write to that exchange only (an application's, which may not use the
	// default exchange, since that reaches every queue).
	Entrances []string
}

// The queue types a topology declares.
const (
	QueueQuorum  = amqp.QueueTypeQuorum
	QueueClassic = amqp.QueueTypeClassic
)

// CheckQueueType reports a queue type sas cannot declare.
func CheckQueueType(t string) error {
	if t != QueueQuorum && t != QueueClassic {
		return fmt.Errorf("SAS_QUEUE_TYPE %q: want %s (a cluster's replicated queues) or %s (one node's durable queues)", t, QueueQuorum, QueueClassic)
	}
	return nil
}

// Classic reports whether the topology's queues are classic queues.
func (t Topology) Classic() bool { return t.QueueType == QueueClassic }

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
// queue of the topology's type (a quorum queue with its delivery limit)
// and a durable dead-letter queue of that type bound to the exchange
// under its own name.
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
			amqp.QueueTypeArg: t.qtype(),
		}); err != nil {
			return fmt.Errorf("declare queue %s (%s): %w", dlq, t.mismatch(), err)
		}
		if err := ch.QueueBind(dlq, dlq, dlx, false, nil); err != nil {
			return fmt.Errorf("bind queue %s: %w", dlq, err)
		}
		q := t.Queue(in)
		if _, err := ch.QueueDeclare(q, true, false, false, false, t.inputArgs(in)); err != nil {
			return fmt.Errorf("declare queue %s (%s): %w", q, t.mismatch(), err)
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

// existingType is the type of the topology's first input queue when it
// exists as another type than the topology's, or "": a deployment made
// with quorum queues keeps them when its SAS_QUEUE_TYPE changes, since
// RabbitMQ cannot change a queue's type and the queue may hold messages.
func (t Topology) existingType(conn *amqp.Connection) string {
	if len(t.Inputs) == 0 {
		return ""
	}
	// A passive declare says whether the queue exists, not its type; a
	// declare RabbitMQ refuses, then one it takes with the other type's
	// arguments, does. Each refusal closes its channel.
	try := func(declare func(ch *amqp.Channel, q string) error) bool {
		ch, err := conn.Channel()
		if err != nil {
			return false
		}
		defer ch.Close()
		return declare(ch, t.Queue(t.Inputs[0])) == nil
	}
	exists := try(func(ch *amqp.Channel, q string) error {
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err
	})
	if !exists || try(func(ch *amqp.Channel, q string) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, t.inputArgs(t.Inputs[0]))
		return err
	}) {
		return ""
	}
	other := t
	other.QueueType = QueueClassic
	if t.Classic() {
		other.QueueType = QueueQuorum
	}
	if try(func(ch *amqp.Channel, q string) error {
		_, err := ch.QueueDeclare(q, true, false, false, false, other.inputArgs(t.Inputs[0]))
		return err
	}) {
		return other.QueueType
	}
	return ""
}

// inputArgs are the arguments of input queue in.
func (t Topology) inputArgs(in string) amqp.Table {
	args := amqp.Table{
		amqp.QueueTypeArg:           t.qtype(),
		"x-dead-letter-exchange":    t.DeadLetterExchange(),
		"x-dead-letter-routing-key": t.DeadLetterQueue(in),
	}
	if !t.Classic() {
		args["x-delivery-limit"] = int64(t.DeliveryLimit)
	}
	return args
}

func (t Topology) qtype() string {
	if t.Classic() {
		return QueueClassic
	}
	return QueueQuorum
}

// mismatch says what to do when a queue exists with other arguments.
func (t Topology) mismatch() string {
	return fmt.Sprintf("declared as a %s queue; if it exists with other arguments, drain and delete it, or change the prefix", t.qtype())
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
