package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.yaml.in/yaml/v3"

	"sas/internal/broker"
	"sas/internal/harness/localstack"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/statestore"
	"sas/internal/statestore/lab"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// Main runs the benchmark command (sasctl bench): every service locally, offering orders to the submit queue at a
// fixed rate or as fast as the system takes them, and reports what it
// measured over a window after a warm-up: throughput, latency from the
// state store's timestamps with a per-stage breakdown, CPU and peak memory
// per process, and queue depths over time.
func Main(ctx context.Context, a *Tool, args []string) error {
	fs := a.flags()
	var o benchOptions
	fs.StringVar(&o.wf, "workflow", workflow.DefaultName, "workflow of the orders (single: one step; order: three; graphs: fanout, five 200 ms branches then a join; foreach, 100 items of 50 ms, 20 at once)")
	fs.Float64Var(&o.rate, "rate", 0, "orders offered per second; 0 offers as fast as the system absorbs them (see --inflight)")
	fs.IntVar(&o.inflight, "inflight", 2000, "with --rate 0: orders published and not yet ended, at most")
	fs.DurationVar(&o.warmup, "warmup", 10*time.Second, "load before the measured window")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "the measured window")
	fs.DurationVar(&o.drain, "drain", 60*time.Second, "after the window, how long to wait for its orders to end")
	fs.IntVar(&o.schedulers, "schedulers", 2, "scheduler replicas")
	fs.IntVar(&o.agents, "agents", 2, "agent replicas")
	fs.IntVar(&o.latency, "remote-latency-ms", 1, "the remote service's latency per call")
	fs.StringVar(&o.binDir, "bin", "", "directory of the sas binaries (default: sasctl's own)")
	fs.IntVar(&o.portBase, "port-base", 9300, "services listen on 127.0.0.1 from this port up (as sasctl dev)")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file")
	fs.StringVar(&o.label, "label", "", "a name for this run in the report")
	fs.BoolVar(&o.purge, "purge", false, "empty the submit, replies and agent queues first (a previous run's leftovers); without it, leftovers stop the run")
	fs.IntVar(&o.pprofOffset, "pprof-offset", 0, "when not 0, every service serves Go's profiler on its port plus this offset (e.g. 1000: the submitter's on port-base+1001)")
	fs.DurationVar(&o.idle, "idle", 0, "before the load, measure every process with none for this long: CPU and wake-ups per second of a system at rest")
	fs.IntVar(&o.churn, "churn", 0, "warm up until this many orders have ended as well (claimed, answered, ended, never vacuumed): the store's history of dead rows behind the measured window")
	fs.IntVar(&o.statements, "statements", 0, "report the N statements that took the database the most time in the window, per completed order (the server must load pg_stat_statements: make bench-statements starts one that does; its counts for the database are reset when the window opens)")
	fs.IntVar(&o.prefill, "prefill", 0, "before the run, fill the store with this many orders as they look once run (most completed, their steps and history), vacuumed and analyzed: a steady state of a store in use")
	fs.BoolVar(&o.fresh, "fresh", true, "run on a new schema of the database, migrated by the run's own sasctl and dropped after, so that no earlier run's rows or dead tuples weigh on it (--fresh=false: the database as it is)")
	against := fs.String("against", "", "A/B: the directory of another build's binaries (A); runs A and this run's binaries (B, --bin) alternately, --rounds times each, and prints both with the ratio B/A of every figure")
	rounds := fs.Int("rounds", 2, "with --against: runs of each side")
	backlog := fs.Int("backlog", 0, "instead of a load: queue this many orders with the schedulers and agents stopped, then start them, and report the time to drain and every process's peak memory")
	var env, envB multiFlag
	fs.Var(&env, "env", "NAME=VALUE added to every service's environment (repeatable), e.g. SAS_SCHEDULER_BATCH=200 or GOGC=400")
	fs.Var(&envB, "env-b", "with --against: NAME=VALUE added to B's services' environment only (repeatable), e.g. a workflows file A cannot read")
	fs.StringVar(&o.via, "via", "amqp", "where orders go in: amqp (the submit queue), routed (a partitions layout's consistent-hash exchange, the order id as routing key, to the one partition this run is: the broker needs the rabbitmq_consistent_hash_exchange plugin) or http (the API service, POST /api/v1/orders, its per-token rate limit lifted)")
	fs.BoolVar(&o.await, "await", false, "with --via http: await every order over HTTP too, and report what that adds to its end (the await's return against the order's end in the store)")
	fs.StringVar(&o.namespace, "namespace", "", "with --via http: submit the load's orders to this namespace (added if it is not there); the report's latencies are its orders'")
	fs.Float64Var(&o.neighbourRate, "neighbour-rate", 0, "with --namespace: also offer this many orders a second to the namespace \"neighbour\", held to --neighbour-quota: a noisy tenant beside the measured one")
	fs.Float64Var(&o.neighbourQuota, "neighbour-quota", 0, "with --neighbour-rate: the neighbour's submit rate quota, orders a second (its in-flight quota is 20 times it)")
	fs.Float64Var(&o.neighbourKindRate, "neighbour-kind-rate", 0, "with --neighbour-rate: the neighbour's own rate limit on every agent kind (sasctl limits set KIND --namespace neighbour), claims a second: its orders past it wait in the store")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	o.env, o.envB = env, envB
	if len(envB) > 0 && *against == "" {
		fmt.Fprintln(a.stderr, "sasctl bench: --env-b needs --against")
		return ErrUsage
	}
	if o.via != "amqp" && o.via != "http" && o.via != "routed" || o.await && o.via != "http" {
		fmt.Fprintln(a.stderr, "sasctl bench: --via is amqp, routed or http; --await needs --via http")
		return ErrUsage
	}
	if (o.namespace != "" && o.via != "http") || (o.neighbourRate != 0 && (o.namespace == "" || o.neighbourQuota <= 0 || o.neighbourRate < 0)) ||
		o.namespace == "neighbour" || o.neighbourKindRate < 0 || (o.neighbourKindRate > 0 && o.neighbourRate <= 0) {
		fmt.Fprintln(a.stderr, "sasctl bench: --namespace needs --via http (and is not \"neighbour\"); --neighbour-rate needs --namespace and --neighbour-quota > 0; --neighbour-kind-rate needs --neighbour-rate")
		return ErrUsage
	}
	if o.namespace != "" {
		if err := statestore.CheckNamespace(o.namespace); err != nil {
			fmt.Fprintf(a.stderr, "sasctl bench: --namespace: %v\n", err)
			return ErrUsage
		}
	}
	if o.rate < 0 || o.inflight < 1 || o.duration <= 0 || o.warmup < 0 || *rounds < 1 {
		fmt.Fprintln(a.stderr, "sasctl bench: --rate must be >= 0, --inflight >= 1, --duration > 0, --warmup >= 0, --rounds >= 1")
		return ErrUsage
	}
	if _, err := newOrders(o.wf); err != nil {
		fmt.Fprintf(a.stderr, "sasctl bench: %v\n", err)
		return ErrUsage
	}
	for _, e := range env {
		name, _, ok := strings.Cut(e, "=")
		if !ok || !strings.HasPrefix(name, "SAS_") && !slices.Contains(goRuntimeVars(), name) {
			fmt.Fprintf(a.stderr, "sasctl bench: --env %q: want SAS_NAME=VALUE or one of %s\n", e, strings.Join(goRuntimeVars(), ", "))
			return ErrUsage
		}
	}
	var out any
	switch {
	case *backlog > 0:
		rep, err := a.benchBacklog(ctx, o, *backlog)
		if err != nil {
			return err
		}
		rep.print(a.stdout)
		out = rep
	case *against == "":
		rep, err := a.runBench(ctx, o)
		if err != nil {
			return err
		}
		rep.print(a.stdout)
		out = rep
	default:
		ab, err := a.benchAB(ctx, o, *against, *rounds)
		if err != nil {
			return err
		}
		ab.print(a.stdout)
		out = ab
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// benchOptions are one run's settings.
type benchOptions struct {
	wf                          string
	rate                        float64
	inflight                    int
	warmup, duration, drain     time.Duration
	idle                        time.Duration // a window with no load first
	schedulers, agents, latency int
	binDir                      string
	portBase, pprofOffset       int
	label                       string
	purge, fresh                bool
	prefill                     int // orders written before the run (lab.Fill)
	statements                  int // the dearest statements reported (pg_stat_statements)
	churn                       int // orders ended before the window opens
	env                         []string
	envB                        []string // with --against: B's own
	via                         string   // amqp or http
	await                       bool     // with http: await each order
	// namespace: with http, where the load goes; neighbourRate orders a
	// second go to "neighbour" too, held to neighbourQuota a second.
	namespace                     string
	neighbourRate, neighbourQuota float64
	// neighbourKindRate: the neighbour's own rate limit on every kind.
	neighbourKindRate float64
}

// runBench runs every service under load once and returns what it
// measured.
func (a *Tool) runBench(ctx context.Context, o benchOptions) (*benchReport, error) {
	rig, err := a.newBenchRig(ctx, o, o.purge)
	if err != nil {
		return nil, err
	}
	defer rig.close()
	a, smp, store, pool, conn, pub, topo, depths, queueNames, serviceEnv := rig.a, rig.smp, rig.store, rig.pool, rig.conn, rig.pub, rig.topo, rig.depths, rig.queues, rig.env

	scenarioEnv, faults, err := smp.setUp(rig.dir, o.latency)
	if err != nil {
		return nil, err
	}
	serviceEnv = append(serviceEnv, scenarioEnv...)
	var routed *partition.Layout
	if o.via == "routed" {
		// One partition, this run, behind the routing exchange: every
		// submit goes through the exchange and its bucket's exchange,
		// and the submitter checks each order's bucket is its own.
		routed = &partition.Layout{Exchange: topo.Prefix + "route", Buckets: partition.DefaultBuckets,
			Partitions: []partition.Partition{{Name: "p1", QueuePrefix: topo.Prefix, DatabaseURLEnv: "SAS_BENCH_P1_DATABASE_URL"}}}
		raw, err := yaml.Marshal(routed)
		if err != nil {
			return nil, err
		}
		file := filepath.Join(rig.dir, "partitions.yaml")
		if err := os.WriteFile(file, raw, 0o600); err != nil {
			return nil, err
		}
		serviceEnv = append(serviceEnv, "SAS_PARTITIONS_FILE="+file, "SAS_PARTITION=p1")
	}
	apiPort := 0
	if o.via == "http" {
		apiPort = o.portBase + 9
		serviceEnv = append(serviceEnv, "SAS_API_RATE=1000000", "SAS_API_BURST=1000000")
	}
	// The machine's speed now, before anything of the run is on it.
	calibration := calibrate()
	st, err := localstack.Start(ctx, localstack.Options{BinDir: o.binDir, Schedulers: o.schedulers, Agents: o.agents,
		Faults: faults, PortBase: o.portBase, Env: serviceEnv, DebugOffset: o.pprofOffset, APIPort: apiPort})
	if err != nil {
		return nil, err
	}
	defer st.Stop()
	fmt.Fprintf(a.stderr, "services up (%d processes); logs in %s\n", len(st.Procs), st.Logs)
	if routed != nil {
		ch, err := conn.Channel(ctx)
		if err != nil {
			return nil, err
		}
		err = routed.Declare(ch)
		_ = ch.Close()
		if err != nil {
			return nil, fmt.Errorf("--via routed: %w (rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)", err)
		}
	}
	var hl, neighbour *httpLoad
	if o.via == "http" {
		namespaces := []string{statestore.DefaultNamespace}
		if o.namespace != "" {
			if namespaces, err = benchNamespaces(ctx, store, o); err != nil {
				return nil, err
			}
		}
		_, token, err := store.CreateAPITokenIn(ctx, "bench-"+time.Now().UTC().Format("150405.000000"), statestore.TokenSubmitter, "sasctl bench", namespaces)
		if err != nil {
			return nil, err
		}
		base := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
		hl = newHTTPLoad(ctx, base, token, o.await)
		hl.namespace = o.namespace
		if o.neighbourRate > 0 {
			neighbour = newHTTPLoad(ctx, base, token, false)
			neighbour.namespace = neighbourNamespace
		}
	}

	// Ended orders, counted from the status events the system publishes.
	var ended atomic.Int64
	endedWake := make(chan struct{}, 1)
	stopListen, err := listenEnded(ctx, conn, topo, func() {
		ended.Add(1)
		select {
		case endedWake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	defer stopListen()

	var idle *idleUse
	if o.idle > 0 {
		fmt.Fprintf(a.stderr, "at rest for %v ...\n", o.idle)
		if idle, err = measureIdle(ctx, st, o.idle); err != nil {
			return nil, err
		}
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	gen := &generator{pub: pub, queue: topo.Queue(submitter.Input), sampler: smp, http: hl}
	if routed != nil {
		gen.exchange = routed.Exchange
	}
	loadDone := make(chan error, 1)
	loadJoined := make(chan struct{})
	// However the run ends, the load generator is stopped and waited for.
	defer func() {
		stopLoad()
		<-loadJoined
	}()
	var noisy *generator
	if neighbour != nil {
		other, err := newOrders(o.wf)
		if err != nil {
			return nil, err
		}
		noisy = &generator{sampler: other, http: neighbour}
	}
	go func() {
		defer close(loadJoined)
		var wg sync.WaitGroup
		if noisy != nil {
			wg.Go(func() { _ = noisy.fixedRate(loadCtx, o.neighbourRate) })
		}
		if o.rate > 0 {
			loadDone <- gen.fixedRate(loadCtx, o.rate)
		} else {
			loadDone <- gen.closedLoop(loadCtx, o.inflight, &ended, endedWake)
		}
		wg.Wait()
	}()
	// published is every order the API or the broker took, the
	// neighbour's too (ended counts them all).
	published := func() int64 {
		if noisy != nil {
			return gen.published.Load() + noisy.published.Load()
		}
		return gen.published.Load()
	}

	samples := &sampler{queues: queueNames, depths: depths}
	began := time.Now()
	window := struct {
		from, to     time.Time
		cpu0, cpu1   cpuSnapshot
		wal0, wal1   *lab.WALReading
		sent0, sent1 int64 // orders the load generator had published
		statements   []lab.Statement
	}{}
	// With --statements, pg_stat_statements counts from the window's
	// start; countStatements is false once it cannot.
	countStatements := o.statements > 0
	resetStatements := func() {
		if countStatements {
			if err := lab.ResetStatements(ctx, pool); err != nil {
				fmt.Fprintf(a.stderr, "the report will lack the statements: %v\n", err)
				countStatements = false
			}
		}
	}
	readWAL := func() *lab.WALReading {
		r, err := lab.ReadWAL(ctx, pool)
		if err != nil {
			fmt.Fprintf(a.stderr, "the report will lack the database's WAL figures: %v\n", err)
			return nil
		}
		return &r
	}
	phase := "warm-up"
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	measureAt := began.Add(o.warmup)
	endAt := measureAt.Add(o.duration)
	if o.warmup == 0 && o.churn == 0 {
		window.from, err = store.Now(ctx)
		if err != nil {
			return nil, err
		}
		window.cpu0, window.sent0 = takeCPU(ctx, st), gen.published.Load()
		window.wal0 = readWAL()
		resetStatements()
		phase = "measuring"
	}
	for phase != "done" {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-loadDone:
			if err != nil {
				return nil, fmt.Errorf("load: %w", err)
			}
			return nil, errors.New("load generator stopped early")
		case now := <-tick.C:
			if err := st.Exited(); err != nil {
				return nil, err
			}
			if phase == "measuring" {
				samples.take(ctx, now.Sub(measureAt))
			}
			switch {
			case phase == "warm-up" && !now.Before(measureAt) && ended.Load() >= int64(o.churn):
				if window.from, err = store.Now(ctx); err != nil {
					return nil, err
				}
				measureAt, endAt = now, now.Add(o.duration)
				window.cpu0, window.sent0 = takeCPU(ctx, st), gen.published.Load()
				window.wal0 = readWAL()
				resetStatements()
				phase = "measuring"
			case phase == "measuring" && !now.Before(endAt):
				if window.to, err = store.Now(ctx); err != nil {
					return nil, err
				}
				window.cpu1, window.sent1 = takeCPU(ctx, st), gen.published.Load()
				if window.wal0 != nil {
					window.wal1 = readWAL()
				}
				if countStatements {
					stmts, serr := lab.ReadStatements(ctx, pool, o.statements)
					if serr != nil {
						fmt.Fprintf(a.stderr, "the report will lack the statements: %v\n", serr)
					}
					window.statements = stmts
				}
				phase = "done"
			}
			fmt.Fprintf(a.stderr, "\r%-9s %5.0fs | published %d | ended %d | in flight %d   ",
				phase, time.Since(began).Seconds(), gen.published.Load(), ended.Load(), gen.published.Load()-ended.Load())
		}
	}
	stopLoad()
	if err := <-loadDone; err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("load: %w", err)
	}
	fmt.Fprintln(a.stderr)

	// Wait for the window's orders to end, within --drain.
	drainUntil := time.Now().Add(o.drain)
	for ended.Load() < published() && time.Now().Before(drainUntil) && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	// And after: the machine's speed may change within minutes (a shared
	// host), and a run between two figures far apart straddled a change.
	calibrationAfter := calibrate()
	timings, err := lab.ReadTimings(ctx, pool, window.from, window.to, o.namespace)
	if err != nil {
		return nil, err
	}
	rep := newBenchReport(o.label, o.wf, o.rate, o.inflight, o.warmup, window.to.Sub(window.from), o.schedulers, o.agents, o.latency, o.env)
	rep.Published, rep.PublishFailures = gen.published.Load(), gen.failed.Load()
	rep.Churned = o.churn
	rep.Machine.CalibrationMS = float64(calibration.Microseconds()) / 1000
	rep.Machine.CalibrationAfterMS = float64(calibrationAfter.Microseconds()) / 1000
	if rep.Postgres, err = postgresSettings(ctx, pool); err != nil {
		fmt.Fprintf(a.stderr, "the report will lack the database's settings: %v\n", err)
	}
	rep.Broker = newBrokerReport(conn)
	if o.via == "http" {
		rep.Via = "http"
	}
	rep.Namespace = o.namespace
	if noisy != nil {
		rep.Neighbour = &neighbourReport{Rate: o.neighbourRate, Quota: o.neighbourQuota, KindRate: o.neighbourKindRate,
			Admitted: noisy.published.Load(), Refused: noisy.failed.Load()}
	}
	if hl != nil && o.await {
		over, failed, err := hl.overhead(ctx, pool, window.from, window.to)
		if err != nil {
			return nil, err
		}
		rep.AwaitOverhead, rep.AwaitFailures = &over, failed
	}
	rep.fill(timings, window.cpu0, window.cpu1, st, samples)
	rep.fillDatabase(window.wal0, window.wal1, timings.Completions)
	rep.fillLedger(window.wal0, window.wal1, window.cpu0, window.cpu1, window.sent1-window.sent0, timings.Completions)
	rep.fillStatements(window.statements, timings.Completions)
	rep.Idle = idle
	if rig.filled != nil {
		rep.Prefilled, rep.PrefilledSize = rig.filled.Orders, rig.filled.Size
	}
	return rep, nil
}

// neighbourReport is what the noisy tenant offered and what came of it.
type neighbourReport struct {
	Rate     float64 `json:"rate"`
	Quota    float64 `json:"quota"`
	KindRate float64 `json:"kind_rate,omitempty"` // its own rate limit on every kind
	Admitted int64   `json:"admitted"`
	Refused  int64   `json:"refused"`
}

// neighbourNamespace is the noisy tenant's namespace (--neighbour-rate).
const neighbourNamespace = "neighbour"

// benchNamespaces adds the load's namespace, and the neighbour's with its
// quotas (a rate, and 20 times it in flight), and returns both.
func benchNamespaces(ctx context.Context, store *statestore.Store, o benchOptions) ([]string, error) {
	names := []string{o.namespace}
	if o.neighbourRate > 0 {
		names = append(names, neighbourNamespace)
	}
	for _, ns := range names {
		if _, err := store.AddNamespace(ctx, ns, "sasctl bench"); err != nil && !errors.Is(err, statestore.ErrConflict) {
			return nil, err
		}
	}
	if o.neighbourRate > 0 {
		inFlight := int(math.Ceil(20 * o.neighbourQuota))
		if err := store.SetNamespaceQuotas(ctx, neighbourNamespace, statestore.Quotas{MaxSubmitRate: &o.neighbourQuota, MaxInFlight: &inFlight}, "sasctl bench"); err != nil {
			return nil, err
		}
	}
	if o.neighbourKindRate > 0 {
		for _, kind := range workflow.Builtin().Agents() {
			r := o.neighbourKindRate
			if _, err := store.SetNamespaceLimits(ctx, neighbourNamespace, kind, statestore.LimitChange{Rate: &r}, "sasctl bench"); err != nil {
				return nil, err
			}
		}
	}
	return names, nil
}

// benchRig is what a benchmark run sets up before its services start: a
// fresh schema (o.fresh), migrated and prefilled (o.prefill), the broker
// topology and empty queues. a is the app with the run's database URL,
// env the services' environment.
type benchRig struct {
	a      *Tool
	smp    *orders
	env    []string
	store  *statestore.Store
	pool   *pgxpool.Pool // the store's, for the lab's readers
	conn   *broker.Conn
	pub    *broker.Publisher
	topo   broker.Topology
	depths *broker.QueueInspector
	queues []string
	filled *lab.FillReport
	dir    string   // the run's own files (a graph scenario's workflows)
	undo   []func() // run in reverse by close
}

func (a *Tool) newBenchRig(ctx context.Context, o benchOptions, purge bool) (_ *benchRig, err error) {
	r := &benchRig{a: a, env: slices.Clone(o.env)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.smp, err = newOrders(o.wf); err != nil {
		return nil, err
	}
	if r.dir, err = os.MkdirTemp("", "sas-bench-"); err != nil {
		return nil, err
	}
	r.undo = append(r.undo, func() { _ = os.RemoveAll(r.dir) })
	if o.fresh {
		url, drop, err := a.freshSchema(ctx)
		if err != nil {
			return nil, err
		}
		r.undo = append(r.undo, drop)
		fmt.Fprintf(a.stderr, "on a fresh schema %s\n", schemaOf(url))
		fresh := *a
		fresh.cfg.DatabaseURL = url
		r.a = &fresh
		r.env = append(r.env, "SAS_DATABASE_URL="+url)
	}
	store, pool, err := r.a.benchStore(ctx, o.binDir)
	if err != nil {
		return nil, err
	}
	r.store, r.pool = store, pool
	r.undo = append(r.undo, pool.Close)
	if o.prefill > 0 {
		if !o.fresh {
			return nil, errors.New("--prefill needs a fresh schema (--fresh)")
		}
		fmt.Fprintf(a.stderr, "filling the store with %d orders ...\n", o.prefill)
		f, err := lab.Fill(ctx, r.pool, o.prefill, 0)
		if err != nil {
			return nil, err
		}
		r.filled = &f
		fmt.Fprintf(a.stderr, "filled in %v, vacuumed and analyzed in %v: %s\n", f.Filled.Round(time.Second), f.Vacuumed.Round(time.Second), f.Size)
	}
	inputs := []string{submitter.Input, messages.RepliesQueue}
	for _, k := range workflow.Builtin().Agents() {
		inputs = append(inputs, messages.RequestsQueue(k))
	}
	if r.conn, r.pub, r.topo, err = r.a.openBroker(ctx, inputs...); err != nil {
		return nil, err
	}
	r.undo = append(r.undo, func() { r.conn.Close() }, func() { r.pub.Close() })
	r.depths = broker.NewQueueInspector(r.conn)
	r.undo = append(r.undo, r.depths.Close)
	for _, in := range inputs {
		r.queues = append(r.queues, r.topo.Queue(in))
	}
	// A run's figures are only its own if no earlier run left work behind.
	if err := emptyQueues(ctx, r.conn, r.depths, r.queues, purge, a.stderr); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *benchRig) close() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
}

// emptyQueues checks that queues hold no ready messages, or with purge
// empties them.
func emptyQueues(ctx context.Context, conn *broker.Conn, depths *broker.QueueInspector, queues []string, purge bool, w io.Writer) error {
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			ch.Close()
		}
	}()
	for _, q := range queues {
		n, err := depths.Ready(ctx, q)
		if err != nil {
			return err
		}
		if n == 0 {
			continue
		}
		if !purge {
			return fmt.Errorf("queue %s holds %d messages (left by an earlier run?); empty it or run with --purge", q, n)
		}
		if ch == nil {
			if ch, err = conn.Channel(ctx); err != nil {
				return err
			}
		}
		purged, err := ch.QueuePurge(q, false)
		if err != nil {
			return fmt.Errorf("purge %s: %w", q, err)
		}
		fmt.Fprintf(w, "purged %d messages an earlier run left in %s\n", purged, q)
	}
	return nil
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// listenEnded counts the orders that end (status events completed, failed,
// error) on a private queue bound to the status exchange.
func listenEnded(ctx context.Context, conn *broker.Conn, topo broker.Topology, onEnded func()) (func(), error) {
	ch, err := conn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		for _, key := range []string{messages.StatusCompleted, messages.StatusFailed, messages.StatusError} {
			if err = ch.QueueBind(q.Name, key, topo.StatusExchange(), false, nil); err != nil {
				break
			}
		}
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.ConsumeWithContext(ctx, q.Name, "sasctl-bench", true, true, false, false, nil)
	}
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("listen for status events: %w", err)
	}
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		for range deliveries {
			onEnded()
		}
	}()
	// Closing the channel closes deliveries: the counting loop ends, and
	// stop waits for it.
	return func() {
		ch.Close()
		<-counted
	}, nil
}

