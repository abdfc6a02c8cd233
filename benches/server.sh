# Shared by benches/e2e.sh and benches/soak.sh (sourced, not run): builds the release server
# and the load generator, and starts the server on free loopback ports.
#   start_server [CONFIG LINES] [-- COMMAND PREFIX...]
# writes $work/config.yaml (the three listeners, then the given lines), starts the server
# (under the prefix, e.g. `taskset -c 0`), waits for /healthz, and sets $pid, $grpc, $http,
# $admin. The caller sets $work and removes it, and kills $pid, on exit. SERVER=path runs
# that binary instead of the one just built (an older build, for an A/B).
#   load BINARY TRANSPORT [LOADGEN OPTIONS...]
# one full run against a fresh server (see below), for benches/e2e.sh and benches/scale.sh.
cargo build --release --quiet
cargo build --release --quiet --example loadgen

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_server() {
  local extra=${1:-}
  shift || true
  [[ ${1:-} == -- ]] && shift
  grpc=$(free_port); http=$(free_port); admin=$(free_port)
  cat > "$work/config.yaml" <<YAML
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:$grpc }
    http: { endpoint: 127.0.0.1:$http }
admin:
  endpoint: 127.0.0.1:$admin
$extra
YAML
  "$@" "${SERVER:-target/release/refusal-gate}" serve --config "$work/config.yaml" 2>"$work/server.log" &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$admin/healthz" >/dev/null && return 0; sleep 0.1; done
  echo "the server did not come up; its log:" >&2
  cat "$work/server.log" >&2
  return 1
}

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
median() { tr ' ' '\n' <<<"$*" | sort -g | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }'; }

# load BINARY TRANSPORT [LOADGEN OPTIONS...]: one run of $seconds against a fresh server
# configured with $config, the load generator given $extra and these options; sets $out (the
# load generator's last line), $cpu_per_m, $keys and $rss.
load() {
  local binary=$1 transport=$2
  shift 2
  SERVER=$binary start_server "$config" -- taskset -c 0
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
  keys=$(curl -s "http://127.0.0.1:$admin/metrics" | awk '$1 == "refusal_gate_tracker_keys" { print $2 }')
  rss=$(awk '/VmHWM/ { printf "%.0f MiB", $2 / 1024 }' "/proc/$pid/status")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
