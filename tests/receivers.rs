//! Black-box tests of the receivers: a real server on free loopback ports, spans sent by
//! the OpenTelemetry SDK's own OTLP exporters (gRPC and HTTP/protobuf), raw JSON and gzip
//! requests, and bad input; every assertion is on `/metrics` or on the wire answer.

mod common;

use common::{has_metric, kv, scrape, start, value, CONFIG};
use flate2::{write::GzEncoder, Compression};
use opentelemetry::trace::{SpanKind, Status, Tracer, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue as PbKeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource as PbResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use prost::Message;
use std::io::Write;

/// Sends the agent's story through `provider`: a discovery read, three POSTs to an
/// undeclared path (each refused), an MCP call failing with invalid params twice, and a
/// server span and an internal span that are not attempts.
fn play_agent(provider: &SdkTracerProvider) {
    let tracer = provider.tracer("agent");
    let client = |name: &'static str, attrs: Vec<KeyValue>, failed: bool| {
        let mut span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attrs)
            .start(&tracer);
        if failed {
            opentelemetry::trace::Span::set_status(&mut span, Status::error("failed"));
        }
        opentelemetry::trace::Span::end(&mut span);
    };
    client(
        "GET",
        vec![
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("url.full", "http://mcp.test:8080/.well-known/mcp.json"),
            KeyValue::new("http.response.status_code", 200),
        ],
        false,
    );
    for _ in 0..3 {
        client(
            "POST",
            vec![
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("url.full", "http://mcp.test:8080/mcp/sse"),
                KeyValue::new("http.response.status_code", 404),
                KeyValue::new("error.type", "404"),
            ],
            true,
        );
    }
    for _ in 0..2 {
        client(
            "MCP send tools/call lookup",
            vec![
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", "lookup"),
                KeyValue::new("server.address", "mcp.test"),
                KeyValue::new("server.port", 8080),
                KeyValue::new("rpc.response.status_code", "-32602"),
                KeyValue::new("error.type", "-32602"),
            ],
            true,
        );
    }
    tracer
        .span_builder("GET /mcp")
        .with_kind(SpanKind::Server)
        .with_attributes(vec![KeyValue::new("http.request.method", "GET")])
        .start(&tracer);
    tracer.span_builder("work").start(&tracer);
}