// generator publishes sample orders to the submit queue, keeping many
// confirms in flight on one channel.
type generator struct {
	http *httpLoad // --via http: through the API instead
	pub  *broker.Publisher
	// queue is the submit queue; exchange, when set, the routing
	// exchange published to instead, the order id as routing key.
	queue, exchange string
	sampler         *orders
	published       atomic.Int64 // confirmed by the broker
	failed          atomic.Int64
}

// confirmWindow is how many publishes may await their confirm at once.
const confirmWindow = 512

// run publishes one order each time next says so, until ctx ends.
func (g *generator) run(ctx context.Context, next func(ctx context.Context, started int64) bool) error {
	if g.http != nil {
		return g.runHTTP(ctx, next)
	}
	pending := make(chan *broker.Pending, confirmWindow)
	var wg sync.WaitGroup
	wg.Go(func() {
		for p := range pending {
			if err := p.Wait(context.WithoutCancel(ctx)); err != nil {
				g.failed.Add(1)
				continue
			}
			g.published.Add(1)
		}
	})
	defer func() {
		close(pending)
		wg.Wait()
	}()
	var started int64
	for next(ctx, started) {
		o := g.sampler.next()
		body, err := messages.Encode(o)
		if err != nil {
			return err
		}
		exchange, key := "", g.queue
		if g.exchange != "" {
			exchange, key = g.exchange, o.OrderID
		}
		p, err := g.pub.Start(ctx, exchange, key, amqp.Publishing{
			ContentType: messages.ContentType,
			Type:        messages.TypeSubmitOrder,
			MessageId:   o.OrderID,
			Headers:     amqp.Table{"schema_version": int32(messages.SchemaVersion)},
			Body:        body,
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			g.failed.Add(1)
			continue
		}
		started++
		pending <- p
	}
	return nil
}

// fixedRate offers rate orders per second, whatever the system does with
// them (an open loop). It sleeps at least a millisecond at a time and then
// publishes what fell due meanwhile, so that pacing costs little CPU.
func (g *generator) fixedRate(ctx context.Context, rate float64) error {
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	return g.run(ctx, func(ctx context.Context, started int64) bool {
		for ctx.Err() == nil {
			due := int64(time.Since(start).Seconds() * rate)
			if started < due {
				return true
			}
			wait := time.Until(start.Add(time.Duration(float64(started+1) / rate * float64(time.Second))))
			timer.Reset(max(wait, time.Millisecond))
			select {
			case <-ctx.Done():
				timer.Stop()
			case <-timer.C:
			}
		}
		return false
	})
}

// closedLoop keeps at most window orders published and not yet ended.
func (g *generator) closedLoop(ctx context.Context, window int, ended *atomic.Int64, wake <-chan struct{}) error {
	return g.run(ctx, func(ctx context.Context, started int64) bool {
		for ctx.Err() == nil {
			if started-ended.Load() < int64(window) {
				return true
			}
			select {
			case <-ctx.Done():
			case <-wake:
			case <-time.After(10 * time.Millisecond):
			}
		}
		return false
	})
}

// sampler reads the queues' ready messages once a second.
type sampler struct {
	queues []string
	depths *broker.QueueInspector
	at     []time.Duration
	ready  [][]int // per queue, per sample
}

func (s *sampler) take(ctx context.Context, at time.Duration) {
	if s.ready == nil {
		s.ready = make([][]int, len(s.queues))
	}
	s.at = append(s.at, at)
	for i, q := range s.queues {
		n, err := s.depths.Ready(ctx, q)
		if err != nil {
			n = -1
		}
		s.ready[i] = append(s.ready[i], n)
	}
}

// cpuSnapshot is CPU time and context switches per process (the services
// by name, and the PostgreSQL and RabbitMQ servers' processes together),
// the machine's CPU, and what each service's metrics say it did with
// RabbitMQ.
type cpuSnapshot struct {
	at       time.Time
	services map[string]procReading
	servers  map[string]map[int]procReading // postgres / rabbitmq: by pid
	self     procReading
	machine  machineCPU
	broker   map[string]brokerCounts // by service
}

// procReading is one process's CPU time and context switches so far.
type procReading struct {
	cpu      time.Duration
	switches int64
}

func readProc(pid int) (procReading, error) {
	cpu, err := processCPU(pid)
	if err != nil {
		return procReading{}, err
	}
	sw, err := contextSwitches(pid)
	return procReading{cpu: cpu, switches: sw}, err
}

// sub is what a process did between an earlier reading and this one.
func (r procReading) sub(then procReading) procReading {
	return procReading{cpu: r.cpu - then.cpu, switches: r.switches - then.switches}
}

func takeCPU(ctx context.Context, st *localstack.Stack) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), services: map[string]procReading{}, servers: map[string]map[int]procReading{},
		broker: map[string]brokerCounts{}}
	for _, p := range st.Procs {
		s.services[p.Name], _ = readProc(p.PID())
	}
	s.self, _ = readProc(os.Getpid())
	for name, pids := range serverPIDs() {
		s.servers[name] = map[int]procReading{}
		for _, pid := range pids {
			if d, err := readProc(pid); err == nil {
				s.servers[name][pid] = d
			}
		}
	}
	s.machine, _ = readMachineCPU()
	for _, p := range st.Procs {
		if p.Name != "remote" {
			s.broker[p.Name], _ = brokerCounters(ctx, p.Addr)
		}
	}
	return s
}

