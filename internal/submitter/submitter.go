// Package submitter is the submitter service: it consumes SubmitOrder
// messages from the submit queue and writes each order with its step rows
// and their history in one transaction, acking only after the commit. A
// duplicate is acked; a message that can never be accepted is dead-lettered
// with its reason and acked; nothing on the queue can stop it.
package submitter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/failpoint"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

// Input is the unprefixed name of the submit queue.
const Input = messages.SubmitQueue

// Config is the submitter's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	service.WorkflowsFile
	// MetricsAddr is where /metrics, /healthz and /readyz are served.
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9101"`
	// Prefetch is how many unacked submits the broker hands over at once.
	Prefetch int `envconfig:"SUBMITTER_PREFETCH" default:"256"`
	// Workers is how many submits are handled at once.
	Workers int `envconfig:"SUBMITTER_WORKERS" default:"64"`
	// Batch is how many orders handled at the same moment are written in
	// one transaction, at most.
	Batch int `envconfig:"SUBMITTER_BATCH" default:"64"`
	// BatchLinger is how long a batch that is not full waits for more.
	BatchLinger time.Duration `envconfig:"SUBMITTER_BATCH_LINGER" default:"3ms"`
	// Writers is how many such transactions run at once.
	Writers int `envconfig:"SUBMITTER_WRITERS" default:"1"`
	// DBMaxConns caps the database pool.
	DBMaxConns int32 `envconfig:"DB_MAX_CONNS" default:"10"`
	// StepTimeout, when set, replaces every step's complete-by budget from
	// the workflow definition.
	StepTimeout time.Duration `envconfig:"STEP_TIMEOUT" default:"0s"`
	// Namespaces says which broker logins may submit to which namespace
	// (a submit's sas-namespace header): LOGIN=NAMESPACE,... ('*': every
	// one), the login being the user-id property RabbitMQ checks against
	// the publisher's own. A submit naming no namespace goes to default.
	Namespaces string `envconfig:"SUBMITTER_NAMESPACES"`
}

// NamespaceHeader is the submit's header naming its namespace.
const NamespaceHeader = intake.NamespaceHeader

// Reasons of a submit its namespace refuses.
const (
	ReasonNamespaceRefused = intake.ReasonNamespaceRefused
	ReasonUnknownNamespace = intake.ReasonUnknownNamespace
)

// Reasons the submitter adds to those of messages.
const (
	ReasonConflict        = intake.ReasonConflict
	ReasonUnknownWorkflow = intake.ReasonUnknownWorkflow
)

type metrics struct {
	orders    *prometheus.CounterVec
	insertDur prometheus.Histogram
	batchSize prometheus.Histogram
	dbRetries prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_submitter_orders_total",
			Help: "Submit messages handled, by outcome (inserted, duplicate, rejected, forwarded: passed to the partition owning the order).",
		}, []string{"outcome"}),
		insertDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sas_submitter_insert_duration_seconds",
			Help:    "Time to write one order with its steps.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sas_submitter_insert_batch_size",
			Help:    "Orders written by one insert transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		dbRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_submitter_db_retries_total",
			Help: "Order writes retried after a database error.",
		}),
	}
	for _, outcome := range []string{"inserted", "duplicate", "rejected", "forwarded"} {
		m.orders.WithLabelValues(outcome)
	}
	reg.MustRegister(m.orders, m.insertDur, m.batchSize, m.dbRetries)
	return m
}

