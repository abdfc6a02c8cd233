//! Calls counted whole that a late span may still join (DESIGN §11: "in any order"): a call
//! that named a server nobody observes is complete as far as anyone expects, but a span of
//! its own can still come after it — a transport request or an inner protocol span that ended
//! after its parent (a stream, a background task begun inside the call), or one exported by
//! another processor. Kept for the reorder window, so that such a span joins the call it is
//! part of and the call is counted again with its facts, instead of the span being counted on
//! its own.
//!
//! Core: pure state. What is kept of such a call is cheap, since almost every flat span is
//! one and almost none is ever joined: the request's bytes, held once ([`Recent::keep`]: a
//! receiver's [`Bytes`] by reference, the whole buffer it is a view of counted, unless that
//! buffer is mostly something else; other bodies copied), and for each call where its spans
//! stand in them (its spans from earlier requests kept whole) and what it was counted as. A
//! call's spans are read again only when a late span joins it ([`Recent::take`]), and a root's
//! attempt made again from its span. Calls are found by their spans in a table of fixed size
//! (a span's place is its key's hash; a newer call's span may take an older one's place, which
//! is then forgotten), filled only when a span is looked for: most requests look for none.
//! Kept apart from the held and remembered calls, so that a stream of flat spans never pushes
//! out a call still waiting for its parent; bounded by the same `max_held_spans` and
//! `max_held_mib`, the oldest request forgotten first; its room is reused by the next (once
//! warm, keeping allocates nothing).

use super::{Call, Kept, SpanKey, State};
use crate::extract::call::Side;
use crate::extract::Owned;
use crate::tracker::{Nanos, Observation};
use bytes::Bytes;
use std::collections::VecDeque;
use std::ops::Range;

/// A request's body held in [`Bytes`] by its receiver, and what the buffer it is a view of
/// keeps allocated: a call kept for a late part that keeps the body by reference keeps that
/// buffer, and counts it against `tracker.max_held_mib`, not only the body's length.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'b> {
    /// The body.
    pub bytes: &'b Bytes,
    /// The bytes its buffer keeps allocated (taken as at least the body's length).
    pub allocated: usize,
}

/// What a kept body held where it is ([`Owner`]) counts, when it is held there: when `owner`
/// holds it and its buffer is at most [`MOSTLY_ELSE`] times its length, the buffer. `None`
/// when the body is copied instead, its length counted: a small body does not keep a large
/// buffer (nor one of a size not known).
fn held_where_it_is(body: &[u8], owner: Owner<'_>) -> Option<usize> {
    let same = owner.bytes.as_ptr() == body.as_ptr() && owner.bytes.len() == body.len();
    let allocated = owner.allocated.max(body.len());
    (same && allocated / MOSTLY_ELSE <= body.len()).then_some(allocated)
}

/// A kept body whose buffer is more than this many times its size is copied out of it. A copy
/// costs the request some 4 % more CPU (a 26 KiB tree export on OTLP/gRPC, copied at 4 times:
/// 1.06 of the build before, 1.02 not copied; benches/e2e.sh, 5 pairs): worth it for a small
/// export that would keep a buffer of 128 KiB, not for one that fills a third of it.
const MOSTLY_ELSE: usize = 8;

/// Where a span stands in its request's body: its resource's `ResourceSpans` message and its
/// own bytes, each as (offset, length).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct At {
    /// The `ResourceSpans` the span is under.
    pub resource: (u32, u32),
    /// The span.
    pub span: (u32, u32),
}

impl At {
    /// Where `resource` and `span`, both slices of `body`, stand in it.
    pub fn of(body: &[u8], resource: &[u8], span: &[u8]) -> At {
        let place = |part: &[u8]| {
            let offset = (part.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
            (offset as u32, part.len() as u32)
        };
        At {
            resource: place(resource),
            span: place(span),
        }
    }

    /// The two slices of `body` it names; `None` when they are not in it.
    pub fn read<'b>(&self, body: &'b [u8]) -> Option<(&'b [u8], &'b [u8])> {
        let slice = |(offset, len): (u32, u32)| {
            let start = offset as usize;
            body.get(start..start.checked_add(len as usize)?)
        };
        Some((slice(self.resource)?, slice(self.span)?))
    }
}

/// A span of a call kept for a late part, found in its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The span.
    pub key: SpanKey,
    /// The parent it names.
    pub parent: Option<SpanKey>,
    /// Where it stands in its request.
    pub at: At,
    /// It was counted as skipped (`same_call`) already.
    pub skipped: bool,
}

