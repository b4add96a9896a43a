package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"sas/client"
	"sas/internal/partition"
)

// TestAPartitionsOutageSparesTheOthers (make bench-partition-outage):
// three partitions, each its own PostgreSQL server and a whole sas, under
// a steady load through the routing exchange; one partition's server is
// stopped for 30 s and started again. The other partitions' orders keep
// ending at the rate offered, their latency's p99 within 1.2x of before;
// the stopped partition's orders wait and then end; every order ends once
// in its own store, the saga and invariant checks holding in each.
func TestAPartitionsOutageSparesTheOthers(t *testing.T) {
	if os.Getenv("SAS_PARTITION_OUTAGE") == "" {
		t.Skip("a partition's outage under load: make bench-partition-outage")
	}
	const rate = 30 // orders a second, over the three partitions
	node := startRabbitNodes(t, "sasout", "5760", 1, "", "rabbitmq_consistent_hash_exchange")
	dir := t.TempDir()
	file := filepath.Join(dir, "partitions.yaml")
	layout := "exchange: sasout.route\nbuckets: 256\npartitions:\n"
	for i := 1; i <= 3; i++ {
		layout += fmt.Sprintf("  - {name: p%d, queue_prefix: sasout.p%d., database_url_env: SAS_P%d_DATABASE_URL}\n", i, i, i)
	}
	if err := os.WriteFile(file, []byte(layout), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := partition.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	_, pipes, servers := startPartitions(t, l, file, node.urls, 5570, "outage")
	if out, errOut, code := sasctl(t, env("SAS_AMQP_URL="+node.urls, "SAS_PARTITIONS_FILE="+file), "partitions", "setup"); code != 0 {
		t.Fatalf("partitions setup: exit %d\n%s%s", code, out, errOut)
	}
	cl, err := client.Connect(t.Context(), client.Config{URL: node.urls, QueuePrefix: "sasout.client.", SubmitExchange: l.Exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	// The load: rate orders a second through the routing exchange, each
	// noted with the phase it was submitted in.
	type sent struct {
		id    string
		phase int // 0 before, 1 while p2 is down, 2 after
	}
	var mu sync.Mutex
	var all []sent
	phase := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id, err := cl.Submit(t.Context(), client.Order{Workflow: "single", Payload: map[string]any{}})
			if err != nil {
				t.Errorf("submit: %v", err)
				return
			}
			mu.Lock()
			all = append(all, sent{id, phase})
			mu.Unlock()
		}
	})
	setPhase := func(p int) {
		mu.Lock()
		phase = p
		mu.Unlock()
	}
	// Each phase lasts a fixed time: the load's windows are the measure.
	script := filepath.Join("..", "scripts", "pg-standby.sh")
	time.Sleep(30 * time.Second)
	if out, err := exec.Command(script, "crash", servers[1].dir, servers[1].base).CombinedOutput(); err != nil {
		t.Fatalf("stop partition p2's server: %v\n%s", err, out)
	}
	setPhase(1)
	time.Sleep(30 * time.Second)
	if out, err := exec.Command(script, "restart", servers[1].dir, servers[1].base).CombinedOutput(); err != nil {
		t.Fatalf("start partition p2's server again: %v\n%s", err, out)
	}
	setPhase(2)
	time.Sleep(15 * time.Second)
	close(stop)
	wg.Wait()

	// Every order ends once, in its own store.
	mine := make([][]sent, len(pipes))
	for _, s := range all {
		_, p := l.Of(s.id)
		i := slices.IndexFunc(l.Partitions, func(q partition.Partition) bool { return q == p })
		mine[i] = append(mine[i], s)
	}
	ids := func(ss []sent, ph ...int) []string {
		var out []string
		for _, s := range ss {
			if len(ph) == 0 || slices.Contains(ph, s.phase) {
				out = append(out, s.id)
			}
		}
		return out
	}
	for i, pp := range pipes {
		its := ids(mine[i])
		pp.waitTerminal(t, its, 3*time.Minute)
		if n := pp.count(t, `SELECT count(*) FROM orders`); n != len(its) {
			t.Fatalf("partition %s holds %d orders, want its own %d", l.Partitions[i].Name, n, len(its))
		}
		if completed, failed := pp.checkSaga(t, its); completed+failed != len(its) {
			t.Fatalf("partition %s: %d completed and %d failed of %d", l.Partitions[i].Name, completed, failed, len(its))
		}
		if r := pp.checkInvariants(t, its); !r.OK() {
			t.Fatalf("partition %s: invariants: %v", l.Partitions[i].Name, r.Violations)
		}
	}
	// The others' latency (written to ended) and pace, before and while
	// p2 was down.
	p99 := func(pp *pipeline, ids []string) (time.Duration, int) {
		var d float64
		var n int
		if err := pp.pool.QueryRow(t.Context(), `SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)), 0), count(*)
			FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids).Scan(&d, &n); err != nil {
			t.Fatal(err)
		}
		return time.Duration(d * float64(time.Second)), n
	}
	for _, i := range []int{0, 2} {
		before, nb := p99(pipes[i], ids(mine[i], 0))
		during, nd := p99(pipes[i], ids(mine[i], 1))
		t.Logf("partition %s: p99 %v over %d orders before, %v over %d while p2 was down (%.2fx)", l.Partitions[i].Name,
			before.Round(time.Millisecond), nb, during.Round(time.Millisecond), nd, float64(during)/float64(before))
		if during > before*12/10+5*time.Millisecond {
			t.Errorf("partition %s: p99 %v while p2 was down, over 1.2x its %v before", l.Partitions[i].Name, during, before)
		}
		if float64(nd) < 0.8*float64(nb) {
			t.Errorf("partition %s: %d orders completed while p2 was down, %d before", l.Partitions[i].Name, nd, nb)
		}
	}
	down, _ := p99(pipes[1], ids(mine[1], 1))
	t.Logf("partition p2: %d orders submitted while its server was down, all ended once it was back (p99 %v)", len(ids(mine[1], 1)), down.Round(time.Millisecond))
}
