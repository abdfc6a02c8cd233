//! Interfaces that mean what they say (DESIGN §13): per (interface, operation), what the
//! interface answered — refused it (row 1 or 1'), served it, or contradicted its discovery
//! document — from every client, and the contradictions that follow: a refusal and a success
//! of the same operation within `honesty_window` of each other, whichever came first.
//!
//! No single sender names an interface (contract 6, DESIGN §13 "Witnesses"): the refusal and
//! the success of a contradiction come from two different clients, a drift is shown by two
//! clients within the window — or the interface's own SERVER spans say it, alone or joined
//! with a client's. What one client alone shows waits for a second witness.
//!
//! Core: pure. The tracker owns a [`Witness`] and feeds it each new attempt's [`Testimony`];
//! it returns the contradictions to count. Each is counted once when first seen (confirmed),
//! and again only after a whole window without it, whatever the order the spans arrive in.
//! Memory is bounded: at most `cap` operations are remembered (some 500 bytes each with the
//! table's room, `examples/key_memory` with `WITNESS=1`), and bounded per interface (DESIGN
//! §13, contract 6): one interface holds at most an eighth of them, and the origins nobody
//! configured together at most half, so that an origin a sender invents cannot crowd out a
//! configured interface's witness. Past a bound new operations go unremembered (and are
//! reported, [`LeftOut`]) until the quiet ones are forgotten, a window after their last
//! attempt arrived.

use super::Nanos;
use foldhash::HashMap;

/// A way an interface contradicted itself or its document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contradiction {
    /// It refused an operation (row 1 or 1') and served it within the window.
    RefusalContradicted,
    /// It served what its document declares `no`.
    UndeclaredServed,
    /// It refused what its document declares.
    DeclaredRefused,
}

impl Contradiction {
    /// Every kind, in label order.
    pub const ALL: [Contradiction; 3] = [
        Contradiction::RefusalContradicted,
        Contradiction::UndeclaredServed,
        Contradiction::DeclaredRefused,
    ];

    /// The `kind` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Contradiction::RefusalContradicted => "refusal_contradicted",
            Contradiction::UndeclaredServed => "undeclared_served",
            Contradiction::DeclaredRefused => "declared_refused",
        }
    }
}

/// What one attempt says about its interface (DESIGN §13).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Testimony {
    /// The operation as §13 compares them (for HTTP, the method and the path with a trailing
    /// `/`, doubled `/` and case taken away); 0: the attempt says nothing about its interface.
    pub about: u64,
    /// The interface refused it (row 1 or 1').
    pub refused: bool,
    /// The interface served it (class `ok`).
    pub served: bool,
    /// It contradicted the interface's document, and how.
    pub drift: Option<Contradiction>,
    /// Who says it: [`SERVER`], the interface's own SERVER spans (alone or joined with a
    /// client's), or a client, by a fingerprint of its (`service.name`, instance)
    /// ([`Testimony::client`]).
    pub witness: u32,
    /// The interface is a configured one, not an origin of its own.
    pub configured: bool,
}

/// Which bound left an operation unremembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut {
    /// Its interface holds its share already.
    Interface,
    /// The origins nobody configured hold theirs.
    Origins,
    /// Every operation the witness may remember is.
    Total,
}

impl LeftOut {
    /// Every reason, in label order.
    pub const ALL: [LeftOut; 3] = [LeftOut::Interface, LeftOut::Origins, LeftOut::Total];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LeftOut::Interface => "interface",
            LeftOut::Origins => "origins",
            LeftOut::Total => "total",
        }
    }
}

/// One interface holds at most this share of the operations a witness remembers.
const PER_INTERFACE: usize = 8;

/// The witness that is the interface's own server: it needs no second one.
pub const SERVER: u32 = 0;

impl Testimony {
    /// The witness for client `id` (a hash of its name and instance), never [`SERVER`].
    pub fn client(id: u64) -> u32 {
        ((id ^ (id >> 32)) as u32).max(1)
    }
}

/// The refusals or successes of one operation kept: the latest few, enough to find one
/// within a window of any other in all but a storm of both.
const KEPT: usize = 4;

/// The latest times one side of an operation was seen, with who saw each.
#[derive(Debug, Clone, Copy, Default)]
struct Times {
    /// Starts, sorted; 0 for none.
    at: [Nanos; KEPT],
    /// The witness of each.
    by: [u32; KEPT],
}

