// Package localstack runs every sas service on this machine as
// processes, for sasctl dev and the benchmark: the demo remote service, a
// submitter, schedulers, agents, a supervisor, optionally the console and
// a local Prometheus.
package localstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sas/internal/harness/proc"
)

// Options shapes a local run of every service (sasctl dev and the benchmark).
type Options struct {
	BinDir     string // the sas binaries; "" means sasctl's own directory
	Schedulers int
	Agents     int
	Faults     string // the remote service's fault injection (JSON)
	PortBase   int    // submitter +1, schedulers +2, +12, …, agents +3, +13, …, supervisor +4, remote +5, console +6, api +8
	PromPort   int    // a local Prometheus, if installed (0: none)
	Rules      string // its alert rules, if the file exists
	// Env is added to every service's environment (e.g. tuning variables).
	Env []string
	// ConsolePort, when not 0, runs the web console there (its metrics on
	// port base +6), with the users of ConsoleUsers (a users file).
	ConsolePort  int
	ConsoleUsers string
	// APIPort, when not 0, runs the HTTP API there (its metrics on port
	// base +8).
	APIPort int
	// DebugOffset, when not 0, serves each service's profiler on its own
	// port plus this offset (SAS_DEBUG_ADDR).
	DebugOffset int
	// HoldWorkers starts no scheduler and no agent: StartWorkers does,
	// later (a backlog built while they are stopped).
	HoldWorkers bool
}

// Stack is the running services, in start order.
type Stack struct {
	Procs   []*proc.Proc
	ByName  map[string][]*proc.Proc // by service: submitter, scheduler, agent, supervisor, remote
	Logs    string
	PromURL string
	// StartWorkers starts the schedulers and agents held back by
	// HoldWorkers and waits until they are ready.
	StartWorkers func(ctx context.Context) error
}

// Stop ends every process, last started first, each with SIGTERM and,
// after 30 s, SIGKILL.
func (s *Stack) Stop() {
	for i := len(s.Procs) - 1; i >= 0; i-- {
		s.Procs[i].Stop(30 * time.Second)
	}
}

// Exited returns an error naming a process that ended, if one did.
func (s *Stack) Exited() error {
	for _, p := range s.Procs {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v (log: %s)", p.Name, p.Err(), p.Log)
		}
	}
	return nil
}

// Start runs the remote service, a submitter, the schedulers, the
// agents and a supervisor, waits until each is ready, and starts a local
// Prometheus when asked and installed. On error what was started is
// stopped.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	if o.BinDir == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.BinDir = filepath.Dir(self)
	}
	logs, err := os.MkdirTemp("", "sas-dev-")
	if err != nil {
		return nil, err
	}
	s := &Stack{ByName: map[string][]*proc.Proc{}, Logs: logs}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	start := func(service, name, addrVar string, port int, env ...string) (*proc.Proc, error) {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		env = append(append(env, o.Env...), "SAS_INSTANCE_ID="+name)
		if o.DebugOffset != 0 {
			env = append(env, fmt.Sprintf("SAS_DEBUG_ADDR=127.0.0.1:%d", port+o.DebugOffset))
		}
		p, err := proc.Start(name, filepath.Join(o.BinDir, service), logs, addrVar, addr, env)
		if err != nil {
			return nil, fmt.Errorf("%w; run `make build` first", err)
		}
		s.Procs = append(s.Procs, p)
		s.ByName[service] = append(s.ByName[service], p)
		return p, nil
	}
	remote, err := start("remote", "remote", "SAS_REMOTE_ADDR", o.PortBase+5, "SAS_REMOTE_FAULTS="+o.Faults)
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
		{"scheduler", o.Schedulers, o.PortBase + 2, nil},
		{"agent", o.Agents, o.PortBase + 3, []string{"SAS_REMOTE_URL=http://" + remote.Addr}},
	}
	services := []service{{"submitter", 1, o.PortBase + 1, nil}, {"supervisor", 1, o.PortBase + 4, nil}}
	if !o.HoldWorkers {
		services = append(services[:1], append(workers, services[1:]...)...)
	}
	if err := run(services); err != nil {
		return nil, err
	}
	s.StartWorkers = func(ctx context.Context) error {
		if !o.HoldWorkers {
			return nil
		}
		held := len(s.Procs)
		if err := run(workers); err != nil {
			return err
		}
		for _, p := range s.Procs[held:] {
			if err := p.WaitReady(ctx, 60*time.Second); err != nil {
				return err
			}
		}
		return nil
	}
	if o.ConsolePort != 0 {
		if _, err := start("console", "console", "SAS_METRICS_ADDR", o.PortBase+6,
			fmt.Sprintf("SAS_CONSOLE_ADDR=127.0.0.1:%d", o.ConsolePort), "SAS_CONSOLE_USERS_FILE="+o.ConsoleUsers); err != nil {
			return nil, err
		}
	}
	if o.APIPort != 0 {
		if _, err := start("api", "api", "SAS_METRICS_ADDR", o.PortBase+8, fmt.Sprintf("SAS_API_ADDR=127.0.0.1:%d", o.APIPort)); err != nil {
			return nil, err
		}
	}
	for _, p := range s.Procs {
		if err := p.WaitReady(ctx, 60*time.Second); err != nil {
			return nil, err
		}
	}
	if o.PromPort > 0 {
		if path, err := exec.LookPath("prometheus"); err == nil {
			p, err := startPrometheus(path, logs, o.PromPort, o.Rules, s.Procs)
			if err != nil {
				return nil, err
			}
			s.Procs = append(s.Procs, p)
			s.PromURL = "http://" + p.Addr
		}
	}
	return s, nil
}

// startPrometheus runs a local Prometheus scraping every service.
func startPrometheus(path, logs string, port int, rules string, procs []*proc.Proc) (*proc.Proc, error) {
	var b strings.Builder
	b.WriteString("global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n")
	if abs, err := filepath.Abs(rules); err == nil {
		if _, err := os.Stat(abs); err == nil {
			fmt.Fprintf(&b, "rule_files:\n  - %q\n", abs)
		}
	}
	b.WriteString("scrape_configs:\n")
	jobs := map[string][]string{}
	var order []string
	for _, p := range procs {
		job := "sas-" + strings.TrimRight(strings.TrimRight(p.Name, "0123456789"), "-")
		if _, seen := jobs[job]; !seen {
			order = append(order, job)
		}
		jobs[job] = append(jobs[job], p.Addr)
	}
	for _, job := range order {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n      - targets: [%s]\n", job, `"`+strings.Join(jobs[job], `", "`)+`"`)
	}
	cfg := filepath.Join(logs, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return proc.StartCommand("prometheus", []string{path, "--config.file=" + cfg, "--web.listen-address=" + addr,
		"--storage.tsdb.path=" + filepath.Join(logs, "prometheus-data")}, logs, addr, nil)
}
