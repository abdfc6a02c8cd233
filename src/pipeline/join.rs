//! The first tier's forwarding (`tracker.role: join`, docs/operations.md "Running several"):
//! every span leaves stamped with the client of its call — an attempt's own, a part of a call
//! its call's, and a span of no call its resource's — one client per forwarded request (sent
//! as one batch with others only when they share no trace), so that a second tier routed by
//! `refusal_gate.client` brings each client's calls, both sides of them, to one replica.
//!
//! Thin: the stamps are written where tags would be (the pipeline's counting); this frames
//! what leaves ([`crate::otlp::route`]).

use super::outbox::Parcel;
use super::Pipeline;
use crate::export::Exporter;
use crate::extract;
use crate::otlp::frame;
use crate::otlp::route::{self, Routed};
use crate::otlp::tags::SpanTags;
use crate::otlp::wire;
use crate::otlp::SpanView;

impl Pipeline {
    /// Queues a request's `forwarded` spans (their room reserved for its `body`'s size), one
    /// request per client; a span without a stamp takes its resource's.
    pub(super) fn forward_stamped(
        &self,
        exporter: &Exporter,
        (body, left_out): (&[u8], &[u32]),
        tags: &mut SpanTags,
        forwarded: usize,
    ) {
        stamp_the_rest(body, left_out, tags, self.max_attributes);
        match route::split(body, left_out, tags) {
            Ok(requests) => {
                let mut reserved = body.len();
                for Routed {
                    body: out,
                    spans,
                    route,
                    traces,
                } in requests
                {
                    let reserved = std::mem::take(&mut reserved);
                    if spans == 0 {
                        // Every span of it withheld, or left out: nothing to send now.
                        exporter.release(0, reserved);
                        continue;
                    }
                    exporter.push_routed(out, spans, reserved, (route, traces));
                }
            }
            Err(e) => {
                // The framing was checked first, on the same reader: this cannot happen.
                exporter.release(forwarded, body.len());
                tracing::error!(error = %e, "Could not re-frame a request for forwarding.");
            }
        }
    }

    /// Queues withheld spans leaving together, one request per client; a span without a
    /// stamp (it left before its call was counted) takes its resource's.
    pub(super) fn forward_parcels_stamped(&self, exporter: &Exporter, parcels: &[Parcel]) {
        let mut groups: Vec<(Vec<u8>, Vec<u8>, Vec<route::TraceId>)> = Vec::new();
        for p in parcels {
            let stamp = match p.tags.is_empty() {
                true => resource_stamp(&p.envelope.resource, self.max_attributes),
                false => p.tags.clone(),
            };
            let at = match groups.iter().position(|(s, _, _)| *s == stamp) {
                Some(at) => at,
                None => {
                    groups.push((stamp, Vec::new(), Vec::new()));
                    groups.len() - 1
                }
            };
            let (stamp, out, traces) = &mut groups[at];
            frame::enclose(out, &p.envelope, &p.span, stamp);
            let span = wire::SpanRef::parse(&p.span);
            traces.push(span.map_or([0; 16], |s| route::trace_id(s.trace_id())));
        }
        for (stamp, out, mut traces) in groups {
            let spans = traces.len();
            traces.sort_unstable();
            traces.dedup();
            exporter.push_routed(out, spans, 0, (route::route_of(&stamp), traces));
        }
    }
}

/// The stamp of the client a resource names (`service.name`, `service.instance.id`), read
/// from its `ResourceSpans` (or those fields of it that an envelope keeps).
fn resource_stamp(resource_spans: &[u8], max_attributes: usize) -> Vec<u8> {
    let client = match wire::ResourceRef::of(resource_spans) {
        Ok(resource) => extract::client(|f| resource.attributes(max_attributes, f)),
        Err(_) => extract::client(|_| {}),
    };
    let mut out = Vec::new();
    route::stamp(&mut out, client.name, client.instance);
    out
}

/// Stamps every span of the request that is forwarded now without a stamp with its
/// resource's client (`left_out` as for [`frame::retag`]).
fn stamp_the_rest(body: &[u8], left_out: &[u32], tags: &mut SpanTags, max_attributes: usize) {
    let mut left_out = left_out.iter().copied().peekable();
    let (mut seen, mut decoded) = (0u32, 0usize);
    for resource_spans in wire::each(body, 1).map_while(Result::ok) {
        let mut stamp: Option<Vec<u8>> = None;
        for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
            for _ in wire::each(scope_spans, 2).map_while(Result::ok) {
                let at = seen;
                seen += 1;
                if left_out.next_if_eq(&at).is_some() {
                    continue;
                }
                let i = decoded;
                decoded += 1;
                if tags.is_withheld(i) || !tags.get(i).is_empty() {
                    continue;
                }
                let stamp =
                    stamp.get_or_insert_with(|| resource_stamp(resource_spans, max_attributes));
                tags.write(i, |out| out.extend_from_slice(stamp));
            }
        }
    }
}
