//! What a request's spans say of their calls, gathered as the request is read: the spans
//! that may be part of a call with others (nodes), the attempts counted at once (roots), and
//! how long each counted call is to be kept for the rest of it.
//!
//! Core: pure.

use super::super::calls::{At, Batch, SpanKey};
use crate::extract::call::Member;
use crate::extract::{Client, Owned};
use crate::tracker::Observation;
use foldhash::HashSet;

/// A span of the request that may be part of a call with others: one that names a parent, a
/// parent named earlier in the request, or a SERVER span of an observed interface.
pub(in crate::pipeline) struct Node<'a> {
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
pub(in crate::pipeline) struct Root<'a> {
    /// Its span's protobuf bytes, read again if it joins a call.
    pub bytes: &'a [u8],
    /// Its client.
    pub client: Client<'a>,
    /// Its place among the request's tags, when forwarding.
    pub slot: Option<usize>,
    /// Where it stands in the request.
    pub at: At,
}

/// The spans a request's vectors and maps of spans make room for at once, at least.
pub(super) const ROOM: usize = 64;

/// The most spans the nodes of a request make room for at once (some 300 bytes each); past
/// it, they grow as they come.
const MAX_ROOM: usize = 4_096;

/// What a node is besides its attempt.
#[derive(Debug, Clone, Copy)]
pub(in crate::pipeline) struct NodeMeta {
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
pub(in crate::pipeline) enum Memory {
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
    pub(in crate::pipeline) fn of(awaited: bool, may_grow: bool) -> Option<Memory> {
        match (awaited, may_grow) {
            (true, _) => Some(Memory::Remembered),
            (false, true) => Some(Memory::Recent),
            (false, false) => None,
        }
    }
}

/// A span of the request that is not a node: its key, and its index in `Joins::roots` when
/// it was an attempt.
pub(super) type Seen = (SpanKey, Option<u32>);

/// An attempt counted at once whose call's other side may still come: its span's key, its
/// facts and what it was counted as.
pub(super) type Remembered = (SpanKey, Owned, Observation);

/// What a request's spans say of their calls.
#[derive(Default)]
pub(in crate::pipeline) struct Joins<'a> {
    /// The spans to join, read as attempts: moved as they are into the work set, not copied.
    pub members: Vec<Member<'a>>,
    /// The rest of each of them.
    pub nodes: Vec<NodeMeta>,
    /// Every other span since recording began: its key, and its index in `roots` when it was
    /// an attempt.
    pub seen: Vec<Seen>,
    /// The attempts counted at once, since recording began.
    pub roots: Vec<Root<'a>>,
    /// The parents `nodes` name, so that a span named before it comes is a node too.
    pub awaited: HashSet<SpanKey>,
    /// Attempts counted at once whose call's other side may still come: remembered.
    pub remember: Vec<Remembered>,
    /// Attempts counted at once, whole, that a late part of their own may still join: kept
    /// for the reorder window ([`Memory::Recent`]).
    pub recent: Option<Batch>,
    /// Whether other spans are recorded in `seen`: from the first node on, or from the start
    /// when calls are kept. A request of spans that name no parent records nothing.
    pub recording: bool,
    /// The spans read before recording began (read again only when a node's parent is not
    /// found elsewhere: a parent before its child in one export).
    pub unrecorded: u32,
    /// The request's body: its spans counted at the first node, for room.
    pub body: &'a [u8],
    /// The request has an INTERNAL protocol span: the CLIENT spans whose parent is no attempt
    /// are joined by time to one that wraps them ([`super::wrappers`]).
    pub wrapping: bool,
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
            // Room for the request's spans and half as many kept ones at once: growing a
            // vector of attempts by doubling copies each several times, into memory no cache
            // holds.
            let spans = crate::otlp::wire::spans_in(self.body);
            let room = (spans + spans / 2).clamp(ROOM, MAX_ROOM);
            self.members.reserve(room);
            self.nodes.reserve(room);
            self.awaited.reserve(spans.min(MAX_ROOM));
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
