//! One call, one attempt (DESIGN §9, §11), wired: the spans of a request that may be part of
//! a call with others, joined with each other and with the calls kept from earlier requests,
//! assembled ([`crate::extract::call`]), and counted — or held for the rest of their call.
//!
//! Core, as the rest of the pipeline: no sockets, no clock. A request's CLIENT spans that name
//! no parent are attempts at once (the hot path: while nothing is kept and no span of the
//! request names a parent, they cost nothing more); the others, and every SERVER span of an
//! observed interface, are *nodes*, joined once the whole request has been read, under one
//! lock of [`Calls`]. A call none of whose spans waits for a
//! parent still to come is counted; a span of it counted earlier (an attempt on its own, or
//! the call before a late span arrived) is taken back from the tracker first while it is
//! pending, so the call is counted once whatever the order its spans came in.

use super::calls::{key, At, Batch, Bound, Call, Calls, Owner, SpanKey};
use super::outbox::Outbox;
use super::{place, Pipeline, RequestState};
use crate::discovery::{InterfaceRef, Interfaces};
use crate::extract::call::{Member, Side};
use crate::extract::{self, Attempt, Client, Owned, UNKNOWN_CLIENT};
use crate::otlp::wire::SpanRef;
use crate::otlp::SpanView;
use crate::tracker::Observation;
use foldhash::{HashMap, HashSet};

mod carriers;
mod count;
mod joins;
mod work;

pub(super) use carriers::{carriers, wrappers};
use count::{keep_counted, mark_open, Counting, Places};
pub(super) use joins::{Joins, Memory, Node, Root};
use joins::{NodeMeta, Remembered, Seen};
use work::{From, Work};

/// A client nobody named.
const UNKNOWN: Client<'static> = Client {
    name: UNKNOWN_CLIENT,
    instance: None,
};

/// What a request leaves to come: the attempts to remember, the calls to keep for a late part
/// (with the calls the request took out, whose spans they take), and the spans the request
/// joined.
type Rest<'k> = (
    Vec<Remembered>,
    Option<(Batch, &'k mut [Call])>,
    &'k HashSet<SpanKey>,
);

