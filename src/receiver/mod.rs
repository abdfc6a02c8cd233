//! The shared ingest path: both receivers hand it the raw request bytes, it decodes them
//! span by span, runs extract → classify → track inline, and records what happened.
//!
//! Edge, but a thin one: decoding and the [`Pipeline`] hold no sockets and no tasks. The
//! one error type, [`IngestError`], maps to the gRPC and HTTP answers in one place
//! ([`IngestError::grpc_code`], [`IngestError::http_status`]), as OTLP specifies them.
//! A span that fails to decode is skipped and counted; it never fails its batch.

pub mod grpc;
pub mod http;
pub use crate::otlp::wire;

use crate::alert::delivery::Alerter;
use crate::alert::{Alert, AlertKey, Severity};
use crate::classify::{self, Kind};
use crate::config::{AlertingConfig, OtlpExporterConfig};
use crate::discovery::loader::Catalog;
use crate::discovery::{Declared, Interfaces};
use crate::export::{Exporter, Reservation};
use crate::extract::{self, Attempt};
use crate::metrics::Metrics;
use crate::tracker::{Event, GroupId, Judgement, Nanos, Observation, Tracker};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

pub use crate::otlp::Transport;

/// Why a whole request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The body is not an OTLP traces request.
    #[error("malformed {encoding} request: {detail}")]
    Malformed {
        /// `protobuf` or `json`.
        encoding: &'static str,
        /// What the decoder said.
        detail: String,
    },
    /// The body, as sent or inflated, is larger than allowed.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The content type is neither protobuf nor JSON.
    #[error("unsupported content type {0:?}: use application/x-protobuf or application/json")]
    UnsupportedMediaType(String),
    /// The content encoding is neither identity nor gzip.
    #[error("unsupported content encoding {0:?}: use gzip or none")]
    UnsupportedEncoding(String),
    /// The gzip stream is corrupt.
    #[error("invalid gzip body: {0}")]
    BadGzip(String),
    /// No valid bearer token.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// The receiver has `max_concurrent_requests` in flight: retry after the hint.
    #[error("too many requests in flight; retry after {}s", retry_after.as_secs())]
    Busy {
        /// How long the sender should wait.
        retry_after: std::time::Duration,
    },
    /// The export queue is full: retry after the hint (OTLP's retryable answer).
    #[error("the export queue is full; retry after {}s", retry_after.as_secs())]
    Overloaded {
        /// How long the sender should wait.
        retry_after: std::time::Duration,
        /// The spans refused.
        spans: u64,
    },
}

impl IngestError {
    /// How long the sender should wait before retrying, when it should.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            IngestError::Overloaded { retry_after, .. } | IngestError::Busy { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The `reason` label for refused requests.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::Malformed { .. } => "malformed",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::UnsupportedMediaType(_) => "unsupported_media_type",
            IngestError::UnsupportedEncoding(_) => "unsupported_encoding",
            IngestError::BadGzip(_) => "bad_gzip",
            IngestError::Overloaded { .. } => "queue_full",
            IngestError::Unauthenticated => "unauthenticated",
            IngestError::Busy { .. } => "concurrency_limit",
        }
    }

    /// The OTLP/HTTP status.
    pub fn http_status(&self) -> u16 {
        match self {
            IngestError::Malformed { .. } | IngestError::BadGzip(_) => 400,
            IngestError::TooLarge { .. } => 413,
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => 415,
            IngestError::Overloaded { .. } | IngestError::Busy { .. } => 503,
            IngestError::Unauthenticated => 401,
        }
    }

    /// The OTLP/gRPC status code.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            IngestError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            IngestError::UnsupportedEncoding(_) => tonic::Code::Unimplemented,
            IngestError::Overloaded { .. } | IngestError::Busy { .. } => tonic::Code::Unavailable,
            IngestError::Unauthenticated => tonic::Code::Unauthenticated,
            _ => tonic::Code::InvalidArgument,
        }
    }
}

/// The encoding of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-protobuf`, and gRPC.
    Protobuf,
    /// `application/json`: OTLP's JSON mapping.
    Json,
}

/// One decoded resource with its spans; spans that failed to decode are already counted
/// in `malformed`.
#[derive(Debug, Default)]
pub struct Batch {
    /// (resource attributes, spans) in request order.
    pub resources: Vec<(Vec<KeyValue>, Vec<Span>)>,
    /// Spans that could not be decoded.
    pub malformed: u64,
}

impl Batch {
    /// How many spans the request held, malformed ones included.
    pub fn span_count(&self) -> u64 {
        self.resources
            .iter()
            .map(|(_, s)| s.len() as u64)
            .sum::<u64>()
            + self.malformed
    }
}

/// Decodes a request body span by span into prost's owned types: the path of OTLP/JSON and
/// replay, and of tools and tests. The receivers read protobuf spans in place instead
/// ([`Pipeline::ingest_wire`]).
///
/// # Errors
/// [`IngestError::Malformed`] when the request's own framing is broken; a broken span is
/// not an error but counted in [`Batch::malformed`].
pub fn decode(body: &[u8], encoding: Encoding) -> Result<Batch, IngestError> {
    match encoding {
        Encoding::Protobuf => decode_protobuf(body),
        Encoding::Json => decode_json(body),
    }
}

/// Walks `ExportTraceServiceRequest` → `ResourceSpans` → `ScopeSpans` by hand and decodes
/// each `Span` on its own, so that one bad span costs only itself.
fn decode_protobuf(body: &[u8]) -> Result<Batch, IngestError> {
    let malformed = |detail: String| IngestError::Malformed {
        encoding: "protobuf",
        detail,
    };
    let mut batch = Batch::default();
    for resource_spans in fields(body, 1).map_err(malformed)? {
        let mut resource = Vec::new();
        for r in fields(resource_spans, 1).map_err(malformed)? {
            resource = Resource::decode(r)
                .map_err(|e| malformed(format!("resource: {e}")))?
                .attributes;
        }
        let mut spans = Vec::new();
        for scope_spans in fields(resource_spans, 2).map_err(malformed)? {
            for span in fields(scope_spans, 2).map_err(malformed)? {
                match Span::decode(span) {
                    Ok(span) => spans.push(span),
                    Err(_) => batch.malformed += 1,
                }
            }
        }
        batch.resources.push((resource, spans));
    }
    Ok(batch)
}

