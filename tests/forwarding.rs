//! Forwarding, black-box: two refusal-gate processes chained (A forwards to B, B to a
//! capturing OTLP sink), spans arriving with their `refusal_gate.*` attributes and nothing
//! else changed; no loss across a restart of B; a downstream that refuses is not retried;
//! a full queue pushes back with OTLP's retryable answer.

mod common;

use common::sink::{serve, start_sink, Sink};
use common::{free_port, http_span, kv, Reaper};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_refusal-gate");

/// A refusal-gate process on the given ports, forwarding with `exporter` (YAML).
struct Gate {
    _child: Reaper,
    grpc: u16,
    http: u16,
    admin: u16,
}

fn gate(ports: (u16, u16, u16), exporter: &str, dir: &std::path::Path, name: &str) -> Gate {
    let (grpc, http, admin) = ports;
    let config = format!(
        "receivers:\n  otlp:\n    grpc: {{ endpoint: 127.0.0.1:{grpc} }}\n    http: {{ endpoint: 127.0.0.1:{http} }}\n\
         admin:\n  endpoint: 127.0.0.1:{admin}\n\
         interfaces:\n  - name: weather-mcp\n    protocol: mcp\n    url: http://mcp.test:8080/mcp\n    endpoints: [{{ path: /mcp }}]\n\
         exporters:\n  otlp: {exporter}\n"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, config).expect("writing the configuration");
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("a log file");
    let child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Gate {
        _child: Reaper(child),
        grpc,
        http,
        admin,
    }
}

fn ports() -> (u16, u16, u16) {
    (free_port(), free_port(), free_port())
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("refusal-gate-fwd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

/// A request with everything a forwarder could lose: resource attributes and dropped
/// count, a scope with version and attributes, schema URLs, events, links, status, flags,
/// and a server span that is not an attempt.
fn rich_request(client: &str, first: u64) -> ExportTraceServiceRequest {
    let mcp = "http://mcp.test:8080";
    let mut spans: Vec<Span> = vec![
        http_span(first, "GET", &format!("{mcp}/.well-known/mcp.json"), 200),
        http_span(first + 1, "POST", &format!("{mcp}/mcp/sse"), 404),
        http_span(first + 2, "POST", &format!("{mcp}/mcp/sse"), 404),
    ];
    let mut server = http_span(first + 3, "GET", &format!("{mcp}/x"), 200);
    server.kind = 2;
    spans.push(server);
    for span in &mut spans {
        span.trace_state = "vendor=1".into();
        span.flags = 1;
        span.dropped_attributes_count = 2;
        span.events
            .push(opentelemetry_proto::tonic::trace::v1::span::Event {
                name: "log".into(),
                time_unix_nano: span.start_time_unix_nano + 5,
                attributes: vec![kv("n", Value::IntValue(1))],
                ..Default::default()
            });
        span.attributes
            .push(kv("custom.double", Value::DoubleValue(1.5)));
    }
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", Value::StringValue(client.into())),
                    kv("deployment.environment", Value::StringValue("test".into())),
                ],
                dropped_attributes_count: 3,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "agent-sdk".into(),
                    version: "1.2.3".into(),
                    attributes: vec![kv("scope.attr", Value::BoolValue(true))],
                    dropped_attributes_count: 0,
                }),
                spans,
                schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
            }],
            schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
        }],
    }
}

async fn post(port: u16, body: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .expect("the receiver answers")
}

fn string_attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

