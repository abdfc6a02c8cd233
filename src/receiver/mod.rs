//! The receivers: OTLP/gRPC ([`grpc`]) and OTLP/HTTP ([`http`]), each an edge that turns its
//! transport's request into bytes for [`crate::pipeline::Pipeline::handle`] and the
//! pipeline's answer (or [`crate::pipeline::IngestError`]) into its transport's response.
//!
//! Edges only: sockets, codecs, limits and auth; no span is read here.

pub mod grpc;
pub mod http;

use crate::pipeline::{Encoding, IngestError, Pipeline, Summary, Transport};
use bytes::Bytes;
use std::sync::Arc;

/// Bodies this large or larger are handled on the blocking pool: decoding a large one (JSON
/// above all) must not hold an async worker that `/healthz` and other requests need.
pub const OFF_WORKER_BYTES: usize = 1 << 20;

/// Runs one request's body through the pipeline at the clock's now: inline when it is small,
/// on the blocking pool when it is [`OFF_WORKER_BYTES`] or more. `allocated` is what the
/// buffer `body` is a view of keeps allocated ([`Pipeline::handle_bytes`]).
///
/// # Errors
/// What [`Pipeline::handle`] refused.
pub async fn handle(
    pipeline: &Arc<Pipeline>,
    transport: Transport,
    (body, allocated): (Bytes, usize),
    encoding: Encoding,
) -> Result<Summary, IngestError> {
    if body.len() < OFF_WORKER_BYTES {
        let now = crate::clock::now();
        return pipeline.handle_bytes(transport, (&body, allocated), encoding, now);
    }
    let pipeline = Arc::clone(pipeline);
    tokio::task::spawn_blocking(move || {
        pipeline.handle_bytes(transport, (&body, allocated), encoding, crate::clock::now())
    })
    .await
    .unwrap_or_else(|e| {
        // A panic in the pipeline: the request is refused as malformed, the process goes on.
        Err(IngestError::Malformed {
            encoding: "protobuf",
            detail: format!("the request could not be handled: {e}"),
        })
    })
}
