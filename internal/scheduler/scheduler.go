// Package scheduler is the scheduler service. It claims pending steps and
// sends their requests to agents (claimer.go), applies the agents' replies
// fenced by attempt and deadline (replies.go), publishes the status events
// and operator alerts the state store's outbox holds (relay.go), and wakes
// on PostgreSQL notifications with a polling fallback (wake.go). Any number
// of replicas may run: claims never overlap, any replica applies any reply,
// and one relay at a time keeps each order's events in order.
package scheduler

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/workflow"
)

// Config is the scheduler's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	service.WorkflowsFile
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9102"`
	// Kinds are the agent kinds whose steps this scheduler claims and
	// whose request queues it declares; empty means every kind the
	// workflows file names. Steps carry their kind from submission, so a
	// scheduler claims what it is configured for, whatever its own file
	// says: list a kind here before a submitter with a newer file sends
	// orders that use it.
	Kinds []string `envconfig:"SCHEDULER_KINDS"`
	// BatchSize is how many steps one claim takes at most.
	BatchSize int `envconfig:"SCHEDULER_BATCH" default:"100"`
	// MaxQueued is how many requests may wait in an agent kind's queue
	// before the scheduler stops claiming steps for that kind.
	MaxQueued int `envconfig:"SCHEDULER_MAX_QUEUED" default:"1000"`
	// MaxRepliesQueued is how many replies may wait in the replies queue
	// before the claimer stops claiming (0: no limit).
	MaxRepliesQueued int `envconfig:"SCHEDULER_MAX_REPLIES_QUEUED" default:"2000"`
	// PollInterval is how often the claimer and the relay look for work
	// when no notification woke them.
	PollInterval time.Duration `envconfig:"SCHEDULER_POLL_INTERVAL" default:"500ms"`
	// ReplyPrefetch and ReplyWorkers shape the replies consumer.
	ReplyPrefetch int `envconfig:"SCHEDULER_REPLY_PREFETCH" default:"256"`
	ReplyWorkers  int `envconfig:"SCHEDULER_REPLY_WORKERS" default:"64"`
	// SignalWorkers is how many signals (callbacks and heartbeats of
	// services that answered 202 among them) are applied at once.
	SignalWorkers int `envconfig:"SCHEDULER_SIGNAL_WORKERS" default:"16"`
	// Namespaces says which broker logins may signal the orders of which
	// namespace (a signal's sas-namespace header), as they may submit to
	// it: LOGIN=NAMESPACE,... A signal naming none reaches default's
	// orders alone.
	Namespaces string `envconfig:"SUBMITTER_NAMESPACES"`
	// ReplyBatch is how many replies handled at once are applied in one
	// transaction, at most.
	ReplyBatch int `envconfig:"SCHEDULER_REPLY_BATCH" default:"64"`
	// ReplyBatchLinger is how long a batch that is not full waits for more.
	ReplyBatchLinger time.Duration `envconfig:"SCHEDULER_REPLY_BATCH_LINGER" default:"3ms"`
	// ReplyWriters is how many such transactions run at once.
	ReplyWriters int `envconfig:"SCHEDULER_REPLY_WRITERS" default:"1"`
	// RelayBatch is how many outbox messages one relay round publishes.
	RelayBatch int `envconfig:"SCHEDULER_RELAY_BATCH" default:"500"`
	// SkipUnheardEvents is how long a progress event (received,
	// processing, compensating) that the broker returned, no queue being
	// bound for its status, is not written for orders without a reply_to;
	// a queue bound for it hears such events again within that while.
	// 0 writes and publishes every event.
	SkipUnheardEvents time.Duration `envconfig:"SCHEDULER_SKIP_UNHEARD_EVENTS" default:"5s"`
	// StepEvents: write step events (messages.StepEvent, routing key
	// step.EVENT on the status exchange) for queues of the deployment's
	// own that bind step.#: from the start, then as progress events are
	// (not while the broker returns them). Off, they are written only
	// while the API follows some order's steps.
	StepEvents bool `envconfig:"SCHEDULER_STEP_EVENTS" default:"false"`
	// DBMaxConns caps the database pool.
	DBMaxConns int32 `envconfig:"DB_MAX_CONNS" default:"10"`
}

