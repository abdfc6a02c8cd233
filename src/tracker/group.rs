//! The per-(client instance, interface) state machine: discovery reads, refusals, and for
//! each operation a short time-ordered history of attempts (DESIGN §5).
//!
//! Core: pure. It is fed attempts and the tracker's clock and returns [`Event`]s; it takes
//! no locks, reads no clock and counts nothing itself. A verdict is a function of the set of
//! attempts the group holds, not of their arrival order: every attempt stays *pending* until
//! it settles, and a late attempt re-judges the pending ones it can affect (those that start
//! after it ends). Settled verdicts never change, so the counters built from them never
//! go down and count each attempt once. The packed attempt is [`super::entry`]; the rules
//! that judge it, [`super::rules`].

use super::entry::{
    kept_end, Entry, Question, Tail, Verdict, ASKED, FOLLOWED, JUDGED, READ, SETTLED,
};
use super::keys::KeyMap;
use super::rules::{followed, follows, Lists};
use super::rules::{RECENT_KEPT, REFUSALS_KEPT};
use super::{Event, Judgement, Nanos, Observation, Params, Retraction};
use crate::classify::{self, Class};
use crate::extract::Discovery;
use std::sync::Arc;

/// The longest operation name a key keeps for alerts, in bytes.
pub const OPERATION_MAX: usize = 64;
/// Pending attempts a key holds beyond its settled history before the oldest settle early:
/// what bounds memory when one key is flooded within a reorder window.
const MAX_PENDING_PER_KEY: usize = 32;

/// One (client instance, interface, operation) key.
#[derive(Debug)]
pub(super) struct Key {
    /// The tracker's clock when the key last saw an attempt: what TTL and LRU go by.
    pub(super) last_seen: Nanos,
    /// The operation, as alerts name it (at most [`OPERATION_MAX`] bytes).
    operation: Arc<str>,
    /// How many attempts at the front of the history are settled (at least): what trimming
    /// may drop without reading them.
    settled_prefix: u8,
    /// The most attempts the history held since its pending ones last settled: the room it
    /// keeps once they settle (see `give_back`).
    held_most: u8,
    /// The history may hold a settled refusal not yet judged honored or not: the sweep's
    /// judging reads the histories of these keys alone (see `judge_key`).
    unjudged: bool,
    /// Sorted by (start, end, span id); at most `Params::depth` entries.
    history: Vec<Entry>,
    /// What the in-order path needs of the history.
    tail: Tail,
}

impl Key {
    /// An empty key, its history allocated once for `depth` attempts (an attempt arriving
    /// in order at a full history takes the place of the oldest settled one, which leaves
    /// first: see `trim_key`). `operation` is the operation's name for the alerts of its
    /// violations, as the shard keeps it (see `Names`).
    pub(super) fn new(p: &Params, operation: Arc<str>) -> Key {
        Key {
            last_seen: 0,
            operation,
            settled_prefix: 0,
            held_most: 0,
            unjudged: false,
            history: Vec::with_capacity(p.depth),
            tail: Tail::EMPTY,
        }
    }
}

/// One client instance's view of one interface.
#[derive(Debug)]
pub(super) struct Group {
    /// The metrics handle for (client, interface), chosen by the caller: the latest
    /// attempt's, since a handle goes stale when its series expires (`metrics.series_ttl`)
    /// while the group lives on.
    labels: u32,
    /// What the group's keys are judged against; apart from `keys` so that a key can be
    /// borrowed mutably while they are read.
    lists: Listed,
    pub(super) keys: KeyMap<Key>,
    /// Its attempts not yet settled; apart from `keys` as `lists` is.
    pending: Pending,
    /// No key was last seen before this (a lower bound, lowered as keys come and raised by
    /// each look for idle ones): the sweep reads the keys only once it is `key_ttl` old.
    oldest_seen: Nanos,
    /// Some key may hold a settled refusal not yet judged ([`Key::unjudged`]): the sweep
    /// reads the keys only then.
    unjudged: bool,
}

/// A group's [`Lists`], allocated when it first has something to list: most groups (an API
/// that never refused, read by a client that never read its document) never do, and a
/// group's place in its shard's table is 8 bytes of them, not 96 (issue 66: 262,144 places
/// at 22,300 clients). Reads go through `Deref`, with the empty lists when there are none;
/// writes through [`Listed::get_mut`], which allocates them.
#[derive(Debug, Default)]
struct Listed(Option<Box<Lists>>);

/// The lists of a group that has none.
static NO_LISTS: Lists = Lists::EMPTY;

impl Listed {
    /// The lists, to write: allocated if they were not.
    fn get_mut(&mut self) -> &mut Lists {
        self.0.get_or_insert_with(Box::default)
    }
}

impl std::ops::Deref for Listed {
    type Target = Lists;

    fn deref(&self) -> &Lists {
        self.0.as_deref().unwrap_or(&NO_LISTS)
    }
}

/// A group's attempts not yet settled.
#[derive(Debug, Default)]
struct Pending {
    /// How many.
    count: u32,
    /// The clock when the first of them arrived.
    first_at: Nanos,
    /// The latest start among them (a late attempt that ends after it cannot affect them).
    latest_start: Nanos,
}

impl Pending {
    /// Counts an attempt that starts at `start` pending; `reaching` is the end of a read or
    /// a refusal. Whether it may change the verdicts of the group's other pending attempts:
    /// a read or a refusal that arrived late, ending no later than one of them started.
    fn note(&mut self, now: Nanos, start: Nanos, reaching: Option<Nanos>) -> bool {
        if self.count == 0 {
            self.first_at = now;
            self.latest_start = start;
        }
        self.count += 1;
        let affected = reaching.is_some_and(|end| self.count > 1 && end <= self.latest_start);
        self.latest_start = self.latest_start.max(start);
        affected
    }
}

