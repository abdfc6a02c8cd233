//! The tracker: per client instance, interface and operation, what was refused, and which
//! attempts a client following the decision boundary would not have sent (DESIGN §5).
//!
//! The per-group logic (`group.rs`) is a pure state machine. This module is the stateful
//! shell around it: a fixed set of shards, each a `Mutex` over the groups of the client
//! instances that hash to it, so one client's state is always behind one lock and two
//! clients rarely contend. A lock is held for one attempt (or one sweep of one shard) and
//! never across an `.await`: nothing here is async. The caller passes the clock in (the wall
//! clock when serving, span time when replaying) and records the [`Event`]s it gets back.
//!
//! `max_keys` bounds the whole: each shard has an even share of it, and lends what it does not
//! use to the others (clients do not hash evenly). Once the whole is reached, a new key is
//! made room for in its own shard when that shard holds its share or more, else in a shard
//! holding more than its share (the room lent comes back), else in its own; eviction is
//! least-recently-used within that shard, in batches of 1/64 of what it holds. Another shard is
//! only ever tried, never waited for: the whole can pass `max_keys` by a key for a moment
//! when every shard holding more than its share is busy and the new key's own is empty.

mod entry;
mod group;
pub mod honesty;
mod keys;
mod names;
mod rules;

pub use group::GroupState;

use crate::classify::Kind;
use crate::classify::Outcome;
use crate::config::TrackerConfig;
use crate::discovery::Declared;
use crate::extract::Discovery;
use arrayvec::ArrayVec;
use foldhash::HashMap;
use group::Group;
use std::fmt::Display;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use crate::clock::Nanos;

/// The most shards; fewer when `max_keys` is small, so every shard can hold a key.
const MAX_SHARDS: usize = 16;

/// A violation of the decision boundary (DESIGN §5), in priority order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Violation {
    /// Retried after an authoritative refusal.
    RetryAfterRefusal,
    /// Retried after an unverified refusal without reading the discovery document.
    RetryWithoutDiscovery,
    /// Retried after an ambiguous failure.
    RetryAfterAmbiguous,
    /// Retried past `max_retries` transient or throttled failures.
    RetryBudgetExhausted,
    /// Came back sooner than the server's `Retry-After` asked.
    RetryBeforeRetryAfter,
    /// Asked for another undeclared path soon after a refusal.
    ProbeAfterRefusal,
}

impl Violation {
    /// Every violation, in priority order.
    pub const ALL: [Violation; 6] = [
        Violation::RetryAfterRefusal,
        Violation::RetryWithoutDiscovery,
        Violation::RetryAfterAmbiguous,
        Violation::RetryBudgetExhausted,
        Violation::RetryBeforeRetryAfter,
        Violation::ProbeAfterRefusal,
    ];

    /// The `violation` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::RetryAfterRefusal => "retry_after_refusal",
            Violation::RetryWithoutDiscovery => "retry_without_discovery",
            Violation::RetryAfterAmbiguous => "retry_after_ambiguous",
            Violation::RetryBudgetExhausted => "retry_budget_exhausted",
            Violation::RetryBeforeRetryAfter => "retry_before_retry_after",
            Violation::ProbeAfterRefusal => "probe_after_refusal",
        }
    }

    /// The alert it raises.
    pub fn alert_name(self) -> &'static str {
        match self {
            Violation::RetryAfterRefusal => "RetryAfterAuthoritativeRefusal",
            Violation::RetryWithoutDiscovery => "RetryWithoutDiscovery",
            Violation::RetryAfterAmbiguous => "RetryAfterAmbiguousResponse",
            Violation::RetryBudgetExhausted => "RetryBudgetExhausted",
            Violation::RetryBeforeRetryAfter => "RetryBeforeRetryAfter",
            Violation::ProbeAfterRefusal => "ProbingAfterRefusal",
        }
    }

    /// Whether a client following the decision boundary would not have sent the request.
    /// Probes are reported, but not counted as avoidable.
    pub fn is_avoidable(self) -> bool {
        self != Violation::ProbeAfterRefusal
    }
}

/// Who and where: one client instance on one interface. The ids are hashes chosen by the
/// caller (of `service.name` + `service.instance.id`, and of the interface name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId {
    /// The client instance.
    pub client: u64,
    /// The interface.
    pub interface: u64,
}

