package lab

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNoStatements says that the server does not count statements: the
// pg_stat_statements library is not in its shared_preload_libraries (make
// bench-statements starts a server that has it).
var ErrNoStatements = errors.New("the server does not count statements: pg_stat_statements is not in its shared_preload_libraries")

// Statement is one statement's use of the database between a reset of
// pg_stat_statements and a reading, as the extension counts it: the same
// statement with other constants or parameters is one.
type Statement struct {
	Query   string  // its normalized text, white space collapsed, at most 160 characters
	Calls   int64   // executions
	TotalMS float64 // execution time, in milliseconds (planning not counted)
	Rows    int64   // rows it returned or changed
	// TopLevel: a client sent it; else a function or trigger ran it
	// (counted only with pg_stat_statements.track = all), and its time is
	// inside its caller's too.
	TopLevel bool
}

// statementsSchema is the schema pg_stat_statements is installed in,
// after installing it in public if it is not. It returns ErrNoStatements
// when the library is not loaded.
func statementsSchema(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var loaded bool
	if err := pool.QueryRow(ctx, `SELECT 'pg_stat_statements' = ANY(string_to_array(replace(current_setting('shared_preload_libraries'), ' ', ''), ','))`).Scan(&loaded); err != nil {
		return "", fmt.Errorf("read shared_preload_libraries: %w", err)
	}
	if !loaded {
		return "", ErrNoStatements
	}
	var schema string
	err := pool.QueryRow(ctx, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_stat_statements'`).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements WITH SCHEMA public`); err != nil {
			return "", fmt.Errorf("install pg_stat_statements (the database's owner or a superuser may): %w", err)
		}
		schema = "public"
	} else if err != nil {
		return "", fmt.Errorf("find pg_stat_statements: %w", err)
	}
	return schema, nil
}

// ResetStatements sets pg_stat_statements' counts of this database's
// statements back to zero, installing the extension first if it is not
// (in public): a reading after counts what ran between. It returns
// ErrNoStatements when the server does not load the library.
func ResetStatements(ctx context.Context, pool *pgxpool.Pool) error {
	schema, err := statementsSchema(ctx, pool)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `SELECT `+pgx.Identifier{schema}.Sanitize()+`.pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	if err != nil {
		return fmt.Errorf("reset pg_stat_statements: %w", err)
	}
	return nil
}

// ReadStatements reads the n statements of this database that took the
// most execution time since the last reset, dearest first.
func ReadStatements(ctx context.Context, pool *pgxpool.Pool, n int) ([]Statement, error) {
	schema, err := statementsSchema(ctx, pool)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT query, calls, total_exec_time, rows, toplevel
		FROM `+pgx.Identifier{schema, "pg_stat_statements"}.Sanitize()+`
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Statement, error) {
		var s Statement
		err := row.Scan(&s.Query, &s.Calls, &s.TotalMS, &s.Rows, &s.TopLevel)
		s.Query = shortQuery(s.Query)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pg_stat_statements: %w", err)
	}
	return out, nil
}

var (
	sqlComment = regexp.MustCompile(`--[^\n]*`)
	space      = regexp.MustCompile(`\s+`)
)

// shortQuery is a statement's text on one line, without comments, cut
// at 160 characters.
func shortQuery(q string) string {
	q = strings.TrimSpace(space.ReplaceAllString(sqlComment.ReplaceAllString(q, " "), " "))
	if r := []rune(q); len(r) > 160 {
		q = string(r[:159]) + "…"
	}
	return q
}
