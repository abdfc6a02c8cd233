//! One call, one attempt, across exports (DESIGN §9, §11): the spans of calls that may still
//! be joined by spans yet to come, kept between requests.
//!
//! Core: pure state, fed the tracker's clock. Two kinds of calls are kept, each as a bag of
//! its spans' extracted facts ([`Kept`]: an [`Owned`] attempt and ids, never the span):
//! - *held*: not counted yet, because a span of it names a parent that has not arrived and may
//!   be part of the call (SDKs end children first, so a transport request often comes an export
//!   before its protocol span). Held until that parent arrives or `reorder_window` passes.
//! - *counted*: counted already, but a span of the other side may still come — a client call
//!   on an observed interface, or one that named no server while some interface is observed —
//!   so its attempts are kept to be taken back and counted again with that span's facts.
//!   Remembered for a minute at least.
//!
//! A bag may hold spans of several calls (siblings waiting for the same parent): the caller
//! tells them apart when it assembles them. Bags are found by any of their spans and by the
//! parents they wait for. Both kinds together are bounded by `max_held_spans` spans and
//! `max_held_mib`; past either, the oldest bag goes first — a held one to be counted at once
//! (what [`Calls::keep`] returns), a counted one forgotten.
//!
//! Apart from them, and bounded alike, calls counted whole that a late part of their own may
//! still join, for the reorder window ([`Calls::keep_recent`], `recent`).

use crate::extract::call::Side;
use crate::extract::Owned;
use crate::tracker::{Nanos, Observation};
use foldhash::{HashMap, HashSet};
use recent::Recent;
pub use recent::{At, Batch, Member as RecentMember, Owner, Part};
use std::collections::VecDeque;

mod recent;

/// (trace id, span id): one span, or the parent a span names.
pub type SpanKey = ([u8; 16], [u8; 8]);

/// The key of `trace` and `span` (shorter ids are padded with zeros, as the tracker does).
pub fn key(trace: &[u8], span: &[u8]) -> SpanKey {
    let mut k = ([0; 16], [0; 8]);
    let (t, s) = (trace.len().min(16), span.len().min(8));
    k.0[..t].copy_from_slice(&trace[..t]);
    k.1[..s].copy_from_slice(&span[..s]);
    k
}

/// How many ids of spans of forgotten counted calls are kept for each span `max_held_spans`
/// allows: a flood four times the bound past it is still counted once.
const GONE_PER_SPAN: usize = 4;

/// How long a counted call is remembered at least.
const REMEMBERED: Nanos = 60 * crate::clock::SECOND;

/// One span of a kept call.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// Its facts.
    pub facts: Owned,
    /// Which side recorded it.
    pub side: Side,
    /// A server span that names its client itself.
    pub named: bool,
    /// The span.
    pub key: SpanKey,
    /// The parent it names, if any.
    pub parent: Option<SpanKey>,
    /// The HTTP server span that carries it by time (a protocol server span), if any.
    pub carrier: Option<SpanKey>,
    /// It was counted as skipped (`same_call`) already.
    pub skipped: bool,
}

impl Kept {
    /// Moves it out, leaving it without strings.
    pub fn take(&mut self) -> Kept {
        Kept {
            facts: self.facts.take(),
            ..*self
        }
    }

    /// The memory it takes: itself and its facts' strings.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Kept>() + self.facts.heap_bytes()
    }
}

/// Whether a kept call has been counted.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Waiting for the spans `open` names (parents of its spans not seen yet).
    Held {
        /// The parents waited for.
        open: Vec<SpanKey>,
    },
    /// Counted as these attempts (each about one of its spans), to be taken back when a late
    /// span of the call arrives while they are pending.
    Counted {
        /// What the tracker was given.
        attempts: Vec<Observation>,
    },
}

/// The spans of one or more calls, kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Its spans.
    pub members: Vec<Kept>,
    /// Held or counted.
    pub state: State,
    /// When its first span arrived (tracker clock): what its wait is counted from.
    pub since: Nanos,
}