/// One field of a protobuf message: its number, its bytes as they stand (key included),
/// and the value of a length-delimited field.
struct Field<'a> {
    number: u32,
    raw: &'a [u8],
    value: Option<&'a [u8]>,
}

/// The fields of one protobuf message, in order, split by wire type.
fn walk(buf: &[u8]) -> Result<Vec<Field<'_>>, String> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let start = buf.len() - rest.len();
        let (number, wire) = decode_key(&mut rest).map_err(|e| e.to_string())?;
        let mut value = None;
        match wire {
            WireType::Varint => {
                decode_varint(&mut rest).map_err(|e| e.to_string())?;
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if wire == WireType::SixtyFourBit { 8 } else { 4 };
                rest = rest.get(n..).ok_or("truncated fixed-width field")?;
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut rest).map_err(|e| e.to_string())?)
                    .map_err(|_| "length out of range")?;
                value = Some(rest.get(..len).ok_or("truncated length-delimited field")?);
                rest = &rest[len..];
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(format!("field {number} uses deprecated groups"));
            }
        }
        out.push(Field {
            number,
            raw: &buf[start..buf.len() - rest.len()],
            value,
        });
    }
    Ok(out)
}

/// Checks a protobuf request's framing down to its spans (not inside them) and counts the
/// spans: what must hold before anything of it is ingested.
///
/// # Errors
/// [`IngestError::Malformed`] when the request, a resource or a scope is broken.
pub fn frame_check(body: &[u8]) -> Result<usize, IngestError> {
    let broken = |what: &str| IngestError::Malformed {
        encoding: "protobuf",
        detail: format!("broken framing in {what}"),
    };
    let mut spans = 0;
    for resource_spans in wire::each(body, 1) {
        let resource_spans = resource_spans.map_err(|_| broken("the request"))?;
        wire::ResourceRef::of(resource_spans).map_err(|_| broken("a resource"))?;
        for scope_spans in wire::each(resource_spans, 2) {
            let scope_spans = scope_spans.map_err(|_| broken("resource spans"))?;
            for span in wire::each(scope_spans, 2) {
                span.map_err(|_| broken("scope spans"))?;
                spans += 1;
            }
        }
    }
    Ok(spans)
}

/// The length-delimited fields numbered `wanted` of one protobuf message.
fn fields(buf: &[u8], wanted: u32) -> Result<Vec<&[u8]>, String> {
    Ok(walk(buf)?
        .into_iter()
        .filter(|f| f.number == wanted)
        .filter_map(|f| f.value)
        .collect())
}

/// The fields that lead from a request down to its spans: `resource_spans` (1),
/// `scope_spans` (2), `spans` (2).
const SPAN_PATH: [u32; 3] = [1, 2, 2];

/// The spans of a request in order, as [`tag`] rewrites them.
#[derive(Clone)]
struct SpanCursor<'t> {
    seen: u32,
    decoded: usize,
    malformed_at: &'t [u32],
    tags: &'t [Option<Vec<u8>>],
}

impl<'t> SpanCursor<'t> {
    /// The next span's tags (empty when it has none), or `None` when it is left out.
    fn next(&mut self) -> Option<&'t [u8]> {
        let at = self.seen;
        self.seen += 1;
        if let Some((&first, rest)) = self.malformed_at.split_first() {
            if first == at {
                self.malformed_at = rest;
                return None;
            }
        }
        let extra = self.tags.get(self.decoded).and_then(|t| t.as_deref());
        self.decoded += 1;
        Some(extra.unwrap_or(&[]))
    }
}

/// The length of the message `buf` at `depth` of [`SPAN_PATH`] once rewritten, its spans
/// taken from `spans`; `None` for a span that is left out.
fn rewritten_len(
    buf: &[u8],
    depth: usize,
    spans: &mut SpanCursor<'_>,
) -> Result<Option<usize>, String> {
    let Some(&wanted) = SPAN_PATH.get(depth) else {
        return Ok(spans.next().map(|extra| buf.len() + extra.len()));
    };
    let mut len = 0;
    for field in walk(buf)? {
        match field.value {
            Some(value) if field.number == wanted => {
                if let Some(n) = rewritten_len(value, depth + 1, spans)? {
                    len += prost::encoding::key_len(wanted)
                        + prost::encoding::encoded_len_varint(n as u64)
                        + n;
                }
            }
            _ => len += field.raw.len(),
        }
    }
    Ok(Some(len))
}

