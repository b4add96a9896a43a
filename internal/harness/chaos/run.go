package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/harness/badinput"
	"sas/internal/harness/netproxy"
	"sas/internal/harness/proc"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/remote"
	"sas/internal/scheduler"
	"sas/internal/statestore"
	"sas/internal/submitter"
	"sas/internal/workflow"
	"sas/migrations"
)

// Fault kinds.
const (
	FaultKill      = "kill"      // kill -9 a submitter, scheduler, agent or supervisor, restart it
	FaultFailpoint = "failpoint" // restart a scheduler, agent or submitter to die at a step boundary
	FaultStop      = "stop"      // SIGSTOP a scheduler or agent past its lease, then SIGCONT
	FaultRemote    = "remote"    // a burst of 5xx, 429, hangs and apply-then-fail at the remote
	FaultPoison    = "poison"    // malformed messages on the submit queue
	FaultDuplicate = "duplicate" // submits delivered again
	FaultNetwork   = "network"   // cut, slow down or refuse for a while the services' connections to Postgres, RabbitMQ or the remote
	FaultPause     = "pause"     // pause a workflow (its running orders and those written meanwhile) for up to 2 s, then resume it
	FaultMigrate   = "migrate"   // move the running orders of the time workflow to a version with one more action (MigratedTimeYAML)
	// Restarts disturb everything else using the broker or the database
	// on this machine: for dedicated runs (make chaos), not make test.
	FaultBrokerRestart = "broker-restart" // rabbitmqctl stop_app, then start_app
	FaultDBRestart     = "db-restart"     // PostgreSQL stopped with -m immediate (a crash), then started
)

// AllFaults lists every fault kind.
func AllFaults() []string {
	return append(ShortFaults(), FaultBrokerRestart, FaultDBRestart)
}

// ShortFaults lists the fault kinds that leave the rest of the machine
// alone (no broker or database restart).
func ShortFaults() []string {
	return []string{FaultKill, FaultFailpoint, FaultStop, FaultRemote, FaultPoison, FaultDuplicate, FaultNetwork, FaultPause, FaultMigrate}
}

// Config configures a run.
type Config struct {
	BinDir      string // binaries built with -tags failpoints
	DatabaseURL string // the run makes its own schema in this database
	AMQPURL     string
	// QueueType is the services' SAS_QUEUE_TYPE (quorum or classic).
	QueueType   string
	Orders      int
	Rate        float64 // orders published per second
	Seed        uint64
	Faults      []string
	PortBase    int           // services listen from PortBase+1; 0 picks free ports
	StepTimeout time.Duration // the budget of one attempt
	HealTimeout time.Duration // how long the orders may take to end after the faults stop
	LogDir      string
	Keep        bool // keep the schema and queues afterwards
	// Env is added to every service's environment (e.g. SAS_BROKEN for
	// the negative controls).
	Env []string
	// KillRoles are the services the kill fault picks from (default:
	// submitter, scheduler, agent, supervisor); StopRoles those the stop
	// fault freezes (default: scheduler, agent).
	KillRoles []string
	StopRoles []string
	// Partitions, above 1, runs that many partitions (docs/SCALING.md):
	// each a schema, a queue prefix and its services of its own, orders
	// published through a routing exchange of the consistent-hash
	// plugin; every fault may strike any partition's processes (the
	// network fault any partition's database), and the invariants are
	// checked in each partition and across them.
	Partitions int
}

// Report is a run's outcome.
type Report struct {
	Seed                                     uint64
	Published, Confirmed, Malformed, Repeats int
	Refused                                  int // orders the remote refuses for good (they must be compensated)
	// WithDeadline are the orders published with a deadline of their own
	// (DeadlineEvery); DeadlinePassed those whose deadline passed while
	// they ran (they were undone).
	WithDeadline, DeadlinePassed int
	// Migrated are the orders the migrate fault moved to another version.
	Migrated int
	Faults   map[string]int
	Crashes  []string // processes that died without being killed
	// CrashLogs is the end of each crashed process's log, in Crashes'
	// order: the report says why, where the log folder may be gone (a
	// CI machine's temporary files).
	CrashLogs     []string
	HealedToQuiet time.Duration
	DeadLettered  map[string]int // by reason
	StaleReplies  float64        // counted by the schedulers alive at the end
	Result        Result
	LogDir        string
}

// OK reports whether every invariant held and no process crashed.
func (r Report) OK() bool { return r.Result.OK() && len(r.Crashes) == 0 }

