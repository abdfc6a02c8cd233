#!/usr/bin/env bash
# What a key past `tracker.max_keys` costs (issue 66): the release server on core 0, the load
# generator on core 1 (as benches/e2e.sh), every span of every request opening a key of its
# client (`loadgen --fresh-keys 1`: a tools/call of a tool never called before). Each fleet
# (one client; a thousand) runs against a server with room for every key it opens (`max_keys`
# 20,000,000: "below") and against one already full after its first tenth of a second
# (`max_keys` 100,000: "past", every new key evicting another), the four runs interleaved
# round by round. Reports the server's CPU-seconds a million spans (median of ROUNDS runs,
# default 3), past / below, the keys and evictions at the end, and the slowest `/readyz`
# answer seen while the load ran (polled every 20 ms from core 1).
#   benches/eviction.sh [SECONDS]   (default 8 seconds a run)
# SERVER=path measures that binary instead of the one just built.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-8}
rounds=${ROUNDS:-3}
work=$(mktemp -d)
trap 'kill "${pid:-0}" "${poller:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
extra=(--fresh-keys 1)

# readyz_slowest: polls /readyz every 20 ms until $work/stop exists, then prints the slowest
# answer in milliseconds (or "failed" if one was not 200).
readyz_slowest() {
  local slowest=0 took
  while [[ ! -e $work/stop ]]; do
    took=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "http://127.0.0.1:$admin/readyz")
    [[ ${took%% *} == 200 ]] || { echo failed; return; }
    slowest=$(awk -v a="$slowest" -v b="${took#* }" 'BEGIN { print (b * 1000 > a ? b * 1000 : a) }')
    sleep 0.02
  done
  printf '%.1f\n' "$slowest"
}

fleets=(1 1000)
bounds=(below past)
declare -A limit=([below]=20000000 [past]=100000)
declare -A cpus=() slowest=() keys=() evicted=()
for round in $(seq "$rounds"); do
  for clients in "${fleets[@]}"; do
    for bound in "${bounds[@]}"; do
      rm -f "$work/stop"
      start_server "tracker: { max_keys: ${limit[$bound]} }" -- taskset -c 0
      taskset -c 1 bash -c "$(declare -f readyz_slowest); work=$work admin=$admin readyz_slowest" \
        >"$work/readyz" &
      poller=$!
      before=$(cpu)
      out=$(taskset -c 1 target/release/examples/loadgen --protocol grpc \
        --endpoint "http://127.0.0.1:$grpc" --duration "$seconds" --clients "$clients" \
        "${extra[@]}" | tail -1)
      after=$(cpu)
      touch "$work/stop"
      wait "$poller"
      run="$clients-$bound"
      cpus[$run]+="$(awk -v c=$((after - before)) -v t="$ticks" -v s="$(field "$out" spans)" \
        'BEGIN { printf "%.3f", c / t / (s / 1e6) }') "
      slowest[$run]+="$(cat "$work/readyz") "
      metrics=$(curl -s "http://127.0.0.1:$admin/metrics")
      keys[$run]=$(awk '$1 == "refusal_gate_tracker_keys" { print $2 }' <<<"$metrics")
      evicted[$run]=$(awk '/^refusal_gate_tracker_evictions_total\{reason="capacity"\}/ { print $2 }' \
        <<<"$metrics")
      kill "$pid"
      wait "$pid" 2>/dev/null || true
    done
  done
done

echo "OTLP/grpc, every span a new key, $seconds s a run, median of $rounds rounds"
printf '%-8s %-6s %14s %10s %10s %12s %s\n' clients bound CPU-s/Mspans past/below keys evicted \
  'slowest /readyz (ms, each run)'
for clients in "${fleets[@]}"; do
  base=$(median "${cpus[$clients-below]}")
  for bound in "${bounds[@]}"; do
    run="$clients-$bound"
    cpu=$(median "${cpus[$run]}")
    printf '%-8s %-6s %14s %10s %10s %12s %s\n' "$clients" "$bound" "$cpu" \
      "$(awk -v c="$cpu" -v b="$base" 'BEGIN { printf "%.2f", c / b }')" "${keys[$run]}" \
      "${evicted[$run]:-0}" "${slowest[$run]}"
  done
done
