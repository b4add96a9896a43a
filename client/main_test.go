package client_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"sas/internal/harness/proc"
	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/migrations"
)

// TestMain runs the examples and tests against a real stack: PostgreSQL
// (a schema of its own), RabbitMQ (a queue prefix of its own), and the
// submitter, a scheduler, an agent, the supervisor and the demo service as
// processes. The examples find it as an application would, in
// SAS_AMQP_URL and SAS_QUEUE_PREFIX.
func TestMain(m *testing.M) {
	os.Exit(runWithStack(m))
}

func runWithStack(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	unavailable := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "client tests: %s: %v (run `make services`)\n", what, err)
		if os.Getenv("CI") == "true" {
			return 1
		}
		return 0
	}
	admin, err := statestore.Connect(ctx, testenv.DatabaseURL(), 2)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		return unavailable("PostgreSQL", err)
	}
	defer admin.Close()
	if conn, err := amqp.Dial(testenv.AMQPURL()); err != nil {
		return unavailable("RabbitMQ", err)
	} else {
		conn.Close()
	}
	schema := "t_client_" + testenv.RandomSuffix(8)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		fmt.Fprintln(os.Stderr, "client tests:", err)
		return 1
	}
	defer admin.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
	u, _ := url.Parse(testenv.DatabaseURL())
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	dbURL := u.String()
	pool, err := statestore.Connect(ctx, dbURL, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client tests:", err)
		return 1
	}
	ms, _ := statestore.LoadMigrations(migrations.FS)
	if _, err := statestore.Migrate(ctx, pool, ms); err != nil {
		fmt.Fprintln(os.Stderr, "client tests: migrate:", err)
		return 1
	}
	pool.Close()

	dir, err := os.MkdirTemp("", "sas-client-test-")
	if err != nil {
		return 1
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "../cmd/submitter", "../cmd/scheduler", "../cmd/agent", "../cmd/supervisor", "../cmd/remote")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "client tests: build:", err)
		return 1
	}
	// The build (minutes with a cold cache) does not count against the
	// services' start.
	ctx, cancelStart := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelStart()
	prefix := "test.client." + testenv.RandomSuffix(8) + "."
	env := []string{"SAS_DATABASE_URL=" + dbURL, "SAS_AMQP_URL=" + testenv.AMQPURL(), "SAS_QUEUE_PREFIX=" + prefix,
		"SAS_SUPERVISOR_INTERVAL=200ms", "SAS_SCHEDULER_POLL_INTERVAL=200ms"}
	var procs []*proc.Proc
	defer func() {
		for _, p := range procs {
			p.Stop(10 * time.Second)
		}
		if os.Getenv("SAS_CLIENT_TEST_KEEP_LOGS") == "" {
			return
		}
		fmt.Fprintln(os.Stderr, "client tests: logs in", dir)
	}()
	remoteAddr := freeAddr()
	for _, svc := range []struct{ name, addrVar, addr string }{
		{"remote", "SAS_REMOTE_ADDR", remoteAddr},
		{"submitter", "SAS_METRICS_ADDR", freeAddr()},
		{"scheduler", "SAS_METRICS_ADDR", freeAddr()},
		{"agent", "SAS_METRICS_ADDR", freeAddr()},
		{"supervisor", "SAS_METRICS_ADDR", freeAddr()},
	} {
		p, err := proc.Start(svc.name, filepath.Join(dir, svc.name), dir, svc.addrVar, svc.addr,
			append(env, "SAS_REMOTE_URL=http://"+remoteAddr, `SAS_REMOTE_FAULTS={"*":{"error_rate":0.05,"latency_max_ms":2}}`))
		if err != nil {
			fmt.Fprintln(os.Stderr, "client tests:", err)
			return 1
		}
		procs = append(procs, p)
		if err := p.WaitReady(ctx, time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "client tests:", err)
			return 1
		}
	}
	os.Setenv("SAS_AMQP_URL", testenv.AMQPURL())
	os.Setenv("SAS_QUEUE_PREFIX", prefix)
	os.Setenv("SAS_TEST_CLIENT_DATABASE_URL", dbURL)
	// The tests must leave no goroutine of theirs running (the stack's
	// processes, started above, are stopped below).
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if err := goleak.Find(before); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "client tests: goroutines left running:", err)
		code = 1
	}
	if conn, err := amqp.Dial(testenv.AMQPURL()); err == nil {
		if ch, err := conn.Channel(); err == nil {
			for _, q := range []string{"submit", "replies", "agent.inventory", "agent.payment", "agent.shipping"} {
				_, _ = ch.QueueDelete(prefix+q, false, false, false)
				_, _ = ch.QueueDelete(prefix+q+".dlq", false, false, false)
			}
			for _, ex := range []string{"dlx", "status", "alerts"} {
				_ = ch.ExchangeDelete(prefix+ex, false, false)
			}
		}
		conn.Close()
	}
	return code
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
