//! The shared ingest path: both receivers hand it the raw request bytes, it decodes them
//! span by span, runs extract → classify → track inline, and records what happened.
//!
//! Edge, but a thin one: decoding and the [`Pipeline`] hold no sockets and no tasks. The
//! one error type, [`IngestError`], maps to the gRPC and HTTP answers in one place
//! ([`IngestError::grpc_code`], [`IngestError::http_status`]), as OTLP specifies them.
//! A span that fails to decode is skipped and counted; it never fails its batch.

pub mod grpc;
pub mod http;

use crate::alert::delivery::Alerter;
use crate::alert::{Alert, AlertKey, Severity};
use crate::classify;
use crate::config::AlertingConfig;
use crate::discovery::loader::Catalog;
use crate::discovery::Interfaces;
use crate::extract::{self, Attempt};
use crate::metrics::Metrics;
use crate::tracker::{Event, GroupId, Nanos, Observation, Tracker};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Which receiver a request came in on: the `transport` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP.
    Http,
}

impl Transport {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}

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
}

impl IngestError {
    /// The `reason` label for refused requests.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::Malformed { .. } => "malformed",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::UnsupportedMediaType(_) => "unsupported_media_type",
            IngestError::UnsupportedEncoding(_) => "unsupported_encoding",
            IngestError::BadGzip(_) => "bad_gzip",
        }
    }

    /// The OTLP/HTTP status.
    pub fn http_status(&self) -> u16 {
        match self {
            IngestError::Malformed { .. } | IngestError::BadGzip(_) => 400,
            IngestError::TooLarge { .. } => 413,
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => 415,
        }
    }

    /// The OTLP/gRPC status code.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            IngestError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            IngestError::UnsupportedEncoding(_) => tonic::Code::Unimplemented,
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

/// Decodes a request body span by span.
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

/// The length-delimited fields numbered `wanted` of one protobuf message; other fields are
/// skipped by wire type.
fn fields(mut buf: &[u8], wanted: u32) -> Result<Vec<&[u8]>, String> {
    use prost::encoding::{decode_key, decode_varint, WireType};
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).map_err(|e| e.to_string())?;
        match wire {
            WireType::Varint => {
                decode_varint(&mut buf).map_err(|e| e.to_string())?;
            }
            WireType::SixtyFourBit | WireType::ThirtyTwoBit => {
                let n = if wire == WireType::SixtyFourBit { 8 } else { 4 };
                buf = buf.get(n..).ok_or("truncated fixed-width field")?;
            }
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut buf).map_err(|e| e.to_string())?)
                    .map_err(|_| "length out of range")?;
                let value = buf.get(..len).ok_or("truncated length-delimited field")?;
                buf = &buf[len..];
                if tag == wanted {
                    out.push(value);
                }
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(format!("field {tag} uses deprecated groups"));
            }
        }
    }
    Ok(out)
}

/// OTLP/JSON, leniently: the request must be a JSON object of the right shape; each span
/// that does not deserialize is skipped and counted.
fn decode_json(body: &[u8]) -> Result<Batch, IngestError> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use serde_json::Value;
    // The fast path: a well-formed request deserializes in one pass. Only when it does not
    // is the body walked span by span, so that one bad span costs only itself.
    if let Ok(request) = serde_json::from_slice::<ExportTraceServiceRequest>(body) {
        return Ok(Batch {
            resources: request
                .resource_spans
                .into_iter()
                .map(|rs| {
                    let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
                    let spans = rs.scope_spans.into_iter().flat_map(|ss| ss.spans).collect();
                    (resource, spans)
                })
                .collect(),
            malformed: 0,
        });
    }
    let malformed = |detail: String| IngestError::Malformed {
        encoding: "json",
        detail,
    };
    let mut root: Value = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    let Some(root) = root.as_object_mut() else {
        return Err(malformed("the request is not a JSON object".into()));
    };
    let mut batch = Batch::default();
    let resource_spans = match root.remove("resourceSpans") {
        None | Some(Value::Null) => return Ok(batch),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(malformed("resourceSpans is not an array".into())),
    };
    for mut rs in resource_spans {
        let resource = match rs.get_mut("resource").map(Value::take) {
            None | Some(Value::Null) => Vec::new(),
            Some(r) => {
                serde_json::from_value::<Resource>(r)
                    .map_err(|e| malformed(format!("resource: {e}")))?
                    .attributes
            }
        };
        let mut spans = Vec::new();
        let scopes = match rs.get_mut("scopeSpans").map(Value::take) {
            Some(Value::Array(scopes)) => scopes,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(malformed("scopeSpans is not an array".into())),
        };
        for mut scope in scopes {
            let list = match scope.get_mut("spans").map(Value::take) {
                Some(Value::Array(list)) => list,
                None | Some(Value::Null) => Vec::new(),
                Some(_) => return Err(malformed("spans is not an array".into())),
            };
            for span in list {
                match serde_json::from_value::<Span>(span) {
                    Ok(span) => spans.push(span),
                    Err(_) => batch.malformed += 1,
                }
            }
        }
        batch.resources.push((resource, spans));
    }
    Ok(batch)
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
}