// Print writes the report.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "fault run, seed %d\n", r.Seed)
	fmt.Fprintf(w, "  orders published %d, confirmed %d (of them %d refused for good by the remote); malformed %d; repeated submits %d\n",
		r.Published, r.Confirmed, r.Refused, r.Malformed, r.Repeats)
	fmt.Fprintf(w, "  outcomes: completed %d (%d with a branch an N-of-M join spared), failed (compensated) %d, held in error %d\n",
		r.Result.Completed, r.Result.Spared, r.Result.Failed, r.Result.HeldError)
	fmt.Fprintf(w, "  deadlines: %d orders with one of their own, %d passed while they ran (undone); %d running orders moved to another version\n",
		r.WithDeadline, r.DeadlinePassed, r.Migrated)
	var kinds []string
	for k := range r.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprint(w, "  faults injected:")
	for _, k := range kinds {
		fmt.Fprintf(w, " %s %d", k, r.Faults[k])
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  remote: %d actions applied, %d undone, %d effects in all; duplicate attempt rate %.1f%%\n",
		r.Result.Keys, r.Result.UndoEffects, r.Result.Effects, 100*r.Result.DuplicateAttemptRate())
	fmt.Fprintf(w, "  stale replies refused (schedulers alive at the end): %.0f\n", r.StaleReplies)
	fmt.Fprintf(w, "  from faults healed to every order ended: %v\n", r.HealedToQuiet.Round(time.Millisecond))
	fmt.Fprintf(w, "  dead-lettered: %v\n", r.DeadLettered)
	fmt.Fprintf(w, "  unexpected crashes: %d %v\n", len(r.Crashes), r.Crashes)
	for i, l := range r.CrashLogs {
		fmt.Fprintf(w, "    the log of %s ends:\n      %s\n", r.Crashes[i], strings.ReplaceAll(l, "\n", "\n      "))
	}
	lost := 0
	dup := 0
	for _, v := range r.Result.Violations {
		switch v.Invariant {
		case 1:
			lost++
		case 3:
			dup++
		}
	}
	fmt.Fprintf(w, "  lost orders: %d; duplicated effects: %d\n", lost, dup)
	if r.OK() {
		fmt.Fprintln(w, "  every invariant held")
	} else {
		fmt.Fprintf(w, "  %d invariant violations:\n", len(r.Result.Violations))
		for i, v := range r.Result.Violations {
			if i == 50 {
				fmt.Fprintf(w, "    … and %d more\n", len(r.Result.Violations)-50)
				break
			}
			fmt.Fprintf(w, "    %v\n", v)
		}
	}
	fmt.Fprintf(w, "  logs: %s\n", r.LogDir)
}

// slot is one replica of a service; its process is replaced on restart.
type slot struct {
	role, name, binary, addrVar, addr string
	env                               []string

	mu        sync.Mutex
	p         *proc.Proc
	failpoint string // the failpoint the current process runs with
}

func (s *slot) current() *proc.Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p
}

// run is one fault run in progress.
type run struct {
	cfg        Config
	proxies    map[string]*netproxy.Proxy // between the services and postgres, rabbitmq, remote
	rng        *rand.Rand
	rngMu      sync.Mutex
	logger     *slog.Logger
	slots      []*slot
	remote     *slot
	baseFaults string

	mu        sync.Mutex
	faults    map[string]int
	crashes   []string
	crashLogs []string
	healing   sync.WaitGroup
	stores    []*statestore.Store // the harness's own, one a partition, for the pause and migrate faults
	ports     ports               // the services' ports, held for the run
	migrated  int                 // orders the migrate fault moved
	watchers  sync.WaitGroup      // one per started process: reports and restarts it
	stopping  atomic.Bool         // set once the run stops its processes: none is restarted
}

func (r *run) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

// someStore is the store of a partition picked at random (the one store
// of a run without partitions): the pause and migrate faults strike
// either partition, as the others strike either's processes.
func (r *run) someStore() *statestore.Store {
	if len(r.stores) == 1 {
		return r.stores[0] // no draw: a seed's schedule stays what it was
	}
	return r.stores[r.intn(len(r.stores))]
}

func (r *run) count(kind string) {
	r.mu.Lock()
	r.faults[kind]++
	r.mu.Unlock()
}

// crashLogTail is how much of a crashed process's log the report keeps:
// its last few lines.
const crashLogTail = 2048

// start starts s's process (with a failpoint, or none) and watches it: a
// process that dies without being killed is a crash, unless it died at its
// failpoint; either way it is started again.
func (r *run) start(s *slot, failpoint string) error {
	env := s.env
	if failpoint != "" {
		env = append(append([]string{}, env...), "SAS_FAILPOINTS="+failpoint)
	}
	p, err := proc.Start(s.name, filepath.Join(r.cfg.BinDir, s.binary), r.cfg.LogDir, s.addrVar, s.addr, env)
	if err != nil {
		return err
	}
	s.mu.Lock()
	stopping := r.stopping.Load()
	if !stopping {
		s.p, s.failpoint = p, failpoint
	}
	s.mu.Unlock()
	if stopping { // started as the run stopped its processes (stopServices)
		p.Stop(20 * time.Second)
		return nil
	}
	r.watchers.Add(1)
	go func() {
		defer r.watchers.Done()
		<-p.Done()
		if p.Intended() || r.stopping.Load() {
			return
		}
		if failpoint != "" {
			r.count("failpoint:" + failpoint)
		} else {
			r.mu.Lock()
			r.crashes = append(r.crashes, fmt.Sprintf("%s: %v", s.name, p.Err()))
			r.crashLogs = append(r.crashLogs, p.LogTail(crashLogTail))
			r.mu.Unlock()
			r.logger.Error("process crashed", "name", s.name, "err", p.Err())
		}
		if s.current() == p {
			if err := r.start(s, ""); err != nil {
				r.logger.Error("restart failed", "name", s.name, "err", err)
			}
		}
	}()
	return nil
}

// Run performs a fault run and checks it: a schema and queues of the
// run's own, the services started behind proxies, orders published while
// faults are injected, the faults healed, every order waited for, and the
// history checked against the invariants.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) (Report, error) {
	rep := Report{Seed: cfg.Seed, LogDir: cfg.LogDir, DeadLettered: map[string]int{}}
	r := &run{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed)), logger: logger, faults: map[string]int{},
		proxies: map[string]*netproxy.Proxy{}}
	enabled := map[string]bool{}
	for _, f := range cfg.Faults {
		enabled[f] = true
	}

	var stages []*stage
	for range max(cfg.Partitions, 1) {
		w, err := r.prepare(ctx)
		if err != nil {
			return rep, err
		}
		defer w.close(ctx, cfg.Keep, logger)
		stages = append(stages, w)
	}
	w := stages[0]
	for _, st := range stages {
		r.stores = append(r.stores, st.store)
	}
	layout, err := r.partitionLayout(ctx, stages)
	if err != nil {
		return rep, err
	}
	ids := r.chooseOrders(&rep)
	defer r.ports.release() // after the services stop (deferred below)
	defer r.closeProxies()
	defer r.stopServices()
	if err := r.startServices(ctx, stages, layout); err != nil {
		return rep, err
	}
	logger.Info("services up", "processes", len(r.slots), "schema", w.tag, "partitions", len(stages))

	h := History{Confirmed: map[string]bool{}, Malformed: map[string]string{}}
	if err := r.publishUnderFaults(ctx, w, layout, ids, enabled, &h, &rep); err != nil {
		return rep, err
	}
	r.heal(ctx)
	healed := time.Now()
	for i, st := range stages {
		if err := r.waitQuiet(ctx, st.store, ownedBy(layout, i, h.Confirmed), healed.Add(cfg.HealTimeout)); err != nil {
			return rep, err
		}
	}
	rep.HealedToQuiet = time.Since(healed)
	return rep, r.gather(ctx, stages, layout, h, &rep)
}

