//! Forwarding for a second tier routed by client (`tracker.role: join`, docs/operations.md
//! "Running several"): each span's *stamp* — `refusal_gate.client` and
//! `refusal_gate.client_instance`, the client of its call — and the split of a request into
//! one request per stamp.
//!
//! One request per client matters because the Collector's load-balancing exporter, routing by
//! an attribute, splits a request by trace and sends each trace whole to the replica of every
//! key found in it: a trace that held two clients' spans would reach both replicas. Requests of
//! different clients may still leave as one batch when no trace has spans in both
//! ([`Routed::traces`]).
//!
//! Core: pure protocol code.

use super::frame::{self, FrameError};
use super::span::SpanView;
use super::tags::{self, SpanTags, Tag};
use super::wire;
use foldhash::HashMap;

/// The span attribute naming the client of a span's call.
pub const CLIENT: &str = "refusal_gate.client";

/// The span attribute naming the instance of that client, when it has one.
pub const CLIENT_INSTANCE: &str = "refusal_gate.client_instance";

/// Appends the stamp of client `name` (instance `instance`) to `out`: encoded
/// `Span.attributes` fields, as tags are.
pub fn stamp(out: &mut Vec<u8>, name: &str, instance: Option<&str>) {
    tags::push(out, CLIENT, Tag::Str(name));
    if let Some(instance) = instance {
        tags::push(out, CLIENT_INSTANCE, Tag::Str(instance));
    }
}

/// One request of a split: the spans of one stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The request.
    pub body: Vec<u8>,
    /// How many spans it holds.
    pub spans: usize,
    /// The same for the same stamp.
    pub route: u64,
    /// The traces its spans belong to (sorted, once each): it is sent as one with requests of
    /// other routes only when they share none of them.
    pub traces: Vec<TraceId>,
}

/// A trace id as a key: the span's 16 bytes (a malformed one: its first 16, zero-padded).
pub type TraceId = [u8; 16];

/// `bytes` as a [`TraceId`].
pub fn trace_id(bytes: &[u8]) -> TraceId {
    let mut id = [0; 16];
    let n = bytes.len().min(16);
    id[..n].copy_from_slice(&bytes[..n]);
    id
}

/// The trace of each span of `body` that is not left out, in order (`left_out` as for
/// [`frame::retag`]).
fn traces_of(body: &[u8], left_out: &[u32]) -> Vec<TraceId> {
    let mut left_out = left_out.iter().copied().peekable();
    let mut out = Vec::new();
    let mut seen = 0u32;
    for resource_spans in wire::each(body, 1).map_while(Result::ok) {
        for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
            for span in wire::each(scope_spans, 2).map_while(Result::ok) {
                let at = seen;
                seen += 1;
                if left_out.next_if_eq(&at).is_none() {
                    let span = wire::SpanRef::parse(span);
                    out.push(span.map_or([0; 16], |s| trace_id(s.trace_id())));
                }
            }
        }
    }
    out
}

/// The sorted, distinct traces of the spans `of` says are of route `r`.
fn traces_in(traces: &[TraceId], of: &[Option<usize>], r: usize) -> Vec<TraceId> {
    let mut out: Vec<TraceId> = of
        .iter()
        .zip(traces)
        .filter(|(of, _)| **of == Some(r))
        .map(|(_, t)| *t)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The route of a stamp.
pub fn route_of(stamp: &[u8]) -> u64 {
    std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::with_seed(0), stamp)
}

