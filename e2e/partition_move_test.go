package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/client"
	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/partition"
	"sas/internal/scheduler"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// TestABucketMovesToANewPartitionUnderLoad: three partitions and a
// fourth added to the layout (owning no bucket), each a state store and a
// whole sas, orders published through the routing exchange all along;
// sasctl partitions move moves a bucket of p1 and one of p3 to p4 while
// they flow, and every order of those buckets is submitted again during
// and after the moves, as a client retrying would. Every order is
// written in exactly one store and ends there once (none lost, none
// written twice), no service call is applied twice, the moved buckets'
// new orders are p4's and their old ones stay where they were (sasctl
// finds both), and partitions moves and show say where each bucket is.
func TestABucketMovesToANewPartitionUnderLoad(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "partitions.yaml")
	layout := fmt.Sprintf("exchange: %sroute\nbuckets: 16\npartitions:\n", prefix)
	for i := 1; i <= 4; i++ {
		layout += fmt.Sprintf("  - {name: p%d, queue_prefix: %sp%d., database_url_env: SAS_P%d_DATABASE_URL", i, prefix, i, i)
		if i == 4 {
			layout += ", added: true"
		}
		layout += "}\n"
	}
	if err := os.WriteFile(file, []byte(layout), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := partition.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	tool := env("SAS_AMQP_URL="+testenv.AMQPURL(), "SAS_PARTITIONS_FILE="+file, "SAS_QUEUE_PREFIX="+prefix+"tool.")
	var pipes []*pipeline
	for _, p := range l.Partitions {
		dbURL, pool := testenv.Database(t)
		topo := scheduler.Topology(p.QueuePrefix, 10, broker.QueueClassic, workflow.Builtin().Agents())
		topo.Inputs = append(topo.Inputs, submitter.Input)
		testenv.Broker(t, topo)
		st := stack{dbURL: dbURL, pool: pool, topo: topo, submit: topo.Queue(submitter.Input), dlq: topo.DeadLetterQueue(submitter.Input),
			env: env("SAS_DATABASE_URL="+dbURL, "SAS_AMQP_URL="+testenv.AMQPURL(), "SAS_QUEUE_PREFIX="+p.QueuePrefix, "SAS_QUEUE_TYPE=classic",
				"SAS_PARTITIONS_FILE="+file, "SAS_PARTITION="+p.Name)}
		// Each call takes about two seconds: the moved buckets' orders
		// are running in their old partition as they move (about six of
		// a bucket at a time).
		pipes = append(pipes, newPipeline(t, pipelineOpts{on: &st, faults: `{"*":{"latency_min_ms":1500,"latency_max_ms":2500}}`}))
		tool = append(tool, p.DatabaseURLEnv+"="+dbURL)
	}
	t.Cleanup(func() {
		conn, err := amqp.Dial(testenv.AMQPURL())
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for b := range l.Buckets {
			_ = ch.ExchangeDelete(l.BucketExchange(b), false, false)
		}
		_ = ch.ExchangeDelete(l.Exchange, false, false)
	})
	out, errOut, code := sasctl(t, tool, "partitions", "setup")
	if code != 0 || !strings.Contains(out, "p4: 0 buckets") {
		t.Fatalf("partitions setup: exit %d\n%s%s", code, out, errOut)
	}

	cl, err := client.Connect(t.Context(), client.Config{URL: testenv.AMQPURL(), QueuePrefix: prefix + "client.", SubmitExchange: l.Exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const fromP1, fromP3 = 0, 15
	moving := func(id string) bool { b := l.BucketOf(id); return b == fromP1 || b == fromP3 }
	payload := map[string]any{}
	var mu sync.Mutex
	var sent []string
	sentOf := func(keep func(string) bool) []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, id := range sent {
			if keep(id) {
				out = append(out, id)
			}
		}
		return out
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The load: new orders, 50 a second.
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id, err := cl.Submit(t.Context(), client.Order{Workflow: "single", Payload: payload})
			if err != nil {
				t.Errorf("submit: %v", err)
				return
			}
			mu.Lock()
			sent = append(sent, id)
			mu.Unlock()
		}
	})
	// The retries: every order of the moving buckets submitted again,
	// over and over (every 50 ms), while they move.
	retried := 0
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, id := range sentOf(moving) {
				if _, err := cl.Submit(t.Context(), client.Order{ID: id, Workflow: "single", Payload: payload}); err != nil {
					t.Errorf("submit again: %v", err)
					return
				}
				retried++
			}
		}
	})
	testenv.Eventually(t, time.Minute, "orders of both buckets before the moves", func() bool {
		return len(sentOf(func(id string) bool { return l.BucketOf(id) == fromP1 })) >= 10 &&
			len(sentOf(func(id string) bool { return l.BucketOf(id) == fromP3 })) >= 10
	})
	// The first move is killed once its bucket is fenced in p1: the
	// bucket's submits wait (p1 passes them on, p4 holds them) until the
	// move is run again, which resumes it.
	_, _, code = sasctl(t, append(slices.Clone(tool), "SAS_FAILPOINTS=move-after-fence"), "partitions", "move", fmt.Sprint(fromP1), "to", "p4", "--as", "tester")
	if code == 0 {
		t.Fatal("the move with its failpoint was not killed")
	}
	out, errOut, code = sasctl(t, tool, "partitions", "moves")
	if code != 0 || !strings.Contains(out, " copying ") {
		t.Fatalf("partitions moves after the kill: exit %d\n%s%s", code, out, errOut)
	}
	for _, b := range []int{fromP1, fromP3} {
		out, errOut, code := sasctl(t, tool, "partitions", "move", fmt.Sprint(b), "to", "p4", "--as", "tester")
		if code != 0 || !strings.Contains(out, fmt.Sprintf("bucket %d is partition p4's", b)) {
			t.Fatalf("partitions move %d to p4: exit %d\n%s%s", b, code, out, errOut)
		}
		// It waited for the bucket's orders running in the old partition
		// (the move not killed: the killed one's may all have ended
		// while it was down, no new one written there since its fence).
		if b == fromP3 && !regexp.MustCompile(`draining, \d+ ids copied, [1-9]\d* of its orders running`).MatchString(out) {
			t.Fatalf("partitions move %d to p4 did not drain running orders:\n%s", b, out)
		}
		t.Logf("move of bucket %d:\n%s", b, out)
	}
	movedAt := len(sentOf(func(string) bool { return true }))
	testenv.Eventually(t, time.Minute, "new orders of both buckets after the moves", func() bool {
		mu.Lock()
		after := sent[movedAt:]
		mu.Unlock()
		n1, n3 := 0, 0
		for _, id := range after {
			switch l.BucketOf(id) {
			case fromP1:
				n1++
			case fromP3:
				n3++
			}
		}
		return n1 >= 10 && n3 >= 10
	})
	close(stop)
	wg.Wait()
	// Once more after the moves, every order of the moved buckets.
	for _, id := range sentOf(moving) {
		if _, err := cl.Submit(t.Context(), client.Order{ID: id, Workflow: "single", Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	all := sentOf(func(string) bool { return true })
	t.Logf("%d orders, %d of the moved buckets submitted again during the moves", len(all), retried)

	// Every order in exactly one store, and ended there once.
	testenv.Eventually(t, 2*time.Minute, "every order written", func() bool {
		n := 0
		for _, pp := range pipes {
			n += pp.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, all)
		}
		return n >= len(all)
	})
	held := make([][]string, len(pipes))
	where := map[string]int{}
	for i, pp := range pipes {
		rows, err := pp.pool.Query(t.Context(), `SELECT order_id::text FROM orders`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			if j, twice := where[id]; twice {
				t.Errorf("order %s written in %s and in %s", id, l.Partitions[j].Name, l.Partitions[i].Name)
			}
			where[id] = i
			held[i] = append(held[i], id)
		}
		rows.Close()
	}
	if len(where) != len(all) {
		t.Fatalf("the stores hold %d orders, %d were submitted", len(where), len(all))
	}
	for _, id := range held[3] {
		if !moving(id) {
			t.Fatalf("order %s of bucket %d is in p4, which owns only buckets %d and %d", id, l.BucketOf(id), fromP1, fromP3)
		}
	}
	if len(held[3]) < 20 {
		t.Fatalf("p4 holds %d orders, want the moved buckets' new ones (20 at least)", len(held[3]))
	}
	for i, pp := range pipes {
		pp.waitTerminal(t, held[i], 2*time.Minute)
		if completed, failed := pp.checkSaga(t, held[i]); completed != len(held[i]) || failed != 0 {
			t.Fatalf("partition %s: %d completed and %d failed of %d", l.Partitions[i].Name, completed, failed, len(held[i]))
		}
		if r := pp.checkInvariants(t, held[i]); !r.OK() {
			t.Fatalf("partition %s: invariants: %v", l.Partitions[i].Name, r.Violations)
		}
	}

	// sasctl finds a moved bucket's old order where it was written and
	// a new one in p4, and says where the buckets are.
	var old string
	for _, id := range held[0] {
		if l.BucketOf(id) == fromP1 {
			old = id
			break
		}
	}
	for _, id := range []string{old, held[3][0]} {
		if out, errOut, code := sasctl(t, tool, "orders", "show", id); code != 0 || !strings.Contains(out, "completed") {
			t.Fatalf("orders show %s: exit %d\n%s%s", id, code, out, errOut)
		}
	}
	out, errOut, code = sasctl(t, tool, "partitions", "moves")
	if code != 0 || strings.Count(out, " done ") != 2 || !strings.Contains(out, "sasctl:tester") {
		t.Fatalf("partitions moves: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = sasctl(t, tool, "partitions", "show")
	if code != 0 || !regexp.MustCompile(`p4 .* 2 +0, 15\n`).MatchString(out) {
		t.Fatalf("partitions show: exit %d\n%s%s", code, out, errOut)
	}
	// Moving it again where it is, or to no partition, is refused.
	if _, errOut, code := sasctl(t, tool, "partitions", "move", "0", "to", "p4"); code == 0 || !strings.Contains(errOut, "already") {
		t.Fatalf("a move to its owner: exit %d %s", code, errOut)
	}
	if _, errOut, code := sasctl(t, tool, "partitions", "move", "16", "to", "p2"); code == 0 || !strings.Contains(errOut, "bucket 16") {
		t.Fatalf("a bucket past the last: exit %d %s", code, errOut)
	}
}
