//! A span and its attribute values as refusal-gate reads them, wherever they come from:
//! [`SpanView`] over the protobuf bytes ([`super::wire::SpanRef`]: every request, whatever
//! its encoding) or over prost's owned [`Span`] (tests and tools), and [`Val`], an attribute's
//! value, borrowed.
//!
//! Core: pure protocol code, no allocation; it knows nothing of the pipeline.

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span};

/// An attribute value as extraction reads it, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'a> {
    /// A string.
    Str(&'a str),
    /// A string as it stands on the wire, not yet checked as UTF-8 (it is when used).
    Raw(&'a [u8]),
    /// An `AnyValue` message as it stands on the wire, read only when used (most
    /// attributes are not): see [`Val::decoded`].
    Encoded(&'a [u8]),
    /// An integer.
    Int(i64),
    /// A double.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// An array: a captured HTTP header is one (see [`Val::first`]).
    Array(Array<'a>),
    /// Anything else (maps, bytes, nothing).
    Other,
}

/// An array value, borrowed as it came.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Array<'a> {
    /// An `ArrayValue` message as it stands on the wire.
    Encoded(&'a [u8]),
    /// Decoded by prost (tests and tools).
    Owned(&'a [AnyValue]),
}

impl<'a> Val<'a> {
    /// The value as a string, when it is one (and valid UTF-8).
    pub fn as_str(self) -> Option<&'a str> {
        match self.decoded() {
            Val::Str(s) => Some(s),
            Val::Raw(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// An array's first element (`Other` when it is empty); any other value as it is. An
    /// HTTP instrumentation records a captured header as an array of its values.
    pub fn first(self) -> Val<'a> {
        match self.decoded() {
            Val::Array(Array::Owned(values)) => Val::of(values.first()),
            Val::Array(Array::Encoded(bytes)) => super::wire::first_element(bytes),
            v => v,
        }
    }

    /// A value decoded by prost, borrowed.
    pub fn of(v: Option<&'a AnyValue>) -> Val<'a> {
        match v.and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => Val::Str(s),
            Some(Value::IntValue(i)) => Val::Int(*i),
            Some(Value::DoubleValue(d)) => Val::Double(*d),
            Some(Value::BoolValue(b)) => Val::Bool(*b),
            Some(Value::ArrayValue(a)) => Val::Array(Array::Owned(&a.values)),
            _ => Val::Other,
        }
    }
}

/// A span as extraction reads it, wherever it comes from. Callbacks rather than
/// iterators keep it object-safe and free of allocation.
pub trait SpanView<'a> {
    /// The span kind (3 is CLIENT).
    fn kind(&self) -> i32;
    /// The span name.
    fn name(&self) -> &'a str;
    /// Start, Unix nanoseconds.
    fn start(&self) -> u64;
    /// End, Unix nanoseconds.
    fn end(&self) -> u64;
    /// The trace id.
    fn trace_id(&self) -> &'a [u8];
    /// The span id.
    fn span_id(&self) -> &'a [u8];
    /// The parent span's id; empty for a root span.
    fn parent_span_id(&self) -> &'a [u8] {
        &[]
    }
    /// Whether the span's status is ERROR.
    fn status_error(&self) -> bool;
    /// The trace and span ids of its first link, when it has one (DESIGN §12.5: the MCP
    /// conventions link a protocol server span to the HTTP server span that carried it).
    fn link(&self) -> Option<(&'a [u8], &'a [u8])> {
        None
    }
    /// The status description (an error's message, as some SDKs record it); empty when
    /// there is none or it is not UTF-8.
    fn status_message(&self) -> &'a str {
        ""
    }
    /// Calls `f` with the first `max` attributes: each key as bytes, and its value.
    fn attributes(&self, max: usize, f: &mut dyn FnMut(&'a [u8], Val<'a>));
    /// How many attributes the span has.
    fn attribute_count(&self) -> usize;
    /// Calls `f` with the `exception.type` and `exception.message` of every `exception` event
    /// (each `None` when absent) until it returns true.
    fn exceptions(&self, f: &mut dyn FnMut(Option<&'a str>, Option<&'a str>) -> bool);
}

impl<'a> SpanView<'a> for &'a Span {
    fn kind(&self) -> i32 {
        self.kind
    }
    fn name(&self) -> &'a str {
        &self.name
    }
    fn start(&self) -> u64 {
        self.start_time_unix_nano
    }
    fn end(&self) -> u64 {
        self.end_time_unix_nano
    }
    fn trace_id(&self) -> &'a [u8] {
        &self.trace_id
    }
    fn span_id(&self) -> &'a [u8] {
        &self.span_id
    }
    fn parent_span_id(&self) -> &'a [u8] {
        &self.parent_span_id
    }
    fn status_error(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|st| st.code == StatusCode::Error as i32)
    }
    fn status_message(&self) -> &'a str {
        self.status.as_ref().map_or("", |st| &st.message)
    }
    fn link(&self) -> Option<(&'a [u8], &'a [u8])> {
        self.links
            .first()
            .map(|l| (l.trace_id.as_slice(), l.span_id.as_slice()))
    }
    fn attributes(&self, max: usize, f: &mut dyn FnMut(&'a [u8], Val<'a>)) {
        for kv in self.attributes.iter().take(max) {
            f(kv.key.as_bytes(), Val::of(kv.value.as_ref()));
        }
    }
    fn attribute_count(&self) -> usize {
        self.attributes.len()
    }
    fn exceptions(&self, f: &mut dyn FnMut(Option<&'a str>, Option<&'a str>) -> bool) {
        for event in self.events.iter().filter(|e| e.name == "exception") {
            let (mut kind, mut message) = (None, None);
            for kv in &event.attributes {
                match kv.key.as_str() {
                    "exception.type" => kind = Val::of(kv.value.as_ref()).as_str(),
                    "exception.message" => message = Val::of(kv.value.as_ref()).as_str(),
                    _ => {}
                }
            }
            if f(kind, message) {
                return;
            }
        }
    }
}
