package agent

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// BenchmarkCall: one call of the demo remote service over loopback HTTP,
// as an agent makes it (keep-alive connections, many calls at once), the
// service in this process too. Besides the wall time it reports
// self-cpu-ns/op: this process's CPU per call, the client's and the
// service's together.
//
//	go test -run '^$' -bench Call -benchtime 20000x -count 5 ./internal/agent
func BenchmarkCall(b *testing.B) {
	c, _, _ := newCaller(b, nil)
	payload := body("bench")
	var n atomic.Int64
	b.SetParallelism(4) // 4 × GOMAXPROCS goroutines
	b.ResetTimer()
	cpu0 := testenv.SelfCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			res := c.call(ctx, "reserve_inventory", "bench-"+strconv.FormatInt(n.Add(1), 10), payload)
			cancel()
			if res.outcome != callOK {
				b.Errorf("call ended %v: %s", res.outcome, res.reason)
				return
			}
		}
	})
	cpu1 := testenv.SelfCPU(b)
	b.StopTimer()
	if b.N > 0 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "self-cpu-ns/op")
	}
}

// BenchmarkCallAtLowRate: as BenchmarkCall, one call at a time at
// testenv.LowRate a second, as an agent at low load makes them.
//
//	go test -run '^$' -bench CallAtLowRate -benchtime 300x ./internal/agent
func BenchmarkCallAtLowRate(b *testing.B) {
	c, _, _ := newCaller(b, nil)
	payload := body("bench")
	b.ResetTimer()
	cpu0 := testenv.SelfCPU(b)
	testenv.Paced(b, testenv.LowRate, func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if res := c.call(ctx, "reserve_inventory", "bench-"+strconv.Itoa(i), payload); res.outcome != callOK {
			b.Fatalf("call ended %v: %s", res.outcome, res.reason)
		}
	})
	cpu1 := testenv.SelfCPU(b)
	b.StopTimer()
	if b.N > 0 {
		b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "self-cpu-ns/op")
	}
}
