#!/usr/bin/env bash
# Side by side with the OpenTelemetry Collector (issue 64): the same load generator
# (examples/loadgen.rs) into refusal-gate and into the Collector doing the nearest job it has
# — its OTLP receiver → the span_metrics connector, with the status and JSON-RPC code as
# dimensions → its Prometheus exporter — each server pinned to core 0, the generator to core 1,
# one fresh server a run, the two alternately (ROUNDS pairs, default 3, each pair in the other
# order from the last). For OTLP/gRPC and OTLP/HTTP, flat spans and call trees, it reports
# spans/s, spans per server CPU-second (from /proc/<pid>/stat) and peak RSS, medians, and the
# median of the pairs' ratios of CPU per span (refusal-gate over the Collector).
#   benches/collector.sh [SECONDS]   (default 10 s a run)
# COLLECTOR=path: the Collector binary (default: the one the test command builds,
# ~/.cache/refusal-gate-collector/otelcol-refusal-gate; `--version` says its release).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
rounds=${ROUNDS:-3}
collector=${COLLECTOR:-${XDG_CACHE_HOME:-$HOME/.cache}/refusal-gate-collector/otelcol-refusal-gate}
[[ -x $collector ]] || { echo "no Collector at $collector: run scripts/test once, or set COLLECTOR" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
config=""
extra=()

# One run of $seconds against a fresh Collector: sets $out, $cpu_per_m and $rss as `load` does.
load_collector() {
  local transport=$1
  shift
  grpc=$(free_port); http=$(free_port)
  cat >"$work/collector.yaml" <<YAML
receivers:
  otlp:
    protocols:
      grpc: { endpoint: 127.0.0.1:$grpc }
      http: { endpoint: 127.0.0.1:$http }
connectors:
  span_metrics:
    dimensions:
      - name: http.response.status_code
      - name: rpc.jsonrpc.error_code
exporters:
  prometheus: { endpoint: 127.0.0.1:$(free_port) }
service:
  telemetry:
    metrics: { level: none }
  pipelines:
    traces: { receivers: [otlp], exporters: [span_metrics] }
    metrics: { receivers: [span_metrics], exporters: [prometheus] }
YAML
  taskset -c 0 "$collector" --config "$work/collector.yaml" 2>"$work/collector.log" &
  pid=$!
  for _ in $(seq 100); do
    curl -sf -o /dev/null -X POST -H 'content-type: application/x-protobuf' \
      "http://127.0.0.1:$http/v1/traces" && break
    sleep 0.1
  done
  local port=$grpc before after
  [[ $transport == http ]] && port=$http
  before=$(cpu)
  out=$(taskset -c 1 target/release/examples/loadgen --protocol "$transport" \
    --endpoint "http://127.0.0.1:$port" --duration "$seconds" --concurrency 8 "$@" | tail -1)
  after=$(cpu)
  cpu_per_m=$(awk -v c=$((after - before)) -v t="$ticks" -v s="$(field "$out" spans)" \
    'BEGIN { printf "%.3f", c / t / (s / 1e6) }')
  rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

echo "the Collector: $("$collector" --version)"
printf '%-6s %-6s %-14s %12s %14s %10s\n' transport work server spans/s Mspans/cpu-s peak-RSS
for transport in ${TRANSPORTS:-grpc http}; do
  for workload in flat tree; do
    rg_rates="" rg_cpus="" col_rates="" col_cpus="" ratios=""
    for round in $(seq "$rounds"); do
      order=(refusal-gate collector)
      ((round % 2 == 0)) && order=(collector refusal-gate)
      for server in "${order[@]}"; do
        if [[ $server == collector ]]; then
          load_collector "$transport" --workload "$workload"
          col_rates+="$(field "$out" spans_per_sec) " col_cpus+="$cpu_per_m " col_rss=$rss col_cpu=$cpu_per_m
        else
          load target/release/refusal-gate "$transport" --workload "$workload"
          rg_rates+="$(field "$out" spans_per_sec) " rg_cpus+="$cpu_per_m " rg_rss=$rss rg_cpu=$cpu_per_m
        fi
      done
      ratios+="$(awk -v a="$col_cpu" -v b="$rg_cpu" 'BEGIN { printf "%.3f", b / a }') "
    done
    for server in refusal-gate collector; do
      if [[ $server == collector ]]; then rates=$col_rates cpus=$col_cpus r=$col_rss; else rates=$rg_rates cpus=$rg_cpus r=$rg_rss; fi
      printf '%-6s %-6s %-14s %12s %14s %10s\n' "$transport" "$workload" "$server" "$(median "$rates")" \
        "$(awk -v c="$(median "$cpus")" 'BEGIN { printf "%.2fM", 1 / c }')" "$r"
    done
    echo "$transport $workload: refusal-gate/Collector CPU per span, median of $rounds pairs: $(median "$ratios") (pairs: $ratios)"
  done
done
