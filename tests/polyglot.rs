//! Agents in Go and Java against the binary, each a small program of the project's built by the
//! README's test command with its dependencies pinned: the official MCP Go SDK's client and a
//! plain `net/http` client, both on `otelhttp`'s transport, exporting with the Go SDK's OTLP/HTTP
//! exporter (`tests/agents/go`, `REFUSAL_GATE_AGENT_GO`); the official MCP Java SDK's client and
//! the JDK's `HttpClient`, under the OpenTelemetry Java agent, which instruments that client and
//! exports over OTLP/HTTP (`tests/agents/java`, `REFUSAL_GATE_AGENT_JAVA`). Neither SDK records
//! spans of its own: each MCP call is an HTTP CLIENT span, and the server's spans say which call
//! it was (DESIGN §11.3 as this project reads it, the note of issue 65).
//!
//! Each plays DESIGN §1's three clients against the MCP server the other stacks' tests run (the
//! official Python SDK's, behind the ASGI instrumentation, its SERVER spans observed), and a
//! careful one: the planner stopped at -32601, the prober's 22 requests to three undeclared
//! paths, the assistant's two retries of a failing `tools/call`. And against an HTTP API with an
//! OpenAPI document: one that retries a 503 within its budget, and one whose HTTP client sends a
//! request again on its own (a 307). The counters must be what DESIGN makes of the spans each
//! stack really sent — one attempt per HTTP request — and the test prints, per stack, what the
//! spans of a refused call carried.

mod common;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use common::{binary_config, free_port, fresh_dir, spawn_binary, value};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The MCP server's service name: its SERVER spans are the server view of `weather`.
const SERVER: &str = "weather-polyglot";

/// The HTTP API's OpenAPI document.
const OPENAPI: &str = r#"{"openapi":"3.1.0","info":{"title":"orders","version":"1"},"paths":{
"/v1/orders":{"post":{"responses":{"201":{"description":"placed"}}}},
"/v1/orders/legacy":{"post":{"responses":{"307":{"description":"moved to /v1/orders"}}}},
"/v1/reservations":{"post":{"responses":{"201":{"description":"held"},"503":{"description":"busy"}}}}}}"#;