/// One group as the state file holds it (see [`super::Tracker::export`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GroupState {
    /// The client instance's hash.
    pub client: u64,
    /// The interface's hash.
    pub interface: u64,
    /// The metric labels handle of the process that wrote it.
    pub labels: u32,
    lists: Lists,
    keys: Vec<KeyState>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct KeyState {
    operation_hash: u64,
    operation: String,
    last_seen: Nanos,
    history: Vec<Entry>,
}

impl Group {
    /// The group's state, for the state file.
    pub(super) fn export(&self, client: u64, interface: u64) -> GroupState {
        GroupState {
            client,
            interface,
            labels: self.labels,
            lists: Lists::clone(&self.lists),
            keys: self
                .keys
                .iter()
                .map(|(op, k)| KeyState {
                    operation_hash: *op,
                    operation: k.operation.to_string(),
                    last_seen: k.last_seen,
                    history: k.history.clone(),
                })
                .collect(),
        }
    }

    /// A group from the state file, with at most `room` keys (the most recently seen),
    /// every verdict settled and each history within bounds; `name` gives the shard's copy
    /// of an operation's name.
    pub(super) fn import(
        state: GroupState,
        labels: u32,
        p: &Params,
        room: usize,
        mut name: impl FnMut(&str) -> Arc<str>,
    ) -> Group {
        let mut group = Group::new(labels, false);
        let mut lists = state.lists;
        // Sorted ascending: the latest are kept.
        for (list, kept) in [
            (&mut lists.refusals, REFUSALS_KEPT),
            (&mut lists.reads, RECENT_KEPT),
            (&mut lists.sessions, RECENT_KEPT),
        ] {
            list.sort_unstable();
            list.drain(..list.len().saturating_sub(kept));
        }
        group.lists = Listed((lists != Lists::EMPTY).then(|| Box::new(lists)));
        let mut keys = state.keys;
        keys.sort_by_key(|k| std::cmp::Reverse(k.last_seen));
        for k in keys.into_iter().take(room) {
            let mut key = Key::new(p, name(&k.operation));
            key.last_seen = k.last_seen;
            let mut history = k.history;
            history.sort_by_key(Entry::order);
            let skip = history.len().saturating_sub(p.depth);
            for mut e in history.into_iter().skip(skip) {
                e.set(SETTLED);
                key.history.push(e);
            }
            key.settled_prefix = held(&key.history);
            key.tail = Tail::of(&key.history);
            key.unjudged = true;
            group.unjudged = true;
            group.insert(k.operation_hash, key);
        }
        group
    }

    pub(super) fn new(labels: u32, anonymous: bool) -> Group {
        Group {
            labels,
            lists: Listed(anonymous.then(|| {
                Box::new(Lists {
                    anonymous,
                    ..Lists::default()
                })
            })),
            keys: KeyMap::default(),
            pending: Pending::default(),
            oldest_seen: Nanos::MAX,
            unjudged: false,
        }
    }

    /// Adds `key` for `operation`; it counts as seen at its `last_seen`, or `now` when it
    /// is new (what observing it will set).
    pub(super) fn insert(&mut self, operation: u64, key: Key) {
        self.oldest_seen = self.oldest_seen.min(key.last_seen);
        self.keys.insert(operation, key);
    }

    /// Adds a new key for `operation`, about to be observed at `now`.
    pub(super) fn open(&mut self, operation: u64, mut key: Key, now: Nanos) {
        key.last_seen = now;
        self.insert(operation, key);
    }

    /// What [`super::Shard::touch`] reads ahead of observing `operation`: the key whole
    /// (its tail may sit in the next cache line) and the last bytes of its history's latest
    /// attempt (what it asked), where the arriving one begins to be written: the cache line
    /// that write would otherwise wait for, more often than the attempt's first bytes (about
    /// 2 % of the CPU a span, benches/e2e.sh, 9 pairs). 0 when there is no such key.
    pub(super) fn touch(&self, operation: u64) -> Nanos {
        self.keys.get(&operation).map_or(0, |k| {
            k.tail.start
                ^ k.last_seen
                ^ k.history
                    .last()
                    .map_or(0, |e| u64::from(e.question.version))
        })
    }

    /// What the group keeps of each operation's recent attempts, oldest first: a client's
    /// story as the console tells it.
    pub(super) fn history(&self) -> super::GroupHistory {
        let mut operations: Vec<super::OperationHistory> = self
            .keys
            .values()
            .map(|key| super::OperationHistory {
                operation: key.operation.to_string(),
                attempts: key
                    .history
                    .iter()
                    .map(|e| super::Recent {
                        start: e.start,
                        end: e.end(),
                        kind: e.kind(),
                        violation: e.violation(),
                        attempt: u16::from(e.attempt),
                        read: e.has(READ),
                        asked: e.has(ASKED),
                        settled: e.has(SETTLED),
                        trace_id: e.trace_id,
                    })
                    .collect(),
            })
            .collect();
        operations.sort_by_key(|o| o.attempts.first().map_or(0, |a| a.start));
        super::GroupHistory {
            labels: self.labels,
            first_read: self.lists.first_read,
            operations,
        }
    }

    /// The group's labels handle.
    pub(super) fn labels(&self) -> u32 {
        self.labels
    }

    pub(super) fn has_pending(&self) -> bool {
        self.pending.count > 0
    }

    /// How many of its attempts are pending, and since when (the clock when the first of
    /// them arrived; meaningless when none is).
    pub(super) fn pending(&self) -> (u32, Nanos) {
        (self.pending.count, self.pending.first_at)
    }

