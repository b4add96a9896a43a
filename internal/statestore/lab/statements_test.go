package lab_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/testenv"
	"sas/internal/statestore/lab"
)

// statementsServer starts a PostgreSQL server of the test's own that
// counts statements, as make bench-statements does (scripts/
// test-postgres.sh with pg_stat_statements preloaded, tracking the
// statements functions run too), and stops it when the test ends.
func statementsServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	dir, err := os.MkdirTemp("", "sas-statements-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the server's user reaches its folder in it
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, dir) })
	cmd := exec.Command(filepath.Join("..", "..", "..", "scripts", "test-postgres.sh"))
	cmd.Env = append(os.Environ(), "SAS_TEST_PG_DIR="+dir, "SAS_TEST_PG_PORT="+port, "SAS_TEST_PG_MAX_CONNECTIONS=20",
		"SAS_TEST_PG_OPTIONS=-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/test-postgres.sh: %v\n%s", err, stderr.String())
	}
	url := strings.TrimSpace(string(out))
	if url == "" {
		testenv.Unavailable(t, "a PostgreSQL server of the test's own", errors.New(stderr.String()))
	}
	return url
}

// stopServer stops the server in dir at once (its postmaster told to quit,
// as pg_ctl stop -m immediate does) and removes its folder.
func stopServer(t *testing.T, dir string) {
	defer os.RemoveAll(dir)
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil || syscall.Kill(pid, syscall.SIGQUIT) != nil {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	t.Errorf("the statements server (pid %d) did not stop", pid)
}

// TestStatementsCountWhatRanSinceTheReset: on a server that counts
// statements, a reset and a reading count what ran between them, by
// statement: a client's five executions of one statement with other
// parameters as one, a statement a function ran marked as not the
// client's, nothing from before the reset. On a server that does not
// load pg_stat_statements, both say so.
func TestStatementsCountWhatRanSinceTheReset(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	_, plain := testenv.Database(t)
	var preload string
	if err := plain.QueryRow(ctx, `SHOW shared_preload_libraries`).Scan(&preload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(preload, "pg_stat_statements") {
		if err := lab.ResetStatements(ctx, plain); !errors.Is(err, lab.ErrNoStatements) {
			t.Errorf("reset on a server without pg_stat_statements: %v, want ErrNoStatements", err)
		}
		if _, err := lab.ReadStatements(ctx, plain, 5); !errors.Is(err, lab.ErrNoStatements) {
			t.Errorf("reading on a server without pg_stat_statements: %v, want ErrNoStatements", err)
		}
	}

	pool, err := pgxpool.New(ctx, statementsServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE FUNCTION lab_twice() RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM count(*) FROM pg_class WHERE relname = 'lab_twice';
			PERFORM count(*) FROM pg_class WHERE relname = 'lab_twice';
		END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT 'before the reset' AS lab_before`); err != nil {
		t.Fatal(err)
	}
	if err := lab.ResetStatements(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := pool.Exec(ctx, `SELECT count(*) AS lab_series FROM generate_series(1, $1)`, 10+i); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := pool.Exec(ctx, `SELECT lab_twice()`); err != nil {
			t.Fatal(err)
		}
	}
	stmts, err := lab.ReadStatements(ctx, pool, 50)
	if err != nil {
		t.Fatal(err)
	}
	var series, nested, caller *lab.Statement
	for i, s := range stmts {
		switch {
		case strings.Contains(s.Query, "lab_before"):
			t.Errorf("a statement from before the reset is counted: %+v", s)
		case strings.Contains(s.Query, "lab_series"):
			series = &stmts[i]
		case strings.Contains(s.Query, "relname = "):
			nested = &stmts[i]
		case strings.Contains(s.Query, "lab_twice()"):
			caller = &stmts[i]
		}
	}
	if series == nil || series.Calls != 5 || !series.TopLevel || series.Rows != 5 || series.TotalMS <= 0 {
		t.Errorf("the client's statement run 5 times reads %+v", series)
	}
	if nested == nil || nested.Calls != 6 || nested.TopLevel {
		t.Errorf("the function's statement (twice a call, 3 calls) reads %+v", nested)
	}
	if caller == nil || caller.Calls != 3 || !caller.TopLevel || (nested != nil && caller.TotalMS < nested.TotalMS) {
		t.Errorf("the function's call reads %+v (its statements took %+v)", caller, nested)
	}
	for i := 1; i < len(stmts); i++ {
		if stmts[i].TotalMS > stmts[i-1].TotalMS {
			t.Fatalf("statements not dearest first: %+v before %+v", stmts[i-1], stmts[i])
		}
	}
}
