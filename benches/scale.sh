#!/usr/bin/env bash
# Fleet sizes on one replica (issue 31): the release server on core 0, the load generator
# (examples/loadgen.rs) on core 1, as in benches/e2e.sh. For each fleet it reports the
# clients, the keys tracked at the end, spans per server CPU-second at full speed (median of
# ROUNDS runs, default 3, the fleets interleaved round by round) and its ratio to the
# 100-client fleet of the same run, the peak RSS, and the p50/p99 export latency at half
# of the full-speed rate.
#   benches/scale.sh [SECONDS]   (default 15 seconds a run)
# TRANSPORT=http measures OTLP/HTTP instead of OTLP/gRPC; FLEETS='100 22k' runs only those
# (the first is the baseline of the ratios); LOADGEN='--rate 600000' passes options to every
# run of the load generator; TRACKER='reorder_window: 3s' adds those settings to every fleet's
# tracker block; SERVER=path measures that binary instead of the one just built (run it once
# each way for an A/B). The fleets:
#   100      100 clients (4,500 keys), the default configuration: the baseline
#   10k      10,000 clients (450,000 keys), the default label caps (most clients share the
#            overflow series)
#   10k-raw  10,000 clients with the caps raised so each client is its own series
#            (metrics.max_clients 100,000, max_series 200,000)
#   22k      22,300 clients, 1,003,500 keys, every key tracked (tracker.max_keys raised)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-15}
rounds=${ROUNDS:-3}
transport=${TRANSPORT:-grpc}
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
read -ra extra <<<"${LOADGEN:-}"

names=(100 10k 10k-raw 22k)
clients=(100 10000 10000 22300)
metrics=('' '' 'max_clients: 100000, max_series: 200000' '')
trackers=('' '' '' 'max_keys: 1100000')
configs=()
for i in "${!names[@]}"; do
  config=''
  [[ -n ${metrics[$i]} ]] && config+="metrics: { ${metrics[$i]} }"$'\n'
  tracker=${trackers[$i]}
  [[ -n $tracker && -n ${TRACKER:-} ]] && tracker+=', '
  tracker+=${TRACKER:-}
  [[ -n $tracker ]] && config+="tracker: { $tracker }"
  configs+=("$config")
done

if [[ -n ${FLEETS:-} ]]; then
  keep=()
  for f in $FLEETS; do
    for i in "${!names[@]}"; do [[ ${names[$i]} == "$f" ]] && keep+=("$i"); done
  done
  names=($(for i in "${keep[@]}"; do echo "${names[$i]}"; done))
  clients=($(for i in "${keep[@]}"; do echo "${clients[$i]}"; done))
  kept_configs=()
  for i in "${keep[@]}"; do kept_configs+=("${configs[$i]}"); done
  configs=("${kept_configs[@]}")
fi

declare -A cpus=() rates=() last_keys=() last_rss=()
for round in $(seq "$rounds"); do
  for i in "${!names[@]}"; do
    config=${configs[$i]}
    load "${SERVER:-target/release/refusal-gate}" "$transport" --clients "${clients[$i]}"
    cpus[$i]+="$cpu_per_m "
    rates[$i]+="$(field "$out" spans_per_sec) "
    last_keys[$i]=$keys
    last_rss[$i]=$rss
  done
done

echo "OTLP/$transport, $seconds s a run, median of $rounds rounds"
printf '%-8s %8s %9s %14s %10s %10s %10s %10s\n' fleet clients keys Mspans/cpu-s "vs-${names[0]}" peak-RSS p50@half p99@half
base=$(median "${cpus[0]}")
for i in "${!names[@]}"; do
  cpu=$(median "${cpus[$i]}")
  config=${configs[$i]}
  load target/release/refusal-gate "$transport" --clients "${clients[$i]}" \
    --rate "$(awk -v r="$(median "${rates[$i]}")" 'BEGIN { printf "%d", r / 2 }')"
  printf '%-8s %8s %9s %14s %10s %10s %10s %10s\n' "${names[$i]}" "${clients[$i]}" \
    "${last_keys[$i]}" "$(awk -v c="$cpu" 'BEGIN { printf "%.2fM", 1 / c }')" \
    "$(awk -v c="$cpu" -v b="$base" 'BEGIN { printf "%.2f", b / c }')" "${last_rss[$i]}" \
    "$(field "$out" p50_us) us" "$(field "$out" p99_us) us"
done
