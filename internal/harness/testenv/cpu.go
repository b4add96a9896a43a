package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ThreadCPU is the time on a CPU so far of every thread of every process
// on this machine whose command name is one of names, by thread id: the
// first field of /proc/PID/task/TID/schedstat, in nanoseconds.
// Benchmarks read it before and after (CPUBetween) to say what the local
// PostgreSQL ("postgres") or RabbitMQ ("beam.smp") spent per op.
func ThreadCPU(names ...string) map[int]time.Duration {
	out := map[int]time.Duration{}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		comm, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil || !slices.Contains(names, strings.TrimSpace(string(comm))) {
			continue
		}
		threads, _ := filepath.Glob(filepath.Join(dir, "task", "[0-9]*", "schedstat"))
		for _, path := range threads {
			tid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			if err != nil {
				continue
			}
			if ns, ok := onCPU(path); ok {
				out[tid] = ns
			}
		}
	}
	return out
}

// CPUBetween is the CPU time the threads of after spent since before
// (two ThreadCPU readings): each thread's own difference, a thread that
// began in between counted whole. A thread that ended in between is not
// in after, and its time since before is lost; subtracting the sums of
// the two readings would instead take its whole life off the total, and
// a busy thread ending made the figure negative. A thread id used again
// by a new thread (its time less than before's) counts as new.
func CPUBetween(before, after map[int]time.Duration) time.Duration {
	var total time.Duration
	for tid, ns := range after {
		if prev, ok := before[tid]; ok && prev <= ns {
			ns -= prev
		}
		total += ns
	}
	return total
}

// onCPU reads the first field of a schedstat file.
func onCPU(path string) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// SelfCPU is the user and system CPU time this process has used.
func SelfCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MeasureCPU resets b's timer and starts measuring the CPU time of the
// server processes named (see ThreadCPU) and of this process. The
// returned func stops the timer and reports both per op: as
// <metric>-cpu-ns/op (when there was such a process) and
// client-cpu-ns/op.
func MeasureCPU(b *testing.B, metric string, names ...string) func() {
	b.Helper()
	b.ResetTimer()
	server0 := ThreadCPU(names...)
	self0 := SelfCPU(b)
	return func() {
		server1 := ThreadCPU(names...)
		self1 := SelfCPU(b)
		b.StopTimer()
		if b.N == 0 {
			return
		}
		if len(server0) > 0 && len(server1) > 0 {
			b.ReportMetric(float64(CPUBetween(server0, server1))/float64(b.N), metric+"-cpu-ns/op")
		}
		b.ReportMetric(float64(self1-self0)/float64(b.N), "client-cpu-ns/op")
	}
}

// LowRate is the rate, in ops per second, of the benchmarks that measure a
// part of an order as a system at low load runs it: one at a time, with the
// processes asleep in between: 60 orders a second, the low load of
// docs/BENCHMARKS.md.
const LowRate = 60

// Paced runs op b.N times, one every 1/rate of a second: each op then
// finds the processes it wakes asleep, as at low load, instead of warm
// from the op before.
func Paced(b *testing.B, rate int, op func(i int)) {
	b.Helper()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range b.N {
		<-tick.C
		op(i)
	}
}
