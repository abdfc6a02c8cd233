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

use super::calls::{key, At, Batch, Bound, Call, Calls, Kept, RecentMember, SpanKey, State};
use super::{place, Pipeline, RequestState};
use crate::discovery::{Declared, InterfaceRef, Interfaces};
use crate::extract::call::{self, Joined, Link, Member, Role, Side};
use crate::extract::{self, Attempt, Client, Family, Owned, UNKNOWN_CLIENT};
use crate::otlp::tags::SpanTags;
use crate::otlp::wire::SpanRef;
use crate::otlp::SpanView;
use crate::tracker::{Event, Nanos, Observation, Retraction};
use bytes::Bytes;
use foldhash::{HashMap, HashSet};

/// A span of the request that may be part of a call with others: one that names a parent, a
/// parent named earlier in the request, or a SERVER span of an observed interface.
pub(super) struct Node<'a> {
    /// The span read as an attempt.
    pub member: Member<'a>,
    /// The span.
    pub key: SpanKey,
    /// The parent it names.
    pub parent: Option<SpanKey>,
    /// The HTTP server span of the same export whose time contains it (a protocol server
    /// span whose parent is not one: DESIGN §9).
    pub carrier: Option<SpanKey>,
    /// Its place among the request's tags, when forwarding.
    pub slot: Option<usize>,
    /// Where it stands in the request.
    pub at: At,
}

/// An attempt of the request counted at once, which a later span of its call may join.
pub(super) struct Root<'a> {
    /// Its span's protobuf bytes, read again if it joins a call.
    pub bytes: &'a [u8],
    /// Its client.
    pub client: Client<'a>,
    /// Its place among the request's tags, when forwarding.
    pub slot: Option<usize>,
    /// Where it stands in the request.
    pub at: At,
}

/// The spans a request's vectors and maps of spans make room for at once.
const ROOM: usize = 64;

/// What a node is besides its attempt.
#[derive(Debug, Clone, Copy)]
pub(super) struct NodeMeta {
    /// The span.
    pub key: SpanKey,
    /// The parent it names.
    pub parent: Option<SpanKey>,
    /// The HTTP server span of the same export whose time contains it.
    pub carrier: Option<SpanKey>,
    /// Its place among the request's tags, when forwarding.
    pub slot: Option<usize>,
    /// Where it stands in the request.
    pub at: At,
}

/// How long a counted call is kept for the rest of it to join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Memory {
    /// Its other side is expected — a client call on an observed interface (its server's
    /// spans), or one that named no server (a request under it, or a server span that places
    /// it): remembered a minute at least.
    Remembered,
    /// Whole as far as anyone expects, but a span of its own may still come late (a child that
    /// ended after it): kept for the reorder window ([`Calls::keep_recent`]).
    Recent,
}

impl Memory {
    /// How long a counted call is kept: remembered when its other side is expected
    /// (`awaited`), else for the reorder window when a part of its own may still come late
    /// (`may_grow`: it has a client protocol span), else not at all.
    pub(super) fn of(awaited: bool, may_grow: bool) -> Option<Memory> {
        match (awaited, may_grow) {
            (true, _) => Some(Memory::Remembered),
            (false, true) => Some(Memory::Recent),
            (false, false) => None,
        }
    }
}

/// What a request's spans say of their calls.
#[derive(Default)]
pub(super) struct Joins<'a> {
    /// The spans to join, read as attempts: moved as they are into the work set, not copied.
    pub members: Vec<Member<'a>>,
    /// The rest of each of them.
    pub nodes: Vec<NodeMeta>,
    /// Every other span since recording began: its key, and its index in `roots` when it was
    /// an attempt.
    pub seen: Vec<(SpanKey, Option<u32>)>,
    /// The attempts counted at once, since recording began.
    pub roots: Vec<Root<'a>>,
    /// The parents `nodes` name, so that a span named before it comes is a node too.
    pub awaited: HashSet<SpanKey>,
    /// Attempts counted at once whose call's other side may still come: remembered.
    pub remember: Vec<(SpanKey, Owned, Observation)>,
    /// Attempts counted at once, whole, that a late part of their own may still join: kept
    /// for the reorder window ([`Memory::Recent`]).
    pub recent: Option<Batch>,
    /// Whether other spans are recorded in `seen`: from the first node on, or from the start
    /// when calls are kept. A request of spans that name no parent records nothing.
    pub recording: bool,
    /// The spans read before recording began (read again only when a node's parent is not
    /// found elsewhere: a parent before its child in one export).
    pub unrecorded: u32,
}

impl<'a> Joins<'a> {
    /// Whether a node of the request named `key` as its parent.
    pub fn awaits(&self, key: &SpanKey) -> bool {
        !self.awaited.is_empty() && self.awaited.contains(key)
    }