    /// Adds one attempt; returns its verdict as now known (`Some(None)` for a span already
    /// tracked), or `None` when its key is not in the group. When the group's pending
    /// attempts are due — they have waited `window`, the shard's reorder window — they settle
    /// first, as the sweep would have settled them (unless
    /// [`Params::settle_on_arrival`] is off, as in a replay): a key then
    /// holds pending what arrives within one reorder window, not a window and the sweep's
    /// second besides (which grew the histories of a fleet whose keys take about one attempt
    /// a second).
    pub(super) fn observe(
        &mut self,
        now: Nanos,
        obs: &Observation,
        p: &Params,
        window: Nanos,
        out: &mut Vec<Event>,
    ) -> Option<Option<Judgement>> {
        if p.settle_on_arrival {
            self.settle_if_due(now, window, p, out);
        }
        let read = obs.discovery == Discovery::Read;
        let mut entry = Entry::of(obs);
        if self.lists.anonymous {
            // Never honored: nothing tells its clients apart (DESIGN §12.6).
            entry.set(JUDGED);
        }
        // Where the group compares the attempt's end, it compares the end as kept.
        let end = entry.end();
        let key = self.keys.get_mut(&obs.operation)?;
        key.last_seen = key.last_seen.max(now);
        self.labels = obs.labels;
        // In order (nearly always): after the last attempt, judged from the key's tail.
        let in_order = key.tail.precedes(&entry);
        if in_order && key.history.len() < p.depth + MAX_PENDING_PER_KEY {
            // The settled attempts that would leave once it is in leave first, so that a key
            // needs no room beyond its depth (they see it arrive: `trim_key`). Only settled
            // attempts leave so, short of the pending bound: nothing is settled here.
            let settled = trim_key(key, self.labels, now, p, Some(&entry), out);
            debug_assert_eq!(
                settled, 0,
                "only settled attempts leave ahead of one arriving"
            );
        }
        let at = if in_order {
            key.history.len()
        } else {
            // The same span sent again (an exporter's retry): already counted.
            let Some(at) = place_of(&key.history, &entry) else {
                return Some(None);
            };
            at
        };
        make_room(key, p);
        let refusal = classify::is_refusal_signal(obs.outcome, obs.declared);
        let in_session = obs.asked.in_session;
        if read || refusal || in_session {
            self.lists
                .get_mut()
                .note((read, refusal, in_session), end, p.probe_window);
        }
        if obs.asked.sessionless {
            self.lists.get_mut().streams = true;
        }
        // A session shown late matters only to a group's streams (DESIGN §12.4): others are
        // not re-judged for it.
        let reaching = read || refusal || (in_session && self.lists.streams);
        let others_affected = self.pending.note(now, obs.start, reaching.then_some(end));
        let (kind, violation, attempt) = if in_order {
            append_judged(&self.lists, key, entry, p)
        } else {
            insert_judged(&self.lists, key, (at, entry), reaching, p)
        };
        let judgement = Judgement {
            kind,
            violation,
            attempt: u32::from(attempt),
            discovery_read: self.lists.read_before(obs.start),
        };
        key.held_most = key.held_most.max(held(&key.history));
        self.pending.count -= trim_key(key, self.labels, now, p, None, out);
        if others_affected {
            self.rejudge_others(obs.operation, end, p);
        }
        Some(Some(judgement))
    }

    /// Re-judges the pending attempts of every key but `operation` that started when a read
    /// or a refusal that arrived late ended (at `end`) or later: only those reach across keys.
    fn rejudge_others(&mut self, operation: u64, end: Nanos, p: &Params) {
        for (op, other) in self.keys.iter_mut() {
            if *op != operation {
                let first = other.history.partition_point(|e| e.start < end);
                rejudge(&self.lists, other, first, p);
                other.tail = Tail::of(&other.history);
            }
        }
    }

    /// The group's read state at `at` and the latest attempt of `operation`.
    pub(super) fn peek(&self, operation: u64, at: Nanos) -> super::Peek {
        super::Peek {
            read_before: self.lists.read_before(at),
            last: self
                .keys
                .get(&operation)
                .and_then(|k| k.history.last())
                .map(|e| (e.kind(), u32::from(e.attempt))),
        }
    }

    /// Settles every pending attempt: their verdicts become final and are counted.
    pub(super) fn settle(&mut self, now: Nanos, p: &Params, out: &mut Vec<Event>) {
        if self.pending.count == 0 {
            return;
        }
        for key in self.keys.values_mut() {
            for e in key.history.iter_mut().filter(|e| !e.has(SETTLED)) {
                e.set(SETTLED);
                key.unjudged |= e.kind().class() == Class::Refusal;
                out.push(counted(self.labels, &key.operation, e));
            }
            self.unjudged |= key.unjudged;
            key.settled_prefix = held(&key.history);
            trim_key(key, self.labels, now, p, None, out);
            give_back(key, p);
        }
        self.pending.count = 0;
    }

    /// Whether the pending attempts have waited `window` since the first arrived.
    fn due(&self, now: Nanos, window: Nanos) -> bool {
        self.pending.count > 0 && now >= self.pending.first_at.saturating_add(window)
    }

    /// Settles the pending attempts once they have waited `window`: `reorder_window`, or
    /// less while the tracker's windows hold more than `max_pending` (see
    /// `super::window_for`), when those that have not waited `reorder_window` are counted as
    /// settled early ([`Event::SettledEarly`]).
    pub(super) fn settle_if_due(
        &mut self,
        now: Nanos,
        window: Nanos,
        p: &Params,
        out: &mut Vec<Event>,
    ) {
        if !self.due(now, window) {
            return;
        }
        if !self.due(now, p.reorder_window) {
            out.push(Event::SettledEarly {
                attempts: self.pending.count,
            });
        }
        self.settle(now, p, out);
    }