/// Writes the message `buf` at `depth` of [`SPAN_PATH`] rewritten: each span with its tags
/// appended, the ones left out dropped, every other byte as it was. Each byte is copied once,
/// straight to `out`: a nested message's new length is measured before it is written.
fn rewrite(
    buf: &[u8],
    depth: usize,
    spans: &mut SpanCursor<'_>,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let wanted = SPAN_PATH[depth];
    let key = |out: &mut Vec<u8>, len: usize| {
        prost::encoding::encode_key(wanted, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(len as u64, out);
    };
    for field in walk(buf)? {
        match field.value {
            Some(span) if field.number == wanted && depth + 1 == SPAN_PATH.len() => {
                if let Some(extra) = spans.next() {
                    key(out, span.len() + extra.len());
                    out.extend_from_slice(span);
                    out.extend_from_slice(extra);
                }
            }
            Some(value) if field.number == wanted => {
                let len = rewritten_len(value, depth + 1, &mut spans.clone())?.unwrap_or(0);
                key(out, len);
                rewrite(value, depth + 1, spans, out)?;
            }
            _ => out.extend_from_slice(field.raw),
        }
    }
    Ok(())
}

/// Rewrites a protobuf request for forwarding: each span gets `tags[i]` (encoded
/// `Span.attributes` fields) appended, in request order; the spans at `malformed_at` (they
/// could not be read, and were rejected) are left out. Nothing else changes, byte for byte.
///
/// # Errors
/// When the request's framing is broken (it decoded, so it is not).
pub fn tag(body: &[u8], malformed_at: &[u32], tags: &[Option<Vec<u8>>]) -> Result<Vec<u8>, String> {
    let spans = SpanCursor {
        seen: 0,
        decoded: 0,
        malformed_at,
        tags,
    };
    let len = rewritten_len(body, 0, &mut spans.clone())?.unwrap_or(0);
    let mut out = Vec::with_capacity(len);
    rewrite(body, 0, &mut spans.clone(), &mut out)?;
    debug_assert_eq!(out.len(), len, "measured as written");
    Ok(out)
}

/// OTLP/JSON, leniently: the request must be a JSON object of the right shape; each span
/// that does not deserialize is left out and counted. Returns the request (resources and
/// scopes whole) and how many spans were left out.
fn json_request(body: &[u8]) -> Result<(ExportTraceServiceRequest, u64), IngestError> {
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
    use serde_json::Value;
    // The fast path: a well-formed request deserializes in one pass. Only when it does not
    // is the body walked span by span, so that one bad span costs only itself.
    if let Ok(request) = serde_json::from_slice::<ExportTraceServiceRequest>(body) {
        return Ok((request, 0));
    }
    let malformed = |detail: String| IngestError::Malformed {
        encoding: "json",
        detail,
    };
    fn list(v: Option<Value>, what: &str) -> Result<Vec<Value>, String> {
        match v {
            Some(Value::Array(list)) => Ok(list),
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(_) => Err(format!("{what} is not an array")),
        }
    }
    fn take<T: serde::de::DeserializeOwned + Default>(
        v: Option<Value>,
        what: &str,
    ) -> Result<T, String> {
        match v {
            None | Some(Value::Null) => Ok(T::default()),
            Some(v) => serde_json::from_value(v).map_err(|e| format!("{what}: {e}")),
        }
    }
    let mut root: Value = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let Some(root) = root.as_object_mut() else {
        return Err(malformed("the request is not a JSON object".into()));
    };
    let mut request = ExportTraceServiceRequest::default();
    let mut rejected = 0;
    for mut rs in list(root.remove("resourceSpans"), "resourceSpans").map_err(malformed)? {
        let rs = rs
            .as_object_mut()
            .ok_or_else(|| malformed("a resourceSpans entry is not an object".into()))?;
        let mut out = ResourceSpans {
            resource: Some(take::<Resource>(rs.remove("resource"), "resource").map_err(malformed)?),
            schema_url: take(rs.remove("schemaUrl"), "schemaUrl").map_err(malformed)?,
            ..Default::default()
        };
        for mut scope in list(rs.remove("scopeSpans"), "scopeSpans").map_err(malformed)? {
            let scope = scope
                .as_object_mut()
                .ok_or_else(|| malformed("a scopeSpans entry is not an object".into()))?;
            let mut ss = ScopeSpans {
                scope: take::<Option<InstrumentationScope>>(scope.remove("scope"), "scope")
                    .map_err(malformed)?,
                schema_url: take(scope.remove("schemaUrl"), "schemaUrl").map_err(malformed)?,
                ..Default::default()
            };
            for span in list(scope.remove("spans"), "spans").map_err(malformed)? {
                match serde_json::from_value::<Span>(span) {
                    Ok(span) => ss.spans.push(span),
                    Err(_) => rejected += 1,
                }
            }
            out.scope_spans.push(ss);
        }
        request.resource_spans.push(out);
    }
    Ok((request, rejected))
}

fn decode_json(body: &[u8]) -> Result<Batch, IngestError> {
    let (request, malformed) = json_request(body)?;
    Ok(Batch {
        resources: request
            .resource_spans
            .into_iter()
            .map(|rs| {
                let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
                let spans = rs.scope_spans.into_iter().flat_map(|ss| ss.spans).collect();
                (resource, spans)
            })
            .collect(),
        malformed,
    })
}

/// An OTLP/JSON request as protobuf, for forwarding: spans that do not deserialize are
/// left out and counted.
///
/// # Errors
/// As [`decode`] for JSON.
pub fn json_to_protobuf(body: &[u8]) -> Result<(Vec<u8>, u64), IngestError> {
    let (request, malformed) = json_request(body)?;
    Ok((request.encode_to_vec(), malformed))
}

/// What one request amounted to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Spans accepted (everything that decoded).
    pub accepted: u64,
    /// Spans that could not be decoded: OTLP's `rejected_spans`.
    pub rejected: u64,
    /// Attempts classified.
    pub attempts: u64,
    /// Spans with more attributes than are read (`max_attributes_per_span`).
    pub truncated: u64,
}

/// Everything a request needs, shared by the receivers, the admin endpoint and the sweeper.
pub struct Pipeline {
    catalog: Arc<Catalog>,
    tracker: Tracker,
    metrics: Metrics,
    alerter: Arc<Alerter>,
    exporter: Option<Arc<Exporter>>,
    /// foldhash: a fast keyed hash, seeded at random so ids cannot be aimed at (the seed is
    /// kept in the state file, so ids survive a restart).
    hasher: foldhash::fast::FixedState,
    seed: u64,
    /// Attributes read per span and per resource.
    max_attributes: usize,
}

/// Where one attempt stands, before the tracker sees it.
struct Placed<'i> {
    interface: crate::discovery::InterfaceRef<'i>,
    interface_name: &'i str,
    declared: Declared,
    outcome: classify::Outcome,
    reason: classify::Reason<'i>,
    discovery: extract::Discovery,
    group: GroupId,
    operation: u64,
}

/// What the pipeline says of an attempt put as a question ([`Pipeline::assess`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Its kind, as a span with the same signal gets it.
    pub kind: Kind,
    /// The rule that fired, as spans are tagged (`refusal_gate.reason`).
    pub rule: String,
    /// Its interface's name.
    pub interface: String,
    /// The client's latest attempt of the same operation: its kind and number in a row.
    pub last: Option<(Kind, u32)>,
    /// Which attempt in a row of failures this is.
    pub attempt: u32,
    /// Whether it was tracked and counted.
    pub observed: bool,
    /// Other interfaces that declare the path: (name, URL, protocol).
    pub alternatives: Vec<(String, String, crate::config::Protocol)>,
    /// The interface's discovery document path, when one is known.
    pub discovery_path: Option<String>,
}

/// What one request carries through the ingest path.
struct RequestState<'t> {
    now: Nanos,
    events: Vec<Event>,
    summary: Summary,
    tags: Option<&'t mut Vec<Option<Vec<u8>>>>,
}

impl<'t> RequestState<'t> {
    fn new(
        now: Nanos,
        tags: Option<&'t mut Vec<Option<Vec<u8>>>>,
        rejected: u64,
    ) -> RequestState<'t> {
        RequestState {
            now,
            events: Vec::new(),
            summary: Summary {
                rejected,
                ..Summary::default()
            },
            tags,
        }
    }
}

