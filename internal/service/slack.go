package service

import (
	"fmt"
	"time"
)

// Go's runtime keeps a monitor thread (sysmon) that, while any goroutine
// runs, sleeps 20 µs at a time, and every system call of a process that
// was idle wakes it from its deeper sleep. A service at low load goes idle
// and busy again for every message, so that thread woke 600 to 900 times a
// second in each service at 60 orders a second, each wake-up a context
// switch: about a millisecond of CPU per single-step order across the
// services, a tenth of all the machine spent on them
// (docs/benchmarks/HISTORY.md, "Timer slack"). With a timer slack of a
// millisecond, the kernel may let each such sleep run to a millisecond
// and serve several timers with one wake-up: the monitor then wakes a few
// times per message instead of a few dozen, and a Go timer fires at most
// that much later.
//
// A thread's timer slack is inherited by the threads it starts and kept
// across execve, and only a thread's own can be set without CAP_SYS_NICE:
// as it starts, a service sets its own thread's and executes itself again
// (applyTimerSlack), so that every thread of the new image, the monitor
// first, inherits it. SAS_TIMER_SLACK sets it; 0 leaves the runtime's
// threads with the slack the process inherited (the kernel's default is
// 50 µs) and executes nothing.
const (
	defaultTimerSlack = time.Millisecond
	maxTimerSlack     = 50 * time.Millisecond
	// timerSlackExecEnv marks the image that applyTimerSlack executed, so
	// that it never executes itself twice.
	timerSlackExecEnv = "SAS_TIMER_SLACK_EXECUTED"
)

// timerSlack reads SAS_TIMER_SLACK: the default when empty, 0 for none.
func timerSlack(getenv func(string) string) (time.Duration, error) {
	v := getenv("SAS_TIMER_SLACK")
	if v == "" {
		return defaultTimerSlack, nil
	}
	d, err := time.ParseDuration(v) // "0" parses too
	if err != nil || d < 0 || d > maxTimerSlack {
		return 0, fmt.Errorf("SAS_TIMER_SLACK %q: want a duration from 0 (keep the inherited slack) to %v, e.g. 1ms", v, maxTimerSlack)
	}
	return d, nil
}

// mustExec reports whether applyTimerSlack sets the calling thread's
// slack and executes the binary again, given the slack wanted, the
// thread's and whether this image is already the one it executed.
func mustExec(want, current time.Duration, executed bool) bool {
	return want > 0 && current < want && !executed
}