/// The latest time each of the last two witnesses showed a drift of one kind.
#[derive(Debug, Clone, Copy, Default)]
struct Shown {
    /// Starts; 0 for none.
    at: [Nanos; 2],
    /// The witness of each.
    by: [u32; 2],
}

/// What is remembered of one operation on one interface.
#[derive(Debug, Clone, Default)]
struct Record {
    /// The latest refusals.
    refused: Times,
    /// The latest successes.
    served: Times,
    /// Per drift kind (undeclared served, declared refused), who showed it last, while it
    /// waits for a second witness.
    shown: [Shown; 2],
    /// Per kind, the earliest and latest time it was seen: it is counted again only when seen
    /// a whole window outside them.
    seen: [Option<(Nanos, Nanos)>; 3],
    /// When anything was last noted, by the clock (as the tracker's keys are): for forgetting.
    last: Nanos,
    /// When a refusal contradicted was last seen, by the clock: what the Gate API is told.
    contradicted_at: Nanos,
    /// The traces of the latest refusal and the latest success: the other call of a pair.
    traces: [[u8; 16]; 2],
    /// Its interface is a configured one.
    configured: bool,
}

/// A contradiction to count: its kind, when (the later of the two attempts), and for a refusal
/// contradicted the trace of the other call of the pair (the latest of its kind).
pub type Found = (Contradiction, Nanos, Option<[u8; 16]>);

/// The interfaces' testimonies, per (interface, operation).
#[derive(Debug, Default)]
pub struct Witness {
    records: HashMap<(u64, u64), Record>,
    /// How many operations each interface has remembered.
    per_interface: HashMap<u64, usize>,
    /// How many of the remembered are unconfigured origins'.
    origins: usize,
    cap: usize,
    window: Nanos,
}

impl Witness {
    /// A witness remembering at most `cap` operations, with contradictions `window` apart at
    /// most.
    pub fn new(cap: usize, window: Nanos) -> Witness {
        Witness {
            cap,
            window,
            ..Witness::default()
        }
    }

    /// Notes what an attempt on `interface` that started at `at` says, arriving when the clock
    /// reads `now`; returns the contradictions to count now, at most two (one of the pair, one
    /// of the document), and the bound that left the operation unremembered, if one did.
    pub fn note(
        &mut self,
        interface: u64,
        t: &Testimony,
        (at, now, trace): (Nanos, Nanos, [u8; 16]),
    ) -> ([Option<Found>; 2], Option<LeftOut>) {
        if t.about == 0 || !(t.refused || t.served || t.drift.is_some()) {
            return ([None, None], None);
        }
        let window = self.window;
        if !self.records.contains_key(&(interface, t.about)) {
            if let Some(bound) = self.full(interface, t.configured) {
                return ([None, None], Some(bound));
            }
            *self.per_interface.entry(interface).or_default() += 1;
            self.origins += usize::from(!t.configured);
        }
        let record = self.records.entry((interface, t.about)).or_default();
        record.configured = t.configured;
        record.last = record.last.max(now);
        let mut found = [None, None];
        // Which list it joins (0: refusals, 1: successes); the other holds its pair.
        let side = match (t.refused, t.served) {
            (true, _) => Some(0),
            (_, true) => Some(1),
            _ => None,
        };
        if let Some(side) = side {
            let (mine, other) = if side == 0 {
                (&mut record.refused, &record.served)
            } else {
                (&mut record.served, &record.refused)
            };
            keep(mine, at, t.witness);
            let pair = within(other, at, t.witness, window);
            let other_trace = record.traces[1 - side];
            record.traces[side] = trace;
            if let Some(pair) = pair {
                record.contradicted_at = record.contradicted_at.max(now);
                found[0] = counted(
                    record,
                    Contradiction::RefusalContradicted,
                    pair.max(at),
                    window,
                )
                .map(|(kind, when, _)| (kind, when, Some(other_trace)));
            }
        }
        if let Some(kind) = t.drift {
            let shown = &mut record.shown[usize::from(kind == Contradiction::DeclaredRefused)];
            if let Some(confirmed) = second(shown, at, t.witness, window) {
                found[1] = counted(record, kind, confirmed, window);
            }
        }
        (found, None)
    }

