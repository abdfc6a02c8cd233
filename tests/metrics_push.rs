//! The OTLP metrics exporter (`exporters.otlp_metrics`) against test receivers that decode the
//! real `ExportMetricsServiceRequest`, one over OTLP/gRPC (gzip) and one over OTLP/HTTP
//! (zstd): after a prober's retries, the pushes carry its violation counter as a monotonic
//! cumulative sum equal to `/metrics`' and with its labels as attributes, the violating call's
//! trace as the point's exemplar. With the receiver down for a while, ingest goes on, the
//! failed pushes and their retries are counted, and once it is up the counts arrive whole.

mod common;

use axum::body::Bytes;
use axum::http::HeaderMap;
use common::{export, free_port, http_span, scrape, send, start, value, CONFIG};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, AggregationTemporality,
};
use prost::Message;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The requests a receiver was sent.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<ExportMetricsServiceRequest>>>);

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .expect("not poisoned")
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// A point of a sum as the receiver saw it.
#[derive(Debug, Clone, PartialEq)]
struct SumPoint {
    attributes: BTreeMap<String, String>,
    value: f64,
    monotonic: bool,
    cumulative: bool,
    exemplar_traces: Vec<Vec<u8>>,
}

impl Received {
    fn pushes(&self) -> usize {
        self.0.lock().expect("not poisoned").len()
    }

    /// The points of the sum `name` in the latest push, and the pushes' resources'
    /// `service.name`s.
    fn latest(&self, name: &str) -> (Vec<SumPoint>, Vec<String>) {
        let requests = self.0.lock().expect("not poisoned");
        let Some(request) = requests.last() else {
            return (Vec::new(), Vec::new());
        };
        let mut points = Vec::new();
        let mut services = Vec::new();
        for rm in &request.resource_metrics {
            for kv in rm.resource.iter().flat_map(|r| &r.attributes) {
                if let (true, Some(Value::StringValue(s))) = (
                    kv.key == "service.name",
                    kv.value.as_ref().and_then(|v| v.value.as_ref()),
                ) {
                    services.push(s.clone());
                }
            }
            for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
                let Some(Data::Sum(sum)) = (m.name == name).then_some(m.data.as_ref()).flatten()
                else {
                    continue;
                };
                for p in &sum.data_points {
                    points.push(SumPoint {
                        attributes: p
                            .attributes
                            .iter()
                            .map(|kv| {
                                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                    Some(Value::StringValue(s)) => s.clone(),
                                    other => format!("{other:?}"),
                                };
                                (kv.key.clone(), v)
                            })
                            .collect(),
                        value: match p.value {
                            Some(number_data_point::Value::AsDouble(v)) => v,
                            Some(number_data_point::Value::AsInt(v)) => v as f64,
                            None => f64::NAN,
                        },
                        monotonic: sum.is_monotonic,
                        cumulative: sum.aggregation_temporality
                            == AggregationTemporality::Cumulative as i32,
                        exemplar_traces: p.exemplars.iter().map(|e| e.trace_id.clone()).collect(),
                    });
                }
            }
        }
        (points, services)
    }
}

/// Serves a gRPC metrics receiver on `listener` (gzip and zstd accepted, as a Collector does).
fn serve_grpc(received: impl MetricsService, listener: tokio::net::TcpListener) {
    let service = MetricsServiceServer::new(received)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Zstd);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });
}

/// Serves an OTLP/HTTP receiver of `POST /v1/metrics` (protobuf; gzip or zstd).
async fn serve_http(received: Received) -> SocketAddr {
    let app = axum::Router::new().route(
        "/v1/metrics",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let received = received.clone();
            async move {
                let encoding = headers
                    .get("content-encoding")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let body = match encoding {
                    "zstd" => zstd::decode_all(&body[..]).expect("zstd"),
                    "gzip" => {
                        use std::io::Read;
                        let mut out = Vec::new();
                        flate2::read::GzDecoder::new(&body[..])
                            .read_to_end(&mut out)
                            .expect("gzip");
                        out
                    }
                    _ => body.to_vec(),
                };
                assert_eq!(
                    headers.get("content-type").and_then(|v| v.to_str().ok()),
                    Some("application/x-protobuf")
                );
                let request = ExportMetricsServiceRequest::decode(&body[..]).expect("protobuf");
                received.0.lock().expect("not poisoned").push(request);
                ExportMetricsServiceResponse::default().encode_to_vec()
            }
        }),
    );
    common::serve_http(app).await
}