fn provider(service: &str, exporter: opentelemetry_otlp::SpanExporter) -> SdkTracerProvider {
    SdkTracerProvider::builder()
        .with_resource(
            Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .with_batch_exporter(exporter)
        .build()
}

/// Plays the agent and flushes, off the async workers (the SDK's flush blocks).
async fn play_and_flush(provider: SdkTracerProvider) {
    tokio::task::spawn_blocking(move || {
        play_agent(&provider);
        provider.force_flush().expect("the export succeeds");
        provider.shutdown().expect("the provider shuts down");
    })
    .await
    .expect("the exporting thread finishes");
}

fn assert_agent_counted(m: &str, client: &str) {
    let c = ("client", client);
    let i = ("interface", "weather-mcp");
    assert_eq!(value(m, "refusal_gate_attempts_total", &[c]), 6.0, "{m}");
    assert_eq!(
        value(
            m,
            "refusal_gate_attempts_total",
            &[
                c,
                i,
                ("class", "refusal"),
                ("kind", "interface_not_declared")
            ]
        ),
        3.0
    );
    assert_eq!(
        value(
            m,
            "refusal_gate_attempts_total",
            &[c, i, ("class", "ambiguous"), ("kind", "ambiguous")]
        ),
        2.0
    );
    assert_eq!(
        value(m, "refusal_gate_attempts_total", &[c, ("class", "ok")]),
        1.0
    );
    assert_eq!(
        value(
            m,
            "refusal_gate_violations_total",
            &[c, i, ("violation", "retry_after_refusal")]
        ),
        2.0
    );
    assert_eq!(
        value(
            m,
            "refusal_gate_violations_total",
            &[c, i, ("violation", "retry_after_ambiguous")]
        ),
        1.0
    );
    assert_eq!(value(m, "refusal_gate_discovery_reads_total", &[c, i]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_grpc_exporter_spans_are_classified_and_counted() {
    let server = start(CONFIG).await;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{}", server.bound.grpc))
        .build()
        .expect("the exporter builds");
    play_and_flush(provider("sdk-grpc", exporter)).await;
    let m = scrape(&server.bound).await;
    assert_agent_counted(&m, "sdk-grpc");
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_accepted_spans_total",
            &[("transport", "grpc")]
        ),
        8.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_spans_skipped_total",
            &[("reason", "not_client")]
        ),
        2.0
    );
    assert_eq!(value(&m, "refusal_gate_tracker_keys", &[]), 3.0);
    assert!(
        value(
            &m,
            "refusal_gate_batch_duration_seconds_count",
            &[("transport", "grpc")]
        ) >= 1.0
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_http_protobuf_exporter_spans_are_classified_and_counted() {
    let server = start(CONFIG).await;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("http://{}/v1/traces", server.bound.http))
        .build()
        .expect("the exporter builds");
    play_and_flush(provider("sdk-http", exporter)).await;
    let m = scrape(&server.bound).await;
    assert_agent_counted(&m, "sdk-http");
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_accepted_spans_total",
            &[("transport", "http")]
        ),
        8.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    server.shutdown().await;
}

/// A request of one resource with these (attributes, start ms) client spans.
fn request(service: &str, spans: &[(Vec<PbKeyValue>, u64)]) -> ExportTraceServiceRequest {
    let t0 = 1_700_000_000_000_000_000u64;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(PbResource {
                attributes: vec![kv(
                    "service.name",
                    any_value::Value::StringValue(service.into()),
                )],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: spans
                    .iter()
                    .enumerate()
                    .map(|(i, (attributes, ms))| Span {
                        trace_id: vec![9; 16],
                        span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                        name: "call".into(),
                        kind: 3,
                        start_time_unix_nano: t0 + ms * 1_000_000,
                        end_time_unix_nano: t0 + (ms + 20) * 1_000_000,
                        attributes: attributes.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn grpc_call(status: i64) -> Vec<PbKeyValue> {
    use any_value::Value::{IntValue, StringValue};
    vec![
        kv("rpc.system", StringValue("grpc".into())),
        kv("rpc.service", StringValue("pkg.Svc".into())),
        kv("rpc.method", StringValue("Get".into())),
        kv("rpc.grpc.status_code", IntValue(status)),
        kv("server.address", StringValue("grpc.test".into())),
        kv("server.port", IntValue(50051)),
    ]
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(bytes).expect("writing to memory");
    e.finish().expect("finishing in memory")
}

async fn post(url: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = reqwest::Client::new().post(url).body(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.expect("the receiver answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_protobuf_and_json_requests_are_accepted() {
    let server = start(CONFIG).await;
    let url = format!("http://{}/v1/traces", server.bound.http);

    // gzip protobuf: three UNAVAILABLE gRPC calls → transient.
    let body = request(
        "raw-gzip",
        &[
            (grpc_call(14), 0),
            (grpc_call(14), 100),
            (grpc_call(14), 200),
        ],
    );
    let r = post(
        &url,
        gzip(&body.encode_to_vec()),
        &[
            ("content-type", "application/x-protobuf"),
            ("content-encoding", "gzip"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");

    // JSON, OTLP's mapping: hex ids, an integer enum, int64 as a string and as a number.
    let json = r#"{"resourceSpans":[{"resource":{"attributes":[
        {"key":"service.name","value":{"stringValue":"raw-json"}}]},
      "scopeSpans":[{"scope":{"name":"s"},"spans":[
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"GET",
         "kind":3,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":1700000000020000000,
         "attributes":[{"key":"http.request.method","value":{"stringValue":"GET"}},
                       {"key":"url.full","value":{"stringValue":"http://api.test/items"}},
                       {"key":"http.response.status_code","value":{"intValue":"429"}}],
         "status":{"code":2}},
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b175","name":"GET",
         "kind":3,"startTimeUnixNano":"1700000000100000000","endTimeUnixNano":"1700000000120000000",
         "attributes":[{"key":"http.request.method","value":{"stringValue":"GET"}},
                       {"key":"url.full","value":{"stringValue":"http://api.test/items"}},
                       {"key":"http.response.status_code","value":{"intValue":429}}]}
      ]}]}]}"#;
    let r = post(
        &url,
        json.as_bytes().to_vec(),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    // gzip JSON too.
    let again = json.replace("raw-json", "raw-json-gzip");
    let r = post(
        &url,
        gzip(again.as_bytes()),
        &[
            ("content-type", "application/json; charset=utf-8"),
            ("content-encoding", "gzip"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);

    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[
                ("client", "raw-gzip"),
                ("interface", "http://grpc.test:50051"),
                ("class", "transient"),
            ]
        ),
        3.0
    );
    for client in ["raw-json", "raw-json-gzip"] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_attempts_total",
                &[
                    ("client", client),
                    ("interface", "http://api.test"),
                    ("class", "throttled"),
                ]
            ),
            2.0,
            "{client}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_malformed_span_does_not_fail_its_batch() {
    let server = start(CONFIG).await;
    let url = format!("http://{}/v1/traces", server.bound.http);
    let json = r#"{"resourceSpans":[{"resource":{"attributes":[
        {"key":"service.name","value":{"stringValue":"half-bad"}}]},
      "scopeSpans":[{"spans":[
        {"traceId":"not-hex","spanId":"zz","name":"bad","kind":3},
        {"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"GET","kind":3,
         "startTimeUnixNano":"1","endTimeUnixNano":"2",
         "attributes":[{"key":"http.request.method","value":{"stringValue":"GET"}},
                       {"key":"http.response.status_code","value":{"intValue":"200"}}]}]}]}]}"#;
    let r = post(
        &url,
        json.as_bytes().to_vec(),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(r.status(), 200);
    let body: serde_json::Value =
        serde_json::from_slice(&r.bytes().await.expect("a body")).expect("a JSON response");
    assert_eq!(
        body["partialSuccess"]["rejectedSpans"],
        serde_json::json!("1")
    );
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &[("client", "half-bad")]),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_spans_total",
            &[("transport", "http"), ("reason", "malformed_span")]
        ),
        1.0
    );
    server.shutdown().await;
}

