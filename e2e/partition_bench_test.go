package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sas/internal/partition"
)

// TestPartitionsThroughput (make bench-partitions): one, two and three
// partitions on this machine, each its own PostgreSQL server and a whole
// sas, given single-step orders through the routing exchange as fast as
// they are absorbed: SAS_PARTITION_BENCH_ORDERS (20,000) published at
// once, the time until every one has completed, and the machine's CPU
// (every process: the PostgreSQL servers, RabbitMQ, every sas process,
// the remote services and the publisher) per order over that time.
func TestPartitionsThroughput(t *testing.T) {
	if os.Getenv("SAS_PARTITION_BENCH") == "" {
		t.Skip("partitions' throughput: make bench-partitions")
	}
	orders := 20000
	if v, err := strconv.Atoi(os.Getenv("SAS_PARTITION_BENCH_ORDERS")); err == nil && v > 0 {
		orders = v
	}
	node := startRabbitNodes(t, "sasbp", "5780", 1, "", "rabbitmq_consistent_hash_exchange")
	var table []string
	for n := 1; n <= 3; n++ {
		t.Run(fmt.Sprintf("%d", n), func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "partitions.yaml")
			layout := fmt.Sprintf("exchange: sasbp%d.route\nbuckets: 256\npartitions:\n", n)
			for i := 1; i <= n; i++ {
				layout += fmt.Sprintf("  - {name: p%d, queue_prefix: sasbp%d.p%d., database_url_env: SAS_P%d_DATABASE_URL}\n", i, n, i, i)
			}
			if err := os.WriteFile(file, []byte(layout), 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := partition.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			_, pipes, _ := startPartitions(t, l, file, node.urls, 5600+100*n, fmt.Sprintf("bench%d", n))
			tool := env("SAS_AMQP_URL="+node.urls, "SAS_PARTITIONS_FILE="+file, fmt.Sprintf("SAS_QUEUE_PREFIX=sasbp%d.tool.", n))
			if out, errOut, code := sasctl(t, tool, "partitions", "setup"); code != 0 {
				t.Fatalf("partitions setup: exit %d\n%s%s", code, out, errOut)
			}
			before := machineCPU(t)
			start := time.Now()
			if out, errOut, code := sasctl(t, tool, "submit", "--count", fmt.Sprint(orders), "--workflow", "single", "--payload", "{}", "--concurrency", "256"); code != 0 {
				t.Fatalf("submit: exit %d\n%s%s", code, out, errOut)
			}
			deadline := time.Now().Add(5 * time.Minute)
			for {
				done := 0
				for _, pp := range pipes {
					done += pp.count(t, `SELECT count(*) FROM orders WHERE status = 'completed'`)
				}
				if done >= orders {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d completed after 5 minutes", done, orders)
				}
				time.Sleep(100 * time.Millisecond)
			}
			took := time.Since(start)
			busy := machineCPU(t) - before
			row := fmt.Sprintf("%d partition(s): %d orders in %.1f s, %.0f orders/s, %.2f ms CPU per order (machine)",
				n, orders, took.Seconds(), float64(orders)/took.Seconds(), busy.Seconds()*1000/float64(orders))
			t.Log(row)
			table = append(table, row)
		})
	}
	t.Logf("partitions on one machine:\n%s", strings.Join(table, "\n"))
}

// machineCPU is the CPU time every process on the machine has spent,
// from /proc/stat (user, nice, system, irq, softirq, steal).
func machineCPU(t *testing.T) time.Duration {
	t.Helper()
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