/// Re-frames a request for forwarding as [`frame::retag`] does, but as one request per
/// distinct tags (each span's stamp): a request whose spans all carry the same is re-framed
/// once, byte for byte but for the tags; otherwise each request keeps every resource and
/// scope and only its own spans. Withheld and left-out spans are in none.
///
/// # Errors
/// [`FrameError`] when the framing is broken — never for a request [`frame::check`]
/// accepted.
pub fn split(body: &[u8], left_out: &[u32], tags: &SpanTags) -> Result<Vec<Routed>, FrameError> {
    let mut stamps: Vec<&[u8]> = Vec::new();
    let mut spans_of: Vec<usize> = Vec::new();
    let mut index: HashMap<&[u8], usize> = HashMap::default();
    let mut of_span = Vec::with_capacity(tags.len());
    for i in 0..tags.len() {
        if tags.is_withheld(i) {
            of_span.push(None);
            continue;
        }
        let stamp = tags.get(i);
        let r = *index.entry(stamp).or_insert_with(|| {
            stamps.push(stamp);
            spans_of.push(0);
            stamps.len() - 1
        });
        spans_of[r] += 1;
        of_span.push(Some(r));
    }
    let traces = traces_of(body, left_out);
    if stamps.len() <= 1 {
        let route = stamps.first().map_or(0, |s| route_of(s));
        let spans = spans_of.first().copied().unwrap_or(0);
        let traces = traces_in(&traces, &of_span, 0);
        let body = frame::retag(body, left_out, tags)?;
        return Ok(vec![Routed {
            body,
            spans,
            route,
            traces,
        }]);
    }
    let mut out = Vec::with_capacity(stamps.len());
    for (r, stamp) in stamps.iter().enumerate() {
        let mut only = SpanTags::with_capacity(tags.len(), 0);
        for of in &of_span {
            let i = only.push_span();
            match of {
                Some(of) if *of == r => only.write(i, |o| o.extend_from_slice(stamp)),
                _ => only.withhold(i),
            }
        }
        out.push(Routed {
            body: frame::retag(body, left_out, &only)?,
            spans: spans_of[r],
            route: route_of(stamp),
            traces: traces_in(&traces, &of_span, r),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::fixtures::{s, span};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    /// A request of `n` spans, the first half in one resource and the rest in another; span
    /// `k` is named `sk`, of trace `k + 1` (16 bytes of it).
    fn request(n: usize) -> Vec<u8> {
        let resource = |name: &str, spans: Vec<_>| ResourceSpans {
            resource: Some(Resource {
                attributes: vec![s("service.name", name)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        };
        let spans: Vec<_> = (0..n)
            .map(|k| Span {
                trace_id: vec![k as u8 + 1; 16],
                ..span(&format!("s{k}"), vec![])
            })
            .collect();
        let (first, rest) = spans.split_at(n / 2);
        ExportTraceServiceRequest {
            resource_spans: vec![
                resource("one", first.to_vec()),
                resource("two", rest.to_vec()),
            ],
        }
        .encode_to_vec()
    }

    fn stamped(name: &str, instance: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        stamp(&mut out, name, instance);
        out
    }

    /// Each span of `body` by name, with its stamp's attributes.
    fn clients(body: &[u8]) -> Vec<(String, Vec<(String, String)>)> {
        let request = ExportTraceServiceRequest::decode(body).expect("a request");
        let value = |v: &Option<_>| format!("{v:?}");
        request
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(|sp| {
                let stamp = sp
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), value(&kv.value)))
                    .collect();
                (sp.name.clone(), stamp)
            })
            .collect()
    }

    fn tags_of(stamps: &[Option<&[u8]>]) -> SpanTags {
        let mut tags = SpanTags::default();
        for stamp in stamps {
            let i = tags.push_span();
            match stamp {
                Some(stamp) => tags.write(i, |o| o.extend_from_slice(stamp)),
                None => tags.withhold(i),
            }
        }
        tags
    }

    #[test]
    fn a_stamp_names_the_client_and_its_instance_when_there_is_one() {
        let (with, without) = (stamped("agent", Some("pod-1")), stamped("agent", None));
        let split =
            split(&request(2), &[], &tags_of(&[Some(&with), Some(&without)])).expect("split");
        let all: Vec<_> = split.iter().flat_map(|r| clients(&r.body)).collect();
        let keys = |k: usize| all[k].1.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>();
        assert_eq!(keys(0), [CLIENT, CLIENT_INSTANCE]);
        assert!(all[0].1[0].1.contains("\"agent\"") && all[0].1[1].1.contains("\"pod-1\""));
        assert_eq!(keys(1), [CLIENT]);
    }

    #[test]
    fn spans_of_one_stamp_stay_one_request_as_retag_frames_it() {
        let body = request(3);
        let one = stamped("agent", None);
        let tags = tags_of(&[Some(&one), Some(&one), Some(&one)]);
        let split = split(&body, &[], &tags).expect("split");
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].spans, 3);
        assert_eq!(
            split[0].body,
            frame::retag(&body, &[], &tags).expect("retag")
        );
        assert_eq!(split[0].route, route_of(&one));
        assert_eq!(split[0].traces, [[1; 16], [2; 16], [3; 16]]);
        assert_ne!(route_of(&one), route_of(&stamped("agent", Some("pod-1"))));
    }

    #[test]
    fn spans_of_different_stamps_leave_in_different_requests_of_different_routes() {
        let (a, b) = (stamped("a", None), stamped("b", None));
        // Six spans: the third left out (not among the tags), the last withheld.
        let tags = tags_of(&[Some(&a), Some(&b), Some(&a), Some(&b), None]);
        let split = split(&request(6), &[2], &tags).expect("split");
        assert_eq!(split.len(), 2);
        assert_eq!((split[0].spans, split[1].spans), (2, 2));
        assert_eq!(
            (split[0].route, split[1].route),
            (route_of(&a), route_of(&b))
        );
        // The traces of their own spans: the one left out was of trace 3.
        assert_eq!(split[0].traces, [[1; 16], [4; 16]]);
        assert_eq!(split[1].traces, [[2; 16], [5; 16]]);
        let names = |r: &Routed| {
            clients(&r.body)
                .into_iter()
                .map(|c| c.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&split[0]), ["s0", "s3"]);
        assert_eq!(names(&split[1]), ["s1", "s4"]);
        for (r, name) in split.iter().zip(["a", "b"]) {
            for (_, stamp) in clients(&r.body) {
                assert_eq!(stamp.len(), 1);
                assert!(stamp[0].1.contains(&format!("\"{name}\"")), "{stamp:?}");
            }
        }
    }

    #[test]
    fn a_request_with_nothing_to_forward_is_one_empty_route() {
        let split = split(&request(1), &[], &tags_of(&[None])).expect("split");
        assert_eq!(split.len(), 1);
        assert_eq!((split[0].spans, split[0].route), (0, 0));
        assert!(split[0].traces.is_empty());
    }

    #[test]
    fn a_trace_id_of_the_wrong_length_is_cut_or_padded_to_sixteen_bytes() {
        assert_eq!(trace_id(&[7; 20]), [7; 16]);
        let mut short = [0; 16];
        short[..3].copy_from_slice(&[1, 2, 3]);
        assert_eq!(trace_id(&[1, 2, 3]), short);
    }
}