    /// Takes back the attempt `obs` stood for, while it is pending (a span of a call that has
    /// since become part of another attempt, DESIGN §11): the group is then as if it had never
    /// been observed — what it read and refused, and every pending verdict it reached.
    /// Returns what became of it, and whether its key is left empty (for the caller to drop).
    pub(super) fn retract(&mut self, obs: &Observation, p: &Params) -> (Retraction, bool) {
        let Some(key) = self.keys.get_mut(&obs.operation) else {
            return (Retraction::Missing, false);
        };
        let at = key.history.partition_point(|e| {
            e.order() < (obs.start, kept_end(obs.start, obs.end), obs.span_id)
        });
        match key.history.get(at) {
            Some(e) if e.span_id == obs.span_id && e.trace_id == obs.trace_id => {
                if e.has(SETTLED) {
                    return (Retraction::Settled, false);
                }
            }
            _ => return (Retraction::Missing, false),
        }
        let gone = key.history.remove(at);
        key.settled_prefix = key.settled_prefix.min(small(at));
        let emptied = key.history.is_empty();
        self.pending.count = self.pending.count.saturating_sub(1);
        let read = gone.has(READ);
        let refusal = classify::is_refusal_signal(gone.outcome(), gone.declared());
        if refusal {
            if let Ok(i) = self.lists.refusals.binary_search(&gone.end()) {
                self.lists.get_mut().refusals.remove(i);
            }
        }
        if read && self.lists.first_read == Some(gone.end()) {
            // The earliest read the group still holds (older ones leave with their keys'
            // settled history; a read is taken back while pending, so rarely has one left).
            self.lists.get_mut().first_read = self
                .keys
                .values()
                .flat_map(|k| k.history.iter())
                .filter(|e| e.has(READ))
                .map(|e| e.end())
                .min();
        }
        // As when it arrived (Group::observe): its key from its place on, and a read or a
        // refusal reaches every attempt that started when it ended or later, in every key.
        for (op, key) in self.keys.iter_mut() {
            let from_end = || key.history.partition_point(|e| e.start < gone.end());
            let first = match (*op == obs.operation, read || refusal) {
                (true, true) => at.min(from_end()),
                (true, false) => at,
                (false, true) => from_end(),
                (false, false) => continue,
            };
            rejudge(&self.lists, key, first, p);
            key.tail = Tail::of(&key.history);
        }
        (Retraction::Retracted, emptied)
    }

    /// Counts the settled refusals whose `probe_window` has passed with no attempt after
    /// them on their key as honored.
    /// Reads the keys only when some may hold one.
    pub(super) fn judge_refusals(&mut self, now: Nanos, p: &Params, out: &mut Vec<Event>) {
        if !self.unjudged {
            return;
        }
        let mut waiting = false;
        for key in self.keys.values_mut().filter(|k| k.unjudged) {
            judge_key(key, self.labels, now, p, out);
            waiting |= key.unjudged;
        }
        self.unjudged = waiting;
    }

    /// Removes the keys idle for `key_ttl` at `now` (settled and judged first); returns
    /// how many. Reads the keys only when the oldest may be: a sweep over a million keys
    /// otherwise reads each group alone.
    pub(super) fn expire(&mut self, now: Nanos, p: &Params, out: &mut Vec<Event>) -> usize {
        if now < self.oldest_seen.saturating_add(p.key_ttl) {
            return 0;
        }
        let removed = self.remove_keys(now, p, out, |_, key| {
            now >= key.last_seen.saturating_add(p.key_ttl)
        });
        self.oldest_seen = self
            .keys
            .values()
            .map(|k| k.last_seen)
            .min()
            .unwrap_or(Nanos::MAX);
        removed
    }

    /// Removes keys for which `expired` holds, settling and judging them first; returns how
    /// many it removed.
    pub(super) fn remove_keys(
        &mut self,
        now: Nanos,
        p: &Params,
        out: &mut Vec<Event>,
        mut expired: impl FnMut(u64, &Key) -> bool,
    ) -> usize {
        let doomed: Vec<u64> = self
            .keys
            .iter()
            .filter(|(op, k)| expired(**op, k))
            .map(|(op, _)| *op)
            .collect();
        self.remove_ops(now, p, out, &doomed)
    }

    /// Removes the keys of `ops`, settling and judging them first, each found by its hash —
    /// what a key costs does not depend on how many the group holds; returns how many it
    /// removed.
    pub(super) fn remove_ops(
        &mut self,
        now: Nanos,
        p: &Params,
        out: &mut Vec<Event>,
        ops: &[u64],
    ) -> usize {
        let mut removed = 0;
        for op in ops {
            if let Some(mut key) = self.keys.remove(op) {
                removed += 1;
                for e in key.history.iter_mut().filter(|e| !e.has(SETTLED)) {
                    e.set(SETTLED);
                    self.pending.count -= 1;
                    out.push(counted(self.labels, &key.operation, e));
                }
                judge_key(&mut key, self.labels, now, p, out);
            }
        }
        removed
    }
}

/// Where `entry`, arriving out of order, goes in `history` (sorted by [`Entry::order`]);
/// `None` when the same span is there already (an exporter's retry).
fn place_of(history: &[Entry], entry: &Entry) -> Option<usize> {
    let at = match history.last() {
        None => 0,
        Some(last) if last.order() < entry.order() => history.len(),
        Some(_) => history.partition_point(|e| e.order() < entry.order()),
    };
    let same = history.get(at).is_some_and(|e| {
        e.span_id == entry.span_id && e.trace_id == entry.trace_id && e.start == entry.start
    });
    (!same).then_some(at)
}

/// Room in a full history for one more: half as much again, never past what a key can hold
/// — its settled depth and `MAX_PENDING_PER_KEY` more, the arriving one included. Not
/// doubled: a key of a large fleet that outgrows its depth by a few pending attempts takes 9
/// entries, not 12 (a flooded one reaches its 38 in five steps, and keeps them).
fn make_room(key: &mut Key, p: &Params) {
    let len = key.history.len();
    if len == key.history.capacity() {
        let grown = (len + len / 2).min(most_held(p)).max(len + 1);
        key.history.reserve_exact(grown - len);
    }
}

