//! The OTLP/HTTP receiver: `POST /v1/traces`, protobuf or JSON, gzip or not.
//!
//! Edge. It checks method, media type and encoding, reads the body up to the limit (and
//! inflates gzip up to the same limit, so a small bomb never grows past it in memory), and
//! hands the bytes to the shared ingest path. Answers follow OTLP/HTTP: 200 with an
//! `ExportTraceServiceResponse` in the request's encoding; 400, 413 or 415 with a
//! `google.rpc.Status` body; 405 for other methods; 404 for other signals and paths.

use super::{decode, wall_clock, Encoding, IngestError, Pipeline, Transport};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Limited};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

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
}

/// The router of the OTLP/HTTP receiver. `limit` is the largest body, in bytes, both as
/// sent and after inflation.
pub fn router(pipeline: Arc<Pipeline>, limit: usize) -> Router {
    Router::new()
        .route("/v1/traces", post(traces))
        .fallback(|| async { (StatusCode::NOT_FOUND, "only /v1/traces is served\n") })
        .with_state(Receiver { pipeline, limit })
}

async fn traces(State(rx): State<Receiver>, request: Request) -> Response {
    let started = Instant::now();
    let encoding = match media_type(request.headers()) {
        Ok(e) => e,
        Err(e) => return refuse(&rx, Encoding::Protobuf, &e),
    };
    match read_body(request, rx.limit).await {
        Ok(body) => match decode(&body, encoding) {
            Ok(batch) => {
                let summary = rx.pipeline.ingest(Transport::Http, &batch, wall_clock());
                rx.pipeline
                    .metrics()
                    .batch_duration(Transport::Http, started.elapsed().as_secs_f64());
                let body = match encoding {
                    Encoding::Protobuf => ExportTraceServiceResponse {
                        partial_success: (summary.rejected > 0).then(|| {
                            ExportTracePartialSuccess {
                                rejected_spans: i64::try_from(summary.rejected).unwrap_or(i64::MAX),
                                error_message: rejected_message(summary.rejected),
                            }
                        }),
                    }
                    .encode_to_vec(),
                    // Written by hand: proto3's JSON mapping puts int64 in a string, which
                    // the generated serde code does not.
                    Encoding::Json if summary.rejected > 0 => serde_json::json!({
                        "partialSuccess": {
                            "rejectedSpans": summary.rejected.to_string(),
                            "errorMessage": rejected_message(summary.rejected),
                        }
                    })
                    .to_string()
                    .into_bytes(),
                    Encoding::Json => b"{}".to_vec(),
                };
                respond(StatusCode::OK, encoding, body)
            }
            Err(e) => refuse(&rx, encoding, &e),
        },
        Err(e) => refuse(&rx, encoding, &e),
    }
}

/// The `partial_success.error_message` for spans that could not be decoded.
pub(super) fn rejected_message(rejected: u64) -> String {
    format!("{rejected} spans could not be decoded")
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

/// Reads the body within `limit`, inflating gzip within the same limit.
async fn read_body(request: Request, limit: usize) -> Result<Bytes, IngestError> {
    let gzip = match request
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e.is_empty() || e == "identity" => false,
        Some(e) if e == "gzip" => true,
        Some(e) => return Err(IngestError::UnsupportedEncoding(e)),
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        // Refuse before reading: the client learns at once, and nothing is buffered.
        return Err(IngestError::TooLarge { limit });
    }
    let body = Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                IngestError::TooLarge { limit }
            } else {
                IngestError::Malformed {
                    encoding: "http",
                    detail: format!("reading the body: {e}"),
                }
            }
        })?
        .to_bytes();
    if !gzip {
        return Ok(body);
    }
    let mut inflated = Vec::with_capacity(body.len().saturating_mul(4).min(limit));
    let read = flate2::read::GzDecoder::new(&body[..])
        .take(limit as u64 + 1)
        .read_to_end(&mut inflated);
    match read {
        Err(e) => Err(IngestError::BadGzip(e.to_string())),
        Ok(n) if n > limit => Err(IngestError::TooLarge { limit }),
        Ok(_) => Ok(Bytes::from(inflated)),
    }
}

fn refuse(rx: &Receiver, encoding: Encoding, e: &IngestError) -> Response {
    rx.pipeline
        .metrics()
        .refused_request(Transport::Http, e.reason());
    let status = RpcStatus {
        code: e.grpc_code() as i32,
        message: e.to_string(),
    };
    let body = match encoding {
        Encoding::Protobuf => status.encode_to_vec(),
        Encoding::Json => serde_json::to_vec(&status).unwrap_or_default(),
    };
    let code = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    respond(code, encoding, body)
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
