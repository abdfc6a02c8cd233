//! Alerts and dashboards against the real servers: Prometheus scrapes refusal-gate with
//! the shipped rules, a retry after refusal and a retry before the server's Retry-After each
//! reach Alertmanager twice over (pushed by refusal-gate and fired by the rule), and so does
//! an interface that refused a tool to one client and served it to another (DESIGN §13: also
//! named in /metrics and in the Gate API's answer), and every PromQL expression of the Grafana
//! dashboard returns data. Then the delivery rule: an Alertmanager answering 503 is retried,
//! one answering 400 is not.
//!
//! The first test needs Debian's `prometheus` and `prometheus-alertmanager`, which the
//! README's test command installs; without them plain `cargo test` skips it with a message.

mod common;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::{
    export, external, free_port, http_span, kv, scrape, send, value, with_retry_after, Reaper,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use opentelemetry_proto::tonic::trace::v1::{Span, Status};
use refusal_gate::app::Server;
use refusal_gate::config::Config;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MCP: &str = "http://mcp.test:8080";

fn config(alertmanager: &str) -> String {
    format!(
        "
receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:0 }}
    http: {{ endpoint: 127.0.0.1:0 }}
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: {MCP}/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
tracker:
  probe_window: 1s
alerting:
  alertmanager: {{ url: '{alertmanager}', timeout: 2s }}
  resolve_after: 5m
"
    )
}

/// An MCP `tools/call` of `tool` over POST /mcp, refused with `code` or served.
fn tool_call(i: u64, tool: &str, code: Option<i64>) -> Span {
    let mut span = http_span(i, "POST", &format!("{MCP}/mcp"), 200);
    span.attributes.extend([
        kv("mcp.method.name", Value::StringValue("tools/call".into())),
        kv("gen_ai.tool.name", Value::StringValue(tool.into())),
    ]);
    if let Some(code) = code {
        span.attributes.push(kv(
            "rpc.response.status_code",
            Value::StringValue(code.to_string()),
        ));
        span.status = Some(Status {
            code: SpanStatus::Error as i32,
            ..Default::default()
        });
    }
    span
}

/// The scenario: a discovery read, three refused POSTs to an undeclared path (two retries
/// after refusal), a refusal left alone (honored once the 1 s window passes), a 429 asking
/// for a second's wait and a 503 100 ms later (a retry before its Retry-After), another 503,
/// and one malformed span; then the tool `export` refused to e2e-agent with -32601 and served
/// to another client (the interface contradicts itself).
async fn play(server: &Server) {
    let url = |p: &str| format!("{MCP}{p}");
    let spans = vec![
        http_span(0, "GET", &url("/.well-known/mcp.json"), 200),
        http_span(1, "POST", &url("/mcp/sse"), 404),
        http_span(2, "POST", &url("/mcp/sse"), 404),
        http_span(3, "POST", &url("/mcp/sse"), 404),
        http_span(4, "GET", &url("/mcp"), 405),
        with_retry_after(http_span(5, "POST", &url("/mcp"), 429), "1"),
        http_span(6, "POST", &url("/mcp"), 503),
        http_span(7, "POST", &url("/mcp"), 503),
        tool_call(8, "export", Some(-32601)),
    ];
    send(&server.bound, export("e2e-agent", spans)).await;
    send(
        &server.bound,
        export("other-agent", vec![tool_call(9, "export", None)]),
    )
    .await;
    let malformed = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"e2e-agent"}}]},
        "scopeSpans":[{"spans":[{"traceId":"not hex","spanId":"zz","name":"bad","kind":3}]}]}]}"#;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.bound.http))
        .header("content-type", "application/json")
        .body(malformed)
        .send()
        .await
        .expect("the receiver answers");
    assert_eq!(r.status(), 200);
}

/// The alert `alertname` of e2e-agent on weather-mcp as Alertmanager holds it twice: pushed by
/// refusal-gate (no `source` label) and fired by Prometheus's rule (`source: prometheus`).
async fn pushed_and_fired(am: &str, alertname: &str) -> (serde_json::Value, serde_json::Value) {
    held_twice(am, alertname, |a| {
        a["labels"]["client"] == "e2e-agent" && a["labels"]["interface"] == "weather-mcp"
    })
    .await
}

/// The interface alert `alertname` of weather-mcp as Alertmanager holds it twice: pushed and
/// fired by the rule. An interface's alert names no client.
async fn interface_alert(am: &str, alertname: &str) -> (serde_json::Value, serde_json::Value) {
    held_twice(am, alertname, |a| a["labels"]["interface"] == "weather-mcp").await
}

