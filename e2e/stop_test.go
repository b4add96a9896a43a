package e2e

import (
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

// TestAStoppedSchedulerTellsTheEndsItHeld, with real binaries: a
// scheduler stopped (SIGTERM) while a reply that ended an order is in
// hand, its end held for this scheduler to publish, publishes that end
// before it exits, and leaves nothing held in the outbox for another
// scheduler's relay to wait out. (The failpoint stops the scheduler at
// the first such reply; orders go one at a time until one is held, as
// an order's end is held only when the outbox is empty.)
func TestAStoppedSchedulerTellsTheEndsItHeld(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{schedulers: 1, agents: 1, schedulerEnv: []string{"SAS_FAILPOINTS=scheduler-stop-before-telling-end"}})
	ch := amqpChannel(t)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		err = ch.QueueBind(q.Name, messages.StatusCompleted, p.topo.StatusExchange(), false, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	sch := p.schedulers[0]
	var ids []string
	testenv.Eventually(t, time.Minute, "the scheduler to stop at its failpoint", func() bool {
		if sch.exited() {
			return true
		}
		if len(ids) == 0 || p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1::uuid AND status = 'completed'`, ids[len(ids)-1]) == 1 {
			ids = append(ids, p.submitOrders(t, 1, "--workflow", "single")...)
		}
		return false
	})
	if sch.err != nil {
		t.Fatalf("the scheduler did not stop cleanly: %v\n%s", sch.err, sch.tail())
	}
	// The order submitted as the scheduler stopped, if any, waits for
	// the next one; every order that ended had its end published by the
	// time the scheduler exited, the held one too: nobody else is left to
	// publish it.
	var ended []string
	if err := p.pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(order_id::text), '{}') FROM orders
		WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if len(ended) == 0 {
		t.Fatalf("no order of %d ended before the scheduler stopped", len(ids))
	}
	told := map[string]bool{}
	for _, d := range drain(t, ch, q.Name, len(ended), 10*time.Second) {
		ev, err := messages.DecodeStatusEvent(d.Body)
		if err != nil || ev.Status != messages.StatusCompleted {
			t.Fatalf("event on the completed binding: %s %v", d.Body, err)
		}
		told[ev.OrderID] = true
	}
	for _, id := range ended {
		if !told[id] {
			t.Errorf("order %s's end was not published", id)
		}
	}
	if n := p.count(t, `SELECT count(*) FROM outbox WHERE held_until IS NOT NULL`); n != 0 {
		t.Fatalf("%d held messages left in the outbox after the scheduler stopped", n)
	}
}