impl Call {
    /// The memory it takes: itself, what it waits for or was counted as, and its spans.
    fn bytes(&self) -> usize {
        let attempts = match &self.state {
            State::Held { open } => open.len() * std::mem::size_of::<SpanKey>(),
            State::Counted { attempts } => attempts.len() * std::mem::size_of::<Observation>(),
        };
        std::mem::size_of::<Call>() + attempts + self.members.iter().map(Kept::bytes).sum::<usize>()
    }

    /// Whether it waits for spans still to come.
    pub fn is_held(&self) -> bool {
        matches!(self.state, State::Held { .. })
    }
}

/// Why a held call was counted before its wait was over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `tracker.max_held_spans` spans were kept.
    Spans,
    /// `tracker.max_held_mib` were kept.
    Bytes,
}

impl Bound {
    /// The `bound` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Spans => "max_held_spans",
            Bound::Bytes => "max_held_mib",
        }
    }
}

/// A kept call's place: its slot, and a tag that tells it from the calls kept in that slot
/// before.
type Handle = u64;

/// A call in its slot: its handle and its bytes.
#[derive(Debug)]
struct Slot {
    call: Call,
    handle: Handle,
    bytes: usize,
}

/// The kept calls, found by their spans and by the parents they wait for.
#[derive(Debug)]
pub struct Calls {
    /// The calls, each in a slot of its own (a freed slot is reused): found by handle without
    /// hashing.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    live: usize,
    members: HashMap<SpanKey, Handle>,
    awaiting: HashMap<SpanKey, Handle>,
    /// (since, handle) of the held calls and of the counted ones, each oldest first; stale
    /// entries (bags taken since) are skipped.
    held_order: VecDeque<(Nanos, Handle)>,
    counted_order: VecDeque<(Nanos, Handle)>,
    next: u64,
    spans: usize,
    bytes: usize,
    max_spans: usize,
    max_bytes: usize,
    window: Nanos,
    /// The spans of counted calls forgotten before their time because a bound was reached,
    /// with when each call arrived, oldest first: a span of such a call that comes later is
    /// part of a call counted already, never a call of its own. At most [`GONE_PER_SPAN`]
    /// times `max_spans` of them (ids only: some 60 bytes each), each for as long as its call
    /// would have been remembered.
    gone: HashSet<SpanKey>,
    gone_order: VecDeque<(Nanos, SpanKey)>,
    /// Counted calls a late span of their own may still join, for the reorder window.
    recent: Recent,
}

impl Calls {
    /// Keeps calls for `window` (the tracker's reorder window; counted ones a minute at
    /// least), at most `max_spans` spans and `max_bytes` bytes of them.
    pub fn new(window: Nanos, max_spans: usize, max_bytes: usize) -> Calls {
        Calls {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            members: HashMap::default(),
            awaiting: HashMap::default(),
            held_order: VecDeque::new(),
            counted_order: VecDeque::new(),
            next: 0,
            spans: 0,
            bytes: 0,
            max_spans,
            max_bytes,
            window,
            gone: HashSet::default(),
            gone_order: VecDeque::new(),
            recent: Recent::default(),
        }
    }

    /// A batch to fill with the calls of a request to keep for a late part
    /// ([`Calls::keep_recent`]).
    pub fn recent_batch(&mut self) -> Batch {
        self.recent.batch()
    }