    /// The bound a new operation of `interface` would pass, if any.
    fn full(&self, interface: u64, configured: bool) -> Option<LeftOut> {
        let mine = self.per_interface.get(&interface).copied().unwrap_or(0);
        if self.records.len() >= self.cap {
            Some(LeftOut::Total)
        } else if mine >= (self.cap / PER_INTERFACE).max(1) {
            Some(LeftOut::Interface)
        } else if !configured && self.origins >= (self.cap / 2).max(1) {
            Some(LeftOut::Origins)
        } else {
            None
        }
    }

    /// Whether `interface` was seen contradicting itself on `about` (refusing it and serving
    /// it) within a window of `now`, by the clock.
    pub fn contradicted(&self, interface: u64, about: u64, now: Nanos) -> bool {
        self.records.get(&(interface, about)).is_some_and(|r| {
            r.contradicted_at != 0 && now <= r.contradicted_at.saturating_add(self.window)
        })
    }

    /// Forgets the operations with nothing noted for a whole window before `now`, by the
    /// clock.
    pub fn expire(&mut self, now: Nanos) {
        let window = self.window;
        let (per_interface, origins) = (&mut self.per_interface, &mut self.origins);
        self.records.retain(|&(interface, _), r| {
            let keep = r.last.saturating_add(window) >= now;
            if !keep {
                *origins -= usize::from(!r.configured);
                if let Some(n) = per_interface.get_mut(&interface) {
                    *n -= 1;
                }
            }
            keep
        });
        self.per_interface.retain(|_, n| *n > 0);
    }