// Run runs the submitter until ctx is done, then shuts down gracefully: it
// stops taking messages, finishes the ones in hand (within
// cfg.ShutdownTimeout) and closes its connections.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	me := cfg.Instance("submitter")
	logger = logger.With("service", "submitter", "instance", me)
	workflows, err := cfg.Workflows()
	if err != nil {
		return err
	}
	grants, err := intake.ParseBrokerGrants(cfg.Namespaces)
	if err != nil {
		return err
	}
	layout, own, err := cfg.Own(cfg.QueuePrefix)
	if err != nil {
		return err
	}
	reg := service.NewRegistry()
	m := newMetrics(reg)
	topo := broker.Topology{Prefix: cfg.QueuePrefix, DeliveryLimit: cfg.DeliveryLimit, QueueType: cfg.QueueType, Inputs: []string{Input}, Entrances: []string{Input}}
	sk, err := service.Start(ctx, service.Setup{Name: "submitter", Me: me, Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		DBMaxConns: cfg.DBMaxConns, Topology: &topo, Traced: true, DBKeyed: true}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	store, conn, pub, bm, tr := sk.Deps.Store, sk.Deps.Conn, sk.Deps.Pub, sk.Deps.Metrics, sk.Tracing
	var follower *partition.Follower
	if layout != nil {
		// Its store writes only the orders of the buckets it owns now,
		// and it passes on the others where they moved.
		store.FenceAs(layout.Partitions[own].Name, layout.BucketOf)
		follower = partition.NewFollower(layout, store)
		if err := service.RetryDB(ctx, logger, "reading the buckets moved", func() error { return follower.Now(ctx) }); err != nil {
			return err
		}
	}
	if err := intake.StoreVersions(ctx, store, workflows, me, logger); err != nil {
		return err
	}

	// In-flight writes run under the skeleton's WorkCtx: on SIGTERM they
	// finish rather than being cut off, unless the shutdown timeout passes.
	workCtx := sk.WorkCtx
	inserts := batch.New(cfg.Batch, cfg.BatchLinger, func(ctx context.Context, orders []statestore.NewOrder) ([]statestore.InsertOutcome, []error) {
		m.batchSize.Observe(float64(len(orders)))
		return store.InsertOrders(ctx, orders)
	})
	sk.Go(func(ctx context.Context) { inserts.Run(ctx, cfg.Writers) })
	h := &handler{store: store, inserts: inserts, workflows: workflows, stepTimeout: cfg.StepTimeout, actor: me, metrics: m, logger: logger,
		workCtx: workCtx, tr: tr, grants: grants, namespaces: intake.NewNamespaces(store.Namespaces), partitions: layout, partition: own, pub: pub,
		follower: follower}
	consumer := broker.NewConsumer(conn, pub, broker.ConsumerConfig{Input: Input, Prefetch: cfg.Prefetch, Workers: cfg.Workers,
		Reasons: append(messages.Reasons(), messages.ReasonInvalidPayload, ReasonConflict, ReasonUnknownWorkflow, ReasonNamespaceRefused, ReasonWrongPartition,
			ReasonUnknownNamespace, quotaReason(statestore.QuotaInFlight), quotaReason(statestore.QuotaSubmitRate), quotaReason(statestore.QuotaPayloadBytes))},
		h.chain(), logger, bm)

	logger.Info("submitter started", "queue", topo.Queue(Input), "workers", cfg.Workers, "prefetch", cfg.Prefetch,
		"workflows", workflows.Source)
	return sk.Run(ctx, cfg.ShutdownTimeout, sk.Deps.Ready(consumer), consumer.Run)
}

// submitStore is what the handler needs of the state store beside its
// batched inserts: a lone insert (the fault suite's broken build) and
// telling a refusal's reply_to.
type submitStore interface {
	InsertOrder(ctx context.Context, o statestore.NewOrder) (statestore.InsertOutcome, error)
	InsertOrderWithinQuota(ctx context.Context, o statestore.NewOrder) (statestore.InsertOutcome, *statestore.QuotaRefusal, error)
	service.Teller
}

// namespaceIndex is what the handler asks of the deployment's namespaces
// (intake.Namespaces).
type namespaceIndex interface {
	Exists(ctx context.Context, ns string) (bool, error)
	Quotas(ctx context.Context, ns string) (bool, error)
}

// quotaReason is the dead letter's reason of a quota's refusal.
func quotaReason(quota string) string { return "quota_" + quota }