async fn wait_for_spans(sink: &Sink, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.spans().len() < n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {n} spans arrived",
            sink.spans().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metric(admin: u16, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
        .await
        .expect("the admin endpoint answers")
        .text()
        .await
        .expect("a body");
    common::value(&text, name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_cross_two_gates_tagged_and_otherwise_unchanged() {
    let dir = temp_dir("chain");
    let (sink_addr, sink) = start_sink().await;
    let b = gate(
        ports(),
        &format!("{{ endpoint: 'http://{sink_addr}', batch_interval: 50ms }}"),
        &dir,
        "b",
    );
    let a = gate(
        ports(),
        &format!(
            "{{ endpoint: 'http://127.0.0.1:{}', batch_interval: 50ms, compression: gzip }}",
            b.grpc
        ),
        &dir,
        "a",
    );
    let sent = rich_request("chained-agent", 0);
    assert_eq!(post(a.http, sent.encode_to_vec()).await.status(), 200);
    wait_for_spans(&sink, 4, "A → B → sink").await;

    let got = sink.spans();
    let rs = &sent.resource_spans[0];
    let ss = &rs.scope_spans[0];
    for original in &ss.spans {
        let (resource, scope, span) = got.get(&original.span_id).expect("every span arrives");
        assert_eq!(
            resource,
            rs.resource.as_ref().expect("a resource"),
            "the resource is unchanged"
        );
        assert_eq!(
            scope,
            ss.scope.as_ref().expect("a scope"),
            "the scope is unchanged"
        );
        // Everything but the appended attributes is the same.
        let (kept, added) = span.attributes.split_at(original.attributes.len());
        assert_eq!(
            kept,
            &original.attributes[..],
            "the original attributes, in order"
        );
        let mut without = span.clone();
        without.attributes.truncate(original.attributes.len());
        assert_eq!(
            &without, original,
            "ids, times, events, status, flags unchanged"
        );
        let is_attempt = original.kind == 3;
        assert_eq!(
            !added.is_empty(),
            is_attempt,
            "only attempts are tagged, once"
        );
        assert!(added.iter().all(|a| a.key.starts_with("refusal_gate.")));
    }
    let first_retry = &got[&ss.spans[2].span_id].2;
    assert_eq!(
        string_attr(first_retry, "refusal_gate.class"),
        Some(&Value::StringValue("refusal".into()))
    );
    assert_eq!(
        string_attr(first_retry, "refusal_gate.kind"),
        Some(&Value::StringValue("interface_not_declared".into()))
    );
    assert_eq!(
        string_attr(first_retry, "refusal_gate.violation"),
        Some(&Value::StringValue("retry_after_refusal".into()))
    );
    assert_eq!(
        string_attr(first_retry, "refusal_gate.attempt"),
        Some(&Value::IntValue(2))
    );
    assert_eq!(
        string_attr(first_retry, "refusal_gate.reason"),
        Some(&Value::StringValue("http 404 undeclared path".into()))
    );
    assert_eq!(
        string_attr(first_retry, "refusal_gate.interface"),
        Some(&Value::StringValue("weather-mcp".into()))
    );
    // `discovery_read`: whether the client had read the document when the attempt started.
    assert_eq!(
        string_attr(first_retry, "refusal_gate.discovery_read"),
        Some(&Value::BoolValue(true))
    );
    let read = &got[&ss.spans[0].span_id].2;
    assert_eq!(
        string_attr(read, "refusal_gate.discovery_read"),
        Some(&Value::BoolValue(false)),
        "the read itself started before it had read anything"
    );
    assert_eq!(
        string_attr(read, "refusal_gate.decision"),
        Some(&Value::StringValue("proceed".into()))
    );
    assert_eq!(
        metric(a.admin, "refusal_gate_exporter_sent_spans_total", &[]).await,
        4.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_while_the_next_gate_restarts() {
    let dir = temp_dir("restart");
    let (sink_addr, sink) = start_sink().await;
    let b_ports = ports();
    let b_exporter = format!("{{ endpoint: 'http://{sink_addr}', batch_interval: 50ms }}");
    let mut b = Some(gate(b_ports, &b_exporter, &dir, "b"));
    let a = gate(
        ports(),
        &format!(
            "{{ endpoint: 'http://127.0.0.1:{}', batch_interval: 50ms, timeout: 2s }}",
            b_ports.0
        ),
        &dir,
        "a",
    );
    let mut sent = 0u64;
    for round in 0..30u64 {
        if round == 10 {
            // Stop B gracefully (it drains to the sink) and keep sending to A.
            if let Some(g) = b.take() {
                let mut child = g._child;
                common::sigterm(&child.0);
                let _ = child.0.wait();
            }
        }
        if round == 20 {
            b = Some(gate(b_ports, &b_exporter, &dir, "b"));
        }
        let spans: Vec<Span> = (0..5)
            .map(|i| http_span(round * 5 + i, "POST", "http://api.test/items", 503))
            .collect();
        let r = post(a.http, common::export("restart-agent", spans)).await;
        assert_eq!(r.status(), 200, "A accepts while B is away");
        sent += 5;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_spans(&sink, sent as usize, "after B came back").await;
    let got = sink.spans();
    for n in 0..sent {
        assert!(
            got.contains_key((n + 1).to_be_bytes().as_slice()),
            "span {n} arrived"
        );
    }
    assert!(
        metric(
            a.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "retried")]
        )
        .await
            > 0.0,
        "A's retries show the outage"
    );
    assert_eq!(
        metric(
            a.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "refused")]
        )
        .await,
        0.0
    );
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gRPC server whose TraceService answers UNIMPLEMENTED, counting the calls.
#[derive(Clone, Default)]
struct Refuser {
    calls: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl TraceService for Refuser {
    async fn export(
        &self,
        _request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        *self.calls.lock().expect("not poisoned") += 1;
        Err(tonic::Status::unimplemented("traces are not accepted here"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_refuses_is_sent_once() {
    let dir = temp_dir("refuse");
    let refuser = Refuser::default();
    let addr = serve(refuser.clone()).await;
    let a = gate(
        ports(),
        &format!("{{ endpoint: 'http://{addr}', batch_interval: 50ms }}"),
        &dir,
        "a",
    );
    let spans = (0..3)
        .map(|i| http_span(i, "GET", "http://api.test/x", 200))
        .collect();
    assert_eq!(
        post(a.http, common::export("refused-agent", spans))
            .await
            .status(),
        200
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while *refuser.calls.lock().expect("not poisoned") == 0 {
        assert!(Instant::now() < deadline, "never sent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        *refuser.calls.lock().expect("not poisoned"),
        1,
        "UNIMPLEMENTED is final"
    );
    assert_eq!(
        metric(
            a.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "refused")]
        )
        .await,
        3.0
    );
    assert_eq!(
        metric(
            a.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "retried")]
        )
        .await,
        0.0
    );
    assert_eq!(
        metric(a.admin, "refusal_gate_exporter_queue_spans", &[]).await,
        0.0
    );

    // Over HTTP, a 404 is final too.
    let hits = Arc::new(Mutex::new(0usize));
    let counted = Arc::clone(&hits);
    let app = axum::Router::new().fallback(move || {
        let counted = Arc::clone(&counted);
        async move {
            *counted.lock().expect("not poisoned") += 1;
            axum::http::StatusCode::NOT_FOUND
        }
    });
    let http_addr = common::serve_http(app).await;
    let h = gate(
        ports(),
        &format!(
            "{{ endpoint: 'http://{http_addr}', protocol: http/protobuf, batch_interval: 50ms }}"
        ),
        &dir,
        "h",
    );
    let spans = (0..2)
        .map(|i| http_span(i, "GET", "http://api.test/x", 200))
        .collect();
    assert_eq!(
        post(h.http, common::export("refused-agent-http", spans))
            .await
            .status(),
        200
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*hits.lock().expect("not poisoned"), 1, "HTTP 404 is final");
    assert_eq!(
        metric(
            h.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "refused")]
        )
        .await,
        2.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_pushes_back_with_a_retry_hint() {
    let dir = temp_dir("full");
    // Nothing listens downstream, so nothing drains.
    let nowhere = free_port();
    let a = gate(
        ports(),
        &format!(
            "{{ endpoint: 'http://127.0.0.1:{nowhere}', queue_size: 10, batch_interval: 50ms }}"
        ),
        &dir,
        "a",
    );
    let batch = |first: u64| {
        common::export(
            "full-agent",
            (first..first + 5)
                .map(|i| http_span(i, "GET", "http://api.test/x", 200))
                .collect(),
        )
    };
    assert_eq!(post(a.http, batch(0)).await.status(), 200);
    assert_eq!(post(a.http, batch(5)).await.status(), 200);
    let r = post(a.http, batch(10)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");

    // gRPC: UNAVAILABLE with RetryInfo.
    use tonic_types::StatusExt;
    let mut client = opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient::connect(
        format!("http://127.0.0.1:{}", a.grpc),
    )
    .await
    .expect("connects");
    let request = ExportTraceServiceRequest::decode(&batch(20)[..]).expect("valid");
    let status = client.export(request).await.expect_err("the queue is full");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(
        status.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        metric(
            a.admin,
            "refusal_gate_receiver_refused_spans_total",
            &[("reason", "queue_full")]
        )
        .await,
        10.0
    );
    assert_eq!(
        metric(a.admin, "refusal_gate_exporter_queue_spans", &[]).await,
        10.0
    );
    // Refused requests were not ingested: a retry later will be counted once.
    assert_eq!(
        metric(
            a.admin,
            "refusal_gate_attempts_total",
            &[("client", "full-agent")]
        )
        .await,
        10.0
    );

    // on_full: drop accepts and counts the drop instead.
    let d = gate(
        ports(),
        &format!("{{ endpoint: 'http://127.0.0.1:{nowhere}', queue_size: 5, on_full: drop, batch_interval: 50ms }}"),
        &dir,
        "d",
    );
    assert_eq!(post(d.http, batch(0)).await.status(), 200);
    assert_eq!(post(d.http, batch(5)).await.status(), 200);
    assert_eq!(
        metric(
            d.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "queue_full")]
        )
        .await,
        5.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_forwarding_crosses_gates_over_http_and_grpc() {
    let dir = temp_dir("zstd");
    let (sink_addr, sink) = start_sink().await;
    // B → sink over gRPC, zstd; A → B's OTLP/HTTP receiver, zstd.
    let b = gate(
        ports(),
        &format!("{{ endpoint: 'http://{sink_addr}', batch_interval: 50ms, compression: zstd }}"),
        &dir,
        "b",
    );
    let a = gate(
        ports(),
        &format!(
            "{{ endpoint: 'http://127.0.0.1:{}', protocol: http/protobuf, batch_interval: 50ms, compression: zstd }}",
            b.http
        ),
        &dir,
        "a",
    );
    let sent = rich_request("zstd-agent", 0);
    assert_eq!(post(a.http, sent.encode_to_vec()).await.status(), 200);
    wait_for_spans(&sink, 4, "A → B → sink, zstd both legs").await;
    let got = sink.spans();
    for original in &sent.resource_spans[0].scope_spans[0].spans {
        assert!(got.contains_key(&original.span_id), "every span arrives");
    }
}

/// One call as the next hop saw it: when, its `authorization`, its `grpc-encoding`, spans.
type Call = (Instant, Option<String>, Option<String>, usize);

/// A gRPC next hop that records each call's `authorization` and `grpc-encoding` metadata
/// and answers the first call UNAVAILABLE with a `RetryInfo` of 300 ms.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
}

#[tonic::async_trait]
impl TraceService for Recorder {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        use tonic_types::{ErrorDetails, StatusExt};
        let value = |k: &str| {
            request
                .metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let spans = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        let mut calls = self.calls.lock().expect("not poisoned");
        calls.push((
            Instant::now(),
            value("authorization"),
            value("grpc-encoding"),
            spans,
        ));
        if calls.len() == 1 {
            return Err(tonic::Status::with_error_details(
                tonic::Code::Unavailable,
                "busy",
                ErrorDetails::with_retry_info(Some(Duration::from_millis(300))),
            ));
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_forwarding_sends_the_configured_headers_compressed_and_honours_retry_info() {
    let dir = temp_dir("grpc-headers");
    for (compression, encoding) in [
        ("gzip", Some("gzip")),
        ("zstd", Some("zstd")),
        ("none", None),
    ] {
        let recorder = Recorder::default();
        let addr = serve(recorder.clone()).await;
        let a = gate(
            ports(),
            &format!(
                "{{ endpoint: 'http://{addr}', compression: {compression}, batch_interval: 50ms, \
                 headers: {{ Authorization: 'Bearer next-hop' }} }}"
            ),
            &dir,
            compression,
        );
        let spans = (0..3)
            .map(|i| http_span(i, "GET", "http://api.test/x", 200))
            .collect();
        let body = common::export("header-agent", spans);
        assert_eq!(post(a.http, body).await.status(), 200);
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorder.calls.lock().expect("not poisoned").len() < 2 {
            assert!(Instant::now() < deadline, "{compression}: not sent again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let calls = recorder.calls.lock().expect("not poisoned").clone();
        for (_, authorization, got, spans) in &calls {
            assert_eq!(
                authorization.as_deref(),
                Some("Bearer next-hop"),
                "{compression}"
            );
            assert_eq!(got.as_deref(), encoding, "{compression}");
            assert_eq!(*spans, 3, "{compression}: the whole batch, decoded");
        }
        assert!(
            calls[1].0 - calls[0].0 >= Duration::from_millis(300),
            "{compression}: the retry waits as RetryInfo says"
        );
        assert_eq!(
            metric(a.admin, "refusal_gate_exporter_sent_spans_total", &[]).await,
            3.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_next_hop_asking_to_wait_until_a_date_is_waited_for() {
    use axum::response::IntoResponse;
    let dir = temp_dir("retry-date");
    // The first POST: 503 with `Retry-After` two seconds ahead as an HTTP-date (whole
    // seconds, so the wait is one to two seconds); then 200.
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = Arc::clone(&calls);
    let app = axum::Router::new().fallback(move || {
        let seen = Arc::clone(&seen);
        async move {
            let mut calls = seen.lock().expect("not poisoned");
            calls.push(Instant::now());
            if calls.len() == 1 {
                let at = std::time::SystemTime::now() + Duration::from_secs(2);
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", httpdate::fmt_http_date(at))],
                )
                    .into_response()
            } else {
                axum::http::StatusCode::OK.into_response()
            }
        }
    });
    let addr = common::serve_http(app).await;
    let a = gate(
        ports(),
        &format!("{{ endpoint: 'http://{addr}', protocol: http/protobuf, batch_interval: 50ms }}"),
        &dir,
        "a",
    );
    let spans = (0..2)
        .map(|i| http_span(i, "GET", "http://api.test/x", 200))
        .collect();
    assert_eq!(
        post(a.http, common::export("date-agent", spans))
            .await
            .status(),
        200
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.lock().expect("not poisoned").len() < 2 {
        assert!(Instant::now() < deadline, "never sent again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = calls.lock().expect("not poisoned").clone();
    // Without the date the first backoff is 0.2 s (± 25 %).
    assert!(
        calls[1] - calls[0] >= Duration::from_millis(900),
        "retried after {:?}, not when the next hop asked",
        calls[1] - calls[0]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gRPC next hop that takes the spans and answers with a 10 MB `partial_success` message.
#[derive(Clone, Default)]
struct Rambler {
    calls: Arc<Mutex<usize>>,
}

#[tonic::async_trait]
impl TraceService for Rambler {
    async fn export(
        &self,
        _request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess;
        *self.calls.lock().expect("not poisoned") += 1;
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: Some(ExportTracePartialSuccess {
                rejected_spans: 0,
                error_message: "x".repeat(10 << 20),
            }),
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_to_read_is_final_over_both_protocols() {
    let dir = temp_dir("large-answer");
    let rambler = Rambler::default();
    let grpc = serve(rambler.clone()).await;
    let hits = Arc::new(Mutex::new(0usize));
    let counted = Arc::clone(&hits);
    let app = axum::Router::new().fallback(move || {
        let counted = Arc::clone(&counted);
        async move {
            *counted.lock().expect("not poisoned") += 1;
            vec![0u8; 10 << 20]
        }
    });
    let http = common::serve_http(app).await;
    let gates = [
        (
            format!("{{ endpoint: 'http://{grpc}', batch_interval: 50ms }}"),
            Arc::clone(&rambler.calls),
        ),
        (
            format!(
                "{{ endpoint: 'http://{http}', protocol: http/protobuf, batch_interval: 50ms }}"
            ),
            Arc::clone(&hits),
        ),
    ];
    for (n, (exporter, calls)) in gates.into_iter().enumerate() {
        let g = gate(ports(), &exporter, &dir, &format!("g{n}"));
        let spans = (0..2)
            .map(|i| http_span(i, "GET", "http://api.test/x", 200))
            .collect();
        assert_eq!(
            post(g.http, common::export("rambled-agent", spans))
                .await
                .status(),
            200
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(
            g.admin,
            "refusal_gate_exporter_failed_spans_total",
            &[("reason", "refused")],
        )
        .await
            < 2.0
        {
            assert!(Instant::now() < deadline, "{exporter}: never given up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            *calls.lock().expect("not poisoned"),
            1,
            "{exporter}: sent once"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The two halves of call `n` of `client`: its `tools/call` CLIENT span (no error on the
/// client's side) and the observed server's span under it, which says the tool failed.
fn halves(client: &str, n: u8) -> [ExportTraceServiceRequest; 2] {
    let at = common::T0 + u64::from(n) * 1_000_000_000;
    let trace = vec![n; 16];
    let s = |k: &str, v: &str| kv(k, Value::StringValue(v.into()));
    let span = |id: u8, parent: Option<u8>, kind: i32, attributes| Span {
        trace_id: trace.clone(),
        span_id: vec![n, id, 0, 0, 0, 0, 0, 1],
        parent_span_id: parent
            .map(|p| vec![n, p, 0, 0, 0, 0, 0, 1])
            .unwrap_or_default(),
        kind,
        name: "tools/call get_weather".into(),
        start_time_unix_nano: at + u64::from(id) * 1_000_000,
        end_time_unix_nano: at + 40_000_000 - u64::from(id) * 1_000_000,
        attributes,
        ..Default::default()
    };
    let tool = [
        s("mcp.method.name", "tools/call"),
        s("gen_ai.tool.name", "get_weather"),
    ];
    let mut mine = tool.to_vec();
    mine.push(s("url.full", "http://mcp.test:8080/mcp"));
    let mut theirs = tool.to_vec();
    theirs.push(s("error.type", "tool_error"));
    let request = |service: &str, span: Span| ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![s("service.name", service)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    [
        request(client, span(1, None, 3, mine)),
        request("weather-server", span(2, Some(1), 2, theirs)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_tags_are_the_verdict_counted_for_the_call_whichever_half_comes_first() {
    let dir = temp_dir("tags");
    let (sink_addr, sink) = start_sink().await;
    let (grpc, http, admin) = ports();
    let config = format!(
        "receivers:\n  otlp:\n    grpc: {{ endpoint: 127.0.0.1:{grpc} }}\n    http: {{ endpoint: 127.0.0.1:{http} }}\n\
         admin:\n  endpoint: 127.0.0.1:{admin}\n\
         interfaces:\n  - name: weather-mcp\n    protocol: mcp\n    url: http://mcp.test:8080/mcp\n    endpoints: [{{ path: /mcp }}]\n    server: {{ service_names: [weather-server] }}\n\
         exporters:\n  otlp: {{ endpoint: 'http://{sink_addr}', protocol: grpc }}\n"
    );
    let path = dir.join("tags.yaml");
    std::fs::write(&path, config).expect("writing the configuration");
    let _gate = Reaper(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(Instant::now() < deadline, "the gate did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each order a client of its own; each half an export of its own.
    let orders = [("server-first", [1, 0]), ("client-first", [0, 1])];
    for (n, (client, order)) in orders.iter().enumerate() {
        let halves = halves(client, n as u8 + 1);
        for half in order {
            assert!(post(http, halves[*half].encode_to_vec())
                .await
                .status()
                .is_success());
        }
    }
    wait_for_spans(&sink, 4, "every half forwarded").await;
    let mut tagged = 0;
    for (resource, _, span) in sink.spans().values() {
        let Some(Value::StringValue(class)) = string_attr(span, "refusal_gate.class") else {
            continue;
        };
        tagged += 1;
        let service = resource.attributes.iter().find(|a| a.key == "service.name");
        let Some(Value::StringValue(client)) = service
            .and_then(|a| a.value.as_ref())
            .and_then(|v| v.value.as_ref())
        else {
            panic!("a forwarded span without its resource");
        };
        let counted = metric(
            admin,
            "refusal_gate_attempts_total",
            &[
                ("client", client.as_str()),
                ("interface", "weather-mcp"),
                ("class", class.as_str()),
            ],
        )
        .await;
        assert_eq!(
            counted, 1.0,
            "{client}'s span was tagged {class}, which is not what was counted for its call"
        );
    }
    assert_eq!(
        tagged, 2,
        "each call's attempt tagged, the client's half withheld until the server's came"
    );
    for (client, _) in orders {
        assert_eq!(
            metric(
                admin,
                "refusal_gate_attempts_total",
                &[
                    ("client", client),
                    ("interface", "weather-mcp"),
                    ("class", "ambiguous")
                ],
            )
            .await,
            1.0,
            "{client}: one call, the tool's failure seen from the server"
        );
    }
}