/// Attempts staged before the tracker takes them together ([`Tracker::observe_all`]):
/// enough for the cache misses of looking up their keys to overlap, few enough to stay in
/// the cache.
const STAGED: usize = 64;

/// One attempt, extracted and placed, waiting for the tracker.
struct Staged<'a> {
    obs: Observation,
    operation: extract::Operation<'a>,
    /// When tagging: where its tags go, and those that do not depend on its verdict.
    tag: Option<(usize, Vec<u8>)>,
}

/// A resource's client, hashed once for all its spans, and the metric labels of the
/// interfaces its spans went to so far (a request's spans go to a handful).
struct ClientIds<'a> {
    client: extract::Client<'a>,
    /// The tracker's id of the client instance.
    id: u64,
    /// The hash of its name, for the metric labels.
    name: u64,
    /// (interface id, labels), filled in turn.
    labels: [(u64, u32); 16],
    filled: usize,
}

/// The `refusal_gate.*` attributes of DESIGN §6 that do not depend on the verdict (the
/// rule and the interface), encoded as `Span.attributes` (field 9) entries.
fn encode_place_tags(reason: classify::Reason<'_>, interface: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    push_tag(
        &mut out,
        "refusal_gate.reason",
        Tag::Str(&reason.to_string()),
    );
    push_tag(&mut out, "refusal_gate.interface", Tag::Str(interface));
    out
}

/// `placed` (from [`encode_place_tags`]) with the attributes of the verdict appended: all
/// the `refusal_gate.*` attributes, ready to append to a span's bytes.
fn encode_tags(j: &Judgement, placed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(placed.len() + 256);
    out.extend_from_slice(placed);
    push_tag(
        &mut out,
        "refusal_gate.class",
        Tag::Str(j.kind.class().as_str()),
    );
    push_tag(&mut out, "refusal_gate.kind", Tag::Str(j.kind.as_str()));
    push_tag(
        &mut out,
        "refusal_gate.decision",
        Tag::Str(j.kind.decision().as_str()),
    );
    push_tag(
        &mut out,
        "refusal_gate.discovery_read",
        Tag::Bool(j.discovery_read),
    );
    push_tag(
        &mut out,
        "refusal_gate.attempt",
        Tag::Int(i64::from(j.attempt)),
    );
    if let Some(v) = j.violation {
        push_tag(&mut out, "refusal_gate.violation", Tag::Str(v.as_str()));
    }
    out
}

/// The value of one tag.
enum Tag<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
}