    /// Keeps the calls of `batch`, counted whole, of the request `body` (held in the
    /// [`bytes::Bytes`] given, if any, else copied) that arrived at `now`, for the reorder
    /// window: a span of one of them that comes late ([`Calls::take_member`] finds it) is
    /// joined to it, and the call counted again. Their spans from earlier requests
    /// ([`Part::Taken`]) are moved out of the calls the request took out, `taken`. Within the
    /// bounds, apart from the held calls: the oldest request is forgotten first.
    pub fn keep_recent(
        &mut self,
        body: (&[u8], Option<Owner<'_>>),
        (batch, taken): (Batch, &mut [Call]),
        now: Nanos,
    ) {
        let bounds = (self.max_spans, self.max_bytes);
        self.recent.keep(body, (batch, taken), now, bounds);
    }

    /// Forgets the recently counted calls, whose attempts have all been settled (a scrape):
    /// none can be counted again, but a late span of one is still part of it, so their ids
    /// are kept as a forgotten counted call's are ([`Calls::was_counted`]).
    pub fn recent_settled(&mut self) {
        let mut gone = Vec::new();
        self.recent.clear(|key, since| gone.push((key, since)));
        for (key, since) in gone {
            self.counted_gone(key, since);
        }
    }

    /// How many spans of recently counted calls ([`Calls::keep_recent`]) are kept, and their
    /// bytes.
    pub fn recent(&self) -> (usize, usize) {
        (self.recent.spans(), self.recent.bytes())
    }

    /// Whether span `key` is of a counted call forgotten early (past a bound): a span naming
    /// it as its parent is part of a call counted already.
    pub fn was_counted(&self, key: &SpanKey) -> bool {
        !self.gone.is_empty() && self.gone.contains(key)
    }

    /// Remembers that span `key`, of a call that arrived at `since`, was counted (its call
    /// forgotten, or the span skipped as part of one that was): within the bounds, the
    /// oldest going first.
    pub fn counted_gone(&mut self, key: SpanKey, since: Nanos) {
        if self.max_spans == 0 || !self.gone.insert(key) {
            return;
        }
        self.gone_order.push_back((since, key));
        while self.gone_order.len() > GONE_PER_SPAN * self.max_spans {
            if let Some((_, k)) = self.gone_order.pop_front() {
                self.gone.remove(&k);
            }
        }
    }

    /// How many spans are kept.
    pub fn spans(&self) -> usize {
        self.spans
    }

    /// How many spans of held calls are kept (the rest are of counted calls).
    pub fn held(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.call.is_held())
            .map(|s| s.call.members.len())
            .sum()
    }

