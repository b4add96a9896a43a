package proctest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/scheduler"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/supervisor"
	"sas/internal/workflow"
	"sas/migrations"
)

// The agent's and supervisor's settings the cases run with: their
// defaults (internal/agent and internal/supervisor Config).
const (
	agentCallTimeout  = 5 * time.Second
	agentSafetyMargin = 100 * time.Millisecond
	agentRetryBase    = 50 * time.Millisecond
	agentRetryMax     = 2 * time.Second
	sweepBackoffBase  = time.Second
	sweepBackoffMax   = time.Minute
	batch             = 500
)

// Horizon is the longest a case's order may run in virtual time.
const Horizon = 800 * 24 * time.Hour

// maxRounds bounds the rounds of one case (each claims, fires, sweeps
// and applies what is due): a case past it does not settle.
const maxRounds = 100_000

// me is the name the cases' scheduler, supervisor and services act under.
const me = "workflows-test"

// Env is a schema of its own, with a virtual clock, where a workflows
// file's cases run one after the other.
type Env struct {
	pool   *pgxpool.Pool
	store  *statestore.Store
	local  *scheduler.Local
	reg    *workflow.Registry
	schema string
}

// Open makes a schema with a virtual clock in the database db names (a
// name no other uses), migrates it and stores the workflows' versions.
// Close drops it.
func Open(ctx context.Context, db statestore.Options, reg *workflow.Registry) (*Env, error) {
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	schema := "sas_workflows_test_" + hex.EncodeToString(suffix)
	if err := secrets.CheckURL("the database URL", db.URL); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", secrets.New(db.URL, db.Password).Err(err))
	}
	if db.Password != "" {
		cfg.ConnConfig.Password = db.Password
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = statestore.VirtualSearchPath(schema)
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	cfg.ConnConfig.RuntimeParams["client_min_messages"] = "warning"
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the cases need a PostgreSQL database (SAS_DATABASE_URL): %w", secrets.New(db.URL, db.Password).Err(err))
	}
	e := &Env{pool: pool, store: statestore.New(pool), reg: reg, schema: schema}
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err == nil {
		err = statestore.CreateVirtualClock(ctx, pool, schema, ms)
	}
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("prepare a schema for the cases: %w", err)
	}
	if err := intake.StoreVersions(ctx, e.store, reg, me, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		e.Close()
		return nil, err
	}
	secret, err := e.store.StepTokenKey(ctx)
	if err != nil {
		e.Close()
		return nil, err
	}
	tokens, err := steptoken.NewKey(secret)
	if err != nil {
		e.Close()
		return nil, err
	}
	e.local = scheduler.NewLocal(e.store, reg, me, tokens)
	if err := e.local.StoreLimits(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close drops the schema and closes the connections.
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{e.schema}.Sanitize()+` CASCADE`)
	e.pool.Close()
}

// reset empties every table an order wrote, so that the next case finds
// none of the last one's orders, signals, timers or alerts. (DELETE, not
// TRUNCATE: a few rows each, and a truncate makes new files.)
func (e *Env) reset(ctx context.Context) error {
	var tables []string
	rows, err := e.pool.Query(ctx, `SELECT format('%I', c.relname) FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
  AND (EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'order_id' AND NOT a.attisdropped)
       OR c.relname IN ('alerts', 'leases', 'listener_leases', 'operator_actions', 'overview_minutes'))
  -- deleting orders deletes these (orders_delete_history)
  AND c.relname NOT IN ('orders', 'steps', 'transitions', 'signals', 'order_attributes', 'order_payloads', 'order_deadlines', 'order_pauses')`)
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fmt.Errorf("list the order tables: %w", err)
	}
	slices.Sort(tables)
	q := "DELETE FROM orders;"
	for _, t := range tables {
		q += " DELETE FROM " + t + ";"
	}
	if _, err = e.pool.Exec(ctx, q); err != nil {
		return fmt.Errorf("empty the order tables: %w", err)
	}
	return nil
}

// event is something a scripted service or the case does at a moment:
// a reply, a callback, a signal.
type event struct {
	at    time.Time
	seq   int
	what  string
	apply func(ctx context.Context) ([]messages.StepRequest, error)
}

// run is one case's run.
type run struct {
	e      *Env
	c      Case
	t0     time.Time
	events []event
	seq    int
	trace  []string
}

func (r *run) at(t time.Time, what string, apply func(ctx context.Context) ([]messages.StepRequest, error)) {
	r.seq++
	r.events = append(r.events, event{at: t, seq: r.seq, what: what, apply: apply})
	slices.SortStableFunc(r.events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.seq, b.seq)
	})
}

func (r *run) note(t time.Time, format string, args ...any) {
	r.trace = append(r.trace, fmt.Sprintf("%-10s %s", "+"+short(t.Sub(r.t0)), fmt.Sprintf(format, args...)))
}

