//! Test fixtures shared by the black-box tests: a real server on free loopback ports, a
//! scrape of its `/metrics`, and builders for spans sent by the OpenTelemetry SDK.
#![allow(dead_code)]

pub mod browser;
pub mod collector;
pub mod sink;

use refusal_gate::app::{Bound, Server};
use refusal_gate::config::Config;
use std::collections::BTreeMap;

/// The interfaces most tests use, on top of port-0 listeners.
pub const CONFIG: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0, max_request_body_size_mib: 1 }
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
tracker:
  probe_window: 3s
";

/// Starts a server in this process on free ports.
pub async fn start(config: &str) -> Server {
    let config = Config::parse(config).expect("the test configuration is valid");
    Server::start(&config).await.expect("the server starts")
}

/// The text of `/metrics`.
pub async fn scrape(bound: &Bound) -> String {
    let response = reqwest::get(format!("http://{}/metrics", bound.admin))
        .await
        .expect("the admin endpoint answers");
    assert_eq!(response.status(), 200);
    response.text().await.expect("a text body")
}

/// Parses one exposition line into (name, labels, value).
fn parse_line(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.trim_end_matches('}')),
        None => (series, ""),
    };
    let mut map = BTreeMap::new();
    for pair in labels.split("\",").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=')?;
        map.insert(k.to_owned(), v.trim_matches('"').to_owned());
    }
    Some((name, map, value))
}