/// What the tracker needs of one attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The client instance and interface.
    pub group: GroupId,
    /// A hash of the operation.
    pub operation: u64,
    /// An opaque handle the caller wants back on this group's events (its metric labels).
    pub labels: u32,
    /// Start, Unix nanoseconds.
    pub start: Nanos,
    /// End, Unix nanoseconds, not before `start`.
    pub end: Nanos,
    /// What the response said.
    pub outcome: Outcome,
    /// Whether the interface declares the path.
    pub declared: Declared,
    /// Whether the attempt asked for, or read, the interface's discovery document.
    pub discovery: Discovery,
    /// The server's delay (`Retry-After`) in nanoseconds from `end`, when it gave one.
    pub retry_after: Option<Nanos>,
    /// The span's trace id.
    pub trace_id: [u8; 16],
    /// The span's id.
    pub span_id: [u8; 8],
    /// Nobody owns its client's name (DESIGN §12.6: a server span that names no client and
    /// no address): its attempts are counted by class, but none is judged a violation or
    /// counted honored. The whole group is so; the first attempt of a group decides.
    pub anonymous: bool,
    /// What it asked, as far as telling a new question from a retry needs (DESIGN §12).
    pub asked: Asked,
    /// What it says about its interface (DESIGN §13).
    pub testimony: honesty::Testimony,
}

/// What an attempt asked, as far as telling a new question from a retry needs (DESIGN §12.1,
/// §12.4). Kept in 8 bytes an entry: fingerprints folded to 30 and 32 bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    /// A fingerprint of the protocol version it named; 0: none.
    pub version: u64,
    /// A fingerprint of its arguments; 0: unknown.
    pub arguments: u64,
    /// Its answer refused the protocol version (MCP -32022, A2A -32009), not the operation:
    /// an attempt naming another version after it is a new question.
    pub version_refused: bool,
    /// A GET or DELETE on an MCP interface that named no session: a successful MCP request
    /// of its group between it and the previous one shows a new session, so it is no retry.
    pub sessionless: bool,
    /// A successful MCP request: it opened or used a session.
    pub in_session: bool,
}

/// An attempt's verdict as known when it arrived: what its span is tagged with. The
/// counted verdict may differ when later spans arrive before it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    /// Its kind (and so its class).
    pub kind: Kind,
    /// The violation it commits, if any.
    pub violation: Option<Violation>,
    /// 1 for a first attempt, n for the n-th in a row of failures on its key.
    pub attempt: u32,
    /// Whether the client had read the interface's discovery document when it started:
    /// the fact the decision table's rows 1 and 2 turn on.
    pub discovery_read: bool,
}

/// What the tracker knows of one client's operation on one interface (see
/// [`Tracker::peek`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peek {
    /// The client had read the interface's discovery document by then.
    pub read_before: bool,
    /// The latest attempt's kind and its number in its row of failures.
    pub last: Option<(Kind, u32)>,
}

/// One attempt a key keeps, as the console shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recent {
    /// Start, Unix nanoseconds.
    pub start: Nanos,
    /// End, Unix nanoseconds.
    pub end: Nanos,
    /// Its kind as judged so far (final once `settled`).
    pub kind: Kind,
    /// The violation it commits, if any.
    pub violation: Option<Violation>,
    /// Its number in its row of failures.
    pub attempt: u16,
    /// The client had read the interface's discovery document when it started.
    pub read: bool,
    /// It asked for the discovery document itself.
    pub asked: bool,
    /// Its verdict is final and counted.
    pub settled: bool,
    /// Its span's trace id.
    pub trace_id: [u8; 16],
}

/// One operation's recent attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationHistory {
    /// The operation, as alerts name it.
    pub operation: String,
    /// Its attempts the key keeps, oldest first.
    pub attempts: Vec<Recent>,
}

/// What the tracker keeps of one client instance on one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHistory {
    /// The group's labels handle (its client and interface names, to the caller).
    pub labels: u32,
    /// When the client first read the interface's discovery document, if it has.
    pub first_read: Option<Nanos>,
    /// Its operations, in the order they were first tried.
    pub operations: Vec<OperationHistory>,
}

/// What became of an attempt taken back ([`Tracker::retract`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retraction {
    /// It was pending: it is gone, as if never observed.
    Retracted,
    /// Its verdict was already counted: it stays.
    Settled,
    /// The tracker does not hold it (its key was evicted, or it was never observed).
    Missing,
}

/// Why keys left the tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// No attempt for `key_ttl`.
    Ttl,
    /// `max_keys` was reached.
    Capacity,
}

