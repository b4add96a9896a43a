package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"

	"sas/internal/broker"
	"sas/internal/harness/localstack"
	"sas/internal/harness/proc"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// mildFaults is the demo's default fault injection: enough to see
// retries, replays and the odd compensation, not enough to slow it down.
const mildFaults = `{"*":{"error_rate":0.03,"rate_limit_rate":0.01,"apply_then_fail_rate":0.01,"latency_min_ms":1,"latency_max_ms":5}}`

// dev runs the whole system on this machine, pushes orders through it with
// live progress, and prints a summary. It uses the PostgreSQL and
// RabbitMQ the settings name; when those are on this machine and do not
// answer, it starts its own as the current user (devServersUp).
func (a *app) dev(ctx context.Context, args []string) (err error) {
	fs := a.flags()
	orders := fs.Int("orders", 3000, "orders to submit")
	wf := fs.String("workflow", "", "workflow of the orders (default: the default workflow)")
	workflows := fs.String("workflows", "", "workflows file every service reads (default: SAS_WORKFLOWS_FILE, else the built-in one)")
	endpoints := fs.String("endpoints", "", "endpoints file giving agent kinds services of your own (default: SAS_AGENT_ENDPOINTS_FILE); every kind it does not name goes to the demo service")
	payload := fs.String("payload", "", "payload of the orders: "+payloadFlagHelp+" (default: random demo orders)")
	schedulers := fs.Int("schedulers", 2, "scheduler replicas")
	agents := fs.Int("agents", 3, "agent replicas")
	faults := fs.String("faults", mildFaults, "the remote service's fault injection (JSON)")
	binDir := fs.String("bin", "", "directory of the sas binaries (default: sasctl's own)")
	promPort := fs.Int("prometheus-port", 9090, "port of a local Prometheus scraping every service, if prometheus is installed (0: none)")
	rules := fs.String("rules", "deploy/prometheus/alerts.yml", "alert rules for the local Prometheus (skipped if the file is missing)")
	keep := fs.Bool("keep", false, "keep the services running after the orders end, until Ctrl-C")
	portBase := fs.Int("port-base", 9100, "services listen on 127.0.0.1 from this port up: submitter +1, schedulers +2, +12, …, agents +3, +13, …, supervisor +4, remote +5, console's metrics +6")
	consolePort := fs.Int("console-port", 8080, "port of the web console on 127.0.0.1 (0: none)")
	apiPort := fs.Int("api-port", 8090, "port of the HTTP API on 127.0.0.1 (0: none); an operator token for it is made and printed")
	consoleUsers := fs.String("console-users", "", "the console's users file (default: SAS_CONSOLE_USERS_FILE, else a new one with the operator admin and a random password, printed)")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	reg, err := workflowsFile(*workflows)
	if err != nil {
		return err
	}
	routes, endpointsFile, err := devRoutes(reg, cmp.Or(*endpoints, os.Getenv("SAS_AGENT_ENDPOINTS_FILE")))
	if err != nil {
		return err
	}
	smp, err := newOrderSampler(reg, *wf, *payload)
	if err != nil {
		return err
	}
	var env []string
	// One local RabbitMQ node: classic durable queues keep a confirmed
	// message on its disk for less than quorum queues cost (queues an
	// earlier run made keep their type).
	if os.Getenv("SAS_QUEUE_TYPE") == "" {
		env = append(env, "SAS_QUEUE_TYPE="+broker.QueueClassic)
		a.cfg.QueueType = broker.QueueClassic
	}
	if path := cmp.Or(*workflows, os.Getenv("SAS_WORKFLOWS_FILE")); path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		env = append(env, "SAS_WORKFLOWS_FILE="+abs)
		env = append(env, "SAS_AGENT_KINDS="+strings.Join(reg.Agents(), ","))
	}
	if endpointsFile != "" {
		env = append(env, "SAS_AGENT_ENDPOINTS_FILE="+endpointsFile)
	}
	// Servers of its own, as this user, when the ones named (on this
	// machine) do not answer; stopped last, removed unless kept.
	servers, err := devServersUp(ctx, a.cfg.DatabaseURL, a.cfg.AMQPURL, installedBins, a.stderr)
	if err != nil {
		return err
	}
	if servers != nil {
		defer func() { servers.Stop(*keep) }()
		env = append(env, servers.Env()...)
		a.cfg.DatabaseURL = cmp.Or(servers.DatabaseURL, a.cfg.DatabaseURL)
		a.cfg.AMQPURL = cmp.Or(servers.AMQPURL, a.cfg.AMQPURL)
	}
	store, closeStore, err := a.migrateAndOpen(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	users, login := cmp.Or(*consoleUsers, os.Getenv("SAS_CONSOLE_USERS_FILE")), ""
	var temporary []string // folders made for this run, removed at its end
	if *consolePort != 0 && users == "" {
		if users, login, err = devConsoleUser(); err != nil {
			return err
		}
		temporary = append(temporary, filepath.Dir(users))
	}
	st, err := localstack.Start(ctx, localstack.Options{BinDir: *binDir, Schedulers: *schedulers, Agents: *agents, Faults: *faults,
		PortBase: *portBase, PromPort: *promPort, Rules: *rules, Env: env, ConsolePort: *consolePort, ConsoleUsers: users,
		APIPort: *apiPort})
	if err != nil {
		return err
	}
	temporary = append(temporary, st.Logs)
	for _, r := range routes {
		fmt.Fprintf(a.stderr, "agent kinds %s: %s\n", strings.Join(r.kinds, ", "), r.to)
	}
	if *consolePort != 0 {
		fmt.Fprintf(a.stderr, "console: http://localhost:%d/ %s\n", *consolePort, login)
	}
	if *apiPort != 0 {
		token, err := devAPIToken(ctx, store)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "HTTP API: http://localhost:%d/api/v1 (operator token, shown once: SAS_API_TOKEN=%s)\n", *apiPort, token)
	}
	defer func() {
		fmt.Fprintln(a.stderr, "stopping every service…")
		st.Stop()
		if *keep {
			fmt.Fprintln(a.stderr, "the stack was stopped")
		} else {
			fmt.Fprintf(a.stderr, "the stack was stopped. To keep it running after the orders end, run %s dev --keep (make demo DEMO_FLAGS=--keep)\n", self())
		}
		// The run's folders (logs, the console's users file) go with it,
		// unless kept or the run failed: then the logs tell why.
		if *keep || err != nil {
			fmt.Fprintf(a.stderr, "logs kept in %s\n", st.Logs)
			return
		}
		for _, dir := range temporary {
			_ = os.RemoveAll(dir)
		}
	}()
	procs, byName, logs, promURL := st.Procs, st.ByName, st.Logs, st.PromURL
	fmt.Fprintf(a.stderr, "services up (%d processes); logs in %s\n", len(procs), logs)

	began := time.Now()
	var published atomic.Int64
	// The run's own orders: not the children their sub-processes start,
	// nor the orders the file's schedules start meanwhile.
	ids := make([]string, *orders)
	for i := range ids {
		ids[i] = messages.NewID()
	}
	submitErr := make(chan error, 1)
	go func() { submitErr <- a.publishSample(ctx, ids, smp, &published) }()

	ended, stalledSince, last := 0, time.Now(), -1
	ticker := time.NewTicker(500 * time.Millisecond)
	defer ticker.Stop()
	for ended < *orders {
		select {
		case <-ctx.Done():
			fmt.Fprintln(a.stderr, "\ninterrupted; stopping the services")
			return nil
		case err := <-submitErr:
			if err != nil {
				return fmt.Errorf("submit: %w", err)
			}
			submitErr = nil
		case <-ticker.C:
		}
		if err := st.Exited(); err != nil {
			return err
		}
		pr, err := store.ProgressOf(ctx, ids)
		if err != nil {
			return err
		}
		ended = pr.ByStatus[statestore.OrderCompleted] + pr.ByStatus[statestore.OrderFailed] + pr.ByStatus[statestore.OrderError]
		if ended != last {
			last, stalledSince = ended, time.Now()
		} else if time.Since(stalledSince) > time.Minute {
			fmt.Fprintln(a.stderr, "\nno order ended for a minute; see `sasctl orders list --status processing` and the logs")
			break
		}
		elapsed := time.Since(began).Seconds()
		fmt.Fprintf(a.stderr, "\r%s %d/%d ended | submitted %d | completed %d | failed %d | error %d | in flight %d | %.0f/s   ",
			bar(ended, *orders, 30), ended, *orders, published.Load(), pr.ByStatus[statestore.OrderCompleted],
			pr.ByStatus[statestore.OrderFailed], pr.ByStatus[statestore.OrderError], int(published.Load())-ended, float64(ended)/elapsed)
	}
	took := time.Since(began)
	fmt.Fprintln(a.stderr)

	pr, err := store.ProgressOf(ctx, ids)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nSUMMARY\t")
	for _, st := range []string{statestore.OrderCompleted, statestore.OrderFailed, statestore.OrderError, statestore.OrderCompensating, statestore.OrderProcessing, statestore.OrderReceived} {
		if n := pr.ByStatus[st]; n > 0 {
			fmt.Fprintf(tw, "orders %s\t%d\n", st, n)
		}
	}
	fmt.Fprintf(tw, "time\t%v\n", took.Round(time.Millisecond))
	fmt.Fprintf(tw, "throughput\t%.0f orders/s\n", float64(ended)/took.Seconds())
	fmt.Fprintf(tw, "latency submit->end p50\t%v\n", pr.P50.Round(time.Millisecond))
	fmt.Fprintf(tw, "latency submit->end p99\t%v\n", pr.P99.Round(time.Millisecond))
	fmt.Fprintf(tw, "agent retries\t%.0f\n", scrapeSum(byName["agent"], "sas_agent_retries_total"))
	fmt.Fprintf(tw, "supervisor resets\t%.0f\n", scrapeSum(byName["supervisor"], "sas_supervisor_resets_total"))
	fmt.Fprintf(tw, "operator alerts\t%d\n", pr.Alerts)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\nmetrics: ")
	for _, p := range procs {
		fmt.Fprintf(a.stdout, "%s http://%s/metrics  ", p.Name, p.Addr)
	}
	if promURL != "" {
		fmt.Fprintf(a.stdout, "\nPrometheus: %s", promURL)
	}
	fmt.Fprintf(a.stdout, "\nlogs: %s (removed at the end unless --keep)\ninspect: %s orders list --status failed; %s orders show ID; %s alerts list --open\n", logs, self(), self(), self())
	if *keep {
		fmt.Fprintln(a.stderr, "services keep running; Ctrl-C stops them")
		<-ctx.Done()
	}
	return nil
}

