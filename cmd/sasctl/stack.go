package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"sas/internal/harness/proc"
	"sas/internal/statestore"
	"sas/migrations"
)

// stackOptions shapes a local run of every service (sasctl dev and bench).
type stackOptions struct {
	binDir     string // the sas binaries; "" means sasctl's own directory
	schedulers int
	agents     int
	faults     string // the remote service's fault injection (JSON)
	portBase   int    // submitter +1, schedulers +2, +12, …, agents +3, +13, …, supervisor +4, remote +5, console +6
	promPort   int    // a local Prometheus, if installed (0: none)
	rules      string // its alert rules, if the file exists
	// env is added to every service's environment (e.g. tuning variables).
	env []string
	// consolePort, when not 0, runs the web console there (its metrics on
	// port base +6), with the users of consoleUsers (a users file).
	consolePort  int
	consoleUsers string
	// debugOffset, when not 0, serves each service's profiler on its own
	// port plus this offset (SAS_DEBUG_ADDR).
	debugOffset int
	// holdWorkers starts no scheduler and no agent: startWorkers does,
	// later (a backlog built while they are stopped).
	holdWorkers bool
}

// stack is the running services, in start order.
type stack struct {
	procs   []*proc.Proc
	byName  map[string][]*proc.Proc // by service: submitter, scheduler, agent, supervisor, remote
	logs    string
	promURL string
	// startWorkers starts the schedulers and agents held back by
	// holdWorkers and waits until they are ready.
	startWorkers func(ctx context.Context) error
}

// stop ends every process, last started first, each with SIGTERM and,
// after 30 s, SIGKILL.
func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].Stop(30 * time.Second)
	}
}

// exited returns an error naming a process that ended, if one did.
func (s *stack) exited() error {
	for _, p := range s.procs {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v (log: %s)", p.Name, p.Err(), p.Log)
		}
	}
	return nil
}

// migrate applies the migrations and returns a store on a small pool the
// caller closes.
func (a *app) migrateAndOpen(ctx context.Context) (*statestore.Store, func(), error) {
	migrateCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	o := a.cfg.Database(4)
	o.LockTimeout = 0
	pool, err := a.poolWith(migrateCtx, o)
	if err != nil {
		return nil, nil, err
	}
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err == nil {
		_, err = statestore.Migrate(migrateCtx, pool, ms)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return statestore.New(pool), pool.Close, nil
}

// startStack runs the remote service, a submitter, the schedulers, the
// agents and a supervisor, waits until each is ready, and starts a local
// Prometheus when asked and installed. On error what was started is
// stopped.
func startStack(ctx context.Context, o stackOptions) (_ *stack, err error) {
	if o.binDir == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.binDir = filepath.Dir(self)
	}
	logs, err := os.MkdirTemp("", "sas-dev-")
	if err != nil {
		return nil, err
	}
	s := &stack{byName: map[string][]*proc.Proc{}, logs: logs}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	start := func(service, name, addrVar string, port int, env ...string) (*proc.Proc, error) {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		env = append(append(env, o.env...), "SAS_INSTANCE_ID="+name)
		if o.debugOffset != 0 {
			env = append(env, fmt.Sprintf("SAS_DEBUG_ADDR=127.0.0.1:%d", port+o.debugOffset))
		}
		p, err := proc.Start(name, filepath.Join(o.binDir, service), logs, addrVar, addr, env)
		if err != nil {
			return nil, fmt.Errorf("%w; run `make build` first", err)
		}
		s.procs = append(s.procs, p)
		s.byName[service] = append(s.byName[service], p)
		return p, nil
	}
	remote, err := start("remote", "remote", "SAS_REMOTE_ADDR", o.portBase+5, "SAS_REMOTE_FAULTS="+o.faults)
	if err != nil {
		return nil, err
	}
	type service struct {
		name    string
		n, port int
		env     []string
	}
	run := func(services []service) error {
		for _, svc := range services {
			for i := range svc.n {
				name := svc.name
				if svc.n > 1 {
					name = fmt.Sprintf("%s-%d", svc.name, i+1)
				}
				if _, err := start(svc.name, name, "SAS_METRICS_ADDR", svc.port+10*i, svc.env...); err != nil {
					return err
				}
			}
		}
		return nil
	}
	workers := []service{
		{"scheduler", o.schedulers, o.portBase + 2, nil},
		{"agent", o.agents, o.portBase + 3, []string{"SAS_REMOTE_URL=http://" + remote.Addr}},
	}
	services := []service{{"submitter", 1, o.portBase + 1, nil}, {"supervisor", 1, o.portBase + 4, nil}}
	if !o.holdWorkers {
		services = append(services[:1], append(workers, services[1:]...)...)
	}
	if err := run(services); err != nil {
		return nil, err
	}
	s.startWorkers = func(ctx context.Context) error {
		if !o.holdWorkers {
			return nil
		}
		held := len(s.procs)
		if err := run(workers); err != nil {
			return err
		}
		for _, p := range s.procs[held:] {
			if err := p.WaitReady(ctx, 60*time.Second); err != nil {
				return err
			}
		}
		return nil
	}
	if o.consolePort != 0 {
		if _, err := start("console", "console", "SAS_METRICS_ADDR", o.portBase+6,
			fmt.Sprintf("SAS_CONSOLE_ADDR=127.0.0.1:%d", o.consolePort), "SAS_CONSOLE_USERS_FILE="+o.consoleUsers); err != nil {
			return nil, err
		}
	}
	for _, p := range s.procs {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	if o.promPort > 0 {
		if path, err := exec.LookPath("prometheus"); err == nil {
			p, err := startPrometheus(path, logs, o.promPort, o.rules, s.procs)
			if err != nil {
				return nil, err
			}
			s.procs = append(s.procs, p)
			s.promURL = "http://" + p.Addr
		}
	}
	return s, nil
}
