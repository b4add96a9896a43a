#!/usr/bin/env bash
# Starts, if it is not up, the PostgreSQL server of make test: a cluster
# of its own (initdb) on this machine, on its own port, with room for the
# connections of the end-to-end tests that run at once (each starts a
# whole stack), and otherwise the settings of the machine's server
# (autovacuum off, 128 MB shared buffers) but fsync, off: every commit is
# still written to the kernel before it is acknowledged, so a process or
# a server killed keeps it as the tests expect; only the machine's own
# crash could lose it, and no test plays that (the tests that crash a
# PostgreSQL start their own). The suite is bound by the machine's CPU,
# and the flushes cost it up to 8 % (e2e 700-771 s against 764-765,
# 2026-12-01). It also gets what scripts/services.sh does to the
# machine's server: loopback trusted but for members of
# sas_password_auth, who give their password (the password tests), and
# the system catalogs compacted when schemas made and dropped have grown
# them past 20 MB. Prints the URL of its test database on stdout; prints
# nothing, and says why on stderr, where PostgreSQL's programs are not
# installed (the tests then use SAS_TEST_DATABASE_URL's default, the
# machine's server). Idempotent; it removes nothing.
#
# Environment: SAS_TEST_PG_DIR (default /tmp/sas-test-pg-$UID),
# SAS_TEST_PG_PORT (default 55432), SAS_TEST_PG_MAX_CONNECTIONS (default
# 300), SAS_TEST_PG_DATABASE (default sas_test), SAS_TEST_PG_FSYNC (default
# off; on for a benchmark: make bench-statements; set fsync here, not in
# the options, or each run restarts the cluster), SAS_TEST_PG_OPTIONS (more
# of the server's settings when it starts, e.g. "-c
# shared_preload_libraries=pg_stat_statements": make bench-statements).
set -euo pipefail

dir="${SAS_TEST_PG_DIR:-/tmp/sas-test-pg-$(id -u)}"
port="${SAS_TEST_PG_PORT:-55432}"
max_connections="${SAS_TEST_PG_MAX_CONNECTIONS:-300}"
database="${SAS_TEST_PG_DATABASE:-sas_test}"
options="${SAS_TEST_PG_OPTIONS:-}"
fsync="${SAS_TEST_PG_FSYNC:-off}"
case "$fsync" in on | off) ;; *)
	echo "test-postgres: SAS_TEST_PG_FSYNC must be on or off" >&2
	exit 2
	;;
esac

log() { printf 'test-postgres: %s\n' "$*" >&2; }
# shellcheck source=scripts/pg-lib.sh
. "$(dirname "$0")/pg-lib.sh"

bin=""
if command -v initdb >/dev/null 2>&1; then
	bin="$(dirname "$(readlink -f "$(command -v initdb)")")"
else
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ]; then
			bin="$d"
			break
		fi
	done
fi
if [ -z "$bin" ]; then
	log "initdb is not installed; the tests use the server SAS_TEST_DATABASE_URL names (or the machine's)"
	exit 0
fi

# PostgreSQL does not run as root: as root, the cluster is the postgres
# user's.
as_owner() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

admin="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
url="postgres://postgres@127.0.0.1:$port/$database?sslmode=disable"

up() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres -U postgres; }

# trust_loopback writes the cluster's pg_hba.conf: loopback is trusted, as
# on the development machines, but for the members of sas_password_auth.
# It says whether it changed the file.
trust_loopback() {
	local hba="$dir/data/pg_hba.conf"
	if [ ! -f "$hba" ] || grep -q '+sas_password_auth' "$hba"; then
		return 1
	fi
	printf '%s\n' 'local all all trust' \
		"$password_hba_rule" \
		'host all all 127.0.0.1/32 trust' 'host all all ::1/128 trust' |
		as_owner tee "$hba" >/dev/null
}

if up; then
	if trust_loopback; then
		as_owner "$bin/pg_ctl" -D "$dir/data" reload >/dev/null
	fi
	have="$(psql "$admin" -qAtX -c 'SHOW max_connections' 2>/dev/null || echo 0)"
	has_fsync="$(psql "$admin" -qAtX -c 'SHOW fsync' 2>/dev/null || echo unknown)"
	if [ "$have" -lt "$max_connections" ] || [ "$has_fsync" != "$fsync" ]; then
		if [ ! -f "$dir/data/postmaster.pid" ]; then
			log "port $port answers but is not the cluster in $dir; set SAS_TEST_PG_PORT"
			exit 1
		fi
		log "restarting the test cluster for max_connections $max_connections and fsync $fsync (it has $have and $has_fsync)"
		as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
	fi
fi

if ! up; then
	if [ ! -f "$dir/data/PG_VERSION" ]; then
		if [ -e "$dir/data" ]; then
			log "$dir/data is there but holds no cluster; remove it or set SAS_TEST_PG_DIR"
			exit 1
		fi
		log "making a cluster in $dir"
		mkdir -p "$dir"
		if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
		as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
	fi
	trust_loopback || true
	log "starting the test cluster on 127.0.0.1:$port"
	as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
		-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=$max_connections -c autovacuum=off -c shared_buffers=128MB -c fsync=$fsync $options" \
		start >/dev/null
fi

psql "$admin" -qAtX -v ON_ERROR_STOP=1 \
	-c "$password_role_sql" >/dev/null
if [ "$(psql "$admin" -qAtX -c "SELECT count(*) FROM pg_database WHERE datname = '$database'")" = "0" ]; then
	psql "$admin" -qAtX -c "CREATE DATABASE \"$database\"" >/dev/null
fi
compact_catalog "$url" "$database"
echo "$url"
