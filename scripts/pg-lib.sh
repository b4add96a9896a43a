# Shell functions shared by scripts/services.sh and
# scripts/test-postgres.sh; sourced, never run. The caller defines log.

# Members of the role sas_password_auth give their password even on
# loopback, where everyone else is trusted: the tests of logins whose
# passwords hold any character use it to prove the password is checked.
# password_role_sql makes the role if it is missing; password_hba_rule is
# the pg_hba.conf line that asks them for it.
password_role_sql='DO $$ BEGIN CREATE ROLE sas_password_auth NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$'
password_hba_rule='host all +sas_password_auth 127.0.0.1/32 scram-sha-256'

# compact_catalog URL NAME rewrites the system catalogs of the database at
# URL (called NAME in what it says) when they have grown past 20 MB. Every
# test and benchmark run makes and drops schemas; with autovacuum off (as
# on the development machine) their dead rows stay in pg_attribute,
# pg_class and the rest, and every schema made afterwards pays for reading
# past them (sas_test here reached 165 MB of pg_attribute for 10 schemas,
# and the e2e suite 870 s against 560 s a few hours before). Takes a few
# seconds when due.
compact_catalog() {
	local url=$1 name=$2 size t
	size=$(psql "$url" -qAtX -c "SELECT pg_total_relation_size('pg_catalog.pg_attribute')") || return 0
	[ "${size:-0}" -gt 20000000 ] || return 0
	log "compacting the system catalogs of $name (pg_attribute: $((size / 1000000)) MB)"
	for t in pg_attribute pg_class pg_depend pg_proc pg_type pg_index pg_constraint pg_attrdef pg_trigger pg_namespace pg_description pg_init_privs; do
		psql "$url" -qAtX -c "VACUUM FULL pg_catalog.$t" || return 0
	done
}
