// Package e2e tests sas end to end: it builds the real binaries, starts
// them as processes against the real PostgreSQL and RabbitMQ, and drives
// them from outside, as a user and an operator would.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/harness/testenv"
)

// binDir holds the binaries TestMain built.
var binDir string

// chromium is the tests' one browser (browser).
var chromium sharedChromium

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sas-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// go test puts its own GOROOT/bin first on PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: find the go command:", err)
		return 1
	}
	// The binaries are built with failpoints, so a test can kill a
	// process at a chosen point (SAS_FAILPOINTS), and, on a machine of
	// four cores or more, with the race detector, so a data race in a real
	// process fails the test that drives it. The detector takes about
	// twice the services' CPU: on two cores the suite's processes then
	// outran the machine (a run past 18 minutes, its timing tests failing
	// for want of CPU), so there it is off unless SAS_E2E_RACE=on asks for
	// it. SAS_E2E_RACE=off turns it off anywhere, for a benchmark's
	// timings (make bench-console). The tests' own code runs under go
	// test -race everywhere.
	race := runtime.NumCPU() >= 4
	switch os.Getenv("SAS_E2E_RACE") {
	case "on":
		race = true
	case "off":
		race = false
	}
	// -trimpath: a fresh clone reuses the build cache (see the Makefile).
	// -s -w: no symbol table and no DWARF, which a stack trace and a
	// profile do not read (they use the binary's own line tables); the
	// links took 16 s of the suite's start on two cores with them, 10
	// without (2026-12-02).
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-race", "-tags", "failpoints", "-o", dir + "/", "./cmd/submitter", "./cmd/sasctl",
		"./cmd/scheduler", "./cmd/agent", "./cmd/remote", "./cmd/supervisor", "./cmd/console", "./cmd/api", "./internal/harness/idp"}
	if !race {
		args = slices.DeleteFunc(args, func(a string) bool { return a == "-race" })
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = ".."
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build binaries:", err)
		return 1
	}
	binDir = dir
	defer chromium.stop()
	return m.Run()
}

// env is a process environment: the test's own minus any SAS_ setting,
// plus kv.
func env(kv ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SAS_") {
			out = append(out, e)
		}
	}
	// atexit_sleep_ms=0: the race runtime otherwise sleeps a second at
	// every exit (ThreadSanitizer's default), which made each sasctl call
	// and each service's stop a second longer. halt_on_error reports a
	// race when it happens, so nothing waits for the exit's report.
	out = append(out, "GORACE=halt_on_error=1 exitcode=66 atexit_sleep_ms=0")
	return append(out, kv...)
}

// proc is a running sas binary.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    string
	done   chan struct{}
	err    error
	ops    string // host:port of its ops server, if any
	killed bool   // killed on purpose: stop expects no clean exit
}

// kill sends SIGKILL, as a crash would, and waits for the process to go.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	p.killed = true
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not die on SIGKILL", p.name)
	}
}

// waitKilled waits for the process to die by SIGKILL (a failpoint).
func (p *proc) waitKilled(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still running after %v", p.name, timeout)
	}
	p.killed = true
	ee, ok := p.err.(*exec.ExitError)
	if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("%s ended with %v, want death by SIGKILL\n%s", p.name, p.err, p.tail())
	}
}

// signal sends sig (e.g. SIGSTOP, SIGCONT) to the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// freeAddr returns a loopback address whose port is free now and was
// given to no other test of this binary. The port is from 10,000 to
// 19,999: below Linux's ephemeral range (32768 and up), from which every
// outgoing connection here takes its local port, and which once gave a
// connection the port picked for a scheduler's ops server between the
// pick and the scheduler's listen; and below portBase's spans. The
// kernel's own pick (port 0) would come from that range.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 10000 {
		addr := fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(10000))
		if _, taken := handedOut.LoadOrStore(addr, true); taken {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // another process's
		}
		ln.Close()
		return addr
	}
	t.Fatal("no free port from 10000 to 19999")
	return ""
}

// handedOut are the addresses freeAddr, and the spans of ports portBase,
// gave this test binary's tests.
var handedOut sync.Map

