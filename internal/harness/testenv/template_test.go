package testenv

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestATemplatedSchemaIsTheChains makes one schema by the chain of
// migrations and one from the template's script, as Database does, and
// finds the same schema in both: tables and their columns in order,
// defaults, constraints, indexes, sequences, functions (text, settings,
// rights), triggers, types, policies, comments, every grant, and every
// row the migrations write.
func TestATemplatedSchemaIsTheChains(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	chain := newSchema(t)
	if err := migrate(ctx, chain.url); err != nil {
		t.Fatalf("migrate by the chain: %v", err)
	}
	templated := newSchema(t)
	script, _, err := templateScript(ctx, templated.pool)
	if err != nil {
		t.Fatal(err)
	}
	if script == "" {
		var whyNot string
		digest, _ := chainDigest()
		_ = templated.pool.QueryRow(ctx, `SELECT why_not FROM `+templatesSchema+`.scripts WHERE digest = $1`, digest).Scan(&whyNot)
		msg := "no template script, tests migrate by the chain: " + whyNot
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if err := makeSchema(ctx, templated.pool, templated.name, templated.url); err != nil {
		t.Fatal(err)
	}

	var chainKey, templatedKey string
	if err := chain.pool.QueryRow(ctx, `SELECT key FROM `+chain.name+`.step_token_key`).Scan(&chainKey); err != nil {
		t.Fatal(err)
	}
	if err := templated.pool.QueryRow(ctx, `SELECT key FROM `+templated.name+`.step_token_key`).Scan(&templatedKey); err != nil {
		t.Fatal(err)
	}
	if templatedKey == chainKey || strings.Contains(script, templatedKey) {
		t.Errorf("the templated schema's step token key %q is another schema's: each schema makes its own", templatedKey)
	}

	want := describeSchema(ctx, t, chain.pool, chain.name)
	got := describeSchema(ctx, t, templated.pool, templated.name)
	if len(want) < 200 {
		t.Fatalf("the chain's schema is described in %d lines; the description reads too little", len(want))
	}
	for _, line := range want {
		if !slices.Contains(got, line) {
			t.Errorf("the chain's schema has, the templated one not: %s", line)
		}
	}
	for _, line := range got {
		if !slices.Contains(want, line) {
			t.Errorf("the templated schema has, the chain's not: %s", line)
		}
	}
}

// describeSchema lists what makes the schema name, a line an object (its
// name as S), sorted.
func describeSchema(ctx context.Context, t *testing.T, admin *pgxpool.Pool, name string) []string {
	t.Helper()
	queries := []string{
		`SELECT format('schema %s', nspacl) FROM pg_namespace WHERE oid = $1::regnamespace`,
		`SELECT format('relation %s %s %s %s %s %s %s %s %s', relname, relkind, relpersistence, relrowsecurity, relacl, reloptions, reltuples, relpages, relallvisible)
			FROM pg_class WHERE relnamespace = $1::regnamespace`,
		`SELECT format('columns %s: %s', c.relname, string_agg(format('%s %s %s %s %s%s %s %s', a.attname, format_type(a.atttypid, a.atttypmod),
				a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attacl, a.attcollation), ', ' ORDER BY a.attnum))
			FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON (d.adrelid, d.adnum) = (a.attrelid, a.attnum)
			WHERE c.relnamespace = $1::regnamespace AND a.attnum > 0 AND NOT a.attisdropped GROUP BY c.relname`,
		`SELECT format('constraint %s %s %s %s %s', c.relname, con.conname, pg_get_constraintdef(con.oid), con.condeferrable, con.condeferred)
			FROM pg_constraint con LEFT JOIN pg_class c ON c.oid = con.conrelid WHERE con.connamespace = $1::regnamespace`,
		`SELECT format('index %s', pg_get_indexdef(i.indexrelid)) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = $1::regnamespace`,
		`SELECT format('sequence %s %s %s %s %s %s', sequencename, data_type, start_value, increment_by, last_value, cycle)
			FROM pg_sequences WHERE schemaname = $1::text`,
		`SELECT format('function %s(%s) %s %s %s %s %s %s %s %s %s', p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
				p.prokind, p.prosecdef, p.provolatile, p.proleakproof, p.proisstrict, p.proconfig, p.proacl, md5(p.prosrc))
			FROM pg_proc p WHERE p.pronamespace = $1::regnamespace`,
		`SELECT format('trigger %s %s', pg_get_triggerdef(tg.oid), tg.tgenabled) FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
			WHERE c.relnamespace = $1::regnamespace AND NOT tg.tgisinternal`,
		`SELECT format('type %s %s %s', typname, typtype, (SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) FROM pg_enum WHERE enumtypid = t.oid))
			FROM pg_type t WHERE typnamespace = $1::regnamespace`,
		`SELECT format('policy %s %s %s %s %s', c.relname, p.polname, p.polcmd, pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid))
			FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = $1::regnamespace`,
		`SELECT format('comment %s %s %s %s', d.classoid::regclass, coalesce(c.relname, p.proname), d.objsubid, d.description)
			FROM pg_description d LEFT JOIN pg_class c ON d.classoid = 'pg_class'::regclass AND c.oid = d.objoid
			LEFT JOIN pg_proc p ON d.classoid = 'pg_proc'::regclass AND p.oid = d.objoid
			WHERE c.relnamespace = $1::regnamespace OR p.pronamespace = $1::regnamespace`,
	}
	var lines []string
	for _, q := range queries {
		rows, err := admin.Query(ctx, q, name)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		lines = append(lines, got...)
	}
	// Every table's rows, as JSON, with times and the step token key (made
	// at random, each schema its own) as their shapes.
	rows, err := admin.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p')`, name)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		var data string
		if err := admin.QueryRow(ctx, `SELECT count(*) || ' ' || coalesce(string_agg(r, '; ' ORDER BY r), '')
			FROM (SELECT regexp_replace(regexp_replace(to_jsonb(x)::text, '"\d{4}-\d\d-\d\dT[0-9:.+-]+"', '"<time>"', 'g'),
				'"key": "[0-9a-f]{64}"', '"key": "<random>"') AS r FROM `+name+`.`+table+` x) rows`).Scan(&data); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, "rows "+table+": "+data)
	}
	for i, line := range lines {
		lines[i] = strings.ReplaceAll(line, name, "S")
	}
	slices.Sort(lines)
	return lines
}