/// A span of a call to keep for a late part, as the request gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// It stands in the request.
    Here(Member),
    /// It came in an earlier request: span `member` of the kept call `call` the request took
    /// out, moved into the batch when it is kept (the request reads it until then).
    Taken {
        /// The span.
        key: SpanKey,
        /// The call, among those the request took out.
        call: u32,
        /// The span, among the call's.
        member: u32,
        /// It was counted as skipped (`same_call`) by the request.
        skipped: bool,
    },
    /// A copy of it, whole (a span of the request that is not a client's).
    Whole(Box<Kept>),
}

/// Where a span of a call kept for a late part is found.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// In its request.
    Here(Member),
    /// Kept already (it came in an earlier request): the index of its copy in the batch.
    Kept(u32),
    /// Still in the kept call the request took out ([`Part::Taken`]), until the batch is kept.
    Taken {
        key: SpanKey,
        call: u32,
        member: u32,
        skipped: bool,
    },
}

/// One call of a [`Batch`]: its spans and attempts there (none for a root, whose attempt is
/// read again from its span), and whether a late span took it.
#[derive(Debug, Clone)]
struct Entry {
    members: Range<u32>,
    attempts: Option<Range<u32>>,
    taken: bool,
}

/// The calls of one request to keep for a late part: filled by the request, then kept with its
/// bytes (`Recent::keep`).
#[derive(Debug, Default)]
pub struct Batch {
    members: Vec<Place>,
    /// The spans of its calls that came in earlier requests, kept whole.
    kept: Vec<Kept>,
    attempts: Vec<Observation>,
    entries: Vec<Entry>,
    /// Whether a span of it is still in a call the request took out ([`Place::Taken`]).
    taking: bool,
}

impl Batch {
    /// Adds a call: its spans (in the request, or taken from an earlier one), and what it
    /// was counted as.
    pub fn call(&mut self, parts: impl IntoIterator<Item = Part>, attempts: &[Observation]) {
        let (m, a) = (self.members.len() as u32, self.attempts.len() as u32);
        for part in parts {
            let place = match part {
                Part::Here(here) => Place::Here(here),
                Part::Taken {
                    key,
                    call,
                    member,
                    skipped,
                } => {
                    self.taking = true;
                    Place::Taken {
                        key,
                        call,
                        member,
                        skipped,
                    }
                }
                Part::Whole(kept) => {
                    self.kept.push(*kept);
                    Place::Kept(self.kept.len() as u32 - 1)
                }
            };
            self.members.push(place);
        }
        self.attempts.extend_from_slice(attempts);
        self.entries.push(Entry {
            members: m..self.members.len() as u32,
            attempts: Some(a..self.attempts.len() as u32),
            taken: false,
        });
    }

    /// Adds a call of one span that names no parent (a root counted at once). What it was
    /// counted as is not kept: almost no root is ever joined, and the one that is has its
    /// attempt made again from its span (`Recent::take`), as it was made the first time.
    pub fn root(&mut self, key: SpanKey, at: At) {
        let m = self.members.len() as u32;
        self.members.push(Place::Here(Member {
            key,
            parent: None,
            at,
            skipped: false,
        }));
        self.entries.push(Entry {
            members: m..m + 1,
            attempts: None,
            taken: false,
        });
    }

    /// Moves the spans its calls took from earlier requests out of the calls the request
    /// took out (`taken`): a move, not a copy, once the request no longer reads them.
    fn adopt(&mut self, taken: &mut [Call]) {
        if !std::mem::take(&mut self.taking) {
            return;
        }
        for place in &mut self.members {
            let Place::Taken {
                call,
                member,
                skipped,
                ..
            } = *place
            else {
                continue;
            };
            let Some(span) = taken
                .get_mut(call as usize)
                .and_then(|c| c.members.get_mut(member as usize))
            else {
                continue;
            };
            let mut span = span.take();
            span.skipped |= skipped;
            self.kept.push(span);
            *place = Place::Kept(self.kept.len() as u32 - 1);
        }
    }

    /// Drops the calls a span of which `joined` names (joined by another call since).
    pub fn drop_joined(&mut self, joined: impl Fn(&SpanKey) -> bool) {
        let (members, kept) = (&self.members, &self.kept);
        let key = |place: &Place| match place {
            Place::Here(m) => m.key,
            Place::Kept(k) => kept[*k as usize].key,
            Place::Taken { key, .. } => *key,
        };
        for entry in &mut self.entries {
            let places = entry.members.start as usize..entry.members.end as usize;
            if members[places].iter().any(|m| joined(&key(m))) {
                entry.taken = true;
            }
        }
    }