type handler struct {
	store       submitStore
	inserts     *batch.Batcher[statestore.NewOrder, statestore.InsertOutcome]
	workflows   *workflow.Registry
	stepTimeout time.Duration
	actor       string
	metrics     *metrics
	logger      *slog.Logger
	workCtx     context.Context
	tr          *tracing.Tracing
	// grants are the namespaces each broker login may submit to.
	grants     intake.BrokerGrants
	namespaces namespaceIndex
	// partitions, in a partitioned deployment, is its layout and
	// partition this submitter's index in it; pub passes on what another
	// partition owns.
	partitions *partition.Layout
	partition  int
	pub        forwarder
	// follower keeps partitions following the buckets moved (nil in a
	// test's handler: the layout's split alone).
	follower moveFollower
}

// moveFollower keeps a layout following the moved buckets
// (partition.Follower).
type moveFollower interface {
	Fresh(ctx context.Context)
	Now(ctx context.Context) error
}

// forwarder publishes a message and waits for the broker's confirm
// (broker.Publisher).
type forwarder interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

// forward passes a submit whose order another partition owns to that
// partition's submit entrance, as it came (its id, correlation id,
// headers and body; the publisher's user-id cannot be carried, so a
// namespace its header names is judged there without it), and acks it
// here once the broker confirmed the copy. A submit passed on
// maxForwards times already is refused: the partitions disagree on who
// owns it (their layouts differ), and passing it again could go round
// for ever.
func (h *handler) forward(ctx context.Context, m broker.Message, o messages.SubmitOrder, owner partition.Partition) error {
	hops := forwards(m.Headers)
	if hops >= maxForwards {
		h.metrics.orders.WithLabelValues("rejected").Inc()
		return h.refuse(o.OrderID, o.ReplyTo, messages.CorrelationID(m.CorrelationID), ReasonWrongPartition,
			fmt.Sprintf("order %s is partition %s's by this submitter's layout, and partition %v passed it here: give every submitter the same SAS_PARTITIONS_FILE",
				o.OrderID, owner.Name, m.Headers[ForwardedHeader]))
	}
	headers := amqp.Table{}
	for k, v := range m.Headers {
		headers[k] = v
	}
	headers[ForwardedHeader] = h.partitions.Partitions[h.partition].Name
	headers[ForwardsHeader] = int32(hops + 1)
	if err := h.pub.Publish(ctx, owner.SubmitEntrance(), o.OrderID, amqp.Publishing{
		ContentType: m.ContentType, Type: messages.TypeSubmitOrder, MessageId: m.ID, CorrelationId: m.CorrelationID,
		Timestamp: time.Now(), Headers: headers, Body: m.Body,
	}); err != nil {
		return fmt.Errorf("pass order %s to partition %s: %w", o.OrderID, owner.Name, err) // back to the queue
	}
	h.metrics.orders.WithLabelValues("forwarded").Inc()
	h.logger.Debug("order passed to its partition", "order_id", o.OrderID, "partition", owner.Name)
	return nil
}

// ForwardedHeader names the partition that passed a submit on last;
// ForwardsHeader counts how many times it was passed on.
const (
	ForwardedHeader = "sas-forwarded-by"
	ForwardsHeader  = "sas-forwards"
)

// maxForwards bounds how often a submit is passed on: once after a
// broker's ring was renumbered, once more when its bucket moved between
// a layout's split and the move's owner.
const maxForwards = 2

// forwards is how many times a submit was passed on.
func forwards(headers amqp.Table) int {
	switch n := headers[ForwardsHeader].(type) {
	case int32:
		return int(n)
	case int64:
		return int(n)
	}
	if _, passed := headers[ForwardedHeader]; passed {
		return 1 // passed on by a submitter before the count
	}
	return 0
}

// ReasonWrongPartition dead-letters a submit passed on to a partition
// that does not own it either (the submitters' layouts differ).
const ReasonWrongPartition = "wrong_partition"

// namespaceOf is the namespace a submit goes to: its header's, when the
// login that published it (its user-id, which RabbitMQ checked) may
// submit there and it exists; else the default one. A refusal returns
// its reason and detail.
func (h *handler) namespaceOf(ctx context.Context, m broker.Message) (ns, reason, detail string, err error) {
	return h.grants.Resolve(ctx, m.Headers, m.UserID, "submit to", h.namespaces.Exists)
}

