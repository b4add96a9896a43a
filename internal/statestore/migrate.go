package statestore

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
// search_path points at, each in its own transaction, and returns the names
// it applied. Concurrent callers are serialised by a session advisory lock
// keyed on the schema, so two `sasctl migrate` runs at once are safe; a
// second run applies nothing.
func Migrate(ctx context.Context, pool *pgxpool.Pool, migrations []Migration) ([]string, error) {
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
	return ran, nil
}
