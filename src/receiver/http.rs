//! The OTLP/HTTP receiver: `POST /v1/traces`, protobuf or JSON, gzip, zstd or neither.
//!
//! Edge. It checks method, media type and encoding, reads the body up to the limit (and
//! inflates gzip up to the same limit, so a small bomb never grows past it in memory), and
//! hands the bytes to [`crate::pipeline::Pipeline::handle`]. Before any of that, a request without a valid
//! bearer token (when tokens are configured) is answered 401. A body is charged to
//! `max_reading_mib` as it arrives and the concurrency slot taken once it has: a body that
//! does not fit, or one that arrived with `max_concurrent_requests` being handled, is
//! answered 503 with `Retry-After`. A request dropped before its answer (its connection
//! closed) is counted abandoned. An oversized body is refused with 413 after the
//! rest of it is read and discarded (bounded), so the client reads the answer instead of a
//! broken connection it would retry. Answers follow OTLP/HTTP: 200 with an
//! `ExportTraceServiceResponse` in the request's encoding; 400, 413 or 415 with a
//! `google.rpc.Status` body; 408 (and the connection closed) for a body that did not arrive
//! within `read_timeout`, which frees what it held; 405 for other methods; 404 for
//! other signals and paths.

use crate::access::{Limit, Reading, Tokens};
use crate::pipeline::{Encoding, IngestError, Pipeline, Transport};
use crate::serve::ReadDeadline;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use std::io::Read;
use std::sync::Arc;

/// `google.rpc.Status`, the body of an OTLP/HTTP error: two fields are all OTLP asks for.
#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[derive(Clone)]
struct Receiver {
    pipeline: Arc<Pipeline>,
    limit: usize,
    tokens: Arc<Tokens>,
    concurrency: Limit,
    reading: Reading,
}

/// The router of the OTLP/HTTP receiver. `limit` is the largest body, in bytes, both as
/// sent and after inflation; `tokens` who may send; `concurrency` how many are handled at
/// once and `reading` how many bytes of bodies may be arriving.
pub fn router(
    pipeline: Arc<Pipeline>,
    limit: usize,
    tokens: Arc<Tokens>,
    (concurrency, reading): (Limit, Reading),
) -> Router {
    Router::new()
        .route("/v1/traces", post(traces))
        .fallback(|| async { (StatusCode::NOT_FOUND, "only /v1/traces is served\n") })
        .with_state(Receiver {
            pipeline,
            limit,
            tokens,
            concurrency,
            reading,
        })
}

async fn traces(State(rx): State<Receiver>, request: Request) -> Response {
    let pending = super::Pending::new(&rx.pipeline, Transport::Http);
    let response = answer(&rx, request).await;
    pending.answered();
    response
}

async fn answer(rx: &Receiver, request: Request) -> Response {
    let media = media_type(request.headers());
    // Errors are answered in the request's encoding when it has a known one.
    let answer_in = *media.as_ref().unwrap_or(&Encoding::Protobuf);
    let authorization = request.headers().get(header::AUTHORIZATION);
    let Some(grant) = rx.tokens.grant(authorization.map(HeaderValue::as_bytes)) else {
        drain(request.into_body(), rx.limit).await;
        let mut response = refuse(rx, answer_in, &IngestError::Unauthenticated);
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    };
    let encoding = match media {
        Ok(e) => e,
        Err(e) => return refuse(rx, Encoding::Protobuf, &e),
    };
    let body = match read_body(request, rx.limit, &rx.reading).await {
        Ok(body) => body,
        Err(e @ IngestError::BrokenOff) => {
            rx.pipeline.metrics().abandoned_request(Transport::Http);
            return answer_error(encoding, &e);
        }
        Err(e) => return refuse(rx, encoding, &e),
    };
    // Held until the answer is built, from the moment the body is here.
    let Some(_permit) = rx.concurrency.try_enter() else {
        let busy = IngestError::Busy {
            retry_after: crate::export::RETRY_HINT,
        };
        return refuse(rx, encoding, &busy);
    };
    let sender = (Transport::Http, grant);
    let summary = match super::handle(&rx.pipeline, sender, body, encoding).await {
        Ok(summary) => summary,
        // `handle` counted it already.
        Err(e) => return answer_error(encoding, &e),
    };
    let rejected = summary.rejected + summary.not_permitted;
    let body = match encoding {
        Encoding::Protobuf => ExportTraceServiceResponse {
            partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
                error_message: super::rejected_message(&summary),
            }),
        }
        .encode_to_vec(),
        // Written by hand: proto3's JSON mapping puts int64 in a string, which the
        // generated serde code does not.
        Encoding::Json if rejected > 0 => serde_json::json!({
            "partialSuccess": {
                "rejectedSpans": rejected.to_string(),
                "errorMessage": super::rejected_message(&summary),
            }
        })
        .to_string()
        .into_bytes(),
        Encoding::Json => b"{}".to_vec(),
    };
    respond(StatusCode::OK, encoding, body)
}