type metrics struct {
	claimed        prometheus.Counter
	claimedByReply prometheus.Counter
	throttled      *prometheus.CounterVec
	repliesFull    prometheus.Counter
	claimDuration  prometheus.Histogram
	claimSize      prometheus.Histogram
	replyBatchSize prometheus.Histogram
	published      prometheus.Counter
	publishFailed  prometheus.Counter
	released       prometheus.Counter
	resent         prometheus.Counter
	wakeups        *prometheus.CounterVec
	replies        *prometheus.CounterVec
	stale          *prometheus.CounterVec
	ordersFinished *prometheus.CounterVec
	orderDuration  *prometheus.HistogramVec
	stepDuration   *prometheus.HistogramVec
	queueReady     *prometheus.GaugeVec
	dbRetries      prometheus.Counter
	outbox         *prometheus.CounterVec
	unroutable     *prometheus.CounterVec
	relayErrors    prometheus.Counter
	listening      prometheus.Gauge
	signals        *prometheus.CounterVec
	limitHeld      *prometheus.CounterVec
	limitWait      *prometheus.HistogramVec
	limitLowered   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_claimed_total", Help: "Steps claimed.",
		}),
		claimedByReply: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_claimed_with_reply_total",
			Help: "Steps claimed by the statement that applied the reply to the step before them (also in sas_scheduler_claimed_total).",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_scheduler_throttled_total", Help: "Claims skipped because the agent kind's request queue was full, by kind.",
		}, []string{"kind"}),
		repliesFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_throttled_by_replies_total", Help: "Claims skipped because the replies queue held SAS_SCHEDULER_MAX_REPLIES_QUEUED replies or more.",
		}),
		claimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_scheduler_claim_duration_seconds", Help: "Time of one claim statement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		claimSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_scheduler_claim_size", Help: "Steps taken by one claim statement that took any.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		replyBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_scheduler_reply_batch_size", Help: "Replies applied by one transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_requests_published_total", Help: "Step requests confirmed by the broker.",
		}),
		publishFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_request_publish_failures_total", Help: "Step requests the broker did not confirm.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_claims_released_total", Help: "Claimed steps handed back to pending because their request could not be sent.",
		}),
		resent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_steps_resent_total", Help: "Steps sent before the broker connection dropped, handed back to pending when it came back (transient step messages).",
		}),
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_scheduler_wakeups_total", Help: "Times a loop woke, by loop (claimer, relay, resend) and source (notify, poll, throttled, busy, held, reconnect).",
		}, []string{"loop", "source"}),
		replies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_scheduler_replies_total", Help: "Agent replies handled, by result (processed, error, stale, rejected, abandoned: a service's last answer kept, accepted: a 202 held the step open, throttled: a service's 429).",
		}, []string{"result"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_stale_replies_total", Help: "Replies that changed nothing, by kind (superseded, late, not_processing, unknown_step, race).",
		}, []string{"kind"}),
		ordersFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_orders_finished_total", Help: "Orders that reached a terminal status through a reply, by status and namespace.",
		}, []string{"status", "namespace"}),
		orderDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sas_order_duration_seconds", Help: "Time from submission to the reply that ended the order, by final status and namespace.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}, []string{"status", "namespace"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sas_step_duration_seconds", Help: "Time from a step's claim to its reply, by step name and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"name", "outcome"}),
		queueReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_agent_queue_ready", Help: "Requests waiting in an agent kind's queue, as last read by this scheduler.",
		}, []string{"kind"}),
		dbRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_scheduler_db_retries_total", Help: "Reply and signal applications retried after a database error.",
		}),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_signals_total", Help: "Signals handled, by outcome: applied (a wait ended), kept (before its wait began), duplicate, refused (dead-lettered).",
		}, []string{"outcome"}),
		outbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_outbox_published_total", Help: "Outbox messages published, by type.",
		}, []string{"type"}),
		unroutable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_outbox_unroutable_total", Help: "Outbox publishes no queue was bound for, by target (status_exchange, reply_to, alerts).",
		}, []string{"target"}),
		relayErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_outbox_relay_errors_total", Help: "Relay rounds that failed and will be retried.",
		}),
		listening: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_scheduler_listening", Help: "1 while this scheduler is the one of those claiming its agent kinds that listens for new work (holds their listener lease).",
		}),
	}
	m.limitHeld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sas_limit_held_total", Help: "Claims of a limited agent kind that its limit cut short, by kind and limit (rate, in_flight, namespace: a namespace's own).",
	}, []string{"kind", "limit"})
	m.limitWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sas_limit_wait_seconds", Help: "How long steps of a limited (or keyed) agent kind waited pending before their claim, by kind.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
	}, []string{"kind"})
	m.limitLowered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sas_limit_lowered_total", Help: "Times a service's 429 lowered its agent kind's rate, by kind.",
	}, []string{"kind"})
	reg.MustRegister(m.limitHeld, m.limitWait, m.limitLowered)
	reg.MustRegister(m.claimed, m.claimedByReply, m.throttled, m.repliesFull, m.claimDuration, m.claimSize, m.replyBatchSize, m.published, m.publishFailed, m.released, m.resent, m.wakeups, m.replies,
		m.stale, m.ordersFinished, m.orderDuration, m.stepDuration, m.queueReady, m.dbRetries, m.outbox, m.unroutable, m.relayErrors, m.listening,
		m.signals)
	return m
}

