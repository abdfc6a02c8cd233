//! Black-box tests of what keeps strangers out and floods bounded: bearer-token
//! authentication on both receivers (with the OpenTelemetry SDK's own exporters carrying
//! the token, and raw requests to see the exact answers) and on the admin endpoint, the
//! receivers' concurrency limit answering with a retryable status and a retry hint, and an
//! ordinary exporter getting through beside one HTTP/2 connection that holds or resets its
//! streams and HTTP/1 connections that trickle their bodies.

mod common;

use bytes::Bytes;
use common::{export, http_span, scrape, sdk_export, start, value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use prost::Message;
use refusal_gate::app::Bound;
use refusal_gate::export::{RawCodec, EXPORT_PATH};
use std::collections::HashMap;
use tokio::io::AsyncWriteExt;
use tonic_types::StatusExt;

const TOKENS: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
    auth: { tokens: [right-token, second-token] }
admin:
  endpoint: 127.0.0.1:0
  auth: { tokens: [admin-token] }
";

/// Port-0 listeners with every limit at its default.
const DEFAULTS: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
";

fn grpc_exporter(bound: &Bound, token: Option<&str>) -> opentelemetry_otlp::SpanExporter {
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(t) = token {
        metadata.insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{}", bound.grpc))
        .with_metadata(metadata)
        .build()
        .expect("the exporter builds")
}

fn http_exporter(bound: &Bound, token: Option<&str>) -> opentelemetry_otlp::SpanExporter {
    let headers: HashMap<String, String> = token
        .map(|t| ("authorization".to_owned(), format!("Bearer {t}")))
        .into_iter()
        .collect();
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("http://{}/v1/traces", bound.http))
        .with_headers(headers)
        .build()
        .expect("the exporter builds")
}

/// A raw gRPC export of `body` with an optional token: the status code, and any retry hint.
async fn grpc_raw(
    bound: &Bound,
    token: Option<&str>,
    body: Vec<u8>,
) -> (tonic::Code, Option<std::time::Duration>) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", bound.grpc))
        .expect("a valid endpoint")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let mut request = tonic::Request::new(Bytes::from(body));
    if let Some(t) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
    match grpc.unary(request, path, RawCodec).await {
        Ok(_) => (tonic::Code::Ok, None),
        Err(status) => (
            status.code(),
            status.get_details_retry_info().and_then(|r| r.retry_delay),
        ),
    }
}

async fn admin_get(bound: &Bound, path: &str, token: Option<&str>) -> reqwest::StatusCode {
    let mut request = reqwest::Client::new().get(format!("http://{}{path}", bound.admin));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    request.send().await.expect("answers").status()
}