/// The storm of `tests/prometheus.rs`: a discovery read, then 5 refused calls to an
/// undeclared path (4 retries after the refusal), call `i` in trace `[0x20 + i; 16]`.
fn storm(service: &str) -> Vec<u8> {
    let mut spans = vec![http_span(
        0,
        "GET",
        "http://mcp.test:8080/.well-known/mcp.json",
        200,
    )];
    spans.extend((1..=5).map(|i| {
        let mut span = http_span(i, "POST", "http://mcp.test:8080/mcp/sse", 404);
        span.trace_id = vec![0x20 + i as u8; 16];
        span
    }));
    export(service, spans)
}

const RETRIES: &str = "refusal_gate_violations_total";

/// Waits until the receiver has `at_least` pushes and the latest carries the prober's
/// violation counter at `/metrics`' value; returns that point.
async fn wait_for_counter(
    server: &refusal_gate::app::Server,
    received: &Received,
    at_least: usize,
) -> SumPoint {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(&server.bound).await;
        let scraped = value(
            &text,
            RETRIES,
            &[("client", "pusher"), ("violation", "retry_after_refusal")],
        );
        let (points, services) = received.latest(RETRIES);
        let pushed = points
            .iter()
            .find(|p| p.attributes.get("client").map(String::as_str) == Some("pusher"))
            .cloned();
        if let Some(p) = pushed.filter(|p| received.pushes() >= at_least && p.value == scraped) {
            assert_eq!(services, ["refusal-gate"], "the resource's service.name");
            assert_eq!(scraped, 4.0, "the prober's 4 retries");
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "no push with the counter: {} pushes, /metrics says {scraped}, the latest push {:?}",
            received.pushes(),
            received.latest(RETRIES).0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn config(endpoint: &str, protocol: &str, compression: &str, interval: &str) -> String {
    format!(
        "{CONFIG}exporters:\n  otlp_metrics: {{ endpoint: \"{endpoint}\", protocol: {protocol}, compression: {compression}, interval: {interval}, timeout: 2s }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_reach_an_otlp_grpc_and_an_otlp_http_receiver_with_the_counters_of_metrics() {
    let grpc = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let grpc_addr = listener.local_addr().expect("an address");
    serve_grpc(grpc.clone(), listener);
    let http = Received::default();
    let http_addr = serve_http(http.clone()).await;
    for (received, endpoint, protocol, compression) in [
        (&grpc, format!("http://{grpc_addr}"), "grpc", "gzip"),
        (
            &http,
            format!("http://{http_addr}"),
            "http/protobuf",
            "zstd",
        ),
    ] {
        let server = start(&config(&endpoint, protocol, compression, "200ms")).await;
        send(&server.bound, storm("pusher")).await;
        let before = received.pushes();
        let point = wait_for_counter(&server, received, before + 2).await;
        assert!(point.monotonic && point.cumulative, "{protocol}: {point:?}");
        assert_eq!(
            point.attributes,
            BTreeMap::from([
                ("client".to_owned(), "pusher".to_owned()),
                ("interface".to_owned(), "weather-mcp".to_owned()),
                ("violation".to_owned(), "retry_after_refusal".to_owned()),
            ]),
            "{protocol}: the labels of /metrics as attributes"
        );
        assert_eq!(
            point.exemplar_traces,
            vec![vec![0x25; 16]],
            "{protocol}: the latest violating call's trace"
        );
        let text = scrape(&server.bound).await;
        assert!(
            value(
                &text,
                "refusal_gate_exporter_metric_pushes_total",
                &[("outcome", "sent")]
            ) >= 2.0,
            "{protocol}: the pushes are counted"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_a_while_blocks_nothing_and_then_gets_the_counts_whole() {
    let port = free_port();
    let server = start(&config(
        &format!("http://127.0.0.1:{port}"),
        "grpc",
        "gzip",
        "2s",
    ))
    .await;
    // Nothing listens: ingest goes on all the same.
    send(&server.bound, storm("pusher")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(&server.bound).await;
        let count = |outcome| {
            value(
                &text,
                "refusal_gate_exporter_metric_pushes_total",
                &[("outcome", outcome)],
            )
        };
        if count("failed") >= 1.0 && count("retried") >= 1.0 {
            assert_eq!(count("sent"), 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "failures counted: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    send(&server.bound, storm("pusher")).await;

    // The receiver comes up on that port: the next push carries every count.
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port is still free");
    serve_grpc(received.clone(), listener);
    let point = wait_for_counter(&server, &received, 1).await;
    assert_eq!(point.value, 4.0, "the same spans again count nothing more");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_never_followed_nor_counted_as_sent() {
    use axum::http::{header, StatusCode};
    // What a redirect would reach: a URL that answers GET (and anything else) 200.
    let reached = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = reached.clone();
    let elsewhere = common::serve_http(axum::Router::new().fallback(
        move |method: axum::http::Method| {
            let seen = seen.clone();
            async move {
                seen.lock().expect("not poisoned").push(method.to_string());
                StatusCode::OK
            }
        },
    ))
    .await;
    let target = format!("http://{elsewhere}/v1/metrics");
    let redirects: [(&str, axum::Router); 2] = [
        (
            "301 without Location",
            axum::Router::new().fallback(|| async { StatusCode::MOVED_PERMANENTLY }),
        ),
        (
            "302 to a URL that answers GET 200",
            axum::Router::new().fallback(move || {
                let target = target.clone();
                async move { (StatusCode::FOUND, [(header::LOCATION, target)]) }
            }),
        ),
    ];
    for (what, router) in redirects {
        let receiver = common::serve_http(router).await;
        let endpoint = format!("http://{receiver}");
        let server = start(&format!(
            "{}  otlp: {{ endpoint: \"{endpoint}\", protocol: http/protobuf }}\n",
            config(&endpoint, "http/protobuf", "none", "200ms")
        ))
        .await;
        send(
            &server.bound,
            export("agent", vec![http_span(1, "GET", "http://api.test/x", 200)]),
        )
        .await;
        // Pushes every 200 ms, and the span forwarded: some answers come.
        let deadline = Instant::now() + Duration::from_secs(20);
        let text = loop {
            let text = scrape(&server.bound).await;
            let failed = value(
                &text,
                "refusal_gate_exporter_metric_pushes_total",
                &[("outcome", "failed")],
            );
            let spans = value(
                &text,
                "refusal_gate_exporter_failed_spans_total",
                &[("reason", "refused")],
            );
            if failed >= 3.0 && spans >= 1.0 {
                break text;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no failed push and span: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(
            value(
                &text,
                "refusal_gate_exporter_metric_pushes_total",
                &[("outcome", "sent")]
            ),
            0.0,
            "{what}: no push counted sent"
        );
        assert_eq!(
            value(&text, "refusal_gate_exporter_sent_spans_total", &[]),
            0.0,
            "{what}: no span counted sent"
        );
    }
    assert_eq!(
        *reached.lock().expect("not poisoned"),
        Vec::<String>::new(),
        "no redirect followed"
    );
}

/// A gRPC metrics receiver that sheds every push: `RESOURCE_EXHAUSTED` with a `RetryInfo` of
/// 20 s. Counts the calls.
#[derive(Clone, Default)]
struct Shedding(Arc<Mutex<usize>>);

#[tonic::async_trait]
impl MetricsService for Shedding {
    async fn export(
        &self,
        _: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        use tonic_types::{ErrorDetails, StatusExt};
        *self.0.lock().expect("not poisoned") += 1;
        Err(tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "shedding load",
            ErrorDetails::with_retry_info(Some(Duration::from_secs(20))),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_receivers_retry_info_is_honoured() {
    let shedding = Shedding::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    serve_grpc(shedding.clone(), listener);
    let server = start(&config(&format!("http://{addr}"), "grpc", "none", "3s")).await;
    // Three pushes due (at 3, 6 and 9 s): each asked to wait 20 s, past the next push, so
    // each is given up at once, never retried sooner.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let calls = *shedding.0.lock().expect("not poisoned");
    let text = scrape(&server.bound).await;
    let retried = value(
        &text,
        "refusal_gate_exporter_metric_pushes_total",
        &[("outcome", "retried")],
    );
    assert_eq!(retried, 0.0, "no retry sooner than the receiver asked");
    assert!((1..=3).contains(&calls), "{calls} calls in 10.5 s");
}