// chain is the submitter's handler with its middleware: failpoints,
// the trace context, then the content type and the body decoded, a
// submit that cannot be read refused (reject).
func (h *handler) chain() broker.Handler {
	return broker.Chain(broker.Decoded(messages.DecodeSubmitOrder, h.reject, h.handle), broker.Failpoints(), broker.Traced(h.tr))
}

// handle writes one order. See broker.Handler for what its result means.
// A write in progress runs under workCtx, so SIGTERM lets it finish; ctx
// (done at SIGTERM) only stops retrying after a database error.
func (h *handler) handle(ctx context.Context, m broker.Message, o messages.SubmitOrder) error {
	if h.partitions != nil {
		// The order's partition is its id's bucket's owner, whatever way
		// the submit came (a broker's ring numbered afresh after a
		// restart, a publisher that named another key, a bucket moved).
		if h.follower != nil {
			h.follower.Fresh(ctx)
		}
		if _, owner := h.partitions.Of(o.OrderID); owner.Name != h.partitions.Partitions[h.partition].Name {
			if _, passed := m.Headers[ForwardedHeader]; passed && h.follower != nil {
				// Passed here by a partition that thinks it ours: look
				// at the moves again before passing it on.
				if err := h.follower.Now(ctx); err != nil {
					return err // back to the queue
				}
				if _, owner = h.partitions.Of(o.OrderID); owner.Name == h.partitions.Partitions[h.partition].Name {
					return h.write(ctx, m, o)
				}
			}
			return h.forward(ctx, m, o, owner)
		}
	}
	return h.write(ctx, m, o)
}

