//! The server view (DESIGN §9): the SERVER spans of an interface observed from its own
//! side become attempts on it, under the client the span names (`client_from`), one call
//! counted once.
//!
//! Core, as the rest of the pipeline: no sockets, no clock. Within one resource of one
//! export, an HTTP server span that is the parent of a protocol span (the MCP SDK's
//! `tools/call` inside the ASGI `POST /mcp`) lends the child its client and is not an
//! attempt itself. A span that still waits for a parent — the HTTP span that names its
//! client, or the client's own CLIENT span of the same call — is held in [`Calls`] until the
//! parent arrives or `reorder_window` passes.

use super::calls::{key, Calls, Held};
use super::{place, Pipeline, RequestState};
use crate::discovery::{InterfaceRef, Interfaces};
use crate::extract::{self, Attempt, Client, Family, UNKNOWN_CLIENT};
use crate::otlp::wire::SpanRef;
use crate::tracker::{Event, Nanos};

/// One SERVER span of an observed resource, as read from its request.
pub(super) struct ServerSpan<'a> {
    /// Its place among the request's tags, when forwarding.
    pub slot: Option<usize>,
    /// The span.
    pub span: SpanRef<'a>,
    /// Its protobuf bytes, kept when it is held.
    pub bytes: &'a [u8],
}

/// Where a server span's attempt goes next.
enum Next<'a> {
    /// Counted now, under this client.
    Count(Client<'a>),
    /// Held until the span `awaited` (its parent, or its HTTP parent's) arrives.
    Hold {
        awaited: &'a [u8],
        client: Option<Client<'a>>,
    },
    /// The same call as a client span already counted.
    SameCall,
}

/// Spans of a protocol family carried inside an HTTP request (whose HTTP server span, their
/// parent, names the client).
fn is_protocol(a: &Attempt<'_>) -> bool {
    matches!(a.family, Family::Mcp | Family::A2a | Family::JsonRpc)
}

/// A client nobody named.
const UNKNOWN: Client<'static> = Client {
    name: UNKNOWN_CLIENT,
    instance: None,
};

impl Pipeline {
    /// Runs one resource's SERVER spans, sent by `service` and observed as attempts on
    /// interface `index`.
    pub(super) fn server_view<'a>(
        &self,
        r: &mut RequestState<'_>,
        interfaces: &'a Interfaces,
        index: usize,
        service: &str,
        spans: &[ServerSpan<'a>],
    ) {
        let interface = InterfaceRef::Configured(index);
        let client_from = interfaces.client_from(interface).unwrap_or_default();
        let read: Vec<Option<(Attempt<'a>, Option<Client<'a>>)>> = spans
            .iter()
            .map(
                |s| match extract::extract_server(UNKNOWN, &s.span, self.max_attributes) {
                    Ok(attempt) => {
                        let named =
                            extract::server_client(&s.span, client_from, self.max_attributes);
                        Some((attempt, named))
                    }
                    Err(skip) => {
                        self.metrics.span_skipped(skip.label());
                        None
                    }
                },
            )
            .collect();
        let carriers = carriers(&read);
        let mut has_child = vec![false; read.len()];
        for &(p, _) in carriers.iter().flatten() {
            has_child[p] = true;
        }
        let mut calls = self.calls();
        for (i, (s, x)) in spans.iter().zip(&read).enumerate() {
            let Some((attempt, named)) = x else { continue };
            if has_child[i] {
                self.metrics.span_skipped("same_call");
                continue;
            }
            let parent = carriers[i].and_then(|(p, by_id)| Some((read[p].as_ref()?, by_id)));
            let client = named.or_else(|| parent.and_then(|((_, c), _)| *c));
            if attempt.family == Family::Http {
                // A protocol span held for this one, its HTTP parent: the call is the child's.
                if let Some(child) = calls.take(&key(attempt.trace_id, attempt.span_id)) {
                    self.metrics.span_skipped("same_call");
                    let awaited = attempt.parent_span_id;
                    let held = (child, client, awaited);
                    self.resume(r.now, &mut r.events, interfaces, &mut calls, held);
                    continue;
                }
            }
            // The span the call still waits for: the HTTP parent's parent (the client's span),
            // or the span's own when its carrier is no parent of it.
            let awaited = match parent {
                Some(((p, _), true)) => p.parent_span_id,
                _ => attempt.parent_span_id,
            };
            let next = next(attempt, client, awaited, &calls);
            match next {
                Next::SameCall => self.metrics.span_skipped("same_call"),
                Next::Count(client) => {
                    r.summary.attempts += 1;
                    let tags = s.slot.zip(r.tags.as_deref_mut());
                    self.count_server(
                        r.now,
                        &mut r.events,
                        interfaces,
                        index,
                        attempt,
                        client,
                        tags,
                    );
                }
                Next::Hold { awaited, client } => {
                    // Counted, or merged into its other half, when its wait ends.
                    r.summary.attempts += 1;
                    let held = Held {
                        arrived: r.now,
                        span: s.bytes.to_vec(),
                        service: service.to_owned(),
                        client: client.map(|c| (c.name.to_owned(), c.instance.map(str::to_owned))),
                    };
                    if let Some(early) = calls.hold(key(attempt.trace_id, awaited), held) {
                        self.release(r.now, &mut r.events, interfaces, early);
                    }
                }
            }
        }
    }

