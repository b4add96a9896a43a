package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
)

// TestUnreachableServiceFailsUnderCI runs itself again with the services
// pointed at a closed port: under CI=true the test must fail with a clear
// message; elsewhere it is skipped with the same message.
func TestUnreachableServiceFailsUnderCI(t *testing.T) {
	if svc := os.Getenv("SAS_TESTENV_HELPER"); svc != "" {
		if svc == "postgres" {
			testenv.Database(t)
		} else {
			testenv.Broker(t, broker.Topology{Prefix: "unused."})
		}
		t.Log("reached the service")
		return
	}
	t.Parallel()
	for _, tc := range []struct {
		svc, ci, want string
		fail          bool
	}{
		{"postgres", "true", "--- FAIL", true},
		{"postgres", "", "--- SKIP", false},
		{"rabbitmq", "true", "--- FAIL", true},
		{"rabbitmq", "false", "--- SKIP", false},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestUnreachableServiceFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "SAS_TESTENV_HELPER="+tc.svc, "CI="+tc.ci,
			"SAS_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:1/none?connect_timeout=2",
			"SAS_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:1/")
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fail || !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "is not reachable") {
			t.Errorf("%s with CI=%q: err %v, want %s with a clear message; output:\n%s", tc.svc, tc.ci, err, tc.want, out)
		}
	}
}

// TestADatabasesSessionsAreAsItsURLSays: the pool Database returns made
// the test's schema on one of its sessions, with a script that sets the
// session's search_path and more for itself; every session it holds must
// read as a new connection to the same URL does, and its schema be gone
// once the test is.
func TestADatabasesSessionsAreAsItsURLSays(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const settings = `SELECT coalesce(current_schema(), '(none)') || ' ' || current_setting('search_path') || ' ' ||
		current_setting('synchronous_commit') || ' ' || current_setting('check_function_bodies') || ' ' ||
		current_setting('client_min_messages') || ' ' || current_setting('row_security') || ' ' ||
		current_setting('statement_timeout') || ' ' || current_setting('xmloption')`
	var schema string
	t.Run("made", func(t *testing.T) {
		url, pool := testenv.Database(t)
		fresh, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close(ctx)
		var want string
		if err := fresh.QueryRow(ctx, settings).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if err := fresh.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(schema, "t_") {
			t.Fatalf("a new session's schema is %q, not the test's", schema)
		}
		conns := pool.AcquireAllIdle(ctx)
		if len(conns) == 0 {
			t.Fatal("the pool holds no idle session after the schema was made")
		}
		for _, c := range conns {
			var got string
			err := c.QueryRow(ctx, settings).Scan(&got)
			c.Release()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("a session of the pool reads %q; a new one %q", got, want)
			}
		}
		var orders int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil || orders != 0 {
			t.Fatalf("the schema's orders: %d, %v", orders, err)
		}
	})
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Errorf("schema %s is still there after its test", schema)
	}
}