// uses is what each process did between two snapshots, in report order:
// the services, the load generator, then the servers (every process of
// each that lived through both snapshots).
func uses(st *localstack.Stack, c0, c1 cpuSnapshot) []processUse {
	var out []processUse
	for _, p := range st.Procs {
		rss, _ := peakRSS(p.PID())
		out = append(out, processUse{Name: p.Name, PeakRSSMiB: rss, d: c1.services[p.Name].sub(c0.services[p.Name])})
	}
	self, _ := peakRSS(os.Getpid())
	out = append(out, processUse{Name: "sasctl bench (load and listener)", PeakRSSMiB: self, d: c1.self.sub(c0.self)})
	for _, name := range []string{"postgres", "rabbitmq"} {
		var d procReading
		for pid, end := range c1.servers[name] {
			if then, ok := c0.servers[name][pid]; ok {
				e := end.sub(then)
				d.cpu, d.switches = d.cpu+e.cpu, d.switches+e.switches
			} else {
				d.cpu, d.switches = d.cpu+end.cpu, d.switches+end.switches // started within the window
			}
		}
		out = append(out, processUse{Name: name + " (all processes)", server: name, d: d})
	}
	return out
}

// benchReport is what sasctl bench prints and writes as JSON.
type benchReport struct {
	Label    string `json:"label,omitempty"`
	Workflow string `json:"workflow"`
	// Mode is "rate" (OfferedRate orders/s) or "max" (at most Inflight
	// orders published and not ended).
	Mode            string   `json:"mode"`
	OfferedRate     float64  `json:"offered_rate,omitempty"`
	Inflight        int      `json:"inflight,omitempty"`
	WarmupSeconds   float64  `json:"warmup_s"`
	WindowSeconds   float64  `json:"window_s"`
	Schedulers      int      `json:"schedulers"`
	Agents          int      `json:"agents"`
	RemoteLatencyMS int      `json:"remote_latency_ms"`
	Env             []string `json:"env,omitempty"`
	Machine         struct {
		CPUs      int    `json:"cpus"`
		CPUModel  string `json:"cpu_model,omitempty"`
		GoVersion string `json:"go_version"`
		MemTotal  string `json:"mem_total"`
		// CalibrationMS is how long the fixed work of calibrate.go took
		// on one core before the services started (best of three):
		// lower is a faster machine. CalibrationAfterMS is the same
		// after the load ended.
		CalibrationMS      float64 `json:"calibration_ms,omitempty"`
		CalibrationAfterMS float64 `json:"calibration_after_ms,omitempty"`
	} `json:"machine"`

	Published       int64 `json:"published"`
	PublishFailures int64 `json:"publish_failures"`
	// Via is "http" when orders went in through the API; AwaitOverhead,
	// with --await, is how long after an order's end in the store its
	// await came back.
	Via           string     `json:"via,omitempty"`
	AwaitOverhead *latencyMS `json:"await_overhead_ms,omitempty"`
	AwaitFailures int        `json:"await_failures,omitempty"`
	// Namespace is where the load went (--namespace); its orders alone
	// are timed. Neighbour is the noisy tenant beside it.
	Namespace string           `json:"namespace,omitempty"`
	Neighbour *neighbourReport `json:"neighbour,omitempty"`
	// CompletedPerSecond: orders that reached completed inside the window,
	// per second. PlacedPerSecond: orders placed inside it, per second.
	CompletedPerSecond float64        `json:"completed_per_s"`
	PlacedPerSecond    float64        `json:"placed_per_s"`
	Placed             int            `json:"placed"`
	Ended              map[string]int `json:"ended"`
	Unended            int            `json:"unended"`
	Latency            latencyMS      `json:"latency_ms"`
	Stages             []stageMS      `json:"stages_ms"`
	Processes          []processUse   `json:"processes"`
	MachineBusy        float64        `json:"machine_cpu_busy_percent"`
	// MachineSteal is CPU time the hypervisor gave to other guests: where
	// it is high, the machine was slower than its CPU count says.
	MachineSteal float64 `json:"machine_cpu_steal_percent"`
	// CPUMSPerOrder is the CPU time of every process above (services,
	// load generator, PostgreSQL, RabbitMQ) per order completed in the
	// window: what an order costs the machine, comparable between runs
	// at different rates.
	CPUMSPerOrder float64      `json:"cpu_ms_per_completed_order,omitempty"`
	Database      *databaseUse `json:"database,omitempty"`
	// Ledger is an order's cost in transactions, WAL flushes, messages
	// and wake-ups.
	Ledger *ledger `json:"ledger,omitempty"`
	// Idle is what each process did with no load, before it (--idle).
	Idle *idleUse `json:"idle,omitempty"`
	// Statements are the statements that took the database the most
	// time in the window (--statements), dearest first.
	Statements []statementUse `json:"statements,omitempty"`
	// Prefilled orders were in the store before the run (--prefill),
	// taking PrefilledSize on disk.
	Prefilled     int    `json:"prefilled,omitempty"`
	PrefilledSize string `json:"prefilled_size,omitempty"`
	// Churned orders ended before the window (--churn), their dead rows
	// left where they lie.
	Churned int `json:"churned,omitempty"`
	// Postgres is what the run's PostgreSQL was, by setting: its version,
	// and what its figures depend on.
	Postgres map[string]string `json:"postgres,omitempty"`
	// Broker is what the run's RabbitMQ was.
	Broker *brokerReport `json:"broker,omitempty"`
	Queues []queueDepths `json:"queues"`
}

