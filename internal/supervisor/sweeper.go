package supervisor

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/archive"
	"sas/internal/statestore"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

// sweeper is the supervisor's loop: contend for the lease, sweep while
// holding it, report the store's work.
//
// Leadership is a lease row renewed on the database clock, not a session
// advisory lock: an advisory lock is freed when a dead leader's connection
// closes, but a leader that hangs (stopped, stuck in GC, partitioned with
// its TCP connection alive) would keep it forever and nobody would sweep.
// A lease that is not renewed expires after LeaseTTL whatever the reason,
// so a standby takes over within LeaseTTL + Interval. The sweep statement
// itself checks the lease, so a leader that resumes after losing it
// cannot sweep; and even two sweeps at once never count an expiry twice.
type sweeper struct {
	store   *statestore.Store
	cfg     Config
	me      string
	logger  *slog.Logger
	metrics *metrics
	leading bool
	tr      *tracing.Tracing
	// lead mirrors leading for the timer loop, which runs beside tick.
	lead atomic.Bool
	// timerWake wakes the timer loop: a timer was set for sooner than it
	// looks next, or this supervisor began to lead.
	timerWake chan struct{}
	// timersHeard is true while listenTimers listens.
	timersHeard atomic.Bool
	// workflows are the file's: its schedules, and the workflows their
	// orders run.
	workflows *workflow.Registry
	// archive, when set, keeps each ended order's record before
	// retention deletes it.
	archive archive.Archive

	// The statistics refresh and retention run beside the sweeps (an
	// ANALYZE of a large table, or a long purge, must not delay them past
	// the lease), each one at a time; background joins them.
	background  sync.WaitGroup
	analyzeBusy chan struct{} // holds a token while a refresh runs
	lastAnalyze time.Time
	lastReport  time.Time
	lastSample  time.Time
	// Retention too runs beside the sweeps, one at a time.
	purgeBusy chan struct{}
	lastPurge time.Time
}

func (s *sweeper) run(ctx context.Context) error {
	next := time.NewTimer(0)
	defer next.Stop()
	s.analyzeBusy = make(chan struct{}, 1)
	s.purgeBusy = make(chan struct{}, 1)
	defer s.background.Wait()
	s.timerWake = make(chan struct{}, 1)
	s.background.Go(func() { s.listenTimers(ctx) })
	s.background.Go(func() { s.timers(ctx) })
	if hasWebhooks(s.workflows) {
		w := &webhookSender{store: s.store, client: newWebhookClient(s.cfg.WebhookTimeout), cfg: s.cfg, env: lookupEnv, now: time.Now,
			logger: s.logger, sent: func(state string) { s.metrics.webhooks.WithLabelValues(state).Inc() }}
		s.background.Go(func() { w.run(ctx) })
	}
	// After a failed renewal the next try comes sooner than Interval,
	// from retryFirst doubling up to it, so that the store's return is
	// seen at once.
	retry := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			if s.leading {
				// Hand over now rather than after the lease runs out.
				release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				if err := s.store.ReleaseLease(release, LeaseName, s.me); err != nil {
					s.logger.Warn("could not give the lease up", "err", err)
				}
				cancel()
				s.metrics.leader.Set(0)
			}
			return nil
		case <-next.C:
		}
		if s.tick(ctx) {
			retry = 0
			next.Reset(s.cfg.Interval)
		} else {
			retry = min(max(2*retry, retryFirst), s.cfg.Interval)
			next.Reset(retry)
		}
	}
}

// retryFirst is how soon a failed lease renewal is tried again the
// first time.
const retryFirst = 25 * time.Millisecond

// retryTimers is how soon the timer loop tries again after a failed
// firing, every time: a try costs a refused connection while the store
// is away, and once it is back each of the pool's connections that died
// with it fails one try before a new one is made, so a timer that fell
// due meanwhile is late by about this many tries past the store's return.
const retryTimers = 20 * time.Millisecond

