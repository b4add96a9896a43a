// Package supervisor is the supervisor service: the pattern's safety net.
// Every interval its leader finds processing steps whose complete_by has
// passed on the database clock and, below their failure threshold, puts
// them back to pending after a backoff, or at it marks them error, holds
// their order and raises an operator alert (through the outbox, published
// by the schedulers' relay). It also reports the store's work as metrics.
package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/archive"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// LeaseName is the supervisor leader's lease.
const LeaseName = statestore.SupervisorLease

// Config is the supervisor's configuration (environment prefix SAS_).
type Config struct {
	service.Common
	// The workflows file's schedules are the supervisor's to start.
	service.WorkflowsFile
	MetricsAddr string `envconfig:"METRICS_ADDR" default:":9104"`
	// Interval is how often the leader sweeps and a standby tries to lead.
	Interval time.Duration `envconfig:"SUPERVISOR_INTERVAL" default:"1s"`
	// Batch caps the steps one sweep statement handles, and the timers
	// one firing makes pending.
	Batch int `envconfig:"SUPERVISOR_BATCH" default:"500"`
	// TimerPoll is the longest the leader's timer loop sleeps: it sleeps
	// until the earliest timer (a delayed step's or a wait's due time, a
	// schedule's tick) and is told of one set meanwhile for sooner
	// (statestore.WatchTimers); at rest it wakes once a TimerPoll. While
	// it cannot be told (its listening connection is down, or a writer of
	// timers held the watch's lock when it looked) it looks again within
	// 200 ms (or TimerPoll if shorter).
	TimerPoll time.Duration `envconfig:"SUPERVISOR_TIMER_POLL" default:"5s"`
	// BackoffBase and BackoffMax: a reset step waits BackoffBase *
	// 2^(failure_count-1), at most BackoffMax, before it may be claimed.
	BackoffBase time.Duration `envconfig:"SUPERVISOR_BACKOFF_BASE" default:"1s"`
	BackoffMax  time.Duration `envconfig:"SUPERVISOR_BACKOFF_MAX" default:"1m"`
	// LeaseTTL is how long leadership lasts without renewal: a standby
	// takes over at most LeaseTTL + Interval after the leader stops.
	LeaseTTL time.Duration `envconfig:"SUPERVISOR_LEASE_TTL" default:"5s"`
	// StatsInterval is how often the live-work gauges (sas_steps, the
	// oldest pending and processing ages) are read from the store; each
	// reading counts the pending and processing steps.
	StatsInterval time.Duration `envconfig:"SUPERVISOR_STATS_INTERVAL" default:"5s"`
	// OverviewInterval is how often the leader samples the console's
	// charts (overview_minutes: per minute and workflow, orders completed
	// and failed, their latency, steps pending); 0: never.
	OverviewInterval time.Duration `envconfig:"SUPERVISOR_OVERVIEW_INTERVAL" default:"15s"`
	// AnalyzeInterval is how often the leader looks for state tables whose
	// planner statistics are stale (never analyzed, or grown tenfold
	// since) and analyzes them (0: never).
	AnalyzeInterval time.Duration `envconfig:"SUPERVISOR_ANALYZE_INTERVAL" default:"10s"`
	// AnalyzeMinRows is how many live rows a table needs before it is
	// worth analyzing.
	AnalyzeMinRows int64 `envconfig:"SUPERVISOR_ANALYZE_MIN_ROWS" default:"1000"`
	// VacuumMinDead is how many dead rows a state table (orders, steps,
	// outbox, signals, order_payloads) collects before the leader vacuums
	// it, at most once every AnalyzeInterval, when no vacuum has within
	// it (0: never). The claim, the sweep and the relay walk every dead
	// index entry older than the live ones: this bounds them by the last
	// interval's work, not the table's history.
	VacuumMinDead int64 `envconfig:"SUPERVISOR_VACUUM_MIN_DEAD" default:"20000"`
	// Retention is how long ended orders (completed, failed) are kept,
	// from their last change, before the leader deletes them with their
	// steps, history and alerts (0: for ever).
	Retention time.Duration `envconfig:"RETENTION" default:"720h"`
	// RetentionInterval is how often the leader looks for orders past
	// Retention; RetentionBatch how many it deletes per transaction.
	RetentionInterval time.Duration `envconfig:"RETENTION_INTERVAL" default:"1m"`
	RetentionBatch    int           `envconfig:"RETENTION_BATCH" default:"500"`
	// Webhooks (docs/YOUR-PROCESS.md): how often an idle sender looks
	// for deliveries due (doubling up to 8 times that while none come),
	// how long one try may take, the backoff between tries and how many
	// tries make a delivery dead.
	WebhookPoll       time.Duration `envconfig:"SUPERVISOR_WEBHOOK_POLL" default:"1s"`
	WebhookTimeout    time.Duration `envconfig:"SUPERVISOR_WEBHOOK_TIMEOUT" default:"10s"`
	WebhookBackoff    time.Duration `envconfig:"SUPERVISOR_WEBHOOK_BACKOFF" default:"1s"`
	WebhookBackoffMax time.Duration `envconfig:"SUPERVISOR_WEBHOOK_BACKOFF_MAX" default:"10m"`
	WebhookAttempts   int           `envconfig:"SUPERVISOR_WEBHOOK_ATTEMPTS" default:"8"`
	DBMaxConns        int32         `envconfig:"DB_MAX_CONNS" default:"4"`
	// Archive: where ended orders are archived before retention deletes
	// them (SAS_ARCHIVE and its S3 settings; docs/OPERATIONS.md).
	archive.Config
}