impl Eviction {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::Ttl => "ttl",
            Eviction::Capacity => "capacity",
        }
    }
}

/// What the tracker reports for the caller to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An attempt's verdict became final: count it once.
    Counted {
        /// The operation, when there is a violation to alert on.
        operation: Option<Arc<str>>,
        /// The group's labels handle.
        labels: u32,
        /// Its kind (and so its class).
        kind: Kind,
        /// The violation it commits, if any.
        violation: Option<Violation>,
        /// Whether it read the interface's discovery document.
        discovery_read: bool,
        /// The span's trace id.
        trace_id: [u8; 16],
        /// The span's id.
        span_id: [u8; 8],
        /// When the attempt ended (Unix nanoseconds, as the tracker keeps it).
        end: Nanos,
    },
    /// A refusal was not retried within `probe_window`.
    Honored {
        /// The group's labels handle.
        labels: u32,
    },
    /// An interface contradicted itself or its document (DESIGN §13): count it once.
    Contradicted {
        /// The labels handle of the attempt that showed it (its interface is the one).
        labels: u32,
        /// How.
        kind: honesty::Contradiction,
        /// The operation.
        operation: Arc<str>,
        /// The attempt's trace id.
        trace_id: [u8; 16],
        /// The attempt's span id.
        span_id: [u8; 8],
        /// For a refusal contradicted, the trace of the other call of the pair.
        other_trace: Option<[u8; 16]>,
    },
    /// What an attempt said of its interface could not be remembered (DESIGN §13): a bound of
    /// the witness was reached.
    Unwitnessed {
        /// Which.
        reason: honesty::LeftOut,
    },
    /// Keys were evicted.
    Evicted {
        /// Why.
        reason: Eviction,
        /// How many.
        keys: usize,
    },
    /// A group's pending attempts were counted before they had waited `reorder_window`: the
    /// tracker's windows held more than `tracker.max_pending`.
    SettledEarly {
        /// How many.
        attempts: u32,
    },
}

/// The tracker's settings in the units it works in.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    max_retries: u32,
    probe_window: Nanos,
    key_ttl: Nanos,
    reorder_window: Nanos,
    max_held_spans: usize,
    max_held_bytes: usize,
    /// Attempts kept per key.
    depth: usize,
    /// Whether a group that is due settles when its next attempt arrives (serving), or only
    /// when asked: a sweep, a scrape, the end (a replay, whose clock is its spans' own and
    /// whose verdicts must not depend on the order of its lines).
    settle_on_arrival: bool,
}

impl Params {
    /// From the configuration.
    pub fn new(c: &TrackerConfig) -> Params {
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Params {
            max_retries: c.max_retries,
            probe_window: nanos(c.probe_window),
            key_ttl: nanos(c.key_ttl),
            reorder_window: nanos(c.reorder_window),
            max_held_spans: c.max_held_spans,
            max_held_bytes: c.max_held_bytes(),
            // The budget looks at max_retries + 1 attempts before the one judged.
            depth: (c.max_retries as usize + 2).max(4),
            settle_on_arrival: true,
        }
    }
}

#[derive(Default)]
struct Shard {
    groups: HashMap<GroupId, Group>,
    names: names::Names,
    keys: usize,
    /// Its share of `max_keys`: what it holds beyond is lent by the others.
    cap: usize,
    /// How long its groups' pending attempts wait: `reorder_window`, or less while its
    /// windows hold more than its share of `max_pending` (set by each sweep, [`window_for`]).
    window: Nanos,
}

/// How finely a sweep tells apart how long ago a shard's windows opened: in 32nds of
/// `reorder_window` (156 ms of the default 5 s).
const AGES: usize = 32;

/// The attempts a shard's windows hold, by how long ago each window opened (in 32nds of
/// `reorder_window`, the last holding any older): what a sweep bounds by `max_pending`.
#[derive(Debug, Default)]
struct Held([u64; AGES]);

impl Held {
    /// Counts `count` attempts in a window opened `age` ago.
    fn add(&mut self, age: Nanos, count: u32, reorder_window: Nanos) {
        let width = (reorder_window / AGES as u64).max(1);
        // Below 32: the cast loses nothing.
        let at = (age / width).min(AGES as u64 - 1) as usize;
        self.0[at] += u64::from(count);
    }
}