// tick renews or contends for the lease and, holding it, sweeps; it
// reports whether the store answered.
//
// A renewal that fails (the store restarting, a connection cut) leaves
// what this supervisor believed as it was: the timer loop goes on firing
// through the fenced statement, which refuses if the lease was lost
// meanwhile, so timers fall due on time as soon as the store is back
// rather than at the next renewal.
func (s *sweeper) tick(ctx context.Context) bool {
	lease, err := s.store.AcquireLease(ctx, LeaseName, s.me, s.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			s.metrics.errors.Inc()
			s.logger.Warn("lease renewal failed; will try again", "err", err)
		}
		return false
	}
	if lease.Held != s.leading {
		if lease.Held {
			s.logger.Info("became the leader", "epoch", lease.Epoch)
		} else {
			s.logger.Warn("no longer the leader", "holder", lease.Holder)
		}
		s.leading = lease.Held
		s.lead.Store(lease.Held)
		if lease.Held {
			// What fell due while another led fires now.
			nudgeTimers(s.timerWake)
		}
	}
	if lease.Held {
		s.metrics.leader.Set(1)
		s.sweep(ctx)
		s.maybeAnalyze(ctx)
		s.maybePurge(ctx)
		s.maybeSample(ctx)
	} else {
		s.metrics.leader.Set(0)
	}
	s.report(ctx)
	return true
}

// sweep handles expired steps in batches until none is left.
func (s *sweeper) sweep(ctx context.Context) {
	start := time.Now()
	defer func() { s.metrics.sweepDuration.Observe(time.Since(start).Seconds()) }()
	s.metrics.sweeps.Inc()
	params := statestore.SweepParams{
		Actor: s.me, Limit: s.cfg.Batch, Lease: LeaseName,
		BackoffBase: s.cfg.BackoffBase, BackoffMax: s.cfg.BackoffMax,
	}
	// Orders of a paused workflow written as its pause began are paused
	// too, and steps of paused orders that became pending set aside.
	if n, err := s.store.SettlePauses(ctx, s.me); err != nil {
		if ctx.Err() == nil {
			s.metrics.errors.Inc()
			s.logger.Warn("settling pauses failed; will try again", "err", err)
		}
	} else if n > 0 {
		s.logger.Info("paused orders of a paused workflow", "count", n)
	}
	for ctx.Err() == nil {
		sweepStart := time.Now()
		swept, err := s.store.SweepExpired(ctx, params)
		if err != nil {
			if ctx.Err() == nil {
				s.metrics.errors.Inc()
				s.logger.Warn("sweep failed", "err", err)
			}
			return
		}
		for _, st := range swept {
			sctx := s.traceSweep(ctx, st, sweepStart)
			log := s.logger.With(append([]any{"order_id", st.OrderID, "step", st.Step, "attempt", st.Attempt, "failure_count", st.FailureCount},
				tracing.LogAttrs(sctx)...)...)
			if st.NewState == statestore.StepError {
				s.metrics.failures.Inc()
				log.Error("operator alert: step reached its failure threshold; order held in error")
			} else {
				s.metrics.resets.Inc()
				log.Info("expired step put back to pending")
			}
		}
		if len(swept) < s.cfg.Batch {
			return
		}
	}
}

// timers fires the timers that fall due while this supervisor leads:
// it makes due delayed steps pending, fires due orders' deadlines and
// starts the schedules' due ticks,
// then sleeps until the earliest waiting timer or tick is due (read on
// the database clock), at most TimerPoll, woken by listenTimers when a
// timer is set for sooner than it said it would look (WatchTimers). When
// it could not say so, or cannot hear, it looks again within
// unwatchedTimerPoll, as it did every round before it was told. The
// firing statement checks the lease itself.
func (s *sweeper) timers(ctx context.Context) {
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		case <-s.timerWake:
			if !wait.Stop() {
				select {
				case <-wait.C:
				default:
				}
			}
		}
		next := s.cfg.TimerPoll
		if !s.lead.Load() {
			s.metrics.scheduleLate.Set(0) // the leader's to say
		}
		if s.lead.Load() {
			s.fireSchedules(ctx)
			full, err := s.fireTimers(ctx)
			switch {
			case err != nil:
				// The store is away: look again soon, so that timers due
				// meanwhile fire as soon as it is back.
				next = min(retryTimers, s.cfg.TimerPoll)
			case full:
				next = 0 // a full batch: more may be due
			default:
				// A timer that fell due while this round fired the others
				// is fired at once, not a whole TimerPoll later (held
				// orders' timers, which wait for a resubmit, are left
				// out); minTimerWait keeps a timer another firing holds
				// from spinning the loop.
				d, ok, watched, err := s.store.WatchTimers(ctx, s.cfg.TimerPoll)
				if err != nil || !watched || !s.timersHeard.Load() {
					next = min(next, unwatchedTimerPoll)
				}
				if err == nil && ok && d < next {
					next = max(d, minTimerWait)
				}
			}
		}
		wait.Reset(next)
	}
}