// initSeries makes every labelled series a rule or a dashboard panel reads
// exist from the start, at zero, for the label values known now: a series
// that appears only at its first increment hides that increment from
// increase() and rate().
func (m *metrics) initSeries(workflows *workflow.Registry, kinds []string) {
	for _, kind := range kinds {
		m.throttled.WithLabelValues(kind)
		m.queueReady.WithLabelValues(kind)
		m.limitHeld.WithLabelValues(kind, statestore.HeldRate)
		m.limitHeld.WithLabelValues(kind, statestore.HeldInFlight)
		m.limitHeld.WithLabelValues(kind, statestore.HeldNamespace)
		m.limitWait.WithLabelValues(kind)
		m.limitLowered.WithLabelValues(kind)
	}
	for _, name := range workflows.StepNames() {
		for _, outcome := range []string{messages.OutcomeOK, messages.OutcomeFailed} {
			m.stepDuration.WithLabelValues(name, outcome)
		}
	}
	for _, status := range []string{statestore.OrderCompleted, statestore.OrderFailed, statestore.OrderError} {
		m.ordersFinished.WithLabelValues(status, statestore.DefaultNamespace)
		m.orderDuration.WithLabelValues(status, statestore.DefaultNamespace)
	}
	for _, result := range []string{statestore.StepProcessed, statestore.StepError, "stale", "rejected", "abandoned", "accepted", "throttled"} {
		m.replies.WithLabelValues(result)
	}
	for _, kind := range []string{statestore.StaleUnknownStep, statestore.StaleSuperseded, statestore.StaleNotProcessing, statestore.StaleLate, statestore.StaleRace} {
		m.stale.WithLabelValues(kind)
	}
	for _, typ := range []string{statestore.OutboxStatusEvent, statestore.OutboxOperatorAlert} {
		m.outbox.WithLabelValues(typ)
	}
	for _, target := range []string{"status_exchange", "reply_to", "alerts"} {
		m.unroutable.WithLabelValues(target)
	}
	for loop, sources := range map[string][]string{"claimer": {"notify", "poll", "throttled"}, "relay": {"notify", "poll", "busy", "held"}} {
		for _, source := range sources {
			m.wakeups.WithLabelValues(loop, source)
		}
	}
}

// Topology is the queues and exchanges the scheduler uses: the replies
// and signals queues and a request queue per agent kind it claims for.
func Topology(prefix string, deliveryLimit int, queueType string, kinds []string) broker.Topology {
	inputs := []string{messages.RepliesQueue, messages.SignalsQueue}
	for _, kind := range kinds {
		inputs = append(inputs, messages.RequestsQueue(kind))
	}
	return broker.Topology{Prefix: prefix, DeliveryLimit: deliveryLimit, QueueType: queueType, Inputs: inputs, Entrances: []string{messages.SignalsQueue}}
}

