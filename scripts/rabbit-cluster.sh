#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, as a test fixture: nodes
# NAME1@localhost, NAME2@localhost and NAME3@localhost with AMQP on
# BASE+1, BASE+2 and BASE+3 (Erlang distribution on those plus 20000), no
# plugins, data and logs under DIR. They share the machine's Erlang cookie
# and epmd with any other RabbitMQ here.
#
# NODES=1 starts one node alone; CONF names a file whose lines are added to
# every node's configuration (rabbitmq.conf form); PLUGINS, a list of
# plugins separated by commas, enables them on every node (none by default).
#
# Usage: scripts/rabbit-cluster.sh start DIR BASE NAME     start the nodes and join them (prints the AMQP URLs)
#        scripts/rabbit-cluster.sh stop DIR BASE NAME      stop them and remove DIR
#        scripts/rabbit-cluster.sh restart DIR BASE NAME N stop node N and start it again, its data kept
#        scripts/rabbit-cluster.sh pid DIR BASE NAME N     the OS process id of node N
set -euo pipefail

cmd=${1:?usage: rabbit-cluster.sh start|stop|restart|pid DIR BASE NAME [N]}
dir=${2:?DIR}
base=${3:?BASE}
name=${4:?NAME}
nodes=${NODES:-3}
case "$nodes" in 1 | 2 | 3) ;; *)
	echo "rabbit-cluster: NODES must be 1, 2 or 3" >&2
	exit 2
	;;
esac

log() { printf 'rabbit-cluster: %s\n' "$*" >&2; }

node() { echo "${name}$1@localhost"; }

node_env() { # N: the environment of node N
	local n=$1
	echo "RABBITMQ_NODENAME=$(node "$n")" \
		"RABBITMQ_NODE_PORT=$((base + n))" \
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
		"RABBITMQ_MNESIA_BASE=$dir/mnesia" \
		"RABBITMQ_LOG_BASE=$dir/log" \
		"RABBITMQ_PID_FILE=$dir/node$n.pid" \
		"RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins" \
		"RABBITMQ_CONFIG_FILE=$dir/node$n" \
		"RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config"
}

ctl() { # N args...: rabbitmqctl against node N
	local n=$1
	shift
	rabbitmqctl -q -n "$(node "$n")" "$@"
}

case "$cmd" in
start)
	mkdir -p "$dir/mnesia" "$dir/log"
	echo "[${PLUGINS:-}]." >"$dir/enabled_plugins"
	echo '[].' >"$dir/advanced.config"
	for n in $(seq "$nodes"); do
		# guest may log in from loopback; a minority side pauses.
		printf 'loopback_users.guest = true\ncluster_partition_handling = pause_minority\n' >"$dir/node$n.conf"
		if [ -n "${CONF:-}" ]; then
			cat "$CONF" >>"$dir/node$n.conf"
		fi
	done
	# Debian's rabbitmq-server runs the node as the rabbitmq user.
	if [ "$(id -u)" -eq 0 ] && id rabbitmq >/dev/null 2>&1; then
		chown -R rabbitmq:rabbitmq "$dir"
	fi
	for n in $(seq "$nodes"); do
		log "starting $(node "$n") on port $((base + n))"
		env $(node_env "$n") rabbitmq-server -detached
	done
	for n in $(seq "$nodes"); do
		# wait: for the pid file, then for the node to boot.
		ctl "$n" wait "$dir/node$n.pid" --timeout 120 >/dev/null
	done
	for n in $(seq 2 "$nodes"); do
		ctl "$n" stop_app >&2
		ctl "$n" join_cluster "$(node 1)" >&2
		ctl "$n" start_app >&2
	done
	ctl 1 await_online_nodes "$nodes" --timeout 60 >&2
	urls=()
	for n in $(seq "$nodes"); do
		urls+=("amqp://guest:guest@127.0.0.1:$((base + n))/")
	done
	log "$nodes node(s) up: $(for n in $(seq "$nodes"); do printf '%s ' "$(node "$n")"; done)"
	(
		IFS=,
		echo "${urls[*]}"
	)
	;;
stop)
	# The data goes with DIR, so nothing is shut down with care: each
	# node started (its pid file) is killed. A rabbitmqctl stop boots an
	# Erlang VM of its own, about 1.4 s of CPU on a 2-vCPU machine, even
	# for a node that is not there (a first start's clean-up, a cluster
	# of one).
	pids=()
	for n in 1 2 3; do
		if [ -f "$dir/node$n.pid" ]; then
			pid="$(cat "$dir/node$n.pid")"
			if kill -9 "$pid" 2>/dev/null; then
				pids+=("$pid")
			fi
		fi
	done
	# Gone before DIR is: a node's last writes would land in it.
	for pid in "${pids[@]}"; do
		for _ in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
	done
	rm -rf "$dir"
	;;
restart)
	n=${5:?N}
	log "restarting $(node "$n")"
	ctl "$n" stop >&2
	env $(node_env "$n") rabbitmq-server -detached
	ctl "$n" wait "$dir/node$n.pid" --timeout 120 >/dev/null
	;;
pid)
	n=${5:?N}
	cat "$dir/node$n.pid"
	;;
*)
	echo "usage: rabbit-cluster.sh start|stop|restart|pid DIR BASE NAME [N]" >&2
	exit 2
	;;
esac
