//! A real Prometheus scrapes a real refusal-gate: the counters it stores are the ones the
//! spans should have produced, their exemplars name the violating calls (Prometheus asks for
//! OpenMetrics), and `promtool check metrics` finds nothing to lint in the 0.0.4 format a
//! scraper gets when it does not ask.
//!
//! Needs Debian's `prometheus` package (and `prometheus-alertmanager` for `amtool`), which
//! the README's test command installs. Under plain `cargo test` without them, the tests say
//! so and pass; under the test command (`REFUSAL_GATE_REQUIRE_EXTERNAL=1`) a missing binary
//! fails them.

mod common;

use common::{export, external, free_port, http_span, scrape, send, start, Reaper, CONFIG};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A discovery read and `retries + 1` refused calls to an undeclared path, the `i`-th in a
/// trace of its own ([`trace_of`]).
fn storm(service: &str, retries: u64) -> Vec<u8> {
    let mut spans = vec![http_span(
        0,
        "GET",
        "http://mcp.test:8080/.well-known/mcp.json",
        200,
    )];
    spans.extend((1..=retries + 1).map(|i| {
        let mut span = http_span(i, "POST", "http://mcp.test:8080/mcp/sse", 404);
        span.trace_id = trace_of(i);
        span
    }));
    export(service, spans)
}

/// The trace id of the storm's `i`-th call.
fn trace_of(i: u64) -> Vec<u8> {
    vec![0x10 + i as u8; 16]
}

/// The exemplars Prometheus stored for `promql` over the fixtures' time, as (trace_id,
/// span_id) label values.
async fn exemplars(prometheus: &str, promql: &str) -> Vec<(String, String)> {
    let t0 = common::T0 / 1_000_000_000;
    let Ok(response) = reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query_exemplars"))
        .query(&[
            ("query", promql.to_owned()),
            ("start", (t0 - 60).to_string()),
            ("end", (t0 + 60).to_string()),
        ])
        .send()
        .await
    else {
        return Vec::new();
    };
    let bytes = response.bytes().await.unwrap_or_default();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let mut found = Vec::new();
    for series in body["data"].as_array().into_iter().flatten() {
        for e in series["exemplars"].as_array().into_iter().flatten() {
            let label = |name: &str| e["labels"][name].as_str().unwrap_or_default().to_owned();
            found.push((label("trace_id"), label("span_id")));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_counters() {
    if !external("prometheus") {
        return;
    }
    let server = start(CONFIG).await;
    let dir = std::env::temp_dir().join(format!("refusal-gate-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             scrape_configs:\n  - job_name: refusal-gate\n    static_configs:\n      - targets: ['{}']\n",
            server.bound.admin
        ),
    )
    .expect("writing the config");
    let port = free_port();
    let _prometheus = Reaper(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            // Exemplars are kept only with this; the scrape then asks for OpenMetrics.
            .arg("--enable-feature=exemplar-storage")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );

    send(&server.bound, storm("prom-client", 4)).await;

    let prometheus = format!("http://127.0.0.1:{port}");
    let retries = r#"sum(refusal_gate_violations_total{client="prom-client",violation="retry_after_refusal"})"#;
    let refusals = r#"sum(refusal_gate_attempts_total{client="prom-client",class="refusal"})"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = (None, None);
    while Instant::now() < deadline {
        seen = (
            common::prometheus_query(&prometheus, retries).await,
            common::prometheus_query(&prometheus, refusals).await,
        );
        if seen == (Some(4.0), Some(5.0)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(seen, (Some(4.0), Some(5.0)), "what Prometheus stored");
    assert_eq!(
        common::prometheus_query(&prometheus, r#"up{job="refusal-gate"}"#).await,
        Some(1.0)
    );

    // From the counter to the trace: the violations' exemplar is a violating call, the
    // latest (the storm's retries are its calls 2 to 5, each in a trace of its own).
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let violating: Vec<(String, String)> = (2..=5)
        .map(|i: u64| (hex(&trace_of(i)), hex(&(i + 1).to_be_bytes())))
        .collect();
    let found = exemplars(
        &prometheus,
        r#"refusal_gate_violations_total{client="prom-client"}"#,
    )
    .await;
    assert!(
        !found.is_empty() && found.iter().all(|e| violating.contains(e)),
        "exemplars {found:?}, violating calls {violating:?}"
    );
    assert_eq!(found.last(), violating.last(), "the latest violating call");
    let refusals = exemplars(
        &prometheus,
        r#"refusal_gate_attempts_total{client="prom-client",class="refusal"}"#,
    )
    .await;
    assert_eq!(refusals.last(), violating.last(), "the latest refused call");

    // A scraper that does not ask for OpenMetrics gets the 0.0.4 text format, no exemplar.
    let plain = reqwest::get(format!("http://{}/metrics", server.bound.admin))
        .await
        .expect("the admin endpoint answers");
    assert_eq!(
        plain.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let plain = plain.text().await.expect("a body");
    assert!(
        !plain.contains("trace_id") && !plain.contains("# EOF"),
        "{plain}"
    );

    // The exposition passes Prometheus's own lint.
    let text = scrape(&server.bound).await;
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    lint.stdin
        .take()
        .expect("a stdin")
        .write_all(text.as_bytes())
        .expect("writing the exposition");
    let out = lint.wait_with_output().expect("promtool finishes");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs a command in `dashboards/` and fails with its output unless it succeeds.
fn check(program: &str, args: &[&str]) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards");
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shipped_rules_and_configs_pass_promtool_and_amtool() {
    if !external("promtool") || !external("amtool") {
        return;
    }
    check(
        "promtool",
        &["check", "rules", "prometheus/refusal-gate.rules.yml"],
    );
    check(
        "promtool",
        &["test", "rules", "prometheus/refusal-gate.rules.test.yml"],
    );
    check(
        "promtool",
        &["check", "config", "prometheus/prometheus.yml"],
    );
    check("amtool", &["check-config", "alertmanager/alertmanager.yml"]);
}
