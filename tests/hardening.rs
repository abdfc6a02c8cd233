//! Black-box tests of what keeps strangers out and floods bounded: bearer-token
//! authentication on both receivers (with the OpenTelemetry SDK's own exporters carrying
//! the token, and raw requests to see the exact answers) and on the admin endpoint, and the
//! receivers' concurrency limit answering with a retryable status and a retry hint.

mod common;

use bytes::Bytes;
use common::{export, http_span, scrape, sdk_export, start, value};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
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

    // OTLP/HTTP: one request whose body never comes holds the only place.
    let mut held = tokio::net::TcpStream::connect(b.http)
        .await
        .expect("connects");
    held.write_all(
        b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\ncontent-length: 1000\r\n\r\n",
    )
    .await
    .expect("written");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", b.http))
        .header("content-type", "application/x-protobuf")
        .body(body.clone())
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    drop(held);

    // OTLP/gRPC: a stream that never sends its message holds the only place.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", b.grpc))
        .expect("a valid endpoint")
        .connect()
        .await
        .expect("connects");
    let mut holder = tonic::client::Grpc::new(channel);
    let hold = tokio::spawn(async move {
        holder.ready().await.expect("ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
        let never = tokio_stream::pending::<Bytes>();
        let _ = holder
            .client_streaming(tonic::Request::new(never), path, RawCodec)
            .await;
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (code, hint) = grpc_raw(&b, None, body.clone()).await;
    assert_eq!(code, tonic::Code::Unavailable);
    assert_eq!(hint, Some(std::time::Duration::from_secs(1)), "a RetryInfo");
    hold.abort();

    // Once the holders are gone, requests pass again.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(grpc_raw(&b, None, body.clone()).await.0, tonic::Code::Ok);
    common::send(&b, body).await;

    let m = scrape(&b).await;
    for transport in ["grpc", "http"] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_receiver_refused_requests_total",
                &[("transport", transport), ("reason", "concurrency_limit")]
            ),
            1.0,
            "{transport}"
        );
    }
    server.shutdown().await;
}
