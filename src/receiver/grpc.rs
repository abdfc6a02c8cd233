//! The OTLP/gRPC receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! Edge. tonic frames, decompresses (gzip, zstd) and limits the message; a codec of our own hands
//! the raw message bytes to [`crate::pipeline::Pipeline::handle`] instead of decoding them
//! with prost, so gRPC and HTTP reach the same reader and one broken span does not fail its
//! request.
//! Every other gRPC service (metrics, logs) is answered `UNIMPLEMENTED` by tonic's router.
//! A request without a valid bearer token (when tokens are configured) is answered
//! `UNAUTHENTICATED`; one whose message would pass `max_reading_mib` of messages still
//! arriving, or that arrived with `max_concurrent_requests` already being handled,
//! `UNAVAILABLE` with a `RetryInfo`; one whose `content-type` is not `application/grpc…`
//! HTTP 415, as the gRPC protocol says; one whose message did not arrive within
//! `read_timeout` `DEADLINE_EXCEEDED` (its bytes freed). A stream reset before its answer is
//! counted abandoned.

use super::{Metered, Pending};
use crate::access::{Grant, Limit, Reading, Tokens};
use crate::export::EXPORT_PATH;
use crate::pipeline::{Encoding, IngestError, Pipeline, Transport};
use crate::serve::{ReadDeadline, MAX_FRAME_BYTES};
use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::{
    Codec, CompressionEncoding, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder,
};
use tonic::codegen::{http, Service};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::Status;

/// The buffer a request's message is read into, at first ([`RawDecoder::buffer_settings`]).
const BUFFER_BYTES: usize = 128 * 1024 - 64;

/// What the buffer a message of `len` bytes was read into keeps allocated, at most (the
/// message is a view of it, [`crate::pipeline::Pipeline::handle_bytes`]): tonic reads it into
/// [`BUFFER_BYTES`] beside the first DATA frame (up to [`MAX_FRAME_BYTES`]) and its 5-byte
/// header, and grows that buffer as a `Vec` (to at least twice its size) when the message does
/// not fit. A compressed message is inflated into a buffer sized from its compressed length,
/// which the receiver does not see: not known (`usize::MAX`), and so copied if kept.
fn allocated(len: usize, compressed: bool) -> usize {
    let beside = len + MAX_FRAME_BYTES as usize + 5;
    if compressed {
        usize::MAX
    } else if beside <= BUFFER_BYTES {
        BUFFER_BYTES
    } else {
        beside.max(2 * BUFFER_BYTES)
    }
}

/// A codec that decodes to the message's raw bytes and encodes prost responses.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

struct RawDecoder;
struct ResponseEncoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }

    /// A request's buffer starts at just under 128 KiB rather than tonic's 8: tonic reserves
    /// a message's whole length on top of what the first DATA frame already put in the buffer
    /// (up to 64 KiB, `serve::MAX_FRAME_BYTES`), so an export of up to some 60 KiB then
    /// arrives without the buffer being grown and copied. Just under: glibc serves 128 KiB
    /// and more from `mmap`, a page fault a page.
    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        tonic::codec::BufferSettings::new(BUFFER_BYTES, 32 * 1024)
    }
}

impl Encoder for ResponseEncoder {
    type Item = ExportTraceServiceResponse;
    type Error = Status;
    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }

    /// A response's buffer starts at 256 bytes rather than tonic's 8 KiB: an answer is
    /// empty, or a partial success of a few dozen bytes, and 8 KiB taken from the allocator
    /// for every request cost about 1 % of the server's time at 1,000 clients, where the
    /// heap is crowded with the keys' histories (the buffer grows if a message needs more).
    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        tonic::codec::BufferSettings::new(256, 256)
    }
}

