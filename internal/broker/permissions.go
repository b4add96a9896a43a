package broker

import (
	"regexp"
	"strings"
)

// Permission is what one service's RabbitMQ user may do, as the three
// regular expressions of `rabbitmqctl set_permissions` (configure, write,
// read) over resource names.
type Permission struct {
	Service   string
	Configure string
	Write     string
	Read      string
}

// Permissions lists, for a deployment whose names start with prefix, the
// least each service needs: to declare its topology (configure the
// exchanges and its queues; write to the dead-letter queues it binds; read
// the exchanges it binds to; and read every queue it declares, because
// RabbitMQ asks for read on a queue declared with a dead-letter exchange;
// and write on the queues it consumes, to bind a classic one to the
// dead-letter exchange, its way back for a counted redelivery),
// to consume its inputs (read) and to publish where it publishes (write;
// "amq.default" is the default exchange). So a scheduler may read the agent
// queues it declares: the price of every service declaring what it uses.
func Permissions(prefix string) []Permission {
	return permissions(regexp.QuoteMeta(prefix))
}

// PartitionedPermissions is Permissions for a partitioned deployment
// (docs/SCALING.md) whose services share one set of users: each may do
// under every partition's prefix what it may under its own (a submitter
// passes a submit on to the partition owning it; the API and the console
// signal and follow orders in every partition), applications and sasctl
// publish to the routing exchange, and sasctl declares and binds the
// routing exchange and its buckets' (partitions setup, move).
func PartitionedPermissions(prefixes []string, routing string) []Permission {
	quoted := make([]string, len(prefixes))
	for i, p := range prefixes {
		quoted[i] = regexp.QuoteMeta(p)
	}
	out := permissions(`(?:` + strings.Join(quoted, `|`) + `)`)
	r := regexp.QuoteMeta(routing)
	for i := range out {
		switch out[i].Service {
		case "app":
			out[i].Write = `^(` + r + `|` + strings.TrimPrefix(strings.TrimSuffix(out[i].Write, `$`), `^`) + `)$`
		case "sasctl":
			route := r + `(\.bucket\.[0-9]+)?`
			out[i].Configure = `^(` + route + `|` + strings.TrimPrefix(strings.TrimSuffix(out[i].Configure, `$`), `^`) + `)$`
			// Binding writes the destination (a bucket's exchange, a
			// partition's submit entrance) and reads the source.
			out[i].Write = `^(` + route + `|(?:` + strings.Join(quoted, `|`) + `)submit|` + strings.TrimPrefix(strings.TrimSuffix(out[i].Write, `$`), `^`) + `)$`
			out[i].Read = `^(` + route + `|` + strings.TrimPrefix(strings.TrimSuffix(out[i].Read, `$`), `^`) + `)$`
		}
	}
	return out
}

// permissions is Permissions for names starting with p, a regular
// expression.
func permissions(p string) []Permission {
	exchanges := p + `(dlx|status|alerts)`
	return []Permission{
		{
			Service:   "submitter",
			Configure: `^(` + exchanges + `|` + p + `submit(\.dlq)?)$`,
			// write on its queue: to bind it to its exchange.
			Write: `^` + p + `(dlx|submit(\.dlq)?)$`,
			Read:  `^` + p + `(dlx|submit)$`,
		},
		{
			// signals is an entrance: its own exchange, bound to it.
			Service:   "scheduler",
			Configure: `^(` + exchanges + `|` + p + `(replies|signals)(\.dlq)?|` + p + `agent\.[^.]+(\.dlq)?)$`,
			Write:     `^(amq\.default|` + p + `(dlx|status|alerts|replies(\.dlq)?|signals(\.dlq)?)|` + p + `agent\.[^.]+\.dlq)$`,
			Read:      `^(` + p + `(dlx|replies|signals)|` + p + `agent\.[^.]+)$`,
		},
		{
			Service:   "agent",
			Configure: `^(` + exchanges + `|` + p + `replies(\.dlq)?|` + p + `agent\.[^.]+(\.dlq)?)$`,
			Write:     `^(amq\.default|` + p + `(dlx|replies\.dlq)|` + p + `agent\.[^.]+(\.dlq)?)$`,
			Read:      `^(` + p + `(dlx|replies)|` + p + `agent\.[^.]+)$`,
		},
		{
			// sasctl publishes orders and signals, and reads dead-letter queues and
			// publishes their messages back (dlq requeue) through the
			// default exchange.
			Service:   "sasctl",
			Configure: `^(` + exchanges + `|` + p + `(submit|signals)(\.dlq)?)$`,
			Write:     `^(amq\.default|` + p + `submit\.dlq)$`,
			Read:      `^(` + p + `(dlx|submit)|` + p + `[^.]+(\.[^.]+)?\.dlq)$`,
		},
		{
			// The HTTP API publishes signals through the default exchange
			// and follows status events through an exclusive queue the
			// broker names (amq.gen-…) bound to the status exchange.
			Service:   "api",
			Configure: `^(` + exchanges + `|` + p + `signals(\.dlq)?|amq\.gen-[^.]+)$`,
			Write:     `^(amq\.default|` + p + `(dlx|signals(\.dlq)?)|amq\.gen-[^.]+)$`,
			Read:      `^(` + p + `(dlx|status|signals)|amq\.gen-[^.]+)$`,
		},
		{
			// An application (the client package) publishes orders and
			// signals through the submit and signals queues' own
			// exchanges, never the default one, and declares and reads
			// its reply queues.
			Service:   "app",
			Configure: `^` + p + `client\.[^.]+$`,
			Write:     `^` + p + `(submit|signals)$`,
			Read:      `^` + p + `client\.[^.]+$`,
		},
	}
}
