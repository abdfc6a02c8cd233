#!/usr/bin/env bash
# Soak: drives the release server at a steady rate with a churning fleet — every request
# from a client instance never seen before, so every key is new — for a configurable time,
# sampling the server's resident memory and open file descriptors every 10 seconds. Fails
# (exit 1) when either grows past its bound, or when the memory of the last third of the run
# has grown by more than a tenth over the middle third (a leak, even under the bound).
#   benches/soak.sh [MINUTES] [SPANS_PER_SECOND]     (default 30 minutes, 20000 spans/s)
# Bounds (environment): SOAK_RSS_MIB (default 400), SOAK_FDS (default 256). The growth check
# needs a run well past the warm-up (the tracker fills to max_keys in the first minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
rate=${2:-20000}
rss_bound=${SOAK_RSS_MIB:-400}
fd_bound=${SOAK_FDS:-256}
work=$(mktemp -d)
trap 'kill "${pid:-0}" "${gen:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
# Small caps, so the run reaches every bound well within its time: the tracker evicts,
# labels overflow, and series expire, all the while.
start_server "tracker:
  max_keys: 100000
metrics:
  max_clients: 200
  series_ttl: 2m"
target/release/examples/loadgen --protocol grpc --endpoint "http://127.0.0.1:$grpc" \
  --duration $((minutes * 60)) --rate "$rate" --concurrency 4 --fresh-clients 1 \
  >"$work/loadgen.out" &
gen=$!
samples=()
printf '%8s %10s %6s %12s\n' seconds rss-MiB fds tracker-keys
start=$(date +%s)
while kill -0 "$gen" 2>/dev/null; do
  sleep 10
  kill -0 "$pid" || { echo "soak: the server died"; cat "$work/server.log"; exit 1; }
  rss=$(awk '/VmRSS/ { printf "%d", $2 / 1024 }' "/proc/$pid/status")
  fds=$(ls "/proc/$pid/fd" | wc -l)
  keys=$(curl -sf "http://127.0.0.1:$admin/metrics" | awk '/^refusal_gate_tracker_keys / { print $2 }')
  printf '%8d %10d %6d %12s\n' $(( $(date +%s) - start )) "$rss" "$fds" "$keys"
  samples+=("$rss")
  if (( rss > rss_bound )); then echo "soak: RSS ${rss} MiB over the bound ${rss_bound} MiB"; exit 1; fi
  if (( fds > fd_bound )); then echo "soak: ${fds} open files over the bound ${fd_bound}"; exit 1; fi
done
wait "$gen"
tail -1 "$work/loadgen.out"
n=${#samples[@]}
if (( n >= 6 )); then
  third=$(( n / 3 ))
  middle=0; last=0
  for ((i = third; i < 2 * third; i++)); do middle=$(( middle > samples[i] ? middle : samples[i] )); done
  for ((i = 2 * third; i < n; i++)); do last=$(( last > samples[i] ? last : samples[i] )); done
  echo "soak: peak RSS ${middle} MiB in the middle third, ${last} MiB in the last"
  if (( last * 10 > middle * 11 )); then echo "soak: memory still growing"; exit 1; fi
fi
echo "soak: passed — $n samples, RSS ${samples[0]} → ${samples[n-1]} MiB"