    /// Whether it holds no call.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The key of the span at `place`.
    fn key(&self, place: &Place) -> SpanKey {
        match place {
            Place::Here(m) => m.key,
            Place::Kept(k) => self.kept[*k as usize].key,
            Place::Taken { key, .. } => *key,
        }
    }

    fn clear(&mut self) {
        self.taking = false;
        self.members.clear();
        self.kept.clear();
        self.attempts.clear();
        self.entries.clear();
    }

    /// The memory it takes, about.
    fn bytes(&self) -> usize {
        self.members.len() * std::mem::size_of::<Place>()
            + self.kept.iter().map(Kept::bytes).sum::<usize>()
            + self.attempts.len() * std::mem::size_of::<Observation>()
            + self.entries.len() * std::mem::size_of::<Entry>()
    }
}

/// One request's bytes and its calls.
#[derive(Debug, Default)]
struct Body {
    since: Nanos,
    bytes: Bytes,
    batch: Batch,
    /// What it counts against the bounds.
    cost: usize,
}

/// A span's slot in the table: its key, the request (by number, modulo 2^32: the call found
/// is checked to hold the key) and call it is of. 32 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: SpanKey,
    /// 0: empty.
    body: u32,
    entry: u32,
}

/// The most places the table has (32 MiB of them).
const MAX_PLACES: usize = 1 << 20;

/// How many kept requests' room is kept for the next.
const SPARE: usize = 8;

/// The recently counted calls, by request, oldest first.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// Each kept span's place, at its key's hash; sized to `max_held_spans` (rounded up to a
    /// power of two) on first use. Filled when a span is looked for, not when it is kept:
    /// almost every kept call is forgotten unlooked-for, and most requests look for none.
    table: Vec<Slot>,
    /// The places the table is to have.
    places: usize,
    bodies: VecDeque<Body>,
    /// The number of `bodies`' first (numbers start at 1).
    base: u64,
    /// The number of the first request whose spans are not in the table yet.
    indexed: u64,
    spans: usize,
    bytes: usize,
    spare: Vec<Body>,
}

/// Where `key` goes in a table of `len` places (a power of two): Fibonacci hashing of the
/// span id and the trace id's low half (SDKs make both random; tests make them sequential).
fn place_of(key: &SpanKey, len: usize) -> usize {
    let mut low = [0; 8];
    low.copy_from_slice(&key.0[8..]);
    let h = (u64::from_le_bytes(key.1) ^ u64::from_le_bytes(low).rotate_left(29))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - len.trailing_zeros())) as usize
}

impl Recent {
    /// How many spans are kept.
    pub fn spans(&self) -> usize {
        self.spans
    }

    /// How many bytes they take, about (the requests' bytes included).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The newest request kept: its bytes.
    #[cfg(test)]
    pub fn newest(&self) -> Option<&Bytes> {
        self.bodies.back().map(|b| &b.bytes)
    }

    /// An empty batch, in the room of one kept before.
    pub fn batch(&mut self) -> Batch {
        let mut batch = self
            .spare
            .last_mut()
            .map(|b| std::mem::take(&mut b.batch))
            .unwrap_or_default();
        batch.clear();
        batch
    }