// brokerReport is the broker a run ran against: its figures depend on the
// queues' type most (a quorum queue writes each message to its Raft log).
type brokerReport struct {
	Server string `json:"server"`
	// QueueType is the type the run's queues are (they keep the type
	// they were made with, whatever SAS_QUEUE_TYPE says now).
	QueueType string `json:"queue_type"`
}

// newBrokerReport describes the broker of conn.
func newBrokerReport(conn *broker.Conn) *brokerReport {
	t := conn.Topology().QueueType
	if t == "" {
		t = broker.QueueQuorum
	}
	return &brokerReport{Server: conn.Server(), QueueType: t}
}

// databaseUse is what the database cluster wrote over the window.
type databaseUse struct {
	WALBytes         int64   `json:"wal_bytes"`
	WALBytesPerOrder float64 `json:"wal_bytes_per_completed_order,omitempty"`
	// Checkpoints completed in the window: after each, the first change
	// to a page logs the whole page, so the WAL per order, and the
	// database's CPU, rise for a while.
	Checkpoints int64 `json:"checkpoints"`
}

type latencyMS struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

type stageMS struct {
	Stage string `json:"stage"`
	latencyMS
}

type processUse struct {
	Name       string  `json:"name"`
	CPUSeconds float64 `json:"cpu_s"`
	// CPUPercent is of one core, over the window.
	CPUPercent    float64 `json:"cpu_percent"`
	CPUMSPerOrder float64 `json:"cpu_ms_per_order,omitempty"` // per order completed in the window
	PeakRSSMiB    float64 `json:"peak_rss_mib,omitempty"`
	// WakeUps are context switches (all threads), per second of the
	// window and per order completed in it.
	WakeUpsPerSecond float64 `json:"wake_ups_per_s"`
	WakeUpsPerOrder  float64 `json:"wake_ups_per_order,omitempty"`
	// Messages the service published and deliveries it handled, per
	// order (from its own metrics).
	PublishedPerOrder float64 `json:"published_per_order,omitempty"`
	DeliveredPerOrder float64 `json:"delivered_per_order,omitempty"`

	server string      // postgres or rabbitmq: a server's processes
	d      procReading // what it did in the window
}

