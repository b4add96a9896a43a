package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/remote"
	"sas/internal/statestore"
)

// callInFlight returns a ledger entry whose call has reached the remote
// and not been applied yet, if there is one.
func (p pipeline) callInFlight(t *testing.T) (remote.Entry, bool) {
	t.Helper()
	for _, e := range p.ledger(t) {
		if e.Effects == 0 && e.Calls > 0 {
			return e, true
		}
	}
	return remote.Entry{}, false
}

func (p pipeline) stepOf(t *testing.T, orderID string, step int) statestore.Step {
	t.Helper()
	d, err := statestore.New(p.pool).GetOrder(context.Background(), orderID)
	if err != nil {
		t.Fatal(err)
	}
	return d.Steps[step-1]
}

func supervisorResets(t *testing.T, p *pipeline, orderID string, step int) int {
	return p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = $2
		AND from_state = 'processing' AND to_state = 'pending' AND actor LIKE 'supervisor:%'`, orderID, step)
}

// TestAgentKilledMidCallIsRecovered: an agent dies (kill -9) while its
// remote call is in progress; the supervisor resets the step after its
// complete_by; another agent completes it; the remote applied it once.
func TestAgentKilledMidCallIsRecovered(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{withoutAgents: true, supervisors: 1,
		faults:       `{"reserve_inventory":{"latency_min_ms":5000,"latency_max_ms":5000}}`,
		submitterEnv: []string{"SAS_STEP_TIMEOUT=2s"}})
	first := p.startAgent(t)
	ids := p.submitOrders(t, 1, "--workflow", "single")
	testenv.Eventually(t, 30*time.Second, "the agent's call in progress", func() bool {
		_, ok := p.callInFlight(t)
		return ok
	})
	first.kill(t)
	testenv.Eventually(t, 30*time.Second, "the supervisor to reset the step", func() bool {
		return supervisorResets(t, p, ids[0], 1) == 1
	})
	p.setFaults(t, `{}`)
	p.startAgent(t)
	p.waitTerminal(t, ids, time.Minute)
	st := p.stepOf(t, ids[0], 1)
	if st.ProcessState != statestore.StepProcessed || st.Attempt != 2 || st.FailureCount != 1 {
		t.Fatalf("step after recovery: %+v", st)
	}
	p.checkInvariants(t, ids)
	for _, e := range p.ledger(t) {
		if e.Key == st.IdempotencyKey && e.Effects != 1 {
			t.Fatalf("key %s applied %d times", e.Key, e.Effects)
		}
	}
}

// TestSchedulerKilledAfterClaimIsRecovered: a scheduler dies (SIGKILL at a
// failpoint) right after claiming steps, before sending any request; the
// supervisor resets them and another scheduler sees them through.
func TestSchedulerKilledAfterClaimIsRecovered(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{supervisors: 1,
		schedulerEnv: []string{"SAS_FAILPOINTS=scheduler-after-claim"},
		submitterEnv: []string{"SAS_STEP_TIMEOUT=2s"}})
	doomed := p.schedulers[0]
	ids := p.submitOrders(t, 5, "--workflow", "single")
	doomed.waitKilled(t, 30*time.Second)
	if n := p.count(t, `SELECT count(*) FROM steps WHERE order_id = ANY($1::uuid[]) AND process_state = 'processing'`, ids); n == 0 {
		t.Fatal("the scheduler died without having claimed anything")
	}
	p.schedulers = append(p.schedulers, start(t, "scheduler", append(append([]string{}, p.env...), "SAS_SCHEDULER_POLL_INTERVAL=200ms")))
	p.waitTerminal(t, ids, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != 5 {
		t.Fatalf("%d of 5 orders completed", n)
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[])
		AND from_state = 'processing' AND to_state = 'pending' AND actor LIKE 'supervisor:%'`, ids); n == 0 {
		t.Fatal("no step was recovered by the supervisor")
	}
	p.checkOneEffectPerStep(t, ids)
	p.checkInvariants(t, ids)
}

