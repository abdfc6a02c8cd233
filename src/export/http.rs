//! The OTLP/HTTP sender: a batch posted as one protobuf body, compressed by the kept
//! [`super::Packer`], its answer read within bounds and mapped to retry, split or final.
//!
//! Edge.

use super::client::{error_chain, partial, Batch, Packer, Parts, MAX_ANSWER};
use super::Sent;
use crate::config::OtlpExporterConfig;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use std::time::Duration;

/// The OTLP/HTTP URL of a signal (`/v1/traces`, `/v1/metrics`) at `endpoint`: the base URL
/// with the signal's path added, unless it already ends with it.
pub fn signal_url(endpoint: &str, path: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(path) {
        base.to_owned()
    } else {
        format!("{base}{path}")
    }
}

pub(super) async fn send_http(
    client: &reqwest::Client,
    url: &str,
    packer: &mut Packer,
    config: &OtlpExporterConfig,
    batch: Batch,
) -> Sent {
    let mut request = client
        .post(url)
        .timeout(config.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf");
    for (k, v) in &config.headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let body = match packer.encoding() {
        None => reqwest::Body::wrap(Parts::new(batch)),
        encoding => match packer.pack(&batch) {
            Ok(packed) => {
                if let Some(encoding) = encoding {
                    request = request.header(reqwest::header::CONTENT_ENCODING, encoding);
                }
                reqwest::Body::from(packed)
            }
            Err(_) => return Sent::Final("compressing the batch failed".to_owned()),
        },
    };
    let response = match request.body(body).send().await {
        Ok(r) => r,
        Err(e) => return Sent::Retry(error_chain(&e), None),
    };
    let status = response.status();
    let hint = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        // Delay-seconds or an HTTP-date.
        .and_then(|v| crate::retry::retry_after(v, crate::clock::now()))
        .map(Duration::from_nanos);
    if status.is_success() {
        let mut response = response;
        let mut answer = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            if answer.len() + chunk.len() > MAX_ANSWER {
                return Sent::Final(format!("the answer is larger than {MAX_ANSWER} bytes"));
            }
            answer.extend_from_slice(&chunk);
        }
        return partial(&ExportTraceServiceResponse::decode(&answer[..]).unwrap_or_default());
    }
    // OTLP/HTTP: 429, 502, 503 and 504 are retryable; every other failure is final.
    match status.as_u16() {
        429 | 502 | 503 | 504 => Sent::Retry(format!("HTTP {status}"), hint),
        413 => Sent::TooLarge(format!("HTTP {status}")),
        _ => Sent::Final(format!("HTTP {status}")),
    }
}