// unwatchedTimerPoll is the longest the timer loop sleeps while a timer
// set meanwhile might not be told to it.
const unwatchedTimerPoll = 200 * time.Millisecond

// minTimerWait is the least the timer loop waits when a timer is due
// but was not fired this round (another transaction holds its row).
const minTimerWait = 5 * time.Millisecond

// fireTimers fires one batch of due timers; it reports whether the
// batch was full.
func (s *sweeper) fireTimers(ctx context.Context) (bool, error) {
	fired, err := s.store.FireTimers(ctx, s.me, LeaseName, s.cfg.Batch)
	if err != nil {
		if ctx.Err() == nil {
			s.metrics.errors.Inc()
			s.logger.Warn("firing timers failed; will try again", "err", err)
		}
		return false, err
	}
	for _, f := range fired {
		s.metrics.timersFired.Inc()
		s.metrics.timerLateness.Observe(max(f.Late.Seconds(), 0))
	}
	if len(fired) > 0 {
		s.logger.Debug("timers fired", "count", len(fired))
	}
	passed, err := s.store.FireDeadlines(ctx, s.me, LeaseName, s.cfg.Batch)
	if err != nil {
		if ctx.Err() == nil {
			s.metrics.errors.Inc()
			s.logger.Warn("firing deadlines failed; will try again", "err", err)
		}
		return false, err
	}
	for _, d := range passed {
		if d.Applied {
			s.metrics.deadlines.WithLabelValues(d.Workflow, d.OnDeadline).Inc()
			s.logger.Info("an order's deadline passed", "order_id", d.OrderID, "workflow", d.Workflow, "on_deadline", d.OnDeadline,
				"late", d.Late.String())
		}
	}
	return len(fired) >= s.cfg.Batch || len(passed) >= s.cfg.Batch, nil
}

// maybeAnalyze starts the upkeep of the state tables when one is due and
// none is running: a vacuum of those with many dead rows, then a refresh
// of stale planner statistics.
func (s *sweeper) maybeAnalyze(ctx context.Context) {
	if s.cfg.AnalyzeInterval <= 0 || time.Since(s.lastAnalyze) < s.cfg.AnalyzeInterval {
		return
	}
	select {
	case s.analyzeBusy <- struct{}{}:
	default:
		return // the last one is still running
	}
	s.lastAnalyze = time.Now()
	s.background.Go(func() {
		defer func() { <-s.analyzeBusy }()
		start := time.Now()
		if s.cfg.VacuumMinDead > 0 {
			tables, err := s.store.VacuumDead(ctx, s.cfg.VacuumMinDead, s.cfg.AnalyzeInterval)
			for _, t := range tables {
				s.metrics.vacuumed.WithLabelValues(t).Inc()
			}
			switch {
			case err != nil && ctx.Err() == nil:
				s.metrics.errors.Inc()
				s.logger.Warn("vacuuming the state tables failed", "err", err, "vacuumed", tables)
			case len(tables) > 0:
				s.logger.Info("vacuumed the dead rows of state tables", "tables", tables, "took", time.Since(start).String())
			}
		}
		start = time.Now()
		tables, err := s.store.RefreshStats(ctx, s.cfg.AnalyzeMinRows, s.cfg.AnalyzeInterval)
		for _, t := range tables {
			s.metrics.analyzed.WithLabelValues(t).Inc()
		}
		switch {
		case err != nil && ctx.Err() == nil:
			s.metrics.errors.Inc()
			s.logger.Warn("refreshing planner statistics failed", "err", err, "analyzed", tables)
		case len(tables) > 0:
			s.logger.Info("refreshed stale planner statistics", "tables", tables, "took", time.Since(start).String())
		}
	})
}

