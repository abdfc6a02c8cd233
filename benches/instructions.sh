#!/usr/bin/env bash
# User-space instructions per span, counted by valgrind's callgrind on the release server
# under the load generator: a figure that moves far less than CPU time with whatever else the
# machine is doing (the same binary gives it within about 1.5 % on an idle machine, a few per
# cent on a busy one: the tracker settles by the clock). It leaves out the
# kernel and the cost of cache misses, which CPU time includes; compare builds with it, and
# measure end to end with benches/e2e.sh.
#   benches/instructions.sh [SECONDS [LOADGEN OPTIONS...]]   (default 6 seconds)
# PROTOCOL=grpc (default) or http; SERVER=path measures another build (an older one, for an
# A/B). The load generator first runs 3 seconds so that every key is known, then the counters
# are zeroed and the measured run starts. Prints spans, instructions per span without the
# sweeper (it runs by the clock, and under valgrind the clock runs fast against the work),
# and where they go.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-6}
shift || true
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
out="$work/callgrind.out"
start_server "" -- taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out"
port=$grpc
[[ ${PROTOCOL:-grpc} == http ]] && port=$http
load() {
  taskset -c 1 target/release/examples/loadgen --protocol "${PROTOCOL:-grpc}" \
    --endpoint "http://127.0.0.1:$port" --concurrency 8 "$@" | tail -1
}
load --duration 3 "$@" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
result=$(load --duration "$seconds" "$@")
callgrind_control -d "$pid" >/dev/null 2>&1
kill "$pid"
wait "$pid" 2>/dev/null || true
spans=$(tr ' ' '\n' <<<"$result" | sed -n 's/^spans=//p')
dump=$(ls "$out".* | head -1)
callgrind_annotate --inclusive=yes "$dump" 2>/dev/null > "$work/inclusive"
# The inclusive count of the first line naming FUNCTION, 0 when none does.
count() { { grep -m1 -F "$1" "$work/inclusive" || echo 0; } | awk '{ gsub(",", "", $1); print $1 + 0 }'; }
total=$(awk '/^totals:/ { print $2 }' "$dump")
sweep=$(count 'Pipeline::sweep ')
per() { awk -v v="$1" -v s="$spans" 'BEGIN { printf "%.0f", v / s }'; }
echo "protocol=${PROTOCOL:-grpc} spans=$spans instructions_per_span=$(per $((total - sweep)))"
for f in 'Pipeline::ingest ' 'extract::read ' 'wire::attributes ' 'SpanRef::parse ' \
  'converts::from_utf8 ' 'Tracker::observe_all ' 'StreamingInner::poll_frame ' \
  'Connection<T,P,B>::poll '; do
  printf '  %-28s %6s a span\n' "$f" "$(per "$(count "$f")")"
done
