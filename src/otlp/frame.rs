//! The framing of an export request: the check that must hold before anything of it is
//! ingested ([`check`]), and the re-framing that forwards it with each span's tags appended
//! ([`retag`]) — both on [`super::wire`]'s one field reader, so a request the check accepts is
//! one re-framing can read.
//!
//! Core: pure protocol code. Re-framing copies each byte once, straight to its output.

use super::tags::SpanTags;
use super::wire::{self, Broken};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use std::sync::Arc;

/// Where a request's framing is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("broken framing in {0}")]
pub struct FrameError(pub &'static str);

/// Checks a protobuf export request's framing down to its spans (not inside them) and counts
/// the spans.
///
/// # Errors
/// [`FrameError`] naming the request, a resource, resource spans or scope spans.
pub fn check(body: &[u8]) -> Result<usize, FrameError> {
    let mut spans = 0;
    for resource_spans in wire::each(body, 1) {
        let resource_spans = resource_spans.map_err(|_| FrameError("the request"))?;
        wire::ResourceRef::of(resource_spans).map_err(|_| FrameError("a resource"))?;
        for scope_spans in wire::each(resource_spans, 2) {
            let scope_spans = scope_spans.map_err(|_| FrameError("resource spans"))?;
            for span in wire::each(scope_spans, 2) {
                span.map_err(|_| FrameError("scope spans"))?;
                spans += 1;
            }
        }
    }
    Ok(spans)
}

/// The fields that lead from a request down to its spans: `resource_spans` (1),
/// `scope_spans` (2), `spans` (2).
const SPAN_PATH: [u32; 3] = [1, 2, 2];

/// The spans of a request in order, as [`retag`] rewrites them.
#[derive(Clone)]
struct SpanCursor<'t> {
    seen: u32,
    decoded: usize,
    left_out: &'t [u32],
    tags: &'t SpanTags,
}

/// What becomes of the next span of a request.
enum Next<'t> {
    /// It could not be read: dropped.
    LeftOut,
    /// Withheld, to leave later on its own: the index of its tags.
    Withheld(usize),
    /// Forwarded with these tags appended.
    Tagged(&'t [u8]),
}

impl<'t> SpanCursor<'t> {
    /// What becomes of the next span.
    fn step(&mut self) -> Next<'t> {
        let at = self.seen;
        self.seen += 1;
        if let Some((&first, rest)) = self.left_out.split_first() {
            if first == at {
                self.left_out = rest;
                return Next::LeftOut;
            }
        }
        let i = self.decoded;
        self.decoded += 1;
        match self.tags.is_withheld(i) {
            true => Next::Withheld(i),
            false => Next::Tagged(self.tags.get(i)),
        }
    }

    /// The next span's tags (empty when it has none), or `None` when it is left out or
    /// withheld.
    fn next(&mut self) -> Option<&'t [u8]> {
        match self.step() {
            Next::Tagged(extra) => Some(extra),
            Next::LeftOut | Next::Withheld(_) => None,
        }
    }
}

/// The length of the message `buf` at `depth` of [`SPAN_PATH`] once rewritten, its spans
/// taken from `spans`; `None` for a span that is left out.
fn rewritten_len(
    buf: &[u8],
    depth: usize,
    spans: &mut SpanCursor<'_>,
) -> Result<Option<usize>, Broken> {
    let Some(&wanted) = SPAN_PATH.get(depth) else {
        return Ok(spans.next().map(|extra| buf.len() + extra.len()));
    };
    let mut len = 0;
    for field in wire::raw_fields(buf) {
        let field = field?;
        match field.payload {
            Some(value) if field.number == wanted => {
                if let Some(n) = rewritten_len(value, depth + 1, spans)? {
                    len += key_len(wanted) + encoded_len_varint(n as u64) + n;
                }
            }
            _ => len += field.raw.len(),
        }
    }
    Ok(Some(len))
}