    /// How many bytes they take, about.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The clients of the spans of held calls (a span may be a server's: its client is the
    /// one it names, or none).
    pub fn held_clients(&self) -> impl Iterator<Item = crate::extract::Client<'_>> {
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.call.is_held())
            .flat_map(|s| s.call.members.iter().map(|m| m.facts.attempt().client))
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The call of `handle`, if it is still kept.
    fn get(&self, handle: Handle) -> Option<&Slot> {
        let slot = self.slots.get((handle & u64::from(u32::MAX)) as usize)?;
        slot.as_ref().filter(|s| s.handle == handle)
    }

    /// Whether some call waits for a parent.
    pub fn any_awaiting(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// The call holding the span `key`, taken out: a held or remembered one, else one
    /// counted recently, its spans' facts read again from their request by `read` (and a
    /// root's attempt made again from them by `recount`).
    pub fn take_member(
        &mut self,
        key: &SpanKey,
        read: impl Fn(&[u8], At) -> Option<Owned>,
        recount: impl Fn(&Owned) -> Observation,
    ) -> Option<Call> {
        match self.members.get(key) {
            Some(&id) => self.take(id),
            None => self.recent.take(key, read, recount),
        }
    }

    /// The held or remembered call holding the span `key`, taken out (not one counted
    /// recently: [`Calls::take_member`]).
    pub fn take_held_member(&mut self, key: &SpanKey) -> Option<Call> {
        let id = *self.members.get(key)?;
        self.take(id)
    }

    /// The held call waiting for the span `key`, taken out.
    pub fn take_awaiting(&mut self, key: &SpanKey) -> Option<Call> {
        let id = *self.awaiting.get(key)?;
        self.take(id)
    }

    /// Whether the span `key` is kept.
    pub fn holds(&self, key: &SpanKey) -> bool {
        self.members.contains_key(key)
    }

    fn take(&mut self, id: Handle) -> Option<Call> {
        self.get(id)?;
        let at = (id & u64::from(u32::MAX)) as usize;
        let Slot { call, bytes, .. } = self.slots[at].take()?;
        self.free.push(at);
        self.live -= 1;
        // Removed, and put back in the rare case another call holds the same key.
        let forget = |map: &mut HashMap<SpanKey, Handle>, k: &SpanKey| {
            if let Some(other) = map.remove(k).filter(|other| *other != id) {
                map.insert(*k, other);
            }
        };
        for m in &call.members {
            forget(&mut self.members, &m.key);
        }
        if let State::Held { open } = &call.state {
            for k in open {
                forget(&mut self.awaiting, k);
            }
        }
        self.spans -= call.members.len();
        self.bytes -= bytes;
        Some(call)
    }

    /// Keeps `call`; a held one joins the call already waiting for one of the same parents.
    /// Returns the held calls the bounds forced out, to be counted at once, and why.
    pub fn keep(&mut self, mut call: Call) -> Vec<(Call, Bound)> {
        if self.max_spans == 0 {
            return match call.state {
                State::Held { .. } => vec![(call, Bound::Spans)],
                State::Counted { .. } => Vec::new(),
            };
        }
        // Siblings: the held calls waiting for one of the same parents. The first found that
        // is at least as old takes the call in, where it is (a parent with 10,000 children
        // that come one by one costs one step each, not a rebuild); any other joins too.
        let into = match &call.state {
            State::Held { open } => open
                .iter()
                .filter_map(|k| self.awaiting.get(k).copied())
                .find(|&id| self.get(id).is_some_and(|s| s.call.since <= call.since)),
            State::Counted { .. } => None,
        };
        if let (Some(id), State::Held { open }) = (into, &mut call.state) {
            let open = std::mem::take(open);
            return self.join(id, call.members, open, call.since);
        }
        let mut k = 0;
        while let State::Held { open } = &call.state {
            let Some(parent) = open.get(k).copied() else {
                break;
            };
            k += 1;
            if let Some(other) = self.take_awaiting(&parent) {
                call = merge(call, other);
            }
        }
        let at = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        self.next = self.next.wrapping_add(1);
        let id: Handle = self.next << 32 | at as u64;
        for m in &call.members {
            self.members.insert(m.key, id);
        }
        if let State::Held { open } = &call.state {
            for k in open {
                self.awaiting.insert(*k, id);
            }
        }
        let bytes = call.bytes();
        self.spans += call.members.len();
        self.bytes += bytes;
        let order = if call.is_held() {
            &mut self.held_order
        } else {
            &mut self.counted_order
        };
        order.push_back((call.since, id));
        self.slots[at] = Some(Slot {
            call,
            handle: id,
            bytes,
        });
        self.live += 1;
        self.enforce()
    }

    /// Adds a held call (its spans `members`, waiting for `open`, since `since`) to the held
    /// call `id`, as old or older, in place: its spans and the parents it waits for are added,
    /// nothing of the call already kept is touched again. The other held calls waiting for a
    /// parent it waits for join too.
    fn join(
        &mut self,
        id: Handle,
        mut members: Vec<Kept>,
        open: Vec<SpanKey>,
        mut since: Nanos,
    ) -> Vec<(Call, Bound)> {
        let mut others: Vec<Call> = Vec::new();
        let mut new_open: Vec<SpanKey> = Vec::new();
        for k in open {
            match self.awaiting.get(&k).copied() {
                Some(other) if other == id => {}
                Some(other) => others.extend(self.take(other)),
                None => new_open.push(k),
            }
        }
        for other in others {
            since = since.min(other.since);
            members.extend(other.members);
            if let State::Held { open } = other.state {
                new_open.extend(open);
            }
        }
        let at = (id & u64::from(u32::MAX)) as usize;
        let in_place = self.slots[at]
            .as_ref()
            .is_some_and(|s| s.handle == id && since >= s.call.since);
        if !in_place {
            // An older call joined (the order of held calls is by age), or none is kept there
            // any more: kept anew, with what is kept there.
            let joined = Call {
                members,
                state: State::Held { open: new_open },
                since,
            };
            let call = match self.take(id) {
                Some(kept) => merge(kept, joined),
                None => joined,
            };
            return self.keep(call);
        }
        new_open.sort_unstable();
        new_open.dedup();
        new_open.retain(|k| self.awaiting.get(k) != Some(&id));
        let added = members.iter().map(Kept::bytes).sum::<usize>()
            + new_open.len() * std::mem::size_of::<SpanKey>();
        for m in &members {
            self.members.insert(m.key, id);
        }
        for k in &new_open {
            self.awaiting.insert(*k, id);
        }
        self.spans += members.len();
        self.bytes += added;
        if let Some(slot) = self.slots[at].as_mut() {
            slot.call.members.extend(members);
            if let State::Held { open } = &mut slot.call.state {
                open.extend(new_open);
            }
            slot.bytes += added;
        }
        self.enforce()
    }

    /// Past either bound, the oldest calls go: the held ones returned, to be counted at once.
    fn enforce(&mut self) -> Vec<(Call, Bound)> {
        let mut forced = Vec::new();
        while self.spans > self.max_spans || self.bytes > self.max_bytes {
            let bound = if self.spans > self.max_spans {
                Bound::Spans
            } else {
                Bound::Bytes
            };
            match self.pop_oldest() {
                Some(call) if call.is_held() => forced.push((call, bound)),
                Some(call) => {
                    for m in &call.members {
                        self.counted_gone(m.key, call.since);
                    }
                }
                None => break,
            }
        }
        forced
    }

    /// The held calls whose wait is over at `now` (every one when `all`), oldest first;
    /// counted calls remembered long enough are forgotten.
    pub fn due(&mut self, now: Nanos, all: bool) -> Vec<Call> {
        let mut out = Vec::new();
        let window = self.window;
        while let Some(id) = self.front(true, |since| all || now >= since.saturating_add(window)) {
            out.extend(self.take(id));
        }
        self.recent.expire(now, window);
        let remembered = window.max(REMEMBERED);
        while let Some(id) = self.front(false, |since| now >= since.saturating_add(remembered)) {
            self.take(id);
        }
        while let Some(&(since, k)) = self.gone_order.front() {
            if now < since.saturating_add(remembered) {
                break;
            }
            self.gone_order.pop_front();
            self.gone.remove(&k);
        }
        out
    }

    /// The id of the oldest held (or counted) call when `due` says its time has come; stale
    /// entries are dropped on the way.
    fn front(&mut self, held: bool, due: impl Fn(Nanos) -> bool) -> Option<Handle> {
        let (order, slots) = if held {
            (&mut self.held_order, &self.slots)
        } else {
            (&mut self.counted_order, &self.slots)
        };
        let kept = |id: Handle, since: Nanos| {
            let at = (id & u64::from(u32::MAX)) as usize;
            slots
                .get(at)
                .and_then(Option::as_ref)
                .is_some_and(|s| s.handle == id && s.call.since == since)
        };
        while let Some(&(since, id)) = order.front() {
            if !kept(id, since) {
                order.pop_front();
                continue;
            }
            if !due(since) {
                return None;
            }
            order.pop_front();
            return Some(id);
        }
        None
    }

    /// The oldest call of either kind, taken out.
    fn pop_oldest(&mut self) -> Option<Call> {
        let oldest = |order: &VecDeque<(Nanos, Handle)>| {
            order
                .iter()
                .find(|(since, id)| self.get(*id).is_some_and(|s| s.call.since == *since))
                .map(|(since, _)| *since)
        };
        let held = oldest(&self.held_order);
        let counted = oldest(&self.counted_order);
        let from_held = match (held, counted) {
            (Some(h), Some(c)) => h <= c,
            (h, _) => h.is_some(),
        };
        let id = self.front(from_held, |_| true)?;
        self.take(id)
    }
}

/// Two bags of spans as one: the earlier arrival, every span, every parent waited for.
pub fn merge(mut a: Call, b: Call) -> Call {
    a.since = a.since.min(b.since);
    a.members.extend(b.members);
    a.state = match (a.state, b.state) {
        (State::Held { mut open }, State::Held { open: more }) => {
            open.extend(more);
            open.sort_unstable();
            open.dedup();
            State::Held { open }
        }
        (State::Counted { mut attempts }, State::Counted { attempts: more }) => {
            attempts.extend(more);
            State::Counted { attempts }
        }
        (State::Counted { attempts }, State::Held { .. })
        | (State::Held { .. }, State::Counted { attempts }) => State::Counted { attempts },
    };
    a
}

#[cfg(test)]
mod tests;