// partitionLayout writes, for a run of several partitions, their layout
// (each stage a partition) and declares its routing exchange; nil for a
// run of one state store.
func (r *run) partitionLayout(ctx context.Context, stages []*stage) (*partition.Layout, error) {
	if len(stages) < 2 {
		return nil, nil
	}
	raw := fmt.Sprintf("exchange: %sroute\nbuckets: 256\npartitions:\n", stages[0].prefix)
	for i, st := range stages {
		raw += fmt.Sprintf("  - {name: p%d, queue_prefix: %s, database_url_env: SAS_CHAOS_P%d_URL}\n", i+1, st.prefix, i+1)
	}
	file := filepath.Join(r.cfg.LogDir, "partitions.yaml")
	if err := os.WriteFile(file, []byte(raw), 0o644); err != nil {
		return nil, err
	}
	l, err := partition.Load(file)
	if err != nil {
		return nil, err
	}
	ch, err := stages[0].conn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	if err := l.Declare(ch); err != nil {
		return nil, fmt.Errorf("%w (rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)", err)
	}
	stages[0].routing = &l
	return &l, nil
}

// ownedBy is the ids of ids partition i owns (all of them, unpartitioned).
func ownedBy(l *partition.Layout, i int, ids map[string]bool) map[string]bool {
	if l == nil {
		return ids
	}
	out := map[string]bool{}
	for id, v := range ids {
		if l.Owner(l.BucketOf(id)) == i {
			out[id] = v
		}
	}
	return out
}

// stage is what a run sets up before its services start: a schema and a
// queue prefix of its own, migrated, and the harness's own connections.
type stage struct {
	// routing, on the first stage of a partitioned run, is the layout
	// whose exchange and buckets close deletes.
	routing            *partition.Layout
	tag, dbURL, prefix string
	topo               broker.Topology
	admin              *pgxpool.Pool // on the configured search path: creates and drops the schema
	pool               *pgxpool.Pool
	store              *statestore.Store
	conn               *broker.Conn
	pub                *broker.Publisher
}

// prepare creates the run's schema, migrates it and declares its queues.
// On an error, what was made so far is closed again.
func (r *run) prepare(ctx context.Context) (w *stage, err error) {
	cfg := r.cfg
	w = &stage{tag: fmt.Sprintf("chaos_%d_%s", cfg.Seed, strings.ReplaceAll(messages.NewID()[:8], "-", ""))}
	defer func() {
		if err != nil {
			w.close(ctx, cfg.Keep, r.logger)
		}
	}()
	if w.admin, err = pgxpool.New(ctx, cfg.DatabaseURL); err != nil {
		return w, err
	}
	if _, err := w.admin.Exec(ctx, `CREATE SCHEMA `+w.tag); err != nil {
		return w, fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(cfg.DatabaseURL)
	if err != nil {
		return w, err
	}
	q := u.Query()
	q.Set("search_path", w.tag)
	u.RawQuery = q.Encode()
	w.dbURL = u.String()
	w.prefix = strings.ReplaceAll(w.tag, "_", ".") + "."
	qtype := cmp.Or(cfg.QueueType, broker.QueueQuorum)
	w.topo = scheduler.Topology(w.prefix, 10, qtype, workflow.Builtin().Agents())
	w.topo.Inputs = append(w.topo.Inputs, submitter.Input)
	if w.pool, err = statestore.Connect(ctx, w.dbURL, 4); err != nil {
		return w, err
	}
	w.store = statestore.New(w.pool)
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		return w, err
	}
	if _, err := statestore.Migrate(ctx, w.pool, ms); err != nil {
		return w, err
	}
	bm := broker.NewMetrics(nil)
	if w.conn, err = broker.Open(ctx, cfg.AMQPURL, "chaos", w.topo, r.logger, bm); err != nil {
		return w, err
	}
	w.pub = broker.NewPublisher(w.conn, bm)
	return w, nil
}

// close deletes the run's queues and schema, unless kept for inspection,
// and closes the harness's connections.
func (w *stage) close(ctx context.Context, keep bool, logger *slog.Logger) {
	if w.conn != nil {
		if keep {
			logger.Info("kept for inspection", "schema", w.tag, "queue_prefix", w.prefix)
		} else {
			cleanup := context.WithoutCancel(ctx)
			if ch, err := w.conn.Channel(cleanup); err == nil {
				_ = w.topo.Delete(ch)
				if w.routing != nil {
					for b := range w.routing.Buckets {
						_ = ch.ExchangeDelete(w.routing.BucketExchange(b), false, false)
					}
					_ = ch.ExchangeDelete(w.routing.Exchange, false, false)
				}
				ch.Close()
			}
			_, _ = w.admin.Exec(cleanup, `DROP SCHEMA `+w.tag+` CASCADE`)
		}
	}
	if w.pub != nil {
		w.pub.Close()
	}
	if w.conn != nil {
		w.conn.Close()
	}
	if w.pool != nil {
		w.pool.Close()
	}
	if w.admin != nil {
		w.admin.Close()
	}
}