/// Everything a request needs, shared by the receivers, the admin endpoint and the sweeper.
pub struct Pipeline {
    catalog: Arc<Catalog>,
    tracker: Tracker,
    metrics: Metrics,
    alerter: Arc<Alerter>,
    hasher: RandomState,
}

/// Unix nanoseconds now: the tracker's clock when serving.
pub fn wall_clock() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
        Pipeline {
            catalog,
            tracker,
            metrics,
            alerter: Arc::new(Alerter::new(alerting, alerts, deliveries)),
            hasher: RandomState::new(),
        }
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The alerter.
    pub fn alerter(&self) -> &Arc<Alerter> {
        &self.alerter
    }

    /// Records what the tracker reported: counters, and an alert for every violation.
    fn record(&self, events: &[Event]) {
        self.metrics.record(events);
        let now = wall_clock();
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
                    operation: operation.as_deref().unwrap_or("").to_owned(),
                    trace_id: hex(trace_id),
                    span_id: hex(span_id),
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
        let mut summary = Summary {
            rejected: batch.malformed,
            ..Summary::default()
        };
        let mut events = Vec::new();
        let interfaces = self.catalog.current();
        for (resource, spans) in &batch.resources {
            for span in spans {
                summary.accepted += 1;
                match extract::extract(resource, span) {
                    Ok(attempt) => {
                        self.observe(&interfaces, &attempt, now, &mut events);
                        summary.attempts += 1;
                    }
                    Err(skip) => self.metrics.span_skipped(skip.label()),
                }
            }
        }
        if batch.malformed > 0 {
            self.metrics
                .refused_spans(transport, "malformed_span", batch.malformed);
        }
        self.record(&events);
        self.metrics.accepted(transport, summary.accepted);
        summary
    }

    fn observe(
        &self,
        interfaces: &Interfaces,
        attempt: &Attempt<'_>,
        now: Nanos,
        events: &mut Vec<Event>,
    ) {
        let interface = interfaces.resolve(attempt.origin.as_deref(), attempt.path);
        let interface_name = interfaces.name(interface);
        let declared = interfaces.declared(interface, attempt.path);
        let (outcome, _reason) = classify::outcome(attempt.family, &attempt.signal);
        let discovery_read = outcome == classify::Outcome::Ok
            && extract::reads_discovery(attempt, interfaces, interface);
        let interface_id = self.hash(interface_name);
        let labels = self.metrics.labels(
            self.hash(attempt.client.name),
            attempt.client.name,
            interface_id,
            interface_name,
        );
        let obs = Observation {
            group: GroupId {
                client: self.hash(attempt.client),
                interface: interface_id,
            },
            operation: self.hash(attempt.operation),
            labels,
            start: attempt.start,
            end: attempt.end,
            outcome,
            declared,
            discovery_read,
            trace_id: fixed(attempt.trace_id),
            span_id: fixed(attempt.span_id),
        };
        if self
            .tracker
            .observe(now, &obs, &attempt.operation, events)
            .is_none()
        {
            self.metrics.span_skipped("duplicate");
        }
    }

    /// Settles pending verdicts (all of them when `force`) and records them.
    pub fn settle(&self, force: bool) {
        let mut events = Vec::new();
        self.tracker.settle(wall_clock(), force, &mut events);
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
        self.tracker.sweep(wall_clock(), &mut events);
        self.record(&events);
        self.metrics.set_tracker_keys(self.tracker.keys());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
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
