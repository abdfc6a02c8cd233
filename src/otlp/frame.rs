//! The framing of an export request: the check that must hold before anything of it is
//! ingested ([`check`]), and the re-framing that forwards it with each span's tags appended
//! ([`retag`]) — both on [`super::wire`]'s one field reader, so a request the check accepts is
//! one re-framing can read.
//!
//! Core: pure protocol code. Re-framing copies each byte once, straight to its output.

use super::tags::SpanTags;
use super::wire::{self, Broken};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};

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

impl<'t> SpanCursor<'t> {
    /// The next span's tags (empty when it has none), or `None` when it is left out.
    fn next(&mut self) -> Option<&'t [u8]> {
        let at = self.seen;
        self.seen += 1;
        if let Some((&first, rest)) = self.left_out.split_first() {
            if first == at {
                self.left_out = rest;
                return None;
            }
        }
        let extra = self.tags.get(self.decoded);
        self.decoded += 1;
        Some(extra)
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
/// `left_out` (indexes among all spans, ascending: they could not be read) are dropped.
/// Nothing else changes, byte for byte.
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