/// Appends one `Span.attributes` entry (field 9, a `KeyValue`) holding `key` = `value`,
/// written directly: what prost would encode, without building the message first.
fn push_tag(out: &mut Vec<u8>, key: &str, value: Tag<'_>) {
    use prost::encoding::{encode_varint, encoded_len_varint};
    let len = |n: usize| encoded_len_varint(n as u64) + n;
    // AnyValue: string_value (1), bool_value (2) or int_value (3).
    let any = match value {
        Tag::Str(s) => 1 + len(s.len()),
        Tag::Bool(_) => 2,
        Tag::Int(i) => 1 + encoded_len_varint(i as u64),
    };
    // KeyValue: key (1), value (2).
    let kv = 1 + len(key.len()) + 1 + len(any);
    out.push(9 << 3 | 2);
    encode_varint(kv as u64, out);
    out.push(1 << 3 | 2);
    encode_varint(key.len() as u64, out);
    out.extend_from_slice(key.as_bytes());
    out.push(2 << 3 | 2);
    encode_varint(any as u64, out);
    match value {
        Tag::Str(s) => {
            out.push(1 << 3 | 2);
            encode_varint(s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        Tag::Bool(b) => out.extend_from_slice(&[2 << 3, u8::from(b)]),
        Tag::Int(i) => {
            out.push(3 << 3);
            encode_varint(i as u64, out);
        }
    }
}

/// What the tracker takes of a placed attempt.
fn observation(p: &Placed<'_>, attempt: &Attempt<'_>, labels: u32) -> Observation {
    Observation {
        group: p.group,
        operation: p.operation,
        labels,
        start: attempt.start,
        end: attempt.end,
        outcome: p.outcome,
        declared: p.declared,
        discovery: p.discovery,
        retry_after: attempt.signal.retry_after,
        trace_id: fixed(attempt.trace_id),
        span_id: fixed(attempt.span_id),
    }
}

fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    let n = bytes.len().min(N);
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

impl Pipeline {
    /// Wires the pure stages to their state.
    pub fn new(
        catalog: Arc<Catalog>,
        tracker: Tracker,
        metrics: Metrics,
        alerting: &AlertingConfig,
    ) -> Pipeline {
        let (alerts, deliveries) = metrics.alert_counters();
        // A random seed: the standard library's per-process random keys.
        let seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            "refusal-gate",
        );
        Pipeline {
            catalog,
            tracker,
            metrics,
            alerter: Arc::new(Alerter::new(alerting, alerts, deliveries)),
            exporter: None,
            hasher: foldhash::fast::FixedState::with_seed(seed),
            seed,
            max_attributes: extract::DEFAULT_MAX_ATTRIBUTES,
        }
    }

    /// A pipeline on `config` alone: its interfaces (no discovery document loaded), tracker,
    /// metrics, alerting and attribute limit, no exporter. What the benchmarks and the fuzz
    /// targets build on.
    pub fn from_config(config: &crate::config::Config) -> Pipeline {
        Pipeline::new(
            Arc::new(Catalog::new(config.interfaces.clone(), Default::default())),
            Tracker::new(&config.tracker),
            Metrics::new(&config.metrics),
            &config.alerting,
        )
        .with_max_attributes(config.receivers.otlp.max_attributes_per_span)
    }

    /// Hashes with `seed` (the one a state file was written with).
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Pipeline {
        self.hasher = foldhash::fast::FixedState::with_seed(seed);
        self.seed = seed;
        self
    }

    /// The tracker's state, for the state file.
    pub fn state(&self) -> crate::state::State {
        let groups = self.tracker.export();
        let handles: std::collections::BTreeSet<u32> = groups.iter().map(|g| g.labels).collect();
        let labels = handles
            .into_iter()
            .filter_map(|id| {
                let (client, interface) = self.metrics.label_names(id)?;
                Some((id, client.to_string(), interface.to_string()))
            })
            .collect();
        crate::state::State {
            format: crate::state::FORMAT.to_owned(),
            version: crate::state::VERSION,
            seed: self.seed,
            saved_at_unix_ms: crate::state::now_ms(),
            labels,
            groups,
        }
    }

    /// Takes the tracker state read from a state file (written with this pipeline's seed:
    /// see [`Pipeline::with_seed`]); returns how many keys it took.
    pub fn restore(&self, state: crate::state::State) -> usize {
        let names: std::collections::HashMap<u32, (String, String)> = state
            .labels
            .into_iter()
            .map(|(id, c, i)| (id, (c, i)))
            .collect();
        let taken = self
            .tracker
            .import(state.groups, |old| match names.get(&old) {
                Some((c, i)) => {
                    self.metrics
                        .labels(self.hash(c.as_str()), c, self.hash(i.as_str()), i)
                }
                None => self.metrics.labels(0, "unknown_service", 0, "unknown"),
            });
        self.metrics.set_tracker_keys(self.tracker.keys());
        taken
    }

    /// Reads at most `n` attributes of each span and resource; the rest are skipped unread
    /// and the span counted in `refusal_gate_receiver_truncated_spans_total`.
    #[must_use]
    pub fn with_max_attributes(mut self, n: usize) -> Pipeline {
        self.max_attributes = n;
        self
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Forwards what it ingests through `exporter` (built from this pipeline's metrics).
    #[must_use]
    pub fn with_exporter(mut self, config: &OtlpExporterConfig) -> Pipeline {
        self.exporter = Some(Arc::new(Exporter::new(
            config.clone(),
            self.metrics.export_metrics(),
        )));
        self
    }

    /// The exporter, when forwarding is on.
    pub fn exporter(&self) -> Option<&Arc<Exporter>> {
        self.exporter.as_ref()
    }

    /// One export request, from either receiver: decode, reserve room to forward it, run it
    /// through extract → classify → track inline, tag and queue it. Counts what it refuses.
    ///
    /// # Errors
    /// An [`IngestError`] that the receiver turns into its transport's answer.
    pub fn handle(
        &self,
        transport: Transport,
        body: &[u8],
        encoding: Encoding,
    ) -> Result<Summary, IngestError> {
        let started = std::time::Instant::now();
        let result = self.handle_inner(transport, body, encoding);
        match &result {
            Ok(_) => self
                .metrics
                .batch_duration(transport, started.elapsed().as_secs_f64()),
            Err(IngestError::Overloaded { spans, .. }) => {
                self.metrics.refused_spans(transport, "queue_full", *spans);
            }
            Err(e) => self.metrics.refused_request(transport, e.reason()),
        }
        result
    }

    fn handle_inner(
        &self,
        transport: Transport,
        body: &[u8],
        encoding: Encoding,
    ) -> Result<Summary, IngestError> {
        let Some(exporter) = &self.exporter else {
            return match encoding {
                // The hot path: spans are read in place, nothing is materialised.
                Encoding::Protobuf => {
                    frame_check(body)?;
                    Ok(self
                        .ingest_wire(transport, body, crate::clock::now(), None)
                        .0)
                }
                Encoding::Json => {
                    let batch = decode(body, encoding)?;
                    Ok(self.ingest(transport, &batch, crate::clock::now()))
                }
            };
        };
        // Forwarding re-frames protobuf; JSON is converted first.
        let converted;
        let (body, pre_rejected) = match encoding {
            Encoding::Protobuf => (body, 0),
            Encoding::Json => {
                let (pb, rejected) = json_to_protobuf(body)?;
                converted = pb;
                (&converted[..], rejected)
            }
        };
        let spans = frame_check(body)?;
        let reservation = exporter.reserve(spans);
        if reservation == Reservation::Refused {
            return Err(IngestError::Overloaded {
                retry_after: crate::export::RETRY_HINT,
                spans: spans as u64,
            });
        }
        let mut tags = Vec::with_capacity(spans);
        let (mut summary, malformed_at) =
            self.ingest_wire(transport, body, crate::clock::now(), Some(&mut tags));
        summary.rejected += pre_rejected;
        if reservation == Reservation::Granted {
            let forwarded = spans - malformed_at.len();
            exporter.release(malformed_at.len());
            match tag(body, &malformed_at, &tags) {
                Ok(tagged) => exporter.push(tagged, forwarded),
                Err(e) => {
                    // The framing was checked first, so this cannot happen; kept for safety.
                    exporter.release(forwarded);
                    tracing::error!(error = %e, "Could not re-frame a request for forwarding.");
                }
            }
        }
        Ok(summary)
    }

    /// Runs a protobuf request through extract → classify → track reading every span in
    /// place (its framing was checked by [`frame_check`]). With `tags`, pushes each decoded
    /// span's `refusal_gate.*` attributes as [`Pipeline::ingest_tagged`] does. Returns the
    /// summary and where the spans that could not be read stood (for [`tag`]).
    pub fn ingest_wire(
        &self,
        transport: Transport,
        body: &[u8],
        now: Nanos,
        tags: Option<&mut Vec<Option<Vec<u8>>>>,
    ) -> (Summary, Vec<u32>) {
        let interfaces = self.catalog.current();
        let mut request = RequestState::new(now, tags, 0);
        let mut staged = Vec::with_capacity(STAGED);
        let mut malformed_at = Vec::new();
        let mut seen = 0u32;
        for resource_spans in wire::each(body, 1).map_while(Result::ok) {
            let client = match wire::ResourceRef::of(resource_spans) {
                Ok(resource) => extract::client(|f| resource.attributes(self.max_attributes, f)),
                Err(_) => extract::client(|_| {}),
            };
            let mut client = self.client_ids(client);
            for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
                for bytes in wire::each(scope_spans, 2).map_while(Result::ok) {
                    let at = seen;
                    seen = seen.saturating_add(1);
                    let Ok(span) = wire::SpanRef::parse(bytes) else {
                        malformed_at.push(at);
                        request.summary.rejected += 1;
                        continue;
                    };
                    self.stage(&mut request, &interfaces, &mut client, &span, &mut staged);
                }
            }
            self.flush(&mut request, &mut staged);
        }
        self.finish_request(transport, &request.summary, &request.events);
        (request.summary, malformed_at)
    }

    /// The alerter.
    pub fn alerter(&self) -> &Arc<Alerter> {
        &self.alerter
    }

    /// Records what the tracker reported: counters, and an alert for every violation.
    fn record(&self, events: &[Event]) {
        self.metrics.record(events);
        let now = crate::clock::now();
        for event in events {
            let Event::Counted {
                labels,
                violation: Some(violation),
                operation,
                trace_id,
                span_id,
                ..
            } = event
            else {
                continue;
            };
            let Some((client, interface)) = self.metrics.label_names(*labels) else {
                continue;
            };
            self.alerter.raise(
                now,
                Alert {
                    key: AlertKey {
                        alertname: violation.alert_name(),
                        client,
                        interface,
                    },
                    severity: Severity::of(*violation),
                    violation: *violation,
                    operation: operation.clone().unwrap_or_else(|| Arc::from("")),
                    trace_id: *trace_id,
                    span_id: *span_id,
                    starts_at: now,
                    ends_at: now,
                },
            );
        }
    }

    /// The interfaces and their documents.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The tracker.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    fn hash(&self, value: impl Hash) -> u64 {
        self.hasher.hash_one(value)
    }

    /// Runs one decoded request through extract → classify → track and records it.
    pub fn ingest(&self, transport: Transport, batch: &Batch, now: Nanos) -> Summary {
        self.ingest_tagged(transport, batch, now, None)
    }

    /// As [`Pipeline::ingest`], and when `tags` is given, pushes for every decoded span, in
    /// order, the encoded `refusal_gate.*` attributes to append to it (`None` for spans that
    /// are not attempts, were tagged upstream, or were already seen).
    pub fn ingest_tagged(
        &self,
        transport: Transport,
        batch: &Batch,
        now: Nanos,
        tags: Option<&mut Vec<Option<Vec<u8>>>>,
    ) -> Summary {
        let interfaces = self.catalog.current();
        let mut request = RequestState::new(now, tags, batch.malformed);
        let mut staged = Vec::with_capacity(STAGED);
        for (resource, spans) in &batch.resources {
            let mut client = self.client_ids(extract::client_of(resource));
            for span in spans {
                self.stage(&mut request, &interfaces, &mut client, &span, &mut staged);
            }
            self.flush(&mut request, &mut staged);
        }
        self.finish_request(transport, &request.summary, &request.events);
        request.summary
    }

    /// A resource's client with its ids.
    fn client_ids<'a>(&self, client: extract::Client<'a>) -> ClientIds<'a> {
        ClientIds {
            client,
            id: self.hash(client),
            name: self.hash(client.name),
            labels: [(0, 0); 16],
            filled: 0,
        }
    }

    /// The metric labels of (client, interface), looked up once per request and interface.
    fn labels(&self, client: &mut ClientIds<'_>, interface: u64, interface_name: &str) -> u32 {
        let known = &client.labels[..client.filled.min(client.labels.len())];
        if let Some((_, labels)) = known.iter().find(|(i, _)| *i == interface) {
            return *labels;
        }
        let labels =
            self.metrics
                .labels(client.name, client.client.name, interface, interface_name);
        client.labels[client.filled % client.labels.len()] = (interface, labels);
        client.filled += 1;
        labels
    }

    /// Extracts one span and, when it is an attempt, places it and stages it for the
    /// tracker (which takes the staged attempts when there are [`STAGED`] of them, or the
    /// resource ends); reserves its place among the tags when asked for them.
    fn stage<'a>(
        &self,
        r: &mut RequestState<'_>,
        interfaces: &'a Interfaces,
        client: &mut ClientIds<'a>,
        span: &dyn extract::SpanView<'a>,
        staged: &mut Vec<Staged<'a>>,
    ) {
        r.summary.accepted += 1;
        if span.attribute_count() > self.max_attributes {
            r.summary.truncated += 1;
        }
        let slot = r.tags.as_deref_mut().map(|tags| {
            tags.push(None);
            tags.len() - 1
        });
        // Borrowed where it was built: an attempt is a few hundred bytes.
        let extracted = extract::extract(client.client, span, self.max_attributes);
        let attempt = match &extracted {
            Ok(attempt) => attempt,
            Err(skip) => {
                self.metrics.span_skipped(skip.label());
                return;
            }
        };
        r.summary.attempts += 1;
        let p = self.place(interfaces, attempt, client.id);
        let labels = self.labels(client, p.group.interface, p.interface_name);
        staged.push(Staged {
            obs: observation(&p, attempt, labels),
            operation: attempt.operation,
            // Spans tagged upstream are forwarded as they came.
            tag: slot
                .filter(|_| !attempt.tagged)
                .map(|at| (at, encode_place_tags(p.reason, p.interface_name))),
        });
        if staged.len() == STAGED {
            self.flush(r, staged);
        }
    }

    /// Runs the staged attempts through the tracker and fills in their tags.
    fn flush(&self, r: &mut RequestState<'_>, staged: &mut Vec<Staged<'_>>) {
        let tags = &mut r.tags;
        self.tracker.observe_all(
            r.now,
            staged,
            |s| (&s.obs, &s.operation),
            &mut r.events,
            |i, verdict| {
                let Some(judgement) = verdict else {
                    self.metrics.span_skipped("duplicate");
                    return;
                };
                if let (Some(tags), Some((at, placed))) = (tags.as_deref_mut(), &staged[i].tag) {
                    tags[*at] = Some(encode_tags(&judgement, placed));
                }
            },
        );
        staged.clear();
    }

    /// Records what one request amounted to.
    fn finish_request(&self, transport: Transport, summary: &Summary, events: &[Event]) {
        if summary.rejected > 0 {
            self.metrics
                .refused_spans(transport, "malformed_span", summary.rejected);
        }
        if summary.truncated > 0 {
            self.metrics.truncated_spans(transport, summary.truncated);
        }
        self.record(events);
        self.metrics.accepted(transport, summary.accepted);
    }

    /// Where an attempt stands: its interface, whether that declares the path, what the
    /// response said, and the tracker's ids for it (`client` is its client's id).
    fn place<'i>(
        &self,
        interfaces: &'i Interfaces,
        attempt: &'i Attempt<'_>,
        client: u64,
    ) -> Placed<'i> {
        use crate::discovery::InterfaceRef;
        let origin = attempt.origin.as_ref().map(|o| o.as_str());
        let mut interface = match origin {
            Some(_) => interfaces.resolve(origin, attempt.path),
            None if attempt.family == extract::Family::Grpc => {
                interfaces.resolve_grpc(attempt.operation.verb)
            }
            None => InterfaceRef::Unknown,
        };
        // A path matters only to a configured interface: a gRPC attempt's is built for one
        // alone (and may then choose among the interfaces on its origin).
        let mut room = None;
        let path = match interface {
            InterfaceRef::Configured(_) if attempt.path.is_none() => {
                let path = attempt.path_or_grpc(&mut room);
                if origin.is_some() && path.is_some() {
                    interface = interfaces.resolve(origin, path);
                }
                path
            }
            _ => attempt.path,
        };
        let interface_name = interfaces.name(interface);
        let declared = interfaces.declared(interface, path);
        let (outcome, reason) = classify::outcome(attempt.family, &attempt.signal);
        Placed {
            interface,
            interface_name,
            declared,
            outcome,
            reason: classify::reason(outcome, declared, reason),
            discovery: extract::discovery(attempt, outcome, interfaces, interface),
            group: GroupId {
                client,
                interface: self.hash(interface_name),
            },
            operation: self.hash(attempt.operation),
        }
    }

    /// Answers for one attempt put as a question (the Gate API) with the same classifier
    /// and the live tracker state that spans get. With `observe`, and a response to
    /// observe, the attempt is tracked and counted exactly as its span would be.
    pub fn assess(&self, attempt: &Attempt<'_>, answered: bool, observe: bool) -> Assessment {
        let interfaces = self.catalog.current();
        let mut client = self.client_ids(attempt.client);
        let p = self.place(&interfaces, attempt, client.id);
        let peek = self.tracker.peek(&p.group, p.operation, attempt.start);
        let base = Assessment {
            kind: classify::classify(p.outcome, p.declared, peek.read_before).kind,
            rule: p.reason.to_string(),
            interface: p.interface_name.to_owned(),
            last: peek.last,
            attempt: peek
                .last
                .map_or(1, |(kind, n)| if kind == Kind::Ok { 1 } else { n + 1 }),
            observed: false,
            alternatives: match attempt.path_or_grpc(&mut None) {
                Some(path) => interfaces.alternatives(p.interface, path),
                None => Vec::new(),
            },
            discovery_path: interfaces.discovery_path(p.interface).map(str::to_owned),
        };
        if !(observe && answered) {
            return base;
        }
        let mut events = Vec::new();
        let labels = self.labels(&mut client, p.group.interface, p.interface_name);
        let obs = observation(&p, attempt, labels);
        let judged =
            self.tracker
                .observe(crate::clock::now(), &obs, &attempt.operation, &mut events);
        if judged.is_none() {
            self.metrics.span_skipped("duplicate");
        }
        self.record(&events);
        match judged {
            Some(j) => Assessment {
                kind: j.kind,
                attempt: j.attempt,
                observed: true,
                ..base
            },
            None => base,
        }
    }

    /// Settles pending verdicts (all of them when `force`) and records them.
    pub fn settle(&self, force: bool) {
        let mut events = Vec::new();
        self.tracker.settle(crate::clock::now(), force, &mut events);
        self.record(&events);
    }

    /// Ends a replay: settles every verdict and judges every refusal as if the clock had
    /// run past all their windows.
    pub fn finish(&self) {
        let mut events = Vec::new();
        self.tracker.finish(&mut events);
        self.record(&events);
        self.metrics.set_tracker_keys(self.tracker.keys());
    }

    /// The periodic sweep: settles, counts honored refusals, expires keys.
    pub fn sweep(&self) {
        let mut events = Vec::new();
        let now = crate::clock::now();
        self.tracker.sweep(now, &mut events);
        self.record(&events);
        self.metrics.set_tracker_keys(self.tracker.keys());
        self.metrics.sweep(now / 1_000_000_000);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn request(spans: usize) -> ExportTraceServiceRequest {
        let span = Span {
            name: "GET".into(),
            kind: 3,
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource::default()),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span; spans],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn protobuf_walk_decodes_every_span() {
        let bytes = request(3).encode_to_vec();
        let batch = decode(&bytes, Encoding::Protobuf).expect("valid");
        assert_eq!(batch.span_count(), 3);
        assert_eq!(batch.malformed, 0);
        assert_eq!(batch.resources[0].1[0].name, "GET");
    }

    #[test]
    fn one_broken_protobuf_span_costs_only_itself() {
        let good = request(1).resource_spans[0].scope_spans[0].spans[0].encode_to_vec();
        let bad = vec![0x0a, 0x05, 0xff]; // name: a string field whose length runs past its span
        let mut scope = Vec::new();
        for span in [&good, &bad, &good] {
            scope.push(0x12); // ScopeSpans.spans
            prost::encoding::encode_varint(span.len() as u64, &mut scope);
            scope.extend_from_slice(span);
        }
        let mut rs = vec![0x12];
        prost::encoding::encode_varint(scope.len() as u64, &mut rs);
        rs.extend_from_slice(&scope);
        let mut body = vec![0x0a];
        prost::encoding::encode_varint(rs.len() as u64, &mut body);
        body.extend_from_slice(&rs);
        let batch = decode(&body, Encoding::Protobuf).expect("framing is valid");
        assert_eq!(batch.resources[0].1.len(), 2);
        assert_eq!(batch.malformed, 1);

        // The receivers' path reads the same request in place and forwards the rest.
        assert_eq!(frame_check(&body).expect("framing is valid"), 3);
        let pipeline = Pipeline::from_config(&crate::config::Config::default());
        let mut tags = Vec::new();
        let (summary, malformed_at) =
            pipeline.ingest_wire(Transport::Grpc, &body, 1, Some(&mut tags));
        assert_eq!((summary.accepted, summary.rejected), (2, 1));
        assert_eq!(malformed_at, vec![1]);
        assert_eq!(tags.len(), 2);
        let forwarded = tag(&body, &malformed_at, &tags).expect("re-framed");
        let request = ExportTraceServiceRequest::decode(&forwarded[..]).expect("a valid request");
        assert_eq!(request.resource_spans[0].scope_spans[0].spans.len(), 2);
    }

    #[test]
    fn a_grpc_attempt_is_placed_by_its_path_on_a_configured_origin() {
        use crate::otlp::fixtures::{s, span};
        let config = crate::config::Config::parse(
            "
interfaces:
  - name: a
    protocol: grpc
    url: http://g.test:50051
    endpoints: [{ path: /pkg.A/Get }]
  - name: b
    protocol: grpc
    url: http://g.test:50051/pkg.B
    endpoints: [{ path: /pkg.B/Get }]
",
        )
        .expect("valid");
        let pipeline = Pipeline::from_config(&config);
        let place = |service: &str, server: bool| {
            let mut attributes = vec![
                s("rpc.system", "grpc"),
                s("rpc.service", service),
                s("rpc.method", "Get"),
            ];
            if server {
                attributes.push(s("server.address", "g.test"));
                attributes.push(crate::otlp::fixtures::i("server.port", 50051));
            }
            let sp = span("x", attributes);
            let client = extract::client_of(&[]);
            let attempt = extract::extract(client, &&sp, 64).expect("an attempt");
            let assessed = pipeline.assess(&attempt, true, false);
            (assessed.interface, assessed.rule)
        };
        // /pkg.B/Get: under b's base path, on the origin both serve from.
        assert_eq!(place("pkg.B", true).0, "b");
        assert_eq!(place("pkg.A", true).0, "a");
        // No server: the interface that declares the service.
        assert_eq!(place("pkg.B", false).0, "b");
        assert_eq!(place("pkg.Nobody", false).0, "unknown");
    }

    #[test]
    fn tags_are_encoded_as_prost_encodes_them() {
        use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue};
        let long = "x".repeat(300);
        let cases = [
            (
                "refusal_gate.kind",
                Tag::Str("unverified_refusal"),
                Value::StringValue("unverified_refusal".into()),
            ),
            (
                "refusal_gate.reason",
                Tag::Str(&long),
                Value::StringValue(long.clone()),
            ),
            (
                "refusal_gate.discovery_read",
                Tag::Bool(true),
                Value::BoolValue(true),
            ),
            (
                "refusal_gate.discovery_read",
                Tag::Bool(false),
                Value::BoolValue(false),
            ),
            ("refusal_gate.attempt", Tag::Int(3), Value::IntValue(3)),
            ("refusal_gate.attempt", Tag::Int(-1), Value::IntValue(-1)),
        ];
        for (key, tag, value) in cases {
            let mut ours = Vec::new();
            push_tag(&mut ours, key, tag);
            let mut theirs = Vec::new();
            let kv = KeyValue {
                key: key.into(),
                value: Some(AnyValue { value: Some(value) }),
                ..Default::default()
            };
            prost::encoding::message::encode(9, &kv, &mut theirs);
            assert_eq!(ours, theirs, "{key}");
        }
    }

    #[test]
    fn attributes_past_the_limit_are_not_read_and_the_span_is_counted() {
        let pipeline =
            Pipeline::from_config(&crate::config::Config::default()).with_max_attributes(8);
        let filler = |n: usize| {
            (0..n)
                .map(|i| KeyValue {
                    key: format!("filler.{i}"),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::IntValue(i as i64)),
                    }),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        };
        let method = KeyValue {
            key: "http.request.method".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue("GET".into())),
            }),
            ..Default::default()
        };
        let request = |attributes: Vec<KeyValue>| {
            let mut r = request(1);
            r.resource_spans[0].scope_spans[0].spans[0].attributes = attributes;
            r.encode_to_vec()
        };
        // The method is the ninth attribute: past the limit, so the span has no protocol.
        let late = request([filler(8), vec![method.clone()]].concat());
        let early = request([vec![method], filler(8)].concat());
        for (body, attempts) in [(late, 0), (early, 1)] {
            for encoding in [Encoding::Protobuf, Encoding::Json] {
                let body = match encoding {
                    Encoding::Protobuf => body.clone(),
                    Encoding::Json => serde_json::to_vec(
                        &ExportTraceServiceRequest::decode(&body[..]).expect("valid"),
                    )
                    .expect("serialises"),
                };
                let summary = pipeline
                    .handle(Transport::Http, &body, encoding)
                    .expect("accepted");
                assert_eq!((summary.attempts, summary.truncated), (attempts, 1));
            }
        }
        assert!(pipeline
            .metrics()
            .render()
            .contains("refusal_gate_receiver_truncated_spans_total{transport=\"http\"} 4"));
    }

    #[test]
    fn broken_framing_is_malformed() {
        for body in [&b"\xff\xff\xff\xff not a message"[..], b"\x0a\x10short"] {
            assert!(matches!(
                decode(body, Encoding::Protobuf),
                Err(IngestError::Malformed { .. })
            ));
        }
        for body in [
            &b"{\"resourceSpans\": ["[..],
            b"[1,2]",
            b"{\"resourceSpans\": 5}",
        ] {
            assert!(matches!(
                decode(body, Encoding::Json),
                Err(IngestError::Malformed { .. })
            ));
        }
    }

    #[test]
    fn json_reads_hex_ids_enums_and_int64_either_way() {
        let body = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"a"}}]},
          "scopeSpans":[{"spans":[
            {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":3,
             "startTimeUnixNano":"100","endTimeUnixNano":200,
             "attributes":[{"key":"http.response.status_code","value":{"intValue":"404"}},
                           {"key":"server.port","value":{"intValue":8080}}]},
            {"traceId":"not hex","spanId":"zz","name":"bad"}
          ]}]}]}"#;
        let batch = decode(body, Encoding::Json).expect("valid");
        assert_eq!(batch.malformed, 1);
        let span = &batch.resources[0].1[0];
        assert_eq!(span.trace_id[0], 1);
        assert_eq!(span.kind, 3);
        assert_eq!(span.start_time_unix_nano, 100);
        assert_eq!(span.end_time_unix_nano, 200);
        assert_eq!(span.attributes.len(), 2);
    }

    #[test]
    fn errors_map_to_otlp_answers() {
        let cases = [
            (
                IngestError::Malformed {
                    encoding: "json",
                    detail: String::new(),
                },
                400,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::BadGzip(String::new()),
                400,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::TooLarge { limit: 1 },
                413,
                tonic::Code::ResourceExhausted,
            ),
            (
                IngestError::UnsupportedMediaType(String::new()),
                415,
                tonic::Code::InvalidArgument,
            ),
        ];
        for (e, http, grpc) in cases {
            assert_eq!(e.http_status(), http, "{e}");
            assert_eq!(e.grpc_code(), grpc, "{e}");
        }
    }
}
