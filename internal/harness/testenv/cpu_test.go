package testenv

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCPUBetweenOutlivesAThreadThatEnds: a thread that had spent CPU
// before the first reading and ends before the second takes nothing off
// the figure. (The two readings' sums differ by minus its whole time, as
// the test checks first: that difference is what was reported before, a
// negative CPU per op.)
func TestCPUBetweenOutlivesAThreadThatEnds(t *testing.T) {
	raw, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	comm := strings.TrimSpace(string(raw))
	tids := make(chan int)
	end := make(chan struct{})
	busy := func() {
		// Locked and never unlocked, the thread ends with the goroutine;
		// but Go never ends the process's main thread, so a goroutine
		// that finds itself there lets go and another one is tried.
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			runtime.UnlockOSThread()
			tids <- 0
			return
		}
		// Busy until the thread itself has run 200ms (RUSAGE_THREAD), not
		// for 200ms of wall time: on a loaded machine those can be far
		// less CPU than the check below asks for.
		for threadCPU() < 200*time.Millisecond {
		}
		tids <- syscall.Gettid()
		<-end
	}
	// This goroutine keeps its thread, so that the busy one is not
	// handed it (it may be the main thread) while this one waits.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := 0
	// Under the whole suite the runtime may hand the main thread to many
	// busy goroutines in a row: try until one runs elsewhere.
	for range 200 {
		go busy()
		if tid = <-tids; tid != 0 {
			break
		}
	}
	if tid == 0 {
		t.Fatal("every busy goroutine ran on the main thread")
	}
	before := ThreadCPU(comm)
	if before[tid] < 100*time.Millisecond {
		t.Fatalf("the busy thread %d read %v, want at least 100ms", tid, before[tid])
	}
	close(end)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not end", tid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	after := ThreadCPU(comm)
	if _, ok := after[tid]; ok {
		t.Fatalf("thread %d is still read after it ended", tid)
	}
	if diff := sum(after) - sum(before); diff > -50*time.Millisecond {
		t.Fatalf("the sums differ by %v; the ended thread's time should have gone from them", diff)
	}
	if got := CPUBetween(before, after); got < 0 || got > 100*time.Millisecond {
		t.Fatalf("CPUBetween %v, want the little the other threads spent", got)
	}
}

// TestCPUBetweenCountsNewThreadsWhole: a thread id not in the first
// reading is a thread that began in between; one whose time went down is
// a new thread under a reused id.
func TestCPUBetweenCountsNewThreadsWhole(t *testing.T) {
	before := map[int]time.Duration{1: 10 * time.Millisecond, 2: 50 * time.Millisecond}
	after := map[int]time.Duration{1: 15 * time.Millisecond, 2: 7 * time.Millisecond, 3: 20 * time.Millisecond}
	if got, want := CPUBetween(before, after), 5*time.Millisecond+7*time.Millisecond+20*time.Millisecond; got != want {
		t.Fatalf("CPUBetween %v, want %v", got, want)
	}
}

func sum(m map[int]time.Duration) time.Duration {
	var total time.Duration
	for _, ns := range m {
		total += ns
	}
	return total
}

// threadCPU is the calling thread's own CPU time (getrusage with
// RUSAGE_THREAD, 1 on Linux).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil {
		return time.Hour // cannot tell: stop spinning
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
