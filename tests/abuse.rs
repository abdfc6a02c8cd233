//! Hostile and unlucky clients against the release-shaped binary on its defaults (issue 18),
//! each bounded in time: a body that amplifies when parsed, stalled and idle connections,
//! too many series, oversized forwarding, slow shutdowns, bad documents, too many watchers.
//! Each asserts the behaviour and the counter that says it happened.

mod common;

use common::{admin_metrics as metrics, binary_config, spawn_binary, value};
use std::io::Write;
use std::time::Duration;

/// The peak resident memory of process `pid` so far, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("procfs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kib * 1024
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("refusal-gate-abuse-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_that_amplifies_when_parsed_stays_bounded() {
    let dir = temp_dir("json");
    let (config, ports) = binary_config(&dir, "json", "");
    let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let pid = server.0.id();
    let before = peak_rss(pid);

    // 19 MiB of tiny objects in a field nobody reads, then a shape error: under the body
    // limit (20 MiB inflated), 29 KB on the wire.
    let mut json = b"{\"x\":[".to_vec();
    while json.len() < 19 << 20 {
        json.extend_from_slice(b"{\"\":0},");
    }
    json.extend_from_slice(b"{\"\":0}],\"resourceSpans\":5}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&json).expect("compressed");
    let body = gz.finish().expect("compressed");
    assert!(body.len() < 100_000, "{} bytes on the wire", body.len());

    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/v1/traces", ports.http);
    let send = |body: Vec<u8>| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body)
            .send()
    };
    // One: a malformed request, and memory bounded by the body it inflates to.
    let answer = send(body.clone()).await.expect("answered");
    assert_eq!(answer.status(), 400);
    let peak = peak_rss(pid);
    assert!(
        peak < 100 << 20,
        "peak RSS {} MiB (before: {} MiB)",
        peak >> 20,
        before >> 20
    );
    // Four at once: each inflated body is held while it is decoded (the body limit bounds
    // that), decoding runs off the async workers, and /healthz stays prompt meanwhile.
    let sends = (0..4).map(|_| {
        client
            .post(&url)
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .body(body.clone())
            .send()
    });
    let healthz = async {
        let started = std::time::Instant::now();
        let r = reqwest::get(format!("http://127.0.0.1:{}/healthz", ports.admin))
            .await
            .expect("answers");
        (r.status(), started.elapsed())
    };
    let (answers, (health, took)) = tokio::join!(futures_all(sends), healthz);
    for answer in answers {
        assert_eq!(answer.expect("answered").status(), 400);
    }
    // Answered while the four are decoded; how long it took is reported, not asserted.
    assert_eq!(health, 200);
    // Each inflated body (19 MiB) is held while it is decoded, no more: 3.2 GB before.
    let peak_four = peak_rss(pid);
    assert!(peak_four < 256 << 20, "peak RSS {} MiB", peak_four >> 20);
    eprintln!(
        "amplification: peak RSS {} MiB after one body, {} MiB after four at once; /healthz meanwhile in {took:?}",
        peak >> 20,
        peak_four >> 20
    );
    let m = metrics(ports.admin).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", "http"), ("reason", "malformed")]
        ),
        5.0
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Awaits every future at once.
async fn futures_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("joined"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_receiver_answers_415_to_what_is_not_grpc() {
    let dir = temp_dir("grpc-type");
    let (config, ports) = binary_config(&dir, "grpc-type", "");
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("a client");
    let url = format!(
        "http://127.0.0.1:{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        ports.grpc
    );
    for content_type in ["text/plain", "application/json", ""] {
        let mut request = h2.post(&url).body(vec![0u8, 0, 0, 0, 0]);
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        let answer = request.send().await.expect("answered");
        assert_eq!(answer.status(), 415, "{content_type:?}");
    }
    // gRPC itself still gets through: an empty export is OK.
    let answer = h2
        .post(&url)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(vec![0u8, 0, 0, 0, 0])
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
    let m = metrics(ports.admin).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", "grpc"), ("reason", "unsupported_media_type")]
        ),
        3.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_the_export_queue_is_refused_for_good() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let dir = temp_dir("never-fits");
    // Nothing listens downstream; the queue holds 10 spans.
    let nowhere = common::free_port();
    let (config, ports) = binary_config(
        &dir,
        "never-fits",
        &format!(
            "exporters:\n  otlp: {{ endpoint: 'http://127.0.0.1:{nowhere}', queue_size: 10 }}\n"
        ),
    );
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let spans = |n: u64| {
        common::export(
            "big-agent",
            (0..n)
                .map(|i| common::http_span(i, "GET", "http://api.test/x", 200))
                .collect(),
        )
    };
    // OTLP/HTTP: 400, not a retryable 503, and the message says why.
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/traces", ports.http))
        .header("content-type", "application/json")
        .body(
            serde_json::to_vec(&ExportTraceServiceRequest::decode(&spans(11)[..]).expect("valid"))
                .expect("JSON"),
        )
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 400);
    assert!(answer.headers().get("retry-after").is_none());
    let text = answer.text().await.expect("a body");
    assert!(
        text.contains("more than the export queue ever holds (10)"),
        "{text}"
    );
    // OTLP/gRPC: INVALID_ARGUMENT, no RetryInfo.
    let mut client = TraceServiceClient::connect(format!("http://127.0.0.1:{}", ports.grpc))
        .await
        .expect("connects");
    let request = ExportTraceServiceRequest::decode(&spans(11)[..]).expect("valid");
    let status = client.export(request).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // What fits still goes in.
    let request = ExportTraceServiceRequest::decode(&spans(10)[..]).expect("valid");
    client.export(request).await.expect("accepted");
    let m = metrics(ports.admin).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("reason", "exceeds_queue")]
        ),
        2.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_watchers_are_capped_and_a_place_comes_back() {
    use refusal_gate::gate::proto::refusal_gate_client::RefusalGateClient;
    use refusal_gate::gate::proto::WatchAlertsRequest;
    let dir = temp_dir("watchers");
    let (config, ports) = binary_config(&dir, "watchers", "alerting:\n  max_watchers: 2\n");
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let sse = format!("http://127.0.0.1:{}/v1/alerts/stream", ports.admin);
    let first = reqwest::get(&sse).await.expect("answered");
    assert_eq!(first.status(), 200);
    let mut gate = RefusalGateClient::connect(format!("http://127.0.0.1:{}", ports.grpc))
        .await
        .expect("connects");
    let second = gate
        .watch_alerts(WatchAlertsRequest::default())
        .await
        .expect("a place is left");
    // Both places are taken: the next watcher is refused on either endpoint.
    let refused = reqwest::get(&sse).await.expect("answered");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let status = gate
        .watch_alerts(WatchAlertsRequest::default())
        .await
        .expect_err("no place is left");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    // A watcher that goes gives its place back.
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = reqwest::get(&sse).await.expect("answered");
        if again.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(second);
    let m = metrics(ports.admin).await;
    for endpoint in ["sse", "grpc"] {
        assert!(
            value(
                &m,
                "refusal_gate_alert_watchers_refused_total",
                &[("endpoint", endpoint)]
            ) >= 1.0,
            "{endpoint}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_cap_holds_for_a_thousand_clients_times_five_hundred_interfaces() {
    let dir = temp_dir("series");
    let (config, ports) = binary_config(&dir, "series", "");
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/v1/traces", ports.http);
    // 1,000 services, each calling 500 origins once: 500,000 pairs, each name within its cap.
    for service in 0..1000u64 {
        let spans = (0..500u64)
            .map(|origin| {
                let mut s =
                    common::http_span(origin, "GET", &format!("http://o{origin}.test/x"), 200);
                s.span_id = (service * 1000 + origin + 1).to_be_bytes().to_vec();
                s
            })
            .collect();
        let body = common::export(&format!("svc-{service}"), spans);
        let answer = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 200);
    }
    let started = std::time::Instant::now();
    let m = metrics(ports.admin).await;
    eprintln!(
        "series cap: /metrics {} bytes, scraped in {:?}",
        m.len(),
        started.elapsed()
    );
    assert!(m.len() < 2 << 20, "/metrics is {} bytes", m.len());
    let pairs: std::collections::BTreeSet<(String, String)> =
        common::series(&m, "refusal_gate_attempts_total")
            .into_iter()
            .map(|(labels, _)| (labels["client"].clone(), labels["interface"].clone()))
            .collect();
    assert!(pairs.len() <= 10_001, "{} pairs", pairs.len());
    assert!(pairs.contains(&("__overflow__".into(), "__overflow__".into())));
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &[]),
        500_000.0,
        "every attempt is still counted"
    );
    assert!(
        value(
            &m,
            "refusal_gate_label_overflow_total",
            &[("label", "series")]
        ) >= 490_000.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_documents_too_large_or_redirected_elsewhere_are_refused_and_counted() {
    use axum::response::{IntoResponse, Redirect};
    use axum::routing::get;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let card = |url: &str| {
        format!("{{\"title\": \"t\", \"remotes\": [{{\"type\": \"streamable-http\", \"url\": \"{url}\"}}]}}")
    };
    // Another origin, which must never be asked.
    let elsewhere_hits = Arc::new(AtomicUsize::new(0));
    let hits = Arc::clone(&elsewhere_hits);
    let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let elsewhere_port = elsewhere.local_addr().expect("an address").port();
    let other_card = card("http://elsewhere.test/mcp");
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/card.json",
            get(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                let body = other_card.clone();
                async move { body }
            }),
        );
        axum::serve(elsewhere, app).await
    });
    let home = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let home_port = home.local_addr().expect("an address").port();
    let own_card = card("http://home.test/mcp");
    tokio::spawn(async move {
        let big = vec![b' '; 5 << 20];
        let app = axum::Router::new()
            .route(
                "/big.json",
                get(move || async move { big.clone().into_response() }),
            )
            .route(
                "/moved.json",
                get(move || async move {
                    Redirect::temporary(&format!("http://localhost:{elsewhere_port}/card.json"))
                }),
            )
            .route(
                "/same.json",
                get(|| async { Redirect::temporary("/card.json") }),
            )
            .route("/card.json", get(move || async move { own_card.clone() }));
        axum::serve(home, app).await
    });
    let dir = temp_dir("documents");
    let interface = |name: &str, path: &str| {
        format!(
            "  - name: {name}\n    protocol: mcp\n    discovery:\n      document: {{ url: 'http://127.0.0.1:{home_port}{path}' }}\n"
        )
    };
    let (config, ports) = binary_config(
        &dir,
        "documents",
        &format!(
            "interfaces:\n{}{}{}",
            interface("big", "/big.json"),
            interface("moved", "/moved.json"),
            interface("same", "/same.json")
        ),
    );
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let loads = |m: &str, interface: &str, outcome: &str| {
        value(
            m,
            "refusal_gate_discovery_document_loads_total",
            &[("interface", interface), ("outcome", outcome)],
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(ports.admin).await;
        let seen = (
            loads(&m, "big", "too_large"),
            loads(&m, "moved", "redirect_refused"),
            loads(&m, "same", "loaded"),
        );
        if seen == (1.0, 1.0, 1.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "loads: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        elsewhere_hits.load(Ordering::SeqCst),
        0,
        "the other origin was never asked"
    );
    // A refused document is a configuration error, not a failure of the process: its watcher
    // waits for a reload, and the server stays ready.
    let ready = reqwest::get(format!("http://127.0.0.1:{}/readyz", ports.admin))
        .await
        .expect("answers");
    assert_eq!(ready.status(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn validate_refuses_what_is_not_a_regular_file_and_does_not_hang() {
    let dir = temp_dir("fifo");
    let card = "{\"title\": \"Ok\", \"remotes\": [{\"type\": \"streamable-http\", \"url\": \"http://ok.test/mcp\"}]}";
    std::fs::write(dir.join("ok.json"), card).expect("a card");
    let fifo = dir.join("pipe.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    std::fs::write(dir.join("cards.yaml"), "interfaces_from: ['*.json']\n").expect("a config");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
        .args(["validate", "--config"])
        .arg(dir.join("cards.yaml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("validate hung on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "a FIFO is refused");
    assert!(stderr.contains("pipe.json: not a regular file"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_half_a_million_keys_stops_within_the_deadline_and_the_state_loads() {
    let dir = temp_dir("shutdown");
    let extra = state_file(&dir.join("state"));
    let (config, ports) = binary_config(&dir, "shutdown", &extra);
    let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    // 1,000 clients, 500 operations each: half a million keys (max_keys' default).
    export_keys(ports.http, 0..1000).await;
    let keys = tracker_keys(ports.admin).await;
    assert!(keys > 450_000.0, "{keys} keys");
    let started = std::time::Instant::now();
    terminate(server).await;
    let took = started.elapsed();
    // service.shutdown_timeout is 20 s by default: inside Kubernetes' 30 s grace period.
    assert!(took < Duration::from_secs(25), "stopping took {took:?}");
    eprintln!("stopped with {keys} keys in {took:?}");
    // The file loads: a new process starts with every key.
    let _again = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let restored = tracker_keys(ports.admin).await;
    assert_eq!(restored, keys);
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_write_past_the_deadline_is_abandoned_and_the_previous_file_stays() {
    let dir = temp_dir("abandon");
    let tracker = state_file(&dir.join("state"));
    // The keys of `services`, then SIGTERM; how many keys the process held.
    let run = |extra: String, services: std::ops::Range<u64>| {
        let dir = dir.clone();
        async move {
            let (config, ports) = binary_config(&dir, "abandon", &extra);
            let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
            export_keys(ports.http, services).await;
            let keys = tracker_keys(ports.admin).await;
            terminate(server).await;
            keys
        }
    };
    // A first run stops in its own time: its 500 keys are written.
    let first = run(tracker.clone(), 0..1).await;
    assert_eq!(first, 500.0);
    // A second run adds 50,000 keys and has 1 ms to stop: writing them takes longer, even in
    // a release build (with 100 ms, a release build's write finished in time), so the write
    // is abandoned where it stands, and the process does not wait for it (if it did, the
    // write would end and its file replace the first).
    let second = run(
        format!("{tracker}service:\n  shutdown_timeout: 1ms\n"),
        1..101,
    )
    .await;
    assert_eq!(second, 50_500.0);
    // Its temporary file stays (unless the write had not yet begun it).
    assert!(temporaries(&dir).len() <= 1);
    // The next start reads the first run's file, whole, and clears any leftover.
    let (config, ports) = binary_config(&dir, "abandon", &tracker);
    let _again = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let restored = tracker_keys(ports.admin).await;
    assert_eq!(restored, first);
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tracker's configuration with its state written to `path` at shutdown only.
fn state_file(path: &std::path::Path) -> String {
    format!(
        "tracker:\n  state_file: '{}'\n  state_interval: 0s\n",
        path.display()
    )
}

/// The keys the server on `admin` holds (`refusal_gate_tracker_keys`).
async fn tracker_keys(admin: u16) -> f64 {
    value(&metrics(admin).await, "refusal_gate_tracker_keys", &[])
}

/// Exports, over OTLP/HTTP to `port`, 500 operations from each client of `services`
/// (`svc-N`): 500 keys a client.
async fn export_keys(port: u16, services: std::ops::Range<u64>) {
    let client = reqwest::Client::new();
    for service in services {
        let spans = (0..500u64)
            .map(|op| {
                let mut s =
                    common::http_span(op, "POST", &format!("http://api.test/items/{op}"), 200);
                s.span_id = (service * 1000 + op + 1).to_be_bytes().to_vec();
                s
            })
            .collect();
        let answer = client
            .post(format!("http://127.0.0.1:{port}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(common::export(&format!("svc-{service}"), spans))
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 200);
    }
}

/// The names of the temporary files in `dir` (of state writes that did not finish).
fn temporaries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("readable")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect()
}

/// Sends the server SIGTERM and waits for it to exit 0.
async fn terminate(mut server: common::Reaper) {
    common::sigterm(&server.0);
    let status = tokio::task::spawn_blocking(move || {
        let status = server.0.wait().expect("waitable");
        drop(server);
        status
    })
    .await
    .expect("joined");
    assert!(status.success(), "{status}");
}

/// `n` client spans of about 1 KB each, numbered from `first`.
fn kilobyte_spans(first: u64, n: u64) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    (first..first + n)
        .map(|i| {
            let mut s = common::http_span(i, "GET", "http://api.test/x", 200);
            s.span_id = (i + 1).to_be_bytes().to_vec();
            s.attributes
                .push(common::kv("payload", Value::StringValue("x".repeat(900))));
            s
        })
        .collect()
}

async fn post_protobuf(port: u16, body: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .expect("answered")
}

/// Waits until `admin`'s `name{labels}` reaches `want`.
async fn wait_for(admin: u16, name: &str, labels: &[(&str, &str)], want: f64) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = metrics(admin).await;
        let got = value(&m, name, labels);
        if got >= want {
            return m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name}{labels:?} = {got}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_default_gates_forwards_every_span_and_splits_what_is_too_large() {
    let dir = temp_dir("chain");
    // The last hop, on its defaults: it takes at most 4 MiB a gRPC message.
    let (last_config, last) = binary_config(&dir, "last", "");
    let _last = spawn_binary(&last_config, last.admin, std::process::Stdio::null()).await;
    let (first_config, first) = binary_config(
        &dir,
        "first",
        &format!(
            "exporters:\n  otlp: {{ endpoint: 'http://127.0.0.1:{}' }}\n",
            last.grpc
        ),
    );
    let _first = spawn_binary(&first_config, first.admin, std::process::Stdio::null()).await;
    // 8,000 spans of about 1 KB: 8 MB, in requests of 1,000.
    for n in 0..8u64 {
        let body = common::export("chained-agent", kilobyte_spans(n * 1000, 1000));
        assert_eq!(post_protobuf(first.http, body).await.status(), 200);
    }
    let m = wait_for(
        last.admin,
        "refusal_gate_receiver_accepted_spans_total",
        &[("transport", "grpc")],
        8000.0,
    )
    .await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("reason", "too_large")]
        ),
        0.0,
        "batches fit the next hop"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A next hop that takes less than a batch (1 MiB): batches too large are split, and a
    // span too large alone is dropped and counted.
    let dir = temp_dir("split");
    let (small_config, small) = binary_config(&dir, "small", "");
    let text = std::fs::read_to_string(&small_config)
        .expect("readable")
        .replace("grpc: {", "grpc: { max_recv_msg_size_mib: 1,");
    std::fs::write(&small_config, text).expect("written");
    let _small = spawn_binary(&small_config, small.admin, std::process::Stdio::null()).await;
    let (into_config, into) = binary_config(
        &dir,
        "into",
        &format!(
            "exporters:\n  otlp: {{ endpoint: 'http://127.0.0.1:{}' }}\n",
            small.grpc
        ),
    );
    let _into = spawn_binary(&into_config, into.admin, std::process::Stdio::null()).await;
    let body = common::export("split-agent", kilobyte_spans(0, 2500));
    assert_eq!(post_protobuf(into.http, body).await.status(), 200);
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let mut huge = common::http_span(9999, "GET", "http://api.test/x", 200);
    huge.attributes.push(common::kv(
        "payload",
        Value::StringValue("x".repeat(2 << 20)),
    ));
    assert_eq!(
        post_protobuf(into.http, common::export("split-agent", vec![huge]))
            .await
            .status(),
        200
    );
    wait_for(
        small.admin,
        "refusal_gate_receiver_accepted_spans_total",
        &[("transport", "grpc")],
        2500.0,
    )
    .await;
    let m = wait_for(
        into.admin,
        "refusal_gate_exporter_failed_spans_total",
        &[("reason", "too_large")],
        1.0,
    )
    .await;
    assert_eq!(
        value(&m, "refusal_gate_exporter_sent_spans_total", &[]),
        2500.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_large_spans_stays_within_the_byte_bound() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let dir = temp_dir("backlog");
    // Nothing listens downstream: the queue only fills.
    let nowhere = common::free_port();
    let (config, ports) = binary_config(
        &dir,
        "backlog",
        &format!(
            "exporters:\n  otlp: {{ endpoint: 'http://127.0.0.1:{nowhere}', queue_size_mib: 64 }}\n"
        ),
    );
    let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let mut statuses = Vec::new();
    for i in 0..8u64 {
        let mut span = common::http_span(i, "GET", "http://api.test/x", 200);
        span.attributes.push(common::kv(
            "payload",
            Value::StringValue("x".repeat(15 << 20)),
        ));
        statuses.push(
            post_protobuf(ports.http, common::export("heavy-agent", vec![span]))
                .await
                .status()
                .as_u16(),
        );
    }
    // Four fit in 64 MiB; the rest are told to come back later.
    assert_eq!(statuses, [200, 200, 200, 200, 503, 503, 503, 503]);
    let m = metrics(ports.admin).await;
    let queued = value(&m, "refusal_gate_exporter_queue_bytes", &[]);
    assert!(queued <= f64::from(64u32 << 20), "{queued} bytes queued");
    assert!(queued >= f64::from(60u32 << 20), "{queued} bytes queued");
    let peak = peak_rss(server.0.id());
    eprintln!(
        "backlog: {} MiB queued, peak RSS {} MiB",
        queued as u64 >> 20,
        peak >> 20
    );
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `dir/name.yaml` with free ports and each listener's extra settings (flow-style
/// YAML, e.g. `read_timeout: 2s`).
fn listeners_config(
    dir: &std::path::Path,
    name: &str,
    [grpc, http, admin]: [&str; 3],
) -> (std::path::PathBuf, common::Ports) {
    let ports = common::Ports {
        grpc: common::free_port(),
        http: common::free_port(),
        admin: common::free_port(),
    };
    let path = dir.join(format!("{name}.yaml"));
    let text = format!(
        "receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:{}, {grpc} }}
    http: {{ endpoint: 127.0.0.1:{}, {http} }}
admin: {{ endpoint: 127.0.0.1:{}, {admin} }}
",
        ports.grpc, ports.http, ports.admin
    );
    std::fs::write(&path, text).expect("the configuration is written");
    (path, ports)
}

/// Starts the binary under `sh -c 'ulimit …'` (the descriptor limits a shell or a unit
/// gives it), its stderr to `log`, and returns once `/healthz` answers.
async fn spawn_with_ulimit(
    config: &std::path::Path,
    admin: u16,
    ulimit: &str,
    log: &std::path::Path,
) -> common::Reaper {
    let reaper = common::Reaper(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit {ulimit} && exec \"$0\" serve --config \"$1\""
            ))
            .arg(env!("CARGO_BIN_EXE_refusal-gate"))
            .arg(config)
            .stderr(std::fs::File::create(log).expect("a log file"))
            .spawn()
            .expect("the binary starts"),
    );
    for _ in 0..100 {
        if healthz(admin).await {
            return reaper;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the binary did not come up on {config:?}");
}

async fn healthz(admin: u16) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client");
    client
        .get(format!("http://127.0.0.1:{admin}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

/// The soft and hard `Max open files` of process `pid`.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("procfs");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("the open files line");
    let mut fields = line["Max open files".len()..].split_whitespace();
    let soft = fields.next().expect("soft").to_owned();
    let hard = fields.next().expect("hard").to_owned();
    (soft, hard)
}

/// Whether the peer closed `socket` (a read sees the end, or a reset); waits at most `wait`.
fn closed(socket: &mut std::net::TcpStream, wait: Duration) -> bool {
    use std::io::Read;
    socket.set_read_timeout(Some(wait)).expect("a read timeout");
    let mut byte = [0u8; 512];
    loop {
        match socket.read(&mut byte) {
            Ok(0) => return true,
            // An answer (a 408, say) before the close: read on.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Whether every socket is closed by the peer before `deadline`.
fn all_closed(sockets: &mut [std::net::TcpStream], deadline: std::time::Instant) -> bool {
    sockets.iter_mut().all(|s| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        closed(s, left.max(Duration::from_millis(1)))
    })
}

fn grpc_exporter(port: u16) -> opentelemetry_otlp::SpanExporter {
    use opentelemetry_otlp::WithExportConfig;
    opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        .build()
        .expect("the exporter builds")
}

fn http_exporter(port: u16) -> opentelemetry_otlp::SpanExporter {
    use opentelemetry_otlp::WithExportConfig;
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("http://127.0.0.1:{port}/v1/traces"))
        .build()
        .expect("the exporter builds")
}

/// A request body that sends `first` and then nothing more, for as long as the returned
/// sender lives.
fn stalled_body(
    first: Vec<u8>,
) -> (
    reqwest::Body,
    tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.try_send(Ok(first)).expect("room for the first chunk");
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    (reqwest::Body::wrap_stream(stream), tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_hold_no_slot_and_are_answered_at_read_timeout() {
    let dir = temp_dir("stall");
    let (config, ports) =
        listeners_config(&dir, "stall", ["read_timeout: 2s", "read_timeout: 2s", ""]);
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let http_url = format!("http://127.0.0.1:{}/v1/traces", ports.http);
    let grpc_url = format!(
        "http://127.0.0.1:{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        ports.grpc
    );
    let probe = || async {
        reqwest::Client::new()
            .post(&http_url)
            .header("content-type", "application/x-protobuf")
            .body(Vec::new())
            .send()
            .await
            .expect("answered")
            .status()
    };

    // OTLP/HTTP: 64 connections (as many as the concurrency slots) that send their headers
    // and one byte of a body, then stall. Written on plain sockets, so that all 64 are in
    // within moments of each other however busy the machine.
    let started = std::time::Instant::now();
    let stalled: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", ports.http)).expect("connects");
            s.write_all(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n\x0a",
            )
            .expect("sent");
            s
        })
        .collect();
    let mut senders = Vec::new();
    // They hold no slot: a request and a real SDK exporter get through while they stall.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(probe().await, 200);
    assert!(sdk_export_counted(http_exporter(ports.http), ports.admin, "http").await);
    let got_through = started.elapsed();
    eprintln!("stalled: the HTTP SDK exporter got through {got_through:?} after 64 stalled bodies");
    assert!(
        !stalled_answered(&stalled),
        "…before the stalled bodies' read_timeout"
    );
    // At read_timeout each is answered 408.
    for mut socket in stalled {
        use std::io::Read;
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a timeout");
        let mut answer = [0u8; 12];
        socket.read_exact(&mut answer).expect("an answer");
        assert_eq!(&answer, b"HTTP/1.1 408");
    }

    // OTLP/gRPC: 64 streams on one HTTP/2 connection, each with the first byte of a
    // message's 5-byte frame header, then nothing.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("a client");
    let mut streams = Vec::new();
    for _ in 0..64 {
        let (body, tx) = stalled_body(vec![0]);
        senders.push(tx);
        let request = h2
            .post(&grpc_url)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(body)
            .send();
        streams.push(tokio::spawn(request));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sdk_export_counted(grpc_exporter(ports.grpc), ports.admin, "grpc").await);
    assert!(
        streams.iter().all(|s| !s.is_finished()),
        "the SDK exporter got through before the stalled streams' read_timeout"
    );
    for answer in streams {
        let answer = answer.await.expect("joined").expect("answered");
        let status = answer
            .headers()
            .get("grpc-status")
            .map(|v| v.as_bytes().to_vec());
        assert_eq!(status.as_deref(), Some(&b"4"[..]), "DEADLINE_EXCEEDED");
    }
    drop(senders);

    let m = metrics(ports.admin).await;
    for transport in ["http", "grpc"] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_receiver_refused_requests_total",
                &[("transport", transport), ("reason", "read_timeout")]
            ),
            64.0,
            "{transport}"
        );
        assert_eq!(
            value(
                &m,
                "refusal_gate_listener_limits_total",
                &[("listener", transport), ("limit", "read_timeout")]
            ),
            64.0,
            "{transport}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether any of `sockets` has been answered (or closed) yet, without waiting.
fn stalled_answered(sockets: &[std::net::TcpStream]) -> bool {
    sockets.iter().any(|s| {
        s.set_nonblocking(true).expect("non-blocking");
        let mut byte = [0u8; 1];
        let answered =
            !matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).expect("blocking");
        answered
    })
}

/// Exports one span with `exporter` (the SDK's own, default retries and timeout); whether
/// the receiver on `transport` counted it accepted.
async fn sdk_export_counted(
    exporter: opentelemetry_otlp::SpanExporter,
    admin: u16,
    transport: &str,
) -> bool {
    let accepted = |m: &str| {
        value(
            m,
            "refusal_gate_receiver_accepted_spans_total",
            &[("transport", transport)],
        )
    };
    let before = accepted(&metrics(admin).await);
    common::sdk_export(exporter, transport).await;
    accepted(&metrics(admin).await) == before + 1.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_after_their_timeouts() {
    let dir = temp_dir("idle");
    let (config, ports) = listeners_config(
        &dir,
        "idle",
        [
            "max_connections: 50, idle_timeout: 2s",
            "max_connections: 50, read_header_timeout: 1s, idle_timeout: 4s",
            "",
        ],
    );
    let log = dir.join("idle.log");
    // A soft limit of 256 under a higher hard one: raised to the hard one at start.
    let server = spawn_with_ulimit(&config, ports.admin, "-S -n 256", &log).await;
    let (soft, hard) = open_files_limits(server.0.id());
    assert_eq!(
        soft, hard,
        "the soft open files limit is raised to the hard one"
    );

    // An HTTP/1 connection kept alive after a request: timed by idle_timeout (4 s), not by
    // read_header_timeout (1 s).
    let mut kept = std::net::TcpStream::connect(("127.0.0.1", ports.http)).expect("connects");
    kept.write_all(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
    )
    .expect("sent");
    // 60 sockets on each receiver that never send a byte: 50 held, 10 closed at once.
    let connect = |port| {
        (0..60)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects"))
            .collect::<Vec<_>>()
    };
    let opened = std::time::Instant::now();
    let mut http_idle = connect(ports.http);
    let mut grpc_idle = connect(ports.grpc);
    {
        use std::io::Read;
        let mut answer = [0u8; 12];
        kept.read_exact(&mut answer).expect("an answer");
        assert_eq!(&answer, b"HTTP/1.1 200");
    }
    let answered = std::time::Instant::now();
    // The admin endpoint answers throughout.
    assert!(healthz(ports.admin).await);
    for listener in ["http", "grpc"] {
        // The kept-alive one holds one of HTTP's 50 places. The sockets are accepted as the
        // server gets to them: waited for, not assumed done.
        let want = if listener == "http" { 11.0 } else { 10.0 };
        let labels = [("listener", listener), ("limit", "max_connections")];
        let m = wait_for(
            ports.admin,
            "refusal_gate_listener_limits_total",
            &labels,
            want,
        )
        .await;
        assert_eq!(
            value(&m, "refusal_gate_listener_limits_total", &labels),
            want,
            "{listener}"
        );
        assert!(
            value(
                &m,
                "refusal_gate_listener_connections",
                &[("listener", listener)]
            ) <= 50.0
        );
    }
    // Still open past read_header_timeout.
    tokio::time::sleep(Duration::from_millis(1500).saturating_sub(answered.elapsed())).await;
    assert!(
        !closed(&mut kept, Duration::from_millis(1)),
        "kept alive past 1 s"
    );
    let deadline = opened + Duration::from_secs(10);
    assert!(
        all_closed(&mut http_idle, deadline),
        "silent HTTP sockets closed"
    );
    assert!(
        all_closed(&mut grpc_idle, deadline),
        "idle gRPC sockets closed"
    );
    assert!(
        closed(&mut kept, Duration::from_secs(10)),
        "kept-alive socket closed"
    );
    assert!(healthz(ports.admin).await);

    let m = metrics(ports.admin).await;
    let limit = |listener, limit| {
        value(
            &m,
            "refusal_gate_listener_limits_total",
            &[("listener", listener), ("limit", limit)],
        )
    };
    assert_eq!(limit("http", "read_header_timeout"), 49.0);
    assert_eq!(limit("http", "idle_timeout"), 1.0);
    assert_eq!(limit("grpc", "idle_timeout"), 50.0);
    // And the places they held serve real exporters again.
    assert!(sdk_export_counted(http_exporter(ports.http), ports.admin, "http").await);
    assert!(sdk_export_counted(grpc_exporter(ports.grpc), ports.admin, "grpc").await);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_idle_sockets_than_descriptors_leave_the_server_reachable() {
    let dir = temp_dir("fds");
    let (config, ports) = listeners_config(&dir, "fds", ["", "", ""]);
    let log = dir.join("fds.log");
    // The common limit of 1,024 descriptors, hard: the default caps are fitted under it.
    let server = spawn_with_ulimit(&config, ports.admin, "-n 1024", &log).await;
    assert_eq!(open_files_limits(server.0.id()).0, "1024");
    let logged = std::fs::read_to_string(&log).expect("the log");
    assert!(logged.contains("lowered"), "{logged}");

    // 1,100 idle sockets on OTLP/HTTP: more than the descriptors the process has.
    let idle: Vec<_> = (0..1100)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", ports.http)).expect("connects"))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    for _ in 0..5 {
        assert!(healthz(ports.admin).await, "/healthz answers");
    }
    eprintln!(
        "descriptors: /healthz answered five times in {:?} with 1,100 idle sockets open",
        started.elapsed()
    );
    let m = metrics(ports.admin).await;
    let held = value(
        &m,
        "refusal_gate_listener_connections",
        &[("listener", "http")],
    );
    // (4096, 4096, 1024) scaled under 1,024 - 256: 341 for OTLP/HTTP.
    assert_eq!(held, 341.0);
    assert_eq!(
        value(
            &m,
            "refusal_gate_listener_limits_total",
            &[("listener", "http"), ("limit", "max_connections")]
        ),
        1100.0 - 341.0
    );
    // The other receiver still takes exports.
    assert!(sdk_export_counted(grpc_exporter(ports.grpc), ports.admin, "grpc").await);
    drop(idle);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `span` moved to the present (its offset from the fixtures' start kept): the tracker keeps
/// a key `key_ttl` after its last attempt.
fn now(
    mut span: opentelemetry_proto::tonic::trace::v1::Span,
) -> opentelemetry_proto::tonic::trace::v1::Span {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    span.start_time_unix_nano = span.start_time_unix_nano - common::T0 + now;
    span.end_time_unix_nano = span.end_time_unix_nano - common::T0 + now;
    span
}

/// The body of `GET http://127.0.0.1:{admin}{path}`.
async fn admin_get(admin: u16, path: &str) -> String {
    let answer = reqwest::get(format!("http://127.0.0.1:{admin}{path}"))
        .await
        .expect("the admin port answers");
    assert_eq!(answer.status(), 200, "{path}");
    answer.text().await.expect("a body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_of_a_hundred_kilobytes_are_cut_and_every_page_stays_small() {
    const NAME_BYTES: usize = 100 << 10;
    let dir = temp_dir("long-names");
    let (config, ports) = binary_config(&dir, "names", "");
    let log = dir.join("stderr.log");
    let stderr = std::fs::File::create(&log).expect("a log file");
    let server = spawn_binary(&config, ports.admin, stderr.into()).await;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/v1/traces", ports.http);
    // 10 names of 100 KiB, alike but for their last byte, each answered 405 twice by 100
    // origins: 1,000 series, 1,000 retries without discovery and their alerts, all naming them.
    let names: Vec<String> = (0..10)
        .map(|n| format!("{}{n}", "a".repeat(NAME_BYTES - 1)))
        .collect();
    for name in &names {
        let spans = (0..100u64)
            .flat_map(|origin| {
                let url = format!("http://o{origin}.test/x");
                [2 * origin, 2 * origin + 1].map(|i| now(common::http_span(i, "GET", &url, 405)))
            })
            .collect();
        let answer = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(common::export(name, spans))
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 200);
    }
    let m = wait_for(ports.admin, "refusal_gate_violations_total", &[], 1000.0).await;
    let status = admin_get(ports.admin, "/api/v1/status?limit=500").await;
    let alerts = admin_get(ports.admin, "/api/v1/alerts").await;
    let rss = peak_rss(server.0.id());
    let logged = std::fs::metadata(&log).expect("the log").len();
    eprintln!(
        "10 names of 100 KiB × 100 origins: /metrics {} bytes, /api/v1/status {} bytes, \
         /api/v1/alerts {} bytes, log {logged} bytes, peak RSS {} MiB",
        m.len(),
        status.len(),
        alerts.len(),
        rss >> 20
    );
    for (what, len) in [
        ("/metrics", m.len()),
        ("/api/v1/status", status.len()),
        ("/api/v1/alerts", alerts.len()),
        ("the log", logged as usize),
    ] {
        assert!(len <= 16 << 20, "{what} is {len} bytes");
    }
    assert!(rss <= 300 << 20, "peak RSS {} MiB", rss >> 20);
    let clients: std::collections::BTreeSet<String> =
        common::series(&m, "refusal_gate_attempts_total")
            .into_iter()
            .map(|(labels, _)| labels["client"].clone())
            .collect();
    assert_eq!(clients.len(), 10, "all 10 clients still distinct");
    assert!(clients.iter().all(|c| c.len() <= 128), "cut to 128 bytes");
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &[]),
        2000.0,
        "every attempt is counted"
    );
    assert!(
        value(
            &m,
            "refusal_gate_label_truncated_total",
            &[("label", "client")]
        ) >= 10.0
    );
    // Each client's page is linked from the fleet page, and shows that client's story.
    if common::external("chromium") {
        let browser = dir.join("browser");
        let fleet = common::dom(&browser, &format!("http://127.0.0.1:{}/", ports.admin));
        for name in &clients {
            let href = format!("/clients/{name}");
            assert!(
                fleet.contains(&format!("href=\"{href}\"")),
                "{href} on the fleet page"
            );
            let page = common::dom(
                &browser,
                &format!(
                    "http://127.0.0.1:{}/clients/{}",
                    ports.admin,
                    common::browser::percent_encode(name)
                ),
            );
            assert!(
                page.contains(&format!("<h1 id=\"story-client\">{name}</h1>")),
                "the story of {name}"
            );
            assert!(page.contains("data-violation=\"retry_without_discovery\""));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_answers_are_not_sniffed_framed_or_echoing_and_a_huge_question_is_too_large() {
    let dir = temp_dir("headers");
    let (config, ports) = binary_config(&dir, "headers", "");
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let client = reqwest::Client::new();
    let admin = format!("http://127.0.0.1:{}", ports.admin);
    for path in [
        "/",
        "/clients/x",
        "/console.js",
        "/metrics",
        "/api/v1/status",
        "/api/v1/alerts",
        "/healthz",
        "/no/such/path",
        "/api/v1/clients/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    ] {
        let answer = client
            .get(format!("{admin}{path}"))
            .send()
            .await
            .expect("answered");
        assert_eq!(
            answer
                .headers()
                .get("x-content-type-options")
                .map(|v| v.as_bytes()),
            Some(&b"nosniff"[..]),
            "{path}"
        );
        if path == "/" || path.starts_with("/clients/") {
            assert_eq!(answer.headers()["x-frame-options"], "DENY", "{path}");
            let csp = answer.headers()["content-security-policy"]
                .to_str()
                .expect("ASCII");
            assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        }
        if path.starts_with("/api/v1/clients/") {
            assert_eq!(answer.status(), 404);
            let body = answer.text().await.expect("a body");
            assert!(!body.contains("script"), "the name is not echoed: {body}");
        }
    }
    // A Gate question of 3 MB: too large, not malformed.
    let question = serde_json::json!({ "client": "a".repeat(3 << 20) }).to_string();
    let answer = client
        .post(format!("{admin}/v1/decide"))
        .header("content-type", "application/json")
        .body(question)
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 413);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A span of trace 9 with id `id` under parent `parent`, of `kind`, with `attributes`.
fn traced(
    kind: i32,
    id: u64,
    parent: u64,
    attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
) -> opentelemetry_proto::tonic::trace::v1::Span {
    now(opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: vec![9; 16],
        span_id: id.to_be_bytes().to_vec(),
        parent_span_id: parent.to_be_bytes().to_vec(),
        name: "POST".into(),
        kind,
        start_time_unix_nano: common::T0,
        end_time_unix_nano: common::T0 + 20_000_000,
        attributes,
        ..Default::default()
    })
}

/// Posts `body` gzip-compressed to the OTLP/HTTP receiver and expects 200.
async fn post_gzip(port: u16, body: &[u8]) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body).expect("compressed");
    let answer = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", "gzip")
        .body(gz.finish().expect("compressed"))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_held_spans_of_a_mebibyte_hold_their_facts_not_their_bodies() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    const MIB: usize = 1 << 20;
    let dir = temp_dir("held");
    let (config, ports) = binary_config(
        &dir,
        "held",
        "interfaces:
  - name: weather
    protocol: http
    url: http://weather.test:8080
    endpoints: [{ path: /forecast, methods: [POST] }]
    server: { service_names: [weather-api] }
",
    );
    let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let post = |url: &str, status: i64| {
        vec![
            common::kv("http.request.method", Value::StringValue("POST".into())),
            common::kv("url.full", Value::StringValue(url.into())),
            common::kv("http.response.status_code", Value::IntValue(status)),
        ]
    };
    // Spans that wait for a parent that never comes, each of a mebibyte: the server's spans
    // of calls whose client spans are still to come, and client requests under a protocol
    // span still to come; half carry the mebibyte in an attribute, half in their path.
    let flood = |n: u64| {
        let server_side = n % 2 == 0;
        let big = "x".repeat(MIB);
        let mut attributes = if n % 4 < 2 {
            post("http://weather.test:8080/forecast", 200)
        } else {
            post(&format!("http://weather.test:8080/forecast/{big}"), 404)
        };
        if n % 4 < 2 {
            attributes.push(common::kv("payload", Value::StringValue(big)));
        }
        traced(
            if server_side { 2 } else { 3 },
            1_000 + n,
            100_000 + n,
            attributes,
        )
    };
    // Ten spans a request (two resources), 100 requests.
    let mut sent = 0;
    for request in 0..100u64 {
        let spans: Vec<_> = (request * 10..request * 10 + 10).map(flood).collect();
        let (servers, clients): (Vec<_>, Vec<_>) = spans.into_iter().partition(|s| s.kind == 2);
        sent += servers.len() + clients.len();
        let mut body = common::export("weather-api", servers);
        body.extend(common::export("flooder", clients));
        post_gzip(ports.http, &body).await;
        if request == 50 {
            // A real call in the middle of the flood, seen from both sides in two exports.
            let client_side = traced(3, 7, 0, post("http://weather.test:8080/forecast", 200));
            post_gzip(ports.http, &common::export("caller", vec![client_side])).await;
            let server_side = traced(2, 8, 7, post("http://weather.test:8080/forecast", 200));
            post_gzip(
                ports.http,
                &common::export("weather-api", vec![server_side]),
            )
            .await;
        }
    }
    let m = metrics(ports.admin).await;
    let rss = peak_rss(server.0.id());
    eprintln!(
        "{sent} held spans of 1 MiB: peak RSS {} MiB, held {} spans and {} bytes at the end, \
         {} held calls forced by max_held_mib",
        rss >> 20,
        value(&m, "refusal_gate_held_spans", &[]),
        value(&m, "refusal_gate_held_bytes", &[]),
        value(
            &m,
            "refusal_gate_held_calls_forced_total",
            &[("bound", "max_held_mib")]
        ),
    );
    assert!(rss <= 300 << 20, "peak RSS {} MiB", rss >> 20);
    assert!(value(&m, "refusal_gate_held_bytes", &[]) <= 16.0 * MIB as f64);
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &[("client", "caller")]),
        1.0,
        "the real call is counted once"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What an attacker may write into any field the report shows: each tries to end the data's
/// script element, open a comment or a script of its own, or run an event handler.
const PAYLOADS: [&str; 8] = [
    "<!--<script>",
    "</script><script>document.title='PWNED'</script>",
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">",
    "\u{2028}\u{2029}</ScRiPt >",
    "<![CDATA[ ]]> --> <!-- <script> </script>",
    "\"'><svg onload=document.body.setAttribute('data-pwned','1')>",
    "${document.title='PWNED'}",
    "&lt;&#x3c;\\u003c",
];

/// One recorded export request (OTLP/JSON, as `replay` reads them) of `service`'s spans.
fn recorded(service: &str, spans: Vec<serde_json::Value>) -> String {
    let string =
        |key: &str, value: &str| serde_json::json!({"key": key, "value": {"stringValue": value}});
    serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [string("service.name", service), string("service.instance.id", service)]},
        "scopeSpans": [{"spans": spans}],
    }]})
    .to_string()
}

/// A recorded CLIENT span `n` (of trace `trace`) carrying `payload` in every field the
/// report may show: an MCP tool call failing in words, or an HTTP request answered `status`.
fn hostile_span(trace: usize, n: u64, mcp: bool, status: u16, payload: &str) -> serde_json::Value {
    let string =
        |key: &str, value: &str| serde_json::json!({"key": key, "value": {"stringValue": value}});
    let start = 1_793_498_400_000_000_000u64 + n * 100_000_000;
    let failed = mcp || status != 200;
    let mut attributes = vec![string("http.route", payload)];
    if failed {
        attributes.push(string("error.type", payload));
    }
    if mcp {
        attributes.extend([
            string("mcp.method.name", "tools/call"),
            string("gen_ai.tool.name", payload),
            string("server.address", "mcp.test"),
        ]);
    } else {
        attributes.extend([
            string("http.request.method", "POST"),
            string("url.full", &format!("http://api.test/{payload}")),
            serde_json::json!({"key": "http.response.status_code", "value": {"intValue": status.to_string()}}),
        ]);
    }
    serde_json::json!({
        "traceId": format!("{trace:032x}"),
        "spanId": format!("{:016x}", n + 1),
        "name": payload,
        "kind": 3,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": (start + 20_000_000).to_string(),
        "attributes": attributes,
        "events": [{"name": "exception", "timeUnixNano": start.to_string(), "attributes": [
            string("exception.message", payload), string("exception.type", payload)]}],
        "status": {"code": if failed { 2 } else { 0 }, "message": payload},
    })
}

#[test]
fn no_payload_in_any_field_breaks_the_report_or_runs_in_it() {
    if !common::external("chromium") {
        return;
    }
    let dir = temp_dir("report");
    // Each payload is a client's name, and fills every field of its two calls, each retried.
    let lines: Vec<String> = PAYLOADS
        .iter()
        .enumerate()
        .map(|(k, payload)| {
            let spans = (0..4)
                .map(|n| hostile_span(k + 1, n, n < 2, 404, payload))
                .collect();
            recorded(&format!("{payload} {k}"), spans)
        })
        .collect();
    let recording = dir.join("hostile.jsonl");
    std::fs::write(&recording, lines.join("\n")).expect("written");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
        .args(["replay", "--format", "html"])
        .arg(&recording)
        .output()
        .expect("replay runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = dir.join("report.html");
    std::fs::write(&report, &out.stdout).expect("the report is written");
    let url = common::browser::file_url(&report);
    let browser = dir.join("browser");
    let fleet = common::dom(&browser, &url);
    let untouched = |page: &str, what: &str| {
        assert!(!page.contains("<title>PWNED"), "a script ran in {what}");
        assert!(
            !page.contains("data-pwned=\"1\""),
            "a handler ran in {what}"
        );
        assert!(!page.contains("Loading…"), "{what} is stuck loading");
    };
    untouched(&fleet, "the fleet");
    for (k, payload) in PAYLOADS.iter().enumerate() {
        let client = format!("{payload} {k}");
        let href = format!("#/clients/{}", encode_uri_component(&client));
        assert!(
            fleet.contains(&format!("href=\"{}\"", html_attribute(&href))),
            "the fleet links {client:?}"
        );
        // The story's own address, every special character percent-encoded for the command
        // line (a current Chromium loads nothing from a `file://` URL with a raw `'`).
        let story = common::dom(
            &browser,
            &format!(
                "{url}#/clients/{}",
                common::browser::percent_encode(&client)
            ),
        );
        untouched(&story, &client);
        assert!(
            story.contains(&format!(
                "<h1 id=\"story-client\">{}</h1>",
                html_text(&client)
            )),
            "the story of {client:?}"
        );
        assert!(story.contains("data-violation="), "its retries are told");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// JavaScript's `encodeURIComponent`.
fn encode_uri_component(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
            b'-' | b'_' | b'.' | b'!' | b'~' | b'*' | b'\'' | b'(' | b')' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Text as Chromium serialises it in an element.
fn html_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\u{a0}', "&nbsp;")
}

/// An attribute value as Chromium serialises it.
fn html_attribute(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

#[test]
fn the_report_of_sixteen_thousand_clients_tells_every_story_and_its_time_is_printed() {
    const CLIENTS: usize = 16_000;
    let dir = temp_dir("report-scale");
    // Each client makes a request twice: 16,000 stories to tell, and no alert (past
    // alerting.queue_size alerts, raising one is issue 31's, and would weigh on both).
    let lines: Vec<String> = (0..CLIENTS)
        .map(|c| {
            let spans = (0..2)
                .map(|n| hostile_span(c + 1, n, false, 200, "x"))
                .collect();
            recorded(&format!("client-{c}"), spans)
        })
        .collect();
    let recording = dir.join("fleet.jsonl");
    std::fs::write(&recording, lines.join("\n")).expect("written");
    let replay = |format: &str| {
        let started = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
            .args(["replay", "--format", format])
            .arg(&recording)
            .output()
            .expect("replay runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (started.elapsed(), out.stdout)
    };
    let (table_took, _) = replay("table");
    let (html_took, html) = replay("html");
    eprintln!(
        "replay of {CLIENTS} clients: table {table_took:?}, HTML report {html_took:?} ({:.2}× the table's), {} bytes",
        html_took.as_secs_f64() / table_took.as_secs_f64(),
        html.len()
    );
    let html = String::from_utf8(html).expect("UTF-8");
    let start = html.find("type=\"application/json\">").expect("the data") + 24;
    let end = start + html[start..].find("</script>").expect("its end");
    let data: serde_json::Value = serde_json::from_str(&html[start..end]).expect("JSON");
    let stories = data["clients"].as_object().expect("the stories");
    assert_eq!(stories.len(), CLIENTS, "every client's story");
    assert!(
        stories["client-15999"]["interfaces"][0]["operations"][0]["attempts"]
            .as_array()
            .is_some_and(|a| a.len() == 2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sizes of the hostile shapes, as issue 44 measured them.
const HOSTILE: [(&str, usize); 7] = [
    ("ring", 64_000),
    ("star", 100_000),
    ("chain", 100_000),
    ("carriers", 100_000),
    ("carriers by time", 100_000),
    ("gateway comb", 4_500),
    ("siblings, a request each", 10_000),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_call_trees_are_joined_while_readyz_keeps_answering() {
    use refusal_gate::workload::hostile;
    let dir = temp_dir("hostile");
    let (config, ports) = binary_config(&dir, "hostile", hostile::CONFIG);
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    // /readyz asked every 20 ms meanwhile, each answer's time kept.
    // The shape being sent (its place in HOSTILE; past the end: all sent).
    let phase = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let probe = {
        let phase = phase.clone();
        let url = format!("http://127.0.0.1:{}/readyz", ports.admin);
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut answers = Vec::new();
            loop {
                let during = phase.load(std::sync::atomic::Ordering::Relaxed);
                if during == HOSTILE.len() {
                    break;
                }
                let asked = std::time::Instant::now();
                let status = client.get(&url).send().await.map(|r| r.status().as_u16());
                answers.push((during, status.ok(), asked.elapsed()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answers
        })
    };
    let client = reqwest::Client::new();
    let mut sent = 0;
    for (shape, n) in HOSTILE {
        let started = std::time::Instant::now();
        for body in hostile::requests(shape, n) {
            let answer = client
                .post(format!("http://127.0.0.1:{}/v1/traces", ports.http))
                .header("content-type", "application/x-protobuf")
                .body(body)
                .send()
                .await
                .expect("the receiver answers");
            assert_eq!(answer.status(), 200, "{shape}");
        }
        sent += n;
        phase.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        eprintln!("{shape}, {n} spans: answered in {:?}", started.elapsed());
    }
    let answers = probe.await.expect("the probe ends");
    for (k, (shape, _)) in HOSTILE.iter().enumerate() {
        let during: Vec<Duration> = answers.iter().filter(|a| a.0 == k).map(|a| a.2).collect();
        eprintln!(
            "/readyz while {shape} was sent: {} answers, the slowest in {:?}",
            during.len(),
            during.iter().max()
        );
    }
    assert!(
        answers.iter().all(|(_, status, _)| *status == Some(200)),
        "/readyz answered every time: {answers:?}"
    );
    let m = metrics(ports.admin).await;
    assert_eq!(
        value(&m, "refusal_gate_receiver_accepted_spans_total", &[]),
        sent as f64
    );
    assert_eq!(
        value(&m, "refusal_gate_call_cycles_cut_total", &[]),
        1.0,
        "the ring's cut"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A loopback port that accepts connections and never says a word: a metrics receiver
/// stalled before its first byte (an HTTP answer never sent, an HTTP/2 handshake never
/// finished). Kept open while the returned listener lives.
fn silent_receiver() -> (std::net::TcpListener, u16) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("bound").port();
    let accepting = listener.try_clone().expect("cloned");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in accepting.incoming().flatten() {
            held.push(stream);
        }
    });
    (listener, port)
}

/// An answer's body that never ends: with no bytes, one that never sends a byte; with
/// some, one that sends them again and again, as fast as they are read.
struct EndlessBody(Option<bytes::Bytes>);

impl http_body::Body for EndlessBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        match &self.0 {
            None => std::task::Poll::Pending,
            Some(bytes) => {
                let frame = http_body::Frame::data(bytes.clone());
                std::task::Poll::Ready(Some(Ok(frame)))
            }
        }
    }
}

/// gRPC messages of no bytes (a flag and a length of 0), 64 KiB of them.
static EMPTY_MESSAGES: [u8; 65_535] = [0; 65_535];

/// A receiver on a loopback port that answers every request at once with 200 and the
/// `content_type`, over HTTP/2 (`http2`, as gRPC) or HTTP/1, and then never sends the body.
async fn headers_then_nothing(http2: bool, content_type: &'static str) -> u16 {
    answering(http2, content_type, || EndlessBody(None)).await
}

/// A receiver on a loopback port that answers every request at once with 200, the
/// `content_type` and the body `body` makes, over HTTP/2 (`http2`) or HTTP/1.
async fn answering<B>(http2: bool, content_type: &'static str, body: fn() -> B) -> u16
where
    B: http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible> + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let port = listener.local_addr().expect("bound").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(move |_| async move {
                hyper::Response::builder()
                    .header("content-type", content_type)
                    .body(body())
            });
            let io = TokioIo::new(stream);
            tokio::spawn(async move {
                if http2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_metrics_receiver_costs_neither_the_shutdown_deadline_nor_the_state_file() {
    let (_silent, silent) = silent_receiver();
    // A receiver that answers 503 and asks for 30 s.
    let busy = common::serve_http(axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "30")],
            "busy",
        )
    }))
    .await;
    let grpc_stalled = headers_then_nothing(true, "application/grpc").await;
    let http_stalled = headers_then_nothing(false, "application/x-protobuf").await;
    // Empty gRPC messages forever, as fast as they are read.
    let messages = || EndlessBody(Some(bytes::Bytes::from_static(&EMPTY_MESSAGES)));
    let endless = answering(true, "application/grpc", messages).await;
    // Where in the push the signal comes decides whether tonic's client was caught reading
    // the endless answer (on the parent of issue 63's fix, 3 of 8 offsets from 1.0 to 2.7 s
    // stopped in 20 s): the endless receiver is tried at five.
    let receivers = [
        (
            "a gRPC receiver whose answer never ends (empty messages, as fast as read)",
            format!("http://127.0.0.1:{endless}"),
            "grpc",
        ),
        (
            "a gRPC receiver whose answer never ends, signalled sooner",
            format!("http://127.0.0.1:{endless}"),
            "grpc",
        ),
        (
            "a gRPC receiver whose answer never ends, signalled later",
            format!("http://127.0.0.1:{endless}"),
            "grpc",
        ),
        (
            "a gRPC receiver whose answer never ends, signalled later still",
            format!("http://127.0.0.1:{endless}"),
            "grpc",
        ),
        (
            "a gRPC receiver whose answer never ends, signalled last",
            format!("http://127.0.0.1:{endless}"),
            "grpc",
        ),
        (
            "a gRPC receiver that sends headers, then nothing",
            format!("http://127.0.0.1:{grpc_stalled}"),
            "grpc",
        ),
        (
            "an HTTP receiver whose answer's body never ends",
            format!("http://127.0.0.1:{http_stalled}"),
            "http/protobuf",
        ),
        (
            "an HTTP receiver that never answers",
            format!("http://127.0.0.1:{silent}"),
            "http/protobuf",
        ),
        (
            "a gRPC receiver whose handshake never ends",
            format!("http://127.0.0.1:{silent}"),
            "grpc",
        ),
        (
            "an HTTP receiver asking for 30 s",
            format!("http://{busy}"),
            "http/protobuf",
        ),
    ];
    for (k, (what, endpoint, protocol)) in receivers.into_iter().enumerate() {
        let dir = temp_dir(&format!("stalled-push-{k}"));
        let extra = format!(
            "{}exporters:\n  otlp_metrics: {{ endpoint: \"{endpoint}\", protocol: {protocol}, interval: 1s, timeout: 2s }}\n",
            state_file(&dir.join("state"))
        );
        let (config, ports) = binary_config(&dir, "stalled", &extra);
        let server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
        export_keys(ports.http, 0..2).await;
        let keys = tracker_keys(ports.admin).await;
        assert_eq!(keys, 1_000.0, "{what}");
        // A push under way (or waiting to retry) when the signal comes.
        let offset = [1_500, 1_000, 1_800, 2_000, 2_300].get(k).unwrap_or(&1_500);
        tokio::time::sleep(Duration::from_millis(*offset)).await;
        let started = std::time::Instant::now();
        terminate(server).await;
        let took = started.elapsed();
        eprintln!("{what}: stopped in {took:?}");
        // Within the push's timeout (2 s) and 2 s more.
        assert!(
            took < Duration::from_secs(4),
            "{what}: stopping took {took:?}"
        );
        let _again = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
        assert_eq!(
            tracker_keys(ports.admin).await,
            keys,
            "{what}: the state file is whole"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_metrics_push_logs_its_cause() {
    let dir = temp_dir("push-cause");
    // A port nothing listens on: the connection is refused.
    let closed = common::free_port();
    let extra = format!(
        "exporters:\n  otlp_metrics: {{ endpoint: \"http://127.0.0.1:{closed}\", protocol: http/protobuf, interval: 1s, timeout: 2s }}\n"
    );
    let (config, ports) = binary_config(&dir, "cause", &extra);
    let log = dir.join("log");
    let stderr = std::fs::File::create(&log).expect("a log file");
    let server = spawn_binary(&config, ports.admin, stderr.into()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while value(
        &metrics(ports.admin).await,
        "refusal_gate_exporter_metric_pushes_total",
        &[("outcome", "failed")],
    ) < 1.0
    {
        assert!(std::time::Instant::now() < deadline, "no failed push");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    terminate(server).await;
    let text = std::fs::read_to_string(&log).expect("the log");
    let line = text
        .lines()
        .find(|l| l.contains("OTLP metrics push failed"))
        .expect("the failure is logged");
    assert!(
        line.to_lowercase().contains("connection refused"),
        "the cause is said: {line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exemplar_names_only_a_span_whose_ids_are_valid() {
    let server = common::start(
        "receivers:\n  otlp:\n    grpc: { endpoint: 127.0.0.1:0 }\n    http: { endpoint: 127.0.0.1:0 }\n\
         admin:\n  endpoint: 127.0.0.1:0\n  ui: { trace_url: 'http://tempo.test/trace/{trace_id}' }\n\
         interfaces:\n  - name: items\n    protocol: http\n    url: http://api.test\n    endpoints: [{ path: /items/1, methods: [GET] }]\n",
    )
    .await;
    let bound = &server.bound;
    // (client, trace id, span id): a request refused (405), then the same again with these
    // ids — a violation, whose series carries the exemplar of the attempt that committed it.
    let cases: [(&str, Vec<u8>, Vec<u8>); 9] = [
        ("valid", vec![7; 16], vec![9; 8]),
        ("trace-15", vec![7; 15], vec![9; 8]),
        ("trace-17", vec![7; 17], vec![9; 8]),
        ("trace-none", Vec::new(), vec![9; 8]),
        ("trace-zero", vec![0; 16], vec![9; 8]),
        ("span-7", vec![7; 16], vec![9; 7]),
        ("span-9", vec![7; 16], vec![9; 9]),
        ("span-none", vec![7; 16], Vec::new()),
        ("span-zero", vec![7; 16], vec![0; 8]),
    ];
    for (client, trace, span) in &cases {
        let first = common::http_span(1, "DELETE", "http://api.test/items/1", 405);
        let mut again = common::http_span(2, "DELETE", "http://api.test/items/1", 405);
        again.trace_id = trace.clone();
        again.span_id = span.clone();
        common::send(bound, common::export(client, vec![first, again])).await;
    }
    let text = reqwest::Client::new()
        .get(format!("http://{}/metrics", bound.admin))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .expect("the admin endpoint answers")
        .text()
        .await
        .expect("a body");
    for (client, ..) in &cases {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("refusal_gate_violations_total{"))
            .filter(|l| l.contains(&format!("client=\"{client}\"")))
            .collect();
        let exemplars: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.split_once(" # "))
            .map(|(_, e)| e)
            .collect();
        if *client == "valid" {
            assert_eq!(lines.len(), 1, "{text}");
            assert_eq!(
                exemplars.len(),
                1,
                "the valid span's violation carries its exemplar: {lines:?}"
            );
            let want = format!(
                "trace_id=\"{}\",span_id=\"{}\"",
                "07".repeat(16),
                "09".repeat(8)
            );
            assert!(exemplars[0].contains(&want), "{}", exemplars[0]);
        } else {
            assert!(exemplars.is_empty(), "{client}: {lines:?}");
        }
    }
    // The console's alerts link only the valid span's trace.
    let status: serde_json::Value = reqwest::get(format!("http://{}/api/v1/status", bound.admin))
        .await
        .expect("answers")
        .text()
        .await
        .map(|t| serde_json::from_str(&t).expect("JSON"))
        .expect("a body");
    let alerts = status["alerts"].as_array().expect("alerts");
    assert_eq!(alerts.len(), cases.len(), "an alert each: {alerts:?}");
    for alert in alerts {
        let link = alert["trace_url"].as_str();
        match alert["client"].as_str() {
            Some("valid") => assert_eq!(
                link,
                Some(format!("http://tempo.test/trace/{}", "07".repeat(16)).as_str())
            ),
            Some("trace-15") | Some("trace-17") | Some("trace-none") | Some("trace-zero") => {
                assert_eq!(link, None, "{alert}")
            }
            // A valid trace with a span id of the wrong length: the alert names its trace.
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_request_too_large_to_read_is_resource_exhausted() {
    use refusal_gate::gate::proto::refusal_gate_client::RefusalGateClient;
    use refusal_gate::gate::proto::WatchAlertsRequest;
    let server = common::start(
        "receivers:\n  otlp:\n    grpc: { endpoint: 127.0.0.1:0 }\n    http: { endpoint: 127.0.0.1:0 }\nadmin:\n  endpoint: 127.0.0.1:0\n",
    )
    .await;
    let mut gate = RefusalGateClient::connect(format!("http://{}", server.bound.grpc))
        .await
        .expect("connects");
    // 5 MB: past gRPC's 4 MiB a message, as the OTLP receiver's own limit is answered.
    let request = WatchAlertsRequest {
        client: "x".repeat(5_000_000),
        ..Default::default()
    };
    let status = gate
        .watch_alerts(request)
        .await
        .expect_err("too large to read");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    // The Gate answers the next one as ever.
    let small = gate.watch_alerts(WatchAlertsRequest::default()).await;
    assert!(small.is_ok(), "{small:?}");
}

/// Opens an alert stream over a bare socket, sending `request` (which may hold more than the
/// stream's own request), and returns the socket once the stream's headers say 200.
async fn bare_watcher(admin: u16, request: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", admin))
        .await
        .expect("connects");
    socket.write_all(request).await.expect("sent");
    let mut head = [0u8; 512];
    let n = socket.read(&mut head).await.expect("answered");
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    socket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_hangs_up_gives_its_place_back_whatever_it_sent() {
    let dir = temp_dir("hangups");
    let (config, ports) = binary_config(&dir, "hangups", "alerting:\n  max_watchers: 30\n");
    let _server = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let stream = "GET /v1/alerts/stream HTTP/1.1\r\nhost: gate\r\n";
    // Three ways of holding a stream: its request alone, with a second request pipelined
    // behind it, and with a request body of 1,000 bytes of which 3 were sent. In the last
    // two the connection is never read again while the stream lasts.
    let ways = [
        format!("{stream}\r\n"),
        format!("{stream}\r\nGET /healthz HTTP/1.1\r\nhost: gate\r\n\r\n"),
        format!("{stream}content-length: 1000\r\n\r\nabc"),
    ];
    let mut watchers = Vec::new();
    for way in ways.iter().cycle().take(30) {
        watchers.push(bare_watcher(ports.admin, way.as_bytes()).await);
    }
    let sse = format!("http://127.0.0.1:{}/v1/alerts/stream", ports.admin);
    assert_eq!(reqwest::get(&sse).await.expect("answered").status(), 503);
    // All 30 hang up: all 30 places come back, however each was held.
    drop(watchers);
    let hung_up = std::time::Instant::now();
    let mut admitted = Vec::new();
    while admitted.len() < 30 {
        assert!(
            hung_up.elapsed() < Duration::from_secs(10),
            "{} of 30 places back 10 s after the hang-ups",
            admitted.len()
        );
        let again = reqwest::get(&sse).await.expect("answered");
        if again.status() == 200 {
            admitted.push(again);
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    println!(
        "30 watchers hung up (a third pipelining, a third mid-body): every place back in {:.2} s",
        hung_up.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// DESIGN §13, bounded per interface (issue 63): a flood of successes on operations of an
/// origin the sender invented fills the origins' share of the interfaces' witness and no more
/// — what it leaves out is counted — and a real contradiction on a configured interface, two
/// clients apart, is still counted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invented_origins_flood_does_not_blind_the_witness_of_a_configured_interface() {
    use common::{export, http_span, scrape, send, start};
    let server = start(
        "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: shop
    protocol: http
    url: http://shop.test
    endpoints: [{ path: /orders, methods: [GET, POST] }]
tracker:
  max_keys: 1600
",
    )
    .await;
    let b = &server.bound;
    // 5,000 operations of 50 invented origins, each served: three times what the witness may
    // remember at all.
    for chunk in 0..50u64 {
        let spans = (0..100)
            .map(|k| {
                let i = chunk * 100 + k;
                http_span(i, "GET", &format!("http://invented{chunk}.test/p{i}"), 200)
            })
            .collect();
        send(b, export("flooder", spans)).await;
    }
    // Then one client refused POST /orders, another served it.
    let refused = http_span(6_000, "POST", "http://shop.test/orders", 405);
    send(b, export("buyer-a", vec![refused])).await;
    let served = http_span(6_001, "POST", "http://shop.test/orders", 200);
    send(b, export("buyer-b", vec![served])).await;
    let m = scrape(b).await;
    let contradicted = [("interface", "shop"), ("kind", "refusal_contradicted")];
    assert_eq!(
        common::value(
            &m,
            "refusal_gate_interface_contradictions_total",
            &contradicted
        ),
        1.0,
        "{m}"
    );
    // The origins past their half (and an origin past its own share, where a shard of the
    // witness got more of its operations than its share: where they land is the process's
    // random seed's).
    let left_out = |reason| {
        common::value(
            &m,
            "refusal_gate_witness_left_out_total",
            &[("reason", reason)],
        )
    };
    assert!(left_out("origins") > 0.0, "{m}");
    assert!(
        left_out("interface") + left_out("origins") >= 4_000.0,
        "{m}"
    );
    assert_eq!(
        common::value(
            &m,
            "refusal_gate_witness_left_out_total",
            &[("reason", "total")]
        ),
        0.0,
        "{m}"
    );
}