/// `google.rpc.Status`, as the error bodies carry it.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_http_input_gets_precise_answers_and_breaks_nothing() {
    let server = start(CONFIG).await;
    let base = format!("http://{}", server.bound.http);
    let url = format!("{base}/v1/traces");
    let pb = ("content-type", "application/x-protobuf");
    let gz = ("content-encoding", "gzip");
    let bomb = gzip(&vec![0u8; 64 << 20]);
    let cases: Vec<(&str, reqwest::RequestBuilder, u16)> = {
        let c = reqwest::Client::new();
        vec![
            (
                "garbage protobuf",
                c.post(&url)
                    .header(pb.0, pb.1)
                    .body(&b"\xff\xff\xff\xff nope"[..]),
                400,
            ),
            (
                "garbage json",
                c.post(&url)
                    .header("content-type", "application/json")
                    .body("{\"resourceSpans\": ["),
                400,
            ),
            (
                "wrong content type",
                c.post(&url)
                    .header("content-type", "text/plain")
                    .body("hello"),
                415,
            ),
            ("no content type", c.post(&url).body("hello"), 415),
            ("wrong method", c.get(&url), 405),
            (
                "metrics signal",
                c.post(format!("{base}/v1/metrics")).header(pb.0, pb.1),
                404,
            ),
            (
                "logs signal",
                c.post(format!("{base}/v1/logs")).header(pb.0, pb.1),
                404,
            ),
            (
                "over the limit",
                c.post(&url).header(pb.0, pb.1).body(vec![0u8; 2 << 20]),
                413,
            ),
            (
                "gzip bomb",
                c.post(&url)
                    .header(pb.0, pb.1)
                    .header(gz.0, gz.1)
                    .body(bomb),
                413,
            ),
            (
                "bad gzip",
                c.post(&url)
                    .header(pb.0, pb.1)
                    .header(gz.0, gz.1)
                    .body(&b"\x1f\x8b nope"[..]),
                400,
            ),
            (
                "brotli",
                c.post(&url)
                    .header(pb.0, pb.1)
                    .header("content-encoding", "br")
                    .body("x"),
                415,
            ),
        ]
    };
    for (label, request, want) in cases {
        let r = request.send().await.expect("the receiver answers");
        assert_eq!(r.status().as_u16(), want, "{label}");
        if want == 400 && label.contains("protobuf") {
            let status =
                RpcStatus::decode(r.bytes().await.expect("a body")).expect("a google.rpc.Status");
            assert_eq!(status.code, 3, "INVALID_ARGUMENT");
            assert!(status.message.contains("malformed"), "{}", status.message);
        }
    }
    let ok = request("after-bad-input", &[(grpc_call(0), 0)]);
    assert_eq!(post(&url, ok.encode_to_vec(), &[pb]).await.status(), 200);
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "after-bad-input")]
        ),
        1.0
    );
    let refused = |reason| {
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", "http"), ("reason", reason)],
        )
    };
    assert_eq!(refused("malformed"), 2.0);
    assert_eq!(refused("unsupported_media_type"), 2.0);
    assert_eq!(refused("too_large"), 2.0);
    assert_eq!(refused("bad_gzip"), 1.0);
    assert_eq!(refused("unsupported_encoding"), 1.0);
    assert!(has_metric(&m, "refusal_gate_tracker_evictions_total"));
    server.shutdown().await;
}