// write writes an order this partition owns (or, unpartitioned, any).
func (h *handler) write(ctx context.Context, m broker.Message, o messages.SubmitOrder) error {
	corr := messages.CorrelationID(m.CorrelationID)
	// The namespace first: a refusal after it is that namespace's dead
	// letter (one of a namespace not granted is the deployment's).
	ns, reason, detail, err := h.namespaceOf(ctx, m)
	if err != nil {
		return err // the namespaces could not be read: back to the queue
	}
	if reason != "" {
		h.metrics.orders.WithLabelValues("rejected").Inc()
		return h.refuse(o.OrderID, o.ReplyTo, corr, reason, detail)
	}
	refuse := func(reason, detail string) error {
		return broker.InNamespace(h.refuse(o.OrderID, o.ReplyTo, corr, reason, detail), ns)
	}
	nw, err := intake.Prepare(h.workflows, o, ns, h.stepTimeout, h.actor)
	if err != nil {
		h.metrics.orders.WithLabelValues("rejected").Inc()
		var r *intake.Refusal
		if errors.As(err, &r) {
			return refuse(r.Reason, r.Detail)
		}
		return err
	}
	nw.CorrelationID = corr
	nw.Namespace = ns
	quotas, err := h.namespaces.Quotas(ctx, ns)
	if err != nil {
		return err
	}
	// The order's trace: the application's, when its message carries a
	// valid traceparent, else a new one. Every later span of the order
	// joins it through the traceparent stored with the order.
	sctx, span := h.tr.Start(ctx, "submit "+nw.Workflow, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("sas.order_id", o.OrderID), attribute.String("sas.workflow", nw.Workflow)))
	defer span.End()
	nw.Traceparent = h.tr.Traceparent(sctx)
	log := h.logger.With(append([]any{"order_id", o.OrderID}, tracing.LogAttrs(sctx)...)...)
	if failpoint.Broken("ack-before-commit") {
		// Negative control for the fault suite: ack now, write a little
		// later; a crash in between loses the order.
		go func() {
			time.Sleep(300 * time.Millisecond)
			_, _ = h.store.InsertOrder(h.workCtx, nw)
		}()
		return nil
	}

	// A database error that retrying cannot fix ends in the dead-letter
	// queue; any other (unreachable, overloaded) keeps the message and is
	// retried in place rather than requeued towards its delivery limit.
	var outcome statestore.InsertOutcome
	var refused *statestore.QuotaRefusal
	_, ispan := h.tr.Start(sctx, "insert order")
	err = service.Retry(ctx, func() error {
		start := time.Now()
		var err error
		if quotas {
			// Written alone, in one transaction with the namespace's
			// admission, as the API writes it.
			outcome, refused, err = h.store.InsertOrderWithinQuota(h.workCtx, nw)
		} else {
			outcome, err = h.inserts.Do(h.workCtx, nw)
		}
		if err == nil {
			h.metrics.insertDur.Observe(time.Since(start).Seconds())
		}
		return err
	}, func(err error) bool {
		var away *statestore.ElsewhereError
		return errors.Is(err, statestore.ErrConflict) || errors.Is(err, statestore.ErrInvalidData) || errors.As(err, &away) || h.workCtx.Err() != nil
	}, func(err error, wait time.Duration) {
		h.metrics.dbRetries.Inc()
		ispan.AddEvent("retry", trace.WithAttributes(attribute.String("error", err.Error())))
		log.Warn("writing order failed, retrying", "err", err, "retry_in", wait)
	})
	if err != nil {
		ispan.SetStatus(codes.Error, err.Error())
		span.SetStatus(codes.Error, err.Error())
	} else {
		ispan.SetAttributes(attribute.String("sas.outcome", outcome.String()))
	}
	ispan.End()
	switch {
	case err == nil && refused != nil:
		h.metrics.orders.WithLabelValues("rejected").Inc()
		return refuse(quotaReason(refused.Quota), refused.Detail)
	case err == nil:
		failpoint.Inject("submitter-after-commit")
		h.metrics.orders.WithLabelValues(outcome.String()).Inc()
		log.Debug("order written", "outcome", outcome.String(), "workflow", nw.Workflow)
		return nil
	case errors.Is(err, statestore.ErrConflict):
		h.metrics.orders.WithLabelValues("rejected").Inc()
		return refuse(ReasonConflict, fmt.Sprintf("order_id %s was already submitted with a different payload", o.OrderID))
	case errors.Is(err, statestore.ErrInvalidData):
		h.metrics.orders.WithLabelValues("rejected").Inc()
		return refuse(messages.ReasonInvalidValue, err.Error())
	}
	if away := (*statestore.ElsewhereError)(nil); errors.As(err, &away) {
		// Its bucket moved away: pass it on to the owner the store names.
		if h.follower != nil {
			_ = h.follower.Now(ctx)
		}
		if i := h.partitions.Index(away.Owner); i >= 0 {
			return h.forward(ctx, m, o, h.partitions.Partitions[i])
		}
		return fmt.Errorf("order %s: its bucket is partition %s's, which this submitter's layout lacks", o.OrderID, away.Owner)
	}
	return err // shutting down: back to the queue
}

// refuse dead-letters a submit and tells its reply_to queue, if it named
// one (service.Refuse): the application learns its order does not exist.
func (h *handler) refuse(orderID, replyTo, corr, reason, detail string) error {
	return service.Refuse(h.workCtx, h.store, h.logger, orderID, replyTo, corr, reason, detail, nil)
}

// reject refuses a submit whose body could not be read as one: it is
// dead-lettered with the decoder's reason, and if the body still names a
// reply_to, that queue is told as for any refusal (with the order id,
// when one can be read).
func (h *handler) reject(ctx context.Context, m broker.Message, err error) error {
	h.metrics.orders.WithLabelValues("rejected").Inc()
	rej := broker.RejectFor(err, messages.ReasonInvalidValue).(*broker.Rejection)
	// A granted namespace's unreadable submit is its dead letter.
	ns, reason, _, nerr := h.namespaceOf(ctx, m)
	if nerr != nil || reason != "" {
		ns = ""
	}
	if orderID, replyTo, ok := messages.RefusedRefOf(m.Body); ok {
		return broker.InNamespace(h.refuse(orderID, replyTo, messages.CorrelationID(m.CorrelationID), rej.Reason, rej.Detail), ns)
	}
	rej.Namespace = ns
	return rej
}
