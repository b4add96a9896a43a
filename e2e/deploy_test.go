package e2e

import (
	"fmt"
	"net/url"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// tool finds a command the deployment checks need; make test installs it.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		msg := name + " is not installed (make test installs it: scripts/services.sh --prometheus --compose, make tools)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// composeService is what TestComposeFileIsValid reads of a resolved
// compose service.
type composeService struct {
	Image       string
	Build       map[string]any
	User        string
	Restart     string
	Profiles    []string
	Ports       []any
	Volumes     []string
	Environment map[string]string
	DependsOn   map[string]map[string]string `yaml:"depends_on"`
	Healthcheck map[string]any
	Entrypoint  []string
	Command     []string
	Container   string `yaml:"container_name"`
}

// resolveCompose runs docker-compose config with envFile (no deploy/.env
// is read) and returns the resolved services.
func resolveCompose(t *testing.T, envFile string) map[string]composeService {
	t.Helper()
	compose := tool(t, "docker-compose")
	out, err := exec.Command(compose, "-f", "../deploy/docker-compose.yml", "--env-file", envFile, "config").CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	var doc struct {
		Services map[string]composeService
		Volumes  map[string]any
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("the resolved compose file: %v\n%s", err, out)
	}
	return doc.Services
}

// TestComposeFileIsValid: deploy/docker-compose.yml resolves with nothing
// set (no deploy/.env, no variable) and runs that way: its secrets are
// made by a one-shot service into a volume and read from files, every
// port is on 127.0.0.1, every long-running service restarts and has a
// healthcheck with a start period, images are pinned to the versions the
// tests use, and sasctl runs under the tools profile.
func TestComposeFileIsValid(t *testing.T) {
	t.Parallel()
	empty := filepath.Join(t.TempDir(), "empty.env")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	svcs := resolveCompose(t, empty)
	for _, name := range []string{"secrets", "postgres", "rabbitmq", "migrate", "db-users", "remote", "submitter", "scheduler",
		"agent", "supervisor", "console", "api", "api-token", "sasctl", "prometheus", "grafana"} {
		if _, ok := svcs[name]; !ok {
			t.Errorf("service %s is missing", name)
		}
	}
	oneShot := map[string]bool{"secrets": true, "migrate": true, "db-users": true, "sasctl": true, "api-token": true}
	published := map[string]bool{}
	for name, svc := range svcs {
		if oneShot[name] {
			if svc.Restart != "no" {
				t.Errorf("one-shot service %s restarts (%q)", name, svc.Restart)
			}
		} else {
			if svc.Restart != "unless-stopped" {
				t.Errorf("service %s: restart %q, want unless-stopped", name, svc.Restart)
			}
			if svc.Healthcheck["test"] == nil || svc.Healthcheck["start_period"] == nil {
				t.Errorf("service %s: healthcheck %v, want a test and a start_period", name, svc.Healthcheck)
			}
		}
		for _, p := range svc.Ports {
			// "127.0.0.1:8080:8080/tcp", or the long form.
			short, ok := p.(string)
			if m, long := p.(map[string]any); long {
				short = fmt.Sprintf("%v:%v:%v", m["host_ip"], m["published"], m["target"])
			}
			if !ok && short == "" || !strings.HasPrefix(short, "127.0.0.1:") {
				t.Errorf("service %s publishes %v beyond this machine", name, p)
				continue
			}
			published[strings.Split(short, ":")[1]] = true
		}
		// No password in the environment: each is a file of the volume.
		for k, v := range svc.Environment {
			if strings.Contains(k, "PASSWORD") && !strings.HasSuffix(k, "_FILE") {
				t.Errorf("service %s is given a password in %s", name, k)
			}
			if strings.HasSuffix(k, "_FILE") && strings.Contains(k, "PASSWORD") && !strings.HasPrefix(v, "/run/secrets/sas/") {
				t.Errorf("service %s: %s=%s is not in the secrets volume", name, k, v)
			}
			if u, err := url.Parse(v); strings.HasSuffix(k, "_URL") && err == nil && u.User != nil {
				if _, has := u.User.Password(); has {
					t.Errorf("service %s: %s holds a password", name, k)
				}
			}
		}
		// Images pinned: a version, never latest; ours are built.
		if svc.Build == nil {
			tag := svc.Image[strings.LastIndex(svc.Image, ":")+1:]
			if !strings.Contains(svc.Image, ":") || tag == "latest" || !strings.Contains(tag, ".") {
				t.Errorf("service %s: image %s is not pinned to a version", name, svc.Image)
			}
		} else if name != "secrets" && name != "remote" {
			if _, ok := svc.Environment["SAS_AMQP_URL"]; !ok && name != "supervisor" && name != "migrate" && name != "db-users" && name != "api-token" {
				t.Errorf("service %s has no broker URL", name)
			}
		}
		// api-token writes the API's first token into the volume.
		if name != "secrets" && name != "api-token" && svc.Build != nil && name != "remote" && !slices.Contains(svc.Volumes, "secrets:/run/secrets/sas:ro") {
			t.Errorf("service %s does not mount the secrets volume read-only: %v", name, svc.Volumes)
		}
	}
	for _, port := range []string{"5672", "8080", "9090", "3000", "15672"} {
		if !published[port] {
			t.Errorf("port %s is not published on 127.0.0.1", port)
		}
	}
	// The versions the tests run against.
	versions := map[string]string{"postgres": "postgres:15.", "rabbitmq": "rabbitmq:3.10."}
	for svc, want := range versions {
		if !strings.HasPrefix(svcs[svc].Image, want) {
			t.Errorf("service %s: image %s, want %s… (the line the tests use)", svc, svcs[svc].Image, want)
		}
	}
	// The secrets: made once by root, read by each service from files.
	sec := svcs["secrets"]
	if sec.User != "0:0" || !slices.Contains(sec.Command, "init") || !slices.Contains(sec.Volumes, "secrets:/run/secrets/sas:rw") {
		t.Errorf("the secrets service: %+v", sec)
	}
	if svcs["postgres"].Environment["POSTGRES_PASSWORD_FILE"] != "/run/secrets/sas/postgres" ||
		svcs["grafana"].Environment["GF_SECURITY_ADMIN_PASSWORD__FILE"] != "/run/secrets/sas/grafana-admin" ||
		svcs["rabbitmq"].Environment["RABBITMQ_CONFIG_FILE"] != "/run/secrets/sas/rabbitmq.conf" {
		t.Errorf("postgres, grafana or rabbitmq do not take their secrets from the volume")
	}
	for _, name := range []string{"postgres", "rabbitmq", "grafana"} {
		if svcs[name].DependsOn["secrets"]["condition"] != "service_completed_successfully" {
			t.Errorf("service %s does not wait for the secrets: %v", name, svcs[name].DependsOn)
		}
	}
	for _, role := range []string{"SUBMITTER", "SCHEDULER", "SUPERVISOR", "OPERATOR", "CONSOLE"} {
		if svcs["db-users"].Environment["SAS_DB_PASSWORD_"+role+"_FILE"] == "" {
			t.Errorf("db-users makes no login for %s", role)
		}
	}
	// Prometheus and Grafana keep their data across a recreate.
	if !slices.Contains(svcs["prometheus"].Volumes, "promdata:/prometheus:rw") || !slices.Contains(svcs["grafana"].Volumes, "grafana:/var/lib/grafana:rw") {
		t.Errorf("prometheus or grafana keep no volume: %v %v", svcs["prometheus"].Volumes, svcs["grafana"].Volumes)
	}
	// sasctl on demand, under the tools profile.
	if !slices.Equal(svcs["sasctl"].Profiles, []string{"tools"}) || svcs["sasctl"].Environment["SAS_DATABASE_URL"] == "" {
		t.Errorf("the sasctl service: %+v", svcs["sasctl"])
	}
	// The demo service comes from its own image.
	if svcs["remote"].Build["target"] != "demo" || svcs["submitter"].Build["target"] != nil {
		t.Errorf("the demo service's image: %v; the services': %v", svcs["remote"].Build, svcs["submitter"].Build)
	}
	for _, scaled := range []string{"agent", "scheduler"} {
		// A scaled service may have neither a fixed name nor a host port.
		if svcs[scaled].Container != "" || len(svcs[scaled].Ports) > 0 {
			t.Errorf("service %s cannot be scaled: %+v", scaled, svcs[scaled])
		}
	}
	// Long-running services connect as their own users, never as an owner.
	for svc, want := range map[string][]string{
		"submitter":  {"sas_submitter_login@", "amqp://sas-submitter@"},
		"scheduler":  {"sas_scheduler_login@", "amqp://sas-scheduler@"},
		"agent":      {"amqp://sas-agent@"},
		"supervisor": {"sas_supervisor_login@"},
		"console":    {"sas_console_login@", "amqp://sas-sasctl@"},
		"sasctl":     {"sas_operator_login@", "amqp://sas-sasctl@"},
	} {
		urls := svcs[svc].Environment["SAS_DATABASE_URL"] + " " + svcs[svc].Environment["SAS_AMQP_URL"]
		for _, w := range want {
			if !strings.Contains(urls, w) {
				t.Errorf("service %s does not connect as %s: %s", svc, w, urls)
			}
		}
	}

	// deploy/.env only overrides.
	overrides := filepath.Join(t.TempDir(), ".env")
	example, err := os.ReadFile("../deploy/.env.example")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(example), "\n") {
		if v, ok := strings.CutPrefix(l, "#SAS_"); ok && strings.Contains(v, "=") {
			lines = append(lines, "SAS_"+v)
		}
	}
	if len(lines) < 2 {
		t.Fatalf("deploy/.env.example offers %d overrides", len(lines))
	}
	lines = append(lines, "SAS_LOG_LEVEL=debug", "SAS_REMOTE_URL=https://payments.example:8443")
	if err := os.WriteFile(overrides, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	over := resolveCompose(t, overrides)
	if over["agent"].Environment["SAS_REMOTE_URL"] != "https://payments.example:8443" || over["scheduler"].Environment["SAS_LOG_LEVEL"] != "debug" {
		t.Errorf("deploy/.env does not override: %v", over["agent"].Environment)
	}
}

// TestImageCarriesOnlyTheServices: the Dockerfile's default target (its
// last stage) copies the binaries built from the services' and sasctl's
// packages only; the demo service and the chaos harness are another
// target's.
func TestImageCarriesOnlyTheServices(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	var servicesBuild string
	var stages []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "FROM ") {
			stages = append(stages, l)
		}
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "-o /out/") {
			servicesBuild = l
		}
	}
	var built []string
	for _, f := range strings.Fields(servicesBuild) {
		if p, ok := strings.CutPrefix(f, "./cmd/"); ok {
			built = append(built, p)
		}
	}
	slices.Sort(built)
	if want := []string{"agent", "api", "console", "sasctl", "scheduler", "submitter", "supervisor"}; !slices.Equal(built, want) {
		t.Errorf("the image's binaries: %v, want %v", built, want)
	}
	last := stages[len(stages)-1]
	if !strings.HasSuffix(last, " AS sas") || !strings.Contains(text, "COPY --from=build /out/ /usr/local/bin/\nUSER nonroot") {
		t.Errorf("the default target is not the services' image: %s", last)
	}
	if !strings.Contains(text, " AS demo") || !strings.Contains(text, "./cmd/remote ./cmd/chaos") {
		t.Errorf("the demo service and the chaos harness have no target of their own")
	}
}