    /// Adds a node.
    pub fn node(&mut self, node: Node<'a>) {
        if !self.recording {
            self.recording = true;
        }
        if self.nodes.is_empty() {
            // Room for a request's worth at once: growing a vector of nodes by doubling
            // copies each several times.
            self.members.reserve(ROOM);
            self.nodes.reserve(ROOM);
            self.awaited.reserve(ROOM);
        }
        if let Some(parent) = node.parent {
            self.awaited.insert(parent);
        }
        self.members.push(node.member);
        self.nodes.push(NodeMeta {
            key: node.key,
            parent: node.parent,
            carrier: node.carrier,
            slot: node.slot,
            at: node.at,
        });
    }

    /// Adds an attempt counted at once, whole, that a late part of its own may still join.
    /// `batch` gives a batch to add them to, on the first.
    pub fn keep_recent(&mut self, key: SpanKey, at: At, batch: impl FnOnce() -> Batch) {
        self.recent.get_or_insert_with(batch).root(key, at);
    }

    /// Adds a span that is not a node: a root attempt (`Some`) or any other span.
    pub fn seen(&mut self, key: SpanKey, root: Option<Root<'a>>) {
        if !self.recording {
            self.unrecorded += 1;
            return;
        }
        if self.seen.is_empty() {
            self.seen.reserve(ROOM);
        }
        let at = root.map(|root| {
            self.roots.push(root);
            (self.roots.len() - 1) as u32
        });
        self.seen.push((key, at));
    }

    /// Whether there is anything to join.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.remember.is_empty()
            && self.recent.is_none()
            && self.seen.is_empty()
    }
}

/// Where a span of the work set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    /// A node of the request (`Joins::nodes`), with its tag slot.
    Node(usize),
    /// A root of the request (`Joins::roots`), counted already.
    Root(usize),
    /// Span `member` of kept call `call` (of the calls taken out).
    Kept { call: usize, member: usize },
}

/// The spans being joined: the request's and the kept calls taken out for them.
struct Work<'w> {
    members: Vec<Member<'w>>,
    keys: Vec<SpanKey>,
    parents: Vec<Option<SpanKey>>,
    carriers: Vec<Option<SpanKey>>,
    from: Vec<From>,
    /// Its parent is still to come (not among the spans, not seen in the request, and not
    /// given up on).
    open: Vec<bool>,
}