// start runs a service binary with env and an ops server on a free port,
// waits until it is ready, and stops it (SIGTERM, expecting a clean exit)
// when the test ends.
func start(t *testing.T, name string, environ []string) *proc {
	t.Helper()
	return startOn(t, name, environ, "SAS_METRICS_ADDR")
}

// startOn is start for a binary that reads its listening address from
// addrVar.
func startOn(t *testing.T, name string, environ []string, addrVar string) *proc {
	t.Helper()
	p := launch(t, name, environ, addrVar)
	testenv.Eventually(t, 60*time.Second, name+" to become ready", func() bool {
		if p.exited() {
			t.Fatalf("%s exited during start: %v\n%s", name, p.err, p.tail())
		}
		return ready(p)
	})
	return p
}

// launch runs a service binary as startOn does, without waiting for it to
// become ready.
func launch(t *testing.T, name string, environ []string, addrVar string) *proc {
	t.Helper()
	ops := freeAddr(t)
	p := &proc{name: name, ops: ops, done: make(chan struct{})}
	logFile, err := os.CreateTemp(t.TempDir(), name+"-*.log")
	if err == nil {
		p.log = logFile.Name()
	}
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(filepath.Join(binDir, name))
	p.cmd.Env = append(append([]string{}, environ...), addrVar+"="+ops)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// get returns the status and body of a GET of the process's ops server.
func (p *proc) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.ops + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// ready reports whether the process answers /readyz with 200.
func ready(p *proc) bool {
	resp, err := http.Get("http://" + p.ops + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and requires a clean exit within 30 s.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if p.exited() {
		if p.err != nil && !p.killed {
			t.Errorf("%s had exited: %v\n%s", p.name, p.err, p.tail())
		}
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s did not exit cleanly on SIGTERM: %v\n%s", p.name, p.err, p.tail())
		}
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		t.Errorf("%s did not stop within 30s of SIGTERM\n%s", p.name, p.tail())
	}
}

// logText is the process's whole log.
func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// metric scrapes the process and returns the value of the series
// name+labels (labels as Prometheus prints them, e.g. `{outcome="inserted"}`),
// or 0 if it is not there yet.
func (p *proc) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.ops + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", p.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

// sasctl runs the tool to completion and returns its stdout, stderr and
// exit code.
func sasctl(t *testing.T, environ []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "sasctl"), args...)
	cmd.Env = environ
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("sasctl %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errOut.String(), code
}

// sasctlOK runs the tool as sasctl does and returns its stdout, failing
// the test when it exits other than 0.
func sasctlOK(t *testing.T, environ []string, args ...string) string {
	t.Helper()
	out, errOut, code := sasctl(t, environ, args...)
	if code != 0 {
		t.Fatalf("sasctl %v: exit %d\n%s%s", args, code, out, errOut)
	}
	return out
}

// flat is text with every run of white space made one space: what sasctl
// prints wraps long lines.
func flat(text string) string { return strings.Join(strings.Fields(text), " ") }

// amqpChannel opens a confirm-mode channel straight to the broker, for a
// test to publish and inspect queues as an outside application would.
func amqpChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatalf("dial broker: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// publish publishes body to queue and waits for the broker's confirm.
func publish(t *testing.T, ch *amqp.Channel, queue, contentType, id string, body []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		ContentType: contentType, MessageId: id, DeliveryMode: amqp.Persistent, Body: body,
	})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish not confirmed: %v %v", ok, err)
	}
}

// drain takes n messages off queue (acking them), waiting for them to
// arrive.
func drain(t *testing.T, ch *amqp.Channel, queue string, n int, timeout time.Duration) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	testenv.Eventually(t, timeout, fmt.Sprintf("%d messages on %s", n, queue), func() bool {
		for len(got) < n {
			d, ok, err := ch.Get(queue, false)
			if err != nil {
				t.Fatalf("get from %s: %v", queue, err)
			}
			if !ok {
				return false
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
			got = append(got, d)
		}
		return true
	})
	return got
}