fn media_type(headers: &HeaderMap) -> Result<Encoding, IngestError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = value.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/x-protobuf") {
        Ok(Encoding::Protobuf)
    } else if essence.eq_ignore_ascii_case("application/json") {
        Ok(Encoding::Json)
    } else {
        Err(IngestError::UnsupportedMediaType(value.to_owned()))
    }
}

/// A body's `Content-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compressed {
    No,
    Gzip,
    Zstd,
}

/// Reads the body within `limit`, its bytes charged to `reading` while it arrives, inflating
/// gzip or zstd within the same limit; with what its buffer keeps allocated.
async fn read_body(
    request: Request,
    limit: usize,
    reading: &Reading,
) -> Result<(Bytes, usize), IngestError> {
    let compressed = match request
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => Compressed::No,
        Some(e) if e.is_empty() || e == "identity" => Compressed::No,
        Some(e) if e == "gzip" => Compressed::Gzip,
        Some(e) if e == "zstd" => Compressed::Zstd,
        Some(e) => return Err(IngestError::UnsupportedEncoding(e)),
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let deadline = request.extensions().get::<ReadDeadline>().copied();
    let mut body = request.into_body();
    if declared.is_some_and(|n| n > limit) {
        // Refused without buffering; the rest is read and thrown away (up to a bound) so
        // that the client, still writing, reads a 413 rather than a broken connection — an
        // SDK would retry a broken connection, and a 413 is final.
        drain(body, limit).await;
        return Err(IngestError::TooLarge { limit });
    }
    let mut collected = BytesMut::new();
    let mut share = reading.share();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| match deadline.filter(ReadDeadline::passed) {
            Some(d) => IngestError::ReadTimeout { after: d.timeout() },
            None => IngestError::BrokenOff,
        })?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                drain(body, limit).await;
                return Err(IngestError::TooLarge { limit });
            }
            if !share.take(data.len()) {
                drop(collected);
                drain(body, limit).await;
                return Err(IngestError::ReadingFull {
                    retry_after: crate::export::RETRY_HINT,
                });
            }
            collected.extend_from_slice(&data);
        }
    }
    drop(share);
    let allocated = collected.capacity();
    let body = collected.freeze();
    let mut inflated = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    // Never more than one byte past the limit is inflated: a bomb stops there.
    let read = match compressed {
        Compressed::No => return Ok((body, allocated)),
        Compressed::Gzip => flate2::read::GzDecoder::new(&body[..])
            .take(limit as u64 + 1)
            .read_to_end(&mut inflated)
            .map_err(|e| IngestError::BadGzip(e.to_string())),
        Compressed::Zstd => zstd::stream::read::Decoder::with_buffer(&body[..])
            .and_then(|d| d.take(limit as u64 + 1).read_to_end(&mut inflated))
            .map_err(|e| IngestError::BadZstd(e.to_string())),
    };
    match read? {
        n if n > limit => Err(IngestError::TooLarge { limit }),
        _ => {
            let allocated = inflated.capacity();
            Ok((Bytes::from(inflated), allocated))
        }
    }
}

/// Refuses a request before the pipeline saw it: counts it and answers.
/// Reads and discards what is left of a refused body, up to `limit` more bytes (at least
/// 8 MiB): enough for a client that overshot to finish writing and read the answer, bounded
/// so that a flood costs nothing but its bandwidth.
async fn drain(mut body: Body, limit: usize) {
    let cap = limit.max(8 << 20);
    let mut seen = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        seen += frame.data_ref().map_or(0, |d| d.len());
        if seen > cap {
            break;
        }
    }
}

fn refuse(rx: &Receiver, encoding: Encoding, e: &IngestError) -> Response {
    rx.pipeline
        .metrics()
        .refused_request(Transport::Http, e.reason());
    answer_error(encoding, e)
}

/// The OTLP/HTTP answer to an error: its status, a `google.rpc.Status` body, and
/// `Retry-After` when the sender should retry.
fn answer_error(encoding: Encoding, e: &IngestError) -> Response {
    let status = RpcStatus {
        code: e.grpc_code() as i32,
        message: e.to_string(),
    };
    let body = match encoding {
        Encoding::Protobuf => status.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&status).unwrap_or_default(),
    };
    let code = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = respond(code, encoding, body);
    if matches!(e, IngestError::ReadTimeout { .. }) {
        // The rest of the body may still come: the connection cannot carry another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(retry_after) = e.retry_after() {
        if let Ok(v) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    response
}

fn respond(status: StatusCode, encoding: Encoding, body: Vec<u8>) -> Response {
    let content_type = match encoding {
        Encoding::Protobuf => "application/x-protobuf",
        Encoding::Json => "application/json",
    };
    let mut response = (status, Body::from(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
