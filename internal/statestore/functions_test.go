package statestore_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"sas/internal/statestore"
	"sas/migrations"
)

// fileFunction is one CREATE OR REPLACE FUNCTION of sql/*.sql.
type fileFunction struct{ name, body string }

var functionHeader = regexp.MustCompile(`(?m)^CREATE OR REPLACE FUNCTION ([a-z_][a-z0-9_]*)\(`)

// fileFunctions parses sql/*.sql: each function's name and the
// text between its $function$ quotes, as pg_proc.prosrc holds it.
func fileFunctions(t *testing.T) []fileFunction {
	t.Helper()
	text := statestore.FunctionsSQL()
	var out []fileFunction
	heads := functionHeader.FindAllStringSubmatchIndex(text, -1)
	for i, h := range heads {
		end := len(text)
		if i+1 < len(heads) {
			end = heads[i+1][0]
		}
		def := text[h[0]:end]
		const quote = "$function$"
		open := strings.Index(def, "AS "+quote)
		if open < 0 {
			t.Fatalf("sql/: %s has no AS %s body", text[h[2]:h[3]], quote)
		}
		rest := def[open+len("AS "+quote):]
		closing := strings.Index(rest, quote)
		if closing < 0 {
			t.Fatalf("sql/: %s's body is not closed", text[h[2]:h[3]])
		}
		out = append(out, fileFunction{name: text[h[2]:h[3]], body: rest[:closing]})
	}
	if len(out) == 0 {
		t.Fatal("sql/ defines no function")
	}
	return out
}

// functionsDiffer lists every way the functions of the current schema
// differ from sql/*.sql: a function the file does not define, a
// body other than the file's, a function of the file that is missing, a
// SECURITY DEFINER function whose search_path is not pinned to the schema.
func functionsDiffer(ctx context.Context, t *testing.T, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	t.Helper()
	rows, err := q.Query(ctx, `SELECT p.proname, p.oid::regprocedure::text, p.prosrc, p.prosecdef,
		coalesce(array_to_string(p.proconfig, ';'), ''), current_schema()
		FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace ORDER BY 2`)
	if err != nil {
		t.Fatal(err)
	}
	type dbFunction struct {
		name, signature, body, config, schema string
		definer                               bool
	}
	var inDB []dbFunction
	for rows.Next() {
		var f dbFunction
		if err := rows.Scan(&f.name, &f.signature, &f.body, &f.definer, &f.config, &f.schema); err != nil {
			t.Fatal(err)
		}
		inDB = append(inDB, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	file := fileFunctions(t)
	used := make([]bool, len(file))
	var diffs []string
	for _, f := range inDB {
		found := -1
		for i, ff := range file {
			if !used[i] && ff.name == f.name && ff.body == f.body {
				found = i
				break
			}
		}
		if found < 0 {
			diffs = append(diffs, fmt.Sprintf("%s is defined in the database with a text sql/ does not hold", f.signature))
			continue
		}
		used[found] = true
		if want := "search_path=" + f.schema + ", pg_temp"; f.definer && f.config != want {
			diffs = append(diffs, fmt.Sprintf("%s is SECURITY DEFINER with settings %q, want %q", f.signature, f.config, want))
		}
	}
	for i, ff := range file {
		if !used[i] {
			diffs = append(diffs, fmt.Sprintf("sql/'s %s is not in the database as written", ff.name))
		}
	}
	return diffs
}

func TestFunctionsFileIsTheDefinition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if diffs := functionsDiffer(ctx, t, b.pool); len(diffs) != 0 {
		t.Fatalf("the migrated schema's functions differ from sql/*.sql:\n%s", strings.Join(diffs, "\n"))
	}

	// The check sees a function redefined behind the file's back, one added
	// beside it, and a definer's search_path left open.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stmt := range []string{
		`CREATE OR REPLACE FUNCTION operator_begin(p_claimed text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'x'; END $$`,
		`CREATE FUNCTION step_ended_elsewhere() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$`,
		`ALTER FUNCTION ack_alert(bigint, text) RESET search_path`,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	diffs := functionsDiffer(ctx, t, tx)
	for _, want := range []string{"operator_begin(text) is defined", "step_ended_elsewhere() is defined", "sql/'s operator_begin", "ack_alert(bigint,text) is SECURITY DEFINER"} {
		if !slices.ContainsFunc(diffs, func(d string) bool { return strings.HasPrefix(d, want) }) {
			t.Errorf("the check missed %q; it found:\n%s", want, strings.Join(diffs, "\n"))
		}
	}
}

func TestMigrateAppliesChangedFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	// A function changed in the database (as an older build's file would
	// have left it) and the digest of what was applied forgotten: the next
	// migrate puts the file's text back.
	if _, err := b.pool.Exec(ctx, `CREATE OR REPLACE FUNCTION operator_begin(p_claimed text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'old'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE schema_functions SET sha256 = 'an older file'`); err != nil {
		t.Fatal(err)
	}
	if ran, err := statestore.Migrate(ctx, b.pool, ms); err != nil || len(ran) != 0 {
		t.Fatalf("migrate: ran %v, %v", ran, err)
	}
	if diffs := functionsDiffer(ctx, t, b.pool); len(diffs) != 0 {
		t.Fatalf("after migrate the functions differ from sql/*.sql:\n%s", strings.Join(diffs, "\n"))
	}
}