    /// A client span on an observed interface: remembered for its server span to come, and
    /// the one held for it, if any, dropped — one call, counted once.
    pub(super) fn client_call(&self, attempt: &Attempt<'_>, now: Nanos) {
        let call = key(attempt.trace_id, attempt.span_id);
        if self.calls().client_call(call, now).is_some() {
            self.metrics.span_skipped("same_call");
        }
    }

    /// Counts the held spans whose wait is over at `now` (all of them when `all`).
    pub(super) fn release_held(&self, now: Nanos, all: bool, out: &mut Vec<Event>) {
        let interfaces = self.catalog.current();
        if !interfaces.any_observed() {
            return;
        }
        let due = self.calls().due(now, all);
        for held in due {
            self.release(now, out, &interfaces, held);
        }
    }

    /// Counts a held span as it is: under the client it or its HTTP parent named, else
    /// `unknown_client`.
    fn release(&self, now: Nanos, out: &mut Vec<Event>, interfaces: &Interfaces, held: Held) {
        let Some(index) = interfaces.observed_by(&held.service) else {
            return;
        };
        let Ok(span) = SpanRef::parse(&held.span) else {
            return;
        };
        let Ok(attempt) = extract::extract_server(UNKNOWN, &span, self.max_attributes) else {
            return;
        };
        let client_from = interfaces
            .client_from(InterfaceRef::Configured(index))
            .unwrap_or_default();
        let client = match &held.client {
            Some((name, instance)) => Client {
                name,
                instance: instance.as_deref(),
            },
            None => {
                extract::server_client(&span, client_from, self.max_attributes).unwrap_or(UNKNOWN)
            }
        };
        self.count_server(now, out, interfaces, index, &attempt, client, None);
    }

