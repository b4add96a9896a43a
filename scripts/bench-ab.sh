#!/usr/bin/env bash
# A/B in one sitting: builds BASE's binaries beside the working tree's,
# then runs each scenario with both alternately (A B A B ...; A = BASE,
# B = this tree), each run on a fresh schema of sas_bench and empty
# queues, and prints both and the ratio B/A of every figure; the JSON
# (every run and the ratios) goes to bench-ab-<scenario>.json.
#
# Usage: scripts/bench-ab.sh BASE [SCENARIO ...]
#   scenarios: single-max order-max (as fast as absorbed), single-50 and
#   order-50 (50 orders/s offered: the idle path's latency), single-RATE
#   and order-RATE for any other rate. A scenario ending in -limited runs
#   B with every agent kind limited far above what it reaches (a rate of
#   1,000,000/s and as many in flight), A as it is: what declaring a
#   limit costs.
# Environment: AB_ROUNDS (2), AB_WARMUP (10s), AB_DURATION (30s), GO.
set -euo pipefail

base=${1:?usage: scripts/bench-ab.sh BASE [SCENARIO ...]}
shift
scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
	scenarios=(single-max order-max single-50 order-50)
fi
root=$(cd "$(dirname "$0")/.." && pwd)
go=${GO:-go}
rev=$(git -C "$root" rev-parse --short "$base^{commit}")
adir="$root/bin/ab/$rev"

if [ ! -x "$adir/sasctl" ]; then
	wt=$(mktemp -d)
	trap 'git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$wt"' EXIT
	git -C "$root" worktree add --detach "$wt" "$rev" >/dev/null
	echo "bench-ab: building $rev into $adir" >&2
	(cd "$wt" && GOFLAGS=-buildvcs=false "$go" build -o "$adir/" ./cmd/...)
fi
echo "bench-ab: building the working tree into $root/bin" >&2
(cd "$root" && "$go" build -o bin/ ./cmd/...)

export SAS_DATABASE_URL=${SAS_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sas_bench?sslmode=disable}
export SAS_QUEUE_PREFIX=${SAS_QUEUE_PREFIX:-bench.}
limited="$root/bin/ab/limited-workflows.yaml"
{
	cat "$root/deploy/workflows.yaml"
	echo "limits:"
	grep -v '^ *#' "$root/deploy/workflows.yaml" | grep -o 'agent: [a-z_]\+' | sort -u | while read -r _ kind; do
		echo "  $kind: {rate: 1000000/s, burst: 1000000, max_in_flight: 1000000}"
	done
} >"$limited"
for sc in "${scenarios[@]}"; do
	extra=()
	case "$sc" in *-limited)
		sc=${sc%-limited}
		extra=(--env-b "SAS_WORKFLOWS_FILE=$limited")
		label="$sc-limited"
		;;
	*) label=$sc ;;
	esac
	wf=${sc%%-*}
	load=${sc#*-}
	case "$wf" in single | order) ;; *)
		echo "bench-ab: unknown scenario $sc (want single-max, order-50, ...)" >&2
		exit 2
		;;
	esac
	flags=(--workflow "$wf")
	if [ "$load" != max ]; then
		flags+=(--rate "$load" --drain 30s)
	fi
	"$root/bin/sasctl" bench --against "$adir" --rounds "${AB_ROUNDS:-2}" "${flags[@]}" "${extra[@]}" \
		--warmup "${AB_WARMUP:-10s}" --duration "${AB_DURATION:-30s}" --label "$label" --json "bench-ab-$label.json"
done
