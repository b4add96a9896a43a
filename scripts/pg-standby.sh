#!/usr/bin/env bash
# A PostgreSQL primary and a streaming standby on this machine, as a test
# fixture: the primary on port BASE+1, the standby (made with
# pg_basebackup) on BASE+2, data under DIR, run as the postgres user. With
# MODE sync the primary waits for the standby to flush every commit
# (synchronous_standby_names); with async it does not; with alone there is
# no standby (a server of its own, as a partition's store in a test).
#
# Usage: scripts/pg-standby.sh start DIR BASE sync|async|alone   (prints the (multi-host) URL)
#        scripts/pg-standby.sh crash DIR BASE              stop the primary with -m immediate (a crash)
#        scripts/pg-standby.sh restart DIR BASE            restart the primary (-m fast: what an upgrade or a
#                                                          configuration change does)
#        scripts/pg-standby.sh promote DIR BASE            promote the standby
#        scripts/pg-standby.sh stop DIR BASE               stop both and remove DIR
set -euo pipefail

cmd=${1:?usage: pg-standby.sh start|crash|restart|promote|stop DIR BASE [sync|async|alone]}
dir=${2:?DIR}
base=${3:?BASE}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)

log() { printf 'pg-standby: %s\n' "$*" >&2; }

as_postgres() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

ctl() { as_postgres "$bin/pg_ctl" "$@"; }

case "$cmd" in
start)
	mode=${4:?sync|async}
	mkdir -p "$dir"
	if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$dir"; fi
	as_postgres "$bin/initdb" -D "$dir/primary" -U postgres --auth=trust >/dev/null
	sync_names="''"
	if [ "$mode" = sync ]; then sync_names="'standby'"; fi
	cat >>"$dir/primary/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $((base + 1))
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 5
hot_standby = on
synchronous_standby_names = $sync_names
synchronous_commit = on
max_connections = 200
autovacuum = off
log_timezone = 'UTC'
log_line_prefix = '%m [%p] '
EOF
	echo "host replication all 127.0.0.1/32 trust" >>"$dir/primary/pg_hba.conf"
	ctl -D "$dir/primary" -l "$dir/primary.log" -w start >/dev/null
	if [ "$mode" = alone ]; then
		log "server on $((base + 1))"
		echo "postgres://postgres@127.0.0.1:$((base + 1))/postgres?sslmode=disable"
		exit 0
	fi
	as_postgres "$bin/pg_basebackup" -h 127.0.0.1 -p $((base + 1)) -U postgres -D "$dir/standby" -R -X stream >/dev/null
	# Promoted, it has no standby of its own: it must not wait for one
	# (the copied configuration names one), or every commit would hang.
	# That is what an operator or Patroni does on a failover, here ahead.
	cat >>"$dir/standby/postgresql.conf" <<EOF
port = $((base + 2))
synchronous_standby_names = ''
EOF
	# pg_basebackup -R wrote primary_conninfo; name the standby for
	# synchronous_standby_names.
	sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=standby /" "$dir/standby/postgresql.auto.conf"
	ctl -D "$dir/standby" -l "$dir/standby.log" -w start >/dev/null
	want=async
	if [ "$mode" = sync ]; then want=sync; fi
	for _ in $(seq 1 100); do
		state=$(as_postgres "$bin/psql" -h 127.0.0.1 -p $((base + 1)) -U postgres -qAtX -c \
			"SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'" || true)
		if [ "$state" = "$want" ]; then
			log "primary on $((base + 1)), $mode standby on $((base + 2)), streaming"
			echo "postgres://postgres@127.0.0.1:$((base + 1)),127.0.0.1:$((base + 2))/postgres?target_session_attrs=read-write&sslmode=disable"
			exit 0
		fi
		sleep 0.2
	done
	log "the standby is not streaming ($want) after 20 s"
	exit 1
	;;
crash)
	ctl -D "$dir/primary" -m immediate stop >/dev/null
	;;
promote)
	ctl -D "$dir/standby" -w promote >/dev/null
	;;
restart)
	ctl -D "$dir/primary" -l "$dir/primary.log" -m fast -w restart >/dev/null
	;;
stop)
	for node in primary standby; do
		if [ -d "$dir/$node" ]; then
			ctl -D "$dir/$node" -m immediate stop >/dev/null 2>&1 || true
		fi
	done
	rm -rf "$dir"
	;;
*)
	echo "usage: pg-standby.sh start|crash|restart|promote|stop DIR BASE [sync|async|alone]" >&2
	exit 2
	;;
esac
