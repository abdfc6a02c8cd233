#!/usr/bin/env bash
# End-to-end load run on this machine: the release server pinned to core 0, the load
# generator (examples/loadgen.rs) to core 1. For OTLP/gRPC and OTLP/HTTP it reports spans/s
# at full speed, the server's CPU-seconds per million spans and spans per CPU-second (from
# /proc/<pid>/stat, so a load generator sharing the machine does not skew it), the keys
# tracked at the end, its peak RSS, and the p50/p99 export latency at half of the maximum rate.
#   benches/e2e.sh [SECONDS [LOADGEN OPTIONS...]]   (default 10 seconds a run)
# e.g. `benches/e2e.sh 5 --clients 1000` for a fleet of 45,000 keys.
#
# FORWARD=grpc (or http): the server forwards every span it tags, over that protocol, to a
# sink that drops them (examples/sink.rs, on the load generator's core); COMPRESSION=gzip
# (the exporter's default), zstd or none is the forwarding's compression.
# BASELINE=path/to/an/older/refusal-gate: every full-speed run is made with that binary
# and with this one, alternately (ROUNDS pairs, default 3, each pair in the other order from
# the last), and both medians are reported, with the median of the pairs' ratios of CPU
# per span (an odd ROUNDS gives a true median) — compare within one run, the machines are
# shared.
# WORKLOAD=tree (or `--workload tree` among the load generator's options): the workload of
# every run (flat by default), for an A/B with BASELINE on call trees.
# TREES=1: the same, this binary on the flat workload and on call trees (`--workload tree`:
# an agent's INTERNAL span, a protocol CLIENT span, its HTTP child, half the calls split over
# two requests; `--split 0` among the load generator's options sends every call whole),
# alternately; the ratio is trees' CPU per span over the flat workload's.
#
# TRANSPORTS='grpc' (default 'grpc http'): the transports measured, in that order; with both,
# the last lines give OTLP/HTTP's CPU per span over OTLP/gRPC's, for each binary or workload
# (so `TREES=1 benches/e2e.sh` prints issue 48's four figures and its three ratios in one run).
# CONFIG='yaml lines': added to the server's configuration, e.g. raised label caps:
# CONFIG='metrics: { max_clients: 100000, max_series: 200000 }' benches/e2e.sh 15 --clients 10000
#
# Every run gets a fresh server: the load generator's span times start over each run, and a
# server that had seen the previous run would take them all as late arrivals.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
# `--workload` is the script's to give each run (below): taken out of the options and kept.
workload=${WORKLOAD:-flat}
extra=()
while (($#)); do
  if [[ $1 == --workload ]]; then
    workload=${2:?--workload needs flat or tree}
    shift 2
  else
    extra+=("$1")
    shift
  fi
done
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
forward=${FORWARD:-}
compression=${COMPRESSION:-gzip}
baseline=${BASELINE:-}
rounds=${ROUNDS:-3}
config=${CONFIG:-}
if [[ -n $forward ]]; then
  cargo build --release --quiet --example sink
  sink_http=$(free_port)
  sink_grpc=$(free_port)
  taskset -c 1 target/release/examples/sink "127.0.0.1:$sink_http" "127.0.0.1:$sink_grpc" >/dev/null &
  sink_pid=$!
  trap 'kill "${pid:-0}" "$sink_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
  case $forward in
    grpc) config+="
exporters:
  otlp: { endpoint: 'http://127.0.0.1:$sink_grpc', protocol: grpc, compression: $compression }" ;;
    http) config+="
exporters:
  otlp: { endpoint: 'http://127.0.0.1:$sink_http', protocol: http/protobuf, compression: $compression }" ;;
    *) echo "FORWARD is grpc or http" >&2; exit 2 ;;
  esac
fi
[[ -n $forward ]] && echo "forwarding every span over OTLP/$forward ($compression) to a sink"
binaries=(target/release/refusal-gate)
names=(this)
workloads=("$workload")
if [[ -n $baseline ]]; then
  binaries=("$baseline" target/release/refusal-gate)
  names=(baseline this)
  workloads=("$workload" "$workload")
elif [[ -n ${TREES:-} ]]; then
  binaries=(target/release/refusal-gate target/release/refusal-gate)
  names=(flat trees)
  workloads=(flat tree)
else
  rounds=1
fi
declare -A medians=()
printf '%-6s %-8s %12s %14s %14s %8s %10s %10s %10s\n' transport binary spans/s cpu-s/Mspans Mspans/cpu-s keys peak-RSS p50@half p99@half
for transport in ${TRANSPORTS:-grpc http}; do
  declare -A rates=() cpus=() last_rss=() last_keys=() pair=()
  ratios=""
  for round in $(seq "$rounds"); do
    order=("${!binaries[@]}")
    ((round % 2 == 0)) && order=($(printf '%s\n' "${order[@]}" | tac))
    for i in "${order[@]}"; do
      load "${binaries[$i]}" "$transport" --workload "${workloads[$i]}"
      rates[$i]+="$(field "$out" spans_per_sec) "
      cpus[$i]+="$cpu_per_m "
      pair[$i]=$cpu_per_m
      last_rss[$i]=$rss
      last_keys[$i]=$keys
    done
    ((${#binaries[@]} == 2)) && ratios+="$(awk -v a="${pair[0]}" -v b="${pair[1]}" 'BEGIN { printf "%.3f", b / a }') "
  done
  for i in "${!binaries[@]}"; do
    rate=$(median "${rates[$i]}") full_cpu=$(median "${cpus[$i]}")
    p50=- p99=-
    if [[ ${names[$i]} != baseline ]]; then
      load "${binaries[$i]}" "$transport" --workload "${workloads[$i]}" \
        --rate "$(awk -v r="$rate" 'BEGIN { printf "%d", r / 2 }')"
      p50="$(field "$out" p50_us) us" p99="$(field "$out" p99_us) us"
    fi
    printf '%-6s %-8s %12s %14s %14s %8s %10s %10s %10s\n' "$transport" "${names[$i]}" "$rate" \
      "$full_cpu" "$(awk -v c="$full_cpu" 'BEGIN { printf "%.2fM", 1 / c }')" "${last_keys[$i]}" \
      "${last_rss[$i]}" "$p50" "$p99"
  done
  if ((${#binaries[@]} == 2)); then
    echo "$transport: ${names[1]}/${names[0]} CPU per span, median of $rounds pairs: $(median "$ratios") (pairs: $ratios)"
  fi
  for i in "${!binaries[@]}"; do medians[$transport/${names[$i]}]=$(median "${cpus[$i]}"); done
  unset rates cpus last_rss last_keys pair
done
# Both transports measured: OTLP/HTTP's CPU per span over OTLP/gRPC's, for each binary (or
# workload), from the medians above.
if [[ -n ${medians[grpc/${names[0]}]:-} && -n ${medians[http/${names[0]}]:-} ]]; then
  for name in "${names[@]}"; do
    echo "$name: http/grpc CPU per span, medians: $(awk -v h="${medians[http/$name]}" \
      -v g="${medians[grpc/$name]}" 'BEGIN { printf "%.3f", h / g }')"
  done
fi
