//! An OTLP/HTTP sink for the forwarding benchmark: accepts every `POST /v1/traces` with an
//! empty `ExportTraceServiceResponse` and drops it, reading nothing of the spans, so that the
//! next hop costs as little as it can (`benches/e2e.sh` with `FORWARD=gzip|zstd|none`).
//!
//!     cargo run --release --example sink -- 127.0.0.1:4319
//!
//! It prints nothing while serving and the number of requests and bytes it took when it
//! stops (SIGTERM or SIGINT).

use axum::body::Bytes;
use axum::routing::post;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4319".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let taken = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
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
