package supervisor

import (
	"context"
	"fmt"
	"time"

	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// syncSchedules copies the workflows file's schedules into the state
// store (a new or changed one ticks from now, on the database clock),
// retrying while the database is unreachable. In a partitioned deployment
// a schedule is kept, and fires, in one partition only (partition.Layout.ScheduleOwner):
// the others' supervisors leave it out, so each tick starts one order.
func (s *sweeper) syncSchedules(ctx context.Context) error {
	layout, own, err := s.cfg.Own(s.cfg.QueuePrefix)
	if err != nil {
		return err
	}
	return service.RetryDB(ctx, s.logger, "storing the schedules", func() error {
		now, err := s.store.Now(ctx)
		if err != nil {
			return err
		}
		var defs []statestore.ScheduleDef
		for _, sc := range s.workflows.Schedules() {
			if layout != nil && layout.ScheduleOwner(sc.Name) != own {
				continue
			}
			defs = append(defs, statestore.ScheduleDef{Name: sc.Name, Workflow: sc.Workflow, Cron: sc.Cron, Timezone: sc.Timezone,
				Payload: sc.Payload, Overlap: sc.Overlap, CatchUp: sc.CatchUp, Version: sc.Version(), FirstTick: sc.Next(now)})
			s.metrics.scheduleTicks.WithLabelValues(sc.Name, "started")
			s.metrics.scheduleTicks.WithLabelValues(sc.Name, "skipped")
		}
		return s.store.SyncSchedules(ctx, defs)
	})
}

// catchUpGrace is how late a tick may be handled and still count as on
// time under catch_up: none.
const catchUpGrace = time.Minute

// fireSchedules starts the orders of the schedules whose ticks are due
// (FireSchedules checks the lease).
// A leader whose file has no schedules still looks: a schedule another
// file stored that nobody handles is late, and its gauge says so.
func (s *sweeper) fireSchedules(ctx context.Context) {
	fired, err := s.store.FireSchedules(ctx, s.me, LeaseName, s.planSchedule)
	if err != nil {
		if ctx.Err() == nil {
			s.metrics.errors.Inc()
			s.logger.Warn("starting scheduled orders failed; will try again", "err", err)
		}
		return
	}
	late := 0.0
	for _, f := range fired {
		if len(f.Started) == 0 && f.Skipped == 0 && !f.NextTick.After(f.Now) {
			late = max(late, f.Now.Sub(f.NextTick).Seconds()) // due, and left: this leader cannot tell its ticks
		}
		s.metrics.scheduleTicks.WithLabelValues(f.Name, "started").Add(float64(len(f.Started)))
		s.metrics.scheduleTicks.WithLabelValues(f.Name, "skipped").Add(float64(f.Skipped))
		s.metrics.scheduleNext.WithLabelValues(f.Name).Set(float64(f.NextTick.UnixMilli()) / 1000)
		if f.LastTick != nil {
			s.metrics.scheduleLast.WithLabelValues(f.Name).Set(float64(f.LastTick.UnixMilli()) / 1000)
			if len(f.Started) > 0 {
				s.metrics.scheduleLateness.Observe(max(f.Late.Seconds(), 0))
			}
		}
		if len(f.Started) > 0 || f.Skipped > 0 {
			s.logger.Info("schedule ticked", "schedule", f.Name, "started", f.Started, "skipped", f.Skipped, "next_tick", f.NextTick)
		}
		if f.NoNamespace != "" {
			s.metrics.errors.Inc()
			s.logger.Error("a schedule's tick started nothing: its namespace does not exist (sasctl namespaces add)",
				"schedule", f.Name, "namespace", f.NoNamespace)
		}
	}
	s.metrics.scheduleLate.Set(late)
}

// planSchedule decides a due schedule's round: the ticks that passed
// since its next tick, which of them start an order (catch_up: all the
// latest MaxCatchUp; last the newest; none the newest only if it is not a
// minute late), none while its last order runs under overlap: skip (and
// at most one otherwise skipped: they would overlap it), an operator's
// trigger whatever the overlap, and the next tick after now.
func (s *sweeper) planSchedule(now time.Time, due statestore.ScheduleRow) statestore.ScheduleRound {
	var round statestore.ScheduleRound
	sc, okSc := s.workflows.Schedule(due.Name)
	wf, okWf := s.workflows.Lookup(due.Workflow)
	if !okSc || !okWf || sc.Version() != due.Version {
		// Another supervisor's file (one of another release, or being
		// rolled out): this one cannot tell its ticks and leaves it as it
		// is; a supervisor with that file handles it once it leads.
		round.NextTick = due.NextTick
		return round
	}
	var ticks []time.Time
	if !due.Paused {
		for t := due.NextTick; !t.After(now) && !t.IsZero(); t = sc.Next(t) {
			ticks = append(ticks, t)
			if len(ticks) > 10*workflow.MaxCatchUp {
				ticks = ticks[len(ticks)-workflow.MaxCatchUp:]
			}
		}
	}
	round.NextTick = due.NextTick
	if len(ticks) > 0 {
		last := ticks[len(ticks)-1]
		round.LastTick = &last
		round.NextTick = sc.Next(last)
	}
	start := ticks
	switch sc.CatchUp {
	case workflow.CatchUpAll:
		start = ticks[max(len(ticks)-workflow.MaxCatchUp, 0):]
	case workflow.CatchUpLast:
		start = ticks[max(len(ticks)-1, 0):]
	case workflow.CatchUpNone:
		start = nil
		if len(ticks) > 0 && now.Sub(ticks[len(ticks)-1]) <= catchUpGrace {
			start = ticks[len(ticks)-1:]
		}
	}
	if sc.Overlap == workflow.OverlapSkip && len(start) > 0 {
		if due.Running() {
			start = nil
		} else {
			start = start[len(start)-1:]
		}
	}
	round.Skipped = len(ticks) - len(start)
	for _, t := range start {
		round.Starts = append(round.Starts, s.scheduledOrder(sc, wf, "schedule:"+sc.Name+":"+t.UTC().Format(time.RFC3339Nano), t))
	}
	if due.TriggerAt != nil {
		round.Starts = append(round.Starts, s.scheduledOrder(sc, wf, "schedule:"+sc.Name+":trigger:"+due.TriggerAt.UTC().Format(time.RFC3339Nano), *due.TriggerAt))
		round.ClearTrigger = true
	}
	return round
}

// scheduledOrder is the order of a schedule's tick (or trigger), its id
// derived from name.
func (s *sweeper) scheduledOrder(sc workflow.Schedule, wf workflow.Workflow, name string, tick time.Time) statestore.ScheduleStart {
	o := statestore.NewOrder{OrderID: messages.DerivedID(name), Workflow: wf.Name, WorkflowVersion: wf.Version(), Payload: sc.Payload,
		PayloadHash: statestore.DerivedHash(wf.Name, sc.Payload), FailurePolicy: wf.Policy, Steps: statestore.StepsOf(wf, 0), Attributes: intake.Attributes(wf, sc.Payload), Key: intake.Key(wf, sc.Payload),
		Actor: fmt.Sprintf("schedule:%s (tick %s)", sc.Name, tick.UTC().Format(time.RFC3339)), Namespace: sc.Namespace}
	o.Deadline, o.OnDeadline = wf.Deadline(0)
	return statestore.ScheduleStart{Tick: tick, Order: o,
		Version: statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: s.me}}
}