    /// Keeps the calls of `batch`, of the request `body` that arrived at `now`, then forgets
    /// the oldest requests while more than `max_spans` spans or `max_bytes` bytes are kept.
    pub fn keep(
        &mut self,
        (body, owner): (&[u8], Option<Owner<'_>>),
        (mut batch, taken): (Batch, &mut [Call]),
        now: Nanos,
        bounds: (usize, usize),
    ) {
        batch.adopt(taken);
        let (max_spans, max_bytes) = bounds;
        if batch.is_empty() || max_spans == 0 {
            // Its room, back for the next.
            if let Some(spare) = self.spare.last_mut() {
                spare.batch = batch;
            }
            return;
        }
        if self.base == 0 {
            self.base = 1;
            self.indexed = 1;
        }
        self.places = max_spans.next_power_of_two().clamp(2, MAX_PLACES);
        let mut kept = self.spare.pop().unwrap_or_default();
        kept.since = now;
        let held;
        (kept.bytes, held) = match owner.map(|o| (o, held_where_it_is(body, o))) {
            Some((o, Some(allocated))) => (o.bytes.clone(), allocated),
            _ => (Bytes::copy_from_slice(body), body.len()),
        };
        kept.batch = batch;
        kept.cost = held + kept.batch.bytes();
        self.spans += kept.batch.members.len();
        self.bytes += kept.cost;
        self.bodies.push_back(kept);
        while self.spans > max_spans || self.bytes > max_bytes {
            if !self.pop_front() {
                break;
            }
        }
    }

    /// Puts the spans of the requests kept since the last look in the table, oldest first (a
    /// newer span takes an older one's place).
    fn index(&mut self) {
        if self.table.len() != self.places {
            self.table = vec![Slot::default(); self.places];
            self.indexed = self.base;
        }
        let from = self.indexed.max(self.base);
        let to = self.base + self.bodies.len() as u64;
        for number in from..to {
            let batch = &self.bodies[(number - self.base) as usize].batch;
            for (e, entry) in batch.entries.iter().enumerate() {
                if entry.taken {
                    continue;
                }
                for m in &batch.members[entry.members.start as usize..entry.members.end as usize] {
                    let key = batch.key(m);
                    let at = place_of(&key, self.table.len());
                    self.table[at] = Slot {
                        key,
                        body: number as u32,
                        entry: e as u32,
                    };
                }
            }
        }
        self.indexed = to;
    }

    /// The call holding the span `key`, taken out: its spans read again from their request
    /// by `read` (their facts, or `None` when they no longer read as attempts), and the
    /// attempt of a root made again from its facts by `recount`.
    pub fn take(
        &mut self,
        key: &SpanKey,
        read: impl Fn(&[u8], At) -> Option<Owned>,
        recount: impl Fn(&Owned) -> Observation,
    ) -> Option<Call> {
        if self.bodies.is_empty() {
            return None;
        }
        self.index();
        let slot = self.table[place_of(key, self.table.len())];
        if slot.body == 0 || slot.key != *key {
            return None;
        }
        let back = slot.body.wrapping_sub(self.base as u32) as usize;
        let body = self.bodies.get_mut(back)?;
        let batch = &mut body.batch;
        let entry = batch.entries.get(slot.entry as usize)?;
        let (members, attempts) = (entry.members.clone(), entry.attempts.clone());
        let places = &batch.members[members.start as usize..members.end as usize];
        if entry.taken || !places.iter().any(|m| batch.key(m) == *key) {
            return None;
        }
        let mut kept = Vec::with_capacity(places.len());
        for place in places {
            kept.push(match place {
                Place::Here(m) => Kept {
                    facts: read(&body.bytes, m.at)?,
                    side: Side::Client,
                    named: false,
                    key: m.key,
                    parent: m.parent,
                    carrier: None,
                    skipped: m.skipped,
                },
                Place::Kept(k) => batch.kept[*k as usize].clone(),
                // Never moved in (its call was not among those taken): not whole.
                Place::Taken { .. } => return None,
            });
        }
        if let Some(entry) = batch.entries.get_mut(slot.entry as usize) {
            entry.taken = true;
        }
        let attempts = match attempts {
            Some(a) => batch.attempts[a.start as usize..a.end as usize].to_vec(),
            None => kept.iter().map(|k| recount(&k.facts)).collect(),
        };
        Some(Call {
            members: kept,
            state: State::Counted { attempts },
            since: body.since,
        })
    }

    /// Forgets the requests kept at `since` + `window` or before `now`.
    pub fn expire(&mut self, now: Nanos, window: Nanos) {
        while self
            .bodies
            .front()
            .is_some_and(|b| now >= b.since.saturating_add(window))
        {
            self.pop_front();
        }
    }

    /// Forgets every call, each span of those not taken given to `gone` with when its call
    /// was kept.
    pub fn clear(&mut self, mut gone: impl FnMut(SpanKey, Nanos)) {
        for body in &self.bodies {
            let batch = &body.batch;
            for entry in batch.entries.iter().filter(|e| !e.taken) {
                let members = entry.members.start as usize..entry.members.end as usize;
                for m in &batch.members[members] {
                    gone(batch.key(m), body.since);
                }
            }
        }
        while self.pop_front() {}
    }

    /// Forgets the oldest request; `false` when none is kept.
    fn pop_front(&mut self) -> bool {
        let Some(body) = self.bodies.pop_front() else {
            return false;
        };
        self.base += 1;
        self.spans -= body.batch.members.len();
        self.bytes -= body.cost;
        if self.spare.len() < SPARE {
            // The request's bytes let go of; the rest is room for the next.
            self.spare.push(Body {
                bytes: Bytes::new(),
                ..body
            });
        }
        true
    }
}