type metrics struct {
	leader           prometheus.Gauge
	sweeps           prometheus.Counter
	resets           prometheus.Counter
	failures         prometheus.Counter
	errors           prometheus.Counter
	sweepDuration    prometheus.Histogram
	steps            *prometheus.GaugeVec
	oldestPending    prometheus.Gauge
	oldestProcessing prometheus.Gauge
	openAlerts       *prometheus.GaugeVec
	inFlight         *prometheus.GaugeVec
	quotaInFlight    *prometheus.GaugeVec
	analyzed         *prometheus.CounterVec
	vacuumed         *prometheus.CounterVec
	purged           *prometheus.CounterVec
	timersFired      prometheus.Counter
	deadlines        *prometheus.CounterVec
	paused           *prometheus.GaugeVec
	archived         prometheus.Counter
	archiveErrors    prometheus.Counter
	archiveUp        prometheus.Gauge
	pausedOldest     *prometheus.GaugeVec
	scheduleTicks    *prometheus.CounterVec
	webhooks         *prometheus.CounterVec
	scheduleNext     *prometheus.GaugeVec
	scheduleLast     *prometheus.GaugeVec
	scheduleLateness prometheus.Histogram
	// The limits of agent kinds and the keys' use (report).
	limitRate, limitMaxInFlight, limitInFlight, limitWaiting *prometheus.GaugeVec
	limitOldestWait, limitOverdue, keyWaiting, keyInFlight   *prometheus.GaugeVec
	// a namespace's own limits on a kind and their use
	nsLimitRate, nsLimitMaxInFlight, nsLimitInFlight, nsLimitWaiting *prometheus.GaugeVec
	scheduleLate                                                     prometheus.Gauge
	timerLateness                                                    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_supervisor_leader", Help: "1 while this supervisor holds the leader lease and sweeps.",
		}),
		sweeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_supervisor_sweeps_total", Help: "Sweeps run by this supervisor as leader.",
		}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_supervisor_resets_total", Help: "Expired steps put back to pending.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_supervisor_failures_total", Help: "Expired steps that reached their failure threshold and were marked error (each raises an operator alert).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_supervisor_errors_total", Help: "Sweeps, lease renewals or statistics refreshes that failed and will be tried again.",
		}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_supervisor_sweep_duration_seconds", Help: "Duration of one sweep (all its statements).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		steps: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_steps", Help: "Live steps in the state store by process_state: pending, processing, and error (of orders held in error: what needs an operator).",
		}, []string{"state"}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_oldest_pending_step_age_seconds", Help: "How long the longest-waiting due pending step has waited.",
		}),
		oldestProcessing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_oldest_processing_step_age_seconds", Help: "How long ago the oldest processing step was claimed.",
		}),
		openAlerts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_alerts_open", Help: "Operator alerts that still need a person: not acknowledged, and their order has not ended since (sasctl alerts list --open), by their order's namespace.",
		}, []string{"namespace"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_orders_in_flight", Help: "Orders in flight (received, processing, compensating, held in error), by namespace (the leader's reading, every SAS_SUPERVISOR_STATS_INTERVAL).",
		}, []string{"namespace"}),
		quotaInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_namespace_max_in_flight", Help: "A namespace's quota of orders in flight (sasctl namespaces quota --in-flight; absent: none), by namespace.",
		}, []string{"namespace"}),
		analyzed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_supervisor_tables_analyzed_total", Help: "State tables whose stale planner statistics the leader refreshed, by table.",
		}, []string{"table"}),
		vacuumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_supervisor_tables_vacuumed_total", Help: "State tables whose dead rows the leader vacuumed (SAS_SUPERVISOR_VACUUM_MIN_DEAD), by table.",
		}, []string{"table"}),
		purged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_retention_deleted_total", Help: "Rows of ended orders deleted after SAS_RETENTION, by table (orders, steps, transitions, alerts).",
		}, []string{"table"}),
		timersFired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_timers_fired_total", Help: "Delayed steps the leader made pending when their delay ended.",
		}),
		timerLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_timer_lateness_seconds", Help: "How long after its due time (database clock) a delayed step was made pending.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}),
		deadlines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_order_deadlines_passed_total", Help: "Orders whose whole-order deadline passed while they ran, by workflow and what they did (on_deadline: compensate, hold, fail).",
		}, []string{"workflow", "on_deadline"}),
		archived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_archived_total", Help: "Ended orders whose whole record the archive (SAS_ARCHIVE) confirmed it keeps, before retention deleted them.",
		}),
		archiveErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sas_archive_errors_total", Help: "Retention runs the archive held back: it did not keep an order's record, so nothing more was deleted.",
		}),
		archiveUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_archive_up", Help: "0 while the archive's last write failed and retention waits for it; 1 otherwise (and with no archive).",
		}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_paused", Help: "What is paused, by scope: orders (on their own or with their workflow), workflows, agent kinds (the leader's reading; a standby reports 0).",
		}, []string{"scope"}),
		pausedOldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_paused_oldest_seconds", Help: "How long the longest-paused order, workflow or agent kind has been paused, by scope (0: none).",
		}, []string{"scope"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_webhook_tries_total", Help: "Webhook deliveries tried, by the state each was left in: sent, pending (to be tried again), dead.",
		}, []string{"state"}),
		scheduleTicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sas_schedule_ticks_total", Help: "Schedule ticks the leader handled, by schedule and outcome (started: an order; skipped: overlap or catch-up; triggered: an operator's).",
		}, []string{"schedule", "outcome"}),
		scheduleNext: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_schedule_next_tick_timestamp_seconds", Help: "When each schedule ticks next (Unix time; the leader's reading, after each round).",
		}, []string{"schedule"}),
		scheduleLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_schedule_last_tick_timestamp_seconds", Help: "Each schedule's last tick handled (Unix time).",
		}, []string{"schedule"}),
		scheduleLate: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sas_schedule_late_seconds", Help: "How late the most overdue schedule tick is that the leader has not started (0: none; a standby reports 0).",
		}),
		limitRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_rate", Help: "The claims a second a limited agent kind is allowed now (lowered while a service's 429 holds it; absent: no rate), by kind.",
		}, []string{"kind"}),
		limitMaxInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_max_in_flight", Help: "A limited agent kind's max_in_flight (absent: none), by kind.",
		}, []string{"kind"}),
		limitInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_in_flight", Help: "A limited agent kind's steps processing, by kind.",
		}, []string{"kind"}),
		limitWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_waiting_steps", Help: "A limited agent kind's due steps waiting pending for its limit, by kind.",
		}, []string{"kind"}),
		limitOldestWait: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_oldest_wait_seconds", Help: "How long the longest-waiting due step of a limited agent kind has waited, by kind.",
		}, []string{"kind"}),
		limitOverdue: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_overdue_steps", Help: "Steps of a limited agent kind that have waited pending longer than their own timeout (their budget), by kind.",
		}, []string{"kind"}),
		keyWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_key_waiting_steps", Help: "Steps waiting pending, by agent kind, namespace and concurrency key (the keys with the most waiting, at most 20).",
		}, []string{"kind", "namespace", "key"}),
		keyInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_key_in_flight", Help: "Steps processing, by agent kind, namespace and concurrency key (the same keys as sas_limit_key_waiting_steps).",
		}, []string{"kind", "namespace", "key"}),
		nsLimitRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_namespace_rate", Help: "A namespace's own rate limit on an agent kind (claims a second), by kind and namespace.",
		}, []string{"kind", "namespace"}),
		nsLimitMaxInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_namespace_max_in_flight", Help: "A namespace's own max_in_flight on an agent kind, by kind and namespace.",
		}, []string{"kind", "namespace"}),
		nsLimitInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_namespace_in_flight", Help: "A namespace's steps processing of an agent kind it has limits on, by kind and namespace.",
		}, []string{"kind", "namespace"}),
		nsLimitWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sas_limit_namespace_waiting_steps", Help: "A namespace's due steps waiting pending of an agent kind it has limits on, by kind and namespace.",
		}, []string{"kind", "namespace"}),
		scheduleLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sas_schedule_tick_lateness_seconds", Help: "How long after a schedule's tick (database clock) the leader started its order.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	for _, table := range []string{"orders", "steps", "transitions", "alerts"} {
		m.purged.WithLabelValues(table)
	}
	for _, table := range []string{"orders", "steps", "transitions", "outbox"} {
		m.analyzed.WithLabelValues(table)
	}
	for _, table := range []string{"orders", "steps", "outbox", "signals", "order_payloads"} {
		m.vacuumed.WithLabelValues(table)
	}
	for _, state := range statestore.LiveStates {
		m.steps.WithLabelValues(state)
	}
	m.archiveUp.Set(1)
	for _, scope := range []string{"order", "workflow", "kind"} {
		m.paused.WithLabelValues(scope)
		m.pausedOldest.WithLabelValues(scope)
	}
	for _, state := range []string{statestore.WebhookSent, statestore.WebhookPending, statestore.WebhookDead} {
		m.webhooks.WithLabelValues(state)
	}
	// The default namespace's open alerts from the start (a rule reads
	// them); every other namespace's from the first statistics read.
	m.openAlerts.WithLabelValues(statestore.DefaultNamespace)
	m.inFlight.WithLabelValues(statestore.DefaultNamespace)
	reg.MustRegister(m.webhooks, m.deadlines, m.paused, m.pausedOldest, m.archived, m.archiveErrors, m.archiveUp, m.leader, m.sweeps, m.resets, m.failures, m.errors, m.sweepDuration, m.steps, m.oldestPending, m.oldestProcessing,
		m.openAlerts, m.inFlight, m.quotaInFlight, m.analyzed, m.vacuumed, m.purged, m.timersFired, m.timerLateness, m.scheduleTicks, m.scheduleNext, m.scheduleLast, m.scheduleLateness, m.scheduleLate,
		m.limitRate, m.limitMaxInFlight, m.limitInFlight, m.limitWaiting, m.limitOldestWait, m.limitOverdue, m.keyWaiting, m.keyInFlight,
		m.nsLimitRate, m.nsLimitMaxInFlight, m.nsLimitInFlight, m.nsLimitWaiting)
	return m
}