    /// A held protocol span whose HTTP parent has arrived, naming `client` and itself the
    /// child of `awaited`: counted, held again for the client's span, or dropped.
    fn resume(
        &self,
        now: Nanos,
        out: &mut Vec<Event>,
        interfaces: &Interfaces,
        calls: &mut Calls,
        (held, client, awaited): (Held, Option<Client<'_>>, &[u8]),
    ) {
        let Ok(span) = SpanRef::parse(&held.span) else {
            return;
        };
        let Ok(attempt) = extract::extract_server(UNKNOWN, &span, self.max_attributes) else {
            return;
        };
        match next(&attempt, client, awaited, calls) {
            Next::SameCall => self.metrics.span_skipped("same_call"),
            Next::Count(client) => {
                if let Some(index) = interfaces.observed_by(&held.service) {
                    self.count_server(now, out, interfaces, index, &attempt, client, None);
                }
            }
            Next::Hold { awaited, client } => {
                let awaited = key(attempt.trace_id, awaited);
                let client = client.map(|c| (c.name.to_owned(), c.instance.map(str::to_owned)));
                let again = Held { client, ..held };
                if let Some(early) = calls.hold(awaited, again) {
                    self.release(now, out, interfaces, early);
                }
            }
        }
    }

    /// Tracks and counts one server span's attempt on interface `index` under `client`,
    /// and tags it when its place among the tags is given.
    #[allow(clippy::too_many_arguments)]
    fn count_server(
        &self,
        now: Nanos,
        out: &mut Vec<Event>,
        interfaces: &Interfaces,
        index: usize,
        attempt: &Attempt<'_>,
        client: Client<'_>,
        tags: Option<(usize, &mut crate::otlp::tags::SpanTags)>,
    ) {
        let mut ids = self.client_ids(client);
        let interface = InterfaceRef::Configured(index);
        let mut room = None;
        let path = attempt.path_or_grpc(&mut room);
        let p = self.place_in(interfaces, interface, attempt, path, ids.id);
        let labels = self.labels(&mut ids, p.group.interface, p.interface_name);
        let obs = place::observation(&p, attempt, labels);
        let Some(judgement) = self.tracker.observe(now, &obs, &attempt.operation, out) else {
            self.metrics.span_skipped("duplicate");
            return;
        };
        if let (Some((at, tags)), false) = (tags, attempt.tagged) {
            let reason = p.reason.to_string();
            tags.write(at, |buf| {
                place::write_place_tags(buf, &reason, p.interface_name);
                place::write_verdict_tags(buf, &judgement);
            });
        }
    }
}

/// Which HTTP server span of the same resource and export carries each protocol span, and
/// whether it is the span's parent (`true`): its parent, in the same trace; else — for a
/// protocol span that names no client and whose parent is not here, as when the MCP SDK
/// parents its span to the client's own span (trace context propagated in `_meta`) — the one
/// HTTP span whose time contains it, when it contains no other such span and no other
/// contains it.
fn carriers(read: &[Option<(Attempt<'_>, Option<Client<'_>>)>]) -> Vec<Option<(usize, bool)>> {
    let http = |p: usize| read[p].as_ref().filter(|(a, _)| a.family == Family::Http);
    let mut carriers: Vec<Option<(usize, bool)>> = read
        .iter()
        .map(|x| {
            let (a, _) = x.as_ref().filter(|(a, _)| is_protocol(a))?;
            if a.parent_span_id.is_empty() {
                return None;
            }
            (0..read.len())
                .find(|&p| {
                    http(p).is_some_and(|(h, _)| {
                        h.span_id == a.parent_span_id && h.trace_id == a.trace_id
                    })
                })
                .map(|p| (p, true))
        })
        .collect();
    let orphan = |i: usize, carriers: &[Option<(usize, bool)>]| {
        carriers[i].is_none()
            && read[i]
                .as_ref()
                .is_some_and(|(a, named)| is_protocol(a) && named.is_none())
    };
    let contains = |p: usize, i: usize| {
        let (Some((h, _)), Some((a, _))) = (http(p), read[i].as_ref()) else {
            return false;
        };
        h.start <= a.start && a.end <= h.end
    };
    let taken: Vec<bool> = (0..read.len())
        .map(|p| carriers.iter().flatten().any(|&(c, _)| c == p))
        .collect();
    for i in 0..read.len() {
        if !orphan(i, &carriers) {
            continue;
        }
        let mut around = (0..read.len()).filter(|&p| !taken[p] && contains(p, i));
        let (Some(p), None) = (around.next(), around.next()) else {
            continue;
        };
        let alone = (0..read.len()).all(|j| j == i || !orphan(j, &carriers) || !contains(p, j));
        if alone {
            carriers[i] = Some((p, false));
        }
    }
    carriers
}

/// Where an attempt goes when its call is known up to the span `awaited` (its parent, or its
/// HTTP parent's parent): counted when nothing is awaited, dropped when the client's span
/// has come already, else held (a protocol span whose parent is not here may be waiting
/// for the HTTP span that names its client).
fn next<'a>(
    attempt: &Attempt<'_>,
    client: Option<Client<'a>>,
    awaited: &'a [u8],
    calls: &Calls,
) -> Next<'a> {
    if awaited.is_empty() {
        return Next::Count(client.unwrap_or(UNKNOWN));
    }
    if calls.seen_client(&key(attempt.trace_id, awaited)) {
        return Next::SameCall;
    }
    Next::Hold { awaited, client }
}
