#!/usr/bin/env bash
# sas on this machine: starts PostgreSQL and RabbitMQ if needed, migrates
# the "sas" database, runs the demo remote service (with mild faults), a
# submitter, two schedulers, two agents and a supervisor, posts sample orders through the
# submit queue and follows them to the end. A supervisor recovers steps
# whose attempt ran out of time. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."

orders="${DEMO_ORDERS:-2000}"
./scripts/services.sh sas
export SAS_DATABASE_URL="${SAS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sas?sslmode=disable}"
logs=$(mktemp -d /tmp/sas-demo.XXXXXX)
pids=()
stop() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
run() { # name, env assignments...
	local name=$1
	shift
	env "$@" "bin/${name%-*}" 2>"$logs/$name.log" &
	pids+=($!)
}

bin/sasctl migrate
run remote SAS_REMOTE_ADDR=127.0.0.1:9105 \
	SAS_REMOTE_FAULTS='{"*":{"error_rate":0.05,"rate_limit_rate":0.01,"apply_then_fail_rate":0.01,"latency_min_ms":1,"latency_max_ms":10}}'
run submitter SAS_METRICS_ADDR=127.0.0.1:9101
run scheduler-1 SAS_METRICS_ADDR=127.0.0.1:9102
run scheduler-2 SAS_METRICS_ADDR=127.0.0.1:9112
run agent-1 SAS_METRICS_ADDR=127.0.0.1:9103 SAS_REMOTE_URL=http://127.0.0.1:9105
run agent-2 SAS_METRICS_ADDR=127.0.0.1:9113 SAS_REMOTE_URL=http://127.0.0.1:9105
run supervisor SAS_METRICS_ADDR=127.0.0.1:9104

q() { psql "$SAS_DATABASE_URL" -qAtX -c "$1"; }
since=$(q "SELECT now()")
started=$(date +%s.%N)
bin/sasctl submit --count "$orders"
mine="created_at >= '$since'"
last=-1
stalled=0
while :; do
	ended=$(q "SELECT count(*) FROM orders WHERE $mine AND status IN ('completed', 'failed', 'error')")
	printf '\rorders ended: %d/%d ' "$ended" "$orders"
	[ "$ended" -ge "$orders" ] && break
	for pid in "${pids[@]}"; do
		kill -0 "$pid" 2>/dev/null || { echo; echo "a service exited; see $logs/"; exit 1; }
	done
	if [ "$ended" -eq "$last" ]; then stalled=$((stalled + 1)); else stalled=0; last=$ended; fi
	if [ "$stalled" -ge 240 ]; then
		echo; echo "no order ended for 60 s; see bin/sasctl orders list --status processing and $logs/"
		break
	fi
	sleep 0.25
done
took=$(echo "$(date +%s.%N) - $started" | bc)
echo
psql "$SAS_DATABASE_URL" -qX -c "SELECT status, count(*) AS orders FROM orders WHERE $mine GROUP BY status ORDER BY status"
printf '%d orders ended in %.1f s\n' "$orders" "$took"
echo "metrics: submitter :9101, schedulers :9102 :9112, agents :9103 :9113, supervisor :9104, remote :9105/metrics and /ledger"
echo "logs:    $logs/"
echo "inspect: bin/sasctl orders list --status error; bin/sasctl orders show ID"