impl Codec for RawCodec {
    type Encode = ExportTraceServiceResponse;
    type Decode = Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// The `TraceService` as a tower service, for tonic's router.
#[derive(Clone)]
pub struct TraceService {
    pipeline: Arc<Pipeline>,
    max_message_bytes: usize,
    tokens: Arc<Tokens>,
    concurrency: Limit,
    reading: Reading,
}

impl TraceService {
    /// A service that feeds `pipeline`, refusing messages over `max_message_bytes` after
    /// decompression with `RESOURCE_EXHAUSTED`, requests without one of `tokens` with
    /// `UNAUTHENTICATED`, and messages that do not fit in `reading` while they arrive, or
    /// arrive over the `concurrency` limit, with `UNAVAILABLE` and a `RetryInfo`.
    pub fn new(
        pipeline: Arc<Pipeline>,
        max_message_bytes: usize,
        tokens: Arc<Tokens>,
        (concurrency, reading): (Limit, Reading),
    ) -> TraceService {
        TraceService {
            pipeline,
            max_message_bytes,
            tokens,
            concurrency,
            reading,
        }
    }
}

impl NamedService for TraceService {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

/// The export of a message that has arrived, sent with a grant, under the concurrency limit.
struct Export(Arc<Pipeline>, Grant, Limit);

impl UnaryService<Bytes> for Export {
    type Response = ExportTraceServiceResponse;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<Self::Response>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let pipeline = Arc::clone(&self.0);
        let Some(permit) = self.2.try_enter() else {
            let busy = IngestError::Busy {
                retry_after: crate::export::RETRY_HINT,
            };
            pipeline
                .metrics()
                .refused_request(Transport::Grpc, busy.reason());
            return Box::pin(std::future::ready(Err(status(&busy))));
        };
        let compressed = request
            .metadata()
            .get("grpc-encoding")
            .is_some_and(|e| e != "identity");
        let body = request.into_inner();
        let allocated = allocated(body.len(), compressed);
        let grant = self.1.clone();
        Box::pin(async move {
            let answer = export(&pipeline, grant, (body, allocated)).await;
            drop(permit);
            answer
        })
    }
}

/// Runs one request through the shared path; the classification runs inline, with no
/// queue hop. A full export queue answers `UNAVAILABLE` with `RetryInfo`.
async fn export(
    pipeline: &Arc<Pipeline>,
    grant: Grant,
    body: (Bytes, usize),
) -> Result<tonic::Response<ExportTraceServiceResponse>, Status> {
    let sender = (Transport::Grpc, grant);
    let summary = super::handle(pipeline, sender, body, Encoding::Protobuf)
        .await
        .map_err(|e| status(&e))?;
    let rejected = summary.rejected + summary.not_permitted;
    let partial_success = (rejected > 0).then(|| ExportTracePartialSuccess {
        rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
        error_message: super::rejected_message(&summary),
    });
    Ok(tonic::Response::new(ExportTraceServiceResponse {
        partial_success,
    }))
}

/// The gRPC status of an error, with a `RetryInfo` when the sender should retry.
fn status(e: &IngestError) -> Status {
    use tonic_types::{ErrorDetails, StatusExt};
    match e.retry_after() {
        Some(after) => Status::with_error_details(
            e.grpc_code(),
            e.to_string(),
            ErrorDetails::with_retry_info(Some(after)),
        ),
        None => Status::new(e.grpc_code(), e.to_string()),
    }
}

impl<B> Service<http::Request<B>> for TraceService
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let pipeline = Arc::clone(&self.pipeline);
        let limit = self.max_message_bytes;
        let authorization = req.headers().get(http::header::AUTHORIZATION);
        let grant = self
            .tokens
            .grant(authorization.map(http::HeaderValue::as_bytes));
        let (concurrency, reading) = (self.concurrency.clone(), self.reading.clone());
        let grpc_content = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.get(..16)
                    .is_some_and(|p| p.eq_ignore_ascii_case("application/grpc"))
            });
        // Made before the future is first polled: a stream reset at once is counted too.
        let pending = Pending::new(&pipeline, Transport::Grpc);
        Box::pin(async move {
            let answer = answer(
                pipeline,
                req,
                (grant, grpc_content),
                limit,
                (concurrency, reading),
            )
            .await;
            pending.answered();
            Ok(answer)
        })
    }
}

