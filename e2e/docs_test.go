package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sas/internal/agent"
	"sas/internal/api"
	"sas/internal/console"
	"sas/internal/remote"
	"sas/internal/scheduler"
	"sas/internal/submitter"
	"sas/internal/supervisor"
)

// envVar is one SAS_ variable a configuration struct reads.
type envVar struct{ name, def string }

// envVars lists the variables of a configuration struct, including those
// of embedded structs and of named ones (whose tag prefixes theirs).
func envVars(t reflect.Type) []envVar { return envVarsUnder(t, "SAS_") }

func envVarsUnder(t reflect.Type, prefix string) []envVar {
	var out []envVar
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("envconfig")
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			out = append(out, envVarsUnder(f.Type, prefix)...)
		case name != "" && f.Type.Kind() == reflect.Struct && f.Type.PkgPath() != "time":
			out = append(out, envVarsUnder(f.Type, prefix+name+"_")...)
		case name != "":
			out = append(out, envVar{prefix + name, f.Tag.Get("default")})
		}
	}
	return out
}

// TestReadmeDocumentsEveryVariable keeps the README's configuration table
// complete: every variable a service reads has a row with its default.
func TestReadmeDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	for _, cfg := range []any{submitter.Config{}, scheduler.Config{}, agent.Config{}, remote.Config{}, supervisor.Config{}, console.Config{}, api.Config{}} {
		for _, v := range envVars(reflect.TypeOf(cfg)) {
			at := strings.Index(readme, "| `"+v.name+"` |")
			if at < 0 {
				t.Errorf("README has no configuration row for %s", v.name)
				continue
			}
			row, _, _ := strings.Cut(readme[at:], "\n")
			if v.def != "" && !strings.Contains(row, "`"+v.def+"`") {
				t.Errorf("README row for %s does not show the default %q: %s", v.name, v.def, row)
			}
		}
	}
}

// TestServicesRejectBadConfiguration: a setting that cannot be read stops
// a service at once with exit status 2 and says which.
func TestServicesRejectBadConfiguration(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"submitter", "scheduler", "agent", "remote", "supervisor", "console", "api"} {
		// Tracing asked for over a protocol sas does not speak.
		grpc := "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317\x00OTEL_EXPORTER_OTLP_PROTOCOL=grpc"
		for _, bad := range []string{"SAS_LOG_LEVEL=shout", "SAS_SHUTDOWN_TIMEOUT=soon", grpc} {
			if name == "remote" && bad == "SAS_SHUTDOWN_TIMEOUT=soon" {
				bad = "SAS_REMOTE_SEED=minus-one"
			}
			cmd := exec.Command(filepath.Join(binDir, name))
			cmd.Env = env(strings.Split(bad, "\x00")...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "configuration") {
				t.Errorf("%s with %s: %v, output %q; want exit 2 naming the configuration", name, bad, err, out)
			}
		}
	}
	// A password file that cannot be read, or a password given twice.
	for _, name := range []string{"submitter", "supervisor", "console", "sasctl"} {
		for bad, want := range map[string]string{
			"SAS_DATABASE_PASSWORD_FILE=/nonexistent/db":                  "SAS_DATABASE_PASSWORD_FILE: open /nonexistent/db",
			"SAS_AMQP_PASSWORD=x\x00SAS_AMQP_PASSWORD_FILE=/etc/hostname": "SAS_AMQP_PASSWORD and SAS_AMQP_PASSWORD_FILE are both set",
		} {
			cmd := exec.Command(filepath.Join(binDir, name), "orders", "list")
			cmd.Env = env(strings.Split(bad, "\x00")...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
				t.Errorf("%s with %s: %v, output %q; want exit 2 saying %q", name, bad, err, out, want)
			}
		}
	}
}

// TestServicesRefuseURLsThatHideTheirPassword: a URL whose password holds
// a character that ends a URL's user info would be read as another host
// (and printed by every parser's error): every service and sasctl refuse
// it at once, naming the setting, quoting no part of the password.
func TestServicesRefuseURLsThatHideTheirPassword(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"SAS_AMQP_URL=amqp://sas:Top/Secret@127.0.0.1:5672/",
		"SAS_AMQP_URL=amqp://sas:Top#Secret@127.0.0.1:5672/",
		"SAS_DATABASE_URL=postgres://sas:Top?Secret@127.0.0.1:5432/sas",
		"SAS_DATABASE_URL=postgres://sas:Top@Secret@127.0.0.1:5432/sas",
	} {
		setting, _, _ := strings.Cut(bad, "=")
		for _, name := range []string{"submitter", "scheduler", "agent", "supervisor", "console", "sasctl"} {
			args := []string{}
			if name == "sasctl" {
				args = []string{"orders", "list"}
			}
			cmd := exec.Command(filepath.Join(binDir, name), args...)
			cmd.Env = env(bad)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			want := 2
			if name == "sasctl" {
				want = 1
			}
			if !errors.As(err, &ee) || ee.ExitCode() != want || !strings.Contains(string(out), setting) {
				t.Errorf("%s with %s: %v, output %q; want exit %d naming %s", name, bad, err, out, want, setting)
			}
			if strings.Contains(string(out), "Secret") {
				t.Errorf("%s with %s printed a part of the password: %s", name, bad, out)
			}
		}
	}
}
