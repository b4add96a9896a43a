// Command bench-dbos runs the work of sasctl bench on DBOS Transact, the
// closest durable-workflow peer, so that the two are measured on one
// machine in one sitting (make bench-dbos): orders of one or three steps,
// each step an HTTP call with an idempotency key to sas's own demo remote
// service (a separate process, as for sas), enqueued durably on a DBOS
// queue with the order id as workflow id, at a fixed rate or as fast as
// absorbed. It reports completed orders per second, latency (from the
// workflow's row written to its success, both in DBOS's tables) and the
// CPU per completed order of every process on the machine that took part:
// this one (DBOS and the load), the remote, and PostgreSQL.
//
// `bench-dbos table NAME=SAS.json,DBOS.json ...` prints the two side by
// side as a Markdown table. It is a module of its own, so that sas's
// go.mod does not carry DBOS.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"
)

type options struct {
	dbURL, remoteBin, remoteAddr, label, jsonOut string
	steps, inflight, latencyMS                   int
	rate                                         float64
	warmup, duration, drain, poll                time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "table" {
		if err := table(os.Stdout, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench-dbos table:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/sas_bench_dbos?sslmode=disable", "DBOS's system database (made if missing; its schema dbos is dropped first)")
	flag.StringVar(&o.remoteBin, "remote", "bin/remote", "sas's demo remote service binary")
	flag.StringVar(&o.remoteAddr, "remote-addr", "127.0.0.1:9405", "where the remote listens")
	flag.IntVar(&o.steps, "steps", 1, "steps per order: 1 (sas's single) or 3 (sas's order)")
	flag.Float64Var(&o.rate, "rate", 0, "orders enqueued per second; 0: as fast as absorbed (--inflight)")
	flag.IntVar(&o.inflight, "inflight", 2000, "with --rate 0: orders enqueued and not ended, at most")
	flag.IntVar(&o.latencyMS, "remote-latency-ms", 1, "the remote service's latency per call")
	flag.DurationVar(&o.warmup, "warmup", 10*time.Second, "load before the measured window")
	flag.DurationVar(&o.duration, "duration", 60*time.Second, "the measured window")
	flag.DurationVar(&o.drain, "drain", 30*time.Second, "after the window, how long to wait for its orders to end")
	flag.DurationVar(&o.poll, "queue-poll", 10*time.Millisecond, "the DBOS queue's base polling interval (WithQueueBasePollingInterval; DBOS's default is 1s)")
	flag.StringVar(&o.label, "label", "", "a name for this run in the report")
	flag.StringVar(&o.jsonOut, "json", "", "also write the report as JSON to this file")
	flag.Parse()
	if o.steps != 1 && o.steps != 3 || o.rate < 0 || o.inflight < 1 || o.duration <= 0 {
		fmt.Fprintln(os.Stderr, "bench-dbos: --steps is 1 or 3, --rate >= 0, --inflight >= 1, --duration > 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-dbos:", err)
		os.Exit(1)
	}
	rep.print(os.Stdout)
	if o.jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(o.jsonOut, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench-dbos:", err)
			os.Exit(1)
		}
	}
}

// report is what a run prints and writes as JSON, in sasctl bench's words.
type report struct {
	Label              string             `json:"label,omitempty"`
	System             string             `json:"system"`
	Steps              int                `json:"steps"`
	Mode               string             `json:"mode"`
	OfferedRate        float64            `json:"offered_rate,omitempty"`
	Inflight           int                `json:"inflight,omitempty"`
	WindowSeconds      float64            `json:"window_s"`
	CompletedPerSecond float64            `json:"completed_per_s"`
	Completed          int                `json:"completed"`
	Unended            int                `json:"unended"`
	Latency            latency            `json:"latency_ms"`
	CPUMSPerOrder      float64            `json:"cpu_ms_per_completed_order"`
	Processes          map[string]float64 `json:"cpu_ms_per_order_by_process"`
	MachineBusy        float64            `json:"machine_cpu_busy_percent"`
}

type latency struct {
	N                       int
	P50, P95, P99, Max, Avg float64
}

func run(ctx context.Context, o options) (*report, error) {
	remote, err := startRemote(ctx, o)
	if err != nil {
		return nil, err
	}
	defer remote.stop()

	if err := resetSchema(ctx, o.dbURL); err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dctx, err := dbos.NewContext(ctx, dbos.Config{AppName: "sas-bench", DatabaseURL: o.dbURL, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("dbos: %w", err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	actions := []string{"charge_payment"}
	if o.steps == 3 {
		actions = []string{"reserve_inventory", "charge_payment", "ship_order"}
	}
	// An order: each step one call to the remote service, its key the
	// order's id and the step's number, as sas's agents send it.
	order := func(wctx dbos.Context, orderID string) (string, error) {
		for i, action := range actions {
			if _, err := dbos.RunAsStep(wctx, func(ctx context.Context) (string, error) {
				return call(ctx, client, remote.url, action, orderID, i+1)
			}, dbos.WithStepName(action)); err != nil {
				return "", err
			}
		}
		return "completed", nil
	}
	dbos.RegisterWorkflow(dctx, order, dbos.WithWorkflowName("order"))
	queue, err := dbos.RegisterQueue(dctx, "orders", dbos.WithQueueBasePollingInterval(o.poll))
	if err != nil {
		return nil, fmt.Errorf("dbos queue: %w", err)
	}
	if err := dbos.Launch(dctx); err != nil {
		return nil, fmt.Errorf("dbos launch: %w", err)
	}
	defer dbos.Shutdown(dctx, 10*time.Second)
	pool, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	var published, failed atomic.Int64
	enqueue := func() {
		id := newID()
		if _, err := dbos.RunWorkflow(dctx, order, id, dbos.WithQueue(queue), dbos.WithWorkflowID(id)); err != nil {
			failed.Add(1)
			return
		}
		published.Add(1)
	}
	ended := func() int64 {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM dbos.workflow_status WHERE status IN ('SUCCESS', 'ERROR')`).Scan(&n)
		return n
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	load.Go(func() { generate(loadCtx, o, enqueue, &published, ended) })
	defer func() { stopLoad(); load.Wait() }()

	if err := sleep(ctx, o.warmup); err != nil {
		return nil, err
	}
	from, cpu0 := dbNow(ctx, pool), takeCPU(os.Getpid(), remote.pid())
	if err := sleep(ctx, o.duration); err != nil {
		return nil, err
	}
	to, cpu1 := dbNow(ctx, pool), takeCPU(os.Getpid(), remote.pid())
	stopLoad()
	load.Wait()
	deadline := time.Now().Add(o.drain)
	for ended() < published.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		_ = sleep(ctx, 200*time.Millisecond)
	}

	rep := &report{Label: o.label, System: "DBOS Transact v1.8.0", Steps: o.steps, Mode: "max", Inflight: o.inflight,
		WindowSeconds: to.Sub(from).Seconds()}
	if o.rate > 0 {
		rep.Mode, rep.OfferedRate, rep.Inflight = "rate", o.rate, 0
	}
	// Orders whose workflow row was written inside the window: how long
	// each took to succeed; and how many succeeded inside it.
	rows, err := pool.Query(ctx, `
SELECT (updated_at - created_at)::float8 FROM dbos.workflow_status
WHERE created_at >= $1 AND created_at < $2 AND status = 'SUCCESS'`, from.UnixMilli(), to.UnixMilli())
	if err != nil {
		return nil, err
	}
	var ms []float64
	for rows.Next() {
		var d float64
		if err := rows.Scan(&d); err != nil {
			return nil, err
		}
		ms = append(ms, d)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var placed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dbos.workflow_status WHERE created_at >= $1 AND created_at < $2`,
		from.UnixMilli(), to.UnixMilli()).Scan(&placed); err != nil {
		return nil, err
	}
	rep.Unended = placed - len(ms)
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS' AND updated_at >= $1 AND updated_at < $2`,
		from.UnixMilli(), to.UnixMilli()).Scan(&rep.Completed); err != nil {
		return nil, err
	}
	rep.CompletedPerSecond = float64(rep.Completed) / rep.WindowSeconds
	rep.Latency = percentiles(ms)
	rep.Processes = map[string]float64{}
	var total time.Duration
	for name, d := range cpu1.sub(cpu0) {
		total += d
		rep.Processes[name] = perOrder(d, rep.Completed)
	}
	rep.CPUMSPerOrder = perOrder(total, rep.Completed)
	rep.MachineBusy = cpu1.machine.busySince(cpu0.machine)
	if f := failed.Load(); f > 0 {
		return rep, fmt.Errorf("%d enqueues failed", f)
	}
	return rep, nil
}

// generate enqueues orders at o.rate a second, or keeps o.inflight
// enqueued and not ended.
func generate(ctx context.Context, o options, enqueue func(), published *atomic.Int64, ended func() int64) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if o.rate > 0 {
		interval := time.Duration(float64(time.Second) / o.rate)
		next := time.Now()
		for ctx.Err() == nil {
			wg.Go(enqueue)
			next = next.Add(interval)
			if d := time.Until(next); d > 0 && sleep(ctx, d) != nil {
				return
			}
		}
		return
	}
	sem := make(chan struct{}, 64)
	for ctx.Err() == nil {
		if room := int64(o.inflight) - (published.Load() - ended()); room > 0 {
			for range min(room, 500) {
				sem <- struct{}{}
				wg.Go(func() { defer func() { <-sem }(); enqueue() })
			}
		}
		if sleep(ctx, 20*time.Millisecond) != nil {
			return
		}
	}
}

// call is one step: POST /v1/{action} to the remote service with the
// step's idempotency key, as a sas agent sends it.
func call(ctx context.Context, client *http.Client, base, action, orderID string, step int) (string, error) {
	body, _ := json.Marshal(map[string]any{"order_id": orderID, "step": step, "action": action, "payload": map[string]any{"amount": 1999}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/"+action, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", orderID+":"+strconv.Itoa(step))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%s: %s %s", action, resp.Status, b)
	}
	return string(b), nil
}

// resetSchema drops DBOS's schema of an earlier run, so that no run's
// rows weigh on another's.
func resetSchema(ctx context.Context, url string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS dbos CASCADE`); err != nil && !strings.Contains(err.Error(), "does not exist") {
		return fmt.Errorf("drop the last run's schema: %w", err)
	}
	return nil
}

func dbNow(ctx context.Context, pool *pgxpool.Pool) time.Time {
	var t time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&t); err != nil {
		return time.Now()
	}
	return t
}

type remoteProc struct {
	cmd *exec.Cmd
	url string
}

func (r *remoteProc) pid() int { return r.cmd.Process.Pid }

func (r *remoteProc) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	_ = r.cmd.Wait()
}

// startRemote runs sas's demo remote service with every call taking
// o.latencyMS, and waits until it is ready.
func startRemote(ctx context.Context, o options) (*remoteProc, error) {
	faults := fmt.Sprintf(`{"*":{"latency_min_ms":%d,"latency_max_ms":%d}}`, o.latencyMS, o.latencyMS)
	cmd := exec.Command(o.remoteBin)
	cmd.Env = append(os.Environ(), "SAS_REMOTE_ADDR="+o.remoteAddr, "SAS_REMOTE_FAULTS="+faults, "SAS_LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the remote service (make build first): %w", err)
	}
	r := &remoteProc{cmd: cmd, url: "http://" + o.remoteAddr}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := http.Get(r.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.stop()
			return nil, errors.New("the remote service did not become ready")
		}
		_ = sleep(ctx, 50*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func percentiles(ms []float64) latency {
	if len(ms) == 0 {
		return latency{}
	}
	slices.Sort(ms)
	at := func(p float64) float64 { return ms[min(len(ms)-1, int(p*float64(len(ms))))] }
	var sum float64
	for _, v := range ms {
		sum += v
	}
	return latency{N: len(ms), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: ms[len(ms)-1], Avg: sum / float64(len(ms))}
}

func perOrder(d time.Duration, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / 1000 / float64(n)
}

func (r *report) print(w io.Writer) {
	mode := fmt.Sprintf("as fast as absorbed (at most %d in flight)", r.Inflight)
	if r.Mode == "rate" {
		mode = fmt.Sprintf("%.0f orders/s offered", r.OfferedRate)
	}
	fmt.Fprintf(w, "\nBENCH      %s, %d-step orders, %s, window %.0fs\n", r.System, r.Steps, mode, r.WindowSeconds)
	fmt.Fprintf(w, "completed  %.0f orders/s (%d in the window; %d placed in it not ended)\n", r.CompletedPerSecond, r.Completed, r.Unended)
	fmt.Fprintf(w, "latency    p50 %.1f  p95 %.1f  p99 %.1f  max %.1f ms (n %d)\n", r.Latency.P50, r.Latency.P95, r.Latency.P99, r.Latency.Max, r.Latency.N)
	names := make([]string, 0, len(r.Processes))
	for n := range r.Processes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "cpu        %-32s %.2f ms per order\n", n, r.Processes[n])
	}
	fmt.Fprintf(w, "cpu        %-32s %.2f ms per order; machine %.0f%% busy\n", "all of the above", r.CPUMSPerOrder, r.MachineBusy)
}

// CPU readings from /proc, as sasctl bench takes them.

type cpuSnapshot struct {
	procs   map[string]map[int]time.Duration
	machine machineCPU
}

func takeCPU(self, remote int) cpuSnapshot {
	s := cpuSnapshot{procs: map[string]map[int]time.Duration{
		"bench-dbos (DBOS and the load)": {self: procCPU(self)},
		"remote":                         {remote: procCPU(remote)},
		"postgres (all processes)":       {},
	}}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile(filepath.Join(d, "comm")); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			s.procs["postgres (all processes)"][pid] = procCPU(pid)
		}
	}
	s.machine = readMachine()
	return s
}

// sub is each process's CPU between then and s (a process started in
// between counts from zero).
func (s cpuSnapshot) sub(then cpuSnapshot) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pids := range s.procs {
		for pid, d := range pids {
			out[name] += d - then.procs[name][pid]
		}
	}
	return out
}

func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+k) * time.Second / 100
}

type machineCPU struct{ busy, total int64 }

func readMachine() machineCPU {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return machineCPU{}
	}
	var m machineCPU
	for i, v := range strings.Fields(sc.Text())[1:] {
		if i >= 8 {
			break
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		m.total += n
		if i != 3 && i != 4 && i != 7 { // idle, iowait, steal
			m.busy += n
		}
	}
	return m
}

func (m machineCPU) busySince(then machineCPU) float64 {
	if m.total <= then.total {
		return 0
	}
	return 100 * float64(m.busy-then.busy) / float64(m.total-then.total)
}