/// Appends `entry`, which its key's tail [`Tail::precedes`], judged from the tail alone.
fn append_judged(lists: &Lists, key: &mut Key, mut entry: Entry, p: &Params) -> Verdict {
    let history = &key.history;
    let last = || history.last().map_or(Question::default(), |e| e.question);
    let verdict = lists.judge_after(&key.tail, &entry, last, p);
    entry.judged(verdict);
    key.tail.push(&entry);
    key.history.push(entry);
    debug_assert_eq!(
        lists.judge(&key.history, key.history.len() - 1, p),
        verdict,
        "the in-order path judges as the history does"
    );
    verdict
}

/// Inserts `entry`, arriving out of order, at `at`, and re-judges the pending attempts it can
/// affect: those after it, and when it is a read or a refusal (`reaching`), every one that
/// started when it ended or later (of no length, it can stand after some of them in order).
fn insert_judged(
    lists: &Lists,
    key: &mut Key,
    (at, entry): (usize, Entry),
    reaching: bool,
    p: &Params,
) -> Verdict {
    let end = entry.end();
    key.history.insert(at, entry);
    key.settled_prefix = key.settled_prefix.min(small(at));
    let first = if reaching {
        at.min(key.history.partition_point(|e| e.start < end))
    } else {
        at
    };
    rejudge(lists, key, first, p);
    key.tail = Tail::inserted(&key.history, at, &key.tail);
    debug_assert_eq!(
        key.tail,
        Tail::of(&key.history),
        "an insert's tail is the history's"
    );
    // Re-judging changes verdicts, never positions: the attempt is still at `at`.
    let e = &key.history[at];
    (e.kind(), e.violation(), e.attempt)
}

/// Re-judges the pending attempts of one key from index `first` on, in order.
fn rejudge(lists: &Lists, key: &mut Key, first: usize, p: &Params) {
    for i in first..key.history.len() {
        if key.history[i].has(SETTLED) {
            continue;
        }
        let verdict = lists.judge(&key.history, i, p);
        key.history[i].judged(verdict);
    }
}

/// The most attempts a key's history holds at once: its settled depth, the pending ones
/// past it before the oldest settle early, and the one arriving before it is trimmed.
fn most_held(p: &Params) -> usize {
    p.depth + MAX_PENDING_PER_KEY + 1
}

/// The most room a key's history keeps once its pending attempts settle, when it held
/// `held` in the window they waited (at least its depth): half as much again, the room one
/// growth gives ([`make_room`]), so that a key holding about as many each window keeps its
/// room.
fn room_kept(held: usize) -> usize {
    held + held / 2
}

/// Keeps a key's history within bounds: beyond `depth` entries the oldest settled ones
/// leave (refusals among them judged by what the history shows); pending ones stay until they
/// settle, unless a key holds more than `depth + MAX_PENDING_PER_KEY`, when the oldest settle
/// early. Returns how many pending entries it settled.
///
/// With `arriving`, an attempt about to be appended in order ([`Tail::precedes`]) is counted
/// in as if it were there already: what leaves is what would leave once it is in, and it is
/// among the attempts a leaving refusal may be followed by. (In order, it is never a refusal
/// of no length at a leaving attempt's start, so it takes no [`FOLLOWED`] flag.) A key then
/// needs room for `depth` attempts, not one more.
fn trim_key(
    key: &mut Key,
    labels: u32,
    now: Nanos,
    p: &Params,
    arriving: Option<&Entry>,
    out: &mut Vec<Event>,
) -> u32 {
    let len = key.history.len() + usize::from(arriving.is_some());
    // Over the pending bound, settle down to half of it at once: a flooded key pays one
    // shift of its history per half-bound of attempts, not one per attempt.
    let (keep, forced) = if len > p.depth + MAX_PENDING_PER_KEY {
        let keep = p.depth + MAX_PENDING_PER_KEY / 2;
        (keep, len - keep)
    } else {
        (p.depth, 0)
    };
    // The settled prefix leaves without being read (it may be longer than the count
    // says, never shorter); forced settling reads what it counts.
    let prefix = key.settled_prefix as usize;
    let leave = if forced > 0 {
        forced.max(prefix.min(len - keep))
    } else {
        prefix.min(len.saturating_sub(keep))
    };
    let mut settled = 0;
    for i in 0..leave {
        let e = &key.history[i];
        if !e.has(SETTLED) {
            settled += 1;
            out.push(counted(labels, &key.operation, e));
        }
        if !e.has(JUDGED) && e.kind().class() == Class::Refusal {
            let window_end = e.end().saturating_add(p.probe_window);
            let followed =
                followed(&key.history, i, p) || arriving.is_some_and(|a| follows(e, a, p));
            if !followed && now >= window_end {
                out.push(Event::Honored { labels });
            }
        }
    }
    // An attempt leaving follows the refusals of no length that stay and ended the instant it
    // started (ordered after it, they may be judged later): what they would no longer see.
    if let Some(last) = leave.checked_sub(1).map(|i| key.history[i].start) {
        for e in key.history[leave..]
            .iter_mut()
            .take_while(|e| e.start == last)
            .filter(|e| e.end() == last)
        {
            e.set(FOLLOWED);
        }
    }
    key.history.drain(..leave);
    key.settled_prefix = key.settled_prefix.saturating_sub(small(leave));
    settled
}

/// How many attempts a history holds, for [`Key::held_most`] and [`Key::settled_prefix`].
fn held(history: &[Entry]) -> u8 {
    small(history.len())
}

