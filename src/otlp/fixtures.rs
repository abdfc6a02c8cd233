//! Span builders for tests across the crate: prost's owned types, small and explicit.

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span};

/// A string attribute.
pub fn s(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
    }
}

/// An integer attribute.
pub fn i(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::IntValue(value)),
        }),
    }
}

/// A CLIENT span with these attributes, 100..120 ns.
pub fn span(name: &str, attributes: Vec<KeyValue>) -> Span {
    Span {
        name: name.into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: 100,
        end_time_unix_nano: 120,
        attributes,
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        ..Default::default()
    }
}

/// An attribute holding an array of strings, as a captured HTTP header.
pub fn strings(key: &str, values: &[&str]) -> KeyValue {
    use opentelemetry_proto::tonic::common::v1::ArrayValue;
    KeyValue {
        key: key.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: values
                    .iter()
                    .map(|v| AnyValue {
                        value: Some(Value::StringValue((*v).into())),
                    })
                    .collect(),
            })),
        }),
    }
}

/// A double attribute (some SDKs send integers as doubles).
pub fn d(key: &str, value: f64) -> KeyValue {
    KeyValue {
        key: key.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::DoubleValue(value)),
        }),
    }
}

/// A resource of `client` (`service.name`) with one GET on `url` answered 200, at `at` (its
/// span lasting 1 ns) and `id` its span's id.
pub fn get_on(
    client: &str,
    url: &str,
    at: u64,
    id: u64,
) -> opentelemetry_proto::tonic::trace::v1::ResourceSpans {
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    let mut sp = span(
        "GET",
        vec![
            s("http.request.method", "GET"),
            s("url.full", url),
            i("http.response.status_code", 200),
        ],
    );
    sp.span_id = id.to_be_bytes().to_vec();
    (sp.start_time_unix_nano, sp.end_time_unix_nano) = (at, at + 1);
    ResourceSpans {
        resource: Some(Resource {
            attributes: vec![s("service.name", client)],
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans: vec![sp],
            ..Default::default()
        }],
        ..Default::default()
    }
}