// publishSample publishes a generated order under each of ids, with
// confirms.
func (a *app) publishSample(ctx context.Context, ids []string, smp *orderSampler, published *atomic.Int64) error {
	conn, pub, topo, err := a.openBroker(ctx, submitter.Input)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer pub.Close()
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for _, id := range ids {
		o := smp.order(0, "")
		o.OrderID = id
		body, err := messages.Encode(o)
		if err != nil {
			return err
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nil
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := publishOrder(ctx, pub, o.OrderID, body, submitTo{key: topo.Queue(submitter.Input)}); err != nil {
				once.Do(func() { firstErr = err })
				return
			}
			published.Add(1)
		})
	}
	wg.Wait()
	return firstErr
}

// self is how sasctl was called ("bin/sasctl" under make demo), for
// hints that run it again.
func self() string {
	if strings.Contains(os.Args[0], "/") {
		return os.Args[0]
	}
	return "sasctl"
}

func bar(done, total, width int) string {
	if total <= 0 {
		return ""
	}
	n := min(width, done*width/total)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

// scrapeSum adds up every series of a metric over processes.
func scrapeSum(procs []*proc.Proc, name string) float64 {
	total := 0.0
	for _, p := range procs {
		resp, err := http.Get("http://" + p.Addr + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
				continue
			}
			if i := strings.LastIndexByte(line, ' '); i > 0 {
				if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
					total += v
				}
			}
		}
		resp.Body.Close()
	}
	return total
}

