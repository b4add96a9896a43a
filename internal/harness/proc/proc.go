// Package proc runs sas service binaries as child processes, each in its
// own process group with its log in a file, for the local stack (sasctl
// dev) and fault runs (chaos): start, wait until ready, stop, kill, freeze.
package proc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one running (or ended) service process.
type Proc struct {
	Name string
	Addr string // the address its /readyz is served on
	Log  string // its log file

	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	err    error
	killed bool // ended on purpose by Kill or Stop
}

// Start runs binary with the environment env (added to this process's) and
// addrVar=addr, logging to dir/name.log (appended, across restarts).
func Start(name, binary, dir, addrVar, addr string, env []string) (*Proc, error) {
	return StartCommand(name, []string{binary}, dir, addr, append([]string{addrVar + "=" + addr}, env...))
}

// StartCommand runs args (the program, then its arguments) as name, with
// env added to this process's environment, logging to dir/name.log. addr
// is where it serves, for callers that probe it.
func StartCommand(name string, args []string, dir, addr string, env []string) (*Proc, error) {
	binary := args[0]
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, binary, err)
	}
	p := &Proc{Name: name, Addr: addr, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (nil for a clean exit); valid once Exited.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Intended reports whether the process was ended by Kill or Stop.
func (p *Proc) Intended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// WaitReady polls http://Addr/readyz until it answers 200.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.Exited() {
			return fmt.Errorf("%s exited during start: %v (log %s, ending:\n%s)", p.Name, p.Err(), p.Log, p.LogTail(2048))
		}
		resp, err := http.Get("http://" + p.Addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %v (log %s, ending:\n%s)", p.Name, timeout, p.Log, p.LogTail(2048))
}

// LogTail is the last n bytes of the process's log, for an error that
// should say why it ended without sending its reader to a file a test's
// cleanup may already have removed.
func (p *Proc) LogTail(n int64) string {
	f, err := os.Open(p.Log)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// Kill sends SIGKILL to the process group, as a crash would, and waits.
func (p *Proc) Kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT) // a frozen process must be able to die
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Signal sends sig (e.g. SIGSTOP, SIGCONT) to the process.
func (p *Proc) Signal(sig syscall.Signal) error {
	return p.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM and waits up to grace, then kills.
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
