package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/service"
)

// TestSkeletonStopsAndWaitsForEverything: a service's skeleton opens the
// ops server, the database and the broker, runs its loops, and on
// shutdown ends the background loops only after the loops that use them,
// then closes what it opened; TestMain's goleak check fails the package
// if anything it started is still running.
func TestSkeletonStopsAndWaitsForEverything(t *testing.T) {
	dbURL, _ := testenv.Database(t)
	topo := broker.Topology{Prefix: testenv.Prefix(t), DeliveryLimit: 5, Inputs: []string{"in"}}
	testenv.Broker(t, topo)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sk, err := service.Start(ctx, service.Setup{Name: "test", Me: "test-1", OpsAddr: "127.0.0.1:0", Registry: service.NewRegistry(),
		Common: service.Common{DatabaseURL: dbURL, AMQPURL: testenv.AMQPURL()}, DBMaxConns: 2, Topology: &topo}, logger)
	if err != nil {
		t.Fatal(err)
	}
	if sk.Deps.Store == nil || sk.Deps.Conn == nil || sk.Tracing.On() {
		t.Fatalf("opened store %v, broker %v, tracing on %v", sk.Deps.Store != nil, sk.Deps.Conn != nil, sk.Tracing.On())
	}

	var mu sync.Mutex
	var events []string
	note := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	sk.Go(func(workCtx context.Context) {
		<-workCtx.Done()
		note("background ended")
	})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sk.Run(ctx, 5*time.Second, func(context.Context) error { return nil }, func(loopCtx context.Context) error {
			close(started)
			<-loopCtx.Done()
			note("loop ended")
			return nil
		})
	}()
	<-started
	res, err := http.Get("http://" + sk.Ops.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/readyz answered %d while running", res.StatusCode)
	}

	stop() // SIGTERM
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if err := sk.WorkCtx.Err(); err != nil {
		t.Fatalf("work was cut (%v) though the loops finished within the shutdown timeout", err)
	}
	sk.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0] != "loop ended" || events[1] != "background ended" {
		t.Fatalf("shutdown order %v, want the loop first, then the background loop", events)
	}
	if _, err := http.Get("http://" + sk.Ops.Addr() + "/healthz"); err == nil {
		t.Fatal("the ops server still answers after Close")
	}
	if err := sk.Deps.Store.Ping(context.Background()); err == nil {
		t.Fatal("the database pool still answers after Close")
	}
}