// TestStoppedAgentsLateReplyChangesNothing: an agent is frozen (SIGSTOP)
// with its call in progress until well past complete_by; the step is reset
// and completed by another agent; when the frozen agent resumes, whatever
// it does changes nothing.
func TestStoppedAgentsLateReplyChangesNothing(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{withoutAgents: true, supervisors: 1,
		faults:       `{"reserve_inventory":{"latency_min_ms":1000,"latency_max_ms":1000}}`,
		submitterEnv: []string{"SAS_STEP_TIMEOUT=2s"}})
	frozen := p.startAgent(t)
	ids := p.submitOrders(t, 1, "--workflow", "single")
	testenv.Eventually(t, 30*time.Second, "the agent's call in progress", func() bool {
		_, ok := p.callInFlight(t)
		return ok
	})
	frozen.signal(t, syscall.SIGSTOP)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			frozen.signal(t, syscall.SIGCONT)
		}
	})
	testenv.Eventually(t, 30*time.Second, "the supervisor to reset the step", func() bool {
		return supervisorResets(t, p, ids[0], 1) == 1
	})
	p.setFaults(t, `{}`)
	p.startAgent(t)
	p.waitTerminal(t, ids, time.Minute)
	snapshot := func() string {
		d, err := statestore.New(p.pool).GetOrder(context.Background(), ids[0])
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(d)
		return string(b)
	}
	before := snapshot()

	frozen.signal(t, syscall.SIGCONT)
	resumed = true
	testenv.Eventually(t, 30*time.Second, "the resumed agent to give up or its reply to be refused", func() bool {
		return frozen.metric(t, `sas_agent_abandoned_total{reason="deadline"}`) >= 1 ||
			sum(t, p.schedulers, `sas_scheduler_replies_total{result="stale"}`) >= 1
	})
	if after := snapshot(); after != before {
		t.Fatalf("the resumed agent changed the order:\nbefore %s\nafter  %s", before, after)
	}
	p.checkInvariants(t, ids)
	st := p.stepOf(t, ids[0], 1)
	for _, e := range p.ledger(t) {
		if e.Key == st.IdempotencyKey && e.Effects != 1 {
			t.Fatalf("key applied %d times", e.Effects)
		}
	}
}

// TestRemoteDownReachesThresholdThenResubmit: with the payment endpoint
// down, the step is attempted exactly its threshold number of times, the
// order is held in error and an alert reaches the alerts queue; after the
// fault is removed an operator's resubmit completes the order.
func TestRemoteDownReachesThresholdThenResubmit(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{supervisors: 1,
		faults:       `{"charge_payment":{"error_rate":1}}`,
		submitterEnv: []string{"SAS_STEP_TIMEOUT=1s"}})
	ids := p.submitOrders(t, 1, "--workflow", "order_hold")
	id := ids[0]
	p.waitTerminal(t, ids, 2*time.Minute)
	st := p.stepOf(t, id, 2)
	if st.ProcessState != statestore.StepError || st.FailureCount != st.MaxFailures || st.Attempt != st.MaxFailures {
		t.Fatalf("payment step: %s, failures %d, attempts %d; want error after exactly %d attempts", st.ProcessState, st.FailureCount, st.Attempt, st.MaxFailures)
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = $1 AND step = 2 AND to_state = 'processing'`, id); n != st.MaxFailures {
		t.Fatalf("%d claims of the payment step, want %d", n, st.MaxFailures)
	}
	sup := p.supervisors[0]
	testenv.Eventually(t, 10*time.Second, "the supervisor's metrics to show the held step", func() bool {
		return sup.metric(t, "sas_supervisor_failures_total") == 1 && sup.metric(t, `sas_steps{state="error"}`) == 1 &&
			sup.metric(t, `sas_steps{state="processing"}`) == 0 && sup.metric(t, `sas_steps{state="pending"}`) == 0
	})
	if resets := sup.metric(t, "sas_supervisor_resets_total"); resets != float64(st.MaxFailures-1) {
		t.Fatalf("%v resets counted, want %d", resets, st.MaxFailures-1)
	}
	if al := openAlerts(t, p.env, id); len(al) != 1 || al[0].FailureCount != st.MaxFailures {
		t.Fatalf("open alerts of the order: %+v", al)
	}
	out, _, _ := sasctl(t, p.env, "orders", "show", id)
	if !strings.Contains(out, "status    error") || !strings.Contains(flat(out), "failure threshold") {
		t.Fatalf("orders show lacks the error:\n%s", out)
	}

	p.setFaults(t, `{}`)
	if out, errOut, code := sasctl(t, p.env, "orders", "resubmit", id); code != 0 {
		t.Fatalf("resubmit: %s %s", out, errOut)
	}
	p.waitTerminal(t, ids, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'completed'`, id); n != 1 {
		t.Fatal("the resubmitted order did not complete")
	}
	p.checkOneEffectPerStep(t, ids)
	t.Logf("payment step: %d attempts before error; agent retries %v", st.MaxFailures,
		sum(t, p.agents, `sas_agent_retries_total{endpoint="charge_payment",reason="5xx"}`))
}

