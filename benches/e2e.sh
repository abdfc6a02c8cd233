#!/usr/bin/env bash
# End-to-end load run on this machine: the release server pinned to core 0, the load
# generator (examples/loadgen.rs) to core 1. For OTLP/gRPC and OTLP/HTTP it reports spans/s
# at full speed, the server's CPU-seconds per million spans (from /proc/<pid>/stat, so a
# load generator sharing the machine does not skew it), its peak RSS, and the p50/p99 export
# latency at half of the maximum rate.
#   benches/e2e.sh [SECONDS [LOADGEN OPTIONS...]]   (default 10 seconds a run)
# e.g. `benches/e2e.sh 5 --clients 16` for a fleet whose tracker state stays in the cache.
# With FORWARD=gzip (or zstd, or none) the server forwards every span it tags over OTLP/HTTP, with that
# compression, to a sink that drops them (examples/sink.rs, on the load generator's core).
#
# Every run gets a fresh server: the load generator's span times start over each run, and a
# server that had seen the previous run would take them all as late arrivals.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
extra=("$@")
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
forward=${FORWARD:-}
config=""
if [[ -n $forward ]]; then
  cargo build --release --quiet --example sink
  sink=$(free_port)
  taskset -c 1 target/release/examples/sink "127.0.0.1:$sink" >/dev/null &
  sink_pid=$!
  trap 'kill "${pid:-0}" "$sink_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
  config="exporters:
  otlp: { endpoint: 'http://127.0.0.1:$sink', protocol: http/protobuf, compression: $forward }"
fi
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

# load TRANSPORT [LOADGEN OPTIONS...]: one run against a fresh server; sets $out (the load
# generator's last line), $cpu_per_m and $rss.
load() {
  local transport=$1
  shift
  start_server "$config" -- taskset -c 0
  local port=$grpc
  [[ $transport == http ]] && port=$http
  local before
  before=$(cpu)
  out=$(taskset -c 1 target/release/examples/loadgen --protocol "$transport" \
    --endpoint "http://127.0.0.1:$port" --duration "$seconds" --concurrency 8 "${extra[@]}" "$@" | tail -1)
  local after
  after=$(cpu)
  cpu_per_m=$(awk -v c=$((after - before)) -v t="$ticks" -v s="$(field "$out" spans)" \
    'BEGIN { printf "%.3f", c / t / (s / 1e6) }')
  rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

[[ -n $forward ]] && echo "forwarding every span over OTLP/HTTP ($forward) to a sink"
printf '%-6s %12s %16s %10s %10s %10s\n' transport spans/s cpu-s/Mspans peak-RSS p50@half p99@half
for transport in grpc http; do
  load "$transport"
  rate=$(field "$out" spans_per_sec) full_cpu=$cpu_per_m full_rss=$rss
  load "$transport" --rate "$(awk -v r="$rate" 'BEGIN { printf "%d", r / 2 }')"
  printf '%-6s %12s %16s %10s %8s us %8s us\n' "$transport" "$rate" "$full_cpu" "$full_rss" \
    "$(field "$out" p50_us)" "$(field "$out" p99_us)"
done
