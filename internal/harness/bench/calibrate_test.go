package bench

import (
	"runtime/debug"
	"slices"
	"testing"
	"time"
)

// TestCalibrationWorkIsFixed: the calibration's work makes what it made
// when its figures were first recorded (docs/benchmarks/HISTORY.md,
// 2026-11-30). Work that changed would make a faster or slower machine
// of the same one; change it only with a new name for its figure.
func TestCalibrationWorkIsFixed(t *testing.T) {
	const want = "82d5ea1fac39bf1d6f32332a210c7cf28ab9cebae57aca70bc7dde96e7d14761"
	if got := calibrationWork(); got != want {
		t.Fatalf("the calibration's work made %s, want %s: it is no longer the work the recorded figures timed", got, want)
	}
}

// TestCalibrationTimesTheFastestRun: the work runs once to warm up and
// calibrationRuns times timed, with the garbage collector off, and the
// fastest run counts; the collector's setting is given back.
func TestCalibrationTimesTheFastestRun(t *testing.T) {
	before := debug.SetGCPercent(137)
	defer debug.SetGCPercent(before)
	// Each run but the warm-up spins longer than the one before: the
	// fastest timed is the first, 30 ms shorter than the next.
	calls := 0
	var gcOff []bool
	var spun []time.Duration
	took := timeBest(func() {
		calls++
		gcOff = append(gcOff, debug.SetGCPercent(-1) == -1)
		spin := time.Duration(calls) * 30 * time.Millisecond
		for began := time.Now(); time.Since(began) < spin; {
		}
		spun = append(spun, spin)
	})
	if calls != 1+calibrationRuns {
		t.Fatalf("the work ran %d times, want one to warm up and %d timed", calls, calibrationRuns)
	}
	if took < spun[1] || took >= spun[2] {
		t.Fatalf("took %v, want the first timed run's (%v, the next %v)", took, spun[1], spun[2])
	}
	if slices.Contains(gcOff, false) {
		t.Fatalf("the collector was on during a run: %v", gcOff)
	}
	if got := debug.SetGCPercent(137); got != 137 {
		t.Fatalf("after the calibration the collector's percentage is %d, want the 137 it found", got)
	}
}