// initLimits makes the use gauges of the file's agent kinds exist at
// zero (a rule reads them from the start); a kind's rate and
// max_in_flight exist only while it has them.
func (m *metrics) initLimits(workflows *workflow.Registry) {
	if workflows == nil {
		return
	}
	for _, kind := range workflows.Agents() {
		for _, g := range []*prometheus.GaugeVec{m.limitInFlight, m.limitWaiting, m.limitOldestWait, m.limitOverdue} {
			g.WithLabelValues(kind)
		}
	}
	// Any order may give its own deadline, under its workflow's on_deadline.
	for _, wf := range workflows.All() {
		_, how := wf.Deadline(time.Hour)
		m.deadlines.WithLabelValues(wf.Name, how)
	}
}

// Run runs the supervisor until ctx is done, then gives its lease up so a
// standby takes over at once.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.Retention < 0 || cfg.RetentionBatch < 1 || cfg.RetentionInterval <= 0 {
		return fmt.Errorf("SAS_RETENTION (%v) must not be negative, SAS_RETENTION_BATCH (%d) must be at least 1 and SAS_RETENTION_INTERVAL (%v) positive",
			cfg.Retention, cfg.RetentionBatch, cfg.RetentionInterval)
	}
	if cfg.TimerPoll <= 0 || cfg.Batch < 1 {
		return fmt.Errorf("SAS_SUPERVISOR_TIMER_POLL (%v) must be positive and SAS_SUPERVISOR_BATCH (%d) at least 1", cfg.TimerPoll, cfg.Batch)
	}
	if cfg.WebhookPoll <= 0 || cfg.WebhookTimeout <= 0 || cfg.WebhookBackoff <= 0 || cfg.WebhookBackoffMax < cfg.WebhookBackoff || cfg.WebhookAttempts < 1 {
		return fmt.Errorf("SAS_SUPERVISOR_WEBHOOK_POLL, _TIMEOUT and _BACKOFF must be positive, _BACKOFF_MAX at least _BACKOFF, _ATTEMPTS at least 1")
	}
	if cfg.LeaseTTL < 2*cfg.Interval {
		return fmt.Errorf("SAS_SUPERVISOR_LEASE_TTL (%v) must be at least twice SAS_SUPERVISOR_INTERVAL (%v), or the leader loses its lease between renewals", cfg.LeaseTTL, cfg.Interval)
	}
	me := cfg.Instance("supervisor")
	logger = logger.With("service", "supervisor", "instance", me)
	reg := service.NewRegistry()
	m := newMetrics(reg)
	sk, err := service.Start(ctx, service.Setup{Name: "supervisor", Me: me, Common: cfg.Common, OpsAddr: cfg.MetricsAddr, Registry: reg,
		DBMaxConns: cfg.DBMaxConns, Traced: true, DBKeyed: true}, logger)
	if err != nil {
		return err
	}
	defer sk.Close()
	store, tr := sk.Deps.Store, sk.Tracing
	sk.Ops.SetReady(store.Ping)
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if on, err := store.Autovacuum(startCtx); err == nil && !on {
		logger.Warn("autovacuum is off on this database: the leader vacuums the state tables it owns once their dead rows pass SAS_SUPERVISOR_VACUUM_MIN_DEAD, and refreshes their planner statistics",
			"analyze_interval", cfg.AnalyzeInterval.String(), "vacuum_min_dead", cfg.VacuumMinDead)
	}
	workflows, err := cfg.Workflows()
	if err != nil {
		return err
	}
	m.initLimits(workflows)
	arch, err := archive.Open(cfg.Config)
	if err != nil {
		return err
	}
	s := &sweeper{store: store, cfg: cfg, me: me, logger: logger, metrics: m, tr: tr, workflows: workflows, archive: arch}
	if err := s.syncSchedules(ctx); err != nil {
		return err
	}
	archived := "none"
	if arch != nil {
		archived = arch.String()
	}
	logger.Info("supervisor started", "interval", cfg.Interval, "lease_ttl", cfg.LeaseTTL, "retention", cfg.Retention, "archive", archived)
	return sk.Run(ctx, cfg.ShutdownTimeout, store.Ping, s.run)
}
