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
    use tonic::Code;
    use tonic_types::StatusExt;
    let call = Unary {
        path: EXPORT_PATH,
        headers: &config.headers,
        timeout: config.timeout,
    };
    let status = match call.send(channel, packer, batch).await {
        Ok(answer) => {
            // One uncompressed message (no grpc-accept-encoding was offered).
            let response = ExportTraceServiceResponse::decode(answer).unwrap_or_default();
            return partial(&response);
        }
        Err(Refused::TooLarge(why)) => return Sent::TooLarge(why),
        Err(Refused::Final(why)) => return Sent::Final(why),
        Err(Refused::TimedOut) => {
            return Sent::Retry(format!("timed out after {:?}", config.timeout), None)
        }
        Err(Refused::Status(status)) => status,
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

/// One unary gRPC call, framed and read here rather than by tonic's client: its message
/// compressed by a kept [`Packer`], its answer read within [`MAX_ANSWER`] bytes (tonic's
/// client reads every message a server sends after the answer, looking for its trailers: an
/// endless stream of them keeps the task busy where no timeout can stop it), and the whole
/// within `timeout`. What the exporter forwards with, and the OTLP metrics push.
pub(crate) struct Unary<'a> {
    /// The method's path.
    pub path: &'static str,
    /// Headers (gRPC metadata) sent with it.
    pub headers: &'a std::collections::BTreeMap<String, String>,
    /// How long the whole call may take.
    pub timeout: Duration,
}

/// Why a [`Unary`] call has no answer.
pub(crate) enum Refused {
    /// The message is too large to frame.
    TooLarge(String),
    /// It could not be sent as it is (compression failed).
    Final(String),
    /// No answer within the timeout.
    TimedOut,
    /// The server's status (or the transport's, as gRPC maps it).
    Status(tonic::Status),
}

impl Unary<'_> {
    /// Sends `message` (an encoded request, in parts) over `channel`; returns the answer's
    /// message bytes (empty for a trailers-only answer).
    pub(crate) async fn send(
        &self,
        channel: &tonic::transport::Channel,
        packer: &mut Packer,
        message: Batch,
    ) -> Result<Bytes, Refused> {
        use tonic::codegen::http::{header, HeaderName, HeaderValue, Method, Request};
        let (compressed, mut parts) = match packer.encoding() {
            None => (false, message),
            Some(_) => match packer.pack(&message) {
                Ok(packed) => (true, vec![Bytes::from(packed)]),
                Err(_) => return Err(Refused::Final("compressing the message failed".into())),
            },
        };
        let length: usize = parts.iter().map(Bytes::len).sum();
        let Ok(length) = u32::try_from(length) else {
            return Err(Refused::TooLarge(format!(
                "a gRPC message of {length} bytes"
            )));
        };
        let mut prefix = [u8::from(compressed), 0, 0, 0, 0];
        prefix[1..].copy_from_slice(&length.to_be_bytes());
        parts.insert(0, Bytes::copy_from_slice(&prefix));
        let mut request = Request::new(tonic::body::Body::new(Parts::new(parts)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = tonic::codegen::http::Uri::from_static(self.path);
        let headers = request.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        if let Ok(timeout) = HeaderValue::try_from(grpc_timeout(self.timeout)) {
            headers.insert("grpc-timeout", timeout);
        }
        if let Some(encoding) = packer.encoding() {
            headers.insert("grpc-encoding", HeaderValue::from_static(encoding));
        }
        for (k, v) in self.headers {
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
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(Refused::TimedOut),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(status)) => Err(Refused::Status(status)),
        }
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
/// HTTP-to-gRPC mapping says. Returns the answer's message bytes (empty when there is none).
pub(super) async fn grpc_answer(
    response: tonic::codegen::http::Response<tonic::body::Body>,
) -> Result<Bytes, tonic::Status> {
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
            Code::Ok => Ok(Bytes::new()),
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
    // One message: flag, length, bytes.
    let message = whole.to_bytes();
    Ok(if message.len() > 5 {
        message.slice(5..)
    } else {
        Bytes::new()
    })
}
