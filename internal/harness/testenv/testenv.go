// Package testenv gives tests their own isolated piece of the real
// PostgreSQL and RabbitMQ: a freshly migrated schema per call, a unique
// queue-name prefix, and clean-up of both. Nothing here is mocked.
//
// When a service cannot be reached the test is skipped with the reason,
// except under CI=true, where it fails: CI must never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/migrations"
)

// DatabaseURL is the test database (SAS_TEST_DATABASE_URL).
func DatabaseURL() string {
	if u := os.Getenv("SAS_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/sas_test?sslmode=disable"
}

// AMQPURL is the test broker (SAS_TEST_AMQP_URL).
func AMQPURL() string {
	if u := os.Getenv("SAS_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// Unavailable skips the test because what it needs is missing, or under
// CI=true fails it: CI must never pass by skipping.
func Unavailable(t testing.TB, what string, err error) {
	t.Helper()
	unavailable(t, what, err)
}

func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s is not reachable: %v (run `make services` or scripts/services.sh to start it)", what, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// RandomSuffix returns n random hex characters.
func RandomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

func slug(t testing.TB) string {
	s := regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(s) > 30 {
		s = s[:30]
	}
	return strings.Trim(s, "_")
}

// Database creates a schema of its own for the test, applies the
// migrations to it, and returns a database URL whose search_path points at
// it, with a pool open on that URL. The schema is dropped after the test.
// The schema is made from the template's script (template.go) where
// pg_dump can write one, else by the chain of migrations.
func Database(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	s := newSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := makeSchema(ctx, s.pool, s.name, s.url); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s.url, s.pool
}

// migrate applies the migrations to the schema dbURL names, on a
// connection of its own whose commits do not wait for the WAL to reach
// the disk (synchronous_commit off): each of the 50-odd migrations is a
// transaction, and their flushes were about a quarter of a schema's
// making. Nothing a test keeps is lost by it: the commits are seen by
// every other session at once, and the WAL writer (or the next
// synchronous commit of anyone) flushes them within a fraction of a
// second; only a crash of the server within that time could forget the
// last of them, and a test that crashes its server does so later.
func migrate(ctx context.Context, dbURL string) error {
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	asyncURL, err := withParam(dbURL, "synchronous_commit", "off")
	if err != nil {
		return err
	}
	pool, err := statestore.Connect(ctx, asyncURL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = statestore.Migrate(ctx, pool, ms)
	return err
}

// withParam is the database URL raw with the run-time parameter key set
// to value (pgx sends the URL's unknown parameters to the server).
func withParam(raw, key, value string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// catalogDeadRows is how many dead rows pg_attribute may hold before a
// test that drops its schema vacuums the system catalogs.
const catalogDeadRows = 50000

// vacuumCatalogs vacuums the system catalogs a schema's making and
// dropping leave dead rows in, once pg_attribute holds catalogDeadRows of
// them, at most once a minute (dead rows an open transaction still
// sees stay counted). With autovacuum off (as on the development machine) nothing else
// does during a run, and every later schema, connection and plan reads
// past them: a whole run left 700,000 in pg_attribute, and its later tests
// ran ever slower. Best effort: a failure leaves the catalogs as they
// were.
func vacuumCatalogs(ctx context.Context, admin session) {
	var due bool
	if err := admin.QueryRow(ctx, `SELECT coalesce(n_dead_tup, 0) >= $1 AND coalesce(greatest(last_vacuum, last_autovacuum), '-infinity') < now() - interval '1 minute'
		FROM pg_stat_sys_tables WHERE relid = 'pg_catalog.pg_attribute'::regclass`, catalogDeadRows).Scan(&due); err != nil || !due {
		return
	}
	_, _ = admin.Exec(ctx, `VACUUM pg_catalog.pg_attribute, pg_catalog.pg_class, pg_catalog.pg_depend, pg_catalog.pg_type,
		pg_catalog.pg_proc, pg_catalog.pg_constraint, pg_catalog.pg_index, pg_catalog.pg_attrdef, pg_catalog.pg_trigger`)
}

// EmptyDatabase is Database without the migrations.
func EmptyDatabase(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	s := newSchema(t)
	return s.url, s.pool
}

// schema is a test's schema: its name, a URL whose search_path names it,
// and a pool on that URL. The pool makes the schema, and drops it after
// the test: each session the server starts costs it about 30 ms of CPU on
// the development machine (a fork and a backend's start), and a pool of
// the database's own, besides, cost two more for every test.
type schema struct {
	name, url string
	pool      *pgxpool.Pool
}

func newSchema(t testing.TB) schema {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "t_" + slug(t) + "_" + RandomSuffix(8)
	dbURL, err := withParam(DatabaseURL(), "search_path", name)
	if err != nil {
		t.Fatalf("parse database url: %v", err)
	}
	pool, err := statestore.Connect(ctx, dbURL, 20)
	if err != nil {
		unavailable(t, "PostgreSQL at "+DatabaseURL(), err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+name); err != nil {
		pool.Close()
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		defer pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropSchema(ctx, pool, name); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return schema{name: name, url: dbURL, pool: pool}
}

// dropSchema drops the schema name through the test's pool, or, where the
// test closed it or left its sessions unable to (another role set), on a
// connection of its own; then vacuums the catalogs when they are due.
func dropSchema(ctx context.Context, pool *pgxpool.Pool, name string) error {
	drop := `DROP SCHEMA ` + name + ` CASCADE`
	var on session = pool
	if _, err := pool.Exec(ctx, drop); err != nil {
		conn, err := pgx.Connect(ctx, DatabaseURL())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, drop); err != nil {
			return err
		}
		on = conn
	}
	vacuumCatalogs(ctx, on)
	return nil
}

// Reachable checks that the test database and broker answer (skipping the
// test, or under CI failing it, when not), for tests that connect to them
// without a schema or queues of their own.
func Reachable(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, DatabaseURL())
	if err == nil {
		err = pool.Ping(ctx)
		pool.Close()
	}
	if err != nil {
		unavailable(t, "PostgreSQL at "+secrets.Scrub(DatabaseURL()), err)
	}
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		unavailable(t, "RabbitMQ at "+secrets.Scrub(AMQPURL()), err)
	}
	conn.Close()
}

// Prefix returns a queue-name prefix no other test uses.
func Prefix(t testing.TB) string {
	return "test." + slug(t) + "." + RandomSuffix(8) + "."
}

// Broker checks RabbitMQ answers and deletes topo's queues and exchanges
// after the test.
func Broker(t testing.TB, topo broker.Topology) {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		unavailable(t, "RabbitMQ at "+secrets.Scrub(AMQPURL()), err)
	}
	conn.Close()
	t.Cleanup(func() {
		conn, err := amqp.Dial(AMQPURL())
		if err != nil {
			t.Errorf("clean up queues: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("clean up queues: %v", err)
			return
		}
		if err := topo.Delete(ch); err != nil {
			t.Errorf("clean up queues: %v", err)
		}
	})
}

// Eventually polls cond every few milliseconds until it returns true or
// timeout passes, then fails the test with msg.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, msg)
		}
		time.Sleep(wait)
		wait = min(wait*2, 200*time.Millisecond)
	}
}

// Forge writes a fixture's state as it is, past the state store's doors
// (the triggers steps_moved and orders_moved check every move and write
// it to the history): it runs sql in a transaction whose session applies
// rows as a replica does, firing no trigger. A forged state has no
// history; a test that needs one moves its rows through the store.
func Forge(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	})
	if err != nil {
		t.Fatalf("forge a fixture: %v", err)
	}
}
