package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// devUser is the unprivileged user TestDevRunsAsAnUnprivilegedUser makes.
const devUser = "sas-e2e-dev"

// TestDevRunsAsAnUnprivilegedUser: make demo's steps as a user who is not
// root: scripts/services.sh --or-own installs and starts nothing and does
// not fail; `sasctl dev`, where no PostgreSQL and no RabbitMQ answer at
// the addresses it is given, starts its own (a cluster of initdb's, a RabbitMQ node with its
// own port mapper) as that user, runs orders through the whole system,
// and leaves nothing behind: no process of the user, no folder.
func TestDevRunsAsAnUnprivilegedUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("making an unprivileged user needs root")
	}
	if exec.Command("id", devUser).Run() != nil {
		if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", devUser).CombinedOutput(); err != nil {
			t.Fatalf("useradd: %v: %s", err, out)
		}
	}
	// The binaries where the user may run them.
	dir, err := os.MkdirTemp("", "sas-e2e-dev-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, name := range []string{"sasctl", "submitter", "scheduler", "agent", "supervisor", "remote", "console", "api"} {
		data, err := os.ReadFile(filepath.Join(binDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// services.sh with the functions it sources.
	for _, name := range []string{"services.sh", "pg-lib.sh"} {
		script, err := os.ReadFile(filepath.Join("..", "scripts", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), script, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// make demo's first step as the user: it installs and starts nothing
	// (the machine's servers are root's to start) and does not fail.
	out, err := exec.Command("su", devUser, "-s", "/bin/sh", "-c", "cd /tmp && "+dir+"/services.sh --or-own --prometheus sas").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "not root: installing and starting nothing") {
		t.Fatalf("services.sh --or-own as %s: %v\n%s", devUser, err, out)
	}
	// Addresses where nothing listens.
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	dbAddr, mqAddr := closed(), closed()
	// The services listen from base+1 to base+6 (one scheduler, one
	// agent), in a span of ports no other test was given.
	base := portBase()
	script := fmt.Sprintf("cd /tmp && exec env GORACE='halt_on_error=1 atexit_sleep_ms=0' SAS_DATABASE_URL='postgres://postgres@%s/sas?sslmode=disable' "+
		"SAS_AMQP_URL='amqp://guest:guest@%s/' %s/sasctl dev --orders 10 --schedulers 1 --agents 1 --console-port 0 --api-port 0 --prometheus-port 0 --port-base %d",
		dbAddr, mqAddr, dir, base)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "su", devUser, "-s", "/bin/sh", "-c", script)
	cmd.Env = env()
	out, err = cmd.CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "no PostgreSQL answers: starting one of its own") ||
		!strings.Contains(text, "no RabbitMQ answers: starting a node of its own") ||
		!regexp.MustCompile(`orders completed\s+10\n`).MatchString(text) {
		t.Fatalf("sasctl dev as %s: %v\n%s", devUser, err, text)
	}
	folder := regexp.MustCompile(`\(data in (/tmp/sas-dev-servers-[0-9]+)/postgres\)`).FindStringSubmatch(text)
	if folder == nil {
		t.Fatalf("the servers' folder is not named:\n%s", text)
	}
	logs := regexp.MustCompile(`logs in (/tmp/sas-dev-[0-9]+)`).FindStringSubmatch(text)
	if logs == nil {
		t.Fatalf("the logs' folder is not named:\n%s", text)
	}
	testenv.Eventually(t, 20*time.Second, "every process of "+devUser+" to end", func() bool {
		return exec.Command("pgrep", "-u", devUser).Run() != nil // exit 1: none
	})
	for _, f := range []string{folder[1], logs[1]} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("the folder %s is left behind: %v", f, err)
		}
	}
}
