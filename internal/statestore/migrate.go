package statestore

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// functionFiles are the files of sql/: the current text of every database
// function, by topic, a file a reader opens by name (10_orders.sql,
// 20_steps.sql, 30_replies.sql, 40_compensation.sql,
// 50_waits_and_timers.sql, 60_children.sql, 70_limits.sql,
// 80_operators.sql; 05_guards.sql the triggers' functions, 99_security.sql
// what holds for them all). Migrate applies them, in the order of their
// names, after the schema migrations, whenever their text differs from
// the one applied last. Migrations carry schema changes only (tables,
// columns, indexes, triggers, roles and grants); a function is changed
// here, and TestFunctionsFileIsTheDefinition fails when a function in the
// database has another text than these files', or is not in them. A new
// function's grants (and REVOKE from PUBLIC) go in a migration, as they
// are schema, or, for a function that exists only once these files are
// applied, in 99_security.sql; a function dropped from these files is
// dropped by a migration.
//
//go:embed sql/*.sql
var functionFiles embed.FS

// FunctionsSQL returns the text of every file of sql/, in the order of
// their names, each after a line naming it.
func FunctionsSQL() string {
	names, err := fs.Glob(functionFiles, "sql/*.sql")
	if err != nil {
		panic("statestore: the embedded sql/ cannot be listed: " + err.Error())
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		text, err := fs.ReadFile(functionFiles, name)
		if err != nil {
			panic("statestore: the embedded " + name + " cannot be read: " + err.Error())
		}
		fmt.Fprintf(&b, "-- %s\n%s\n", name, text)
	}
	return b.String()
}

// Migration is one embedded schema file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads NNNN_name.sql files from fsys in version order.
func LoadMigrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, name := range names {
		prefix, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNNN_description.sql", name)
		}
		v, err := strconv.Atoi(prefix)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q: version %q is not a positive number", name, prefix)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %q and %q share version %d", other, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate applies the migrations not yet applied to the schema the pool's
// search_path points at, each in its own transaction, then the database
// functions (sql/*.sql) when their text differs from the one
// applied last, and returns the names of the migrations it applied.
// Concurrent callers are serialised by a session advisory lock keyed on
// the schema, so two `sasctl migrate` runs at once are safe; a second run
// applies nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, migrations []Migration) ([]string, error) {
	return migrate(ctx, pool, migrations, true)
}

// MigrateSchema applies the migrations as Migrate does, but not the
// functions: for bringing a schema to an earlier version (a test of a
// migration that converts data), whose tables the current functions may
// not fit. A later Migrate applies them.
func MigrateSchema(ctx context.Context, pool *pgxpool.Pool, migrations []Migration) ([]string, error) {
	return migrate(ctx, pool, migrations, false)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, migrations []Migration, functions bool) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	// A session-level lock (not a transaction-level one) so that it spans
	// the separate transactions of each migration.
	const lockKey = `hashtextextended('sas.migrate.' || current_schema(), 0)`
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+lockKey+`)`); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// Use a fresh context: the caller's may be cancelled, and a lock
		// left behind would outlive this call on a pooled connection.
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+lockKey+`)`)
	}()

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := map[int]bool{}
	for _, v := range applied {
		done[int(v)] = true
	}

	var ran []string
	for _, m := range migrations {
		if done[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// No arguments: pgx sends it with the simple protocol, which
			// accepts a file of several statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return ran, fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		ran = append(ran, m.Name)
	}
	if functions {
		if err := applyFunctions(ctx, conn.Conn()); err != nil {
			return ran, err
		}
	}
	return ran, nil
}

// applyFunctions applies sql/*.sql in one transaction, unless the schema
// already has that text's functions (schema_functions keeps the digest
// of the text applied last). Function bodies are checked when they run,
// not when they are made, so that a file may name a function of a later
// one (pg_dump applies functions so too).
func applyFunctions(ctx context.Context, conn *pgx.Conn) error {
	text := FunctionsSQL()
	sum := sha256.Sum256([]byte(text))
	digest := hex.EncodeToString(sum[:])
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_functions (
			only_row   boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
			sha256     text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var applied string
		err := tx.QueryRow(ctx, `SELECT sha256 FROM schema_functions`).Scan(&applied)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if applied == digest {
			return nil
		}
		if _, err := tx.Exec(ctx, `SET LOCAL check_function_bodies = off`); err != nil {
			return err
		}
		// No arguments: the simple protocol, for a file of statements.
		if _, err := tx.Exec(ctx, text); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO schema_functions (sha256) VALUES ($1)
			ON CONFLICT (only_row) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()`, digest)
		return err
	})
	if err != nil {
		return fmt.Errorf("apply the functions of sql/: %w", err)
	}
	return nil
}
