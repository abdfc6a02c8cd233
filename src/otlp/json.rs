//! OTLP/JSON, as the specification maps it (hex ids, enum numbers, 64-bit integers as
//! strings or numbers), turned into protobuf bytes: the one form the pipeline reads.
//!
//! Core: pure protocol code. Leniently: the request must be a JSON object of the right shape,
//! and each span that does not deserialize is left out and counted, never failing its batch.
//! What decoding holds is bounded by the body: no generic JSON value is ever built.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

/// Why a body is not an OTLP/JSON traces request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

/// An OTLP/JSON export request as protobuf bytes, and how many of its spans were left out
/// because they did not deserialize.
///
/// # Errors
/// [`JsonError`] when the body is not JSON, or not an export request's shape.
pub fn to_protobuf(body: &[u8]) -> Result<(Vec<u8>, u64), JsonError> {
    let (request, left_out) = request(body)?;
    Ok((request.encode_to_vec(), left_out))
}

/// The request (resources and scopes whole) and how many spans were left out.
fn request(body: &[u8]) -> Result<(ExportTraceServiceRequest, u64), JsonError> {
    // The fast path: a well-formed request deserializes in one pass. Only when it does not
    // is it read again, as the same shape with each span kept as its raw text and then
    // deserialized on its own, so that one bad span costs only itself. Neither pass builds a
    // generic JSON value: what they hold is bounded by the body (and a field refusal-gate
    // does not know is skipped, never materialised).
    if let Ok(request) = serde_json::from_slice::<ExportTraceServiceRequest>(body) {
        return Ok((request, 0));
    }
    let lenient: Lenient<'_> =
        serde_json::from_slice(body).map_err(|e| JsonError(e.to_string()))?;
    let mut request = ExportTraceServiceRequest::default();
    let mut left_out = 0;
    for rs in lenient.resource_spans.unwrap_or_default() {
        let mut out = ResourceSpans {
            resource: Some(rs.resource.unwrap_or_default()),
            schema_url: rs.schema_url.unwrap_or_default(),
            ..Default::default()
        };
        for scope in rs.scope_spans.unwrap_or_default() {
            let mut ss = ScopeSpans {
                scope: scope.scope,
                schema_url: scope.schema_url.unwrap_or_default(),
                ..Default::default()
            };
            for span in scope.spans.unwrap_or_default() {
                match serde_json::from_str::<Span>(span.get()) {
                    Ok(span) => ss.spans.push(span),
                    Err(_) => left_out += 1,
                }
            }
            out.scope_spans.push(ss);
        }
        request.resource_spans.push(out);
    }
    Ok((request, left_out))
}

/// An export request whose spans are kept as their raw JSON text. `null` stands for absent.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lenient<'a> {
    #[serde(borrow, default)]
    resource_spans: Option<Vec<LenientResourceSpans<'a>>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LenientResourceSpans<'a> {
    #[serde(default)]
    resource: Option<Resource>,
    #[serde(default)]
    schema_url: Option<String>,
    #[serde(borrow, default)]
    scope_spans: Option<Vec<LenientScopeSpans<'a>>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LenientScopeSpans<'a> {
    #[serde(default)]
    scope: Option<InstrumentationScope>,
    #[serde(default)]
    schema_url: Option<String>,
    #[serde(borrow, default)]
    spans: Option<Vec<&'a serde_json::value::RawValue>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hex_ids_enums_and_int64_either_way_and_leaves_out_a_bad_span() {
        let body = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"a"}}]},
          "scopeSpans":[{"spans":[
            {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":3,
             "startTimeUnixNano":"100","endTimeUnixNano":200,
             "attributes":[{"key":"http.response.status_code","value":{"intValue":"404"}},
                           {"key":"server.port","value":{"intValue":8080}}]},
            {"traceId":"not hex","spanId":"zz","name":"bad"}
          ]}]}]}"#;
        let (bytes, left_out) = to_protobuf(body).expect("valid");
        assert_eq!(left_out, 1);
        let request = ExportTraceServiceRequest::decode(&bytes[..]).expect("protobuf");
        let span = &request.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.trace_id[0], 1);
        assert_eq!(span.kind, 3);
        assert_eq!(span.start_time_unix_nano, 100);
        assert_eq!(span.end_time_unix_nano, 200);
        assert_eq!(span.attributes.len(), 2);
    }

    #[test]
    fn a_body_of_the_wrong_shape_is_an_error() {
        for body in [
            &b"{\"resourceSpans\": ["[..],
            b"[1,2]",
            b"{\"resourceSpans\": 5}",
            b"{\"resourceSpans\": [7]}",
        ] {
            assert!(
                to_protobuf(body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
