package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// TestStepsABrokerLostAreSentAgain: on classic queues step requests and
// replies are transient (SAS_STEP_MESSAGES), and a broker restart loses
// those in flight. With the agents stopped, a scheduler sends the first
// step of each order; then what a restart does is done to them: the
// requests are gone from their queue and the scheduler's connection is
// closed. When it has reconnected, the scheduler puts the steps it had
// sent back to pending and sends them again: with an agent started, every
// order completes long before the minute their steps' complete_by would
// otherwise hold them (there is no supervisor).
func TestStepsABrokerLostAreSentAgain(t *testing.T) {
	t.Parallel()
	rabbitmqctl := tool(t, "rabbitmqctl")
	const n = 20
	st := newStackOf(t, workflow.Builtin().Agents(), broker.QueueClassic)
	topo := st.topo
	me := topo.Prefix + "scheduler"
	p := newPipeline(t, pipelineOpts{on: &st, withoutAgents: true, schedulerEnv: []string{"SAS_INSTANCE_ID=" + me}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scheduler:\n%s", p.schedulers[0].tail())
		}
	})
	ids := p.submitOrders(t, n)
	requests := topo.Queue(messages.RequestsQueue("inventory"))

	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		q, err := ch.QueueDeclarePassive(requests, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	testenv.Eventually(t, 30*time.Second, "every order's first request queued", func() bool {
		if queued() == n {
			return true
		}
		t.Logf("%d queued; %d processing", queued(), p.count(t, `SELECT count(*) FROM steps WHERE process_state = 'processing'`))
		return false
	})
	d, ok, err := ch.Get(requests, false)
	if err != nil || !ok {
		t.Fatalf("get a request: %v %v", ok, err)
	}
	if d.DeliveryMode != amqp.Transient {
		t.Fatalf("a step request's delivery mode is %d, want transient (%d)", d.DeliveryMode, amqp.Transient)
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}

	// What a broker restart does to them.
	if _, err := ch.QueuePurge(requests, false); err != nil {
		t.Fatal(err)
	}
	closeConnections(t, rabbitmqctl, me)
	lost := time.Now()

	p.startAgent(t)
	p.waitTerminal(t, ids, 30*time.Second)
	if got := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); got != n {
		t.Fatalf("%d of %d orders completed", got, n)
	}
	if got := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND actor = $2
		AND from_state = 'processing' AND to_state = 'pending' AND reason LIKE 'released: broker connection lost%'`, ids, me); got != n {
		t.Fatalf("%d steps put back to pending by the scheduler, want %d", got, n)
	}
	if got := p.schedulers[0].metric(t, "sas_scheduler_steps_resent_total"); got != n {
		t.Fatalf("sas_scheduler_steps_resent_total %v, want %d", got, n)
	}
	t.Logf("%d orders whose requests were lost completed %v after the loss", n, time.Since(lost).Round(10*time.Millisecond))
}

// closeConnections closes, as a broker going down would, every broker
// connection whose name is name.
func closeConnections(t *testing.T, rabbitmqctl, name string) {
	t.Helper()
	out, err := exec.Command(rabbitmqctl, "-q", "list_connections", "pid", "client_properties", "--no-table-headers").CombinedOutput()
	if err != nil {
		t.Fatalf("list_connections: %v\n%s", err, out)
	}
	pid := regexp.MustCompile(`^<[^>]+>`)
	closed := 0
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.Contains(l, `"connection_name","`+name+`"`) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, rabbitmqctl, "-q", "close_connection", pid.FindString(l), "a broker restart, as the test plays it").CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("close_connection: %v\n%s", err, out)
		}
		closed++
	}
	if closed == 0 {
		t.Fatalf("no broker connection named %s:\n%s", name, out)
	}
}
