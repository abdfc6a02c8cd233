#!/usr/bin/env bash
# User-space instructions per span, counted by valgrind's callgrind on the release server
# under the load generator: a figure that moves far less than CPU time with whatever else the
# machine is doing (the same binary gives it within about 1.5 % on an idle machine, a few per
# cent on a busy one: the tracker settles by the clock). It leaves out the
# kernel and the cost of cache misses, which CPU time includes; compare builds with it, and
# measure end to end with benches/e2e.sh.
#   benches/instructions.sh [SECONDS [LOADGEN OPTIONS...]]   (default 6 seconds)
# KEEP=path keeps the callgrind output there (for callgrind_annotate). PROTOCOL=grpc (default) or http; SERVER=path measures another build (an older one, for an
# A/B); WARM=seconds of load before the count starts (default 10: every key known and its
# history grown). One load run does both, so its span times run on in order: a second run
# would start its times over, and the server would take every span of it for a late arrival
# and measure that path instead. The load generator is paused (SIGSTOP) while the counters
# are zeroed after the warm-up and again while they are dumped SECONDS later, so that the
# server's own count of spans accepted, read in both pauses, covers the same work. Prints
# spans, instructions per span without the sweeper (it runs by the clock, and under
# valgrind the clock runs fast against the work), and where they go.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-6}
shift || true
warm=${WARM:-10}
work=$(mktemp -d)
# A paused load generator is continued before it is stopped: SIGTERM waits on a stopped one.
trap 'kill -CONT "${load_pid:-0}" 2>/dev/null; kill "${pid:-0}" "${load_pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
out="$work/callgrind.out"
start_server "" -- taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out"
port=$grpc
[[ ${PROTOCOL:-grpc} == http ]] && port=$http
# The spans the server has accepted so far, by its own counter.
accepted() {
  curl -s "http://127.0.0.1:$admin/metrics" |
    awk '$1 ~ /^refusal_gate_receiver_accepted_spans_total/ { n += $2 } END { printf "%d", n }'
}
taskset -c 1 target/release/examples/loadgen --protocol "${PROTOCOL:-grpc}" \
  --endpoint "http://127.0.0.1:$port" --concurrency 8 --duration $((warm + seconds + 30)) "$@" \
  >/dev/null &
load_pid=$!
# Stops the load and lets the requests in flight finish.
pause() { kill -STOP "$load_pid"; sleep 1; }
sleep "$warm"
pause
before=$(accepted)
callgrind_control -z "$pid" >/dev/null 2>&1
kill -CONT "$load_pid"
sleep "$seconds"
pause
callgrind_control -d "$pid" >/dev/null 2>&1
spans=$(($(accepted) - before))
kill -CONT "$load_pid"
kill "$load_pid" "$pid"
wait "$pid" 2>/dev/null || true
dump=$(ls "$out".* | head -1)
[[ -n ${KEEP:-} ]] && cp "$dump" "$KEEP"
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
