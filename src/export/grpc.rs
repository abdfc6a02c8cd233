//! The OTLP/gRPC sender: a batch framed as one gRPC message here (not by tonic's client, so
//! that it is compressed by the kept [`super::Packer`]), its answer read within bounds and
//! mapped to retry, split or final; and the raw codec the load generator and the tests put
//! arbitrary bytes on the wire with.
//!
//! Edge.

use super::client::{partial, Batch, Packer, Parts, MAX_ANSWER, USER_AGENT};
use super::Sent;
use crate::config::OtlpExporterConfig;
use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use std::time::Duration;

/// The gRPC path of `TraceService/Export`.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// A gRPC client codec for `TraceService/Export` that sends an already-encoded request as
/// it is and decodes the response: what the exporter forwards with, and what the load
/// generator and the tests put arbitrary bytes on the wire with.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;
/// [`RawCodec`]'s encoder: the bytes as they are.
pub struct RawEncoder;
/// [`RawCodec`]'s decoder: an `ExportTraceServiceResponse`.
pub struct ResponseDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        ExportTraceServiceResponse::decode(bytes)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

/// Sends a batch as one gRPC message, framed here rather than by tonic's client so that it
/// is compressed by the [`Packer`] (tonic's own compression is gzip at level 6 and zstd at
/// level 3, made afresh for every message: twice the CPU of everything else forwarding does).
pub(super) async fn send_grpc(
    channel: &tonic::transport::Channel,
    packer: &mut Packer,
    config: &OtlpExporterConfig,
    batch: Batch,
) -> Sent {
    use tonic::codegen::http::{header, HeaderName, HeaderValue, Method, Request};
    use tonic::Code;
    use tonic_types::StatusExt;
    let (compressed, mut parts) = match packer.encoding() {
        None => (false, batch),
        Some(_) => match packer.pack(&batch) {
            Ok(packed) => (true, vec![Bytes::from(packed)]),
            Err(_) => return Sent::Final("compressing the batch failed".to_owned()),
        },
    };
    let length: usize = parts.iter().map(Bytes::len).sum();
    let Ok(length) = u32::try_from(length) else {
        return Sent::TooLarge(format!("a gRPC message of {length} bytes"));
    };
    let mut prefix = [u8::from(compressed), 0, 0, 0, 0];
    prefix[1..].copy_from_slice(&length.to_be_bytes());
    parts.insert(0, Bytes::copy_from_slice(&prefix));
    let mut request = Request::new(tonic::body::Body::new(Parts::new(parts)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = tonic::codegen::http::Uri::from_static(EXPORT_PATH);
    let headers = request.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    if let Ok(timeout) = HeaderValue::try_from(grpc_timeout(config.timeout)) {
        headers.insert("grpc-timeout", timeout);
    }
    if let Some(encoding) = packer.encoding() {
        headers.insert("grpc-encoding", HeaderValue::from_static(encoding));
    }
    for (k, v) in &config.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            HeaderValue::try_from(v.as_str()),
        ) {
            headers.insert(k, v);
        }
    }
    let call = async {
        let mut channel = channel.clone();
        std::future::poll_fn(|cx| tower_service::Service::poll_ready(&mut channel, cx))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let response = tower_service::Service::call(&mut channel, request)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        grpc_answer(response).await
    };
    let status = match tokio::time::timeout(config.timeout, call).await {
        Err(_) => return Sent::Retry(format!("timed out after {:?}", config.timeout), None),
        Ok(Ok(response)) => return partial(&response),
        Ok(Err(status)) => status,
    };
    let hint = status.get_details_retry_info().and_then(|r| r.retry_delay);
    let why = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::DataLoss
        | Code::Cancelled => Sent::Retry(why, hint),
        Code::ResourceExhausted if hint.is_some() => Sent::Retry(why, hint),
        Code::ResourceExhausted => Sent::TooLarge(why),
        _ => Sent::Final(why),
    }
}

/// A `grpc-timeout` header value: milliseconds, or seconds past what eight digits hold.
pub(super) fn grpc_timeout(timeout: Duration) -> String {
    match timeout.as_millis() {
        ms @ 0..=99_999_999 => format!("{ms}m"),
        _ => format!("{}S", timeout.as_secs().min(99_999_999)),
    }
}

/// Reads a gRPC answer: the status from the headers (a trailers-only answer) or from the
/// trailers after the message; an HTTP failure mapped to its gRPC code as gRPC's
/// HTTP-to-gRPC mapping says.
pub(super) async fn grpc_answer(
    response: tonic::codegen::http::Response<tonic::body::Body>,
) -> Result<ExportTraceServiceResponse, tonic::Status> {
    use http_body_util::BodyExt;
    use tonic::{Code, Status};
    let (head, body) = response.into_parts();
    if head.status != tonic::codegen::http::StatusCode::OK {
        let code = match head.status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        };
        return Err(Status::new(code, format!("HTTP {}", head.status)));
    }
    if let Some(status) = Status::from_header_map(&head.headers) {
        // Trailers-only: no message.
        return match status.code() {
            Code::Ok => Ok(ExportTraceServiceResponse::default()),
            _ => Err(status),
        };
    }
    let whole = http_body_util::Limited::new(body, MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                // The spans were taken; an answer this large is the next hop's fault, and
                // sending them again would not change it.
                Status::internal(format!("the answer is larger than {MAX_ANSWER} bytes"))
            } else {
                Status::unavailable(e.to_string())
            }
        })?;
    match whole.trailers().and_then(Status::from_header_map) {
        Some(status) if status.code() == Code::Ok => {}
        Some(status) => return Err(status),
        None => return Err(Status::internal("the answer carries no grpc-status")),
    }
    // One uncompressed message (no grpc-accept-encoding was offered): flag, length, bytes.
    let message = whole.to_bytes();
    Ok(message
        .get(5..)
        .and_then(|m| ExportTraceServiceResponse::decode(m).ok())
        .unwrap_or_default())
}
