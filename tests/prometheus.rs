//! A real Prometheus scrapes a real refusal-gate: the counters it stores are the ones the
//! spans should have produced, and `promtool check metrics` finds nothing to lint.
//!
//! Needs Debian's `prometheus` package, which the README's test command installs. Under
//! plain `cargo test` without it, the test says so and passes; under the test command
//! (`REFUSAL_GATE_REQUIRE_EXTERNAL=1`) a missing binary fails it.

mod common;

use common::{export, http_span, scrape, send, start, CONFIG};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `binary` is on PATH; when it is not, fails under the test command and skips
/// (with a message) otherwise.
pub fn external(binary: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .stdout(Stdio::null())
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

/// Kills the child when the test ends, however it ends.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A discovery read and `retries + 1` refused calls to an undeclared path.
fn storm(service: &str, retries: u64) -> Vec<u8> {
    let mut spans = vec![http_span(
        0,
        "GET",
        "http://mcp.test:8080/.well-known/mcp.json",
        200,
    )];
    spans.extend(
        (1..=retries + 1).map(|i| http_span(i, "POST", "http://mcp.test:8080/mcp/sse", 404)),
    );
    export(service, spans)
}

async fn query(prometheus: &str, promql: &str) -> Option<f64> {
    let response = reqwest::Client::new()
        .get(format!("{prometheus}/api/v1/query"))
        .query(&[("query", promql)])
        .send()
        .await
        .ok()?;
    let body: serde_json::Value = serde_json::from_slice(&response.bytes().await.ok()?).ok()?;
    body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let _prometheus = Reaper(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
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
            query(&prometheus, retries).await,
            query(&prometheus, refusals).await,
        );
        if seen == (Some(4.0), Some(5.0)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(seen, (Some(4.0), Some(5.0)), "what Prometheus stored");
    assert_eq!(
        query(&prometheus, r#"up{job="refusal-gate"}"#).await,
        Some(1.0)
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