// Run runs one case and reads what became of its order.
func (e *Env) Run(ctx context.Context, c Case) Outcome {
	out := Outcome{Case: c.Name}
	fail := func(err error) Outcome {
		out.Err = err
		return out
	}
	if err := e.reset(ctx); err != nil {
		return fail(err)
	}
	t0, err := e.store.Now(ctx)
	if err != nil {
		return fail(err)
	}
	r := &run{e: e, c: c, t0: t0}
	sub := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: c.Workflow,
		Payload: c.Payload, Deadline: c.Deadline}
	o, err := intake.Prepare(e.reg, sub, statestore.DefaultNamespace, 0, me)
	if err != nil {
		return fail(fmt.Errorf("the workflow refuses the case's order: %w", err))
	}
	if _, err := e.store.InsertOrder(ctx, o); err != nil {
		return fail(err)
	}
	out.OrderID = o.OrderID
	r.note(t0, "order submitted (workflow %s)", c.Workflow)
	for i, sg := range c.Signals {
		sig := statestore.Signal{OrderID: o.OrderID, ID: fmt.Sprintf("case-signal-%d", i+1), Name: sg.Name, Payload: sg.Payload, Actor: me}
		r.at(t0.Add(sg.At), "signal "+sg.Name, func(ctx context.Context) ([]messages.StepRequest, error) {
			res, err := e.store.ApplySignal(ctx, sig)
			if err == nil {
				r.note(t0.Add(sg.At), "signal %s: %s", sg.Name, res.Outcome)
			}
			return nil, err
		})
	}
	if err := r.settle(ctx, o.OrderID); err != nil {
		out.Err = err
	}
	out.Trace = r.trace
	if err := e.read(ctx, o.OrderID, &out); err != nil && out.Err == nil {
		out.Err = err
	}
	return out
}

// settle runs the order until it ends or nothing is left to happen.
func (r *run) settle(ctx context.Context, orderID string) error {
	e := r.e
	idle, advanced := 0, false
	for round := 0; ; round++ {
		if round >= maxRounds {
			return fmt.Errorf("the order did not settle after %d rounds", maxRounds)
		}
		now, err := e.store.Now(ctx)
		if err != nil {
			return err
		}
		// The supervisor's work falls due only as time moves (or at the
		// start): it runs in the first round at each moment.
		moved, err := r.round(ctx, now, round == 0 || idle > 0 || advanced)
		if err != nil {
			return err
		}
		advanced = false
		if moved {
			continue
		}
		status, err := e.store.OrderStatus(ctx, orderID)
		if err != nil {
			return err
		}
		if status == statestore.OrderCompleted || status == statestore.OrderFailed {
			return nil
		}
		next, ok, err := e.store.NextDue(ctx)
		if err != nil {
			return err
		}
		if len(r.events) > 0 && (!ok || r.events[0].at.Before(next)) {
			next, ok = r.events[0].at, true
		}
		if !ok {
			return nil // it waits for what no case sends (an operator, a signal)
		}
		if next.Sub(r.t0) > Horizon {
			r.note(next, "next due past the horizon of %s: stopped", short(Horizon))
			return nil
		}
		// Due now and still nothing moved (a limit's rate holds a step,
		// a row another statement held): time goes on, ever faster.
		step := next.Sub(now)
		if step <= 0 {
			idle++
			step = min(time.Second, time.Millisecond<<min(idle, 10))
		} else {
			idle = 0
		}
		if err := e.store.AdvanceClock(ctx, step); err != nil {
			return err
		}
		advanced = true
	}
}

// round does what is due now: the supervisor's settling of pauses, sweep
// of expired steps, timers and deadlines, then a claim and the events due.
// It reports whether anything happened.
func (r *run) round(ctx context.Context, now time.Time, supervise bool) (bool, error) {
	e := r.e
	moved := false
	if supervise {
		n, err := r.supervise(ctx, now)
		if err != nil {
			return false, err
		}
		moved = n > 0
	}
	reqs, n, err := e.local.Claim(ctx, batch)
	if err != nil {
		return false, err
	}
	moved = moved || n > 0
	r.send(now, reqs)
	for len(r.events) > 0 && !r.events[0].at.After(now) {
		ev := r.events[0]
		r.events = r.events[1:]
		reqs, err := ev.apply(ctx)
		if err != nil {
			return false, fmt.Errorf("%s: %w", ev.what, err)
		}
		moved = true
		r.send(now, reqs)
	}
	return moved, nil
}

// supervise does the leading supervisor's work due now: it settles
// pauses, sweeps expired steps, fires timers and deadlines. It reports
// how many it moved.
func (r *run) supervise(ctx context.Context, now time.Time) (int, error) {
	e := r.e
	if _, err := e.store.AcquireLease(ctx, supervisor.LeaseName, me, time.Hour); err != nil {
		return 0, err
	}
	if _, err := e.store.SettlePauses(ctx, me); err != nil {
		return 0, err
	}
	swept, err := e.store.SweepExpired(ctx, statestore.SweepParams{Actor: me, Limit: batch, Lease: supervisor.LeaseName,
		BackoffBase: sweepBackoffBase, BackoffMax: sweepBackoffMax})
	if err != nil {
		return 0, err
	}
	for _, s := range swept {
		r.note(now, "step %d attempt %d ran out of time: %s (failures %d)", s.Step, s.Attempt, s.NewState, s.FailureCount)
	}
	fired, err := e.store.FireTimers(ctx, me, supervisor.LeaseName, batch)
	if err != nil {
		return 0, err
	}
	for _, f := range fired {
		r.note(now, "timer of step %d fired", f.Step)
	}
	passed, err := e.store.FireDeadlines(ctx, me, supervisor.LeaseName, batch)
	if err != nil {
		return 0, err
	}
	for _, d := range passed {
		if d.Applied {
			r.note(now, "the order's deadline passed (%s)", d.OnDeadline)
		}
	}
	return len(swept) + len(fired) + len(passed), nil
}

