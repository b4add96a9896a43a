#!/usr/bin/env bash
# sas beside DBOS Transact on the same work, in one sitting (make
# bench-dbos): for each scenario, DBOS (bench/dbos) then sas (sasctl bench),
# ROUNDS times, each run's JSON kept, then a Markdown table of the last
# round (docs/BENCHMARKS.md). sas runs as a single-node install does:
# classic queues, on a queue prefix of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DURATION=${DBOS_DURATION:-30s}
WARMUP=${DBOS_WARMUP:-10s}
ROUNDS=${DBOS_ROUNDS:-1}
SCENARIOS=${*:-one-60 three-60 one-max three-max}
OUT=${DBOS_OUT:-bench-dbos}
mkdir -p "$OUT"
(cd bench/dbos && $GO build -o ../../bin/bench-dbos .)
export SAS_DATABASE_URL=${SAS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sas_bench?sslmode=disable}
export SAS_QUEUE_PREFIX=bench-dbos. SAS_QUEUE_TYPE=classic
pairs=()
for sc in $SCENARIOS; do
  case $sc in
    one-60) wf=single steps=1 load=(--rate 60) ;;
    three-60) wf=order steps=3 load=(--rate 60) ;;
    one-max) wf=single steps=1 load=(--rate 0 --inflight 2000) ;;
    three-max) wf=order steps=3 load=(--rate 0 --inflight 2000) ;;
    *) echo "unknown scenario $sc (one-60 three-60 one-max three-max)" >&2; exit 2 ;;
  esac
  for r in $(seq 1 "$ROUNDS"); do
    echo "== $sc round $r: DBOS" >&2
    bin/bench-dbos --steps "$steps" "${load[@]}" --warmup "$WARMUP" --duration "$DURATION" --label "$sc" --json "$OUT/dbos-$sc-$r.json"
    echo "== $sc round $r: sas" >&2
    bin/sasctl bench --workflow "$wf" "${load[@]}" --warmup "$WARMUP" --duration "$DURATION" --drain 60s --purge --label "$sc" --json "$OUT/sas-$sc-$r.json" 2>/dev/null | sed -n '/^completed/p;/^LATENCY/,/^$/p;/all of the above/p'
  done
  pairs+=("$sc=$OUT/sas-$sc-$ROUNDS.json,$OUT/dbos-$sc-$ROUNDS.json")
done
echo
bin/bench-dbos table "${pairs[@]}"