// chooseOrders picks the orders' ids up front, so the remote can refuse
// one in twenty for good, and sets the remote's base faults accordingly.
func (r *run) chooseOrders(rep *Report) []string {
	ids := make([]string, r.cfg.Orders)
	var refused []string
	for i := range ids {
		ids[i] = messages.NewID()
		if r.intn(20) == 0 {
			refused = append(refused, ids[i])
		}
	}
	rep.Refused = len(refused)
	refusedJSON, _ := json.Marshal(refused)
	r.baseFaults = `{"*":{"latency_max_ms":3},"charge_payment":{"latency_max_ms":3,"fail_orders":` + string(refusedJSON) + `}}`
	return ids
}

// viaProxy puts a loopback proxy, which the network fault cuts, in front
// of rawURL's host and returns the URL through it.
func (r *run) viaProxy(name, rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	p, err := netproxy.New(u.Host)
	if err != nil {
		return "", err
	}
	r.proxies[name] = p
	u.Host = p.Addr()
	return u.String(), nil
}

func (r *run) closeProxies() {
	for _, p := range r.proxies {
		p.Close()
	}
}

// GraphWorkflow is the graph a fault run submits beside the built-in
// lists: the reservation and the charge at once, a shipment per item once
// both are done, on the built-in agent kinds.
const GraphWorkflow = "chaos_graph"

const graphWorkflowYAML = `
  # The fault run's graph (chaos.GraphWorkflow).
  - name: chaos_graph
    steps:
      - {action: reserve_inventory, agent: inventory, compensation: {action: release_inventory}}
      - {action: charge_payment, agent: payment, needs: [], compensation: {action: refund_payment}}
      - action: create_shipment
        agent: shipping
        needs: [reserve_inventory, charge_payment]
        for_each: payload.items
        max_parallel: 2
        compensation: {action: cancel_shipment}
  # The fault run's time and children (chaos.TimeWorkflow): a timer alone
  # between the reservation and a child order that charges and ships.
  - name: chaos_time
    steps:
      - {action: reserve_inventory, agent: inventory, compensation: {action: release_inventory}}
      - {action: cooling_off, delay: 300ms}
      - {id: pay_and_ship, workflow: chaos_child}
  # The fault run's steps that never run (chaos.NeverRanWorkflow).
  - name: chaos_never
    steps:
      - {action: reserve_inventory, agent: inventory, compensation: {action: release_inventory}}
      - action: charge_payment
        agent: payment
        needs: [reserve_inventory]
        when: "payload.items.size() > 1 || payload.no_such_field"
        compensation: {action: refund_payment}
      - action: create_shipment
        agent: shipping
        needs: [charge_payment]
        when: "payload.items.size() > 0"
        for_each: "payload.items.size() > 2 ? payload.items : payload.customer"
        compensation: {action: cancel_shipment}
      - id: follow_up
        workflow: chaos_child
        needs: [create_shipment]
        input: "payload.items.size() > 3 ? {'customer': payload.customer} : payload.items"
  # The fault run's N-of-M join (chaos.QuorumWorkflow): three branches
  # at once, the confirmation once any two ended well; the charge is
  # refused for one order in twenty, a branch the join can spare.
  - name: chaos_quorum
    steps:
      - {action: reserve_inventory, agent: inventory, compensation: {action: release_inventory}}
      - {action: charge_payment, agent: payment, needs: [], compensation: {action: refund_payment}}
      - {action: create_shipment, agent: shipping, needs: [], compensation: {action: cancel_shipment}}
      - action: confirm_order
        agent: inventory
        needs: {any: 2, of: [reserve_inventory, charge_payment, create_shipment]}
        compensation: {action: unconfirm_order}
  - name: chaos_child
    steps:
      - {action: charge_payment, agent: payment, compensation: {action: refund_payment}}
      - {action: create_shipment, agent: shipping, compensation: {action: cancel_shipment}}
`

// TimeWorkflow is the fault run's workflow with a timer and a child
// order (a sub-process), on the built-in agent kinds.
const TimeWorkflow = "chaos_time"

// NeverRanWorkflow is the fault run's graph whose steps sas fails before
// any request of them leaves, by the order's item count: with one item
// the charge's when fails; with two the shipments' for_each yields no
// list; with three the child's input is no object. Each order is undone,
// and no compensation may run for the step that never ran. With four,
// every step runs and the order completes.
const NeverRanWorkflow = "chaos_never"

// QuorumWorkflow is the fault run's graph with an N-of-M join, on the
// built-in agent kinds.
const QuorumWorkflow = "chaos_quorum"