/// The alert `alertname` that `ours` picks, pushed by refusal-gate and fired by the rule, once
/// Alertmanager holds both (within a minute).
async fn held_twice(
    am: &str,
    alertname: &str,
    ours: impl Fn(&serde_json::Value) -> bool,
) -> (serde_json::Value, serde_json::Value) {
    let filter = format!("filter=alertname%3D%22{alertname}%22");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alerts = get_json(&format!("{am}/api/v2/alerts?{filter}"))
            .await
            .unwrap_or_default();
        let alerts = alerts.as_array().cloned().unwrap_or_default();
        let pushed = alerts
            .iter()
            .filter(|a| ours(a))
            .find(|a| a["labels"]["source"].is_null());
        let fired = alerts
            .iter()
            .filter(|a| ours(a))
            .find(|a| a["labels"]["source"] == "prometheus");
        if let (Some(p), Some(f)) = (pushed, fired) {
            return (p.clone(), f.clone());
        }
        assert!(Instant::now() < deadline, "Alertmanager has {alerts:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn get_json(url: &str) -> Option<serde_json::Value> {
    let r = reqwest::get(url).await.ok()?;
    serde_json::from_slice(&r.bytes().await.ok()?).ok()
}

/// Every `expr` in the dashboard, with Grafana's variables filled in.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dashboards/grafana/refusal-gate.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard")).expect("JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("an expr");
            let filled = expr
                .replace("$client", ".*")
                .replace("$interface", ".*")
                .replace("$__rate_interval", "1m")
                .replace("$__range", "10m");
            out.push((panel["title"].as_str().unwrap_or("?").to_owned(), filled));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_reach_alertmanager_twice_and_every_dashboard_query_has_data() {
    if !external("prometheus") || !external("prometheus-alertmanager") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("refusal-gate-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");

    let am_port = free_port();
    let am_config = dir.join("alertmanager.yml");
    std::fs::write(
        &am_config,
        "route:\n  receiver: nobody\nreceivers:\n  - name: nobody\n",
    )
    .expect("writing");
    let _alertmanager = Reaper(
        Command::new("prometheus-alertmanager")
            .arg(format!("--config.file={}", am_config.display()))
            .arg(format!("--storage.path={}", dir.join("am").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("alertmanager starts"),
    );
    let am = format!("http://127.0.0.1:{am_port}");

    let server = Server::start(&Config::parse(&config(&am)).expect("valid"))
        .await
        .expect("starts");

    let prom_port = free_port();
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dashboards/prometheus/refusal-gate.rules.yml"
    );
    let prom_config = dir.join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s, external_labels: {{ source: prometheus }} }}
rule_files: ['{rules}']
scrape_configs:
  - job_name: refusal-gate
    static_configs: [{{ targets: ['{}'] }}]
alerting:
  alertmanagers:
    - static_configs: [{{ targets: ['127.0.0.1:{am_port}'] }}]
",
            server.bound.admin
        ),
    )
    .expect("writing");
    let _prometheus = Reaper(
        Command::new("prometheus")
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let prometheus = format!("http://127.0.0.1:{prom_port}");

    // Let Prometheus take a first scrape before the scenario, as in a running system.
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_json(&format!("{prometheus}/api/v1/query?query=up"))
        .await
        .is_none_or(|v| v["data"]["result"][0]["value"][1] != "1")
    {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped refusal-gate"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    play(&server).await;

    // Each alert, twice over: pushed by refusal-gate, fired by the shipped rule.
    let (pushed, fired) = pushed_and_fired(&am, "RetryAfterAuthoritativeRefusal").await;
    assert_eq!(pushed["labels"]["severity"], "critical");
    assert_eq!(pushed["labels"]["violation"], "retry_after_refusal");
    assert_eq!(pushed["annotations"]["operation"], "POST /mcp/sse");
    assert_eq!(
        pushed["annotations"]["trace_id"].as_str().map(str::len),
        Some(32)
    );
    assert_eq!(fired["labels"]["severity"], "critical");
    assert_eq!(fired["labels"]["violation"], "retry_after_refusal");
    let (pushed, fired) = pushed_and_fired(&am, "RetryBeforeRetryAfter").await;
    for alert in [&pushed, &fired] {
        assert_eq!(alert["labels"]["severity"], "warning");
        assert_eq!(alert["labels"]["violation"], "retry_before_retry_after");
    }
    assert_eq!(pushed["annotations"]["operation"], "POST /mcp");
    // The interface that refused `export` to one client and served it to another.
    let (pushed, fired) = interface_alert(&am, "InterfaceContradictsItself").await;
    for alert in [&pushed, &fired] {
        assert_eq!(alert["labels"]["severity"], "warning");
        assert_eq!(alert["labels"]["kind"], "refusal_contradicted");
        assert!(alert["labels"]["client"].is_null(), "{alert}");
    }
    assert_eq!(pushed["annotations"]["operation"], "tools/call export");
    assert_eq!(
        pushed["annotations"]["span_id"], "000000000000000a",
        "the later attempt's"
    );
    let answer = |tool: &str| {
        let body = serde_json::json!({
            "client": { "serviceName": "e2e-agent" },
            "protocol": "mcp",
            "url": format!("{MCP}/mcp"),
            "method": "tools/call",
            "tool": tool,
        });
        let url = format!("http://{}/v1/decide", server.bound.admin);
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .expect("the gate answers");
            serde_json::from_slice::<serde_json::Value>(&r.bytes().await.expect("a body"))
                .expect("JSON")
        }
    };
    let gate = answer("export").await;
    assert_eq!(gate["contradicted"], true, "{gate}");
    assert_eq!(
        gate["rule"], "refused before: protocol_not_supported",
        "{gate}"
    );
    assert_eq!(answer("lookup").await["contradicted"], false);

    // The admin port lists it too.
    let listed = get_json(&format!("http://{}/api/v1/alerts", server.bound.admin))
        .await
        .expect("JSON");
    let names: Vec<&str> = listed["data"]["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .filter_map(|a| a["labels"]["alertname"].as_str())
        .collect();
    for name in [
        "RetryAfterAuthoritativeRefusal",
        "RetryBeforeRetryAfter",
        "InterfaceContradictsItself",
    ] {
        assert!(names.contains(&name), "{listed}");
    }

    // Every dashboard query returns data once a few scrapes have seen the scenario.
    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{} queries", queries.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut missing = Vec::new();
        for (title, expr) in &queries {
            let url = reqwest::Url::parse_with_params(
                &format!("{prometheus}/api/v1/query"),
                &[("query", expr)],
            )
            .expect("a URL");
            let answer = get_json(url.as_str()).await.unwrap_or_default();
            assert_ne!(answer["status"], "error", "{title}: {expr}: {answer}");
            if answer["data"]["result"]
                .as_array()
                .is_none_or(Vec::is_empty)
            {
                missing.push(format!("{title}: {expr}"));
            }
        }
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no data for:\n{}",
            missing.join("\n")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_interface_contradictions_total",
            &[
                ("interface", "weather-mcp"),
                ("kind", "refusal_contradicted")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_alerts_total",
            &[
                ("alertname", "InterfaceContradictsItself"),
                ("severity", "warning")
            ]
        ),
        1.0
    );
    assert!(
        value(
            &m,
            "refusal_gate_alert_deliveries_total",
            &[("receiver", "alertmanager"), ("outcome", "sent")]
        ) >= 1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_alerts_total",
            &[
                ("alertname", "RetryAfterAuthoritativeRefusal"),
                ("severity", "critical")
            ]
        ),
        2.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_alerts_total",
            &[
                ("alertname", "RetryBeforeRetryAfter"),
                ("severity", "warning")
            ]
        ),
        1.0
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in Alertmanager that answers `status` to the first `failures` pushes, then 200.
#[derive(Clone)]
struct FakeAm {
    hits: Arc<AtomicUsize>,
    failures: usize,
    status: StatusCode,
}