async fn grpc_raw(
    addr: std::net::SocketAddr,
    path: &'static str,
    body: Vec<u8>,
    gzip: bool,
) -> Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect()
        .await
        .expect("the receiver accepts connections");
    let mut client = tonic::client::Grpc::new(channel);
    if gzip {
        client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    client.ready().await.expect("the channel is ready");
    client
        .unary(
            tonic::Request::new(bytes::Bytes::from(body)),
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            refusal_gate::export::RawCodec,
        )
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grpc_input_gets_otlp_status_codes() {
    let server = start(&CONFIG.replace(
        "grpc: { endpoint: 127.0.0.1:0 }",
        "grpc: { endpoint: 127.0.0.1:0, max_recv_msg_size_mib: 1 }",
    ))
    .await;
    let addr = server.bound.grpc;
    use refusal_gate::export::EXPORT_PATH as EXPORT;
    const METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
    const LOGS: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
    let cases: [(&str, &'static str, Vec<u8>, bool, tonic::Code); 5] = [
        (
            "garbage",
            EXPORT,
            b"\xff\xff\xff\xff nope".to_vec(),
            false,
            tonic::Code::InvalidArgument,
        ),
        (
            "too large",
            EXPORT,
            vec![0u8; 2 << 20],
            false,
            tonic::Code::ResourceExhausted,
        ),
        (
            "a gzip bomb",
            EXPORT,
            vec![0u8; 16 << 20],
            true,
            tonic::Code::ResourceExhausted,
        ),
        (
            "metrics",
            METRICS,
            vec![],
            false,
            tonic::Code::Unimplemented,
        ),
        ("logs", LOGS, vec![], false, tonic::Code::Unimplemented),
    ];
    for (label, path, body, gzip, code) in cases {
        let e = grpc_raw(addr, path, body, gzip).await.expect_err(label);
        assert_eq!(e.code(), code, "{label}: {e}");
    }
    // A valid export still works, compressed or not.
    let ok = request("grpc-after-bad", &[(grpc_call(12), 0)]).encode_to_vec();
    grpc_raw(addr, EXPORT, ok.clone(), false)
        .await
        .expect("a valid export");
    let mut again = request("grpc-after-bad-gzip", &[(grpc_call(12), 0)]);
    again.resource_spans[0].scope_spans[0].spans[0].span_id = vec![7; 8];
    grpc_raw(addr, EXPORT, again.encode_to_vec(), true)
        .await
        .expect("a valid gzip export");
    let m = scrape(&server.bound).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "grpc-after-bad"), ("kind", "unverified_refusal")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "grpc-after-bad-gzip")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", "grpc"), ("reason", "malformed")]
        ),
        1.0
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness() {
    let server = start(CONFIG).await;
    for path in ["healthz", "readyz"] {
        let r = reqwest::get(format!("http://{}/{path}", server.bound.admin))
            .await
            .expect("answers");
        assert_eq!(r.status(), 200, "{path}");
    }
    server.shutdown().await;
}