/// A count of a key's attempts in a byte: a history holds at most [`most_held`], and
/// `tracker.max_retries` is at most 64, so at most 99.
fn small(n: usize) -> u8 {
    debug_assert!(
        n <= usize::from(u8::MAX),
        "a history holds under 100 attempts"
    );
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// Once a key's pending attempts have settled: its history keeps room for as many attempts
/// as it held in the window they waited ([`Key::held_most`], at least its depth), and gives
/// back what is beyond half as much again ([`room_kept`]). A fleet's keys each take about
/// as many attempts one window as the next: a key that keeps its room grows no more, where
/// one given back down to its depth at every settle grows again through two or three
/// reallocations every window, and the churn slows every other allocation of the process
/// (measured at 10,000 clients, some 8 a key a window, issue 66: the allocator 9.1% of the
/// server's CPU when a key kept its room only if it held twice its depth, 5.6% now). What a
/// key keeps is no more than half as much again as it held at its busiest in the window, and
/// about what a key growing through that window takes anyway: at a fixed rate the peak is
/// the same (docs/performance.md). A burst's room goes back after the next quieter window,
/// and what a key holds stays bounded by [`most_held`]. A fresh allocation, not `shrink_to`:
/// shrinking in place leaves a hole beside every key that the allocator rarely fills
/// (measured: 1.2 KB a key).
fn give_back(key: &mut Key, p: &Params) {
    let window = usize::from(key.held_most).max(p.depth);
    key.held_most = held(&key.history);
    if key.history.capacity() > room_kept(window) && key.history.len() <= p.depth {
        let mut fresh = Vec::with_capacity(window);
        fresh.append(&mut key.history);
        key.history = fresh;
    }
}

/// Judges the settled refusals of a key whose `probe_window` has passed, and notes whether
/// any is left to judge ([`Key::unjudged`]).
fn judge_key(key: &mut Key, labels: u32, now: Nanos, p: &Params, out: &mut Vec<Event>) {
    let mut waiting = false;
    for i in 0..key.history.len() {
        let e = &key.history[i];
        if e.has(JUDGED) || !e.has(SETTLED) || e.kind().class() != Class::Refusal {
            continue;
        }
        if now < e.end().saturating_add(p.probe_window) {
            waiting = true;
            continue;
        }
        let followed = followed(&key.history, i, p);
        key.history[i].set(JUDGED);
        if !followed {
            out.push(Event::Honored { labels });
        }
    }
    key.unjudged = waiting;
}

fn counted(labels: u32, operation: &Arc<str>, e: &Entry) -> Event {
    Event::Counted {
        operation: e.violation().map(|_| Arc::clone(operation)),
        labels,
        kind: e.kind(),
        violation: e.violation(),
        discovery_read: e.has(READ),
        trace_id: e.trace_id,
        span_id: e.span_id,
        end: e.end(),
    }
}

#[cfg(test)]
mod tests {
    use super::{most_held, room_kept, Group, Key, Observation, Params, SETTLED};
    use crate::classify::{Kind, Outcome};
    use crate::config::TrackerConfig;
    use crate::discovery::Declared;
    use crate::extract::Discovery;
    use crate::tracker::GroupId;

    /// The `n`th attempt of operation 1, in order, every one succeeding.
    fn attempt(n: u64) -> Observation {
        Observation {
            group: GroupId {
                client: 0,
                interface: 0,
            },
            operation: 1,
            labels: 0,
            start: n * 1_000,
            end: n * 1_000 + 500,
            outcome: Outcome::Ok,
            declared: Declared::Unknown,
            discovery: Discovery::None,
            retry_after: None,
            anonymous: false,
            asked: Default::default(),
            testimony: Default::default(),
            trace_id: [0; 16],
            span_id: n.to_be_bytes(),
        }
    }

    /// A group with one key, operation 1.
    fn one_key(p: &Params) -> Group {
        let mut group = Group::new(0, false);
        group.insert(1, Key::new(p, std::sync::Arc::from("op")));
        group
    }

    /// Two attempts of no length at the same instant are ordered by their span ids, whichever
    /// arrives first: the one with the lower id, arriving second, does not go after the other
    /// as if in order (the tail's comparison is strict), so a refusal with the higher id is
    /// judged after it, and it is never a retry of that refusal.
    #[test]
    fn attempts_of_no_length_at_one_instant_go_by_span_id_whichever_arrives_first() {
        let p = Params::new(&TrackerConfig::default());
        let at = |span: u64, outcome: Outcome| Observation {
            start: 5_000,
            end: 5_000,
            outcome,
            span_id: span.to_be_bytes(),
            ..attempt(0)
        };
        let refusal = at(2, Outcome::NotSupported);
        let transient = at(1, Outcome::Transient);
        let settled = |first: &Observation, second: &Observation| {
            let mut group = one_key(&p);
            let mut out = Vec::new();
            for obs in [first, second] {
                group
                    .observe(0, obs, &p, p.reorder_window, &mut out)
                    .expect("the key is there");
            }
            group.settle(0, &p, &mut out);
            let mut verdicts: Vec<_> = out
                .iter()
                .filter_map(|e| match e {
                    super::super::Event::Counted {
                        span_id,
                        kind,
                        violation,
                        ..
                    } => Some((*span_id, *kind, *violation)),
                    _ => None,
                })
                .collect();
            verdicts.sort_unstable_by_key(|v| v.0);
            verdicts
        };
        let in_order = settled(&transient, &refusal);
        assert_eq!(in_order.len(), 2);
        assert_eq!(in_order[0].2, None, "the transient one is first: no retry");
        assert_eq!(
            settled(&refusal, &transient),
            in_order,
            "arrival order does not matter"
        );
    }

    #[test]
    fn a_flooded_key_grows_its_history_no_further_than_it_can_hold() {
        let p = Params::new(&TrackerConfig::default());
        let mut group = one_key(&p);
        let mut out = Vec::new();
        let bound = most_held(&p);
        let mut most = 0;
        // 200 attempts within one reorder window: none settles by age, so the key fills to
        // its pending bound again and again.
        for n in 0..200u64 {
            group
                .observe(0, &attempt(n), &p, p.reorder_window, &mut out)
                .expect("the key is there");
            let history = &group.keys[&1].history;
            most = most.max(history.len());
            assert!(
                history.capacity() <= bound,
                "{} > {bound}",
                history.capacity()
            );
            // The oldest settled early are no longer pending.
            let pending = history.iter().filter(|e| !e.has(SETTLED)).count();
            assert_eq!(group.pending.count as usize, pending, "after {n}");
        }
        // Full, once trimmed after each arrival: the arriving one took the last place.
        assert_eq!(most, bound - 1, "it did fill up");
    }

    /// An attempt that arrives in order at a full history takes the place of its oldest
    /// settled attempt, which leaves first: with no room beyond the key's depth, and a refusal
    /// leaving so is honored only if the arriving attempt does not follow it either.
    #[test]
    fn a_refusal_leaving_for_an_arriving_attempt_sees_it_arrive() {
        let p = Params::new(&TrackerConfig {
            probe_window: std::time::Duration::from_secs(1),
            ..TrackerConfig::default()
        });
        assert_eq!(p.depth, 5);
        let now = 10_000_000_000;
        let honored = |arriving_start: super::Nanos| {
            let mut group = one_key(&p);
            group.insert(2, Key::new(&p, std::sync::Arc::from("discovery")));
            let mut out = Vec::new();
            // A read of the discovery document (on a key of its own), a refusal, then four
            // attempts that started before the refusal ended: none follows it.
            let read = Observation {
                end: 100,
                discovery: Discovery::Read,
                operation: 2,
                ..attempt(0)
            };
            let refusal = Observation {
                start: 200,
                end: 1_000,
                outcome: Outcome::NotSupported,
                ..attempt(10)
            };
            for o in [read, refusal] {
                group.observe(now, &o, &p, p.reorder_window, &mut out);
            }
            for n in 1..5 {
                let overlapping = Observation {
                    start: 500 + n,
                    end: 1_000 + n,
                    ..attempt(n)
                };
                group.observe(now, &overlapping, &p, p.reorder_window, &mut out);
            }
            group.settle(now, &p, &mut out);
            let key = &group.keys[&1];
            assert_eq!(key.history.len(), p.depth);
            assert_eq!(key.history.capacity(), p.depth);
            assert_eq!(key.history[0].kind(), Kind::ProtocolNotSupported);
            let arriving = Observation {
                start: arriving_start,
                end: arriving_start + 500,
                ..attempt(9)
            };
            out.clear();
            group.observe(now, &arriving, &p, p.reorder_window, &mut out);
            let key = &group.keys[&1];
            assert_eq!(key.history.len(), p.depth, "the refusal left");
            assert_eq!(key.history.capacity(), p.depth, "no room beyond the depth");
            assert_eq!(key.history[p.depth - 1].start, arriving_start);
            out.iter()
                .filter(|e| matches!(e, super::Event::Honored { .. }))
                .count()
        };
        assert_eq!(
            honored(2_000),
            0,
            "the arriving attempt follows the refusal"
        );
        assert_eq!(honored(1_004), 0, "the instant the last one ended");
        assert_eq!(honored(1_000_001_000), 0, "at the window's end");
        assert_eq!(honored(1_000_001_001), 1, "after the window: honored");
    }

    #[test]
    fn a_history_grows_by_half_as_much_again_up_to_what_a_key_can_hold() {
        let p = Params::new(&TrackerConfig::default());
        let mut group = one_key(&p);
        let mut out = Vec::new();
        let mut rooms = vec![group.keys[&1].history.capacity()];
        for n in 0..60 {
            group.observe(0, &attempt(n), &p, p.reorder_window, &mut out);
            let room = group.keys[&1].history.capacity();
            if rooms.last() != Some(&room) {
                rooms.push(room);
            }
        }
        assert_eq!(p.depth, 5);
        assert_eq!(rooms, [5, 7, 10, 15, 22, 33, most_held(&p)]);
        assert_eq!(most_held(&p), 38);
    }

    #[test]
    fn a_key_keeps_room_for_what_it_held_in_a_window_and_gives_back_what_is_beyond() {
        let p = Params::new(&TrackerConfig::default());
        let mut group = one_key(&p);
        let mut out = Vec::new();
        let room = |group: &Group| group.keys[&1].history.capacity();
        let mut n = 0;
        let mut send = |group: &mut Group, attempts: u64| {
            for _ in 0..attempts {
                group.observe(0, &attempt(n), &p, p.reorder_window, &mut out);
                n += 1;
            }
            group.settle(0, &p, &mut Vec::new());
        };
        assert_eq!(p.depth, 5);
        assert_eq!(room_kept(p.depth), 7);
        assert_eq!(room_kept(8), 12);
        // A key that held fewer than its depth keeps room for its depth.
        send(&mut group, 1);
        assert_eq!(room(&group), p.depth, "one attempt: the depth kept");
        // Past the pending bound within one reorder window: flooded, and keeps its room.
        send(&mut group, 60);
        assert_eq!(room(&group), most_held(&p), "it will need the room again");
        send(&mut group, 60);
        assert_eq!(room(&group), most_held(&p), "still used");
        // A window within its depth: the room goes back.
        send(&mut group, p.depth as u64);
        assert_eq!(room(&group), p.depth, "not used: given back");
        // Grown to 10 by 10 a window, and kept while it holds about as many.
        send(&mut group, 10);
        assert_eq!(room(&group), 10, "grown by half as much again twice");
        send(&mut group, 10);
        assert_eq!(room(&group), 10, "kept, not grown again");
        send(&mut group, 8);
        assert_eq!(room(&group), 10, "held 8: within half as much again, kept");
        send(&mut group, 7);
        assert_eq!(room(&group), 10, "held 7: kept");
        // Fewer: what is beyond half as much again goes back, to exactly what it held.
        send(&mut group, 6);
        assert_eq!(
            room(&group),
            6,
            "held 6: 10 is more than 9, given back to 6"
        );
        send(&mut group, 9);
        assert_eq!(room(&group), 9, "grown by half as much again");
        send(&mut group, 6);
        assert_eq!(room(&group), 9, "held 6: 9 kept");
        // A quiet window: back to its depth; a few more than its depth kept in any case.
        send(&mut group, 1);
        assert_eq!(room(&group), p.depth, "held its depth: given back");
        send(&mut group, p.depth as u64 + 1);
        assert_eq!(room(&group), 7, "grown by half as much again");
        send(&mut group, 1);
        assert_eq!(room(&group), 7, "the room kept in any case");
    }

    #[test]
    fn a_group_due_settles_before_an_attempt_arrives_so_a_key_holds_one_window() {
        let p = Params::new(&TrackerConfig::default());
        let second = 1_000_000_000;
        assert_eq!(p.reorder_window, 5 * second);
        let mut group = one_key(&p);
        let mut out = Vec::new();
        // One attempt a second, never swept: each settles once its window has passed.
        for n in 0..30 {
            out.clear();
            let a = Observation {
                start: n * second,
                end: n * second + 500,
                ..attempt(n)
            };
            group.observe(n * second, &a, &p, p.reorder_window, &mut out);
            let counted = out
                .iter()
                .filter(|e| matches!(e, super::Event::Counted { .. }))
                .count();
            let expected = if n >= 5 && n % 5 == 0 { 5 } else { 0 };
            assert_eq!(counted, expected, "settled on the arrival of attempt {n}");
            assert_eq!(
                group.pending.count as u64,
                n % 5 + 1,
                "pending after attempt {n}"
            );
            assert_eq!(group.keys[&1].history.capacity(), p.depth, "no room grown");
        }
        // Not due yet: nothing settles ahead of the arriving attempt.
        let mut group = one_key(&p);
        group.observe(0, &attempt(0), &p, p.reorder_window, &mut out);
        out.clear();
        group.observe(5 * second - 1, &attempt(1), &p, p.reorder_window, &mut out);
        assert!(out.is_empty(), "the window has not passed");
        assert_eq!(group.pending.count, 2);
    }

    #[test]
    fn a_key_is_72_bytes_its_tail_18() {
        assert_eq!(std::mem::size_of::<super::Tail>(), 18);
        assert_eq!(std::mem::size_of::<Key>(), 72);
    }

    /// A group's lists take its place in the shard's table only once it has something to list
    /// (issue 66): a group that only succeeds or fails otherwise holds none; a refusal,
    /// a read, a session shown or a stream without one gives it its lists, and an anonymous
    /// group has them from the start (they say so).
    #[test]
    fn a_group_holds_lists_only_once_it_has_something_to_list() {
        assert_eq!(std::mem::size_of::<Group>(), 104);
        let p = Params::new(&TrackerConfig::default());
        let mut out = Vec::new();
        let mut group = one_key(&p);
        for (n, outcome) in [Outcome::Ok, Outcome::Transient, Outcome::Other]
            .into_iter()
            .enumerate()
        {
            let a = Observation {
                outcome,
                ..attempt(n as u64)
            };
            group.observe(0, &a, &p, p.reorder_window, &mut out);
        }
        assert!(group.lists.0.is_none(), "nothing to list");
        assert!(!group.lists.anonymous && group.lists.first_read.is_none());
        assert!(Group::new(0, true).lists.anonymous);

        type Set = fn(&mut Observation);
        let cases: [(&str, Set); 4] = [
            ("a refusal", |a| a.outcome = Outcome::NotSupported),
            ("a read", |a| a.discovery = Discovery::Read),
            ("a session shown", |a| a.asked.in_session = true),
            ("a stream without one", |a| a.asked.sessionless = true),
        ];
        for (what, set) in cases {
            let mut group = one_key(&p);
            let mut a = attempt(0);
            set(&mut a);
            group.observe(0, &a, &p, p.reorder_window, &mut out);
            assert!(group.lists.0.is_some(), "{what} is listed");
        }
    }

    /// The state file keeps a group's lists as they were, and a group with none comes back
    /// with none allocated.
    #[test]
    fn a_groups_lists_come_back_from_the_state_file_as_they_left() {
        let p = Params::new(&TrackerConfig::default());
        let mut out = Vec::new();
        let mut listed = one_key(&p);
        let read = Observation {
            discovery: Discovery::Read,
            ..attempt(0)
        };
        let refused = Observation {
            outcome: Outcome::NotSupported,
            ..attempt(1)
        };
        listed.observe(0, &read, &p, p.reorder_window, &mut out);
        listed.observe(0, &refused, &p, p.reorder_window, &mut out);
        let name = |n: &str| std::sync::Arc::from(n);
        let back = Group::import(listed.export(0, 0), 0, &p, 10, name);
        assert_eq!(*back.lists, *listed.lists);
        assert_eq!(back.lists.first_read, Some(500));
        assert_eq!(back.lists.refusals, [1_500]);

        let mut bare = one_key(&p);
        bare.observe(0, &attempt(0), &p, p.reorder_window, &mut out);
        let back = Group::import(bare.export(0, 0), 0, &p, 10, name);
        assert!(back.lists.0.is_none(), "nothing to list, nothing allocated");
    }
}