// TestSupervisorFailover: with two supervisors and expiries happening all
// the time, the leader is killed; the standby leads within LeaseTTL +
// Interval (1.2 s here, plus scheduling slack), and the history never
// counts one expiry twice.
func TestSupervisorFailover(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	p := &pipeline{stack: s}
	env := []string{"SAS_SUPERVISOR_BACKOFF_BASE=20ms", "SAS_SUPERVISOR_BACKOFF_MAX=50ms"}
	leader := p.startSupervisor(t, env...)
	testenv.Eventually(t, 10*time.Second, "the first supervisor to lead", func() bool {
		return leader.metric(t, "sas_supervisor_leader") == 1
	})
	standby := p.startSupervisor(t, env...)

	// Steps that expire over and over: a claimer that never replies.
	store := statestore.New(s.pool)
	ctx, stopChurn := context.WithCancel(context.Background())
	var churn sync.WaitGroup
	defer func() { stopChurn(); churn.Wait() }()
	// 20 steps that expire every 100 ms, and one that stays processing
	// for the whole test (for the age metric).
	for i := range 21 {
		id := messages.NewID()
		hash := sha256.Sum256([]byte(id))
		timeout := 100 * time.Millisecond
		if i == 20 {
			timeout = time.Hour
		}
		if _, err := store.InsertOrder(ctx, statestore.NewOrder{OrderID: id, Workflow: "test", Payload: []byte(`{"customer":"c"}`), PayloadHash: hash[:], Actor: "test",
			Steps: []statestore.NewStep{{Name: "s", Agent: "nobody", Timeout: timeout, MaxFailures: 1000}}}); err != nil {
			t.Fatal(err)
		}
	}
	churn.Go(func() {
		for ctx.Err() == nil {
			_, _ = store.ClaimPending(ctx, "ghost-scheduler", 100, "")
			time.Sleep(20 * time.Millisecond)
		}
	})
	testenv.Eventually(t, 30*time.Second, "the leader to sweep", func() bool {
		return leader.metric(t, "sas_supervisor_resets_total") >= 20
	})
	testenv.Eventually(t, 10*time.Second, "the age of the oldest processing step reported", func() bool {
		age := leader.metric(t, "sas_oldest_processing_step_age_seconds")
		return age > 0 && age < 60
	})
	if standby.metric(t, "sas_supervisor_leader") != 0 || standby.metric(t, "sas_supervisor_sweeps_total") != 0 {
		t.Fatal("the standby swept while the leader was alive")
	}

	leader.kill(t)
	killedAt := time.Now()
	testenv.Eventually(t, 10*time.Second, "the standby to take over", func() bool {
		return standby.metric(t, "sas_supervisor_leader") == 1
	})
	takeover := time.Since(killedAt)
	if takeover > 1200*time.Millisecond+time.Second {
		t.Fatalf("takeover took %v, bound is 1.2 s (lease TTL + interval) plus 1 s slack", takeover)
	}
	base := standby.metric(t, "sas_supervisor_resets_total")
	testenv.Eventually(t, 30*time.Second, "the new leader to sweep", func() bool {
		return standby.metric(t, "sas_supervisor_resets_total") >= base+20
	})
	stopChurn()
	churn.Wait()
	if n := s.count(t, `SELECT count(*) FROM (SELECT order_id, step, attempt FROM transitions
		WHERE from_state = 'processing' AND actor LIKE 'supervisor:%' GROUP BY 1, 2, 3 HAVING count(*) > 1) x`); n != 0 {
		t.Fatalf("%d expiries counted twice", n)
	}
	if n := s.count(t, `SELECT count(*) FROM steps WHERE failure_count <> (SELECT count(*) FROM transitions t
		WHERE t.order_id = steps.order_id AND t.step = steps.step AND t.from_state = 'processing' AND t.actor LIKE 'supervisor:%')`); n != 0 {
		t.Fatalf("%d steps whose failure_count disagrees with their history", n)
	}
	t.Logf("standby took over %v after the leader was killed", takeover.Round(time.Millisecond))
}