/// A shard's reorder window until the next sweep, from the one it had (`window`), the
/// attempts its windows hold (`held`) and its share of `tracker.max_pending` (0: no bound).
/// Past the share the windows opened first are cut: the window becomes the age past which
/// the youngest ones would hold more, and a group whose window is that old settles. Within
/// it, the window lengthens again as the attempts held allow (at a steady rate they grow
/// with it) by a 32nd of `reorder_window` a sweep at most, never past it, and is whole when
/// nothing is held. Pure.
fn window_for(window: Nanos, held: &Held, share: u64, reorder_window: Nanos) -> Nanos {
    let total: u64 = held.0.iter().sum();
    if share == 0 || total == 0 {
        return reorder_window;
    }
    let width = (reorder_window / AGES as u64).max(1);
    let mut kept = 0;
    for (i, &count) in held.0.iter().enumerate() {
        kept += count;
        if kept > share {
            return width * i as u64;
        }
    }
    // Within the share: by a 32nd of `reorder_window` a sweep at most, as the windows of
    // groups cut together open again together, and what they hold swings from sweep to sweep
    // for a while. A window cut to nothing grows from a 32nd.
    let scaled = u128::from(window.max(width)) * u128::from(share) / u128::from(total);
    let grown = window.saturating_add(width).min(reorder_window);
    Nanos::try_from(scaled).map_or(grown, |w| w.min(grown))
}

/// How many testimonies a flush holds before noting them: a request's flush at most
/// (`pipeline`'s 64 staged attempts).
const HEARD: usize = 64;

/// `id % n`, with a mask rather than a division (some 30 cycles, on every span) when `n` is
/// a power of two, as the number of shards nearly always is.
fn pick(id: u64, n: usize) -> usize {
    let n = n as u64;
    (if n.is_power_of_two() {
        id & (n - 1)
    } else {
        id % n
    }) as usize
}

impl Shard {
    /// Reads what observing `obs` will read first (its group, then what [`Group::touch`]
    /// reads of its key), changing nothing; a value of no meaning, or 0.
    fn touch(&self, obs: &Observation) -> Nanos {
        self.groups
            .get(&obs.group)
            .map_or(0, |g| g.touch(obs.operation))
    }
}

/// Where a pass over the tracker ([`Tracker::settle`], [`Tracker::sweep`],
/// [`Tracker::finish`]) puts its events: one shard's at a time.
pub trait Events {
    /// Takes the events of one shard (leaving `events` empty or not: it is cleared).
    fn take(&mut self, events: &mut Vec<Event>);
}

/// Collects every event.
impl Events for Vec<Event> {
    fn take(&mut self, events: &mut Vec<Event>) {
        self.append(events);
    }
}

/// Hands each shard's events to a function as they come: what the pipeline records.
pub struct EachShard<F: FnMut(&[Event])>(pub F);

impl<F: FnMut(&[Event])> Events for EachShard<F> {
    fn take(&mut self, events: &mut Vec<Event>) {
        (self.0)(events);
    }
}

/// The sharded map of groups.
pub struct Tracker {
    shards: Vec<Mutex<Shard>>,
    params: Params,
    keys: AtomicUsize,
    max_keys: usize,
    /// Each shard's share of `tracker.max_pending` (0: no bound).
    pending_share: u64,
    /// What interfaces said, per (interface, operation), in shards of their own: an
    /// interface's operations are spread over them, and each is locked apart from the
    /// tracker's (inside a tracker shard's lock at most, never the other way round).
    witnesses: Vec<Mutex<honesty::Witness>>,
}

impl Tracker {
    /// An empty tracker.
    pub fn new(config: &TrackerConfig) -> Tracker {
        Tracker::with_shards(config, MAX_SHARDS)
    }

    /// An empty tracker with at most `shards` shards (fewer when `max_keys` is smaller):
    /// what the benchmarks compare.
    pub fn with_shards(config: &TrackerConfig, shards: usize) -> Tracker {
        let n = config.max_keys.clamp(1, shards.max(1));
        let params = Params::new(config);
        let shards = (0..n)
            .map(|i| {
                // Split max_keys exactly: the first `rem` shards take one more.
                let cap = config.max_keys / n + usize::from(i < config.max_keys % n);
                Mutex::new(Shard {
                    cap,
                    window: params.reorder_window,
                    ..Shard::default()
                })
            })
            .collect();
        let window = u64::try_from(config.honesty_window.as_nanos()).unwrap_or(u64::MAX);
        let witnesses = (0..n)
            .map(|_| Mutex::new(honesty::Witness::new(config.max_keys.div_ceil(n), window)))
            .collect();
        Tracker {
            shards,
            params,
            keys: AtomicUsize::new(0),
            max_keys: config.max_keys.max(1),
            pending_share: config.max_pending.div_ceil(n) as u64,
            witnesses,
        }
    }