/// The sum of the series of `name` whose labels include all of `labels`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(parse_line)
        .filter(|(n, ls, _)| {
            *n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// Every series of `name`: its labels and value.
pub fn series(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter_map(parse_line)
        .filter(|(n, _, _)| *n == name)
        .map(|(_, labels, v)| (labels, v))
        .collect()
}

/// Whether any series of `name` exists.
pub fn has_metric(text: &str, name: &str) -> bool {
    text.lines()
        .filter_map(parse_line)
        .any(|(n, _, _)| n == name)
}

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

/// Span times of the fixtures start here (Unix nanoseconds).
pub const T0: u64 = 1_700_000_000_000_000_000;

/// An attribute.
pub fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// The `i`-th CLIENT span of a client: an HTTP call starting `i` × 100 ms after [`T0`] and
/// lasting 20 ms, with span id `i + 1`.
pub fn http_span(i: u64, method: &str, url: &str, status: i64) -> Span {
    Span {
        trace_id: vec![5; 16],
        span_id: (i + 1).to_be_bytes().to_vec(),
        name: method.into(),
        kind: 3,
        start_time_unix_nano: T0 + i * 100_000_000,
        end_time_unix_nano: T0 + i * 100_000_000 + 20_000_000,
        attributes: vec![
            kv("http.request.method", Value::StringValue(method.into())),
            kv("url.full", Value::StringValue(url.into())),
            kv("http.response.status_code", Value::IntValue(status)),
        ],
        ..Default::default()
    }
}

/// `span` with the server's `Retry-After` captured as HTTP instrumentations record a response
/// header: `http.response.header.retry-after`, an array of strings.
pub fn with_retry_after(mut span: Span, value: &str) -> Span {
    use opentelemetry_proto::tonic::common::v1::ArrayValue;
    span.attributes.push(kv(
        "http.response.header.retry-after",
        Value::ArrayValue(ArrayValue {
            values: vec![AnyValue {
                value: Some(Value::StringValue(value.into())),
            }],
        }),
    ));
    span
}

/// An encoded export request of one resource (`service.name` = `service`) with these spans.
pub fn export(service: &str, spans: Vec<Span>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", Value::StringValue(service.into()))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// Posts an encoded request to the OTLP/HTTP receiver and expects 200.
pub async fn send(bound: &Bound, body: Vec<u8>) {
    post_traces(bound.http, body).await;
}

/// [`send`] with a bearer token.
pub async fn send_with(bound: &Bound, token: &str, body: Vec<u8>) {
    accepted(export_to(bound.http, body).bearer_auth(token)).await;
}

/// Whether `binary` is on PATH. When it is not, fails under the test command
/// (`REFUSAL_GATE_REQUIRE_EXTERNAL=1`, which installs it first) and skips with a message
/// otherwise.
pub fn external(binary: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("REFUSAL_GATE_REQUIRE_EXTERNAL").is_none(),
            "{binary} is not installed; the README's test command installs it"
        );
        eprintln!("skipped: {binary} is not installed (the README's test command installs it)");
    }
    found
}

/// The Python of the agents' virtual environment (`tests/agents/requirements.txt`, made by
/// the README's test command, which names it in `REFUSAL_GATE_AGENT_PYTHON`), or `None`:
/// failing under the test command, skipping with a message otherwise.
pub fn agent_python() -> Option<String> {
    agent_program("REFUSAL_GATE_AGENT_PYTHON").map(|p: std::path::PathBuf| p.display().to_string())
}

/// The `node_modules` of the TypeScript agent stack (`tests/agents/ts/package-lock.json`,
/// installed by the README's test command, which names it in
/// `REFUSAL_GATE_AGENT_NODE_MODULES`), or `None`: failing under the test command, skipping with
/// a message otherwise.
pub fn agent_node_modules() -> Option<std::path::PathBuf> {
    agent_program("REFUSAL_GATE_AGENT_NODE_MODULES")
}

/// What the README's test command installs or builds for the agent stacks and names in the
/// environment variable `var` (`REFUSAL_GATE_AGENT_PYTHON`, `…_NODE_MODULES`, `…_GO`,
/// `…_JAVA`), or `None`: failing under the test command, skipping with a message otherwise.
pub fn agent_program(var: &str) -> Option<std::path::PathBuf> {
    let program = std::env::var_os(var).map(Into::into);
    if program.is_none() {
        assert!(
            std::env::var_os("REFUSAL_GATE_REQUIRE_EXTERNAL").is_none(),
            "{var} is not set; the README's test command sets it"
        );
        eprintln!("skipped: {var} is not set (the README's test command sets it)");
    }
    program
}

/// Waits until the binary on `admin` has counted, for each client of `expected`, as many
/// attempts as it says — the requests its spans record — and returns the scrape that shows
/// it. The servers in the tests export every 100 ms: once their last spans are in, every call
/// is whole. (A read of /metrics settles what is pending, so none is made before.)
pub async fn attempts_reach(admin: u16, expected: &[(String, usize)]) -> String {
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let want: Vec<(String, f64)> = expected
        .iter()
        .map(|(c, n)| (c.clone(), *n as f64))
        .collect();
    loop {
        let m = admin_metrics(admin).await;
        let counted: Vec<(String, f64)> = expected
            .iter()
            .map(|(c, _)| {
                let n = value(&m, "refusal_gate_attempts_total", &[("client", c)]);
                (c.clone(), n)
            })
            .collect();
        if counted == want {
            return m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "attempts {counted:?}, want {want:?}\n{m}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A file of `examples/`.
pub fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}

/// An empty directory of its own for one test: `refusal-gate-{what}-{tag}-{pid}` under the
/// system's temporary directory.
pub fn fresh_dir(what: &str, tag: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("refusal-gate-{what}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

/// A scrape of the binary's `/metrics` on admin port `admin`.
/// Serves `app` on a free loopback port (an HTTP peer: a next hop, a discovery host, a fake
/// Alertmanager, an agent's API) and returns its address.
pub async fn serve_http(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Posts an encoded export request to the OTLP/HTTP receiver at `http` (`host:port`): it must
/// be accepted whole.
pub async fn post_traces(http: impl std::fmt::Display, body: Vec<u8>) {
    accepted(export_to(http, body)).await;
}

/// An OTLP/HTTP export of the encoded `body` to the receiver at `http` (`host:port`).
fn export_to(http: impl std::fmt::Display, body: Vec<u8>) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("http://{http}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(body)
}

/// Sends `request`: the receiver must accept it whole.
async fn accepted(request: reqwest::RequestBuilder) {
    let response = request.send().await.expect("the receiver answers");
    assert_eq!(response.status(), 200);
}

pub async fn admin_metrics(admin: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .expect("the admin port answers")
        .text()
        .await
        .expect("a body")
}

/// Kills the child process when the test ends, however it ends.
pub struct Reaper(pub std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `child` SIGTERM (what an orchestrator sends to stop it).
pub fn sigterm(child: &std::process::Child) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill -TERM {}", child.id());
}

/// A free loopback port (free when asked; the caller binds it soon after). Chosen below the
/// kernel's ephemeral range (32768–60999 on Linux): a port from that range, as binding port
/// 0 gives, can be taken by any outgoing connection's source port before the server binds it
/// (seen once as a replica that never came up). Spread by process and counter, so that the
/// tests of one binary, running at once, do not try the same ports.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7_919);
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(FIRST + seed.wrapping_add(n) % SPAN).expect("below 32,000");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FIRST} and {}", FIRST + SPAN)
}

/// The ports of a server binary's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// OTLP/gRPC.
    pub grpc: u16,
    /// OTLP/HTTP.
    pub http: u16,
    /// Admin.
    pub admin: u16,
}

/// Writes `dir/name.yaml`: free loopback ports for the three listeners, then `extra`.
pub fn binary_config(
    dir: &std::path::Path,
    name: &str,
    extra: &str,
) -> (std::path::PathBuf, Ports) {
    let ports = Ports {
        grpc: free_port(),
        http: free_port(),
        admin: free_port(),
    };
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:{} }}
    http: {{ endpoint: 127.0.0.1:{} }}
admin:
  endpoint: 127.0.0.1:{}
{extra}",
            ports.grpc, ports.http, ports.admin
        ),
    )
    .expect("the configuration is written");
    (path, ports)
}