// send hands each request to its scripted service, which answers at the
// moments its script makes.
func (r *run) send(now time.Time, reqs []messages.StepRequest) {
	for _, req := range reqs {
		r.call(now, req)
	}
}

// call plays an agent calling the step's scripted service as the agent
// does (internal/agent): its tries, each retried after the agent's
// backoff (its ceiling, the longest the jitter waits) until the answer
// or complete_by less the safety margin; then the reply, a 202's
// callback, or nothing.
func (r *run) call(now time.Time, req messages.StepRequest) {
	name := req.Name
	if req.Index != nil {
		name = fmt.Sprintf("%s[%d]", req.Name, *req.Index)
	}
	a := Answer{Result: json.RawMessage(`{}`)}
	if as := r.c.Services[req.Name]; len(as) > 0 {
		a = as[min(req.Attempt, len(as))-1]
	}
	deadline := req.CompleteBy.Add(-agentSafetyMargin)
	r.note(now, "call %s (attempt %d)", name, req.Attempt)
	if !now.Before(deadline) {
		r.note(now, "%s: past its complete_by on arrival, dropped", name)
		return
	}
	reply := messages.StepReply{SchemaVersion: messages.SchemaVersion, OrderID: req.OrderID, Step: req.Step, Attempt: req.Attempt}
	t, last := now, ""
	for n := 0; ; n++ {
		failing := n < a.Transient || a.Silent
		try := a.Takes
		if a.Silent {
			try = agentCallTimeout
		}
		if t.Add(try).After(deadline) {
			// The step's deadline cuts the try short: the agent gives up.
			r.abandon(deadline, name, reply, last)
			return
		}
		t = t.Add(try)
		if !failing {
			break
		}
		last = "503 Service Unavailable: transient failure"
		if a.Silent {
			last = fmt.Sprintf("no answer within %s", short(agentCallTimeout))
		}
		wait := min(agentRetryMax, agentRetryBase<<min(n, 20))
		if !t.Add(wait).Before(deadline) {
			r.abandon(t, name, reply, last)
			return
		}
		t = t.Add(wait)
	}
	switch {
	case a.Refuse != "":
		reply.Outcome, reply.Error = messages.OutcomeFailed, fmt.Sprintf("%s answered %d: %s", req.Name, http.StatusUnprocessableEntity, a.Refuse)
		reply.LastAnswer = fmt.Sprintf("%d %s: %s", http.StatusUnprocessableEntity, http.StatusText(http.StatusUnprocessableEntity), a.Refuse)
	case a.Accept != nil:
		reply.Outcome = messages.OutcomeAccepted
		reply.LastAnswer = "202 Accepted: waiting for the callback"
		if !a.Accept.Never {
			cb := statestore.Callback{Token: req.Token, Name: "complete", Result: a.Accept.Result, Actor: me, Notify: false}
			if a.Accept.Fail != "" {
				cb.Name, cb.Result, cb.Error = "fail", nil, a.Accept.Fail
			}
			at := t.Add(a.Accept.After)
			r.at(at, "callback of "+name, func(ctx context.Context) ([]messages.StepRequest, error) {
				out, err := r.e.store.Callback(ctx, cb)
				if err == nil {
					r.note(at, "callback %s of %s: %s", cb.Name, name, out.Outcome)
				}
				return nil, err
			})
		}
	default:
		reply.Outcome, reply.Result = messages.OutcomeOK, a.Result
		if len(a.Result) == 0 {
			reply.Result = json.RawMessage(`{}`)
		}
	}
	r.at(t, "reply of "+name, func(ctx context.Context) ([]messages.StepRequest, error) {
		r.note(t, "%s answered %s", name, reply.Outcome)
		return r.e.local.Reply(ctx, reply)
	})
}

// abandon is the agent giving up at t: it says nothing but the service's
// last answer, if there was one.
func (r *run) abandon(t time.Time, name string, reply messages.StepReply, last string) {
	r.at(t, "gave up on "+name, func(ctx context.Context) ([]messages.StepRequest, error) {
		r.note(t, "%s: gave up at complete_by", name)
		if last == "" {
			return nil, nil
		}
		reply.Outcome, reply.LastAnswer = messages.OutcomeAbandoned, last
		return r.e.local.Reply(ctx, reply)
	})
}

// short is a duration as a case writes one.
func short(d time.Duration) string {
	switch {
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
