//! Black-box tests beside a real OpenTelemetry Collector (tests/collector/, built from the
//! Collector's own Go modules by the README's test command, which names it in
//! `REFUSAL_GATE_COLLECTOR`): refusal-gate as one more OTLP exporter of a Collector's traces
//! pipeline counts what it counts when the spans come straight to it (hand-made spans, and the
//! real FastMCP and MCP SDK stacks with their servers observed from their side), the spans it
//! forwards reach a Collector with every `refusal_gate.*` tag, and its OTLP metrics push
//! reaches a real Prometheus through the Collector's Prometheus exporter.

mod common;

use common::collector::{collector_binary, Collector};
use common::{export, http_span, kv, scrape, start, value};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::time::Duration;

/// The listeners of a refusal-gate started in process, on free ports.
const LISTENERS: &str = "receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
";

/// The rest of a Collector's configuration that sends its traces, batched as `batch` says,
/// to the refusal-gate whose OTLP/gRPC receiver is `grpc`, its OTLP exporter given `extra`
/// lines too (indented as its keys).
fn to_refusal_gate(grpc: std::net::SocketAddr, batch: &str, extra: &str) -> String {
    format!(
        "processors:
  batch: {{ {batch} }}
exporters:
  otlp_grpc/refusal-gate:
    endpoint: {grpc}
    tls: {{ insecure: true }}
{extra}service:
  telemetry:
    metrics: {{ level: none }}
  pipelines:
    traces: {{ receivers: [otlp], processors: [batch], exporters: [otlp_grpc/refusal-gate] }}
"
    )
}

/// The configuration both refusal-gates run: an MCP server and an HTTP API with declared
/// paths.
const INTERFACES: &str = "
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints: [{ path: /mcp, methods: [POST] }]
  - name: orders-api
    protocol: http
    url: http://api.test
    endpoints: [{ path: /orders, methods: [GET] }]
";

/// A JSON-RPC `tools/call` of `tool` answered with `code` (0: a result), as the MCP SDKs'
/// instrumentations describe it.
fn tools_call(i: u64, tool: &str, code: i64) -> Span {
    let mut span = http_span(i, "POST", "http://mcp.test:8080/mcp", 200);
    span.attributes.extend([
        kv("rpc.system", Value::StringValue("jsonrpc".into())),
        kv("rpc.method", Value::StringValue("tools/call".into())),
        kv("gen_ai.tool.name", Value::StringValue(tool.into())),
    ]);
    if code != 0 {
        span.attributes
            .push(kv("rpc.jsonrpc.error_code", Value::IntValue(code)));
    }
    span
}

/// The seed's three clients, as export requests: the agent that stops at `-32601`, the prober
/// of three undeclared paths (22 requests), the agent that retries an invalid-params call;
/// and one whose calls all succeed. Span ids apart per client.
fn fleet() -> Vec<Vec<u8>> {
    let stops = vec![tools_call(0, "forecast", -32601)];
    let probes: Vec<Span> = (0..22)
        .map(|i| {
            let path = ["/admin", "/debug", "/internal"][i as usize % 3];
            http_span(100 + i, "GET", &format!("http://api.test{path}"), 404)
        })
        .collect();
    let retries: Vec<Span> = (0..4).map(|i| tools_call(200 + i, "pay", -32602)).collect();
    let fine: Vec<Span> = (0..5)
        .map(|i| http_span(300 + i, "GET", "http://api.test/orders", 200))
        .collect();
    vec![
        export("stopping-agent", stops),
        export("prober", probes),
        export("retrying-agent", retries),
        export("fine-agent", fine),
    ]
}