async fn scrape_with(bound: &Bound, token: &str) -> String {
    reqwest::Client::new()
        .get(format!("http://{}/metrics", bound.admin))
        .bearer_auth(token)
        .send()
        .await
        .expect("answers")
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_admit_the_right_tokens_and_refuse_and_count_the_rest() {
    let server = start(TOKENS).await;
    let b = &server.bound;

    // The SDK's exporters, carrying the token as their users configure it.
    assert!(sdk_export(grpc_exporter(b, Some("right-token")), "grpc-ok").await);
    assert!(sdk_export(http_exporter(b, Some("second-token")), "http-ok").await);
    sdk_export(grpc_exporter(b, Some("wrong")), "grpc-wrong").await;
    sdk_export(http_exporter(b, None), "http-missing").await;

    // The exact answers on the wire.
    let body = export("raw", vec![http_span(1, "GET", "http://api.test/x", 200)]);
    assert_eq!(
        grpc_raw(b, None, body.clone()).await.0,
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        grpc_raw(b, Some("right-tokenx"), body.clone()).await.0,
        tonic::Code::Unauthenticated
    );
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", b.http))
        .header("content-type", "application/x-protobuf")
        .bearer_auth("Right-Token")
        .body(body.clone())
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");

    let m = scrape_with(b, "admin-token").await;
    let accepted = |t| {
        value(
            &m,
            "refusal_gate_receiver_accepted_spans_total",
            &[("transport", t)],
        )
    };
    assert_eq!(accepted("grpc"), 1.0, "only the span with the right token");
    assert_eq!(accepted("http"), 1.0, "only the span with the right token");
    let refused = |t| {
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", t), ("reason", "unauthenticated")],
        )
    };
    assert!(
        refused("grpc") >= 3.0,
        "the SDK's (retried) export and two raw ones"
    );
    assert!(refused("http") >= 2.0, "the SDK's export and the raw one");
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &[("client", "grpc-ok")]),
        1.0
    );
    assert!(!m.contains("grpc-wrong") && !m.contains("http-missing"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_requires_its_own_token_except_for_the_probes() {
    let server = start(TOKENS).await;
    let b = &server.bound;
    assert_eq!(admin_get(b, "/metrics", None).await, 401);
    assert_eq!(admin_get(b, "/metrics", Some("right-token")).await, 401);
    assert_eq!(admin_get(b, "/api/v1/alerts", None).await, 401);
    assert_eq!(admin_get(b, "/metrics", Some("admin-token")).await, 200);
    assert_eq!(admin_get(b, "/healthz", None).await, 200);
    assert_eq!(admin_get(b, "/readyz", None).await, 200);
    server.shutdown().await;
}

/// Spans enough to keep the pipeline busy a while: some 3.5 MiB of protobuf.
fn heavy_export() -> Vec<u8> {
    let spans = (0..3500)
        .map(|i| {
            let mut span = http_span(i, "GET", "http://api.test/x", 200);
            span.attributes.push(common::kv(
                "payload",
                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                    "x".repeat(900),
                ),
            ));
            span
        })
        .collect();
    export("heavy", spans)
}

/// Sends `heavy` and, while it is being handled, `light` requests until one is refused:
/// that refusal, or `None` if none was in ten rounds.
async fn refused_beside<T, H, L>(heavy: impl Fn() -> H, light: impl Fn() -> L) -> Option<T>
where
    H: std::future::Future<Output = ()> + Send + 'static,
    L: std::future::Future<Output = Option<T>>,
{
    for _ in 0..10 {
        let handled = tokio::spawn(heavy());
        while !handled.is_finished() {
            if let Some(refused) = light().await {
                return Some(refused);
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_concurrency_limit_the_receivers_answer_retryable_with_a_hint() {
    let server = start(
        "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0, max_concurrent_requests: 1 }
    http: { endpoint: 127.0.0.1:0, max_concurrent_requests: 1 }
admin:
  endpoint: 127.0.0.1:0
",
    )
    .await;
    let b = server.bound;
    let body = export("c", vec![http_span(1, "GET", "http://api.test/x", 200)]);
    let heavy = Bytes::from(heavy_export());

    // A request whose body never comes holds no place: one that arrived does.
    let mut held = tokio::net::TcpStream::connect(b.http)
        .await
        .expect("connects");
    held.write_all(
        b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n",
    )
    .await
    .expect("written");
    let mut attacker = common::bare_http2(b.grpc).await;
    let _stream = common::headers_only(&mut attacker, 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    common::send(&b, body.clone()).await;
    assert_eq!(grpc_raw(&b, None, body.clone()).await.0, tonic::Code::Ok);

    // OTLP/HTTP: a large export being handled holds the only place.
    let client = reqwest::Client::new();
    let post = |body: Bytes| {
        client
            .post(format!("http://{}/v1/traces", b.http))
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
    };
    let refused = refused_beside(
        || {
            let answer = post(heavy.clone());
            async move {
                answer.await.expect("answers");
            }
        },
        || {
            let answer = post(Bytes::from(body.clone()));
            async move { Some(answer.await.expect("answers")).filter(|r| r.status() != 200) }
        },
    )
    .await
    .expect("a request beside a large one being handled is refused");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");

    // OTLP/gRPC: the same.
    let (code, hint) = refused_beside(
        || {
            let heavy = heavy.to_vec();
            async move {
                grpc_raw(&b, None, heavy).await;
            }
        },
        || {
            let body = body.clone();
            async move { Some(grpc_raw(&b, None, body).await).filter(|r| r.0 != tonic::Code::Ok) }
        },
    )
    .await
    .expect("a request beside a large one being handled is refused");
    assert_eq!(code, tonic::Code::Unavailable);
    assert_eq!(hint, Some(std::time::Duration::from_secs(1)), "a RetryInfo");

    let m = scrape(&b).await;
    for transport in ["grpc", "http"] {
        assert!(
            value(
                &m,
                "refusal_gate_receiver_refused_requests_total",
                &[("transport", transport), ("reason", "concurrency_limit")]
            ) >= 1.0,
            "{transport}"
        );
    }
    server.shutdown().await;
}

/// Exports `n` requests of one span, one after the other on one channel, as an exporter does
/// (no retries): how many the gRPC receiver accepted.
async fn grpc_exports_accepted(bound: &Bound, n: u64) -> u64 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", bound.grpc))
        .expect("a valid endpoint")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    let mut accepted = 0;
    for i in 0..n {
        grpc.ready().await.expect("ready");
        let body = export(
            "bystander",
            vec![http_span(i, "GET", "http://api.test/x", 200)],
        );
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
        let request = tonic::Request::new(Bytes::from(body));
        accepted += u64::from(grpc.unary(request, path, RawCodec).await.is_ok());
    }
    accepted
}

/// As [`grpc_exports_accepted`], over OTLP/HTTP on one kept-alive connection.
async fn http_exports_accepted(bound: &Bound, n: u64) -> u64 {
    let client = reqwest::Client::new();
    let mut accepted = 0;
    for i in 0..n {
        let body = export(
            "bystander",
            vec![http_span(i, "GET", "http://api.test/x", 200)],
        );
        let answer = client
            .post(format!("http://{}/v1/traces", bound.http))
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .expect("answers");
        accepted += u64::from(answer.status() == 200);
    }
    accepted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holding_or_resetting_a_hundred_streams_starves_no_exporter() {
    let server = start(DEFAULTS).await;
    let b = server.bound;

    // A hundred streams with their headers only, on one connection, held while an ordinary
    // exporter beside them sends a hundred exports.
    let mut attacker = common::bare_http2(b.grpc).await;
    let held = common::headers_only(&mut attacker, 100).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let through = grpc_exports_accepted(&b, 100).await;
    eprintln!("held streams: {through} of 100 exports accepted beside them");
    assert!(through >= 95, "{through} of 100 exports accepted");
    drop(held);

    // A hundred HEADERS, a pause, a hundred RST_STREAMs, again and again, while the exporter
    // sends again.
    let attack = async {
        for _ in 0..5 {
            let mut streams = common::headers_only(&mut attacker, 100).await;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            for stream in &mut streams {
                stream.send_reset(h2::Reason::CANCEL);
            }
        }
    };
    let ((), through) = tokio::join!(attack, grpc_exports_accepted(&b, 100));
    eprintln!("reset streams: {through} of 100 exports accepted beside them");
    assert!(through >= 95, "{through} of 100 exports accepted");

    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let m = scrape(&b).await;
    let abandoned = value(
        &m,
        "refusal_gate_receiver_abandoned_requests_total",
        &[("transport", "grpc")],
    );
    eprintln!("reset streams: {abandoned} counted abandoned");
    assert!(
        (500.0..=600.0).contains(&abandoned),
        "every reset stream, and the hundred held ones dropped, are counted abandoned: {abandoned}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_trickling_bodies_starve_no_exporter() {
    let server = start(DEFAULTS).await;
    let b = server.bound;
    // 64 connections, each with a body of 100,000 bytes declared and one more byte every
    // 100 ms.
    let mut trickling = Vec::new();
    for _ in 0..64 {
        let mut s = tokio::net::TcpStream::connect(b.http)
            .await
            .expect("connects");
        s.write_all(
            b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\ncontent-length: 100000\r\n\r\n\x0a",
        )
        .await
        .expect("written");
        trickling.push(s);
    }
    let trickle = tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            for s in &mut trickling {
                let _ = s.write_all(b"\x01").await;
            }
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let through = http_exports_accepted(&b, 100).await;
    eprintln!("trickling bodies: {through} of 100 exports accepted beside them");
    assert!(through >= 95, "{through} of 100 exports accepted");
    trickle.abort();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_still_arriving_are_bounded_in_bytes_and_give_them_back() {
    let server = start(
        "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0, max_recv_msg_size_mib: 1, max_reading_mib: 1 }
    http: { endpoint: 127.0.0.1:0, max_request_body_size_mib: 1, max_reading_mib: 1 }
admin:
  endpoint: 127.0.0.1:0
",
    )
    .await;
    let b = server.bound;
    let mut span = http_span(1, "GET", "http://api.test/x", 200);
    let payload = "x".repeat(300 << 10);
    span.attributes.push(common::kv(
        "payload",
        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(payload),
    ));
    let body = export("c", vec![span]);

    // gRPC: 900 KiB of a message arrived, the rest not yet.
    let mut attacker = common::bare_http2(b.grpc).await;
    let mut streams = common::headers_only(&mut attacker, 1).await;
    let mut frame = vec![0u8, 0, 0x10, 0, 0];
    frame.resize(900 << 10, 0x0a);
    streams[0].reserve_capacity(frame.len());
    streams[0]
        .send_data(Bytes::from(frame), false)
        .expect("sent");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (code, hint) = grpc_raw(&b, None, body.clone()).await;
    assert_eq!(code, tonic::Code::Unavailable, "300 KiB more do not fit");
    assert_eq!(hint, Some(std::time::Duration::from_secs(1)), "a RetryInfo");
    // The HTTP receiver has a budget of its own.
    common::send(&b, body.clone()).await;
    streams[0].send_reset(h2::Reason::CANCEL);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        grpc_raw(&b, None, body.clone()).await.0,
        tonic::Code::Ok,
        "given back"
    );

    // HTTP: the same, with a body on a plain socket.
    let mut held = tokio::net::TcpStream::connect(b.http)
        .await
        .expect("connects");
    held.write_all(
        b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000000\r\n\r\n",
    )
    .await
    .expect("written");
    held.write_all(&vec![0x0a; 900 << 10])
        .await
        .expect("written");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", b.http))
        .header("content-type", "application/x-protobuf")
        .body(body.clone())
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    drop(held);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    common::send(&b, body).await;

    let m = scrape(&b).await;
    for transport in ["grpc", "http"] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_receiver_refused_requests_total",
                &[("transport", transport), ("reason", "reading_limit")]
            ),
            1.0,
            "{transport}"
        );
    }
    server.shutdown().await;
}

const SCOPED: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
    auth:
      tokens: [open-token]
      scoped: [{ token: billing-token, clients: ['billing-*'] }]
admin:
  endpoint: 127.0.0.1:0
  auth:
    tokens: [admin-token]
    scoped:
      - { token: reader-token, read_only: true }
      - { token: billing-admin, clients: [billing-agent] }
";

/// The spans of the forgery: three calls failing with invalid params, retried, as
/// `billing-agent/pod-7`.
fn forged(service: &str) -> Vec<u8> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let spans = (0..3)
        .map(|i| {
            let mut span = http_span(i, "POST", "http://mcp.test:8080/mcp", 200);
            span.attributes.extend([
                common::kv("rpc.system", Value::StringValue("jsonrpc".into())),
                common::kv("rpc.method", Value::StringValue("tools/call".into())),
                common::kv("gen_ai.tool.name", Value::StringValue("pay".into())),
                common::kv("rpc.jsonrpc.error_code", Value::IntValue(-32602)),
            ]);
            span
        })
        .collect();
    export(service, spans)
}

/// A Gate question over the HTTP mirror with `token`: its status.
async fn observe_http(bound: &Bound, token: &str, client: &str) -> reqwest::StatusCode {
    let question = serde_json::json!({
        "client": { "serviceName": client },
        "protocol": "http",
        "url": "http://api.test/x",
        "httpMethod": "GET",
        "lastResponse": { "httpStatus": 200 },
        "observe": true,
    });
    reqwest::Client::new()
        .post(format!("http://{}/v1/decide", bound.admin))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(question.to_string())
        .send()
        .await
        .expect("answers")
        .status()
}

/// The same over gRPC, on the receiver's port with `token`: its code.
async fn observe_grpc(bound: &Bound, token: &str, client: &str) -> tonic::Code {
    use refusal_gate::gate::proto::{
        refusal_gate_client::RefusalGateClient, Client, DecideRequest, LastResponse, Protocol,
    };
    let mut gate = RefusalGateClient::connect(format!("http://{}", bound.grpc))
        .await
        .expect("connects");
    let mut request = tonic::Request::new(DecideRequest {
        client: Some(Client {
            service_name: client.into(),
            service_instance_id: String::new(),
        }),
        protocol: Protocol::Http as i32,
        url: "http://api.test/x".into(),
        http_method: "GET".into(),
        last_response: Some(LastResponse {
            http_status: 200,
            ..Default::default()
        }),
        observe: true,
        ..Default::default()
    });
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    match gate.decide(request).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_speaks_only_for_the_clients_it_names() {
    let server = start(SCOPED).await;
    let b = &server.bound;

    // OTLP: a token bound to billing-* sends as billing-agent, and forges checkout-agent.
    assert!(sdk_export(grpc_exporter(b, Some("billing-token")), "billing-agent").await);
    assert!(sdk_export(http_exporter(b, Some("billing-token")), "billing-api").await);
    let (code, _) = grpc_raw(b, Some("billing-token"), forged("checkout-agent")).await;
    assert_eq!(
        code,
        tonic::Code::Ok,
        "the request is answered, its spans refused"
    );
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", b.http))
        .header("content-type", "application/x-protobuf")
        .bearer_auth("billing-token")
        .body(forged("checkout-agent"))
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 200);
    let answer =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::decode(
            answer.bytes().await.expect("a body"),
        )
        .expect("an OTLP answer");
    let partial = answer.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_spans, 3);
    assert!(
        partial.error_message.contains("may not speak for"),
        "{}",
        partial.error_message
    );
    // An unbound token speaks for anyone.
    common::send_with(b, "open-token", forged("any-agent")).await;

    // The Gate: a read-only admin token does not observe; a bound one only as its client.
    assert_eq!(observe_http(b, "reader-token", "billing-agent").await, 403);
    assert_eq!(
        observe_http(b, "billing-admin", "checkout-agent").await,
        403
    );
    assert_eq!(observe_http(b, "billing-admin", "billing-agent").await, 200);
    assert_eq!(
        observe_grpc(b, "billing-token", "checkout-agent").await,
        tonic::Code::PermissionDenied
    );
    assert_eq!(
        observe_grpc(b, "billing-token", "billing-7").await,
        tonic::Code::Ok
    );
    assert_eq!(
        observe_grpc(b, "open-token", "anyone").await,
        tonic::Code::Ok
    );

    let m = scrape_with(b, "reader-token").await;
    let attempts = |client| value(&m, "refusal_gate_attempts_total", &[("client", client)]);
    assert_eq!(
        attempts("billing-agent"),
        2.0,
        "its span and its observed question"
    );
    assert_eq!(attempts("billing-api"), 1.0);
    assert_eq!(attempts("billing-7"), 1.0);
    assert_eq!(attempts("any-agent"), 3.0);
    assert!(
        !m.contains("checkout-agent"),
        "the forged client is never judged"
    );
    for transport in ["grpc", "http"] {
        let refused = value(
            &m,
            "refusal_gate_receiver_refused_spans_total",
            &[("transport", transport), ("reason", "not_permitted")],
        );
        assert_eq!(refused, 3.0, "{transport}");
    }
    for (api, n) in [("http", 2.0), ("grpc", 1.0)] {
        let refused = value(
            &m,
            "refusal_gate_gate_refused_total",
            &[("api", api), ("reason", "not_permitted")],
        );
        assert_eq!(refused, n, "{api}");
    }
    server.shutdown().await;
}
