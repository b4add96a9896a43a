#!/usr/bin/env bash
# A first look at sas on this machine: starts PostgreSQL and RabbitMQ if
# needed, migrates the "sas" database, runs the submitter, posts sample
# orders through the submit queue and shows them in the state store.
# Orders stay "received" until the scheduler and agents exist.
set -euo pipefail
cd "$(dirname "$0")/.."

orders="${DEMO_ORDERS:-500}"
./scripts/services.sh sas
export SAS_DATABASE_URL="${SAS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sas?sslmode=disable}"
export SAS_METRICS_ADDR="${SAS_METRICS_ADDR:-127.0.0.1:9101}"
logs=$(mktemp -d /tmp/sas-demo.XXXXXX)

bin/sasctl migrate
bin/submitter 2>"$logs/submitter.log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT

before=$(psql "$SAS_DATABASE_URL" -qAtX -c 'SELECT count(*) FROM orders')
bin/sasctl submit --count "$orders"
want=$((before + orders))
for _ in $(seq 1 300); do
	now=$(psql "$SAS_DATABASE_URL" -qAtX -c 'SELECT count(*) FROM orders')
	printf '\rorders in the state store: %d/%d' "$now" "$want"
	[ "$now" -ge "$want" ] && break
	kill -0 $pid 2>/dev/null || { echo; echo "submitter exited; see $logs/submitter.log"; exit 1; }
	sleep 0.2
done
echo
bin/sasctl orders list --limit 5
echo
echo "submitter metrics: http://$SAS_METRICS_ADDR/metrics   logs: $logs/"
echo "inspect an order:  bin/sasctl orders show ID"