// The schema migrations that follow the functions file change the schema
// only: a function's text lives in sql/*.sql. The one exception
// is a trigger's stand-in (a trigger function whose body does nothing,
// so that a migration can make the trigger before the file is applied),
// and only for a function the file defines.
func TestMigrationsAfterTheFunctionsFileDefineNoFunction(t *testing.T) {
	const historyLine = "-- History: the function texts below were those of their day; internal/statestore/sql/ holds the current ones.\n"
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	// 0024 was the last migration to define a function.
	const lastWithFunctions = 24
	def := regexp.MustCompile(`(?i)\bCREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\b`)
	standIn := regexp.MustCompile(`CREATE OR REPLACE FUNCTION (\w+)\(\) RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN RETURN NULL; END \$\$;`)
	for _, m := range ms {
		if m.Version == lastWithFunctions && !def.MatchString(m.SQL) {
			t.Fatalf("the pattern does not see the function %s defines", m.Name)
		}
		if m.Version <= lastWithFunctions {
			// Its function texts are history: it says so on its first line.
			if def.MatchString(m.SQL) && !strings.HasPrefix(m.SQL, historyLine) {
				t.Errorf("%s defines functions but does not begin %q", m.Name, historyLine)
			}
			continue
		}
		text := m.SQL
		for _, sm := range standIn.FindAllStringSubmatch(text, -1) {
			if !strings.Contains(statestore.FunctionsSQL(), "CREATE OR REPLACE FUNCTION "+sm[1]+"()") {
				t.Errorf("%s makes a stand-in for %s, which sql/*.sql does not define", m.Name, sm[1])
			}
		}
		if def.MatchString(standIn.ReplaceAllString(text, "")) {
			t.Errorf("%s defines a function: put its text in internal/statestore/sql/*.sql", m.Name)
		}
	}
}

var calledFunction = regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\(`)

// notInlined lists the SQL-language functions named in text that the
// planner does not inline where a statement calls them, as EXPLAIN
// shows: each is parsed and planned again at every execution of the
// statement (only PL/pgSQL keeps its plans for the session).
func notInlined(ctx context.Context, t *testing.T, tx pgx.Tx, text string) []string {
	t.Helper()
	var names []string
	for _, m := range calledFunction.FindAllStringSubmatch(text, -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	rows, err := tx.Query(ctx, `SELECT p.proname, p.oid::regprocedure::text,
		array(SELECT format_type(a, NULL) FROM unnest(p.proargtypes::oid[]) a)
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = current_schema()::regnamespace AND l.lanname = 'sql'
		  AND p.prokind = 'f' AND NOT p.proretset AND p.proname = ANY($1) ORDER BY 2`, names)
	if err != nil {
		t.Fatal(err)
	}
	type sqlFunction struct {
		name, signature string
		args            []string
	}
	var fns []sqlFunction
	for rows.Next() {
		var f sqlFunction
		if err := rows.Scan(&f.name, &f.signature, &f.args); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, f := range fns {
		table := fmt.Sprintf("inline_args_%d", i)
		cols, call := make([]string, len(f.args)), make([]string, len(f.args))
		for j, typ := range f.args {
			cols[j] = fmt.Sprintf("a%d %s", j+1, typ)
			call[j] = fmt.Sprintf("t.a%d", j+1)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TEMP TABLE %s (%s)", table, strings.Join(cols, ", "))); err != nil {
			t.Fatal(err)
		}
		called := f.name + "(" + strings.Join(call, ", ") + ")"
		rows, err := tx.Query(ctx, fmt.Sprintf("EXPLAIN (VERBOSE, COSTS OFF) SELECT %s FROM %s t", called, table))
		if err != nil {
			t.Fatalf("%s: %v", f.signature, err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// EXPLAIN names the columns of a statement's one table bare.
		if strings.Contains(strings.Join(plan, "\n"), strings.ReplaceAll(called, "t.", "")) {
			out = append(out, f.signature)
		}
		if _, err := tx.Exec(ctx, "DROP TABLE "+table); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestHotStatementsCallNoFunctionPlannedAtEachExecution: an SQL-language
// function the planner cannot inline (one with a subquery, say) is
// planned again each time a statement calling it runs: status_heard cost
// the claim and the insert about 0.06 ms per call site that way. The
// statements every order passes through call only functions the planner
// inlines, or PL/pgSQL ones.
func TestHotStatementsCallNoFunctionPlannedAtEachExecution(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	checked := 0
	for name, text := range statestore.HotStatements() {
		if bad := notInlined(ctx, t, tx, text); len(bad) != 0 {
			t.Errorf("the %s calls SQL functions planned at each execution: %s", name, strings.Join(bad, ", "))
		}
		checked++
	}
	if checked < 6 {
		t.Fatalf("checked %d statements, want the claims, the reply and the inserts", checked)
	}

	// The check sees such a function: status_heard as it was.
	if _, err := tx.Exec(ctx, `CREATE OR REPLACE FUNCTION status_heard(p_status text) RETURNS boolean LANGUAGE sql STABLE AS $$
		SELECT p_status NOT IN ('received', 'processing', 'compensating')
		    OR NOT EXISTS (SELECT 1 FROM status_routes WHERE status = p_status AND unheard_until > now()) $$`); err != nil {
		t.Fatal(err)
	}
	if bad := notInlined(ctx, t, tx, statestore.ClaimKindsSQL); !slices.Contains(bad, "status_heard(text)") {
		t.Fatalf("the check missed an SQL status_heard with a subquery; it found %v", bad)
	}
}
