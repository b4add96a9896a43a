package e2e

import (
	"os"
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
		msg := name + " is not installed (make test installs it: scripts/services.sh --prometheus --compose)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// TestComposeFileIsValid: deploy/docker-compose.yml passes docker-compose
// config with the passwords set, and is refused without them (there are
// no default credentials).
func TestComposeFileIsValid(t *testing.T) {
	t.Parallel()
	compose := tool(t, "docker-compose")
	example, err := os.ReadFile("../deploy/.env.example")
	if err != nil {
		t.Fatal(err)
	}
	// Passwords such as openssl rand -base64 gives, and worse: compose
	// builds no URL with them, so they need no encoding.
	const secret = "not/a#real@Secret:%?+="
	filled := filepath.Join(t.TempDir(), ".env")
	lines := strings.Split(string(example), "\n")
	for i, l := range lines {
		if strings.HasSuffix(l, "=") {
			lines[i] = l + secret
		}
	}
	if err := os.WriteFile(filled, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(compose, "-f", "../deploy/docker-compose.yml", "--env-file", filled, "config").CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	for _, scaled := range []string{"agent", "scheduler"} {
		// A scaled service may have neither a fixed name nor a host port.
		svc := section(string(out), "  "+scaled+":")
		if !strings.Contains(svc, "entrypoint") {
			t.Fatalf("service %s not found in the resolved compose file:\n%s", scaled, out)
		}
		if strings.Contains(svc, "container_name") || strings.Contains(svc, "published") || strings.Contains(svc, "ports:") {
			t.Errorf("service %s cannot be scaled:\n%s", scaled, svc)
		}
	}
	// No URL carries a password: each is given apart, whole.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "_URL:") && strings.Contains(line, "Secret") {
			t.Errorf("a URL holds a password: %s", line)
		}
		if strings.Contains(line, "Secret") && !strings.HasSuffix(strings.TrimSpace(line), secret) && !strings.HasSuffix(strings.TrimSpace(line), secret+"'") {
			t.Errorf("a password was changed on its way: %s", line)
		}
	}
	// Long-running services connect as their own users, never as an owner.
	for svc, want := range map[string][]string{
		"submitter":  {"sas_submitter_login@", "amqp://sas-submitter@", "SAS_DATABASE_PASSWORD", "SAS_AMQP_PASSWORD"},
		"scheduler":  {"sas_scheduler_login@", "amqp://sas-scheduler@", "SAS_DATABASE_PASSWORD", "SAS_AMQP_PASSWORD"},
		"agent":      {"amqp://sas-agent@", "SAS_AMQP_PASSWORD"},
		"supervisor": {"sas_supervisor_login@", "SAS_DATABASE_PASSWORD"},
		"console":    {"sas_console_login@", "amqp://sas-sasctl@", "SAS_DATABASE_PASSWORD", "SAS_AMQP_PASSWORD", "127.0.0.1"},
	} {
		sec := section(string(out), "  "+svc+":")
		for _, w := range want {
			if !strings.Contains(sec, w) {
				t.Errorf("service %s does not connect as %s:\n%s", svc, w, sec)
			}
		}
		if strings.Contains(sec, "postgres://sas@") || strings.Contains(sec, "amqp://sas@") {
			t.Errorf("service %s connects as an owner:\n%s", svc, sec)
		}
	}
	out, err = exec.Command(compose, "-f", "../deploy/docker-compose.yml", "--env-file", "../deploy/.env.example", "config").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "set POSTGRES_PASSWORD") {
		t.Fatalf("compose accepted empty passwords: %v\n%s", err, out)
	}
}

// section returns the lines of a top-level compose service, from its
// header to the next line indented as little.
func section(doc, header string) string {
	i := strings.Index(doc, "\n"+header+"\n")
	if i < 0 {
		return ""
	}
	rest := doc[i+1+len(header)+1:]
	var b strings.Builder
	for _, l := range strings.Split(rest, "\n") {
		if l != "" && !strings.HasPrefix(l, "    ") {
			break
		}
		b.WriteString(l + "\n")
	}
	return b.String()
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
	out, errOut, code := sasctl(t, env("SAS_QUEUE_PREFIX=sas."), "broker", "users")
	if code != 0 {
		t.Fatalf("sasctl broker users: %s", errOut)
	}
	if out != string(committed) {
		t.Fatalf("deploy/rabbitmq/users.sh is out of date; regenerate it with\n  SAS_QUEUE_PREFIX=sas. bin/sasctl broker users > deploy/rabbitmq/users.sh")
	}
}
