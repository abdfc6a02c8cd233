//! The server view with real servers and clients that send no telemetry (DESIGN §9): the
//! official MCP Python SDK's server (its OpenTelemetry spans on, the SDK's default) behind
//! `opentelemetry-instrumentation-asgi`, exporting its SERVER spans over OTLP/HTTP to the
//! binary, and DESIGN §1's federation replayed against it by plain httpx clients that export
//! nothing and name themselves only in their User-Agent. The counters must tell the same three
//! stories the conformance suite's federation tells from client spans. A fourth client is
//! instrumented (the OpenTelemetry SDK and the httpx instrumentation, propagating its trace
//! context): both sides export its calls, and each is counted once, as the client's.
//!
//! The Python side lives in `tests/agents/` and runs in the agents' virtual environment, which
//! the README's test command makes (`REFUSAL_GATE_AGENT_PYTHON`); plain `cargo test` skips.

mod common;

use common::{
    admin_metrics as metrics, agent_python, binary_config, free_port, spawn_binary, value,
};
use std::time::Duration;

fn script(name: &str) -> String {
    format!("{}/tests/agents/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs one federation story against the MCP server at `base`; `export` also instruments it.
async fn story(python: &str, name: &str, base: &str, export: Option<(&str, u16)>) {
    let mut client = tokio::process::Command::new(python);
    client.arg(script("federation.py")).arg(name).arg(base);
    if let Some((service, port)) = export {
        client
            .env("OTEL_SERVICE_NAME", service)
            .env(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("http://127.0.0.1:{port}/v1/traces"),
            )
            .env("OTEL_BSP_SCHEDULE_DELAY", "100");
    }
    let out = client.output().await.expect("the client runs");
    assert!(
        out.status.success(),
        "{name}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_servers_own_spans_tell_the_federations_three_stories_and_each_call_counts_once() {
    let Some(python) = agent_python() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("refusal-gate-sv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let mcp_port = free_port();
    let base = format!("http://127.0.0.1:{mcp_port}");
    let (config, ports) = binary_config(
        &dir,
        "server-view",
        &format!(
            "interfaces:
  - name: weather-mcp
    protocol: mcp
    url: {base}/mcp
    endpoints: [{{ path: /mcp, methods: [POST, GET, DELETE] }}]
    server: {{ service_names: [weather-mcp] }}
"
        ),
    );
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;

    let mut server = tokio::process::Command::new(&python)
        .arg(script("mcp_server.py"))
        .arg(mcp_port.to_string())
        .env("OTEL_SERVICE_NAME", "weather-mcp")
        .env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            format!("http://127.0.0.1:{}/v1/traces", ports.http),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the MCP server starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while tokio::net::TcpStream::connect(("127.0.0.1", mcp_port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server never listened"
        );
        if let Some(status) = server.try_wait().expect("waitable") {
            panic!("the MCP server exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    for name in ["planner", "prober", "assistant"] {
        story(&python, name, &base, None).await;
    }
    story(
        &python,
        "careful",
        &base,
        Some(("careful-agent", ports.http)),
    )
    .await;
    // Everything arrived (the server exports every 100 ms): the prober's 23 attempts, the
    // planner's 2, the assistant's 4 and the careful agent's 2, and the 10 server spans each
    // the same call as another (below).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(ports.admin).await;
        let on = |client: &str| {
            value(
                &m,
                "refusal_gate_attempts_total",
                &[("client", client), ("interface", "weather-mcp")],
            )
        };
        let seen = [
            on("prober-agent/1.0"),
            on("planner-agent/1.0"),
            on("assistant-agent/1.0"),
            on("careful-agent"),
            value(
                &m,
                "refusal_gate_spans_skipped_total",
                &[("reason", "same_call")],
            ),
        ];
        if seen == [23.0, 2.0, 4.0, 2.0, 10.0] {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "attempts: {seen:?}\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let violations = |client: &str, violation: Option<&str>| {
        let mut labels = vec![("client", client)];
        labels.extend(violation.map(|v| ("violation", v)));
        value(&m, "refusal_gate_violations_total", &labels)
    };
    // The planner stopped at -32601: a refusal, after its read (initialize), and no violation.
    let planner = "planner-agent/1.0";
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", planner), ("kind", "protocol_not_supported")]
        ),
        1.0
    );
    assert_eq!(violations(planner, None), 0.0);
    // The prober: 22 POSTs to three undeclared paths after reading the card.
    let prober = "prober-agent/1.0";
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", prober), ("kind", "interface_not_declared")]
        ),
        22.0
    );
    assert_eq!(violations(prober, Some("retry_after_refusal")), 19.0);
    assert_eq!(violations(prober, Some("probe_after_refusal")), 2.0);
    // The assistant retried a failing tools/call twice. (The SDK answers an unknown tool with a
    // tool result marked isError, which its span records as `tool_error`: ambiguous, as the
    // recording's -32602 is.)
    let assistant = "assistant-agent/1.0";
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", assistant), ("class", "ambiguous")]
        ),
        3.0
    );
    assert_eq!(violations(assistant, Some("retry_after_ambiguous")), 2.0);
    assert_eq!(violations(assistant, None), 2.0);
    // Both sides exported the careful agent's calls: each counted once, under the name its
    // own telemetry gives, not the User-Agent its server spans name.
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "careful-agent/1.0")]
        ),
        0.0
    );
    assert_eq!(violations("careful-agent", None), 0.0);
    // The MCP spans took their client from the ASGI span around them: no unknown client, and
    // each pair counted once — the ASGI spans of the planner's 2 calls and the assistant's 4,
    // and both server spans of each of the careful agent's 2.
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "unknown_client")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_spans_skipped_total",
            &[("reason", "same_call")]
        ),
        10.0
    );
    let _ = server.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