// TestRetentionDeletesOnlyEndedOldOrders runs the supervisor with a
// retention of two seconds while orders flow: every order it deletes had
// ended (completed or failed) at least that long before, no step in
// flight goes with it, and nothing else goes.
func TestRetentionDeletesOnlyEndedOldOrders(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	// The test's own record of what is deleted, written by triggers in
	// the deleting transaction.
	if _, err := s.pool.Exec(ctx, `
		CREATE TABLE purged_orders (order_id uuid, status text, created_at timestamptz, updated_at timestamptz,
		                            deleted_at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE purged_steps (order_id uuid, step integer, process_state text);
		CREATE FUNCTION log_purged_orders() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			INSERT INTO purged_orders (order_id, status, created_at, updated_at) SELECT order_id, status, created_at, updated_at FROM gone;
			RETURN NULL; END $$;
		CREATE FUNCTION log_purged_steps() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
			INSERT INTO purged_steps SELECT order_id, step, process_state FROM gone;
			RETURN NULL; END $$;
		CREATE TRIGGER log_purged_orders AFTER DELETE ON orders REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION log_purged_orders();
		CREATE TRIGGER log_purged_steps AFTER DELETE ON steps REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION log_purged_steps();`); err != nil {
		t.Fatal(err)
	}
	p := newPipeline(t, pipelineOpts{on: &s, supervisors: 1, agents: 2,
		faults:        `{"*":{"latency_min_ms":5,"latency_max_ms":40},"charge_payment":{"error_rate":0.1}}`,
		supervisorEnv: []string{"SAS_RETENTION=2s", "SAS_RETENTION_INTERVAL=200ms", "SAS_RETENTION_BATCH=25"}})
	failing := messages.NewID()
	p.setFaults(t, `{"*":{"latency_min_ms":5,"latency_max_ms":40},"charge_payment":{"fail_orders":["`+failing+`"]}}`)
	publish(t, amqpChannel(t), p.submit, messages.ContentType, failing, []byte(badinput.ValidSubmitJSON(failing)))

	var ids []string
	began := time.Now()
	for time.Since(began) < 8*time.Second {
		ids = append(ids, p.submitOrders(t, 20)...)
		if n := s.count(t, `SELECT count(*) FROM purged_orders`); n > 0 && len(ids) >= 200 {
			break
		}
	}
	ids = append(ids, failing)
	testenv.Eventually(t, 2*time.Minute, "every order to end and be deleted once past its retention", func() bool {
		return s.count(t, `SELECT count(*) FROM purged_orders WHERE order_id = ANY($1::uuid[])`, ids) == len(ids)
	})
	if n := s.count(t, `SELECT count(*) FROM purged_orders WHERE status NOT IN ('completed', 'failed')`); n != 0 {
		t.Errorf("%d orders deleted that had not ended", n)
	}
	if n := s.count(t, `SELECT count(*) FROM purged_orders WHERE updated_at > deleted_at - interval '2 seconds' OR created_at > deleted_at - interval '2 seconds'`); n != 0 {
		t.Errorf("%d orders deleted less than the retention after they ended", n)
	}
	if n := s.count(t, `SELECT count(*) FROM purged_steps WHERE process_state IN ('pending', 'processing')`); n != 0 {
		t.Errorf("%d steps in flight deleted", n)
	}
	if n := s.count(t, `SELECT count(*) FROM purged_orders WHERE order_id = $1 AND status = 'failed'`, failing); n != 1 {
		t.Errorf("the failed order was not deleted as failed")
	}
	if n := s.count(t, `SELECT count(DISTINCT order_id) FROM purged_orders`); n != s.count(t, `SELECT count(*) FROM purged_orders`) {
		t.Errorf("an order was deleted twice")
	}
	if left := s.count(t, `SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM transitions) + (SELECT count(*) FROM alerts)`); left != 0 {
		t.Errorf("%d rows of deleted orders left behind", left)
	}
	deleted := p.supervisors[0].metric(t, `sas_retention_deleted_total{table="orders"}`)
	if int(deleted) != s.count(t, `SELECT count(*) FROM purged_orders`) {
		t.Errorf("the metric counts %v orders deleted, the database %d", deleted, s.count(t, `SELECT count(*) FROM purged_orders`))
	}
	t.Logf("%d orders, all deleted after they ended; %v transitions deleted", len(ids),
		p.supervisors[0].metric(t, `sas_retention_deleted_total{table="transitions"}`))
}