// TestPrometheusConfigAndRules: promtool accepts the alert rules and the
// compose deployment's Prometheus configuration.
func TestPrometheusConfigAndRules(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool")
	if out, err := exec.Command(promtool, "check", "rules", "../deploy/prometheus/alerts.yml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	// The config names its rule file by its path in the container.
	raw, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs("../deploy/prometheus/alerts.yml")
	cfg := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(raw), "/etc/prometheus/alerts.yml", abs, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

// TestBrokerUsersScriptIsCurrent: the script compose runs to create the
// broker users is what sasctl broker users prints for the sas. prefix.
func TestBrokerUsersScriptIsCurrent(t *testing.T) {
	t.Parallel()
	committed, err := os.ReadFile("../deploy/rabbitmq/users.sh")
	if err != nil {
		t.Fatal(err)
	}
	out := sasctlOK(t, env("SAS_QUEUE_PREFIX=sas."), "broker", "users")
	if out != string(committed) {
		t.Fatalf("deploy/rabbitmq/users.sh is out of date; regenerate it with\n  SAS_QUEUE_PREFIX=sas. bin/sasctl broker users > deploy/rabbitmq/users.sh")
	}
}

// TestComposeTakesAListOfPartitions: sasctl partitions compose turns a
// layout of three partitions into a file laid over
// deploy/docker-compose.yml: the base services are the first
// partition's, each other partition has its own PostgreSQL (and volume),
// migration, logins, submitter, scheduler, agent and supervisor, made
// from the base file's and waiting for its own database; the console,
// the API and sasctl read every partition's store; the broker users are
// made with rights under every prefix; a one-shot service declares the
// routing, on a broker whose plugins include the consistent-hash
// exchange.
func TestComposeTakesAListOfPartitions(t *testing.T) {
	t.Parallel()
	compose := tool(t, "docker-compose")
	dir := t.TempDir()
	layout := filepath.Join(dir, "partitions.yaml")
	if err := os.WriteFile(layout, []byte("exchange: sas.route\npartitions:\n"+
		"  - {name: p1, queue_prefix: sas.p1., database_url_env: SAS_P1_DATABASE_URL}\n"+
		"  - {name: p2, queue_prefix: sas.p2., database_url_env: SAS_P2_DATABASE_URL}\n"+
		"  - {name: p3, queue_prefix: sas.p3., database_url_env: SAS_P3_DATABASE_URL}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "partitions.yml")
	if out, errOut, code := sasctl(t, env(), "partitions", "compose", "--file", layout, "--base", "../deploy/docker-compose.yml", "--out", over); code != 0 {
		t.Fatalf("partitions compose: exit %d\n%s%s", code, out, errOut)
	}
	empty := filepath.Join(dir, "empty.env")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(compose, "-f", "../deploy/docker-compose.yml", "-f", over, "--env-file", empty, "config").CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config with the partitions: %v\n%s", err, out)
	}
	var doc struct {
		Services map[string]composeService
		Volumes  map[string]any
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	svcs := doc.Services
	for _, p := range []string{"p2", "p3"} {
		for _, name := range []string{"postgres-", "migrate-", "db-users-", "submitter-", "scheduler-", "agent-", "supervisor-"} {
			if _, ok := svcs[name+p]; !ok {
				t.Errorf("service %s%s is missing", name, p)
			}
		}
		if _, ok := doc.Volumes["pgdata-"+p]; !ok || !slices.Contains(svcs["postgres-"+p].Volumes, "pgdata-"+p+":/var/lib/postgresql/data:rw") {
			t.Errorf("postgres-%s's data: volumes %v", p, svcs["postgres-"+p].Volumes)
		}
		sub := svcs["submitter-"+p]
		if sub.Environment["SAS_PARTITION"] != p || sub.Environment["SAS_QUEUE_PREFIX"] != "sas."+p+"." ||
			!strings.Contains(sub.Environment["SAS_DATABASE_URL"], "@postgres-"+p+":") || sub.DependsOn["db-users-"+p] == nil ||
			sub.Entrypoint[0] != "/usr/local/bin/submitter" || sub.Healthcheck["test"] == nil {
			t.Errorf("submitter-%s: %+v", p, sub)
		}
		if mig := svcs["migrate-"+p]; !strings.Contains(mig.Environment["SAS_DATABASE_URL"], "@postgres-"+p+":") || mig.DependsOn["postgres-"+p] == nil {
			t.Errorf("migrate-%s: %+v", p, mig)
		}
		if ag := svcs["agent-"+p]; ag.Environment["SAS_QUEUE_PREFIX"] != "sas."+p+"." || ag.Environment["SAS_DATABASE_URL"] != "" {
			t.Errorf("agent-%s: %+v", p, ag)
		}
	}
	if sub := svcs["submitter"]; sub.Environment["SAS_PARTITION"] != "p1" || sub.Environment["SAS_QUEUE_PREFIX"] != "sas.p1." {
		t.Errorf("the base submitter is not p1's: %v", sub.Environment)
	}
	for _, name := range []string{"api", "console", "sasctl", "partitions-setup"} {
		e := svcs[name].Environment
		for i, host := range []string{"postgres", "postgres-p2", "postgres-p3"} {
			if v := e[fmt.Sprintf("SAS_P%d_DATABASE_URL", i+1)]; !strings.Contains(v, "@"+host+":") {
				t.Errorf("%s: SAS_P%d_DATABASE_URL %q, want %s's", name, i+1, v, host)
			}
		}
		if e["SAS_PARTITIONS_FILE"] == "" {
			t.Errorf("%s has no layout", name)
		}
	}
	if setup := svcs["partitions-setup"]; setup.Restart != "no" || !slices.Equal(setup.Command, []string{"partitions", "setup"}) ||
		setup.DependsOn["db-users-p3"] == nil || setup.DependsOn["rabbitmq"] == nil {
		t.Errorf("partitions-setup: %+v", setup)
	}
	if svcs["secrets"].Environment["SAS_PARTITIONS_FILE"] == "" {
		t.Error("the broker users are not made for every partition's prefix")
	}
	for name, svc := range svcs {
		for k := range svc.Environment {
			if strings.Contains(k, "PASSWORD") && !strings.HasSuffix(k, "_FILE") {
				t.Errorf("service %s is given a password in %s", name, k)
			}
		}
	}
	plugins, err := os.ReadFile("../deploy/rabbitmq/enabled_plugins")
	if err != nil || !strings.Contains(string(plugins), "rabbitmq_consistent_hash_exchange") {
		t.Errorf("the broker's plugins: %s %v", plugins, err)
	}
}