/// The answer to one request on the gRPC port, once what its headers say is known.
async fn answer<B>(
    pipeline: Arc<Pipeline>,
    req: http::Request<B>,
    (grant, grpc_content): (Option<Grant>, bool),
    limit: usize,
    (concurrency, reading): (Limit, Reading),
) -> http::Response<tonic::body::Body>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    if !grpc_content {
        // Not gRPC at all: as the gRPC protocol says, HTTP 415, no gRPC status.
        pipeline
            .metrics()
            .refused_request(Transport::Grpc, "unsupported_media_type");
        let mut response = http::Response::new(tonic::body::Body::empty());
        *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return response;
    }
    if req.uri().path() != EXPORT_PATH {
        return Status::unimplemented("only TraceService/Export is served").into_http();
    }
    let Some(grant) = grant else {
        return refuse(&pipeline, &IngestError::Unauthenticated);
    };
    let mut accept = EnabledCompressionEncodings::default();
    accept.enable(CompressionEncoding::Gzip);
    accept.enable(CompressionEncoding::Zstd);
    let mut grpc = Grpc::new(RawCodec)
        .apply_compression_config(accept, EnabledCompressionEncodings::default())
        .apply_max_message_size_config(Some(limit), None);
    let metrics = Arc::clone(&pipeline);
    let deadline = req.extensions().get::<ReadDeadline>().copied();
    // The message's bytes are charged while they arrive; the concurrency slot is taken by
    // `Export` once it has.
    let req = req.map(|body| Metered::new(body, &reading));
    let ending = req.body().ending();
    let mut response = grpc.unary(Export(pipeline, grant, concurrency), req).await;
    let status = response.headers().get("grpc-status").cloned();
    let failed = status.as_ref().is_some_and(|s| s != "0");
    if failed && ending.full() {
        let e = IngestError::ReadingFull {
            retry_after: crate::export::RETRY_HINT,
        };
        return refuse(&metrics, &e);
    }
    if let Some(d) = deadline.filter(|d| failed && d.passed()) {
        // The message did not arrive in time: say so, rather than the read error.
        return refuse(&metrics, &IngestError::ReadTimeout { after: d.timeout() });
    }
    if failed && ending.broken() {
        // Reset by its client: no one reads the answer.
        metrics.metrics().abandoned_request(Transport::Grpc);
        return response;
    }
    // tonic refuses a message over the limit with OUT_OF_RANGE (or, inflated past it,
    // RESOURCE_EXHAUSTED); OTLP asks for RESOURCE_EXHAUSTED. The export itself never answers
    // OUT_OF_RANGE, so every one is tonic's size check.
    let out_of_range = status.as_ref().is_some_and(|s| s == "11");
    if out_of_range {
        response
            .headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    if out_of_range || status.as_ref().is_some_and(|s| s == "8") {
        metrics
            .metrics()
            .refused_request(Transport::Grpc, "too_large");
    }
    response
}

/// Counts a request refused for `e` and answers it.
fn refuse(pipeline: &Pipeline, e: &IngestError) -> http::Response<tonic::body::Body> {
    pipeline
        .metrics()
        .refused_request(Transport::Grpc, e.reason());
    status(e).into_http()
}

#[cfg(test)]
mod tests {
    use super::{allocated, BUFFER_BYTES, MAX_FRAME_BYTES};

    #[test]
    fn a_message_keeps_the_buffer_it_was_read_into_grown_as_tonic_grows_it() {
        let frame = MAX_FRAME_BYTES as usize + 5;
        // Beside the first frame in the first buffer.
        assert_eq!(allocated(0, false), BUFFER_BYTES);
        assert_eq!(allocated(BUFFER_BYTES - frame, false), BUFFER_BYTES);
        // One byte more: the buffer doubled, or grown to the message and its frame.
        assert_eq!(allocated(BUFFER_BYTES - frame + 1, false), 2 * BUFFER_BYTES);
        assert_eq!(allocated(4 * BUFFER_BYTES, false), 4 * BUFFER_BYTES + frame);
        // Inflated into a buffer sized from a length the receiver does not see.
        assert_eq!(allocated(10, true), usize::MAX);
    }
}