// startServices starts the remote and two replicas of each service, which
// reach Postgres, RabbitMQ and the remote through proxies (the harness
// itself connects directly), and waits until each is ready.
func (r *run) startServices(ctx context.Context, stages []*stage, layout *partition.Layout) error {
	cfg := r.cfg
	svcAMQP, err := r.viaProxy("rabbitmq", cfg.AMQPURL)
	if err != nil {
		return err
	}
	// The built-in workflows and a graph beside them (GraphWorkflow).
	wfFile := filepath.Join(cfg.LogDir, "workflows.yaml")
	if err := os.WriteFile(wfFile, append(workflow.BuiltinYAML(), graphWorkflowYAML...), 0o644); err != nil {
		return err
	}
	port := cfg.PortBase
	add := func(common []string, role, suffix, binary, addrVar string, n int, env ...string) error {
		for i := range n {
			addr := ""
			if cfg.PortBase == 0 {
				if addr, err = r.ports.free(); err != nil {
					return err
				}
			} else {
				port++
				addr = fmt.Sprintf("127.0.0.1:%d", port)
			}
			name := fmt.Sprintf("%s-%d%s", role, i+1, suffix)
			r.slots = append(r.slots, &slot{role: role, name: name, binary: binary, addrVar: addrVar,
				addr: addr, env: append(append(append([]string{}, common...), "SAS_INSTANCE_ID="+name), env...)})
		}
		return nil
	}
	var remoteURL string
	for i, w := range stages {
		// Each partition's database behind a proxy of its own.
		proxy, suffix := "postgres", ""
		if layout != nil && i > 0 {
			proxy, suffix = fmt.Sprintf("postgres-p%d", i+1), fmt.Sprintf("-p%d", i+1)
		}
		svcDB, err := r.viaProxy(proxy, w.dbURL)
		if err != nil {
			return err
		}
		common := append([]string{"SAS_DATABASE_URL=" + svcDB, "SAS_AMQP_URL=" + svcAMQP, "SAS_QUEUE_PREFIX=" + w.prefix, "SAS_LOG_LEVEL=info",
			"SAS_QUEUE_TYPE=" + w.topo.QueueType,
			"SAS_WORKFLOWS_FILE=" + wfFile}, cfg.Env...)
		if layout != nil {
			common = append(common, "SAS_PARTITIONS_FILE="+filepath.Join(cfg.LogDir, "partitions.yaml"), fmt.Sprintf("SAS_PARTITION=p%d", i+1))
		}
		if i == 0 {
			// One remote service for every partition.
			if err := add(common, "remote", "", "remote", "SAS_REMOTE_ADDR", 1, "SAS_REMOTE_FAULTS="+r.baseFaults, fmt.Sprintf("SAS_REMOTE_SEED=%d", cfg.Seed)); err != nil {
				return err
			}
			r.remote = r.slots[0]
			if remoteURL, err = r.viaProxy("remote", "http://"+r.remote.addr); err != nil {
				return err
			}
		}
		for _, a := range []struct {
			role, addrVar string
			env           []string
		}{
			{"submitter", "SAS_METRICS_ADDR", []string{"SAS_STEP_TIMEOUT=" + cfg.StepTimeout.String()}},
			{"scheduler", "SAS_METRICS_ADDR", []string{"SAS_SCHEDULER_POLL_INTERVAL=200ms"}},
			{"agent", "SAS_METRICS_ADDR", []string{"SAS_REMOTE_URL=" + remoteURL}},
			{"supervisor", "SAS_METRICS_ADDR", []string{"SAS_SUPERVISOR_INTERVAL=200ms", "SAS_SUPERVISOR_LEASE_TTL=1s",
				"SAS_SUPERVISOR_BACKOFF_BASE=100ms", "SAS_SUPERVISOR_BACKOFF_MAX=1s"}},
		} {
			if err := add(common, a.role, suffix, a.role, a.addrVar, 2, a.env...); err != nil {
				return err
			}
		}
	}
	for _, s := range r.slots {
		if err := r.start(s, ""); err != nil {
			return err
		}
	}
	for _, s := range r.slots {
		if err := s.current().WaitReady(ctx, time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// stopServices stops every process, last started first, and waits for
// the watchers that restart them.
func (r *run) stopServices() {
	r.stopping.Store(true)
	for i := len(r.slots) - 1; i >= 0; i-- {
		if p := r.slots[i].current(); p != nil {
			p.Stop(20 * time.Second)
		}
	}
	r.watchers.Wait()
}

// publishUnderFaults publishes the orders while faults are injected, and
// returns when both are done.
func (r *run) publishUnderFaults(ctx context.Context, w *stage, layout *partition.Layout, ids []string, enabled map[string]bool, h *History, rep *Report) error {
	published := make(chan struct{})
	var pubErr error
	go func() {
		defer close(published)
		pubErr = r.publish(ctx, w.pub, w.topo, layout, ids, enabled, h.Confirmed, h.Malformed, rep)
	}()
	r.injectFaults(ctx, enabled, published)
	<-published
	r.healing.Wait()
	return pubErr
}

// heal turns every fault off: proxies up and fast, the remote back to its
// base faults, frozen processes thawed and ready.
func (r *run) heal(ctx context.Context) {
	for _, p := range r.proxies {
		p.SetDown(false)
		p.SetLatency(0)
	}
	r.setFaults(ctx, r.baseFaults)
	for _, s := range r.slots {
		p := s.current()
		_ = p.Signal(syscall.SIGCONT)
		if err := p.WaitReady(ctx, time.Minute); err != nil {
			r.logger.Warn("not ready after healing", "name", s.name, "err", err)
		}
	}
}

// waitQuiet waits until every order and outbox row has ended, or the
// deadline passes (which the check then reports as unended orders).
func (r *run) waitQuiet(ctx context.Context, store *statestore.Store, confirmed map[string]bool, deadline time.Time) error {
	r.logger.Info("faults healed; waiting for every order to be written and to end")
	// The orders the broker confirmed and the store does not hold yet: a
	// submitter riding out the faults may still have them in hand, and
	// every order ended means theirs too.
	coming := make(map[string]bool, len(confirmed))
	for id := range confirmed {
		coming[id] = true
	}
	for {
		for id := range coming {
			if _, found, err := store.NamespaceOf(ctx, id); err == nil && found {
				delete(coming, id)
			}
		}
		orders, outbox, err := store.Unfinished(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			r.logger.Warn("reading progress failed; again", "err", err)
		} else if orders == 0 && outbox == 0 && len(coming) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			r.logger.Error("orders did not all end in time", "unfinished", orders, "outbox", outbox, "not_written", len(coming))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// gather reads the run's history (dead letters, the audit, the remote's
// ledger, the schedulers' stale-reply counts) and checks it.
func (r *run) gather(ctx context.Context, stages []*stage, layout *partition.Layout, h History, rep *Report) error {
	h.DeadLettered = map[string]string{}
	for _, w := range stages {
		dead, err := drainDeadLetters(ctx, w.conn, w.topo.DeadLetterQueue(submitter.Input))
		if err != nil {
			return err
		}
		for id, reason := range dead {
			rep.DeadLettered[reason]++
			h.DeadLettered[id] = reason
		}
	}
	ledger, err := fetchLedger(ctx, r.remote.addr)
	if err != nil {
		return err
	}
	for _, s := range r.slots {
		if s.role == "scheduler" {
			rep.StaleReplies += scrape(s.current().Addr, "sas_stale_replies_total")
		}
	}
	audits := make([]statestore.Audit, len(stages))
	where := map[string]int{} // order id: the partition holding it
	var across []Violation
	for i, w := range stages {
		if audits[i], err = w.store.ReadAudit(ctx); err != nil {
			return err
		}
		var passed int
		if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM order_deadlines WHERE outcome = 'compensate'`).Scan(&passed); err != nil {
			return err
		}
		rep.DeadlinePassed += passed
		for _, o := range audits[i].Orders {
			if j, twice := where[o.OrderID]; twice {
				across = append(across, Violation{1, fmt.Sprintf("order %s is in partitions p%d and p%d", o.OrderID, j+1, i+1)})
			}
			where[o.OrderID] = i
			// A submitted order is in the partition its id names (a
			// child is in its parent's).
			if layout != nil && h.Confirmed[o.OrderID] && layout.Owner(layout.BucketOf(o.OrderID)) != i {
				across = append(across, Violation{1, fmt.Sprintf("order %s is in partition p%d, its id names %s", o.OrderID, i+1, layout.Partitions[layout.Owner(layout.BucketOf(o.OrderID))].Name)})
			}
		}
	}
	rep.Confirmed = len(h.Confirmed)
	rep.Malformed = len(h.Malformed)
	if layout == nil {
		rep.Result = Check(h, audits[0], ledger)
	} else {
		// Each partition's history against its own store and the
		// ledger's effects on its orders; the malformed messages in the
		// first's (their dead letters gathered from every partition).
		for i := range stages {
			mine := History{Confirmed: ownedBy(layout, i, h.Confirmed), Malformed: map[string]string{}, DeadLettered: h.DeadLettered}
			if i == 0 {
				mine.Malformed = h.Malformed
			}
			var effects []remote.Entry
			for _, e := range ledger {
				if j, ok := where[e.OrderID]; ok && j == i {
					effects = append(effects, e)
				}
			}
			res := Check(mine, audits[i], effects)
			for k := range res.Violations {
				res.Violations[k].Detail = fmt.Sprintf("partition p%d: %s", i+1, res.Violations[k].Detail)
			}
			rep.Result = sumResults(rep.Result, res)
		}
		for _, e := range ledger {
			if _, ok := where[e.OrderID]; !ok {
				across = append(across, Violation{7, fmt.Sprintf("effect %s for order %s that is in no partition", e.Key, e.OrderID)})
			}
		}
		rep.Result.Violations = append(rep.Result.Violations, across...)
	}
	r.mu.Lock()
	rep.Faults, rep.Crashes, rep.CrashLogs = r.faults, r.crashes, r.crashLogs
	rep.Migrated = r.migrated
	r.mu.Unlock()
	return nil
}

// sumResults adds one partition's result to the others'.
func sumResults(a, b Result) Result {
	a.Confirmed += b.Confirmed
	a.Completed += b.Completed
	a.Failed += b.Failed
	a.HeldError += b.HeldError
	a.Spared += b.Spared
	a.Keys += b.Keys
	a.Effects += b.Effects
	a.Requests += b.Requests
	a.UndoEffects += b.UndoEffects
	a.Violations = append(a.Violations, b.Violations...)
	return a
}

// publish sends the orders at cfg.Rate with publisher confirms, with
// malformed messages and repeated submits mixed in.
func (r *run) publish(ctx context.Context, pub *broker.Publisher, topo broker.Topology, layout *partition.Layout, ids []string, enabled map[string]bool,
	confirmed map[string]bool, malformed map[string]string, rep *Report) error {
	queue := topo.Queue(submitter.Input)
	tick := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Rate))
	defer tick.Stop()
	catalogue := badinput.SubmitOrders(messages.NewID)
	send := func(id, contentType string, body []byte) error {
		for {
			exchange, key := "", queue
			if layout != nil {
				// Through the routing exchange, the id as routing key.
				exchange, key = layout.Exchange, id
			}
			err := pub.Publish(ctx, exchange, key, amqp.Publishing{ContentType: contentType, MessageId: id, Body: body})
			if err == nil || ctx.Err() != nil {
				return err
			}
			r.logger.Warn("publish failed; again", "id", id, "err", err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	bodies := map[string][]byte{}
	for i, id := range ids {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		wf := ""
		switch r.intn(6) {
		case 0:
			wf = "single"
		case 1:
			wf = GraphWorkflow
		case 2:
			wf = TimeWorkflow
		case 3:
			wf = NeverRanWorkflow
		case 4:
			wf = QuorumWorkflow
		}
		items := []messages.Item{{SKU: "SKU-1", Qty: 1}}
		switch wf {
		case GraphWorkflow:
			for k := range r.intn(3) {
				items = append(items, messages.Item{SKU: fmt.Sprintf("SKU-%d", k+2), Qty: 1})
			}
		case NeverRanWorkflow:
			for k := range r.intn(4) {
				items = append(items, messages.Item{SKU: fmt.Sprintf("SKU-%d", k+2), Qty: 1})
			}
		}
		o := messages.SubmitOrder{SchemaVersion: 1, OrderID: id, Customer: "chaos", Items: items,
			Amount: 100, Currency: "EUR", Workflow: wf}
		if i%DeadlineEvery == DeadlineEvery-1 {
			// A deadline of its own: under faults some pass while a step
			// is in flight, and the order is undone.
			o.Deadline = "2s"
			rep.WithDeadline++
		}
		body, err := messages.Encode(o)
		if err != nil {
			return err
		}
		if err := send(id, messages.ContentType, body); err != nil {
			return err
		}
		rep.Published++
		confirmed[id] = true
		bodies[id] = body
		if enabled[FaultPoison] && i%25 == 0 {
			c := catalogue[(i/25)%len(catalogue)]
			mid := fmt.Sprintf("bad-%d", i)
			ct := c.ContentType
			if ct == "" {
				ct = messages.ContentType
			}
			if err := send(mid, ct, c.Body); err != nil {
				return err
			}
			malformed[mid] = c.Reason
			r.count(FaultPoison)
		}
		if enabled[FaultDuplicate] && i%20 == 10 {
			again := ids[r.intn(i+1)]
			if err := send(again, messages.ContentType, bodies[again]); err != nil {
				return err
			}
			rep.Repeats++
			r.count(FaultDuplicate)
		}
	}
	return nil
}

// MigratedTimeYAML is the version of the time workflow the migrate
// fault moves running orders to: an audit once the child has paid and
// shipped.
const MigratedTimeYAML = `
workflows:
  - name: chaos_time
    steps:
      - {action: reserve_inventory, agent: inventory, compensation: {action: release_inventory}}
      - {action: cooling_off, delay: 300ms}
      - {id: pay_and_ship, workflow: chaos_child}
      - {action: audit_order, agent: inventory, compensation: {action: unaudit_order}}
  - name: chaos_child
    steps:
      - {action: charge_payment, agent: payment, compensation: {action: refund_payment}}
      - {action: create_shipment, agent: shipping, compensation: {action: cancel_shipment}}
`

// migrate moves up to 50 running orders of the time workflow to
// MigratedTimeYAML's version; it returns how many moved and how many
// stayed (each with why, as MigrateOrder says).
func (r *run) migrate(ctx context.Context) (moved, left int, err error) {
	reg, err := workflow.Parse("migrated.yaml", []byte(MigratedTimeYAML))
	if err != nil {
		return 0, 0, err
	}
	wf, _ := reg.Lookup(TimeWorkflow)
	store := r.someStore()
	ids, err := store.RunningOrders(ctx, TimeWorkflow, wf.Version(), 50)
	if err != nil {
		return 0, 0, err
	}
	verdicts, err := store.MigrateOrders(ctx, ids, wf, true, "chaos")
	if err != nil {
		return 0, 0, err
	}
	for _, v := range verdicts {
		if v.Moved {
			moved++
		} else {
			left++
		}
	}
	return moved, left, nil
}

// DeadlineEvery: one order in this many is published with a deadline of
// its own (2 s).
const DeadlineEvery = 8

// injectFaults injects a fault every 0.3 to 1.5 s until published closes.
func (r *run) injectFaults(ctx context.Context, enabled map[string]bool, published <-chan struct{}) {
	var kinds []string
	for _, k := range []string{FaultKill, FaultFailpoint, FaultStop, FaultRemote, FaultNetwork, FaultBrokerRestart, FaultDBRestart, FaultPause, FaultMigrate} {
		if enabled[k] {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		<-published
		return
	}
	// pick chooses a replica of one of roles whose process is running (one
	// waiting to be restarted is left alone).
	pick := func(roles ...string) *slot {
		var c []*slot
		for _, s := range r.slots {
			for _, role := range roles {
				if s.role == role && !s.current().Exited() {
					c = append(c, s)
				}
			}
		}
		if len(c) == 0 {
			return nil
		}
		return c[r.intn(len(c))]
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-published:
			return
		case <-time.After(time.Duration(300+r.intn(1200)) * time.Millisecond):
		}
		switch kind := kinds[r.intn(len(kinds))]; kind {
		case FaultMigrate:
			moved, left, err := r.migrate(ctx)
			if err != nil {
				r.logger.Warn("moving orders failed", "err", err)
				continue
			}
			r.count(FaultMigrate)
			r.mu.Lock()
			r.migrated += moved
			r.mu.Unlock()
			r.logger.Info("moved running orders to another version", "workflow", TimeWorkflow, "moved", moved, "left", left)
		case FaultPause:
			wf := []string{workflow.DefaultName, "single", GraphWorkflow, TimeWorkflow}[r.intn(4)]
			d := time.Duration(200+r.intn(1800)) * time.Millisecond
			store := r.someStore()
			if _, err := store.PauseWorkflow(ctx, wf, "chaos", "chaos"); err != nil {
				r.logger.Warn("pausing a workflow failed", "workflow", wf, "err", err)
				continue
			}
			r.count(FaultPause + ":" + wf)
			r.healing.Go(func() {
				select {
				case <-ctx.Done():
				case <-time.After(d):
				}
				for {
					_, err := store.ResumeWorkflow(context.WithoutCancel(ctx), wf, "chaos")
					if err == nil || errors.Is(err, statestore.ErrInvalidState) {
						return
					}
					r.logger.Warn("resuming a workflow failed; again", "workflow", wf, "err", err)
					time.Sleep(200 * time.Millisecond)
				}
			})
		case FaultKill:
			roles := r.cfg.KillRoles
			if len(roles) == 0 {
				roles = []string{"submitter", "scheduler", "agent", "supervisor"}
			}
			s := pick(roles...)
			if s == nil {
				continue
			}
			s.current().Kill()
			r.count(FaultKill + ":" + s.role)
			r.healing.Add(1)
			go func() {
				defer r.healing.Done()
				time.Sleep(time.Duration(100+r.intn(900)) * time.Millisecond)
				if err := r.start(s, ""); err != nil {
					r.logger.Error("restart failed", "name", s.name, "err", err)
				}
			}()
		case FaultFailpoint:
			var s *slot
			var fp string
			switch r.intn(3) {
			case 0:
				s, fp = pick("scheduler"), "scheduler-after-claim"
			case 1:
				s, fp = pick("agent"), "agent-after-call"
			default:
				s, fp = pick("submitter"), "submitter-after-commit"
			}
			if s == nil {
				continue
			}
			s.current().Kill()
			if err := r.start(s, fp); err != nil {
				r.logger.Error("restart with failpoint failed", "name", s.name, "err", err)
			}
		case FaultStop:
			roles := r.cfg.StopRoles
			if len(roles) == 0 {
				roles = []string{"scheduler", "agent"}
			}
			s := pick(roles...)
			if s == nil {
				continue
			}
			p := s.current()
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				continue
			}
			r.count(FaultStop + ":" + s.role)
			r.healing.Add(1)
			go func() {
				defer r.healing.Done()
				time.Sleep(r.cfg.StepTimeout + 500*time.Millisecond)
				_ = p.Signal(syscall.SIGCONT)
			}()
		case FaultNetwork:
			names := slices.Sorted(maps.Keys(r.proxies))
			name := names[r.intn(len(names))]
			p := r.proxies[name]
			switch r.intn(3) {
			case 0:
				p.Sever()
				r.count(FaultNetwork + ":" + name + ":cut")
				continue
			case 1:
				p.SetDown(true)
				r.count(FaultNetwork + ":" + name + ":down")
			default:
				p.SetLatency(time.Duration(100+r.intn(400)) * time.Millisecond)
				r.count(FaultNetwork + ":" + name + ":slow")
			}
			r.healing.Add(1)
			go func() {
				defer r.healing.Done()
				time.Sleep(time.Duration(500+r.intn(1500)) * time.Millisecond)
				p.SetDown(false)
				p.SetLatency(0)
			}()
		case FaultBrokerRestart, FaultDBRestart:
			// One restart at a time, and not too often: each takes seconds.
			r.count(kind)
			r.healing.Add(1)
			func() {
				defer r.healing.Done()
				if err := restart(ctx, kind); err != nil {
					r.logger.Error("restart failed", "kind", kind, "err", err)
				}
			}()
		case FaultRemote:
			r.count(FaultRemote)
			r.setFaults(ctx, strings.Replace(r.baseFaults, `"*":{"latency_max_ms":3}`,
				`"*":{"latency_max_ms":3,"error_rate":0.3,"rate_limit_rate":0.05,"retry_after_s":1,"hang_rate":0.05,"hang_ms":500,"apply_then_fail_rate":0.1}`, 1))
			r.healing.Add(1)
			go func() {
				defer r.healing.Done()
				time.Sleep(time.Duration(1000+r.intn(2000)) * time.Millisecond)
				r.setFaults(ctx, r.baseFaults)
			}()
		}
	}
}

// restart restarts the local RabbitMQ or PostgreSQL and waits until it
// answers again.
func restart(ctx context.Context, kind string) error {
	run := func(name string, args ...string) error {
		out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %v: %v: %s", name, args, err, out)
		}
		return nil
	}
	waitFor := func(name string, args ...string) error {
		for range 120 {
			if exec.CommandContext(ctx, name, args...).Run() == nil {
				return nil
			}
			time.Sleep(500 * time.Millisecond)
		}
		return fmt.Errorf("%s did not come back", name)
	}
	switch kind {
	case FaultBrokerRestart:
		if err := run("rabbitmqctl", "stop_app"); err != nil {
			return err
		}
		time.Sleep(time.Second)
		if err := run("rabbitmqctl", "start_app"); err != nil {
			return err
		}
		return waitFor("rabbitmq-diagnostics", "-q", "check_port_connectivity")
	case FaultDBRestart:
		versions, err := filepath.Glob("/etc/postgresql/*")
		if err != nil || len(versions) == 0 {
			return fmt.Errorf("no PostgreSQL cluster found under /etc/postgresql")
		}
		version := filepath.Base(versions[len(versions)-1])
		if err := run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "stop", "-m", "immediate"); err != nil {
			return err
		}
		time.Sleep(time.Second)
		if err := run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"); err != nil {
			return err
		}
		return waitFor("pg_isready", "-q", "-h", "127.0.0.1")
	}
	return nil
}

// ephemeralPortsFrom is the first port of the kernel's ephemeral range
// (Linux's default when it cannot be read).
func ephemeralPortsFrom() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}

func (r *run) setFaults(ctx context.Context, faults string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+r.remote.addr+"/admin/faults", strings.NewReader(faults))
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.logger.Warn("set remote faults", "err", err)
		return
	}
	resp.Body.Close()
}

func drainDeadLetters(ctx context.Context, conn *broker.Conn, queue string) (map[string]string, error) {
	ch, err := conn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	out := map[string]string{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", queue, err)
		}
		if !ok {
			return out, nil
		}
		reason, _ := d.Headers[broker.HeaderErrorReason].(string)
		out[d.MessageId] = reason
	}
}

func fetchLedger(ctx context.Context, addr string) ([]remote.Entry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/ledger", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the remote ledger: %w", err)
	}
	defer resp.Body.Close()
	var l []remote.Entry
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, fmt.Errorf("read the remote ledger: %w", err)
	}
	return l, nil
}

func scrape(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
				total += v
			}
		}
	}
	return total
}
