//! An OTLP sink for the forwarding benchmark: accepts every `POST /v1/traces` (OTLP/HTTP) and,
//! given a second address, every OTLP/gRPC `TraceService/Export`, with an empty
//! `ExportTraceServiceResponse`, and drops them, reading nothing of the spans, so that the
//! next hop costs as little as it can (`benches/e2e.sh` with `FORWARD=gzip|zstd|none`).
//!
//!     cargo run --release --example sink -- 127.0.0.1:4319 [127.0.0.1:4317]
//!
//! It prints nothing while serving and the number of requests and bytes it took (compressed
//! as they came) when it stops (SIGTERM or SIGINT).

use axum::body::Bytes;
use axum::routing::post;
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::http;

/// Requests and bytes taken.
type Counts = Arc<(AtomicU64, AtomicU64)>;

/// The OTLP/gRPC side: reads each request's body whole, as it came, and answers an empty
/// response message, without decompressing or decoding anything.
#[derive(Clone)]
struct GrpcSink(Counts);

impl tonic::server::NamedService for GrpcSink {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl tower_service::Service<http::Request<tonic::body::Body>> for GrpcSink {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let counts = Arc::clone(&self.0);
        Box::pin(async move {
            let taken = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            counts.0.fetch_add(1, Ordering::Relaxed);
            counts.1.fetch_add(taken as u64, Ordering::Relaxed);
            // One uncompressed, empty message, then grpc-status 0 in the trailers.
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let body = http_body_util::StreamBody::new(tokio_stream::iter([
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                Ok(http_body::Frame::trailers(trailers)),
            ]));
            let mut response = http::Response::new(tonic::body::Body::new(body));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok(response)
        })
    }
}

fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4319".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let taken: Counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        if let Some(grpc) = std::env::args().nth(2) {
            let service = GrpcSink(Arc::clone(&taken));
            let grpc = grpc.parse().expect("a socket address");
            tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve(grpc)
                    .await
                    .expect("the gRPC sink serves");
            });
        }
        let counts = Arc::clone(&taken);
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| {
                let counts = Arc::clone(&counts);
                async move {
                    counts.0.fetch_add(1, Ordering::Relaxed);
                    counts.1.fetch_add(body.len() as u64, Ordering::Relaxed);
                    ([("content-type", "application/x-protobuf")], Bytes::new())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .expect("a free address");
        let stop = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
            .expect("the sink serves");
        println!(
            "requests={} bytes={}",
            taken.0.load(Ordering::Relaxed),
            taken.1.load(Ordering::Relaxed)
        );
    });
}