// storeLimits keeps the workflows file's limits of the kinds this
// scheduler claims in the store, where every replica's claims read them:
// in a deployment of partitions, this partition's share of each
// (workflow.Limits.Share), so that the partitions together hold them.
func storeLimits(ctx context.Context, store *statestore.Store, workflows *workflow.Registry, kinds []string, partitions int, logger *slog.Logger) error {
	file := map[string]statestore.Limits{}
	for kind, l := range workflows.Limits() {
		file[kind] = statestore.LimitsOf(l.Share(partitions))
	}
	if err := service.RetryDB(ctx, logger, "storing the file's limits", func() error { return store.SyncLimits(ctx, kinds, file) }); err != nil {
		return err
	}
	for _, kind := range kinds {
		if l, ok := file[kind]; ok {
			logger.Info("agent kind limited", "kind", kind, "limits", l.String(), "partitions", partitions)
		}
	}
	scoped := map[string]map[string]statestore.Limits{}
	for kind, byNS := range workflows.NamespaceLimits() {
		scoped[kind] = map[string]statestore.Limits{}
		for ns, l := range byNS {
			scoped[kind][ns] = statestore.LimitsOf(l.Share(partitions))
		}
	}
	var missing []string
	if err := service.RetryDB(ctx, logger, "storing the file's namespace limits", func() (err error) {
		missing, err = store.SyncNamespaceLimits(ctx, kinds, scoped)
		return err
	}); err != nil {
		return err
	}
	for _, kind := range kinds {
		for ns, l := range scoped[kind] {
			logger.Info("agent kind limited in a namespace", "kind", kind, "namespace", ns, "limits", l.String())
		}
	}
	if len(missing) > 0 {
		logger.Warn("the workflows file limits namespaces that do not exist; their limits hold once sasctl namespaces add makes them",
			"namespaces", missing)
	}
	return nil
}