type queueDepths struct {
	Queue   string  `json:"queue"`
	Max     int     `json:"max"`
	Last    int     `json:"last"`
	Verdict string  `json:"verdict"` // bounded or growing
	Seconds []int   `json:"at_s"`
	Ready   []int   `json:"ready"`
	Slope   float64 `json:"slope_per_s"`
}

// goRuntimeVars are the Go runtime's settings --env may pass besides
// sas's own.
func goRuntimeVars() []string { return []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG"} }

func newBenchReport(label, wf string, rate float64, inflight int, warmup, window time.Duration, schedulers, agents, latency int, env []string) *benchReport {
	r := &benchReport{Label: label, Workflow: wf, Mode: "max", Inflight: inflight, WarmupSeconds: warmup.Seconds(),
		WindowSeconds: window.Seconds(), Schedulers: schedulers, Agents: agents, RemoteLatencyMS: latency, Env: env}
	if rate > 0 {
		r.Mode, r.OfferedRate, r.Inflight = "rate", rate, 0
	}
	r.Machine.CPUs = runtime.NumCPU()
	r.Machine.GoVersion = runtime.Version()
	r.Machine.MemTotal = memTotal()
	r.Machine.CPUModel = cpuModel()
	return r
}

func toMS(l lab.Latency) latencyMS {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return latencyMS{N: l.N, P50: ms(l.P50), P95: ms(l.P95), P99: ms(l.P99), Max: ms(l.Max), Mean: ms(l.Mean)}
}

func (r *benchReport) fill(t lab.Timings, cpu0, cpu1 cpuSnapshot, st *localstack.Stack, s *sampler) {
	secs := r.WindowSeconds
	r.CompletedPerSecond = float64(t.Completions) / secs
	r.PlacedPerSecond = float64(t.Placed) / secs
	r.Placed, r.Ended = t.Placed, t.Ended
	r.Unended = t.Placed
	for _, n := range t.Ended {
		r.Unended -= n
	}
	for _, sl := range t.Stages {
		if sl.Stage == lab.StageOrder {
			r.Latency = toMS(sl.Latency)
			continue
		}
		r.Stages = append(r.Stages, stageMS{Stage: sl.Stage, latencyMS: toMS(sl.Latency)})
	}
	wall := cpu1.at.Sub(cpu0.at).Seconds()
	var total time.Duration
	perOrder := func(d float64) float64 {
		if t.Completions == 0 {
			return 0
		}
		return d / float64(t.Completions)
	}
	for _, p := range uses(st, cpu0, cpu1) {
		total += p.d.cpu
		p.CPUSeconds, p.CPUPercent = p.d.cpu.Seconds(), 100*p.d.cpu.Seconds()/wall
		p.CPUMSPerOrder = perOrder(float64(p.d.cpu.Microseconds()) / 1000)
		p.WakeUpsPerSecond, p.WakeUpsPerOrder = float64(p.d.switches)/wall, perOrder(float64(p.d.switches))
		r.Processes = append(r.Processes, p)
	}
	r.CPUMSPerOrder = perOrder(float64(total.Microseconds()) / 1000)
	r.MachineBusy, r.MachineSteal = cpu1.machine.busySince(cpu0.machine)
	for i, q := range s.queues {
		qd := queueDepths{Queue: q, Ready: s.ready[i]}
		for j, at := range s.at {
			qd.Seconds = append(qd.Seconds, int(at.Round(time.Second).Seconds()))
			qd.Max = max(qd.Max, s.ready[i][j])
		}
		if n := len(qd.Ready); n > 0 {
			qd.Last = qd.Ready[n-1]
		}
		qd.Slope, qd.Verdict = trend(s.at, qd.Ready)
		r.Queues = append(r.Queues, qd)
	}
}

// fillDatabase adds the WAL figures between two readings, if both were
// taken.
func (r *benchReport) fillDatabase(w0, w1 *lab.WALReading, completions int) {
	if w0 == nil || w1 == nil {
		return
	}
	r.Database = &databaseUse{WALBytes: w1.Bytes - w0.Bytes, Checkpoints: w1.Checkpoints - w0.Checkpoints}
	if completions > 0 {
		r.Database.WALBytesPerOrder = float64(r.Database.WALBytes) / float64(completions)
	}
}

// statementUse is one statement's share of the database's time in the
// window (pg_stat_statements).
type statementUse struct {
	Query         string  `json:"query"`
	Calls         int64   `json:"calls"`
	CallsPerOrder float64 `json:"calls_per_order,omitempty"`
	MSPerCall     float64 `json:"ms_per_call"`
	MSPerOrder    float64 `json:"ms_per_order,omitempty"`
	RowsPerCall   float64 `json:"rows_per_call"`
	// Share is of the time of every statement a client sent (of those
	// read); a statement a function or trigger ran (TopLevel false) is
	// inside its caller's time too.
	SharePercent float64 `json:"share_percent"`
	TopLevel     bool    `json:"top_level"`
}

// fillStatements adds the dearest statements, per order completed in the
// window.
func (r *benchReport) fillStatements(stmts []lab.Statement, completions int) {
	var top float64
	for _, s := range stmts {
		if s.TopLevel {
			top += s.TotalMS
		}
	}
	for _, s := range stmts {
		u := statementUse{Query: s.Query, Calls: s.Calls, TopLevel: s.TopLevel}
		if s.Calls > 0 {
			u.MSPerCall, u.RowsPerCall = s.TotalMS/float64(s.Calls), float64(s.Rows)/float64(s.Calls)
		}
		if completions > 0 {
			u.CallsPerOrder, u.MSPerOrder = float64(s.Calls)/float64(completions), s.TotalMS/float64(completions)
		}
		if top > 0 {
			u.SharePercent = 100 * s.TotalMS / top
		}
		r.Statements = append(r.Statements, u)
	}
}

// printStatements prints the dearest statements: what each costs an order.
func printStatements(w io.Writer, stmts []statementUse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nSTATEMENTS (pg_stat_statements, execution)\tcalls per order\tms per call\tms per order\tshare\tstatement")
	for _, s := range stmts {
		q := s.Query
		if !s.TopLevel {
			q = "(inside a function) " + q
		}
		fmt.Fprintf(tw, "\t%.2f\t%.3f\t%.3f\t%.1f%%\t%s\n", s.CallsPerOrder, s.MSPerCall, s.MSPerOrder, s.SharePercent, q)
	}
	_ = tw.Flush()
}

// trend fits a line to the depths and calls the queue growing when, over
// the window, the line rises by more than 500 messages and by more than
// half of the largest depth: a queue that fills and stays under a bound
// (prefetch, the scheduler's SAS_SCHEDULER_MAX_QUEUED) is bounded.
func trend(at []time.Duration, ready []int) (float64, string) {
	n := float64(len(ready))
	if len(ready) < 3 {
		return 0, "bounded"
	}
	var sx, sy, sxx, sxy float64
	peak := 0
	for i, y := range ready {
		x := at[i].Seconds()
		sx, sy, sxx, sxy = sx+x, sy+float64(y), sxx+x*x, sxy+x*float64(y)
		peak = max(peak, y)
	}
	slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	span := at[len(at)-1].Seconds() - at[0].Seconds()
	if rise := slope * span; rise > 500 && rise > float64(peak)/2 {
		return slope, "growing"
	}
	return slope, "bounded"
}

func (r *benchReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	mode := fmt.Sprintf("as fast as absorbed (at most %d in flight)", r.Inflight)
	if r.Mode == "rate" {
		mode = fmt.Sprintf("%.0f orders/s offered", r.OfferedRate)
	}
	fmt.Fprintf(tw, "\nBENCH\t%s workflow, %s, %d schedulers, %d agents, remote %d ms, window %.0fs after %.0fs warm-up\n",
		r.Workflow, mode, r.Schedulers, r.Agents, r.RemoteLatencyMS, r.WindowSeconds, r.WarmupSeconds)
	fmt.Fprintf(tw, "completed\t%.0f orders/s sustained (placed %.0f/s; %d placed in the window, %d not ended)\n",
		r.CompletedPerSecond, r.PlacedPerSecond, r.Placed, r.Unended)
	if r.Via == "http" {
		fmt.Fprintf(tw, "submitted\tthrough the HTTP API (POST /api/v1/orders)\n")
	}
	fmt.Fprintf(tw, "publish failures\t%d\n", r.PublishFailures)
	if r.Namespace != "" {
		fmt.Fprintf(tw, "namespace\t%s (the latencies are its orders')\n", r.Namespace)
	}
	if n := r.Neighbour; n != nil {
		fmt.Fprintf(tw, "neighbour\t%.0f orders/s offered against a quota of %g/s: %d admitted, %d refused\n", n.Rate, n.Quota, n.Admitted, n.Refused)
		if n.KindRate > 0 {
			fmt.Fprintf(tw, "neighbour's limit\tits own rate of %g/s on every agent kind: its steps past it wait in the store\n", n.KindRate)
		}
	}
	if a := r.AwaitOverhead; a != nil {
		fmt.Fprintf(tw, "await overhead\tp50 %.1f ms, p95 %.1f ms, p99 %.1f ms, max %.1f ms over %d orders (%d awaits failed)\n",
			a.P50, a.P95, a.P99, a.Max, a.N, r.AwaitFailures)
	}
	if r.Prefilled > 0 {
		fmt.Fprintf(tw, "store\tprefilled with %d orders (%s), vacuumed\n", r.Prefilled, r.PrefilledSize)
	}
	if r.Churned > 0 {
		fmt.Fprintf(tw, "store\t%d orders ended before the window, not vacuumed\n", r.Churned)
	}
	if len(r.Postgres) > 0 {
		var kv []string
		for _, k := range postgresSettingNames() {
			kv = append(kv, k+"="+r.Postgres[k])
		}
		fmt.Fprintf(tw, "postgres\t%s\n", strings.Join(kv, " "))
	}
	if b := r.Broker; b != nil {
		fmt.Fprintf(tw, "broker\tserver=%q queue_type=%s\n", b.Server, b.QueueType)
	}
	if m := r.Machine; m.CalibrationMS > 0 {
		model := ""
		if m.CPUModel != "" {
			model = " (" + m.CPUModel + ")"
		}
		fmt.Fprintf(tw, "machine\t%d CPUs%s; the fixed work of a calibration in %.0f ms on one core before the run, %.0f after (lower is faster)\n",
			m.CPUs, model, m.CalibrationMS, m.CalibrationAfterMS)
	}
	fmt.Fprintln(tw, "\nLATENCY (ms)\tn\tp50\tp95\tp99\tmax\tmean")
	row := func(name string, l latencyMS) {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\n", name, l.N, l.P50, l.P95, l.P99, l.Max, l.Mean)
	}
	row("submit -> order ended", r.Latency)
	for _, s := range r.Stages {
		row("  "+s.Stage, s.latencyMS)
	}
	fmt.Fprintln(tw, "\nPROCESS\tCPU s\tCPU % of a core\tCPU ms per order\tpeak RSS MiB")
	for _, p := range r.Processes {
		rss := "-"
		if p.PeakRSSMiB > 0 {
			rss = fmt.Sprintf("%.0f", p.PeakRSSMiB)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%.2f\t%s\n", p.Name, p.CPUSeconds, p.CPUPercent, p.CPUMSPerOrder, rss)
	}
	fmt.Fprintf(tw, "all of the above\t\t\t%.2f\t\n", r.CPUMSPerOrder)
	fmt.Fprintln(tw, "\nPROCESS\twake-ups/s\twake-ups per order\tpublished per order\tdelivered per order")
	for _, p := range r.Processes {
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%.2f\t%.2f\n", p.Name, p.WakeUpsPerSecond, p.WakeUpsPerOrder, p.PublishedPerOrder, p.DeliveredPerOrder)
	}
	fmt.Fprintf(tw, "machine (%d CPUs): %.0f%% busy, %.0f%% stolen by the hypervisor\n", r.Machine.CPUs, r.MachineBusy, r.MachineSteal)
	_ = tw.Flush()
	if r.Ledger != nil {
		r.Ledger.print(w)
	}
	if r.Idle != nil {
		r.Idle.print(w)
	}
	if d := r.Database; d != nil {
		fmt.Fprintf(tw, "\nDATABASE (whole cluster)\tWAL %.1f MiB, %.1f KiB per completed order; %d checkpoints in the window\n",
			float64(d.WALBytes)/(1<<20), d.WALBytesPerOrder/1024, d.Checkpoints)
	}
	if len(r.Statements) > 0 {
		_ = tw.Flush()
		printStatements(w, r.Statements)
	}
	fmt.Fprintln(tw, "\nQUEUE (ready)\tmax\tlast\tslope/s\tverdict")
	for _, q := range r.Queues {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\n", q.Queue, q.Max, q.Last, q.Slope, q.Verdict)
	}
	_ = tw.Flush()
}

// postgresSettingNames are the PostgreSQL settings a report records: the
// figures depend on them (a user's server may differ from this machine's).
func postgresSettingNames() []string {
	return []string{"server_version", "autovacuum", "shared_buffers", "synchronous_commit", "jit", "fsync", "max_connections"}
}

// postgresSettings reads postgresSettingNames from the server.
func postgresSettings(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range postgresSettingNames() {
		var v string
		if err := pool.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		out[name] = v
	}
	return out, nil
}
