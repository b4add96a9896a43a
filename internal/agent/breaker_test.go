package agent

import (
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBreaker(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	var states []int
	b := newBreaker(3, time.Second, c.now, func(s int) { states = append(states, s) })

	for i := range 2 {
		if !b.allow() {
			t.Fatalf("closed breaker refused call %d", i)
		}
		b.record(false)
	}
	b.allow()
	b.record(true) // a success resets the count
	for range 3 {
		b.allow()
		b.record(false)
	}
	if b.allow() {
		t.Fatal("breaker still closed after 3 consecutive failures")
	}
	c.t = c.t.Add(999 * time.Millisecond)
	if b.allow() {
		t.Fatal("breaker let a call through before openFor passed")
	}
	c.t = c.t.Add(time.Millisecond)
	if !b.allow() {
		t.Fatal("no probe after openFor")
	}
	if b.allow() {
		t.Fatal("a second call went through while the probe was out")
	}
	b.record(false) // the probe failed: open again
	if b.allow() {
		t.Fatal("breaker closed after a failed probe")
	}
	c.t = c.t.Add(time.Second)
	if !b.allow() {
		t.Fatal("no second probe")
	}
	b.record(true)
	for i := range 2 {
		if !b.allow() {
			t.Fatalf("call %d refused after a good probe closed the breaker", i+1)
		}
	}
	want := []int{circuitClosed, circuitOpen, circuitHalfOpen, circuitOpen, circuitHalfOpen, circuitClosed}
	if len(states) != len(want) {
		t.Fatalf("state changes %v, want %v", states, want)
	}
	for i := range want {
		if states[i] != want[i] {
			t.Fatalf("state changes %v, want %v", states, want)
		}
	}
}