/// Writes the message `buf` at `depth` of [`SPAN_PATH`] rewritten: each span with its tags
/// appended, the ones left out dropped, every other byte as it was. A nested message's new
/// length is measured before it is written.
fn rewrite(
    buf: &[u8],
    depth: usize,
    spans: &mut SpanCursor<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Broken> {
    let wanted = SPAN_PATH[depth];
    let key = |out: &mut Vec<u8>, len: usize| {
        encode_key(wanted, WireType::LengthDelimited, out);
        encode_varint(len as u64, out);
    };
    for field in wire::raw_fields(buf) {
        let field = field?;
        match field.payload {
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

/// Rewrites a protobuf export request for forwarding: the `i`-th span that is kept gets
/// `tags.get(i)` (encoded `Span.attributes` fields) appended, in request order; the spans at
/// `left_out` (indexes among all spans, ascending: they could not be read) are dropped, and
/// so are the spans `tags` withholds ([`withheld`] reads them out). Nothing else changes,
/// byte for byte.
///
/// # Errors
/// [`FrameError`] when the framing is broken — never for a request [`check`] accepted.
pub fn retag(body: &[u8], left_out: &[u32], tags: &SpanTags) -> Result<Vec<u8>, FrameError> {
    let spans = SpanCursor {
        seen: 0,
        decoded: 0,
        left_out,
        tags,
    };
    let broken = |_| FrameError("the request");
    let len = rewritten_len(body, 0, &mut spans.clone())
        .map_err(broken)?
        .unwrap_or(0);
    let mut out = Vec::with_capacity(len);
    rewrite(body, 0, &mut spans.clone(), &mut out).map_err(broken)?;
    debug_assert_eq!(out.len(), len, "measured as written");
    Ok(out)
}

/// What a withheld span stood in: its `ResourceSpans` and its `ScopeSpans`, each without its
/// spans (the resource or scope and their schema URLs, as raw fields). Shared by the spans of
/// one scope; what [`enclose`] frames the span in again when it leaves on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The `ResourceSpans` fields other than `scope_spans`.
    pub resource: Arc<[u8]>,
    /// The `ScopeSpans` fields other than `spans`.
    pub scope: Arc<[u8]>,
}

impl Envelope {
    /// The bytes it holds.
    pub fn len(&self) -> usize {
        self.resource.len() + self.scope.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A span [`withheld`] read out of its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld<'b> {
    /// Its index among the request's tags.
    pub tag: usize,
    /// What it stood in.
    pub envelope: Envelope,
    /// The span.
    pub span: &'b [u8],
}

/// The fields of `message` other than those numbered `inner`, as they stand.
fn without(message: &[u8], inner: u32) -> Result<Arc<[u8]>, Broken> {
    let mut out = Vec::new();
    for field in wire::raw_fields(message) {
        let field = field?;
        if field.number != inner {
            out.extend_from_slice(field.raw);
        }
    }
    Ok(out.into())
}

/// The spans of a request that `tags` withholds, in request order (`left_out` as for
/// [`retag`]).
///
/// # Errors
/// [`FrameError`] when the framing is broken — never for a request [`check`] accepted.
pub fn withheld<'b>(
    body: &'b [u8],
    left_out: &[u32],
    tags: &SpanTags,
) -> Result<Vec<Withheld<'b>>, FrameError> {
    let mut out = Vec::with_capacity(tags.withheld());
    if tags.withheld() == 0 {
        return Ok(out);
    }
    let mut cursor = SpanCursor {
        seen: 0,
        decoded: 0,
        left_out,
        tags,
    };
    let broken = |_| FrameError("the request");
    for resource_spans in wire::each(body, 1) {
        let resource_spans = resource_spans.map_err(broken)?;
        let mut resource = None;
        for scope_spans in wire::each(resource_spans, 2) {
            let scope_spans = scope_spans.map_err(broken)?;
            let mut envelope: Option<Envelope> = None;
            for span in wire::each(scope_spans, 2) {
                let span = span.map_err(broken)?;
                let Next::Withheld(tag) = cursor.step() else {
                    continue;
                };
                let envelope = match &envelope {
                    Some(e) => e.clone(),
                    None => {
                        let resource = match &resource {
                            Some(r) => Arc::clone(r),
                            None => {
                                let r = without(resource_spans, 2).map_err(broken)?;
                                resource.insert(r).clone()
                            }
                        };
                        let scope = without(scope_spans, 2).map_err(broken)?;
                        envelope.insert(Envelope { resource, scope }).clone()
                    }
                };
                out.push(Withheld {
                    tag,
                    envelope,
                    span,
                });
            }
        }
    }
    Ok(out)
}

/// Appends to `out` (an export request being built) one `ResourceSpans` holding `span`, with
/// `tags` appended, in its `envelope`: a withheld span leaving on its own.
pub fn enclose(out: &mut Vec<u8>, envelope: &Envelope, span: &[u8], tags: &[u8]) {
    let field = |n: usize| key_len(2) + encoded_len_varint(n as u64) + n;
    let span_len = span.len() + tags.len();
    let scope_len = envelope.scope.len() + field(span_len);
    let resource_len = envelope.resource.len() + field(scope_len);
    out.reserve(field(resource_len));
    encode_key(1, WireType::LengthDelimited, out);
    encode_varint(resource_len as u64, out);
    out.extend_from_slice(&envelope.resource);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(scope_len as u64, out);
    out.extend_from_slice(&envelope.scope);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(span_len as u64, out);
    out.extend_from_slice(span);
    out.extend_from_slice(tags);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::fixtures::{s, span};
    use crate::otlp::tags::{push, Tag};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    fn named(id: u8) -> Span {
        Span {
            span_id: vec![id; 8],
            ..span("s", vec![s("n", &id.to_string())])
        }
    }

    /// Two resources, the first with two scopes: spans 1, 2 | 3 ; 4, 5.
    fn request() -> ExportTraceServiceRequest {
        let scope = |name: &str, spans| ScopeSpans {
            scope: Some(InstrumentationScope {
                name: name.into(),
                ..Default::default()
            }),
            spans,
            schema_url: format!("{name}-schema"),
        };
        let resource = |service: &str, scopes| ResourceSpans {
            resource: Some(Resource {
                attributes: vec![s("service.name", service)],
                ..Default::default()
            }),
            scope_spans: scopes,
            schema_url: "r-schema".into(),
        };
        ExportTraceServiceRequest {
            resource_spans: vec![
                resource(
                    "a",
                    vec![
                        scope("x", vec![named(1), named(2)]),
                        scope("y", vec![named(3)]),
                    ],
                ),
                resource("b", vec![scope("z", vec![named(4), named(5)])]),
            ],
        }
    }

    #[test]
    fn withheld_spans_leave_the_request_and_come_back_each_in_its_envelope() {
        let body = request().encode_to_vec();
        let mut tags = SpanTags::default();
        for _ in 0..4 {
            tags.push_span();
        }
        // Span 2 could not be read (the second of all): the tags are of 1, 3, 4, 5.
        let left_out = [1];
        tags.write(1, |out| push(out, "refusal_gate.kind", Tag::Str("ok")));
        tags.withhold(1);
        tags.withhold(3);
        let forwarded = ExportTraceServiceRequest::decode(
            &retag(&body, &left_out, &tags).expect("re-framed")[..],
        )
        .expect("decodes");
        let ids: Vec<Vec<u8>> = forwarded
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.span_id.clone())
            .collect();
        assert_eq!(
            ids,
            [vec![1; 8], vec![4; 8]],
            "3 and 5 withheld, 2 left out"
        );
        let held = withheld(&body, &left_out, &tags).expect("read out");
        assert_eq!(
            held.iter().map(|w| w.tag).collect::<Vec<_>>(),
            [1, 3],
            "by their tags' index"
        );
        let mut out = Vec::new();
        for w in &held {
            enclose(&mut out, &w.envelope, w.span, tags.get(w.tag));
        }
        let alone = ExportTraceServiceRequest::decode(&out[..]).expect("decodes");
        let original = request();
        let mut want_3 = original.resource_spans[0].clone();
        want_3.scope_spans = vec![original.resource_spans[0].scope_spans[1].clone()];
        want_3.scope_spans[0].spans[0]
            .attributes
            .push(s("refusal_gate.kind", "ok"));
        let mut want_5 = original.resource_spans[1].clone();
        want_5.scope_spans[0].spans = vec![named(5)];
        assert_eq!(alone.resource_spans, [want_3, want_5]);
        let mut header = original.resource_spans[0].clone();
        let scope = ScopeSpans {
            spans: Vec::new(),
            ..header.scope_spans[0].clone()
        };
        header.scope_spans.clear();
        let header = header.encoded_len() + scope.encoded_len();
        assert_eq!(
            held[0].envelope.len(),
            header,
            "its resource and scope, not their spans"
        );
        assert!(!held[0].envelope.is_empty());
        // Nothing withheld: nothing read.
        let none = SpanTags::default();
        assert_eq!(withheld(&body, &[], &none), Ok(Vec::new()));
        assert_eq!(
            withheld(&[0x0a, 0x05, 1], &[], &tags),
            Err(FrameError("the request"))
        );
    }

    #[test]
    fn spans_of_one_scope_share_its_envelope() {
        let body = request().encode_to_vec();
        let mut tags = SpanTags::default();
        for i in 0..5 {
            tags.push_span();
            if i != 2 {
                tags.withhold(i);
            }
        }
        let held = withheld(&body, &[], &tags).expect("read out");
        assert_eq!(held.len(), 4);
        assert!(Arc::ptr_eq(
            &held[0].envelope.scope,
            &held[1].envelope.scope
        ));
        assert!(Arc::ptr_eq(
            &held[0].envelope.resource,
            &held[1].envelope.resource
        ));
        assert!(!Arc::ptr_eq(
            &held[1].envelope.resource,
            &held[2].envelope.resource
        ));
        assert_eq!(held[2].envelope, held[3].envelope);
    }
}
