#!/usr/bin/env bash
# Makes sure PostgreSQL and RabbitMQ are up on this machine for tests and
# the local stack: installs them from Debian packages if absent, starts them
# if stopped, and creates the test database. Idempotent; safe to run often.
#
# Usage: scripts/services.sh [--or-own] [--prometheus] [--compose] [--chromium] [DATABASE ...]   (default: sas_test)
#   --or-own      as a user who is not root: install and start nothing, only
#                 make the databases in a PostgreSQL that answers; sasctl dev
#                 starts its own servers, as that user, where none answers
#                 (make demo)
#   --prometheus  also install Prometheus and promtool (Debian package) if absent
#   --compose     also install docker-compose (Debian package), to validate deploy/
#   --chromium    also install Chromium (Debian package), the console's browser tests
# Environment: SAS_PG_ADMIN_URL (default
# postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail

or_own=0
with_prometheus=0
with_compose=0
with_chromium=0
while [ "$#" -gt 0 ]; do
	case "$1" in
	--or-own) or_own=1 ;;
	--prometheus) with_prometheus=1 ;;
	--compose) with_compose=1 ;;
	--chromium) with_chromium=1 ;;
	*) break ;;
	esac
	shift
done
if [ "$#" -eq 0 ]; then set -- sas_test; fi
admin_url="${SAS_PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
apt_updated=0

log() { printf 'services: %s\n' "$*" >&2; }
# shellcheck source=scripts/pg-lib.sh
. "$(dirname "$0")/pg-lib.sh"

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		log "$1 needs root; run this script as root or do it by hand"
		exit 1
	fi
}

apt_install() { # command-that-must-exist-afterwards package...
	local cmd=$1
	shift
	need_root "installing $*"
	if [ "$apt_updated" -eq 0 ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
		apt_updated=1
	fi
	log "installing $*"
	# A package's post-install script may fail to start its service where
	# there is no init system; that is not an error here (we start the
	# service ourselves below), as long as the program is installed.
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; then
		log "apt-get reported an error installing $*; checking whether it is usable anyway"
		DEBIAN_FRONTEND=noninteractive dpkg --configure -a >/dev/null 2>&1 || true
	fi
	if ! command -v "$cmd" >/dev/null 2>&1; then
		log "installing $* did not provide $cmd"
		exit 1
	fi
}

wait_for() { # what, seconds, command...
	local what=$1 secs=$2
	shift 2
	local end=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if [ "$SECONDS" -ge "$end" ]; then
			log "$what did not come up within ${secs}s"
			return 1
		fi
		sleep 0.5
	done
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
pg_admin() { psql "$admin_url" -v ON_ERROR_STOP=1 -qAtX "$@"; }

ensure_postgres() {
	if ! command -v pg_ctlcluster >/dev/null 2>&1; then
		apt_install pg_ctlcluster postgresql
	fi
	if ! pg_up; then
		local version
		version=$(ls /etc/postgresql | sort -V | tail -n1)
		log "starting PostgreSQL $version"
		pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
		wait_for PostgreSQL 60 pg_up
	fi
	if ! pg_admin -c 'SELECT 1' >/dev/null 2>&1; then
		# A fresh Debian install asks for a password on TCP. Trust loopback
		# connections, as on the development machines.
		need_root "configuring PostgreSQL for local trust auth"
		local hba
		hba=$(su postgres -c "psql -qAtX -c 'SHOW hba_file'")
		log "allowing trusted loopback connections in $hba"
		sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
		su postgres -c "psql -qAtX -c 'SELECT pg_reload_conf()'" >/dev/null
		wait_for "PostgreSQL trust auth" 20 pg_admin -c 'SELECT 1'
	fi
	ensure_password_auth
	ensure_databases "$@"
}

ensure_databases() {
	local db
	for db in "$@"; do
		if [ "$(pg_admin -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]; then
			log "creating database $db"
			# Another run may create it at the same moment: that is fine.
			pg_admin -c "CREATE DATABASE \"$db\"" ||
				[ "$(pg_admin -c "SELECT 1 FROM pg_database WHERE datname = '$db'")" = 1 ]
		fi
		compact_catalog "${admin_url%/*}/$db" "$db"
	done
}

# ensure_password_auth: members of sas_password_auth give their password
# (pg-lib.sh).
ensure_password_auth() {
	pg_admin -c "$password_role_sql" >/dev/null
	local hba
	hba=$(pg_admin -c 'SHOW hba_file')
	if [ -r "$hba" ] && grep -q '+sas_password_auth' "$hba"; then
		return
	fi
	if [ "$(id -u)" -ne 0 ]; then
		log "not root: members of sas_password_auth stay trusted on loopback (the password tests will say so)"
		return
	fi
	log "requiring passwords of members of sas_password_auth in $hba"
	sed -i "1i $password_hba_rule" "$hba"
	pg_admin -c 'SELECT pg_reload_conf()' >/dev/null
}

rabbit_up() { rabbitmq-diagnostics -q check_port_connectivity >/dev/null 2>&1; }

ensure_rabbitmq() {
	if ! command -v rabbitmq-server >/dev/null 2>&1; then
		apt_install rabbitmq-server rabbitmq-server
	fi
	if ! rabbit_up; then
		log "starting RabbitMQ"
		rabbitmq-server -detached || true
		wait_for RabbitMQ 120 rabbit_up
	fi
	# Partitions route submits through its consistent-hash exchange
	# (docs/SCALING.md): shipped with RabbitMQ, disabled by default.
	if ! rabbitmq-plugins -q list -e rabbitmq_consistent_hash_exchange 2>/dev/null | grep -q consistent_hash; then
		log "enabling rabbitmq_consistent_hash_exchange"
		rabbitmq-plugins -q enable rabbitmq_consistent_hash_exchange >/dev/null
	fi
}

if [ "$or_own" -eq 1 ] && [ "$(id -u)" -ne 0 ]; then
	log "not root: installing and starting nothing; sasctl dev starts its own PostgreSQL or RabbitMQ, as $(id -un), where none answers"
	if pg_up && pg_admin -c 'SELECT 1' >/dev/null 2>&1; then
		ensure_databases "$@"
	fi
	exit 0
fi
ensure_postgres "$@"
ensure_rabbitmq
if [ "$with_prometheus" -eq 1 ] && ! command -v prometheus >/dev/null 2>&1; then
	apt_install prometheus prometheus
fi
if [ "$with_compose" -eq 1 ] && ! command -v docker-compose >/dev/null 2>&1; then
	apt_install docker-compose docker-compose
fi
if [ "$with_chromium" -eq 1 ] && ! command -v chromium >/dev/null 2>&1; then
	apt_install chromium chromium
fi
log "PostgreSQL and RabbitMQ are up; database(s) $* exist"
