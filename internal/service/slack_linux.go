package service

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// applyTimerSlack gives every thread of this process the timer slack
// SAS_TIMER_SLACK asks for (see slack.go): when the calling thread's is
// lower, it sets it and executes this binary again, with the same
// arguments and environment, and does not return. It returns an error
// for a bad setting (the caller exits), and otherwise a note of what it
// could not do (the caller logs it and goes on, its threads at the
// kernel's default).
func applyTimerSlack() (note string, err error) {
	want, err := timerSlack(os.Getenv)
	if err != nil {
		return "", err
	}
	_, executed := os.LookupEnv(timerSlackExecEnv)
	if executed {
		os.Unsetenv(timerSlackExecEnv)
	}
	// The thread whose slack is set must be the one that executes.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return fmt.Sprintf("timer slack left as it is: %v", err), nil
	}
	current := time.Duration(cur)
	if !mustExec(want, current, executed) {
		if executed && current < want {
			return fmt.Sprintf("timer slack %v, not the %v asked for", current, want), nil
		}
		return "", nil
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(want.Nanoseconds()), 0, 0, 0); err != nil {
		return fmt.Sprintf("timer slack left at %v: %v", current, err), nil
	}
	// The binary's own path, not /proc/self/exe, whose name would become
	// the process's (ps, top and pkill would say "exe").
	exe, err := os.Executable()
	if err == nil {
		env := append(os.Environ(), timerSlackExecEnv+"=1")
		err = unix.Exec(exe, os.Args, env)
	}
	// Still here: this thread has the slack, the runtime's others not.
	return fmt.Sprintf("timer slack set on one thread only (executing again failed: %v)", err), nil
}
