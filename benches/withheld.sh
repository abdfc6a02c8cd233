#!/usr/bin/env bash
# What withholding spans for their call's verdict costs (DESIGN §11.5), under load: the tree
# workload with the server view — the MCP server's SERVER span of each MCP call sent a client's
# request behind the call (`loadgen --server-view 1`), the interface observed through it — into
# the release server pinned to core 0, forwarding every span over OTLP/gRPC to a sink that
# drops them (examples/sink.rs, with the load generator on core 1). Reports spans/s, how long
# the withheld spans waited (p50/p99 of refusal_gate_exporter_withheld_seconds, interpolated
# within its buckets as Prometheus's histogram_quantile does) — of the spans that left while
# the load ran, and of all once the last have left (those of the last calls wait out
# tracker.reorder_window: their server's spans are never sent) — what share of the forwarded
# spans waited at all, the spans and bytes withheld (sampled every 0.2 s: median and peak), the spans
# forwarded untagged for want of room, and peak RSS.
#   benches/withheld.sh [SECONDS [LOADGEN OPTIONS...]]   (default 10 s, 100 clients)
# e.g. `benches/withheld.sh 10 --rate 100000` for a fixed rate instead of full speed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
work=$(mktemp -d)
trap 'kill "${pid:-0}" "${sink_pid:-0}" "${sampler:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
source benches/server.sh
cargo build --release --quiet --example sink
sink_http=$(free_port)
sink_grpc=$(free_port)
taskset -c 1 target/release/examples/sink "127.0.0.1:$sink_http" "127.0.0.1:$sink_grpc" >/dev/null &
sink_pid=$!
start_server "interfaces:
  - name: mcp-example
    protocol: mcp
    url: http://mcp.example:8080/mcp
    endpoints: [{ path: /mcp, methods: [POST] }]
    server: { service_names: [mcp-server] }
exporters:
  otlp: { endpoint: 'http://127.0.0.1:$sink_grpc', protocol: grpc }" -- taskset -c 0
gauge() { awk -v n="$2" '$1 == n { print $2 }' <<<"$1"; }
# The withheld spans and bytes, every 0.2 s while the load runs.
(
  while :; do
    m=$(curl -s "http://127.0.0.1:$admin/metrics") || exit 0
    echo "$(gauge "$m" refusal_gate_exporter_withheld_spans) $(gauge "$m" refusal_gate_exporter_withheld_bytes)"
    sleep 0.2
  done
) >"$work/samples" &
sampler=$!
out=$(taskset -c 1 target/release/examples/loadgen --protocol grpc --endpoint "http://127.0.0.1:$grpc" \
  --duration "$seconds" --concurrency 8 --workload tree --server-view 1 "$@" | tail -1)
kill "$sampler"
during=$(curl -s "http://127.0.0.1:$admin/metrics")
# The spans still withheld leave within a window and a sweep.
sleep 7
m=$(curl -s "http://127.0.0.1:$admin/metrics")
rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
python3 - "$work/samples" "$out" "$rss" <<PY
import re, sys
metrics, during = """$m""", """$during"""
samples = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
out, rss = sys.argv[2], sys.argv[3]
field = lambda name: float(re.search(name + r"=(\S+)", out).group(1))
def value(name, labels=""):
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0
def histogram(text):
    return sorted(
        (float("inf") if le == "+Inf" else float(le), float(n))
        for le, n in re.findall(r'^refusal_gate_exporter_withheld_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
    )
def quantile(buckets, q):
    total = buckets[-1][1] if buckets else 0
    rank, lo, below = q * total, 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / max(n - below, 1e-9)
        lo, below = le, n
    return lo
median = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0
sent = value("refusal_gate_exporter_sent_spans_total")
print(f"load: {field('spans_per_sec'):.0f} spans/s over {field('seconds'):.1f} s, {field('errors'):.0f} errors")
for when, buckets in (("during the load", histogram(during)), ("in all", histogram(metrics))):
    total = buckets[-1][1] if buckets else 0
    print(f"withheld, {when}: {total:.0f} spans, waited p50 {quantile(buckets, 0.5):.3f} s, p99 {quantile(buckets, 0.99):.3f} s")
total = histogram(metrics)[-1][1] if histogram(metrics) else 0
print(f"forwarded: {sent:.0f} spans, {100 * total / max(sent, 1):.1f} % of them withheld first")
print(f"withheld at once: median {median([s for s, _ in samples]):.0f} spans, {median([b for _, b in samples]) / 2**20:.2f} MiB; peak {max((s for s, _ in samples), default=0):.0f} spans, {max((b for _, b in samples), default=0) / 2**20:.2f} MiB ({len(samples)} samples)")
untagged = value("refusal_gate_exporter_untagged_spans_total", '{reason="held_full"}')
print(f"untagged for want of room: {untagged:.0f}; peak RSS {rss}")
PY