    /// The witness shard an attempt's testimony goes to; `None` when it says nothing.
    fn witness_shard(&self, obs: &Observation) -> Option<usize> {
        let about = obs.testimony.about;
        (about != 0).then(|| pick(obs.group.interface ^ about, self.witnesses.len()))
    }

    fn lock_witness(&self, shard: usize) -> MutexGuard<'_, honesty::Witness> {
        self.witnesses[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes what a new attempt says about its interface in `witness` (its shard, locked), and
    /// reports the contradictions to count (DESIGN §13).
    fn witness(
        witness: &mut honesty::Witness,
        now: Nanos,
        obs: &Observation,
        operation: &dyn Display,
        out: &mut Vec<Event>,
    ) {
        let interface = obs.group.interface;
        let (found, left_out) =
            witness.note(interface, &obs.testimony, (obs.start, now, obs.trace_id));
        if let Some(reason) = left_out {
            out.push(Event::Unwitnessed { reason });
        }
        if found == [None, None] {
            // Nearly always: nothing to count.
            return;
        }
        let mut name: Option<Arc<str>> = None;
        for (kind, _, other_trace) in found.into_iter().flatten() {
            out.push(Event::Contradicted {
                labels: obs.labels,
                kind,
                other_trace,
                operation: name
                    .get_or_insert_with(|| Arc::from(operation.to_string()))
                    .clone(),
                trace_id: obs.trace_id,
                span_id: obs.span_id,
            });
        }
    }

    /// Notes the testimonies of `items` (by index, in order: `heard`), a witness shard's lock
    /// taken once for all of its own: an uncontended lock still costs an atomic exchange that
    /// waits for every store before it, which one lock an attempt made some 4 % of the
    /// server's time (perf). `heard` is sorted here by shard, arrival order kept within each.
    fn witness_all<T>(
        &self,
        now: Nanos,
        items: &[T],
        parts: &impl Fn(&T) -> (&Observation, &dyn Display),
        heard: &mut [u64],
        out: &mut Vec<Event>,
    ) {
        heard.sort_unstable();
        for run in heard.chunk_by(|a, b| a >> 32 == b >> 32) {
            let mut witness = self.lock_witness((run[0] >> 32) as usize);
            for &i in run {
                let (obs, operation) = parts(&items[(i & u64::from(u32::MAX)) as usize]);
                Tracker::witness(&mut witness, now, obs, operation, out);
            }
        }
    }

    /// Whether `interface` refused operation `about` (an id as [`honesty::Testimony::about`])
    /// and served it within `honesty_window` of `now` (DESIGN §13).
    pub fn contradicted(&self, interface: u64, about: u64, now: Nanos) -> bool {
        self.lock_witness(pick(interface ^ about, self.witnesses.len()))
            .contradicted(interface, about, now)
    }

    /// Forgets the interfaces' operations quiet for a whole `honesty_window` at `now`.
    fn expire_witnesses(&self, now: Nanos) {
        for w in &self.witnesses {
            w.lock().unwrap_or_else(PoisonError::into_inner).expire(now);
        }
    }

    /// The same tracker, whose groups settle only when asked (a sweep, [`Tracker::settle`],
    /// [`Tracker::finish`]), never as an attempt arrives: what a replay needs, whose clock is
    /// its spans' own and whose report must not depend on the order of its lines.
    pub fn settling_only_when_asked(mut self) -> Tracker {
        self.params.settle_on_arrival = false;
        self
    }

    /// How many keys are tracked.
    pub fn keys(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    fn shard_index(&self, group: &GroupId) -> usize {
        pick(group.client, self.shards.len())
    }

    fn shard(&self, group: &GroupId) -> MutexGuard<'_, Shard> {
        self.lock(self.shard_index(group))
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds one attempt at clock `now`. `operation` names it for alerts; it is formatted
    /// only when the attempt opens a new key. Returns its verdict as now known, or `None`
    /// when the same span was already tracked (an exporter's retry: it is not counted twice).
    pub fn observe(
        &self,
        now: Nanos,
        obs: &Observation,
        operation: &dyn Display,
        out: &mut Vec<Event>,
    ) -> Option<Judgement> {
        let mut shard = self.shard(&obs.group);
        let judged = self.observe_locked(&mut shard, now, obs, operation, out);
        drop(shard);
        if let Some(w) = judged.and(self.witness_shard(obs)) {
            Tracker::witness(&mut self.lock_witness(w), now, obs, operation, out);
        }
        judged
    }

    /// Adds attempts in order, exactly as [`Tracker::observe`] one at a time would, and
    /// gives each one's verdict to `verdict` (by index). `parts` gives an item's attempt and
    /// operation. A shard's lock is taken once for a run of attempts in it (a request's
    /// spans share their client, so usually once), and every attempt's key is read once
    /// before any is changed: looking keys up one after another, each waits for its own
    /// cache misses; looking them all up in a tight loop lets those misses overlap. What
    /// the attempts say about their interfaces is noted after them all
    /// (a witness shard locked once for all of its own): the same events, the contradictions
    /// after the rest.
    pub fn observe_all<T>(
        &self,
        now: Nanos,
        items: &[T],
        parts: impl Fn(&T) -> (&Observation, &dyn Display),
        out: &mut Vec<Event>,
        mut verdict: impl FnMut(usize, Option<Judgement>),
    ) {
        // On the stack: a flush allocates nothing for its testimonies (tests/allocations.rs).
        let mut heard = ArrayVec::<u64, HEARD>::new();
        let mut at = 0;
        while at < items.len() {
            let index = self.shard_index(&parts(&items[at]).0.group);
            let run = items[at..]
                .iter()
                .take_while(|t| self.shard_index(&parts(t).0.group) == index)
                .count();
            let mut shard = self.lock(index);
            let touched = items[at..at + run]
                .iter()
                .fold(0, |sum: Nanos, t| sum.wrapping_add(shard.touch(parts(t).0)));
            std::hint::black_box(touched);
            for (i, t) in items[at..at + run].iter().enumerate() {
                let (obs, operation) = parts(t);
                let judged = self.observe_locked(&mut shard, now, obs, operation, out);
                if let Some(w) = judged.and(self.witness_shard(obs)) {
                    if heard.is_full() {
                        // More attempts than a request's flush: noted so far, in order.
                        self.witness_all(now, items, &parts, &mut heard, out);
                        heard.clear();
                    }
                    // The shard above the index: sorted, they run by shard in arrival order.
                    heard.push((w as u64) << 32 | (at + i) as u64);
                }
                verdict(at + i, judged);
            }
            at += run;
        }
        self.witness_all(now, items, &parts, &mut heard, out);
    }

    fn observe_locked(
        &self,
        shard: &mut Shard,
        now: Nanos,
        obs: &Observation,
        operation: &dyn Display,
        out: &mut Vec<Event>,
    ) -> Option<Judgement> {
        let p = &self.params;
        let window = shard.window;
        // The hot path: a known key costs one group lookup and one key lookup.
        if let Some(known) = shard
            .groups
            .get_mut(&obs.group)
            .and_then(|g| g.observe(now, obs, p, window, out))
        {
            return known;
        }
        if self.keys.load(Ordering::Relaxed) >= self.max_keys {
            let evicted = if shard.keys < shard.cap {
                self.reclaim(now, out)
                    .unwrap_or_else(|| evict_lru(shard, now, p, out))
            } else {
                evict_lru(shard, now, p, out)
            };
            self.keys.fetch_sub(evicted, Ordering::Relaxed);
        }
        let name = shard.names.intern_display(operation);
        let group = shard
            .groups
            .entry(obs.group)
            .or_insert_with(|| Group::new(obs.labels, obs.anonymous));
        group.open(obs.operation, group::Key::new(p, name), now);
        shard.keys += 1;
        self.keys.fetch_add(1, Ordering::Relaxed);
        let group = shard.groups.get_mut(&obs.group)?;
        group.observe(now, obs, p, window, out).flatten()
    }

    /// Evicts from a shard holding more than its share of `max_keys` (room it was lent), the
    /// first found free; `None` when none is (or the shard being observed is the only one).
    fn reclaim(&self, now: Nanos, out: &mut Vec<Event>) -> Option<usize> {
        self.shards.iter().find_map(|m| {
            // The shard being observed is locked already: never found here.
            let mut other = m.try_lock().ok()?;
            (other.keys > other.cap).then(|| evict_lru(&mut other, now, &self.params, out))
        })
    }

    /// Takes back the attempt `obs` stood for when it is still pending (DESIGN §11: a span of
    /// a call whose other spans have since made it part of another attempt): the tracker is
    /// then as if it had never been observed. A settled attempt stays counted.
    pub fn retract(&self, obs: &Observation) -> Retraction {
        let mut shard = self.shard(&obs.group);
        let Some(group) = shard.groups.get_mut(&obs.group) else {
            return Retraction::Missing;
        };
        let (retraction, emptied) = group.retract(obs, &self.params);
        if emptied {
            group.keys.remove(&obs.operation);
            if group.keys.is_empty() {
                shard.groups.remove(&obs.group);
            }
            shard.keys -= 1;
            shard.names.removed(1);
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
        retraction
    }

    /// A copy of every group's state, for the state file; one shard locked at a time.
    pub fn export(&self) -> Vec<GroupState> {
        self.each_group(|id, g| Some(g.export(id.client, id.interface)))
    }

    /// What `f` makes of each group it takes, one shard locked at a time.
    fn each_group<T>(&self, mut f: impl FnMut(&GroupId, &Group) -> Option<T>) -> Vec<T> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            out.extend(shard.groups.iter().filter_map(|(id, g)| f(id, g)));
        }
        out
    }

    /// Adds groups read back from a state file, every verdict in them settled (they were
    /// counted by the process that wrote them), within `max_keys`; `relabel` gives each
    /// group's metric labels handle from its old one. Returns how many keys it took.
    pub fn import(&self, groups: Vec<GroupState>, mut relabel: impl FnMut(u32) -> u32) -> usize {
        let mut taken = 0;
        for state in groups {
            let id = GroupId {
                client: state.client,
                interface: state.interface,
            };
            let mut shard = self.shard(&id);
            let held = self.keys.load(Ordering::Relaxed) + taken;
            let room = self.max_keys.saturating_sub(held);
            let labels = relabel(state.labels);
            if shard.groups.contains_key(&id) {
                continue;
            }
            let shard = &mut *shard;
            let names = &mut shard.names;
            let group = Group::import(state, labels, &self.params, room, |n| names.intern(n));
            let keys = group.keys.len();
            if keys == 0 {
                continue;
            }
            shard.groups.insert(id, group);
            shard.keys += keys;
            taken += keys;
        }
        self.keys.fetch_add(taken, Ordering::Relaxed);
        taken
    }

    /// What the tracker holds for `group` and `operation`, without changing anything: for
    /// questions put to the Gate API.
    pub fn peek(&self, group: &GroupId, operation: u64, at: Nanos) -> Peek {
        let shard = self.shard(group);
        shard
            .groups
            .get(group)
            .map(|g| g.peek(operation, at))
            .unwrap_or_default()
    }

    /// What the tracker keeps of every group whose labels handle `wanted` accepts: a
    /// client's story. One pass over every shard, each locked in turn.
    pub fn histories(&self, mut wanted: impl FnMut(u32) -> bool) -> Vec<GroupHistory> {
        self.each_group(|_, g| wanted(g.labels()).then(|| g.history()))
    }

    /// `tracker.max_retries`.
    pub fn max_retries(&self) -> u32 {
        self.params.max_retries
    }

    /// `tracker.reorder_window`, in nanoseconds.
    pub fn reorder_window(&self) -> Nanos {
        self.params.reorder_window
    }

    /// `tracker.max_held_spans`.
    pub fn max_held_spans(&self) -> usize {
        self.params.max_held_spans
    }

    /// `tracker.max_held_mib`, in bytes.
    pub fn max_held_bytes(&self) -> usize {
        self.params.max_held_bytes
    }

    /// Settles pending verdicts: all of them when `force` (a read of the counters), else
    /// those of groups whose first pending attempt arrived `reorder_window` ago.
    pub fn settle(&self, now: Nanos, force: bool, out: &mut impl Events) {
        self.settle_but(now, force, |_| false, out);
    }

    /// [`Tracker::settle`], but a group of a client `waits` names settles only when it is due,
    /// even when `force`d: an attempt of that client still to come (a span held for its call)
    /// may come before its pending ones and change their verdicts.
    pub fn settle_but(
        &self,
        now: Nanos,
        force: bool,
        waits: impl Fn(u64) -> bool,
        out: &mut impl Events,
    ) {
        self.each_shard(out, |shard, batch| {
            for (id, group) in shard.groups.iter_mut() {
                if force && !waits(id.client) {
                    group.settle(now, &self.params, batch);
                } else {
                    group.settle_if_due(now, shard.window, &self.params, batch);
                }
            }
        });
    }

    /// The periodic sweep: settles what is due, counts honored refusals, expires keys idle
    /// for `key_ttl` and the interfaces' operations quiet for `honesty_window`, and sets each
    /// shard's window for what its windows hold against `max_pending` ([`window_for`]).
    pub fn sweep(&self, now: Nanos, out: &mut impl Events) {
        self.expire_witnesses(now);
        let p = &self.params;
        let mut expired = 0;
        self.each_shard(out, |shard, batch| {
            let mut removed = 0;
            let mut held = Held::default();
            let window = shard.window;
            shard.groups.retain(|_, group| {
                group.settle_if_due(now, window, p, batch);
                group.judge_refusals(now, p, batch);
                removed += group.expire(now, p, batch);
                let (count, since) = group.pending();
                held.add(now.saturating_sub(since), count, p.reorder_window);
                !group.keys.is_empty()
            });
            // What a shortened window makes due settles at its group's next attempt, or at
            // the next sweep: not all at once here, holding up the shard's ingest.
            shard.window = window_for(window, &held, self.pending_share, p.reorder_window);
            shard.keys -= removed;
            shard.names.removed(removed);
            expired += removed;
        });
        if expired > 0 {
            self.keys.fetch_sub(expired, Ordering::Relaxed);
            out.take(&mut vec![Event::Evicted {
                reason: Eviction::Ttl,
                keys: expired,
            }]);
        }
    }

    /// Ends a replay: settles everything and judges every refusal as if the clock had
    /// run past all their windows.
    pub fn finish(&self, out: &mut impl Events) {
        self.each_shard(out, |shard, batch| {
            for group in shard.groups.values_mut() {
                group.settle(Nanos::MAX, &self.params, batch);
                group.judge_refusals(Nanos::MAX, &self.params, batch);
            }
        });
    }

    /// Runs `f` on each shard in turn, under its lock, and gives `out` the events of each
    /// shard once its lock is released: what a pass over a million keys reports is never
    /// all held at once, and recording it holds up no ingest.
    fn each_shard(&self, out: &mut impl Events, mut f: impl FnMut(&mut Shard, &mut Vec<Event>)) {
        let mut batch = Vec::new();
        for shard in &self.shards {
            f(
                &mut shard.lock().unwrap_or_else(PoisonError::into_inner),
                &mut batch,
            );
            out.take(&mut batch);
            batch.clear();
        }
    }

    /// Whether any verdict is still pending.
    pub fn has_pending(&self) -> bool {
        self.shards.iter().any(|s| {
            s.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .groups
                .values()
                .any(Group::has_pending)
        })
    }
}

/// Evicts the least recently used keys of a full shard: 1/64 of what it holds at once (its
/// share, or more with room lent), so a flood of new keys pays for one scan of the shard per
/// batch rather than per key — and a client holding a shard's lent room pays no more a key
/// than a thousand clients spread over it (a batch of 1/64 of its share scanned the whole
/// shard for every 1/64 of its share: one client's fresh keys cost 55× a key below the bound,
/// benches/pipeline.rs `tracker_fresh_keys`).
fn evict_lru(shard: &mut Shard, now: Nanos, p: &Params, out: &mut Vec<Event>) -> usize {
    let batch = (shard.keys / 64).max(1);
    let mut ages: Vec<(Nanos, GroupId, u64)> = shard
        .groups
        .iter()
        .flat_map(|(g, group)| group.keys.iter().map(move |(op, k)| (k.last_seen, *g, *op)))
        .collect();
    if ages.len() > batch {
        ages.select_nth_unstable_by_key(batch - 1, |a| a.0);
        ages.truncate(batch);
    }
    let mut doomed: HashMap<GroupId, Vec<u64>> = HashMap::default();
    for (_, g, op) in ages {
        doomed.entry(g).or_default().push(op);
    }
    let mut evicted = 0;
    for (g, ops) in doomed {
        if let Some(group) = shard.groups.get_mut(&g) {
            evicted += group.remove_ops(now, p, out, &ops);
            if group.keys.is_empty() {
                shard.groups.remove(&g);
            }
        }
    }
    shard.keys -= evicted;
    shard.names.removed(evicted);
    out.push(Event::Evicted {
        reason: Eviction::Capacity,
        keys: evicted,
    });
    evicted
}

#[cfg(test)]
mod tests;