/// zstd both ways in: the Rust SDK's own exporters with zstd compression get through on both
/// receivers, and a zstd bomb is refused as a gzip one is — 413 / `RESOURCE_EXHAUSTED` —
/// having inflated no more than one byte past the limit; a corrupt one is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_is_read_on_both_receivers_and_a_zstd_bomb_is_refused() {
    use opentelemetry_otlp::{WithHttpConfig, WithTonicConfig};
    let server = start(&CONFIG.replace(
        "grpc: { endpoint: 127.0.0.1:0 }",
        "grpc: { endpoint: 127.0.0.1:0, max_recv_msg_size_mib: 1 }",
    ))
    .await;
    let grpc = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{}", server.bound.grpc))
        .with_compression(opentelemetry_otlp::Compression::Zstd)
        .build()
        .expect("the exporter builds");
    assert!(common::sdk_export(grpc, "zstd-grpc").await, "gRPC, zstd");
    let http = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("http://{}/v1/traces", server.bound.http))
        .with_compression(opentelemetry_otlp::Compression::Zstd)
        .build()
        .expect("the exporter builds");
    assert!(common::sdk_export(http, "zstd-http").await, "HTTP, zstd");

    // 64 MiB of zeros, a few KiB compressed: over the HTTP limit once inflated.
    let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).expect("compressed");
    assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
    let url = format!("http://{}/v1/traces", server.bound.http);
    let c = reqwest::Client::new();
    let send = |body: Vec<u8>| {
        c.post(&url)
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "zstd")
            .body(body)
            .send()
    };
    assert_eq!(send(bomb).await.expect("answers").status(), 413);
    assert_eq!(
        send(b"\x28\xb5\x2f\xfd nope".to_vec())
            .await
            .expect("answers")
            .status(),
        400
    );
    // gRPC: 16 MiB of zeros, zstd-compressed by tonic, against a 1 MiB limit.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.bound.grpc))
        .expect("a valid URI")
        .connect()
        .await
        .expect("connects");
    let mut client =
        tonic::client::Grpc::new(channel).send_compressed(tonic::codec::CompressionEncoding::Zstd);
    client.ready().await.expect("ready");
    let e = client
        .unary(
            tonic::Request::new(bytes::Bytes::from(vec![0u8; 16 << 20])),
            tonic::codegen::http::uri::PathAndQuery::from_static(refusal_gate::export::EXPORT_PATH),
            refusal_gate::export::RawCodec,
        )
        .await
        .expect_err("a zstd bomb");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");

    let m = scrape(&server.bound).await;
    for client in ["zstd-grpc", "zstd-http"] {
        assert_eq!(
            value(&m, "refusal_gate_attempts_total", &[("client", client)]),
            1.0,
            "{client}"
        );
    }
    let refused = |reason| {
        value(
            &m,
            "refusal_gate_receiver_refused_requests_total",
            &[("transport", "http"), ("reason", reason)],
        )
    };
    assert_eq!(refused("too_large"), 1.0);
    assert_eq!(refused("bad_zstd"), 1.0);
}
