//! Black-box tests of discovery documents: real-shaped A2A cards, OpenAPI documents and an
//! MCP server card, served by a local HTTP server and read from files, decide which 404s are
//! refusals; URL documents are fetched by the product's own retry rule; a reload picks up a
//! changed document while the tracker remembers earlier refusals.

mod common;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use common::{export, http_span, scrape, send, value};
use opentelemetry_proto::tonic::trace::v1::Span;
use refusal_gate::app::{Bound, Server};
use refusal_gate::config::Config;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn fixtures() -> String {
    format!("{}/tests/fixtures/discovery", env!("CARGO_MANIFEST_DIR"))
}

/// A document server: fixtures under /cards/ (with ETags), one URL that fails twice with
/// 503 before it answers, and one that is not there. It counts every request by path.
#[derive(Clone, Default)]
struct Docs {
    hits: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    flaky: Arc<AtomicUsize>,
}

impl Docs {
    fn hits(&self, path: &str) -> usize {
        self.hits
            .lock()
            .expect("not poisoned")
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    fn hit(&self, path: &str) {
        *self
            .hits
            .lock()
            .expect("not poisoned")
            .entry(path.to_owned())
            .or_default() += 1;
    }
}

async fn card(
    State(docs): State<Docs>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> impl IntoResponse {
    docs.hit(&format!("/cards/{name}"));
    let Ok(body) = std::fs::read(format!("{}/{name}", fixtures())) else {
        return (StatusCode::NOT_FOUND, HeaderMap::new(), Vec::new());
    };
    let etag = format!("\"{}\"", body.len());
    let mut out = HeaderMap::new();
    out.insert("etag", etag.parse().expect("a valid header"));
    if headers.get("if-none-match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return (StatusCode::NOT_MODIFIED, out, Vec::new());
    }
    (StatusCode::OK, out, body)
}

async fn flaky(State(docs): State<Docs>) -> impl IntoResponse {
    docs.hit("/flaky.json");
    if docs.flaky.fetch_add(1, Ordering::SeqCst) < 2 {
        return (StatusCode::SERVICE_UNAVAILABLE, Vec::new());
    }
    let card = br#"{"title": "Flaky", "remotes": [{"type": "streamable-http", "url": "http://flaky.fixture.test/mcp"}]}"#;
    (StatusCode::OK, card.to_vec())
}

async fn missing(State(docs): State<Docs>) -> impl IntoResponse {
    docs.hit("/missing.json");
    StatusCode::NOT_FOUND
}

async fn serve_docs() -> (SocketAddr, Docs) {
    let docs = Docs::default();
    let app = Router::new()
        .route("/cards/{name}", get(card))
        .route("/flaky.json", get(flaky))
        .route("/missing.json", get(missing))
        .with_state(docs.clone());
    (common::serve_http(app).await, docs)
}

const PORTS: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
";

async fn start(text: &str) -> Server {
    let config = Config::parse(text).expect("the test configuration is valid");
    Server::start(&config).await.expect("the server starts")
}

/// Waits until `/metrics` satisfies `done`, or fails after 20 s with what it saw.
async fn wait_for(bound: &Bound, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = scrape(bound).await;
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn loads(m: &str, interface: &str, outcome: &str) -> f64 {
    value(
        m,
        "refusal_gate_discovery_document_loads_total",
        &[("interface", interface), ("outcome", outcome)],
    )
}

/// (method, URL, status) attempts of one client, 100 ms apart.
fn request(client: &str, calls: &[(&str, String, i64)]) -> Vec<u8> {
    let spans = calls
        .iter()
        .enumerate()
        .map(|(i, (method, url, status))| http_span(i as u64, method, url, *status))
        .collect();
    export(client, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_document_kind_decides_which_404s_are_refusals() {
    let (docs_addr, _) = serve_docs().await;
    let dir = fixtures();
    let config = format!(
        "{PORTS}
interfaces:
  - name: travel
    protocol: a2a
    discovery:
      document: {{ url: 'http://{docs_addr}/cards/a2a-v0.3.json' }}
  - name: stock
    protocol: a2a
    discovery:
      document: {{ file: '{dir}/a2a-v1.0.json' }}
  - name: pets
    protocol: http
    discovery:
      document: {{ url: 'http://{docs_addr}/cards/openapi-3.0.json' }}
  - name: weather
    protocol: http
    url: http://weather.fixture.test:8080
    discovery:
      document: {{ file: '{dir}/openapi-3.1.yaml' }}
interfaces_from: ['{dir}/mcp-*.json']
"
    );
    let server = start(&config).await;
    wait_for(&server.bound, "both URL documents", |m| {
        loads(m, "travel", "loaded") >= 1.0 && loads(m, "pets", "loaded") >= 1.0
    })
    .await;

    // (interface, client, discovery read, undeclared 404, declared (template) 404)
    let cases = [
        (
            "travel",
            "http://agent.fixture.test",
            "GET /.well-known/agent-card.json",
            "POST /a2a/v2",
            "GET /a2a/rest/v1/tasks/t-1",
        ),
        (
            "stock",
            "http://stock.fixture.test",
            "GET /.well-known/agent-card.json",
            "POST /a2a/v2/message:send",
            "POST /a2a/tasks/t-9:cancel",
        ),
        (
            "pets",
            "http://pets.fixture.test",
            "GET /openapi.json",
            "GET /api/v2/owners",
            "GET /api/v2/pets/rex",
        ),
        (
            "weather",
            "http://weather.fixture.test:8080",
            "GET /openapi.yaml",
            "GET /weather/radar",
            "GET /weather/forecast/paris",
        ),
        (
            "Notes",
            "http://notes.fixture.test",
            "GET /.well-known/mcp/server-card.json",
            "POST /mcp/v2",
            "POST /mcp",
        ),
    ];
    for (interface, origin, read, undeclared, declared) in cases {
        fn call<'a>(origin: &str, line: &'a str, status: i64) -> (&'a str, String, i64) {
            let (method, path) = line.split_once(' ').expect("METHOD path");
            (method, format!("{origin}{path}"), status)
        }
        let client = format!("docs-{interface}");
        let calls = [
            call(origin, read, 200),
            call(origin, undeclared, 404),
            call(origin, declared, 404),
        ];
        send(&server.bound, request(&client, &calls)).await;
        let m = scrape(&server.bound).await;
        let count = |kind: &str| {
            value(
                &m,
                "refusal_gate_attempts_total",
                &[
                    ("client", client.as_str()),
                    ("interface", interface),
                    ("kind", kind),
                ],
            )
        };
        assert_eq!(
            count("interface_not_declared"),
            1.0,
            "{interface}: {undeclared}\n{m}"
        );
        assert_eq!(count("ambiguous"), 1.0, "{interface}: {declared}");
        assert_eq!(count("ok"), 1.0, "{interface}: {read}");
        assert_eq!(
            value(
                &m,
                "refusal_gate_discovery_reads_total",
                &[("client", client.as_str())]
            ),
            1.0,
            "{interface}"
        );
    }
    let m = scrape(&server.bound).await;
    for interface in ["stock", "weather", "Notes"] {
        assert_eq!(
            loads(&m, interface, "loaded"),
            1.0,
            "{interface} loaded once from its file"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_documents_are_retried_by_the_products_own_rule() {
    let (docs_addr, docs) = serve_docs().await;
    let config = format!(
        "{PORTS}
interfaces:
  - name: flaky
    protocol: mcp
    discovery:
      document: {{ url: 'http://{docs_addr}/flaky.json' }}
  - name: gone
    protocol: mcp
    url: http://gone.fixture.test/mcp
    discovery:
      document: {{ url: 'http://{docs_addr}/missing.json' }}
  - name: cached
    protocol: http
    discovery:
      document: {{ url: 'http://{docs_addr}/cards/openapi-3.0.json', refresh: 300ms }}
"
    );
    let server = start(&config).await;
    let m = wait_for(
        &server.bound,
        "the flaky document and a revalidation",
        |m| loads(m, "flaky", "loaded") >= 1.0 && loads(m, "cached", "not_modified") >= 1.0,
    )
    .await;
    // 503, 503, then 200: retried with backoff and loaded.
    assert_eq!(loads(&m, "flaky", "failed"), 2.0);
    assert_eq!(docs.hits("/flaky.json"), 3);
    // Its declared endpoint is in force: a 404 on another path is a refusal.
    let origin = "http://flaky.fixture.test";
    send(
        &server.bound,
        request(
            "flaky-client",
            &[
                ("GET", format!("{origin}/.well-known/mcp.json"), 200),
                ("POST", format!("{origin}/mcp/sse"), 404),
            ],
        ),
    )
    .await;
    // 404: a configuration error, fetched once and reported, never retried.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[
                ("client", "flaky-client"),
                ("kind", "interface_not_declared")
            ]
        ),
        1.0
    );
    assert_eq!(
        docs.hits("/missing.json"),
        1,
        "a refused document is not fetched again"
    );
    assert_eq!(loads(&m, "gone", "refused"), 1.0);
    assert_eq!(loads(&m, "gone", "failed"), 0.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_picks_up_a_changed_document_and_keeps_the_tracker() {
    let dir = std::env::temp_dir().join(format!("refusal-gate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let doc = dir.join("shop.json");
    let openapi = |paths: &[&str]| {
        let paths: Vec<String> = paths
            .iter()
            .map(|p| format!("\"{p}\": {{\"post\": {{\"responses\": {{}}}}}}"))
            .collect();
        format!(
            "{{\"openapi\": \"3.1.0\", \"info\": {{\"title\": \"Shop\"}}, \"servers\": [{{\"url\": \"http://shop.fixture.test\"}}], \"paths\": {{{}}}}}",
            paths.join(",")
        )
    };
    std::fs::write(&doc, openapi(&["/items"])).expect("writing the document");
    let text = format!(
        "{PORTS}
interfaces:
  - name: shop
    protocol: http
    discovery:
      document: {{ file: shop.json }}
"
    );
    let path = dir.join("refusal-gate.yaml");
    std::fs::write(&path, &text).expect("writing the configuration");
    let config = Config::load(&path).expect("valid");
    let server = Server::start(&config).await.expect("the server starts");
    let shop = |i: u64, method: &str, path: &str, status: i64| {
        http_span(
            i,
            method,
            &format!("http://shop.fixture.test{path}"),
            status,
        )
    };
    let body = |spans: Vec<Span>| export("reloader", spans);
    // Before: /orders is undeclared, so its 404 is a refusal.
    send(
        &server.bound,
        body(vec![
            shop(0, "GET", "/openapi.json", 200),
            shop(1, "POST", "/orders", 404),
        ]),
    )
    .await;
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "reloader"), ("kind", "interface_not_declared")]
        ),
        1.0
    );

    std::fs::write(&doc, openapi(&["/items", "/orders"])).expect("rewriting the document");
    server.reload(&Config::load(&path).expect("still valid"));

    // After: /orders is declared, so the retry's 404 is ambiguous, and it is still a retry
    // after the refusal the tracker remembers.
    send(&server.bound, body(vec![shop(2, "POST", "/orders", 404)])).await;
    let m = scrape(&server.bound).await;
    let c = ("client", "reloader");
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[c, ("interface", "shop"), ("kind", "ambiguous")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_violations_total",
            &[c, ("violation", "retry_after_refusal")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(loads(&m, "shop", "loaded"), 2.0);
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