// route says where the agents send the calls of some agent kinds.
type route struct {
	kinds []string
	to    string
}

// devRoutes says which agent kinds of reg go to the services an
// endpoints file names and which to the demo service, and returns the
// file's absolute path ("" for none). A kind the file names that no
// workflow of reg uses is a mistake: the file was written for another.
func devRoutes(reg *workflow.Registry, file string) ([]route, string, error) {
	named := map[string]string{}
	if file != "" {
		abs, err := filepath.Abs(file)
		if err != nil {
			return nil, "", err
		}
		file = abs
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, "", fmt.Errorf("--endpoints: %w", err)
		}
		var f struct {
			Endpoints map[string]struct {
				URL string `yaml:"url"`
			} `yaml:"endpoints"`
		}
		if err := yaml.Unmarshal(raw, &f); err != nil {
			return nil, "", fmt.Errorf("--endpoints %s: %v", file, err)
		}
		for kind, ep := range f.Endpoints {
			if !slices.Contains(reg.Agents(), kind) {
				return nil, "", fmt.Errorf("--endpoints %s names agent kind %q, which no workflow of %s uses (its kinds: %s)",
					file, kind, sourceName(reg), strings.Join(reg.Agents(), ", "))
			}
			named[kind] = ep.URL
		}
	}
	var routes []route
	var demo []string
	for _, kind := range reg.Agents() {
		if url, ok := named[kind]; ok {
			routes = append(routes, route{kinds: []string{kind}, to: url + " (your service, from " + file + ")"})
		} else {
			demo = append(demo, kind)
		}
	}
	if len(demo) > 0 {
		routes = append(routes, route{kinds: demo, to: "the demo service"})
	}
	return routes, file, nil
}

// devAPIToken makes an operator token for this run's API, named after
// the time so that runs never reuse a name.
func devAPIToken(ctx context.Context, store *statestore.Store) (string, error) {
	name := "dev-" + time.Now().UTC().Format("20060102-150405.000")
	_, secret, err := store.CreateAPIToken(ctx, name, statestore.TokenOperator, "sasctl dev")
	if err != nil {
		return "", fmt.Errorf("make the API's token: %w", err)
	}
	return secret, nil
}