impl Pipeline {
    /// A SERVER span of the resource sent by an observed interface's server, as a node.
    pub(super) fn server_node<'a>(
        &self,
        interfaces: &Interfaces,
        index: usize,
        span: &SpanRef<'a>,
        slot: Option<usize>,
    ) -> Option<Node<'a>> {
        let attempt = match extract::extract_server(UNKNOWN, span, self.max_attributes) {
            Ok(attempt) => attempt,
            Err(skip) => {
                self.metrics.span_skipped(skip.label());
                return None;
            }
        };
        let client_from = interfaces
            .client_from(InterfaceRef::Configured(index))
            .unwrap_or_default();
        let (client, named) = extract::server_client(span, client_from, self.max_attributes);
        let parent = (!attempt.parent_span_id.is_empty())
            .then(|| key(attempt.trace_id, attempt.parent_span_id));
        // A protocol span linked to the HTTP span that carried it is carried by it, as by a
        // parent (DESIGN §12.5); whether it is one is decided with the others' links.
        let carrier = span.link().map(|(trace, id)| key(trace, id));
        Some(Node {
            key: key(attempt.trace_id, attempt.span_id),
            parent,
            carrier,
            slot,
            // A server's span is never kept for a late part (it is remembered, observed).
            at: At::default(),
            member: Member {
                attempt: Attempt { client, ..attempt },
                side: Side::Server(index),
                named,
            },
        })
    }

    /// Joins the request's spans with each other and with the kept calls, counts every call
    /// that waits for nothing more, and keeps the rest (DESIGN §11).
    pub(super) fn assemble<'a>(
        &self,
        r: &mut RequestState<'_>,
        interfaces: &Interfaces,
        joins: Joins<'a>,
        (body, owner, malformed_at): (&'a [u8], Option<Owner<'_>>, &[u32]),
    ) {
        let mut calls = self.calls();
        // When forwarding, the outbox too: the request's calls may leave spans withheld, or
        // count calls whose spans were (DESIGN §11.5).
        let forwarding =
            r.tags.is_some() && (!joins.nodes.is_empty() || !joins.remember.is_empty());
        let mut outbox = self.outbox(forwarding);
        if joins.nodes.is_empty() && joins.seen.is_empty() {
            // Spans that name no parent, none named by another: nothing to join (every flat
            // export).
            let recent = joins.recent.map(|batch| (batch, &mut [][..]));
            let kept = (joins.remember, recent, &HashSet::default());
            let forced = (Vec::new(), outbox.as_deref_mut());
            self.keep_rest(&mut calls, interfaces, kept, (body, owner), r, forced);
        } else {
            let locked = (&mut *calls, outbox.as_deref_mut());
            self.assemble_in(r, interfaces, joins, (body, owner), locked);
        }
        if let Some(outbox) = outbox.as_deref_mut() {
            if let Some(tags) = r.tags.as_deref_mut() {
                self.withhold(outbox, (body, malformed_at), tags, r.now);
            }
            // What the request withheld, and what its calls' verdicts let go.
            self.outbox_gauges(outbox);
        }
    }

    /// [`Pipeline::assemble`] of a request with spans to join, under the calls' lock (and the
    /// outbox's, when forwarding).
    fn assemble_in<'a>(
        &self,
        r: &mut RequestState<'_>,
        interfaces: &Interfaces,
        joins: Joins<'a>,
        (body, owner): (&'a [u8], Option<Owner<'_>>),
        (calls, mut outbox): (&mut Calls, Option<&mut Outbox>),
    ) {
        let Joins {
            members,
            nodes,
            mut seen,
            mut roots,
            remember,
            recent,
            unrecorded,
            ..
        } = joins;
        // Parents read before recording began (a parent before its child in one export).
        if unrecorded > 0 {
            self.read_missing(calls, body, unrecorded, &nodes, (&mut seen, &mut roots));
        }
        let mut known: HashSet<SpanKey> =
            HashSet::with_capacity_and_hasher(2 * nodes.len(), Default::default());
        let mut fresh = self.fresh(calls, &nodes, &mut known);
        self.skip_counted(calls, &nodes, &mut fresh, r);
        // The kept calls and the request's roots that join them, found from the nodes out.
        let seen_at: HashMap<SpanKey, Option<u32>> = if fresh.is_empty() && !calls.any_awaiting() {
            HashMap::default()
        } else {
            seen.iter().copied().collect()
        };
        let (mut taken, used_roots) = self.take_joined(
            calls,
            interfaces,
            (&fresh, &nodes),
            (&seen, &seen_at),
            &mut known,
        );
        // The work set: nodes (their attempts moved, not copied), roots read again, and the
        // kept spans.
        let root_spans: Vec<Option<SpanRef<'a>>> = used_roots
            .iter()
            .map(|&i| SpanRef::parse(roots[i].bytes).ok())
            .collect();
        let kept_spans: usize = taken.iter().map(|c| c.members.len()).sum();
        let mut members = only_fresh(members, &fresh);
        members.reserve(used_roots.len() + kept_spans);
        let slots: Vec<Option<usize>> = nodes.iter().map(|n| n.slot).collect();
        let mut work = Work::with_members(members, fresh.len() + used_roots.len() + kept_spans);
        for &i in &fresh {
            let n = &nodes[i];
            work.describe(n.key, n.parent, n.carrier, From::Node(i));
        }
        self.push_roots(&mut work, &used_roots, &root_spans, &roots);
        self.push_kept(&mut work, &taken);
        let has_seen = |k: &SpanKey| seen_at.contains_key(k);
        mark_open(&mut work, &taken, &known, has_seen);
        let root_slots: Vec<Option<usize>> = roots.iter().map(|r| r.slot).collect();
        let (node_at, root_at): (Vec<At>, Vec<At>) = (
            nodes.iter().map(|n| n.at).collect(),
            roots.iter().map(|r| r.at).collect(),
        );
        let places = Places {
            slots: &slots,
            root_slots: &root_slots,
            at: &node_at,
            root_at: &root_at,
        };
        // The request's roots kept for a late part first: a call that joined one is added
        // after it, and takes its place.
        let mut batch = match recent {
            Some(mut batch) => {
                batch.drop_joined(|k| known.contains(k));
                batch
            }
            None => calls.recent_batch(),
        };
        let mut counting = Counting::of(r, outbox.as_deref_mut());
        let forced = self.run(
            calls,
            interfaces,
            &work,
            &taken,
            &mut counting,
            places,
            Some(&mut batch),
        );
        drop(work);
        drop(root_spans);
        let kept = (remember, Some((batch, &mut taken[..])), &known);
        self.keep_rest(calls, interfaces, kept, (body, owner), r, (forced, outbox));
    }

    /// Keeps what a request leaves to come: the attempts counted at once whose other side may
    /// come (unless a span of the request joined them: `known`), and the calls kept for a late
    /// part; then counts the held calls a bound forced out (`forced` and any more).
    fn keep_rest(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        (remember, recent, known): Rest<'_>,
        body: (&[u8], Option<Owner<'_>>),
        r: &mut RequestState<'_>,
        (mut forced, outbox): (Vec<(Call, Bound)>, Option<&mut Outbox>),
    ) {
        keep_counted(calls, remember, known, r.now, &mut forced);
        if let Some(recent) = recent {
            calls.keep_recent(body, recent, r.now);
        }
        self.count_forced(calls, interfaces, forced, (r.now, &mut r.events), outbox);
        self.held_gauge(calls);
    }

    /// The request's nodes, each once, by index (a span kept already, or twice in the request,
    /// is an exporter's retry: skipped as a duplicate); `known` gets their keys.
    fn fresh(&self, calls: &Calls, nodes: &[NodeMeta], known: &mut HashSet<SpanKey>) -> Vec<usize> {
        let mut fresh: Vec<usize> = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            if calls.holds(&n.key) || !known.insert(n.key) {
                self.metrics.span_skipped("duplicate");
                continue;
            }
            fresh.push(i);
        }
        fresh
    }

    /// Adds to the work set the request's roots that joined a call (`used`, by index in
    /// `roots`), each read again from its span (`spans`, in the same order).
    fn push_roots<'w>(
        &self,
        work: &mut Work<'w>,
        used: &[usize],
        spans: &'w [Option<SpanRef<'w>>],
        roots: &[Root<'w>],
    ) {
        for (at, span) in used.iter().zip(spans) {
            let root = &roots[*at];
            let Some(attempt) = span
                .as_ref()
                .and_then(|s| extract::extract(root.client, s, self.max_attributes).ok())
            else {
                continue;
            };
            let k = key(attempt.trace_id, attempt.span_id);
            let member = Member {
                attempt,
                side: Side::Client,
                named: false,
            };
            work.push(member, k, None, From::Root(*at));
        }
    }

    /// Reads again the first `unrecorded` spans of the request for the parents `nodes` name
    /// that are neither nodes nor seen nor kept (a parent before its child in one export),
    /// adding them to `seen` (and the attempts among them to `roots`).
    fn read_missing<'a>(
        &self,
        calls: &Calls,
        body: &'a [u8],
        unrecorded: u32,
        nodes: &[NodeMeta],
        (seen, roots): (&mut Vec<Seen>, &mut Vec<Root<'a>>),
    ) {
        let have: HashSet<SpanKey> = nodes
            .iter()
            .map(|n| n.key)
            .chain(seen.iter().map(|s| s.0))
            .collect();
        let missing: HashSet<SpanKey> = nodes
            .iter()
            .filter_map(|n| n.parent)
            .filter(|p| !have.contains(p) && !calls.holds(p))
            .collect();
        if missing.is_empty() {
            return;
        }
        for (k, root) in self.read_again(body, unrecorded, &missing) {
            let at = root.map(|root| {
                roots.push(root);
                (roots.len() - 1) as u32
            });
            seen.push((k, at));
        }
    }

    /// The kept calls the request's nodes join, taken out, and the request's roots that join
    /// them (by index in `roots`), found from the nodes out: each call waiting for one of
    /// their spans, and each holding a parent one of them names. `known` gets every span
    /// found.
    fn take_joined(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        (fresh, nodes): (&[usize], &[NodeMeta]),
        (seen, seen_at): (&[Seen], &HashMap<SpanKey, Option<u32>>),
        known: &mut HashSet<SpanKey>,
    ) -> (Vec<Call>, Vec<usize>) {
        let mut taken: Vec<Call> = Vec::new();
        let mut used_roots: Vec<usize> = Vec::new();
        let mut frontier: Vec<(SpanKey, Option<SpanKey>)> = fresh
            .iter()
            .map(|&i| (nodes[i].key, nodes[i].parent))
            .collect();
        if calls.any_awaiting() {
            for (k, root) in seen {
                if let Some(call) = calls.take_awaiting(k) {
                    frontier.extend(call.members.iter().map(|m| (m.key, m.parent)));
                    known.extend(call.members.iter().map(|m| m.key));
                    taken.push(call);
                    if let Some(root) = root {
                        if known.insert(*k) {
                            used_roots.push(*root as usize);
                        }
                    }
                }
            }
        }
        while let Some((k, parent)) = frontier.pop() {
            while let Some(call) = calls.take_awaiting(&k) {
                frontier.extend(call.members.iter().map(|m| (m.key, m.parent)));
                known.extend(call.members.iter().map(|m| m.key));
                taken.push(call);
            }
            let Some(p) = parent.filter(|p| !known.contains(p)) else {
                continue;
            };
            // A span of the request that is no attempt is in no call counted before it.
            let call = if seen_at.get(&p) == Some(&None) {
                calls.take_held_member(&p)
            } else {
                let read = |body: &[u8], at: At| read_again(body, at, self.max_attributes);
                calls.take_member(&p, read, |facts| self.recount(interfaces, facts))
            };
            if let Some(call) = call {
                frontier.extend(call.members.iter().map(|m| (m.key, m.parent)));
                known.extend(call.members.iter().map(|m| m.key));
                taken.push(call);
            } else if let Some(Some(root)) = seen_at.get(&p) {
                known.insert(p);
                used_roots.push(*root as usize);
                frontier.push((p, None));
            }
        }
        (taken, used_roots)
    }

    /// Takes out of `fresh` the nodes of calls counted already whose kept spans were forgotten
    /// past a bound ([`Calls::was_counted`]): each names such a span as its parent, or a node
    /// taken out so. Each is skipped as `same_call`, forwarded without verdict tags, and
    /// remembered in turn, so that the rest of its call is never counted as a call of its own.
    fn skip_counted(
        &self,
        calls: &mut Calls,
        nodes: &[NodeMeta],
        fresh: &mut Vec<usize>,
        r: &mut RequestState<'_>,
    ) {
        let counted = |n: &NodeMeta| n.parent.is_some_and(|p| calls.was_counted(&p));
        if !fresh.iter().any(|&i| counted(&nodes[i])) {
            return;
        }
        // Their descendants among the request's nodes, found from them down.
        let mut children: HashMap<SpanKey, Vec<usize>> = HashMap::default();
        for &i in fresh.iter() {
            if let Some(p) = nodes[i].parent {
                children.entry(p).or_default().push(i);
            }
        }
        let mut skip = vec![false; nodes.len()];
        let mut stack: Vec<usize> = fresh
            .iter()
            .copied()
            .filter(|&i| counted(&nodes[i]))
            .collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut skip[i], true) {
                continue;
            }
            stack.extend(children.get(&nodes[i].key).into_iter().flatten());
        }
        fresh.retain(|&i| !skip[i]);
        for (n, _) in nodes.iter().zip(&skip).filter(|(_, skipped)| **skipped) {
            self.metrics.span_skipped("same_call");
            calls.counted_gone(n.key, r.now);
            if let (Some(slot), Some(tags)) = (n.slot, r.tags.as_deref_mut()) {
                tags.write(slot, |_| {});
            }
        }
    }

    /// What an attempt counted at once (a root) was given to the tracker as, made again from
    /// it as it was made then (its metric labels aside: taking back does not look at them).
    fn observation_again(&self, interfaces: &Interfaces, a: &Attempt<'_>) -> Observation {
        let ids = self.client_ids(a.client);
        let p = self.place(interfaces, a, ids.id);
        place::observation(&p, a, 0)
    }

    /// [`Pipeline::observation_again`] of a root kept for a late part, from its facts.
    fn recount(&self, interfaces: &Interfaces, facts: &Owned) -> Observation {
        self.observation_again(interfaces, &facts.attempt())
    }

    /// The first `spans` spans of the request whose keys are `wanted`, read again: each key,
    /// and the attempt it was when it was one (counted at once: a root).
    fn read_again<'a>(
        &self,
        body: &'a [u8],
        spans: u32,
        wanted: &HashSet<SpanKey>,
    ) -> Vec<(SpanKey, Option<Root<'a>>)> {
        use crate::otlp::wire;
        let mut out = Vec::new();
        let mut decoded = 0u32;
        for resource_spans in wire::each(body, 1).map_while(Result::ok) {
            let client = match wire::ResourceRef::of(resource_spans) {
                Ok(resource) => extract::client(|f| resource.attributes(self.max_attributes, f)),
                Err(_) => extract::client(|_| {}),
            };
            for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
                for bytes in wire::each(scope_spans, 2).map_while(Result::ok) {
                    if decoded == spans {
                        return out;
                    }
                    let Ok(span) = SpanRef::parse(bytes) else {
                        continue;
                    };
                    let slot = decoded as usize;
                    decoded += 1;
                    let k = key(span.trace_id(), span.span_id());
                    if !wanted.contains(&k) {
                        continue;
                    }
                    let root = extract::extract(client, &span, self.max_attributes)
                        .is_ok()
                        .then_some(Root {
                            bytes,
                            client,
                            slot: Some(slot),
                            at: At::of(body, resource_spans, bytes),
                        });
                    out.push((k, root));
                }
            }
        }
        out
    }

    /// Adds the spans of the calls taken out to the work set.
    fn push_kept<'w>(&self, work: &mut Work<'w>, taken: &'w [Call]) {
        for (c, call) in taken.iter().enumerate() {
            for (m, kept) in call.members.iter().enumerate() {
                let member = Member {
                    attempt: kept.facts.attempt(),
                    side: kept.side,
                    named: kept.named,
                };
                work.push(
                    member,
                    kept.key,
                    kept.parent,
                    From::Kept { call: c, member: m },
                );
                *work.carriers.last_mut().expect("pushed") = kept.carrier;
            }
        }
    }
}

/// The nodes' members whose indices are in `fresh` (sorted), the rest dropped.
fn only_fresh<'a>(mut members: Vec<Member<'a>>, fresh: &[usize]) -> Vec<Member<'a>> {
    if fresh.len() < members.len() {
        let mut at = fresh.iter().peekable();
        let mut i = 0;
        members.retain(|_| {
            let keep = at.next_if_eq(&&i).is_some();
            i += 1;
            keep
        });
    }
    members
}

/// The facts of the span that stands `at` in `body`, read again (`None` when it no longer
/// reads as an attempt).
fn read_again(body: &[u8], at: At, max_attributes: usize) -> Option<Owned> {
    use crate::otlp::wire;
    let (resource, span) = at.read(body)?;
    let client = match wire::ResourceRef::of(resource) {
        Ok(resource) => extract::client(|f| resource.attributes(max_attributes, f)),
        Err(_) => extract::client(|_| {}),
    };
    let span = SpanRef::parse(span).ok()?;
    let attempt = extract::extract(client, &span, max_attributes).ok()?;
    Some(Owned::of(&attempt))
}

#[cfg(test)]
mod tests;
