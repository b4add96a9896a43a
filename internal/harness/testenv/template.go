package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/migrations"
)

// A test's schema made by the chain of migrations costs the server about
// 300 ms: 51 files, each its own transaction, re-making much of what a
// later one changes. The script pg_dump writes of a schema the chain made
// builds each object once, as it ends up, in about 190 ms. Database makes
// every test's schema from that script: the first test to need it (of any
// process of the run) migrates a template schema by the chain, dumps it
// and keeps the script in the database under the digest of the migrations
// and functions, then drops the template; every other test, process and
// later run of the same code reads the script back, and a change of either
// makes a new one. TestATemplatedSchemaIsTheChains holds the two ways to
// the same schema. Where pg_dump is missing or cannot dump the server, the
// row keeps why and tests migrate by the chain.
//
// The scripts live in a schema of their own in the test database
// (templatesSchema), one row per digest, the others' deleted as a new one
// is written.
const templatesSchema = "sas_test_templates"

// madeAtRandom makes anew, in the schema SCHEMA, what the migrations make
// at random, which the script holds as the template's: each schema has a
// step token key of its own (0028).
const madeAtRandom = `
UPDATE SCHEMA.step_token_key SET key = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
`

// makeSchema migrates the empty schema name, which dbURL's search_path
// names, from the template's script, or by the chain where there is none,
// on a session of pool (the test's own).
func makeSchema(ctx context.Context, pool *pgxpool.Pool, name, dbURL string) error {
	script, template, err := templateScript(ctx, pool)
	if err != nil {
		return err
	}
	if script == "" {
		return migrate(ctx, dbURL)
	}
	// No arguments: the simple protocol runs the script's statements as
	// one transaction, whose commit need not wait for the WAL's flush
	// (see migrate). The script sets the session's search_path, and more,
	// for itself (pg_dump writes them); the session goes back to the
	// pool as it came (RESET ALL: the connection's own settings, the
	// schema's search_path among them), its commit still not waiting.
	_, err = pool.Exec(ctx, `SELECT set_config('synchronous_commit', 'off', true);`+
		strings.ReplaceAll(script, template, name)+
		strings.ReplaceAll(madeAtRandom, "SCHEMA", name)+
		`RESET ALL; SELECT set_config('synchronous_commit', 'off', true);`)
	if err != nil {
		return fmt.Errorf("make the schema from the template's script: %w", err)
	}
	return nil
}

// chainDigest names the schema the migrations and functions make.
func chainDigest() (string, error) {
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range ms {
		fmt.Fprintf(h, "%s\x00%s\x00", m.Name, m.SQL)
	}
	h.Write([]byte(statestore.FunctionsSQL()))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// templateScript returns the script that makes the migrated schema, with
// the template schema's name (which it returns too) where a schema's name
// goes; "" when there is none to be had (tests then use the chain).
func templateScript(ctx context.Context, admin *pgxpool.Pool) (script, template string, err error) {
	digest, err := chainDigest()
	if err != nil {
		return "", "", err
	}
	template = "sas_template_" + digest[:16]
	script, found, err := storedScript(ctx, admin, digest)
	if err != nil || found {
		return script, template, err
	}

	conn, err := admin.Acquire(ctx)
	if err != nil {
		return "", "", err
	}
	defer conn.Release()
	// One maker at a time across processes; the others wait, then read.
	const lockKey = `hashtextextended('sas.test.template', 0)`
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(`+lockKey+`)`); err != nil {
		return "", "", err
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+lockKey+`)`)
	}()
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+templatesSchema+`;
		CREATE TABLE IF NOT EXISTS `+templatesSchema+`.scripts (
			digest  text        PRIMARY KEY,
			script  text,
			why_not text,
			made_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return "", "", fmt.Errorf("make %s: %w", templatesSchema, err)
	}
	if script, found, err := storedScript(ctx, conn, digest); err != nil || found {
		return script, template, err
	}
	script, whyNot, err := dumpTemplate(ctx, conn, template)
	if err != nil {
		return "", "", err
	}
	_, err = conn.Exec(ctx, `WITH gone AS (DELETE FROM `+templatesSchema+`.scripts WHERE digest <> $1)
		INSERT INTO `+templatesSchema+`.scripts (digest, script, why_not) VALUES ($1, nullif($2, ''), nullif($3, ''))`,
		digest, script, whyNot)
	if err != nil {
		return "", "", fmt.Errorf("keep the template's script: %w", err)
	}
	return script, template, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// session runs statements: a pool or a connection.
type session interface {
	querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// storedScript reads the script kept under digest: found is false when
// there is no row (or no table yet); a row without a script is found, "".
func storedScript(ctx context.Context, q querier, digest string) (script string, found bool, err error) {
	var s *string
	err = q.QueryRow(ctx, `SELECT script FROM `+templatesSchema+`.scripts WHERE digest = $1`, digest).Scan(&s)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read the template's script: %w", err)
	case s == nil:
		return "", true, nil
	}
	return *s, true, nil
}

// dumpTemplate migrates the schema template by the chain and returns the
// script pg_dump writes of it (the schema's own CREATE left out, as each
// test's schema exists when the script runs), or why there is none. The
// template is dropped.
func dumpTemplate(ctx context.Context, conn *pgxpool.Conn, template string) (script, whyNot string, err error) {
	if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+template+` CASCADE; CREATE SCHEMA `+template); err != nil {
		return "", "", fmt.Errorf("make the template schema: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS `+template+` CASCADE`)
	}()
	templateURL, err := withParam(DatabaseURL(), "search_path", template)
	if err != nil {
		return "", "", err
	}
	if err := migrate(ctx, templateURL); err != nil {
		return "", "", fmt.Errorf("migrate the template schema: %w", err)
	}
	pgDump, err := exec.LookPath("pg_dump")
	if err != nil {
		return "", "pg_dump is not installed", nil
	}
	// Tables, then their indexes, constraints and triggers, then the rows:
	// the chain makes every index before the rows the migrations write
	// (an index built over rows would leave the table's row count in
	// pg_class, and the planner would not read its tables as the chain's
	// schema has them). --inserts: rows as statements, which the simple
	// protocol runs (it cannot feed a COPY).
	var out []byte
	for _, args := range [][]string{{"--section=pre-data", "--section=post-data"}, {"--data-only", "--inserts"}} {
		cmd := exec.CommandContext(ctx, pgDump, append(args, "--schema="+template, "--dbname="+DatabaseURL())...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		part, err := cmd.Output()
		if err != nil {
			return "", secrets.Scrub(fmt.Sprintf("pg_dump: %v: %s", err, strings.TrimSpace(stderr.String()))), nil
		}
		out = append(out, part...)
	}
	// Lines of psql's own commands (pg_dump writes \restrict and
	// \unrestrict around its script) the server would refuse.
	script = regexp.MustCompile(`(?m)^\\.*$`).ReplaceAllString(string(out), "")
	create := "\nCREATE SCHEMA " + template + ";\n"
	if strings.Count(script, create) != 1 {
		return "", "pg_dump's script does not create the schema once", nil
	}
	return strings.Replace(script, create, "\n", 1), "", nil
}