// maybePurge starts a retention run when one is due and none is running:
// it deletes ended orders older than Retention, RetentionBatch at a time,
// until fewer than a batch are left.
func (s *sweeper) maybePurge(ctx context.Context) {
	if s.cfg.Retention <= 0 || time.Since(s.lastPurge) < s.cfg.RetentionInterval {
		return
	}
	select {
	case s.purgeBusy <- struct{}{}:
	default:
		return
	}
	s.lastPurge = time.Now()
	s.background.Go(func() {
		defer func() { <-s.purgeBusy }()
		start := time.Now()
		var total statestore.Purged
		for ctx.Err() == nil {
			var p statestore.Purged
			var err error
			if s.archive != nil {
				var kept int
				p, kept, err = archive.Retain(ctx, s.store, s.archive, s.cfg.Retention, nil, s.cfg.RetentionBatch)
				s.metrics.archived.Add(float64(kept))
				switch {
				case err != nil && ctx.Err() == nil:
					s.metrics.archiveErrors.Inc()
					s.metrics.archiveUp.Set(0)
				case err == nil:
					s.metrics.archiveUp.Set(1)
				}
				if kept > 0 && p.Orders < int64(kept) && err == nil {
					p.Orders = int64(kept) // some changed meanwhile: not a full batch's worth to go on for
				}
			} else {
				p, err = s.store.PurgeEnded(ctx, s.cfg.Retention, nil, s.cfg.RetentionBatch)
			}
			if err != nil {
				if ctx.Err() == nil {
					s.metrics.errors.Inc()
					s.logger.Warn("deleting ended orders past their retention failed; will try again", "err", err)
				}
				break
			}
			total.Add(p)
			s.metrics.purged.WithLabelValues("orders").Add(float64(p.Orders))
			s.metrics.purged.WithLabelValues("steps").Add(float64(p.Steps))
			s.metrics.purged.WithLabelValues("transitions").Add(float64(p.Transitions))
			s.metrics.purged.WithLabelValues("alerts").Add(float64(p.Alerts))
			if p.Orders < int64(s.cfg.RetentionBatch) {
				break
			}
		}
		if total.Orders > 0 {
			s.logger.Info("deleted ended orders past their retention", "orders", total.Orders, "steps", total.Steps,
				"transitions", total.Transitions, "alerts", total.Alerts, "retention", s.cfg.Retention, "took", time.Since(start))
		}
	})
}

// report refreshes the live-work gauges every StatsInterval: under load
// the counts read thousands of index entries, too many to read every
// sweep.
func (s *sweeper) report(ctx context.Context) {
	if time.Since(s.lastReport) < s.cfg.StatsInterval {
		return
	}
	s.lastReport = time.Now()
	st, err := s.store.Stats(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("reading step stats failed", "err", err)
		}
		return
	}
	for _, state := range statestore.LiveStates {
		s.metrics.steps.WithLabelValues(state).Set(float64(st.ByState[state]))
	}
	s.metrics.oldestPending.Set(st.OldestPending.Seconds())
	s.metrics.oldestProcessing.Set(st.OldestProcessing.Seconds())
	for ns, n := range st.OpenAlertsIn {
		s.metrics.openAlerts.WithLabelValues(ns).Set(float64(n))
	}
	for ns, l := range st.InFlightIn {
		s.metrics.inFlight.WithLabelValues(ns).Set(float64(l.InFlight))
		if l.MaxInFlight != nil {
			s.metrics.quotaInFlight.WithLabelValues(ns).Set(float64(*l.MaxInFlight))
		} else {
			s.metrics.quotaInFlight.DeleteLabelValues(ns)
		}
	}
	s.reportLimits(ctx)
	if ps, err := s.store.PauseStats(ctx); err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("reading pauses failed", "err", err)
		}
	} else {
		s.metrics.paused.WithLabelValues("order").Set(float64(ps.Orders))
		s.metrics.paused.WithLabelValues("workflow").Set(float64(ps.Workflows))
		s.metrics.paused.WithLabelValues("kind").Set(float64(ps.Kinds))
		for scope, d := range ps.Oldest {
			s.metrics.pausedOldest.WithLabelValues(scope).Set(d.Seconds())
		}
	}
}

// keysReported bounds the keys sas_limit_key_* report: a key is often a
// tenant or a customer, and there may be millions.
const keysReported = 20