impl<'w> Work<'w> {
    fn with_capacity(n: usize) -> Work<'w> {
        Work::with_members(Vec::with_capacity(n), n)
    }

    /// A work set whose first spans are `members`, each to be described in turn
    /// ([`Work::describe`]); room for `n` spans in all.
    fn with_members(members: Vec<Member<'w>>, n: usize) -> Work<'w> {
        Work {
            members,
            keys: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
            carriers: Vec::with_capacity(n),
            from: Vec::with_capacity(n),
            open: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, member: Member<'w>, key: SpanKey, parent: Option<SpanKey>, from: From) {
        self.members.push(member);
        self.describe(key, parent, None, from);
    }

    /// Describes the next span of the work set, whose attempt is in `members` already.
    fn describe(
        &mut self,
        key: SpanKey,
        parent: Option<SpanKey>,
        carrier: Option<SpanKey>,
        from: From,
    ) {
        self.keys.push(key);
        self.parents.push(parent);
        self.carriers.push(carrier);
        self.from.push(from);
        self.open.push(false);
    }

    /// Each span's join to the others (DESIGN §11), the calls they form (sets of indexes),
    /// and how many cycles of parent ids were cut.
    fn calls(&self) -> (Vec<Joined>, Groups, usize) {
        let n = self.members.len();
        let mut index: HashMap<SpanKey, usize> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        index.extend(self.keys.iter().enumerate().map(|(i, k)| (*k, i)));
        let mut joined = vec![Joined::default(); n];
        let mut set = Sets::new(n);
        let found = |k: &Option<SpanKey>| k.as_ref().and_then(|k| index.get(k)).copied();
        for (i, joined) in joined.iter_mut().enumerate() {
            let member = &self.members[i];
            if let Some(p) = found(&self.parents[i]).filter(|&p| p != i) {
                match call::link(member, &self.members[p]) {
                    Some(Link::Carried) => joined.carrier = Some(p),
                    Some(link) => joined.parent = Some((p, link)),
                    None => {}
                }
            }
            if joined.carrier.is_none() {
                joined.carrier = found(&self.carriers[i]).filter(|&h| {
                    h != i && call::link(member, &self.members[h]) == Some(Link::Carried)
                });
            }
            for j in joined
                .parent
                .map(|(p, _)| p)
                .into_iter()
                .chain(joined.carrier)
            {
                set.join(i, j);
            }
        }
        let cut = cut_cycles(&mut joined, |i| {
            let a = &self.members[i].attempt;
            (a.start, a.span_id)
        });
        (joined, set.groups(), cut)
    }
}

/// Cuts every cycle of parent ids (spans that name each other as parents, which no SDK
/// records but anyone can send): the span of the cycle that comes first by `first` (the
/// earliest to start) loses its parent, so the call has a root and is counted once, whatever
/// order its spans came in. One pass over the spans; returns how many cycles were cut.
fn cut_cycles<K: Ord>(joined: &mut [Joined], first: impl Fn(usize) -> K) -> usize {
    const NEW: u32 = u32::MAX;
    const DONE: u32 = u32::MAX - 1;
    // Each span's state: NEW, DONE, or the walk that is on it now.
    let mut state = vec![NEW; joined.len()];
    let mut path: Vec<usize> = Vec::new();
    let mut cut = 0;
    for start in 0..joined.len() {
        let walk = start as u32;
        let mut at = Some(start);
        path.clear();
        while let Some(i) = at.filter(|&i| state[i] == NEW) {
            state[i] = walk;
            path.push(i);
            at = joined[i].parent.map(|(p, _)| p);
        }
        if let Some(i) = at.filter(|&i| state[i] == walk) {
            // Back on this walk's own path: the spans from `i` on are a cycle.
            let from = path.iter().position(|&p| p == i).unwrap_or(0);
            if let Some(&root) = path[from..].iter().min_by_key(|&&c| first(c)) {
                joined[root].parent = None;
                cut += 1;
            }
        }
        path.iter().for_each(|&i| state[i] = DONE);
    }
    cut
}

/// Disjoint sets of indexes (union by size, path halving).
struct Sets {
    parent: Vec<usize>,
    size: Vec<usize>,
}

impl Sets {
    fn new(n: usize) -> Sets {
        Sets {
            parent: (0..n).collect(),
            size: vec![1; n],
        }
    }

    fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn join(&mut self, a: usize, b: usize) {
        let (mut a, mut b) = (self.find(a), self.find(b));
        if a == b {
            return;
        }
        if self.size[a] < self.size[b] {
            std::mem::swap(&mut a, &mut b);
        }
        self.parent[b] = a;
        self.size[a] += self.size[b];
    }

    /// The sets, each in index order, in the order of their first index: every index, set
    /// after set, and where each set ends.
    fn groups(mut self) -> Groups {
        let n = self.parent.len();
        let mut keyed: Vec<(usize, usize)> = (0..n).map(|i| (self.find(i), i)).collect();
        // A set's key: its first index (the root's, seen first, is not always the smallest).
        let mut first = vec![usize::MAX; n];
        for &(root, i) in &keyed {
            first[root] = first[root].min(i);
        }
        for k in &mut keyed {
            k.0 = first[k.0];
        }
        keyed.sort_unstable();
        let mut ends = Vec::new();
        for (at, w) in keyed.windows(2).enumerate() {
            if w[0].0 != w[1].0 {
                ends.push(at + 1);
            }
        }
        if n > 0 {
            ends.push(n);
        }
        Groups {
            members: keyed.into_iter().map(|(_, i)| i).collect(),
            ends,
        }
    }
}

/// Sets of indexes, one after another: set `k` is `members[ends[k - 1]..ends[k]]`.
struct Groups {
    members: Vec<usize>,
    ends: Vec<usize>,
}

impl Groups {
    fn iter(&self) -> impl Iterator<Item = &[usize]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.members[a..b])
    }
}

/// Where the request's nodes and roots stand: each one's place among the request's tags,
/// and in its body.
#[derive(Clone, Copy, Default)]
struct Places<'r> {
    slots: &'r [Option<usize>],
    root_slots: &'r [Option<usize>],
    at: &'r [At],
    root_at: &'r [At],
}

/// A client nobody named.
const UNKNOWN: Client<'static> = Client {
    name: UNKNOWN_CLIENT,
    instance: None,
};