/// Starts the refusal-gate binary on `config` and returns once `admin` answers `/healthz`.
pub async fn spawn_binary(
    config: &std::path::Path,
    admin: u16,
    stderr: std::process::Stdio,
) -> Reaper {
    let reaper = Reaper(
        std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
            .args(["serve", "--config"])
            .arg(config)
            .stderr(stderr)
            .spawn()
            .expect("the binary starts"),
    );
    let mut reaper = reaper;
    for _ in 0..100 {
        if reqwest::get(format!("http://127.0.0.1:{admin}/healthz"))
            .await
            .is_ok()
        {
            return reaper;
        }
        if let Ok(Some(status)) = reaper.0.try_wait() {
            panic!("the binary exited with {status} before it answered, on {config:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the binary did not come up on {config:?}");
}

/// Exports one client span (an HTTP GET answered 200) from `service` through an SDK
/// exporter with a simple span processor; whether the export succeeded.
pub async fn sdk_export(exporter: opentelemetry_otlp::SpanExporter, service: &str) -> bool {
    use opentelemetry::trace::{SpanKind, Tracer, TracerProvider as _};
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .with_simple_exporter(exporter)
        .build();
    tokio::task::spawn_blocking(move || {
        let tracer = provider.tracer("agent");
        tracer
            .span_builder("GET")
            .with_kind(SpanKind::Client)
            .with_attributes(vec![
                opentelemetry::KeyValue::new("http.request.method", "GET"),
                opentelemetry::KeyValue::new("url.full", "http://api.test/x"),
                opentelemetry::KeyValue::new("http.response.status_code", 200),
            ])
            .start(&tracer);
        drop(tracer);
        provider.shutdown().is_ok()
    })
    .await
    .expect("the exporting thread finishes")
}

/// How every test runs Chromium: headless, as root (no sandbox), without a GPU or a large
/// `/dev/shm`, with no first-run questions.
pub const HEADLESS: [&str; 5] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
];

/// Headless Chromium on `url`, with a profile of its own in `dir`: the DOM once the page's
/// script has run (its fetches answered within the virtual time budget). `url` goes on
/// Chromium's command line as it is: write its parts with [`browser::percent_encode`] (a
/// current Chromium loads nothing from a `file://` URL whose fragment holds a raw `'`).
pub fn chromium(dir: &std::path::Path, args: &[&str], url: &str) -> std::process::Output {
    let out = std::process::Command::new("chromium")
        .args(HEADLESS)
        .args([
            "--hide-scrollbars",
            "--window-size=1400,1100",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DOM of `url` once its script has run, in headless Chromium ([`chromium`]).
pub fn dom(dir: &std::path::Path, url: &str) -> String {
    String::from_utf8(chromium(dir, &["--dump-dom"], url).stdout).expect("UTF-8")
}

/// One bare HTTP/2 connection to the gRPC port at `grpc`, driven in the background.
pub async fn bare_http2(grpc: std::net::SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = tokio::net::TcpStream::connect(grpc)
        .await
        .expect("connects");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(connection);
    client
}

/// Opens `n` Export streams on `client` and sends their headers only: the streams, held open
/// for as long as they live.
pub async fn headers_only(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    n: usize,
) -> Vec<h2::SendStream<bytes::Bytes>> {
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let request = tonic::codegen::http::Request::post(format!(
            "http://x{}",
            refusal_gate::export::EXPORT_PATH
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
        *client = client.clone().ready().await.expect("room for a stream");
        let (_answer, stream) = client.send_request(request, false).expect("sent");
        streams.push(stream);
    }
    streams
}

/// The first value of the Prometheus server at `prometheus` (its base URL) for the instant
/// query `promql`, once it answers one.
pub async fn prometheus_query(prometheus: &str, promql: &str) -> Option<f64> {
    let response = reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", promql)])
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.ok()?).ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// A file of the agent stacks (tests/agents/).
pub fn agent_script(name: &str) -> String {
    format!("{}/tests/agents/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Starts an MCP server script of tests/agents (`command`: its name, then its options) on
/// `port`, exporting its spans as `service` to the OTLP/HTTP receiver on `otlp` every
/// `every_ms`; returns once it listens.
pub async fn mcp_server_every(
    python: &str,
    command: &[&str],
    (port, service): (u16, &str),
    otlp: u16,
    every_ms: u64,
) -> tokio::process::Child {
    let name = command[0];
    let mut server = tokio::process::Command::new(python)
        .arg(agent_script(name))
        .arg(port.to_string())
        .args(&command[1..])
        .env("OTEL_SERVICE_NAME", service)
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("http://127.0.0.1:{otlp}/v1/traces"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", every_ms.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the MCP server starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never listened"
        );
        if let Some(status) = server.try_wait().expect("waitable") {
            panic!("{name} exited: {status}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    server
}

/// Runs `command` to its end, its spans exported to `otlp` every 100 ms; fails the test
/// with its output when it fails, and returns that output.
pub async fn exporting_to(otlp: u16, mut command: tokio::process::Command) -> std::process::Output {
    let out = command
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("http://127.0.0.1:{otlp}/v1/traces"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .output()
        .await
        .expect("the client runs");
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
