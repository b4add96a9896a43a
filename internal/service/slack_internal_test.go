package service

import (
	"testing"
	"time"
)

func TestTimerSlackSetting(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		bad  bool
	}{
		{"", time.Millisecond, false},
		{"0", 0, false},
		{"0s", 0, false},
		{"200us", 200 * time.Microsecond, false},
		{"50ms", 50 * time.Millisecond, false},
		{"51ms", 0, true},
		{"-1ms", 0, true},
		{"1000000", 0, true},
	} {
		got, err := timerSlack(func(string) string { return tc.v })
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("SAS_TIMER_SLACK=%q: %v, %v; want %v, bad %v", tc.v, got, err, tc.want, tc.bad)
		}
	}
}

func TestTimerSlackExecutesOnceAndOnlyWhenItHelps(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		want, current time.Duration
		executed      bool
		exec          bool
	}{
		{ms, 50 * time.Microsecond, false, true},
		{ms, 50 * time.Microsecond, true, false}, // never twice
		{ms, ms, false, false},                   // inherited already
		{ms, 2 * ms, false, false},               // more than asked: kept
		{0, 50 * time.Microsecond, false, false}, // off
	} {
		if got := mustExec(tc.want, tc.current, tc.executed); got != tc.exec {
			t.Errorf("want %v, current %v, executed %v: execute %v, want %v", tc.want, tc.current, tc.executed, got, tc.exec)
		}
	}
}