/// What counting a call needs: the clock, where its events go, and, for the calls of a
/// request, its tags and its count of attempts.
struct Counting<'r> {
    now: Nanos,
    events: &'r mut Vec<Event>,
    tags: Option<&'r mut SpanTags>,
    attempts: &'r mut u64,
}

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
        let named = extract::server_client(span, client_from, self.max_attributes);
        let parent = (!attempt.parent_span_id.is_empty())
            .then(|| key(attempt.trace_id, attempt.parent_span_id));
        Some(Node {
            key: key(attempt.trace_id, attempt.span_id),
            parent,
            carrier: None,
            slot,
            // A server's span is never kept for a late part (it is remembered, observed).
            at: At::default(),
            member: Member {
                attempt: Attempt {
                    client: named.unwrap_or(UNKNOWN),
                    ..attempt
                },
                side: Side::Server(index),
                named: named.is_some(),
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
        (body, owner): (&'a [u8], Option<&Bytes>),
    ) {
        let mut calls = self.calls();
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
        if nodes.is_empty() && seen.is_empty() {
            // Spans that name no parent, none named by another: nothing to join (every flat
            // export).
            let mut forced = Vec::new();
            let none = HashSet::default();
            keep_counted(&mut calls, remember, &none, r.now, &mut forced);
            if let Some(batch) = recent {
                calls.keep_recent((body, owner), batch, r.now);
            }
            self.count_forced(&mut calls, interfaces, forced, r.now, &mut r.events);
            self.held_gauge(&calls);
            return;
        }
        // Parents read before recording began (a parent before its child in one export).
        let missing: HashSet<SpanKey> = if unrecorded == 0 {
            HashSet::default()
        } else {
            let have: HashSet<SpanKey> = nodes
                .iter()
                .map(|n| n.key)
                .chain(seen.iter().map(|s| s.0))
                .collect();
            nodes
                .iter()
                .filter_map(|n| n.parent)
                .filter(|p| !have.contains(p) && !calls.holds(p))
                .collect()
        };
        if !missing.is_empty() {
            for (k, root) in self.read_again(body, unrecorded, &missing) {
                let at = root.map(|root| {
                    roots.push(root);
                    (roots.len() - 1) as u32
                });
                seen.push((k, at));
            }
        }
        let mut taken: Vec<Call> = Vec::new();
        let mut known: HashSet<SpanKey> =
            HashSet::with_capacity_and_hasher(2 * nodes.len(), Default::default());
        // The request's nodes, each once; a span kept already is an exporter's retry.
        let mut fresh: Vec<usize> = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            if calls.holds(&n.key) || !known.insert(n.key) {
                self.metrics.span_skipped("duplicate");
                continue;
            }
            fresh.push(i);
        }
        self.skip_counted(&mut calls, &nodes, &mut fresh, r);
        // The kept calls and the request's roots that join them, found from the nodes out.
        let seen_at: HashMap<SpanKey, Option<u32>> = if fresh.is_empty() && !calls.any_awaiting() {
            HashMap::default()
        } else {
            let mut at = HashMap::with_capacity_and_hasher(seen.len(), Default::default());
            at.extend(seen.iter().copied());
            at
        };
        let mut used_roots: Vec<usize> = Vec::new();
        let mut frontier: Vec<(SpanKey, Option<SpanKey>)> = fresh
            .iter()
            .map(|&i| (nodes[i].key, nodes[i].parent))
            .collect();
        if calls.any_awaiting() {
            for (k, root) in &seen {
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
        // The work set: nodes (their attempts moved, not copied), roots read again, and the
        // kept spans.
        let root_spans: Vec<Option<SpanRef<'a>>> = used_roots
            .iter()
            .map(|&i| SpanRef::parse(roots[i].bytes).ok())
            .collect();
        let kept_spans: usize = taken.iter().map(|c| c.members.len()).sum();
        let mut members = members;
        if fresh.len() < nodes.len() {
            let mut at = fresh.iter().peekable();
            let mut i = 0;
            members.retain(|_| {
                let keep = at.next_if_eq(&&i).is_some();
                i += 1;
                keep
            });
        }
        members.reserve(used_roots.len() + kept_spans);
        let slots: Vec<Option<usize>> = nodes.iter().map(|n| n.slot).collect();
        let mut work = Work::with_members(members, fresh.len() + used_roots.len() + kept_spans);
        for &i in &fresh {
            let n = &nodes[i];
            work.describe(n.key, n.parent, n.carrier, From::Node(i));
        }
        for (at, span) in used_roots.iter().zip(&root_spans) {
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
        self.push_kept(&mut work, &taken);
        let has_seen = |k: &SpanKey| seen_at.contains_key(k);
        mark_open(&mut work, &taken, &known, has_seen);
        let root_slots: Vec<Option<usize>> = roots.iter().map(|r| r.slot).collect();
        let node_at: Vec<At> = nodes.iter().map(|n| n.at).collect();
        let root_at: Vec<At> = roots.iter().map(|r| r.at).collect();
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
        let mut counting = Counting {
            now: r.now,
            events: &mut r.events,
            tags: r.tags.as_deref_mut(),
            attempts: &mut r.summary.attempts,
        };
        let forced = self.run(
            &mut calls,
            interfaces,
            &work,
            &taken,
            &mut counting,
            places,
            Some(&mut batch),
        );
        drop(work);
        drop(root_spans);
        // Attempts counted at once whose other side may come: kept, unless joined above.
        let mut forced = forced;
        keep_counted(&mut calls, remember, &known, r.now, &mut forced);
        calls.keep_recent((body, owner), batch, r.now);
        self.count_forced(&mut calls, interfaces, forced, r.now, &mut r.events);
        self.held_gauge(&calls);
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

    /// Counts the held calls the bounds forced out (and any they force out in turn).
    fn count_forced(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        mut forced: Vec<(Call, Bound)>,
        now: Nanos,
        events: &mut Vec<Event>,
    ) {
        while !forced.is_empty() {
            let bags: Vec<Call> = forced
                .drain(..)
                .map(|(call, bound)| {
                    self.metrics.held_forced(bound.as_str());
                    call
                })
                .collect();
            forced = self.count_kept(calls, interfaces, bags, now, events);
        }
    }

    /// Counts kept calls as they are (their wait is over): every parent still awaited is
    /// given up on. Returns the held calls that remembering them forced out.
    fn count_kept(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        bags: Vec<Call>,
        now: Nanos,
        events: &mut Vec<Event>,
    ) -> Vec<(Call, Bound)> {
        if bags.is_empty() {
            return Vec::new();
        }
        let mut work = Work::with_capacity(bags.iter().map(|c| c.members.len()).sum());
        self.push_kept(&mut work, &bags);
        let mut attempts = 0;
        let mut counting = Counting {
            now,
            events,
            tags: None,
            attempts: &mut attempts,
        };
        self.run(
            calls,
            interfaces,
            &work,
            &bags,
            &mut counting,
            Places::default(),
            None,
        )
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

    /// Counts (or, when `may_hold`, holds) every call of the work set. Returns the held calls
    /// the bounds forced out.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        work: &Work<'_>,
        taken: &[Call],
        counting: &mut Counting<'_>,
        places: Places<'_>,
        mut batch: Option<&mut Batch>,
    ) -> Vec<(Call, Bound)> {
        // The calls of a request may wait for spans to come; kept calls counted now may not.
        let may_hold = batch.is_some();
        let (joined, groups, cut) = work.calls();
        if cut > 0 {
            self.metrics.call_cycles_cut(cut);
        }
        let undeclared = |a: &Attempt<'_>| {
            let origin = a.origin.as_ref().map(|o| o.as_str());
            let interface = interfaces.resolve(origin, a.path);
            interfaces.declared(interface, a.path) == Declared::No
        };
        // Every call of the work set at once: calls do not reach into each other.
        let roles = call::assemble(&work.members, &joined, undeclared);
        let mut forced = Vec::new();
        let mut open: Vec<SpanKey> = Vec::new();
        let mut counted: Vec<Observation> = Vec::new();
        for group in groups.iter() {
            let counted_before = group.iter().any(|&i| match work.from[i] {
                From::Root(_) => true,
                From::Kept { call, .. } => !taken[call].is_held(),
                From::Node(_) => false,
            });
            open.clear();
            open.extend(
                group
                    .iter()
                    .filter(|&&i| work.open[i])
                    .filter_map(|&i| work.parents[i]),
            );
            if may_hold && !open.is_empty() && !counted_before {
                let since = group
                    .iter()
                    .filter_map(|&i| match work.from[i] {
                        From::Kept { call, .. } => Some(taken[call].since),
                        _ => None,
                    })
                    .min()
                    .unwrap_or(counting.now);
                let members = group.iter().map(|&i| kept(work, taken, i, false)).collect();
                let state = State::Held { open: open.clone() };
                forced.extend(calls.keep(Call {
                    members,
                    state,
                    since,
                }));
                continue;
            }
            let kept_call = self.count_call(
                interfaces,
                work,
                (&roles, group),
                taken,
                counting,
                places,
                &mut counted,
            );
            let parts = |i: usize| roles.roles[i] == Role::Part;
            match kept_call {
                Some(Memory::Remembered) => {
                    let call = Call {
                        members: group
                            .iter()
                            .map(|&i| kept(work, taken, i, parts(i)))
                            .collect(),
                        state: State::Counted {
                            attempts: counted.clone(),
                        },
                        since: counting.now,
                    };
                    forced.extend(calls.keep(call));
                }
                Some(Memory::Recent) => {
                    // Its client spans of this request by where they stand in it, the rest
                    // (kept from an earlier request) copied whole.
                    let at = |i: usize| match work.from[i] {
                        _ if work.members[i].side != Side::Client => None,
                        From::Node(n) => places.at.get(n).copied(),
                        From::Root(n) => places.root_at.get(n).copied(),
                        From::Kept { .. } => None,
                    };
                    if let Some(batch) = batch.as_deref_mut() {
                        let members = group.iter().map(|&i| match at(i) {
                            Some(at) => Ok(RecentMember {
                                key: work.keys[i],
                                parent: work.parents[i],
                                at,
                                skipped: parts(i),
                            }),
                            None => Err(Box::new(kept(work, taken, i, parts(i)))),
                        });
                        batch.call(members, &counted);
                    }
                }
                None => {}
            }
        }
        forced
    }

    /// Counts one call of the work set (the spans `group`, whose `roles` are assembled): takes
    /// back what its spans were counted as before, counts its attempts and tags them (a client
    /// attempt on an observed interface only once its server's side is in: never with a verdict
    /// that is not the call's). Says how long to keep it when more of it may still come (its
    /// attempts left in `counted`).
    #[allow(clippy::too_many_arguments)]
    fn count_call(
        &self,
        interfaces: &Interfaces,
        work: &Work<'_>,
        (calls, group): (&call::Calls<'_>, &[usize]),
        taken: &[Call],
        counting: &mut Counting<'_>,
        places: Places<'_>,
        counted: &mut Vec<Observation>,
    ) -> Option<Memory> {
        // What its spans were counted as before: taken back while pending; a settled attempt
        // stays, and is not counted again — nor is one the tracker no longer holds (settled
        // early by a flooded key and gone from its history, or its key evicted): it was
        // counted, and counting it again would count the call twice.
        let mut settled: Vec<SpanKey> = Vec::new();
        let mut taken_from: Option<usize> = None;
        let mut retract = |obs: &Observation| {
            if self.tracker.retract(obs) != Retraction::Retracted {
                settled.push((obs.trace_id, obs.span_id));
            }
        };
        for &i in group {
            match work.from[i] {
                From::Kept { call, .. } if taken_from != Some(call) => {
                    taken_from = Some(call);
                    if let State::Counted { attempts } = &taken[call].state {
                        attempts.iter().for_each(&mut retract);
                    }
                }
                From::Root(_) => {
                    retract(&self.observation_again(interfaces, &work.members[i].attempt));
                    // Counted by its request as an attempt of its own: now part of a call.
                    *counting.attempts = counting.attempts.saturating_sub(1);
                }
                _ => {}
            }
        }
        counted.clear();
        let mut remember = false;
        let has_server = group
            .iter()
            .any(|&i| matches!(work.members[i].side, Side::Server(_)));
        // A part under a client attempt may come after it (§11.1–2): only HTTP spans have none.
        let may_grow = group.iter().any(|&i| {
            let m = &work.members[i];
            m.side == Side::Client && m.attempt.family != Family::Http
        });
        let slot_of = |i: usize| match work.from[i] {
            From::Node(n) => places.slots.get(n).copied().flatten(),
            From::Root(n) => places.root_slots.get(n).copied().flatten(),
            From::Kept { .. } => None,
        };
        for &i in group {
            match calls.attempt(i) {
                None => {
                    let before = match work.from[i] {
                        From::Kept { call, member } => taken[call].members[member].skipped,
                        _ => false,
                    };
                    if !before {
                        self.metrics.span_skipped("same_call");
                    }
                    if let (Some(slot), Some(tags)) = (slot_of(i), counting.tags.as_deref_mut()) {
                        tags.write(slot, |_| {});
                    }
                }
                Some(call::Assembled { attempt, interface }) => {
                    if !settled.is_empty() && settled.contains(&work.keys[i]) {
                        continue;
                    }
                    let mut ids = self.client_ids(attempt.client);
                    let p = match interface {
                        Some(index) => {
                            let mut room = None;
                            let path = attempt.path_or_grpc(&mut room);
                            let configured = InterfaceRef::Configured(*index);
                            self.place_in(interfaces, configured, attempt, path, ids.id)
                        }
                        None => self.place(interfaces, attempt, ids.id),
                    };
                    let observed = interfaces.client_from(p.interface).is_some();
                    let client = work.members[i].side == Side::Client;
                    if client && (observed || attempt.origin.is_none()) {
                        remember = true;
                    }
                    // Its server's side still to come: its verdict is not the call's yet.
                    let provisional = client && observed && !has_server;
                    let labels = self.labels(&mut ids, p.group.interface, p.interface_name);
                    let obs = place::observation(&p, attempt, labels);
                    *counting.attempts += 1;
                    let judged = self.tracker.observe(
                        counting.now,
                        &obs,
                        &attempt.operation,
                        counting.events,
                    );
                    let Some(judgement) = judged else {
                        self.metrics.span_skipped("duplicate");
                        continue;
                    };
                    counted.push(obs);
                    let Some((slot, tags)) = slot_of(i).zip(counting.tags.as_deref_mut()) else {
                        continue;
                    };
                    if provisional {
                        tags.write(slot, |_| {});
                    } else if !attempt.tagged {
                        let reason = p.reason.to_string();
                        let max = self.metrics.max_label_bytes();
                        tags.write(slot, |buf| {
                            place::write_place_tags(buf, &reason, p.interface_name, max);
                            place::write_verdict_tags(buf, &judgement);
                        });
                    }
                }
            }
        }
        Memory::of(remember, may_grow)
    }

    /// Counts the held calls whose wait is over at `now` (all of them when `all`).
    pub(super) fn release_held(&self, now: Nanos, all: bool, out: &mut Vec<Event>) {
        let mut calls = self.calls();
        if calls.is_empty() {
            return;
        }
        let interfaces = self.catalog.current();
        let due = calls.due(now, all);
        let window = self.tracker.reorder_window();
        let mut forced = Vec::new();
        for call in due {
            // Counted as at the end of its wait, not at the sweep's or the scrape's: what its
            // client sent after it is still pending then, and is judged with it (whatever
            // the order, §11), not settled first because the sweep came late.
            let at = match all {
                true => now,
                false => call.since.saturating_add(window).min(now),
            };
            forced.extend(self.count_kept(&mut calls, &interfaces, vec![call], at, out));
        }
        self.count_forced(&mut calls, &interfaces, forced, now, out);
        self.held_gauge(&calls);
    }

    fn held_gauge(&self, calls: &Calls) {
        self.held
            .store(calls.spans(), std::sync::atomic::Ordering::Relaxed);
        let (spans, bytes) = calls.recent();
        self.metrics
            .set_held(calls.spans() + spans, calls.bytes() + bytes);
    }
}

/// Remembers each attempt counted at once whose other side is expected and that no span of
/// the request joined (`known`).
fn keep_counted(
    calls: &mut Calls,
    remember: Vec<(SpanKey, Owned, Observation)>,
    known: &HashSet<SpanKey>,
    now: Nanos,
    forced: &mut Vec<(Call, Bound)>,
) {
    for (k, facts, obs) in remember {
        if known.contains(&k) {
            continue;
        }
        let call = Call {
            members: vec![Kept {
                facts,
                side: Side::Client,
                named: false,
                key: k,
                parent: None,
                carrier: None,
                skipped: false,
            }],
            state: State::Counted {
                attempts: vec![obs],
            },
            since: now,
        };
        forced.extend(calls.keep(call));
    }
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

/// Marks the spans whose parent is still to come: not among the spans, not a span the request
/// had, and (for a kept span) still awaited by its call.
fn mark_open(
    work: &mut Work<'_>,
    taken: &[Call],
    known: &HashSet<SpanKey>,
    seen: impl Fn(&SpanKey) -> bool,
) {
    for i in 0..work.members.len() {
        let Some(p) = work.parents[i] else { continue };
        if known.contains(&p) || seen(&p) {
            continue;
        }
        work.open[i] = match work.from[i] {
            From::Node(_) => true,
            From::Root(_) => false,
            From::Kept { call, .. } => match &taken[call].state {
                State::Held { open } => open.contains(&p),
                State::Counted { .. } => false,
            },
        };
    }
}

/// Span `i` of the work set, kept: its facts owned (or moved from the call it was kept in).
fn kept(work: &Work<'_>, taken: &[Call], i: usize, skipped: bool) -> Kept {
    if let From::Kept { call, member } = work.from[i] {
        let mut k = taken[call].members[member].clone();
        k.skipped |= skipped;
        return k;
    }
    let m = &work.members[i];
    Kept {
        facts: Owned::of(&m.attempt),
        side: m.side,
        named: m.named,
        key: work.keys[i],
        parent: work.parents[i],
        carrier: work.carriers[i],
        skipped,
    }
}

/// Which HTTP server span of the same resource and export carries each protocol server span
/// by time (DESIGN §9): for a protocol span that names no client and whose parent is not an
/// HTTP server span of the export — as when the MCP SDK parents its span to the client's own
/// span (trace context propagated in `_meta`) — the one HTTP span whose time contains it, when
/// it contains no other such span and no other contains it.
pub(super) fn carriers(members: &[Member<'_>], nodes: &mut [NodeMeta]) {
    let is_protocol = |i: usize| {
        matches!(
            members[i].attempt.family,
            Family::Mcp | Family::A2a | Family::JsonRpc
        )
    };
    let http = |i: usize| members[i].attempt.family == Family::Http;
    let http_keys: HashSet<SpanKey> = (0..nodes.len())
        .filter(|&h| http(h))
        .map(|h| nodes[h].key)
        .collect();
    let protocol_parents: HashSet<SpanKey> = (0..nodes.len())
        .filter(|&i| is_protocol(i))
        .filter_map(|i| nodes[i].parent)
        .collect();
    let orphans: Vec<usize> = (0..nodes.len())
        .filter(|&i| is_protocol(i) && !members[i].named)
        .filter(|&i| !nodes[i].parent.is_some_and(|p| http_keys.contains(&p)))
        .collect();
    if orphans.is_empty() {
        return;
    }
    let parents: Vec<usize> = (0..nodes.len())
        .filter(|&h| http(h) && !protocol_parents.contains(&nodes[h].key))
        .collect();
    let span = |i: usize| (members[i].attempt.start, members[i].attempt.end);
    // The parents whose time contains each orphan: how many, and which when one.
    let around = containing(&parents, &orphans, span);
    // The orphans each parent's time contains: how many.
    let inside = contained(&parents, &orphans, span);
    for (k, &i) in orphans.iter().enumerate() {
        if let (1, Some(p)) = around[k] {
            if inside[p] == 1 {
                nodes[i].carrier = Some(nodes[parents[p]].key);
            }
        }
    }
}

/// For each of `inner` (by its place there): how many of `outer` contain its time (start no
/// later, end no earlier), and the place in `outer` of the one when exactly one does. A sweep
/// by start over a Fenwick tree of ends: O((m + n) log m).
fn containing(
    outer: &[usize],
    inner: &[usize],
    span: impl Fn(usize) -> (Nanos, Nanos),
) -> Vec<(usize, Option<usize>)> {
    let mut ends: Vec<Nanos> = outer.iter().map(|&h| span(h).1).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut by_start: Vec<usize> = (0..outer.len()).collect();
    by_start.sort_unstable_by_key(|&p| span(outer[p]).0);
    let mut queries: Vec<usize> = (0..inner.len()).collect();
    queries.sort_unstable_by_key(|&k| span(inner[k]).0);
    // Counts, and sums of places (the one place when the count is one).
    let mut count = Fenwick::new(ends.len());
    let mut places = Fenwick::new(ends.len());
    let (mut added, mut next) = (0usize, 0usize);
    let mut out = vec![(0, None); inner.len()];
    for k in queries {
        let (start, end) = span(inner[k]);
        while next < by_start.len() && span(outer[by_start[next]]).0 <= start {
            let p = by_start[next];
            let at = ends.partition_point(|&e| e < span(outer[p]).1);
            count.add(at, 1);
            places.add(at, p as u64);
            added += 1;
            next += 1;
        }
        // Of those that started no later, the ones that end no earlier.
        let before = ends.partition_point(|&e| e < end);
        let n = added - count.sum(before) as usize;
        let place = places.total().wrapping_sub(places.sum(before));
        out[k] = (n, (n == 1).then_some(place as usize));
    }
    out
}

/// For each of `outer` (by its place there): how many of `inner` its time contains.
fn contained(
    outer: &[usize],
    inner: &[usize],
    span: impl Fn(usize) -> (Nanos, Nanos),
) -> Vec<usize> {
    let mut ends: Vec<Nanos> = inner.iter().map(|&i| span(i).1).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut by_start: Vec<usize> = (0..inner.len()).collect();
    by_start.sort_unstable_by_key(|&k| std::cmp::Reverse(span(inner[k]).0));
    let mut queries: Vec<usize> = (0..outer.len()).collect();
    queries.sort_unstable_by_key(|&p| std::cmp::Reverse(span(outer[p]).0));
    let mut count = Fenwick::new(ends.len());
    let mut next = 0;
    let mut out = vec![0; outer.len()];
    for p in queries {
        let (start, end) = span(outer[p]);
        // The inner spans that start no earlier …
        while next < by_start.len() && span(inner[by_start[next]]).0 >= start {
            let at = ends.partition_point(|&e| e < span(inner[by_start[next]]).1);
            count.add(at, 1);
            next += 1;
        }
        // … and end no later.
        out[p] = count.sum(ends.partition_point(|&e| e <= end)) as usize;
    }
    out
}

/// Sums over a prefix of places, each added to in O(log n) (a Fenwick tree); wrapping, as the
/// sums of places are read only where one place was added.
struct Fenwick(Vec<u64>);

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick(vec![0; n + 1])
    }

    fn add(&mut self, at: usize, v: u64) {
        let mut i = at + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].wrapping_add(v);
            i += i & i.wrapping_neg();
        }
    }

    /// The sum of places `0..end`.
    fn sum(&self, end: usize) -> u64 {
        let (mut i, mut s) = (end, 0u64);
        while i > 0 {
            s = s.wrapping_add(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        s
    }

    fn total(&self) -> u64 {
        self.sum(self.0.len() - 1)
    }
}

#[cfg(test)]
mod tests;