/// The per-client series of `/metrics`: attempts, violations, discovery reads and honoured
/// refusals, as sorted lines.
fn pair_series(m: &str) -> Vec<String> {
    let mut lines: Vec<String> = m
        .lines()
        .filter(|l| {
            [
                "refusal_gate_attempts_total{",
                "refusal_gate_violations_total{",
                "refusal_gate_discovery_reads_total{",
                "refusal_gate_refusals_honored_total{",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        // Exemplars (`# {trace_id=…}`) are the same spans either way; the value is what counts.
        .map(|l| l.split(" # ").next().unwrap_or(l).to_owned())
        .collect();
    lines.sort();
    lines
}

async fn accepted(bound: &refusal_gate::app::Bound) -> f64 {
    let m = scrape(bound).await;
    value(&m, "refusal_gate_receiver_accepted_spans_total", &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_collector_the_counters_are_those_of_spans_sent_straight() {
    let Some(binary) = collector_binary() else {
        return;
    };
    let dir = common::fresh_dir("collector", "behind");
    let config = format!("{LISTENERS}{INTERFACES}");
    let straight = start(&config).await;
    let behind = start(&config).await;
    // The README's "one more OTLP exporter in your Collector's traces pipeline", literally.
    let collector = Collector::start(
        &binary,
        &dir,
        &to_refusal_gate(behind.bound.grpc, "timeout: 200ms", ""),
    )
    .await;

    let requests = fleet();
    let spans = 1 + 22 + 4 + 5;
    for body in &requests {
        common::send(&straight.bound, body.clone()).await;
        let answer = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/traces", collector.http))
            .header("content-type", "application/x-protobuf")
            .body(body.clone())
            .send()
            .await
            .expect("the Collector answers");
        assert_eq!(answer.status(), 200, "{}", collector.log_text());
    }
    for _ in 0..100 {
        if accepted(&behind.bound).await >= f64::from(spans) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        accepted(&behind.bound).await,
        f64::from(spans),
        "every span through the Collector: {}",
        collector.log_text()
    );
    let (a, b) = (scrape(&straight.bound).await, scrape(&behind.bound).await);
    let (a, b) = (pair_series(&a), pair_series(&b));
    assert!(
        a.iter().any(|l| l.contains("prober")) && a.iter().any(|l| l.contains("violation")),
        "the fleet makes the seed's stories: {a:#?}"
    );
    assert_eq!(a, b, "straight and behind a Collector");
    drop(collector);
    straight.shutdown().await;
    behind.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_spans_reach_a_collector_with_every_tag() {
    let Some(binary) = collector_binary() else {
        return;
    };
    let dir = common::fresh_dir("collector", "forwarded");
    // The Collector prints every span it receives, attributes and all.
    let collector = Collector::start(
        &binary,
        &dir,
        "exporters:
  debug: { verbosity: detailed }
service:
  telemetry:
    metrics: { level: none }
  pipelines:
    traces: { receivers: [otlp], exporters: [debug] }
",
    )
    .await;
    let server = start(&format!(
        "{LISTENERS}exporters:\n  otlp: {{ endpoint: 'http://127.0.0.1:{}', protocol: grpc }}\n{INTERFACES}",
        collector.grpc
    ))
    .await;
    for body in fleet() {
        common::send(&server.bound, body).await;
    }
    server.shutdown().await;
    let mut log = String::new();
    for _ in 0..100 {
        log = collector.log_text();
        if log.matches("Span #").count() >= 32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        log.matches("Span #").count(),
        32,
        "every span arrived: {log}"
    );
    // Every span with every tag a first attempt carries, as refusal-gate wrote them.
    for key in [
        "refusal_gate.class",
        "refusal_gate.kind",
        "refusal_gate.decision",
        "refusal_gate.reason",
        "refusal_gate.interface",
        "refusal_gate.discovery_read",
        "refusal_gate.attempt",
    ] {
        assert_eq!(
            log.matches(&format!("-> {key}: ")).count(),
            32,
            "{key} on every span: {log}"
        );
    }
    for tag in [
        "refusal_gate.interface: Str(orders-api)",
        "refusal_gate.interface: Str(weather-mcp)",
        "refusal_gate.reason: Str(jsonrpc -32601)",
        "refusal_gate.reason: Str(http 404 undeclared path)",
        "refusal_gate.class: Str(ok)",
        "refusal_gate.attempt: Int(4)",
    ] {
        assert!(
            log.contains(tag),
            "{tag} in what the Collector received: {log}"
        );
    }
    drop(collector);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_push_reaches_prometheus_through_a_collector() {
    let Some(binary) = collector_binary() else {
        return;
    };
    if !common::external("prometheus") {
        return;
    }
    let dir = common::fresh_dir("collector", "push");
    // refusal-gate → OTLP metrics push → the Collector's Prometheus exporter → Prometheus.
    let exposed = common::free_port();
    let collector = Collector::start(
        &binary,
        &dir,
        &format!(
            "exporters:
  prometheus: {{ endpoint: 127.0.0.1:{exposed} }}
service:
  telemetry:
    metrics: {{ level: none }}
  pipelines:
    metrics: {{ receivers: [otlp], exporters: [prometheus] }}
"
        ),
    )
    .await;
    let server = start(&format!(
        "{LISTENERS}exporters:\n  otlp_metrics: {{ endpoint: 'http://127.0.0.1:{}', protocol: grpc, interval: 1s }}\n{INTERFACES}",
        collector.grpc
    ))
    .await;
    for body in fleet() {
        common::send(&server.bound, body).await;
    }
    let ours = scrape(&server.bound).await;
    let probes = value(
        &ours,
        "refusal_gate_attempts_total",
        &[("client", "prober")],
    );
    assert_eq!(probes, 22.0);

    let port = common::free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{ scrape_interval: 1s }}\nscrape_configs:\n  - job_name: collector\n    static_configs:\n      - targets: ['127.0.0.1:{exposed}']\n"
        ),
    )
    .expect("the configuration is written");
    let _prometheus = common::Reaper(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let prometheus = format!("http://127.0.0.1:{port}");
    let promql = r#"sum(refusal_gate_attempts_total{client="prober"})"#;
    let mut seen = None;
    for _ in 0..120 {
        seen = common::prometheus_query(&prometheus, promql).await;
        if seen == Some(probes) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        seen,
        Some(probes),
        "the prober's attempts, pushed and scraped: {}",
        collector.log_text()
    );
    let violations = value(&ours, "refusal_gate_violations_total", &[]);
    assert!(violations > 0.0);
    assert_eq!(
        common::prometheus_query(&prometheus, "sum(refusal_gate_violations_total)").await,
        Some(violations),
        "every violation too"
    );
    server.shutdown().await;
    drop(collector);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_fanning_in_a_fleet_is_not_starved_by_one_connection_holding_every_stream() {
    let Some(binary) = collector_binary() else {
        return;
    };
    let dir = common::fresh_dir("collector", "fan-in");
    let server = start(&format!("{LISTENERS}{INTERFACES}")).await;
    // Issue 63: one HTTP/2 connection holds a hundred Export streams open with their headers
    // only, more than max_concurrent_requests (64), for the whole test.
    let mut attacker = common::bare_http2(server.bound.grpc).await;
    let _held = common::headers_only(&mut attacker, 100).await;
    let collector = Collector::start(
        &binary,
        &dir,
        &to_refusal_gate(
            server.bound.grpc,
            "timeout: 100ms, send_batch_size: 50",
            "    retry_on_failure: { enabled: false }\n",
        ),
    )
    .await;
    // A fleet of 100 clients, five spans each, fanned in over the Collector's few connections
    // (its retries off: an export refused would be lost, and counted as such).
    let clients = 100u64;
    for c in 0..clients {
        let spans = (0..5)
            .map(|k| http_span(1_000 + c * 10 + k, "GET", "http://api.test/orders", 200))
            .collect();
        let answer = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/v1/traces", collector.http))
            .header("content-type", "application/x-protobuf")
            .body(export(&format!("agent-{c}"), spans))
            .send()
            .await
            .expect("the Collector answers");
        assert_eq!(answer.status(), 200);
    }
    let want = clients as f64 * 5.0;
    for _ in 0..100 {
        if accepted(&server.bound).await >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(&m, "refusal_gate_receiver_accepted_spans_total", &[]),
        want,
        "every span of the fleet, beside the held streams: {}",
        collector.log_text()
    );
    assert_eq!(
        value(&m, "refusal_gate_receiver_refused_requests_total", &[]).max(0.0),
        0.0,
        "no export refused"
    );
    drop(collector);
    server.shutdown().await;
}

#[test]
fn the_shipped_collector_configurations_are_valid_to_a_real_collector() {
    let Some(binary) = collector_binary() else {
        return;
    };
    for file in [
        "deploy/k8s/collector.yaml",
        "deploy/scaleout/collector.yaml",
    ] {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let out = std::process::Command::new(&binary)
            .arg("validate")
            .arg("--config")
            .arg(&config)
            .output()
            .expect("the Collector runs");
        assert!(
            out.status.success(),
            "{}: {}",
            config.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Plays the seed's stories with `stack`'s client (`stack_client.py`) against `base`, its
/// spans exported to the OTLP/HTTP receiver on `otlp`.
async fn stories(python: &str, stack: &str, base: &str, otlp: u16) {
    for story in ["planner", "prober", "assistant", "careful"] {
        let mut client = tokio::process::Command::new(python);
        client
            .arg(common::agent_script("stack_client.py"))
            .args([stack, story, base]);
        common::exporting_to(otlp, client).await;
    }
}

/// The per-client series of `/metrics` once they stop changing (the servers export every
/// 100 ms; a read of `/metrics` settles what is pending, so the first is made after a pause).
async fn settled_series(bound: &refusal_gate::app::Bound) -> Vec<String> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut last = pair_series(&scrape(bound).await);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = pair_series(&scrape(bound).await);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_stacks_behind_a_collector_are_counted_as_when_they_export_straight() {
    let Some(binary) = collector_binary() else {
        return;
    };
    let Some(python) = common::agent_python() else {
        return;
    };
    // FastMCP's client and server; the MCP SDK's client against its server behind the ASGI
    // instrumentation (tests/stacks.rs runs both).
    for (stack, script, service) in [
        ("fastmcp", "fastmcp_server.py", "weather-fastmcp"),
        ("mcp", "mcp_server.py", "weather-sdk"),
    ] {
        let dir = common::fresh_dir("collector", stack);
        stack_behind_a_collector(&binary, &python, &dir, (stack, script, service)).await;
    }
}

/// Runs one stack's stories twice against the same interface, observed from both sides, on
/// two servers: one exporting (with its clients) straight to a refusal-gate, one through a
/// Collector to another; the per-client series must be the same.
async fn stack_behind_a_collector(
    binary: &std::path::Path,
    python: &str,
    dir: &std::path::Path,
    (stack, script, service): (&str, &'static str, &'static str),
) {
    let (straight_port, behind_port) = (common::free_port(), common::free_port());
    let config = |port: u16| {
        format!(
            "{LISTENERS}interfaces:
  - name: {service}
    protocol: mcp
    url: http://127.0.0.1:{port}/mcp
    endpoints: [{{ path: /mcp, methods: [POST, GET, DELETE] }}]
    server: {{ service_names: [{service}] }}
"
        )
    };
    let straight = start(&config(straight_port)).await;
    let behind = start(&config(behind_port)).await;
    let collector = Collector::start(
        binary,
        dir,
        &to_refusal_gate(behind.bound.grpc, "timeout: 100ms", ""),
    )
    .await;
    let command = [script];
    let server =
        |port, otlp| common::mcp_server_every(python, &command, (port, service), otlp, 100);
    let _straight_server = server(straight_port, straight.bound.http.port()).await;
    let _behind_server = server(behind_port, collector.http).await;
    let base = |port: u16| format!("http://127.0.0.1:{port}");
    stories(
        python,
        stack,
        &base(straight_port),
        straight.bound.http.port(),
    )
    .await;
    stories(python, stack, &base(behind_port), collector.http).await;

    let (a, b) = (
        settled_series(&straight.bound).await,
        settled_series(&behind.bound).await,
    );
    assert!(
        a.iter().any(|l| l.contains(&format!("{stack}-prober")))
            && a.iter().any(|l| l.contains("violation")),
        "{stack}: the stories were told: {a:#?}"
    );
    assert_eq!(
        a,
        b,
        "{stack}: straight and behind a Collector: {}",
        collector.log_text()
    );
    drop(collector);
    straight.shutdown().await;
    behind.shutdown().await;
}
