//! Real agent stacks in other languages against the binary. A Python agent — httpx, the
//! official OpenTelemetry SDK and `opentelemetry-instrumentation-httpx`, capturing the
//! `retry-after` response header — calls a small local server that answers 429 and 503 with
//! `Retry-After`, and exports its client spans over OTLP/HTTP to refusal-gate. The agent that
//! honours the delay (delay-seconds, and an HTTP-date) commits nothing; the one that comes back
//! after 100 ms commits `retry_before_retry_after` on each early retry.
//!
//! The agent's virtual environment (`tests/agents/requirements.txt`) is made by the README's
//! test command, which names its Python in `REFUSAL_GATE_AGENT_PYTHON`; without it, plain
//! `cargo test` skips this test with a message.

mod common;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::{agent_python, binary_config, spawn_binary, value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The throttling server: the first call to `/quota/{name}` starts a wait; every call before it
/// ends is answered 429 (`Retry-After: 1`) or, for `date`, 503 with the end as an HTTP-date;
/// calls after it get 200.
#[derive(Clone, Default)]
struct Quota {
    until: Arc<Mutex<HashMap<String, SystemTime>>>,
}

async fn quota(State(q): State<Quota>, Path(name): Path<String>) -> Response {
    let now = SystemTime::now();
    let by_date = name == "date";
    let until = *q
        .until
        .lock()
        .expect("not poisoned")
        .entry(name)
        .or_insert_with(|| {
            if by_date {
                // An HTTP-date has whole seconds: the wait ends at the one it names.
                httpdate::parse_http_date(&httpdate::fmt_http_date(now + Duration::from_secs(2)))
                    .expect("round trip")
            } else {
                now + Duration::from_secs(1)
            }
        });
    if now >= until {
        return StatusCode::OK.into_response();
    }
    let (status, header) = if by_date {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            httpdate::fmt_http_date(until),
        )
    } else {
        (StatusCode::TOO_MANY_REQUESTS, "1".to_owned())
    };
    let mut response = status.into_response();
    response.headers_mut().insert(
        "retry-after",
        HeaderValue::from_str(&header).expect("a header value"),
    );
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_agents_that_honour_retry_after_commit_nothing_and_one_that_does_not_is_caught() {
    let Some(python) = agent_python() else {
        return;
    };
    let app = Router::new()
        .route("/quota/{name}", post(quota))
        .with_state(Quota::default());
    let server = common::serve_http(app).await;

    let dir = std::env::temp_dir().join(format!("refusal-gate-agents-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) = binary_config(&dir, "agents", "");
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/retry_after.py");
    // (service, story, path, stable HTTP semantic conventions)
    let runs = [
        ("py-honours-seconds", "honours", "seconds", false),
        ("py-honours-date", "honours", "date", true),
        ("py-ignores", "ignores", "ignored", false),
        ("py-ignores-stable", "ignores", "ignored-stable", true),
    ];
    let agents: Vec<_> = runs
        .iter()
        .map(|(service, story, path, stable)| {
            let mut agent = tokio::process::Command::new(&python);
            agent
                .arg(script)
                .arg(story)
                .arg(format!("http://{server}/quota/{path}"))
                .env("OTEL_SERVICE_NAME", service)
                .env(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    format!("http://127.0.0.1:{}/v1/traces", ports.http),
                )
                .env(
                    "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_RESPONSE",
                    "retry-after",
                )
                .env("OTEL_BSP_SCHEDULE_DELAY", "200")
                .kill_on_drop(true);
            if *stable {
                agent.env("OTEL_SEMCONV_STABILITY_OPT_IN", "http");
            }
            // The agents run at once: each waits a second or two on the server's word.
            tokio::spawn(async move { agent.output().await })
        })
        .collect();
    for (agent, (service, ..)) in agents.into_iter().zip(&runs) {
        let output = agent.await.expect("joined").expect("the agent runs");
        assert!(
            output.status.success(),
            "{service}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // The agents flushed their spans before they exited; a scrape settles what is pending.
    let m = reqwest::get(format!("http://127.0.0.1:{}/metrics", ports.admin))
        .await
        .expect("the admin port answers")
        .text()
        .await
        .expect("a body");
    let count = |client: &str, labels: &[(&str, &str)]| {
        let mut all = vec![("client", client)];
        all.extend_from_slice(labels);
        value(&m, "refusal_gate_attempts_total", &all)
    };
    let violations = |client: &str| {
        common::series(&m, "refusal_gate_violations_total")
            .into_iter()
            .filter(|(labels, _)| labels.get("client").map(String::as_str) == Some(client))
            .map(|(labels, n)| (labels["violation"].clone(), n))
            .collect::<Vec<_>>()
    };
    assert_eq!(count("py-honours-seconds", &[("class", "throttled")]), 1.0);
    assert_eq!(count("py-honours-seconds", &[("class", "ok")]), 1.0);
    assert_eq!(count("py-honours-date", &[("class", "transient")]), 1.0);
    assert_eq!(count("py-honours-date", &[("class", "ok")]), 1.0);
    for client in ["py-honours-seconds", "py-honours-date"] {
        assert_eq!(violations(client), vec![], "{client} waited as asked");
    }
    for client in ["py-ignores", "py-ignores-stable"] {
        assert_eq!(count(client, &[("class", "throttled")]), 3.0, "{client}");
        assert_eq!(
            violations(client),
            vec![("retry_before_retry_after".to_owned(), 2.0)],
            "{client}: two retries 100 ms after a 429 that asked for a second"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