async fn fake_push(State(am): State<FakeAm>) -> StatusCode {
    if am.hits.fetch_add(1, Ordering::SeqCst) < am.failures {
        am.status
    } else {
        StatusCode::OK
    }
}

async fn fake_alertmanager(failures: usize, status: StatusCode) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/api/v2/alerts", post(fake_push))
        .with_state(FakeAm {
            hits: Arc::clone(&hits),
            failures,
            status,
        });
    (format!("http://{}", common::serve_http(app).await), hits)
}

async fn retry_after_refusal(server: &Server) {
    let spans = vec![
        http_span(0, "GET", &format!("{MCP}/.well-known/mcp.json"), 200),
        http_span(1, "POST", &format!("{MCP}/mcp/sse"), 404),
        http_span(2, "POST", &format!("{MCP}/mcp/sse"), 404),
    ];
    send(&server.bound, export("pushy", spans)).await;
    // Settle now rather than after the reorder window: a scrape does that.
    scrape(&server.bound).await;
}

fn deliveries(m: &str, outcome: &str) -> f64 {
    value(
        m,
        "refusal_gate_alert_deliveries_total",
        &[("receiver", "alertmanager"), ("outcome", outcome)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_503_is_retried_and_400_is_not() {
    let (flaky, flaky_hits) = fake_alertmanager(2, StatusCode::SERVICE_UNAVAILABLE).await;
    let server = Server::start(&Config::parse(&config(&flaky)).expect("valid"))
        .await
        .expect("starts");
    retry_after_refusal(&server).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while flaky_hits.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < deadline,
            "only {} pushes",
            flaky_hits.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = scrape(&server.bound).await;
    assert_eq!(deliveries(&m, "failed"), 2.0);
    assert_eq!(deliveries(&m, "sent"), 1.0);
    server.shutdown().await;

    let (strict, strict_hits) = fake_alertmanager(usize::MAX, StatusCode::BAD_REQUEST).await;
    let server = Server::start(&Config::parse(&config(&strict)).expect("valid"))
        .await
        .expect("starts");
    retry_after_refusal(&server).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while strict_hits.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "never pushed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several flush intervals and backoffs later, still one push.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        strict_hits.load(Ordering::SeqCst),
        1,
        "a 400 is not retried"
    );
    let m = scrape(&server.bound).await;
    assert_eq!(deliveries(&m, "rejected"), 1.0);
    assert_eq!(deliveries(&m, "failed"), 0.0);
    server.shutdown().await;
}