// reportLimits sets the gauges of the limited kinds and of the keys with
// the most work.
func (s *sweeper) reportLimits(ctx context.Context) {
	kinds, err := s.store.ListLimits(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("reading the limits failed", "err", err)
		}
		return
	}
	m := s.metrics
	for _, g := range []*prometheus.GaugeVec{m.limitRate, m.limitMaxInFlight, m.limitInFlight, m.limitWaiting, m.limitOldestWait, m.limitOverdue} {
		g.Reset() // a kind whose limits were removed leaves
	}
	m.initLimits(s.workflows)
	for _, k := range kinds {
		if !k.Effective.Any() {
			continue
		}
		if k.Effective.Rate != nil {
			m.limitRate.WithLabelValues(k.Agent).Set(*k.Effective.Rate)
		}
		if k.Effective.MaxInFlight != nil {
			m.limitMaxInFlight.WithLabelValues(k.Agent).Set(float64(*k.Effective.MaxInFlight))
		}
		m.limitInFlight.WithLabelValues(k.Agent).Set(float64(k.InFlight))
		m.limitWaiting.WithLabelValues(k.Agent).Set(float64(k.Waiting))
		m.limitOldestWait.WithLabelValues(k.Agent).Set(k.OldestWait)
		m.limitOverdue.WithLabelValues(k.Agent).Set(float64(k.Overdue))
	}
	keys, err := s.store.KeysInUse(ctx, keysReported)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("reading the keys in use failed", "err", err)
		}
		return
	}
	m.keyWaiting.Reset()
	m.keyInFlight.Reset()
	for _, k := range keys {
		m.keyWaiting.WithLabelValues(k.Agent, k.Namespace, k.Key).Set(float64(k.Waiting))
		m.keyInFlight.WithLabelValues(k.Agent, k.Namespace, k.Key).Set(float64(k.InFlight))
	}
	scoped, err := s.store.ListNamespaceLimits(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("reading the namespaces' limits failed", "err", err)
		}
		return
	}
	for _, g := range []*prometheus.GaugeVec{m.nsLimitRate, m.nsLimitMaxInFlight, m.nsLimitInFlight, m.nsLimitWaiting} {
		g.Reset()
	}
	for _, n := range scoped {
		if n.Limits.Rate != nil {
			m.nsLimitRate.WithLabelValues(n.Agent, n.Namespace).Set(*n.Limits.Rate)
		}
		if n.Limits.MaxInFlight != nil {
			m.nsLimitMaxInFlight.WithLabelValues(n.Agent, n.Namespace).Set(float64(*n.Limits.MaxInFlight))
		}
		m.nsLimitInFlight.WithLabelValues(n.Agent, n.Namespace).Set(float64(n.InFlight))
		m.nsLimitWaiting.WithLabelValues(n.Agent, n.Namespace).Set(float64(n.Waiting))
	}
}

// maybeSample writes the console's charts' rows every OverviewInterval.
func (s *sweeper) maybeSample(ctx context.Context) {
	if s.cfg.OverviewInterval <= 0 || time.Since(s.lastSample) < s.cfg.OverviewInterval {
		return
	}
	s.lastSample = time.Now()
	if _, err := s.store.SampleOverview(ctx, s.me, LeaseName); err != nil && ctx.Err() == nil {
		s.metrics.errors.Inc()
		s.logger.Warn("sampling the console's charts failed", "err", err)
	}
}

// traceSweep records a swept step in its order's trace: a span from the
// sweep's start to now, "reset step" or "step failed" (with the order's
// status after its failure policy). It returns the span's context, or ctx
// when tracing is off or the order has no trace.
func (s *sweeper) traceSweep(ctx context.Context, st statestore.SweptStep, start time.Time) context.Context {
	if !s.tr.On() || st.Traceparent == "" {
		return ctx
	}
	name := "reset step"
	if st.NewState == statestore.StepError {
		name = "step failed"
	}
	sctx, span := s.tr.Start(s.tr.Resume(ctx, st.Traceparent), name, trace.WithTimestamp(start),
		trace.WithAttributes(tracing.StepAttrs(st.OrderID, st.Step, st.Attempt, attribute.Int("sas.failure_count", st.FailureCount),
			attribute.String("sas.step_state", st.NewState), attribute.String("sas.order_status", st.OrderStatus),
			attribute.String("sas.reason", "complete_by passed"))...))
	span.End()
	return sctx
}

// nudgeTimers wakes the timer loop, unless a wake-up is already waiting.
func nudgeTimers(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// listenTimers listens on ChannelTimers on a connection of its own and
// wakes the timer loop at each notification. After losing and regaining
// the connection it wakes the loop, since notifications sent meanwhile
// are gone; meanwhile the loop looks every unwatchedTimerPoll.
func (s *sweeper) listenTimers(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.listenTimersOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.logger.Warn("timer notifications lost; looking for timers five times a second until they are back", "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *sweeper) listenTimersOnce(ctx context.Context) error {
	l, err := s.store.Listen(ctx, statestore.ChannelTimers)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	schema, err := l.Schema(ctx)
	if err != nil {
		return err
	}
	s.timersHeard.Store(true)
	defer s.timersHeard.Store(false)
	nudgeTimers(s.timerWake) // what was set while not listening
	for {
		if _, err := l.Wait(ctx, schema); err != nil {
			return err
		}
		nudgeTimers(s.timerWake)
	}
}
