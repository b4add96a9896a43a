package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/service"
	"sas/internal/submitter"
)

func (a *app) submit(ctx context.Context, args []string) error {
	fs := a.flags()
	file := fs.String("file", "", "publish the order in this JSON file (\"-\" for stdin)")
	count := fs.Int("count", 0, "publish this many generated sample orders")
	wf := fs.String("workflow", "", "workflow of generated orders (default: the default workflow)")
	workflows := fs.String("workflows", "", "the workflows file orders are checked against (default: SAS_WORKFLOWS_FILE, else the built-in one)")
	payload := fs.String("payload", "", "payload of generated orders: "+payloadFlagHelp+" (default: a random demo order)")
	priority := fs.Int("priority", 0, "priority 0-9 of generated orders")
	replyTo := fs.String("reply-to", "", "status queue of generated orders")
	deadline := fs.String("deadline", "", "deadline of generated orders in place of their workflow's (1s to 366d, such as 2h)")
	concurrency := fs.Int("concurrency", 32, "publishes awaiting their confirm at once")
	printIDs := fs.Bool("print-ids", false, "print each published order id on stdout")
	partitions := fs.String("partitions", os.Getenv("SAS_PARTITIONS_FILE"), "a partitions layout: publish to its routing exchange, the order id as routing key, so that each order reaches its partition (default: SAS_PARTITIONS_FILE)")
	namespace := fs.String("namespace", "", "the namespace the orders go to (header sas-namespace, with the broker login as user-id: SAS_SUBMITTER_NAMESPACES must grant it)")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	var to submitTo
	if *namespace != "" {
		if err := messages.CheckNamespace(*namespace); err != nil {
			return a.usageError(fs, "--namespace: %v", err)
		}
		uri, err := amqp.ParseURI(a.cfg.AMQPURL)
		if err != nil {
			return fmt.Errorf("SAS_AMQP_URL: %w", err)
		}
		to = submitTo{namespace: *namespace, login: uri.Username}
	}
	if (*file == "") == (*count == 0) || *count < 0 {
		return a.usageError(fs, "give either --file or a positive --count")
	}
	if *priority < 0 || *priority > 9 || *concurrency < 1 {
		return a.usageError(fs, "--priority must be 0 to 9 and --concurrency at least 1")
	}
	if *deadline != "" {
		if err := (messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: "w", Payload: []byte(`{}`),
			Deadline: *deadline}).Validate(); err != nil {
			return a.usageError(fs, "--deadline: %v", err)
		}
	}

	reg, err := workflowsFile(*workflows)
	if err != nil {
		return err
	}
	var bodies func(i int) (string, []byte, error)
	n := *count
	if *file != "" {
		body, err := a.readFile(*file)
		if err != nil {
			return err
		}
		o, err := messages.DecodeSubmitOrder(body)
		if err != nil {
			return fmt.Errorf("%s is not a valid order: %w", *file, err)
		}
		if err := knownWorkflow(reg, o.Workflow); err != nil {
			return fmt.Errorf("%s: %w: nothing published", *file, err)
		}
		// The rule every entrance applies to a payload (intake's).
		if wf, _ := reg.Lookup(o.Workflow); intake.CheckPayload(wf, o.PayloadJSON()) != nil {
			return fmt.Errorf("%s: %w: nothing published", *file, intake.CheckPayload(wf, o.PayloadJSON()))
		}
		n = 1
		bodies = func(int) (string, []byte, error) { return o.OrderID, body, nil }
	} else {
		smp, err := newOrderSampler(reg, *wf, *payload)
		if err != nil {
			return fmt.Errorf("%w: nothing published", err)
		}
		bodies = func(int) (string, []byte, error) {
			o := smp.order(*priority, *replyTo)
			o.Deadline = *deadline
			body, err := messages.Encode(o)
			return o.OrderID, body, err
		}
	}

	var layout *partition.Layout
	if *partitions != "" {
		l, err := partition.Load(*partitions)
		if err != nil {
			return err
		}
		layout = &l
	}
	var inputs []string
	if layout == nil {
		inputs = []string{submitter.Input}
	}
	conn, pub, topo, err := a.openBroker(ctx, inputs...)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer pub.Close()
	// Where each order goes: the submit queue, or through the partitions'
	// routing exchange by its id.
	to.exchange, to.key, to.where = "", topo.Queue(submitter.Input), topo.Queue(submitter.Input)
	if layout != nil {
		to.exchange, to.key, to.where = layout.Exchange, "", "the partitions of exchange "+layout.Exchange
	}

	start := time.Now()
	var published atomic.Int64
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, max(*concurrency, 1))
	var wg sync.WaitGroup
	for i := range n {
		id, body, err := bodies(i)
		if err != nil {
			return err
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := publishOrder(ctx, pub, id, body, to); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			published.Add(1)
			if *printIDs {
				mu.Lock()
				fmt.Fprintln(a.stdout, id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	fmt.Fprintf(a.stderr, "published %d of %d orders to %s, all confirmed by the broker, in %v (%.0f/s)\n",
		published.Load(), n, to.where, took.Round(time.Millisecond), float64(published.Load())/took.Seconds())
	return firstErr
}

// submitTo is where submits go: the namespace ("": the default one) and
// the broker login that sends them; the exchange and routing key they are
// published with (a partitions' routing exchange takes the order id as
// key: key ""), and how to name it.
type submitTo struct {
	namespace, login string
	exchange, key    string
	where            string
}

// publishOrder publishes one submit, again if the broker did not confirm it
// (the submitter treats a repeat as a duplicate).
func publishOrder(ctx context.Context, pub *broker.Publisher, id string, body []byte, to submitTo) error {
	key := to.key
	if key == "" {
		key = id
	}
	headers := amqp.Table{"schema_version": int32(schemaVersionOf(body))}
	if to.namespace != "" {
		headers[submitter.NamespaceHeader] = to.namespace
	}
	var err error
	for attempt := range 5 {
		err = pub.Publish(ctx, to.exchange, key, amqp.Publishing{
			ContentType: messages.ContentType,
			Type:        messages.TypeSubmitOrder,
			MessageId:   id,
			UserId:      to.login,
			Timestamp:   time.Now(),
			Headers:     headers,
			Body:        body,
		})
		if err == nil || !errors.Is(err, broker.ErrUnconfirmed) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return err
}

func (a *app) openBroker(ctx context.Context, inputs ...string) (*broker.Conn, *broker.Publisher, broker.Topology, error) {
	return service.ToolBroker(ctx, a.cfg, "sasctl", a.logger, inputs...)
}

func (a *app) readFile(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(a.stdin, messages.MaxBodyBytes+1))
	}
	return os.ReadFile(name)
}

// schemaVersionOf reads a SubmitOrder body's schema_version, for the
// message's header.
func schemaVersionOf(body []byte) int {
	var v struct {
		SchemaVersion int `json:"schema_version"`
	}
	_ = json.Unmarshal(body, &v)
	return v.SchemaVersion
}