    /// How many operations are remembered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// Keeps `at`, seen by `by`, among the latest [`KEPT`] times of `times` (sorted, 0 for an
/// empty place): the smaller ones move down a place and the smallest leaves (no sort: nearly
/// always `at` is the latest, and goes last).
fn keep(times: &mut Times, at: Nanos, by: u32) {
    let seen = times
        .at
        .iter()
        .zip(&times.by)
        .any(|(t, b)| *t == at && *b == by);
    if at <= times.at[0] || seen {
        return;
    }
    let mut i = 0;
    while i + 1 < KEPT && times.at[i + 1] < at {
        times.at[i] = times.at[i + 1];
        times.by[i] = times.by[i + 1];
        i += 1;
    }
    times.at[i] = at;
    times.by[i] = by;
}

/// Whether two witnesses are two: either is the server, or they are different clients (a
/// client is never [`SERVER`], so witnesses that differ are two, and alike, both the server).
fn two(a: u32, b: u32) -> bool {
    a != b || a == SERVER
}

/// A time of `times` within `window` of `at` that another witness than `by` saw, when one is.
fn within(times: &Times, at: Nanos, by: u32, window: Nanos) -> Option<Nanos> {
    if times.at[KEPT - 1] == 0 {
        return None;
    }
    times
        .at
        .iter()
        .zip(&times.by)
        .find(|&(&t, &b)| t != 0 && t.abs_diff(at) <= window && two(by, b))
        .map(|(&t, _)| t)
}

/// Notes a drift shown at `at` by `by`: when the server shows it, or another witness showed
/// it within `window`, it is confirmed, at the later of the two. Each of the last two
/// witnesses is remembered with the latest time it showed it.
fn second(shown: &mut Shown, at: Nanos, by: u32, window: Nanos) -> Option<Nanos> {
    let confirmed = if by == SERVER {
        Some(at)
    } else {
        shown
            .at
            .iter()
            .zip(&shown.by)
            .find(|&(&t, &b)| t != 0 && b != by && t.abs_diff(at) <= window)
            .map(|(&t, _)| t.max(at))
    };
    // Its own place when it has one (its latest time kept), else the older one's when this
    // is later.
    match shown
        .at
        .iter()
        .zip(&shown.by)
        .position(|(&t, &b)| t != 0 && b == by)
    {
        Some(i) => shown.at[i] = shown.at[i].max(at),
        None => {
            let i = usize::from(shown.at[1] < shown.at[0]);
            if at > shown.at[i] {
                shown.at[i] = at;
                shown.by[i] = by;
            }
        }
    }
    confirmed
}

/// Notes `kind` seen at `at`: it is counted when it was never seen, or `at` is a whole window
/// outside every time it was (so an operation that keeps contradicting itself is counted once
/// a window, not once an attempt).
fn counted(record: &mut Record, kind: Contradiction, at: Nanos, window: Nanos) -> Option<Found> {
    let seen = &mut record.seen[kind as usize];
    let new = match *seen {
        None => true,
        Some((first, last)) => {
            at > last.saturating_add(window) || at.saturating_add(window) < first
        }
    };
    *seen = Some(match *seen {
        Some((first, last)) => (first.min(at), last.max(at)),
        None => (at, at),
    });
    new.then_some((kind, at, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Nanos = 1_000;

    fn refused(about: u64) -> Testimony {
        Testimony {
            about,
            refused: true,
            ..Testimony::default()
        }
    }

    fn served(about: u64) -> Testimony {
        Testimony {
            about,
            served: true,
            ..Testimony::default()
        }
    }

    fn kinds(w: &mut Witness, notes: &[(Testimony, Nanos)]) -> Vec<(Contradiction, Nanos)> {
        notes
            .iter()
            .flat_map(|(t, at)| w.note(1, t, (*at, *at, [0; 16])).0)
            .flatten()
            .map(|(kind, when, _)| (kind, when))
            .collect()
    }

    #[test]
    fn a_refusal_and_a_success_within_the_window_contradict_in_either_order() {
        let rc = Contradiction::RefusalContradicted;
        for notes in [
            [(refused(7), 100), (served(7), 200)],
            [(served(7), 200), (refused(7), 100)],
            [(served(7), 100), (refused(7), 200)],
        ] {
            let mut w = Witness::new(10, W);
            assert_eq!(kinds(&mut w, &notes), [(rc, 200)], "{notes:?}");
        }
        let mut w = Witness::new(10, W);
        assert_eq!(
            kinds(&mut w, &[(refused(7), 100), (served(7), 100 + W + 1)]),
            []
        );
        let mut w = Witness::new(10, W);
        assert_eq!(
            kinds(&mut w, &[(refused(7), 100), (served(8), 200)]),
            [],
            "another operation"
        );
        let mut w = Witness::new(10, W);
        assert_eq!(
            kinds(&mut w, &[(refused(7), 100), (refused(7), 200)]),
            [],
            "refused twice"
        );
    }

    #[test]
    fn a_contradiction_is_counted_once_a_window() {
        let rc = Contradiction::RefusalContradicted;
        let mut w = Witness::new(10, W);
        let notes = [
            (refused(7), 100),
            (served(7), 200),
            (refused(7), 300),
            (served(7), 400),
            // A whole window later: again.
            (refused(7), 400 + W + 1),
            (served(7), 400 + W + 2),
        ];
        assert_eq!(kinds(&mut w, &notes), [(rc, 200), (rc, 402 + W)]);
        assert!(
            w.contradicted(1, 7, 402 + 2 * W),
            "within a window of the last"
        );
        assert!(!w.contradicted(1, 7, 403 + 2 * W));
        assert!(!w.contradicted(2, 7, 500), "another interface");
        assert!(!w.contradicted(1, 8, 500), "another operation");
        // By the clock, not the spans' times: an old contradiction arriving now is news.
        let mut old = Witness::new(10, W);
        old.note(1, &refused(7), (100, 50_000, [1; 16]));
        let (found, _) = old.note(1, &served(7), (200, 50_001, [2; 16]));
        assert_eq!(
            found[0],
            Some((Contradiction::RefusalContradicted, 200, Some([1; 16]))),
            "the other call's trace"
        );
        assert!(old.contradicted(1, 7, 50_001 + W));
        assert!(!old.contradicted(1, 7, 50_002 + W));
        old.expire(50_001 + W);
        assert_eq!(old.len(), 1, "kept a window after it arrived");
        old.expire(50_002 + W);
        assert_eq!(old.len(), 0);
        // Arriving late, within what was seen: not again; a window before it: again.
        assert_eq!(kinds(&mut w, &[(served(7), 150)]), []);
    }

    #[test]
    fn drift_is_counted_once_a_window_on_its_own() {
        let drift = |kind| Testimony {
            about: 3,
            drift: Some(kind),
            ..Testimony::default()
        };
        let us = Contradiction::UndeclaredServed;
        let mut w = Witness::new(10, W);
        let notes = [(drift(us), 100), (drift(us), 200), (drift(us), 200 + W + 1)];
        assert_eq!(kinds(&mut w, &notes), [(us, 100), (us, 201 + W)]);
        let dr = Contradiction::DeclaredRefused;
        assert_eq!(
            kinds(&mut w, &[(drift(dr), 300)]),
            [(dr, 300)],
            "each kind apart"
        );
    }

    #[test]
    fn memory_is_bounded_per_interface_and_forgotten_after_a_quiet_window() {
        // 16 operations at most: 2 an interface, 8 for the unconfigured origins together.
        let mut w = Witness::new(16, W);
        let note = |w: &mut Witness, interface: u64, about: u64, configured: bool, at: Nanos| {
            let t = Testimony {
                configured,
                ..served(about)
            };
            w.note(interface, &t, (at, at, [0; 16])).1
        };
        assert_eq!(note(&mut w, 1, 1, true, 100), None);
        assert_eq!(note(&mut w, 1, 2, true, 100), None);
        assert_eq!(note(&mut w, 1, 3, true, 100), Some(LeftOut::Interface));
        assert_eq!(note(&mut w, 1, 1, true, 200), None, "a known one still");
        // An invented origin's flood fills the origins' half, and no more.
        for origin in 10..14 {
            for about in 1..=2 {
                assert_eq!(note(&mut w, origin, about, false, 100), None);
            }
        }
        assert_eq!(note(&mut w, 14, 1, false, 100), Some(LeftOut::Origins));
        // The configured interfaces keep theirs, to the whole.
        for interface in 2..5 {
            for about in 1..=2 {
                assert_eq!(note(&mut w, interface, about, true, 100), None);
            }
        }
        assert_eq!(w.len(), 16);
        assert_eq!(note(&mut w, 5, 1, true, 100), Some(LeftOut::Total));
        assert!(!w.is_empty());
        // An attempt that says nothing, or names no operation, is not remembered.
        let mut quiet = Witness::new(10, W);
        let silent = Testimony {
            about: 9,
            ..Testimony::default()
        };
        let nameless = Testimony {
            about: 0,
            ..served(0)
        };
        for t in [Testimony::default(), silent, nameless] {
            assert_eq!(quiet.note(1, &t, (100, 100, [0; 16])), ([None, None], None));
        }
        assert!(quiet.is_empty(), "nothing remembered");
        w.expire(100 + W);
        assert_eq!(w.len(), 16, "within a window of its last");
        w.expire(100 + W + 1);
        assert_eq!(w.len(), 1, "interface 1's first, noted again at 200");
        // Forgotten, their room is back: the interfaces' and the origins'.
        assert_eq!(note(&mut w, 1, 4, true, 300), None);
        assert_eq!(note(&mut w, 1, 5, true, 300), Some(LeftOut::Interface));
        for about in 1..=8 {
            assert_eq!(note(&mut w, 20 + about, 1, false, 300), None);
        }
        assert_eq!(note(&mut w, 30, 1, false, 300), Some(LeftOut::Origins));
        w.expire(300 + W + 1);
        assert!(w.is_empty());
        assert_eq!((w.origins, w.per_interface.len()), (0, 0));
        assert_eq!(
            LeftOut::ALL.map(LeftOut::as_str),
            ["interface", "origins", "total"]
        );
    }

    #[test]
    fn the_latest_times_are_kept_with_their_witnesses() {
        let mut times = Times::default();
        for (t, by) in [(5, 1), (1, 1), (9, 2), (3, 1), (9, 2), (7, 3), (9, 4)] {
            keep(&mut times, t, by);
        }
        assert_eq!(times.at, [5, 7, 9, 9]);
        assert_eq!(
            times.by,
            [1, 3, 4, 2],
            "the same time by two witnesses kept twice"
        );
        assert_eq!(within(&times, 20, 1, 11), Some(9));
        assert_eq!(within(&times, 20, 1, 10), None);
        assert_eq!(within(&times, 14, 3, 9), Some(5), "another client's");
        assert_eq!(within(&times, 14, 1, 9), Some(7), "never the same client's");
        let mine = Times {
            at: [0, 0, 5, 9],
            by: [0, 0, 3, 3],
        };
        assert_eq!(within(&mine, 9, 3, 10), None, "its own");
        assert_eq!(
            within(&mine, 9, SERVER, 10),
            Some(5),
            "the server needs no other"
        );
        let servers = Times {
            at: [0, 0, 0, 9],
            by: [0, 0, 0, SERVER],
        };
        assert_eq!(within(&servers, 9, 3, 10), Some(9));
        assert_eq!(
            within(&Times::default(), 5, 1, 10),
            None,
            "an empty place is no time"
        );
    }

    #[test]
    fn a_client_is_a_witness_of_its_own_and_never_the_server() {
        assert_ne!(Testimony::client(0), SERVER, "an id of 0 is a client still");
        assert_ne!(Testimony::client(5), SERVER);
        assert_ne!(Testimony::client(5), Testimony::client(6));
        assert_eq!(Testimony::client(5), Testimony::client(5));
        // The high half folded in: ids alike below differ.
        assert_ne!(Testimony::client(7 << 32 | 5), Testimony::client(5));
    }

    fn by(witness: u32, t: Testimony) -> Testimony {
        Testimony { witness, ..t }
    }

    #[test]
    fn one_client_alone_names_no_interface() {
        let rc = Contradiction::RefusalContradicted;
        // Its own refusal, then its own success: nothing, until another client's success.
        let mut w = Witness::new(10, W);
        let notes = [
            (by(7, refused(1)), 100),
            (by(7, served(1)), 200),
            (by(7, refused(1)), 300),
            (by(8, served(1)), 400),
        ];
        assert_eq!(kinds(&mut w, &notes), [(rc, 400)]);
        assert!(w.contradicted(1, 1, 400));
        let mut alone = Witness::new(10, W);
        kinds(
            &mut alone,
            &[(by(7, refused(1)), 100), (by(7, served(1)), 200)],
        );
        assert!(
            !alone.contradicted(1, 1, 200),
            "the Gate is not told either"
        );
        // Either half from the server's own spans: that is enough.
        for pair in [
            [(by(SERVER, refused(1)), 100), (by(7, served(1)), 200)],
            [(by(7, refused(1)), 100), (by(SERVER, served(1)), 200)],
        ] {
            let mut w = Witness::new(10, W);
            assert_eq!(kinds(&mut w, &pair), [(rc, 200)], "{pair:?}");
        }
    }

    #[test]
    fn a_drift_is_counted_when_a_second_client_or_the_server_shows_it() {
        let drift = |witness, kind| Testimony {
            about: 3,
            drift: Some(kind),
            witness,
            ..Testimony::default()
        };
        let us = Contradiction::UndeclaredServed;
        let dr = Contradiction::DeclaredRefused;
        let mut w = Witness::new(10, W);
        let one = [
            (drift(7, us), 100),
            (drift(7, us), 200),
            (drift(7, dr), 250),
        ];
        assert_eq!(kinds(&mut w, &one), [], "one client, again and again");
        // Another client, within the window of the first's latest: at the later of the two.
        assert_eq!(kinds(&mut w, &[(drift(8, us), 150)]), [(us, 200)]);
        // Too far from any other witness: not yet; the server's own span: at once.
        assert_eq!(kinds(&mut w, &[(drift(9, dr), 250 + W + 1)]), []);
        assert_eq!(kinds(&mut w, &[(drift(SERVER, dr), 300)]), [(dr, 300)]);
        // A third client takes the place of the older of the two it remembers.
        let mut w = Witness::new(10, W);
        let three = [
            (drift(1, us), 100),
            (drift(2, us), 100 + 3 * W),
            (drift(3, us), 100 + 5 * W),
        ];
        assert_eq!(kinds(&mut w, &three), []);
        assert_eq!(
            kinds(&mut w, &[(drift(1, us), 100 + 5 * W)]),
            [(us, 100 + 5 * W)]
        );
        // Three apart in time: the third takes the place of the oldest, not of the second.
        let mut w = Witness::new(10, W);
        let apart = [
            (drift(1, us), 3 * W / 2),
            (drift(2, us), 3 * W),
            (drift(3, us), 6 * W),
        ];
        assert_eq!(kinds(&mut w, &apart), []);
        let fourth = 3 * W + 9 * W / 10;
        assert_eq!(
            kinds(&mut w, &[(drift(4, us), fourth)]),
            [(us, fourth)],
            "2's kept"
        );
        let mut w = Witness::new(10, W);
        let late = [
            (drift(1, us), 5 * W),
            (drift(2, us), 7 * W),
            (drift(3, us), 2 * W),
        ];
        assert_eq!(
            kinds(&mut w, &late),
            [],
            "an older time does not push out a later one"
        );
        assert_eq!(
            kinds(&mut w, &[(drift(4, us), 5 * W)]),
            [(us, 5 * W)],
            "1's still"
        );
    }
}
