//go:build linux

package service_test

import (
	"bufio"
	"cmp"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEveryThreadOfAServiceHasItsTimerSlack starts a service (this test
// binary as one, see TestMain) and reads the timer slack of each of its
// threads: the runtime's monitor thread, started before any code of
// sas's runs, must have it too, or it keeps waking every 20 µs while
// the service works (slack.go). The process keeps its pid and its
// name, and the mark of its second start is not left in its
// environment.
func TestEveryThreadOfAServiceHasItsTimerSlack(t *testing.T) {
	// With none asked for, a service keeps what it inherits: this
	// process's (the same on each of its threads).
	own, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatalf("this thread's timer slack: %v", err)
	}
	inherited := int64(own)
	for _, tc := range []struct {
		env  string
		want int64
	}{
		{"", int64(time.Millisecond)},
		{"SAS_TIMER_SLACK=250us", 250_000},
		{"SAS_TIMER_SLACK=0", inherited},
	} {
		t.Run(cmp.Or(tc.env, "default"), func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "SAS_SERVICE_TEST_MAIN=serve", "SAS_TIMER_SLACK=", tc.env)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("the service's exit: %v", err)
					}
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					t.Error("the service did not stop on SIGTERM")
				}
			}()
			lines := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					select {
					case lines <- sc.Text():
					default:
					}
				}
				done <- cmd.Wait()
			}()
			select {
			case line := <-lines:
				if line != `running, marker ""` {
					t.Fatalf("the service said %q, want it running with no marker left", line)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the service did not start")
			}
			pid := cmd.Process.Pid
			comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			if err != nil {
				t.Fatal(err)
			}
			if name := filepath.Base(os.Args[0]); strings.TrimSpace(string(comm)) != name[:min(len(name), 15)] {
				t.Errorf("process %d is named %q, want %q", pid, strings.TrimSpace(string(comm)), name)
			}
			tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
			if err != nil {
				t.Fatal(err)
			}
			if len(tasks) < 2 {
				t.Fatalf("the service runs %d threads; Go's runtime starts at least two", len(tasks))
			}
			for _, task := range tasks {
				b, err := os.ReadFile("/proc/" + task.Name() + "/timerslack_ns")
				if errors.Is(err, os.ErrPermission) {
					t.Skip("reading another process's timer slack needs CAP_SYS_NICE")
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.TrimSpace(string(b)); got != strconv.FormatInt(tc.want, 10) {
					t.Errorf("thread %s of %d threads has a timer slack of %s ns, want %d", task.Name(), len(tasks), got, tc.want)
				}
			}
		})
	}
}

// TestABadTimerSlackIsAConfigurationError: a service refuses to start,
// naming the setting, on a slack it cannot mean.
func TestABadTimerSlackIsAConfigurationError(t *testing.T) {
	for _, v := range []string{"1h", "-1ms", "soon"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "SAS_SERVICE_TEST_MAIN=serve", "SAS_TIMER_SLACK="+v)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("SAS_TIMER_SLACK=%s: exit %v, want status 2; output %s", v, err, out)
			continue
		}
		if !strings.Contains(string(out), "SAS_TIMER_SLACK") {
			t.Errorf("SAS_TIMER_SLACK=%s: the error does not name the setting: %s", v, out)
		}
	}
}