// Run runs the scheduler until ctx is done, then stops claiming, finishes
// the requests and replies in hand and closes.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	me := cfg.Instance("scheduler")
	logger = logger.With("service", "scheduler", "instance", me)
	reg := service.NewRegistry()
	m := newMetrics(reg)
	workflows, err := cfg.Workflows()
	if err != nil {
		return err
	}
	grants, err := intake.ParseBrokerGrants(cfg.Namespaces)
	if err != nil {
		return err
	}
	kinds := cfg.Kinds
	if len(kinds) == 0 {
		kinds = workflows.Agents()
	}
	for _, k := range kinds {
		if err := messages.CheckName("SAS_SCHEDULER_KINDS", k); err != nil {
			return err
		}
	}
	m.initSeries(workflows, kinds)
	topo := Topology(cfg.QueuePrefix, cfg.DeliveryLimit, cfg.QueueType, kinds)
	sk, err := service.Start(ctx, service.Setup{Name: "scheduler", Me: me, Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		DBMaxConns: cfg.DBMaxConns, Topology: &topo, Traced: true, DBKeyed: true}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	store, conn, pub, bm, tr := sk.Deps.Store, sk.Deps.Conn, sk.Deps.Pub, sk.Deps.Metrics, sk.Tracing
	if tr.On() {
		store.TraceOrders()
	}

	var secret string
	if err := service.RetryDB(ctx, logger, "reading the step token key", func() (err error) {
		secret, err = store.StepTokenKey(ctx)
		return err
	}); err != nil {
		return err
	}
	tokens, err := steptoken.NewKey(secret)
	if err != nil {
		return err
	}

	workCtx := sk.WorkCtx
	w := &waker{store: store, logger: logger, pending: make(chan struct{}, 1), outbox: make(chan struct{}, 1),
		me: me, lease: statestore.SchedulerListenerLease(kinds), gauge: m.listening}
	depths := broker.NewQueueInspector(conn)
	defer depths.Close()
	c := &claimer{store: store, pub: pub, depths: depths, topo: topo, kinds: kinds, system: workflows.HasSystemSteps(), me: me, heldUntil: map[string]time.Time{},
		batch: cfg.BatchSize, maxQueued: cfg.MaxQueued, maxReplies: cfg.MaxRepliesQueued, poll: cfg.PollInterval,
		wake: w.pending, wakeRelay: func() { nudge(w.outbox) }, shareMore: w.shareMore, workCtx: workCtx, logger: logger, metrics: m,
		known: map[string]queueDepth{}, tr: tr, tokens: tokens,
		wakeSelf: func() { nudge(w.pending) }, graph: &graphSteps{store: store, exprs: workflow.NewExprs(1000), me: me, workflows: workflows},
		keyed: workflows.KeyedKinds(), transient: cfg.TransientSteps()}
	layout, err := cfg.Layout()
	if err != nil {
		return err
	}
	partitions := 1
	if layout != nil {
		partitions = len(layout.Partitions)
	}
	if err := storeLimits(ctx, store, workflows, kinds, partitions, logger); err != nil {
		return err
	}
	// Claims and replies do not notify through the database (migration
	// 0007): what they make pending or write to the outbox, this
	// scheduler's own claimer and relay are nudged for.
	// A reply's next step is claimed with it when its kind's queue has
	// room for a whole batch more; the replier sends its request.
	repliesDone := make(chan struct{})
	rl := &relay{store: store, pub: pub, topo: topo, batch: cfg.RelayBatch, poll: cfg.PollInterval, unheardFor: cfg.SkipUnheardEvents,
		wake: w.outbox, held: make(chan statestore.OutboxMessage, heldQueue), handersDone: repliesDone, work: workCtx,
		logger: logger, metrics: m, tr: tr}
	applies := batch.New(cfg.ReplyBatch, cfg.ReplyBatchLinger, func(ctx context.Context, rs []statestore.Reply) ([]statestore.ApplyResult, []error) {
		m.replyBatchSize.Observe(float64(len(rs)))
		results, errs := store.ApplyRepliesPublishing(ctx, rs, c.openKinds(cfg.ReplyBatch), heldFor)
		for _, res := range results {
			if res.Claimed != nil {
				c.countSent(res.Claimed.Agent)
			}
		}
		return results, errs
	})
	sk.Go(func(ctx context.Context) { applies.Run(ctx, cfg.ReplyWriters) })
	r := &replier{store: store, applies: applies, me: me, workCtx: workCtx, logger: logger, metrics: m,
		wakeClaimer: func() { nudge(w.pending) }, wakeRelay: func() { nudge(w.outbox) }, dispatch: c.dispatch, tr: tr,
		publishHeld: rl.hand}
	replies := broker.NewConsumer(conn, pub,
		broker.ConsumerConfig{Input: messages.RepliesQueue, Prefetch: cfg.ReplyPrefetch, Workers: cfg.ReplyWorkers, Reasons: messages.Reasons()},
		r.handler(), logger, bm)
	sg := &signaler{store: store, me: me, workCtx: workCtx, logger: logger, metrics: m, tr: tr, tokens: tokens, redact: cfg.Redactor(),
		wakeClaimer: func() { nudge(w.pending) }, wakeRelay: func() { nudge(w.outbox) },
		grants: grants, exists: intake.NewNamespaces(store.Namespaces).Exists}
	signals := broker.NewConsumer(conn, pub,
		broker.ConsumerConfig{Input: messages.SignalsQueue, Prefetch: cfg.ReplyPrefetch, Workers: max(cfg.SignalWorkers, 1), Reasons: append(messages.Reasons(),
			statestore.SignalUnknownOrder, statestore.SignalOrderEnded, statestore.SignalNoSuchWait, statestore.SignalWaitEnded,
			statestore.SignalInvalidPayload, ReasonInvalidToken, ReasonStaleToken, intake.ReasonNamespaceRefused, intake.ReasonUnknownNamespace)},
		sg.handler(), logger, bm)

	if cfg.StepEvents {
		if err := service.RetryDB(ctx, logger, "turning step events on", func() error { return store.HearStepEvents(ctx) }); err != nil {
			return err
		}
	}
	// The relay publishes the ends the replies in hand hold as the
	// scheduler stops: it is told when the replies' consumer is done.
	runReplies := func(ctx context.Context) error {
		defer close(repliesDone)
		return replies.Run(ctx)
	}
	loops := []func(context.Context) error{w.run, c.run, runReplies, signals.Run, rl.run}
	if c.transient {
		rs := &resender{store: store, me: me, restored: conn.Restored(), wakeClaimer: func() { nudge(w.pending) }, logger: logger, metrics: m}
		loops = append(loops, rs.run)
	}
	logger.Info("scheduler started", "kinds", kinds, "workflows", workflows.Source, "batch", cfg.BatchSize, "poll_interval", cfg.PollInterval.String(),
		"transient_steps", c.transient)
	return sk.Run(ctx, cfg.ShutdownTimeout, sk.Deps.Ready(replies), loops...)
}
