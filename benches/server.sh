# Shared by benches/e2e.sh and benches/soak.sh (sourced, not run): builds the release server
# and the load generator, and starts the server on free loopback ports.
#   start_server [CONFIG LINES] [-- COMMAND PREFIX...]
# writes $work/config.yaml (the three listeners, then the given lines), starts the server
# (under the prefix, e.g. `taskset -c 0`), waits for /healthz, and sets $pid, $grpc, $http,
# $admin. The caller sets $work and removes it, and kills $pid, on exit. SERVER=path runs
# that binary instead of the one just built (an older build, for an A/B).
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