/// The HTTP API: its document, orders, the old address of orders (307), and reservations,
/// which answer 503 twice before each 201.
async fn api() -> std::net::SocketAddr {
    let busy = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route(
            "/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .route("/v1/orders", post(|| async { StatusCode::CREATED }))
        .route(
            "/v1/orders/legacy",
            post(|| async {
                let to = [(header::LOCATION, "/v1/orders")];
                (StatusCode::TEMPORARY_REDIRECT, to).into_response()
            }),
        )
        .route(
            "/v1/reservations",
            post(move || async move {
                match busy.fetch_add(1, Ordering::SeqCst) % 3 {
                    2 => StatusCode::CREATED,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                }
            }),
        );
    common::serve_http(app).await
}

/// The binary's interfaces: the MCP server, observed from its side too, and the HTTP API.
fn interfaces(mcp: u16, api: std::net::SocketAddr) -> String {
    format!(
        "interfaces:
  - name: weather
    protocol: mcp
    url: http://127.0.0.1:{mcp}/mcp
    endpoints: [{{ path: /mcp, methods: [POST, GET, DELETE] }}]
    server: {{ service_names: [{SERVER}] }}
  - name: orders-api
    protocol: http
    url: http://{api}
    endpoints:
      - {{ path: /v1/orders, methods: [POST] }}
      - {{ path: /v1/orders/legacy, methods: [POST] }}
      - {{ path: /v1/reservations, methods: [POST] }}
"
    )
}

/// One recorded span: its name, kind and attributes.
#[derive(Debug, serde::Deserialize)]
struct Recorded {
    name: String,
    kind: String,
    #[serde(default)]
    attributes: serde_json::Map<String, serde_json::Value>,
}

impl Recorded {
    /// Whether it is an HTTP CLIENT span: one request sent.
    fn is_request(&self) -> bool {
        self.kind == "client"
            && (self.attributes.contains_key("http.request.method")
                || self.attributes.contains_key("http.method"))
    }

    /// Its attribute `key`, a string.
    fn text(&self, key: &str) -> Option<&str> {
        self.attributes.get(key)?.as_str()
    }

    /// Its HTTP status, under either convention.
    fn status(&self) -> Option<i64> {
        ["http.response.status_code", "http.status_code"]
            .iter()
            .find_map(|k| self.attributes.get(*k)?.as_i64())
    }
}

/// The spans a recording holds (one JSON object a line).
fn recorded(file: &Path) -> Vec<Recorded> {
    let text = std::fs::read_to_string(file).expect("the agent recorded its spans");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a recorded span"))
        .collect()
}

/// An agent program of another language.
enum Agent {
    /// The Go agent's binary.
    Go(std::path::PathBuf),
    /// The directory of the Java agent's `agent.jar`, its `lib/` and
    /// `opentelemetry-javaagent.jar`.
    Java(std::path::PathBuf),
}

impl Agent {
    /// Runs `story` against `base` as the service `client`, its spans exported to the OTLP/HTTP
    /// receiver on `otlp`; returns the spans it recorded (the Go agent's file in `dir`, the
    /// Java agent's `logging-otlp` lines).
    async fn story(
        &self,
        dir: &Path,
        (story, base, client): (&str, &str, &str),
        otlp: u16,
    ) -> Vec<Recorded> {
        let record = dir.join(format!("{client}.jsonl"));
        let mut command = match self {
            Agent::Go(binary) => {
                let mut command = tokio::process::Command::new(binary);
                command.env("RECORD", &record);
                command
            }
            Agent::Java(built) => {
                let mut command = tokio::process::Command::new("java");
                command
                    .arg(format!(
                        "-javaagent:{}",
                        built.join("opentelemetry-javaagent.jar").display()
                    ))
                    .arg("-jar")
                    .arg(built.join("agent.jar"))
                    .env("OTEL_TRACES_EXPORTER", "otlp,logging-otlp")
                    .env("OTEL_METRICS_EXPORTER", "none")
                    .env("OTEL_LOGS_EXPORTER", "none");
                command
            }
        };
        command.args([story, base]).env("OTEL_SERVICE_NAME", client);
        let out = common::exporting_to(otlp, command).await;
        match self {
            Agent::Go(_) => recorded(&record),
            Agent::Java(_) => logged(&String::from_utf8_lossy(&out.stderr)),
        }
    }
}

/// The spans of the Java agent's `logging-otlp` exporter: a line per batch, one resource's
/// spans in OTLP/JSON after the logger's name.
fn logged(stderr: &str) -> Vec<Recorded> {
    let mut out = Vec::new();
    for line in stderr.lines() {
        let Some((_, json)) = line.split_once("OtlpJsonLoggingSpanExporter - ") else {
            continue;
        };
        let resource: serde_json::Value = serde_json::from_str(json).expect("OTLP/JSON");
        let scopes = resource["scopeSpans"].as_array().into_iter().flatten();
        for span in scopes.flat_map(|s| s["spans"].as_array().into_iter().flatten()) {
            let attributes = span["attributes"].as_array().into_iter().flatten();
            let attributes = attributes
                .map(|kv| {
                    (
                        kv["key"].as_str().unwrap_or_default().to_owned(),
                        plain(&kv["value"]),
                    )
                })
                .collect();
            out.push(Recorded {
                name: span["name"].as_str().unwrap_or_default().to_owned(),
                kind: if span["kind"] == 3 { "client" } else { "other" }.to_owned(),
                attributes,
            });
        }
    }
    out
}

/// An OTLP/JSON `AnyValue` as plain JSON (an `intValue`, a string there, as a number).
fn plain(value: &serde_json::Value) -> serde_json::Value {
    let Some((kind, v)) = value.as_object().and_then(|o| o.iter().next()) else {
        return serde_json::Value::Null;
    };
    match (kind.as_str(), v.as_str()) {
        ("intValue", Some(n)) => n.parse::<i64>().map_or(v.clone(), Into::into),
        _ => v.clone(),
    }
}

/// The stories every stack plays, and whether each runs on the MCP server (else the API).
const STORIES: [(&str, bool); 6] = [
    ("planner", true),
    ("prober", true),
    ("assistant", true),
    ("careful", true),
    ("retrier", false),
    ("resend", false),
];

/// Checks the counters of `stack`'s stories in the scrape `m`; `prober` is what the prober
/// recorded.
fn stories_counted_as_design_says(m: &str, stack: &str, prober: &[Recorded]) {
    let client = |story: &str| format!("{stack}-{story}");
    let of = |story: &str, labels: &[(&str, &str)]| {
        let c = client(story);
        let mut all = vec![("client", c.as_str())];
        all.extend_from_slice(labels);
        value(m, "refusal_gate_attempts_total", &all)
    };
    let violations = |story: &str, violation: &str| {
        let c = client(story);
        let mut labels = vec![("client", c.as_str())];
        if !violation.is_empty() {
            labels.push(("violation", violation));
        }
        value(m, "refusal_gate_violations_total", &labels)
    };
    for (story, on_mcp) in STORIES {
        let interface = if on_mcp { "weather" } else { "orders-api" };
        assert_eq!(
            of(story, &[]),
            of(story, &[("interface", interface)]),
            "{story}\n{m}"
        );
        let c = client(story);
        assert!(
            value(m, "refusal_gate_discovery_reads_total", &[("client", &c)]) >= 1.0,
            "{c} read the contract first\n{m}"
        );
    }
    // The planner: refused -32601 once, and stopped.
    assert_eq!(
        of("planner", &[("kind", "protocol_not_supported")]),
        1.0,
        "{m}"
    );
    assert_eq!(violations("planner", ""), 0.0, "{m}");
    // The prober: every request refused by its 404, on a key of its method and path (no
    // protocol span on either side says which call it was: the server's MCP handler never
    // saw it). All but the first on each key retry after a refusal; the first on every other
    // key probes. (The Go SDK sends `server/discover`, then `initialize`, both POSTs: 3 keys;
    // the Java SDK a POST and a GET: 6.)
    let refused: Vec<&Recorded> = prober
        .iter()
        .filter(|s| s.is_request() && s.status() == Some(404))
        .collect();
    let keys: std::collections::BTreeSet<(Option<&str>, Option<&str>)> = refused
        .iter()
        .map(|s| (s.text("http.request.method"), s.text("url.full")))
        .collect();
    let (refused, keys) = (refused.len() as f64, keys.len() as f64);
    assert!(
        refused >= 22.0 && keys >= 3.0,
        "22 connections at three paths: {refused}, {keys}"
    );
    assert_eq!(
        of("prober", &[("kind", "interface_not_declared")]),
        refused,
        "{m}"
    );
    assert_eq!(
        violations("prober", "retry_after_refusal"),
        refused - keys,
        "{m}"
    );
    assert_eq!(
        violations("prober", "probe_after_refusal"),
        keys - 1.0,
        "{m}"
    );
    let requests = prober.iter().filter(|s| s.is_request()).count() as f64;
    assert_eq!(of("prober", &[]), requests, "{m}");
    // The assistant: a failing tool called three times, twice a retry after an ambiguous answer.
    assert_eq!(of("assistant", &[("kind", "ambiguous")]), 3.0, "{m}");
    assert_eq!(violations("assistant", "retry_after_ambiguous"), 2.0, "{m}");
    assert_eq!(violations("assistant", ""), 2.0, "{m}");
    // The careful agent, the one retrying a 503 within its budget, and the one whose client
    // followed a redirect on its own: nothing to say.
    for story in ["careful", "retrier", "resend"] {
        assert_eq!(violations(story, ""), 0.0, "{story}\n{m}");
        assert_eq!(of(story, &[("class", "refusal")]), 0.0, "{story}\n{m}");
    }
    assert_eq!(of("retrier", &[("class", "transient")]), 2.0, "{m}");
    // Each read the document first: the retrier's 201, and the 307 and the 201 it led to (one
    // span or two: the HTTP client's own requests, as its instrumentation records them).
    assert_eq!(of("retrier", &[("class", "ok")]), 2.0, "{m}");
    assert_eq!(of("resend", &[("class", "ok")]), of("resend", &[]), "{m}");
}

/// Prints, for the note and the next contract, what `stack`'s spans of a refused call carried:
/// the planner's last request (its `completion/complete`, answered -32601) and the prober's
/// first 404.
fn show_refused(stack: &str, planner: &[Recorded], prober: &[Recorded]) {
    let show = |span: Option<&Recorded>| {
        span.map(|s| {
            let attributes = serde_json::Value::Object(s.attributes.clone());
            format!("  {} {:?} {attributes}", s.kind, s.name)
        })
        .unwrap_or_default()
    };
    let complete = planner.iter().rfind(|s| s.is_request());
    let undeclared = prober.iter().find(|s| s.status() == Some(404));
    println!(
        "{stack}: the planner's refused call (-32601):\n{}",
        show(complete)
    );
    println!(
        "{stack}: the prober's refused call (404):\n{}",
        show(undeclared)
    );
}

/// Plays every story of `agent`, as the clients `stack-story`, against the MCP server and the
/// HTTP API, and checks what the binary counted.
async fn tell_the_stories(agent: Agent, stack: &str) {
    let Some(python) = common::agent_python() else {
        return;
    };
    let dir = fresh_dir("polyglot", stack);
    let (mcp, api) = (free_port(), api().await);
    let (config, ports) = binary_config(&dir, stack, &interfaces(mcp, api));
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let server = ["mcp_server.py"];
    let _server = common::mcp_server_every(&python, &server, (mcp, SERVER), ports.http, 100).await;

    let mut expected = Vec::new();
    let mut recordings = std::collections::BTreeMap::new();
    for (story, on_mcp) in STORIES {
        let base = if on_mcp {
            format!("http://127.0.0.1:{mcp}")
        } else {
            format!("http://{api}")
        };
        let client = format!("{stack}-{story}");
        let spans = agent.story(&dir, (story, &base, &client), ports.http).await;
        expected.push((client, spans.iter().filter(|s| s.is_request()).count()));
        recordings.insert(story, spans);
    }
    let m = common::attempts_reach(ports.admin, &expected).await;
    show_refused(stack, &recordings["planner"], &recordings["prober"]);
    // The request the HTTP client sent again on its own after the 307, and what its span says.
    for span in recordings["resend"].iter().filter(|s| s.is_request()) {
        let resends = span.attributes.get("http.request.resend_count");
        let url = span.text("url.full").unwrap_or_default();
        println!(
            "{stack}: resend story: {} {url} {:?}, resend_count {resends:?}",
            span.name,
            span.status()
        );
    }
    stories_counted_as_design_says(&m, stack, &recordings["prober"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_agents_on_the_mcp_go_sdk_and_otelhttp_tell_the_federations_stories() {
    if let Some(binary) = common::agent_program("REFUSAL_GATE_AGENT_GO") {
        tell_the_stories(Agent::Go(binary), "go").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_agents_on_the_mcp_java_sdk_under_the_java_agent_tell_the_federations_stories() {
    if let Some(built) = common::agent_program("REFUSAL_GATE_AGENT_JAVA") {
        tell_the_stories(Agent::Java(built), "java").await;
    }
}
