//! Tests of the tracker: one per violation, priority clash and window edge, and property
//! tests for the invariants of DESIGN §5. Time is a parameter; nothing sleeps.

use super::*;
use crate::classify::{self, Class};
use crate::config::TrackerConfig;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

const MS: Nanos = 1_000_000;
/// Span times start here; the clock passed to `observe` is "now" relative to it.
const T0: Nanos = 1_700_000_000_000 * MS;
const WINDOW_MS: u64 = 10_000;

fn config() -> TrackerConfig {
    TrackerConfig {
        max_retries: 3,
        probe_window: Duration::from_millis(WINDOW_MS),
        key_ttl: Duration::from_secs(3600),
        max_keys: 1000,
        reorder_window: Duration::from_secs(5),
        ..TrackerConfig::default()
    }
}

/// One attempt, built fluently: `at(op, start_ms).fails(outcome)`.
#[derive(Clone, Copy, Debug)]
struct A(Observation);

fn at(op: u64, start_ms: u64) -> A {
    A(Observation {
        group: GroupId {
            client: 1,
            interface: 1,
        },
        operation: op,
        labels: 0,
        start: T0 + start_ms * MS,
        end: T0 + (start_ms + 20) * MS,
        outcome: Outcome::Ok,
        declared: Declared::Unknown,
        discovery: Discovery::None,
        retry_after: None,
        anonymous: false,
        asked: Default::default(),
        testimony: Default::default(),
        trace_id: [7; 16],
        span_id: (op * 1_000_003 + start_ms).to_be_bytes(),
    })
}

impl A {
    fn fails(mut self, outcome: Outcome) -> A {
        self.0.outcome = outcome;
        self.0.discovery = asked(self.0.discovery != Discovery::None, outcome);
        self
    }
    fn undeclared(mut self) -> A {
        self.0.declared = Declared::No;
        self
    }
    /// A request for the discovery document: a read unless it fails.
    fn read(mut self) -> A {
        self.0.discovery = asked(true, self.0.outcome);
        self
    }
    /// The server asked to wait this long after the end.
    fn retry_after_ms(mut self, ms: u64) -> A {
        self.0.retry_after = Some(ms * MS);
        self
    }
    fn lasting(mut self, ms: u64) -> A {
        self.0.end = self.0.start + ms * MS;
        self
    }
    fn client(mut self, client: u64) -> A {
        self.0.group.client = client;
        self.0.labels = client as u32;
        self
    }
}

/// What a request for the discovery document (or any other, when not `asks`) that ended with
/// `outcome` did with it.
fn asked(asks: bool, outcome: Outcome) -> Discovery {
    match (asks, outcome) {
        (false, _) => Discovery::None,
        (true, Outcome::Ok) => Discovery::Read,
        (true, _) => Discovery::Asked,
    }
}

/// Discovery, then attempts: op 0 is the discovery path.
fn discovery() -> A {
    at(0, 0).read()
}

#[derive(Debug, Default, PartialEq, Eq, Clone)]
struct Counts {
    kinds: BTreeMap<&'static str, u32>,
    violations: BTreeMap<&'static str, u32>,
    /// Violations in the order the attempts were given (by start time within the test).
    honored: u32,
    counted: u32,
    evicted: u32,
    contradictions: u32,
    unwitnessed: u32,
}

fn tally(events: &[Event]) -> Counts {
    let mut c = Counts::default();
    for e in events {
        match *e {
            Event::Counted {
                kind, violation, ..
            } => {
                c.counted += 1;
                *c.kinds.entry(kind.as_str()).or_default() += 1;
                if let Some(v) = violation {
                    *c.violations.entry(v.as_str()).or_default() += 1;
                }
            }
            Event::Honored { .. } => c.honored += 1,
            Event::Evicted { keys, .. } => c.evicted += keys as u32,
            Event::Contradicted { .. } => c.contradictions += 1,
            Event::Unwitnessed { .. } => c.unwitnessed += 1,
            Event::SettledEarly { .. } => {}
        }
    }
    c
}

/// Feeds the attempts in the order given, in one request, then finishes like a replay.
fn run(attempts: &[A]) -> Counts {
    run_with(config(), attempts)
}

fn run_with(config: TrackerConfig, attempts: &[A]) -> Counts {
    let tracker = Tracker::new(&config);
    let mut events = Vec::new();
    for a in attempts {
        tracker.observe(a.0.end, &a.0, &"op", &mut events);
    }
    tracker.finish(&mut events);
    tally(&events)
}

/// The violation of each attempt, by span start (ms), after everything settled.
fn violations(attempts: &[A]) -> Vec<(u64, Option<&'static str>)> {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    for a in attempts {
        tracker.observe(a.0.end, &a.0, &"op", &mut events);
    }
    tracker.finish(&mut events);
    let mut out: Vec<(u64, Option<&'static str>)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Counted {
                violation, span_id, ..
            } => {
                let id = u64::from_be_bytes(*span_id);
                Some((id % 1_000_003, violation.map(Violation::as_str)))
            }
            _ => None,
        })
        .collect();
    out.sort();
    out
}

fn v(name: &'static str, n: u32) -> BTreeMap<&'static str, u32> {
    BTreeMap::from([(name, n)])
}

#[test]
fn retry_after_refusal() {
    let c = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported),
        at(1, 200).fails(Outcome::NotSupported),
        at(1, 300).fails(Outcome::NotSupported),
    ]);
    assert_eq!(c.violations, v("retry_after_refusal", 2));
    assert_eq!(c.kinds["protocol_not_supported"], 3);
}

/// DESIGN §12.6: a group nobody owns is counted by kind, but nothing in it is judged a
/// violation or counted honored; a group owned by someone is judged as always.
#[test]
fn a_name_nobody_owns_judges_nobody() {
    let nobody = |a: A| {
        A(Observation {
            anonymous: true,
            ..a.0
        })
    };
    let attempts = [
        discovery(),
        at(1, 100).fails(Outcome::NotSupported),
        at(1, 200).fails(Outcome::NotSupported),
        at(2, 300).fails(Outcome::Transient),
        at(2, 400).fails(Outcome::Transient),
        at(2, 500).fails(Outcome::Transient),
        at(2, 600).fails(Outcome::Transient),
        at(2, 700).fails(Outcome::Transient),
        at(3, 800).undeclared().fails(Outcome::NotFound),
    ];
    let owned = run(&attempts);
    assert!(!owned.violations.is_empty());
    assert!(owned.honored > 0);
    let anonymous: Vec<A> = attempts.iter().map(|a| nobody(*a)).collect();
    let c = run(&anonymous);
    assert_eq!(c.kinds, owned.kinds, "counted by kind as before");
    assert_eq!(c.violations, BTreeMap::new());
    assert_eq!(c.honored, 0);
}

impl A {
    /// It named protocol version `v` (a fingerprint), and the answer refused it when `refused`.
    fn version(mut self, v: u64, refused: bool) -> A {
        self.0.asked.version = v;
        self.0.asked.version_refused = refused;
        self
    }
    /// It carried arguments `args` (a fingerprint).
    fn arguments(mut self, args: u64) -> A {
        self.0.asked.arguments = args;
        self
    }
    /// A GET or DELETE on an MCP endpoint that named no session.
    fn sessionless(mut self) -> A {
        self.0.asked.sessionless = true;
        self
    }
    /// A successful MCP request: a session.
    fn in_session(mut self) -> A {
        self.0.asked.in_session = true;
        self
    }
}

/// DESIGN §12.1: after a refused version, another version is a new question — no violation,
/// and the refusal honored; the same version, or none, is a retry; a refusal of the operation
/// is retried whatever version the retry names.
#[test]
fn another_version_after_a_refused_one_is_a_new_question() {
    let c = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported).version(7, true),
        at(1, 200).version(8, false),
    ]);
    assert_eq!(c.violations, BTreeMap::new());
    assert_eq!(c.honored, 1, "the refusal was honored");
    for (again, why) in [(7, "the same version"), (0, "no version")] {
        let c = run(&[
            discovery(),
            at(1, 100).fails(Outcome::NotSupported).version(7, true),
            at(1, 200).version(again, false),
        ]);
        assert_eq!(c.violations, v("retry_after_refusal", 1), "{why}");
        assert_eq!(c.honored, 0, "{why}");
    }
    let c = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported).version(7, false),
        at(1, 200).fails(Outcome::NotSupported).version(8, false),
    ]);
    assert_eq!(
        c.violations,
        v("retry_after_refusal", 1),
        "the operation refused"
    );
}

/// DESIGN §12.1: other arguments after an ambiguous answer are a corrected call; the same or
/// unknown arguments a retry; arguments never excuse a retry after a refusal.
#[test]
fn other_arguments_correct_an_ambiguous_call_only() {
    let ambiguous = |first: u64, second: u64| {
        run(&[
            at(1, 100).fails(Outcome::Other).arguments(first),
            at(1, 200).fails(Outcome::Other).arguments(second),
        ])
        .violations
    };
    assert_eq!(ambiguous(1, 2), BTreeMap::new());
    assert_eq!(ambiguous(1, 1), v("retry_after_ambiguous", 1));
    assert_eq!(ambiguous(1, 0), v("retry_after_ambiguous", 1));
    assert_eq!(ambiguous(0, 2), v("retry_after_ambiguous", 1));
    let refused = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported).arguments(1),
        at(1, 200).fails(Outcome::NotSupported).arguments(2),
    ]);
    assert_eq!(refused.violations, v("retry_after_refusal", 1));
    // Out of order too: the corrected call arrives before the call it corrects.
    let c = run(&[
        at(1, 200).fails(Outcome::Other).arguments(2),
        at(1, 100).fails(Outcome::Other).arguments(1),
    ]);
    assert_eq!(c.violations, BTreeMap::new());
}

/// DESIGN §12.4: a GET with no session known after a successful MCP request (a new session)
/// is a first attempt; with none since the last GET it is a retry, whatever the arrival order.
#[test]
fn a_sessionless_stream_in_a_new_session_is_a_first_attempt() {
    let get = |ms| at(1, ms).fails(Outcome::NotSupported).sessionless();
    let fresh = [discovery(), get(100), at(2, 200).in_session(), get(300)];
    assert_eq!(run(&fresh).violations, BTreeMap::new());
    let mut reversed = fresh;
    reversed.reverse();
    assert_eq!(run(&reversed).violations, BTreeMap::new());
    let again = [discovery(), get(100), at(2, 50).in_session(), get(300)];
    assert_eq!(run(&again).violations, v("retry_after_refusal", 1));
    let not_sessionless = [
        discovery(),
        at(1, 100).fails(Outcome::NotSupported),
        at(2, 200).in_session(),
        at(1, 300).fails(Outcome::NotSupported),
    ];
    assert_eq!(
        run(&not_sessionless).violations,
        v("retry_after_refusal", 1)
    );
}

/// DESIGN §12.2: after a header mismatch or a gone session, only a read that ended after
/// that answer started informs the retry; the session's first read does not.
#[test]
fn a_header_mismatch_or_a_gone_session_asks_for_a_read_after_it() {
    for asks in [Outcome::HeaderMismatch, Outcome::SessionGone] {
        let hasty = run(&[discovery(), at(1, 100).fails(asks), at(1, 200)]);
        assert_eq!(
            hasty.violations,
            v("retry_without_discovery", 1),
            "{asks:?}"
        );
        let informed = run(&[
            discovery(),
            at(1, 100).fails(asks),
            at(0, 150).read(),
            at(1, 200),
        ]);
        assert_eq!(informed.violations, BTreeMap::new(), "{asks:?}");
        // A read that ended while the answer was in flight (it started at 100) counts.
        let in_flight = run(&[
            at(1, 100).fails(asks).lasting(50),
            at(0, 90).read(),
            at(1, 200),
        ]);
        assert_eq!(in_flight.violations, BTreeMap::new(), "{asks:?}");
        // One that ended before it started does not, whatever the arrival order.
        let before = [at(0, 50).read(), at(1, 100).fails(asks), at(1, 200)];
        assert_eq!(
            run(&before).violations,
            v("retry_without_discovery", 1),
            "{asks:?}"
        );
        let mut reversed = before;
        reversed.reverse();
        assert_eq!(
            run(&reversed).violations,
            v("retry_without_discovery", 1),
            "{asks:?}"
        );
        let kind = if asks == Outcome::HeaderMismatch {
            "header_mismatch"
        } else {
            "session_expired"
        };
        assert_eq!(hasty.kinds[kind], 1);
    }
}

#[test]
fn retry_without_discovery() {
    let c = run(&[
        at(1, 0).fails(Outcome::NotSupported),
        at(1, 100).fails(Outcome::NotSupported),
    ]);
    assert_eq!(c.violations, v("retry_without_discovery", 1));
    assert_eq!(c.kinds["unverified_refusal"], 2);
}

#[test]
fn discovery_between_retries_makes_the_next_try_legitimate() {
    assert_eq!(
        violations(&[
            at(1, 0).fails(Outcome::NotSupported),
            at(0, 100).read(),
            at(1, 200).fails(Outcome::NotSupported),
            at(1, 300).fails(Outcome::NotSupported),
        ]),
        vec![
            (0, None),
            (100, None),
            (200, None),
            (300, Some("retry_after_refusal"))
        ]
    );
}

#[test]
fn a_read_that_ends_after_the_retry_started_does_not_count() {
    let c = run(&[
        at(1, 0).fails(Outcome::NotSupported),
        at(0, 100).read().lasting(200),
        at(1, 200).fails(Outcome::NotSupported),
    ]);
    assert_eq!(c.violations, v("retry_without_discovery", 1));
}

#[test]
fn a_read_that_ends_while_the_refused_attempt_is_in_flight_informs_the_retry() {
    // The read ends with the refused attempt, or inside it: either way before the retry.
    for (read, read_at) in [(at(0, 0).read(), 0), (at(0, 5).read().lasting(10), 5)] {
        let mut want = vec![
            (0, None),
            (read_at, None),
            (40, None),
            (80, Some("retry_after_refusal")),
        ];
        want.sort();
        let attempts = [
            at(1, 0).fails(Outcome::NotSupported),
            read,
            at(1, 40).fails(Outcome::NotSupported),
            at(1, 80).fails(Outcome::NotSupported),
        ];
        assert_eq!(violations(&attempts), want);
        assert_eq!(run(&attempts).kinds["protocol_not_supported"], 2);
    }
}

#[test]
fn a_discovery_read_after_a_refusal_is_never_a_probe() {
    // Its path is a discovery path, which no interface declares: but reading the document
    // after a refusal is what the boundary asks for. So is asking for it and not getting it.
    assert_eq!(
        violations(&[
            at(1, 0).fails(Outcome::NotFound).undeclared(),
            at(0, 100).read().undeclared(),
            at(2, 200).fails(Outcome::NotFound).undeclared(),
            at(0, 300).read().undeclared(),
            at(5, 400).read().undeclared().fails(Outcome::NotFound),
        ]),
        vec![
            (0, None),
            (100, None),
            (200, Some("probe_after_refusal")),
            (300, None),
            (400, None)
        ]
    );
}

#[test]
fn retry_before_retry_after_and_its_edge() {
    // Throttled at 0..20 ms with Retry-After 1 s: back at 1,020 ms at the earliest.
    let back = |start: u64| {
        run(&[
            at(1, 0).fails(Outcome::Throttled).retry_after_ms(1000),
            at(1, start),
        ])
        .violations
    };
    assert_eq!(back(500), v("retry_before_retry_after", 1));
    assert_eq!(back(1019), v("retry_before_retry_after", 1));
    assert!(back(1020).is_empty());
    // Only the predecessor's delay counts, and only after a transient or throttled failure.
    assert_eq!(
        violations(&[
            at(1, 0).fails(Outcome::Transient).retry_after_ms(1000),
            at(1, 100).fails(Outcome::Transient),
            at(1, 200),
        ]),
        vec![
            (0, None),
            (100, Some("retry_before_retry_after")),
            (200, None)
        ]
    );
    assert!(run(&[at(1, 0).retry_after_ms(1000), at(1, 100)])
        .violations
        .is_empty());
    assert_eq!(
        run(&[
            at(1, 0).fails(Outcome::Other).retry_after_ms(1000),
            at(1, 100),
        ])
        .violations,
        v("retry_after_ambiguous", 1)
    );
    // Each key has its own delay: another operation may go ahead.
    assert!(run(&[
        at(1, 0).fails(Outcome::Throttled).retry_after_ms(1000),
        at(2, 100),
    ])
    .violations
    .is_empty());
}

#[test]
fn priority_budget_beats_retry_before_retry_after_which_beats_probe() {
    let mut attempts: Vec<A> = (0..4)
        .map(|i| {
            at(1, i * 1000)
                .fails(Outcome::Transient)
                .retry_after_ms(900)
                .undeclared()
        })
        .collect();
    attempts.push(at(1, 3500).undeclared());
    assert_eq!(
        violations(&attempts).last(),
        Some(&(3500, Some("retry_budget_exhausted")))
    );
    assert_eq!(
        violations(&[
            at(2, 0).fails(Outcome::NotFound).undeclared(),
            at(1, 100)
                .fails(Outcome::Throttled)
                .retry_after_ms(500)
                .undeclared(),
            at(1, 200).undeclared(),
        ]),
        vec![
            (0, None),
            (100, Some("probe_after_refusal")),
            (200, Some("retry_before_retry_after"))
        ]
    );
}

#[test]
fn the_tag_says_whether_the_client_had_read_the_document_before() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let mut judge = |a: A| {
        tracker
            .observe(a.0.end, &a.0, &"op", &mut events)
            .expect("new")
    };
    let refused = judge(at(1, 0).fails(Outcome::NotSupported));
    let read = judge(at(0, 100).read());
    let informed = judge(at(1, 200).fails(Outcome::NotSupported));
    assert_eq!(
        (
            refused.discovery_read,
            read.discovery_read,
            informed.discovery_read
        ),
        (false, false, true)
    );
    assert_eq!(informed.kind, Kind::ProtocolNotSupported);
}

#[test]
fn retry_after_ambiguous() {
    let c = run(&[
        discovery(),
        at(1, 100).fails(Outcome::Other),
        at(1, 200).fails(Outcome::Other),
        at(1, 300).fails(Outcome::Other),
        at(2, 400),
    ]);
    assert_eq!(c.violations, v("retry_after_ambiguous", 2));
}

#[test]
fn an_attempts_number_counts_its_row_of_failures_and_starts_again_after_a_success() {
    // `refusal_gate.attempt` (DESIGN §6): 1 for a first attempt, n for the n-th in a row of
    // failures on its key; the success that ends a row is the row's last, the next one a 1.
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let outcomes = [
        Outcome::Transient,
        Outcome::Transient,
        Outcome::Ok,
        Outcome::Transient,
    ];
    let numbers: Vec<u32> = outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let a = at(1, i as u64 * 1000).fails(*o);
            let judged = tracker.observe(a.0.end, &a.0, &"op", &mut events);
            judged.expect("a new attempt").attempt
        })
        .collect();
    assert_eq!(numbers, [1, 2, 3, 1]);
}

#[test]
fn retry_budget_is_max_retries_and_resets_after_a_success() {
    let five: Vec<A> = (0..5)
        .map(|i| at(1, i * 1000).fails(Outcome::Transient))
        .collect();
    assert_eq!(run(&five).violations, v("retry_budget_exhausted", 1));
    let four: Vec<A> = (0..4)
        .map(|i| at(1, i * 1000).fails(Outcome::Throttled))
        .collect();
    assert!(run(&four).violations.is_empty());
    let mixed: Vec<A> = [
        Outcome::Transient,
        Outcome::Throttled,
        Outcome::Transient,
        Outcome::Transient,
        Outcome::Throttled,
    ]
    .iter()
    .enumerate()
    .map(|(i, o)| at(1, i as u64 * 1000).fails(*o))
    .collect();
    assert_eq!(run(&mixed).violations, v("retry_budget_exhausted", 1));
    let reset: Vec<A> = [503, 429, 503, 200, 503, 503, 503]
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let o = match s {
                200 => Outcome::Ok,
                429 => Outcome::Throttled,
                _ => Outcome::Transient,
            };
            at(1, i as u64 * 1000).fails(o)
        })
        .collect();
    assert!(run(&reset).violations.is_empty());
}

#[test]
fn a_bigger_budget_allows_more_retries() {
    let cfg = TrackerConfig {
        max_retries: 5,
        ..config()
    };
    let six: Vec<A> = (0..6)
        .map(|i| at(1, i * 1000).fails(Outcome::Transient))
        .collect();
    assert!(run_with(cfg.clone(), &six).violations.is_empty());
    let seven: Vec<A> = (0..7)
        .map(|i| at(1, i * 1000).fails(Outcome::Transient))
        .collect();
    assert_eq!(
        run_with(cfg, &seven).violations,
        v("retry_budget_exhausted", 1)
    );
}

#[test]
fn probing_after_refusal_and_its_window_edges() {
    let c = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotFound).undeclared(),
        at(2, 200).fails(Outcome::NotFound).undeclared(),
        at(3, 300).fails(Outcome::NotSupported), // a declared path: not a probe
        at(4, 400).fails(Outcome::NotFound).undeclared(),
    ]);
    assert_eq!(c.violations, v("probe_after_refusal", 2));
    assert_eq!(c.kinds["interface_not_declared"], 3);

    // The refusal ends at 120 ms; the window is 10 s: 10_120 ms is in, 10_121 ms is out.
    let edge = |start: u64| {
        run(&[
            discovery(),
            at(1, 100).fails(Outcome::NotFound).undeclared(),
            at(2, start).fails(Outcome::NotFound).undeclared(),
        ])
        .violations
    };
    assert_eq!(edge(100 + 20 + WINDOW_MS), v("probe_after_refusal", 1));
    assert!(edge(100 + 20 + WINDOW_MS + 1).is_empty());
    // A request that starts before the refusal ended is not a probe after it.
    assert!(edge(110).is_empty());
    // A declared path is never a probe, whatever it answered.
    let declared = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotFound).undeclared(),
        at(2, 200).fails(Outcome::NotFound),
    ]);
    assert!(declared.violations.is_empty());
}

#[test]
fn unverified_refusals_start_probe_windows_too() {
    let c = run(&[
        at(1, 0).fails(Outcome::NotFound).undeclared(),
        at(2, 100).fails(Outcome::NotFound).undeclared(),
    ]);
    assert_eq!(c.violations, v("probe_after_refusal", 1));
    assert_eq!(c.kinds["unverified_refusal"], 2);
}

#[test]
fn priority_retry_after_refusal_beats_probe() {
    // The second attempt is both a retry of a refusal and a request for an undeclared
    // path within the window: only the first violation that holds counts.
    assert_eq!(
        violations(&[
            discovery(),
            at(1, 100).fails(Outcome::NotFound).undeclared(),
            at(1, 200).fails(Outcome::NotFound).undeclared(),
        ]),
        vec![(0, None), (100, None), (200, Some("retry_after_refusal"))]
    );
}

#[test]
fn priority_retry_without_discovery_beats_probe() {
    assert_eq!(
        violations(&[
            at(1, 0).fails(Outcome::NotFound).undeclared(),
            at(1, 100).fails(Outcome::NotFound).undeclared(),
        ]),
        vec![(0, None), (100, Some("retry_without_discovery"))]
    );
}

#[test]
fn priority_budget_beats_probe() {
    // The 5th attempt on key 1 is past the budget *and* a request for an undeclared path
    // soon after a refusal on key 2: only the budget counts.
    let mut attempts: Vec<A> = vec![discovery()];
    attempts.extend((0..4).map(|i| at(1, 100 + i * 1000).fails(Outcome::Transient).undeclared()));
    attempts.push(at(2, 3500).fails(Outcome::NotFound).undeclared());
    attempts.push(at(1, 4100).fails(Outcome::Transient).undeclared());
    assert_eq!(
        violations(&attempts).last(),
        Some(&(4100, Some("retry_budget_exhausted")))
    );
    assert_eq!(run(&attempts).violations, v("retry_budget_exhausted", 1));
}

#[test]
fn priority_retry_after_ambiguous_beats_probe() {
    let attempts = [
        discovery(),
        at(2, 100).fails(Outcome::NotFound).undeclared(),
        at(1, 200).fails(Outcome::Other).undeclared(),
        at(1, 300).fails(Outcome::Other).undeclared(),
    ];
    // 200 is a probe (after the refusal at 100); 300 is a retry after ambiguous first.
    assert_eq!(
        violations(&attempts),
        vec![
            (0, None),
            (100, None),
            (200, Some("probe_after_refusal")),
            (300, Some("retry_after_ambiguous"))
        ]
    );
}

#[test]
fn the_budget_counts_throttled_and_transient_and_a_refusal_ends_it() {
    let mut attempts: Vec<A> = vec![discovery()];
    attempts.extend((0..4).map(|i| at(1, 100 + i * 1000).fails(Outcome::Transient)));
    attempts.push(at(1, 4100).fails(Outcome::NotSupported));
    attempts.push(at(1, 5100).fails(Outcome::NotSupported));
    let c = run(&attempts);
    // The refusal is the 5th failure in a row: past the budget. Its retry is a retry
    // after refusal (the refusal is not a transient failure, so the budget rule is moot).
    assert_eq!(c.violations["retry_budget_exhausted"], 1);
    assert_eq!(c.violations["retry_after_refusal"], 1);
}

#[test]
fn predecessor_is_the_latest_attempt_that_ended_before_the_start() {
    // 0..500 ambiguous, 100..600 ambiguous (concurrent: not a retry of the first),
    // 700 retry of the latest ended (the one that started at 100).
    assert_eq!(
        violations(&[
            at(1, 0).fails(Outcome::Other).lasting(500),
            at(1, 100).fails(Outcome::Other).lasting(500),
            at(1, 700),
        ]),
        vec![(0, None), (100, None), (700, Some("retry_after_ambiguous"))]
    );
    // An attempt that starts before its predecessor ended is not its retry.
    let c = run(&[
        at(1, 0).fails(Outcome::Other).lasting(500),
        at(1, 100).fails(Outcome::Other).lasting(500),
    ]);
    assert!(c.violations.is_empty());
}

#[test]
fn late_discovery_read_rejudges_pending_attempts() {
    // The read arrives last, but it happened first: the refusals are verified and the
    // retries are retries after refusal, not without discovery.
    let c = run(&[
        at(1, 100).fails(Outcome::NotSupported),
        at(1, 200).fails(Outcome::NotSupported),
        at(1, 300).fails(Outcome::NotSupported),
        discovery(),
    ]);
    assert_eq!(c.violations, v("retry_after_refusal", 2));
    assert_eq!(c.kinds["protocol_not_supported"], 3);
}

#[test]
fn settled_verdicts_do_not_change() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let refusal = at(1, 100).fails(Outcome::NotSupported).0;
    tracker.observe(refusal.end, &refusal, &"op", &mut events);
    tracker.settle(refusal.end, true, &mut events);
    let read = discovery().0;
    tracker.observe(read.end, &read, &"op", &mut events);
    tracker.finish(&mut events);
    let c = tally(&events);
    assert_eq!(c.kinds["unverified_refusal"], 1);
    assert_eq!(c.counted, 2);
}

#[test]
fn settling_waits_for_the_reorder_window() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let a = at(1, 100).fails(Outcome::Other).0;
    tracker.observe(T0, &a, &"op", &mut events);
    tracker.sweep(T0 + 4_999 * MS, &mut events);
    assert_eq!(tally(&events).counted, 0);
    assert!(tracker.has_pending());
    tracker.sweep(T0 + 5_000 * MS, &mut events);
    assert_eq!(tally(&events).counted, 1);
    assert!(!tracker.has_pending());
}

#[test]
fn an_attempt_arriving_once_its_group_is_due_settles_the_pending_ones_first() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let a = at(1, 100).fails(Outcome::Other).0;
    tracker.observe(T0, &a, &"op", &mut events);
    let b = at(2, 4_900).fails(Outcome::Other).0;
    tracker.observe(T0 + 4_999 * MS, &b, &"op", &mut events);
    assert_eq!(tally(&events).counted, 0, "not due yet");
    let c = at(1, 5_000).fails(Outcome::Other).0;
    tracker.observe(T0 + 5_000 * MS, &c, &"op", &mut events);
    assert_eq!(
        tally(&events).counted,
        2,
        "due: a and b settle, no sweep needed"
    );
    assert!(tracker.has_pending(), "c waits a window of its own");
    tracker.sweep(T0 + 9_999 * MS, &mut events);
    assert_eq!(tally(&events).counted, 2);
    tracker.sweep(T0 + 10_000 * MS, &mut events);
    assert_eq!(tally(&events).counted, 3);
}

/// The attempts counted early in `events`.
fn settled_early(events: &[Event]) -> u32 {
    events
        .iter()
        .map(|e| match e {
            Event::SettledEarly { attempts } => *attempts,
            _ => 0,
        })
        .sum()
}

#[test]
fn past_max_pending_the_windows_opened_first_settle_early_and_the_window_shortens() {
    let bounded = |max_pending| {
        let cfg = TrackerConfig {
            max_pending,
            ..config()
        };
        Tracker::with_shards(&cfg, 1)
    };
    // Eight clients' groups, their windows opened half a second apart.
    let of = |client: u64, start_ms: u64| {
        let mut a = at(1, start_ms).fails(Outcome::Other).0;
        a.group.client = client;
        a
    };
    let opened = |max_pending| {
        let tracker = bounded(max_pending);
        let mut events = Vec::new();
        for i in 0..8 {
            tracker.observe(T0 + i * 500 * MS, &of(i, i * 500), &"op", &mut events);
        }
        (tracker, events)
    };
    // 8 pending, 4 allowed.
    let (tracker, mut events) = opened(4);
    tracker.sweep(T0 + 4_000 * MS, &mut events);
    // Twice the share held: the window is cut to 2.5 s, the age of the fifth youngest. None
    // settles in the sweep itself, holding up the shard.
    assert_eq!(tally(&events).counted, 0);
    // An attempt arriving in a group the shorter window has made due settles it first.
    tracker.observe(T0 + 4_000 * MS, &of(0, 4_000), &"op", &mut events);
    assert_eq!(tally(&events).counted, 1);
    assert_eq!(settled_early(&events), 1);
    // The next sweep settles the others opened 2.5 s ago or more (by 1.5 s), and the five
    // left — the four youngest and the one just reopened — cut the window to 2,031.25 ms.
    tracker.sweep(T0 + 4_100 * MS, &mut events);
    assert_eq!(tally(&events).counted, 4);
    assert_eq!(settled_early(&events), 4);
    tracker.observe(T0 + 4_531 * MS, &of(5, 4_500), &"op", &mut events);
    assert_eq!(
        tally(&events).counted,
        4,
        "opened at 2.5 s: not due before 4,531.25 ms"
    );
    tracker.observe(T0 + 4_532 * MS, &of(5, 4_510), &"op", &mut events);
    assert_eq!(tally(&events).counted, 6);
    assert_eq!(settled_early(&events), 6);
    // Once the windows hold less than the share, the window lengthens back to the whole.
    tracker.settle(T0 + 4_600 * MS, true, &mut events);
    tracker.sweep(T0 + 4_600 * MS, &mut events);
    let late = of(9, 4_600);
    tracker.observe(T0 + 4_600 * MS, &late, &"op", &mut events);
    tracker.sweep(T0 + 9_599 * MS, &mut events);
    assert!(tracker.has_pending(), "a whole window again");
    tracker.sweep(T0 + 9_600 * MS, &mut events);
    assert!(!tracker.has_pending());
    assert_eq!(
        settled_early(&events),
        6,
        "forced and due settles are not early"
    );

    // No bound: every window whole, however many are held.
    let (tracker, mut events) = opened(0);
    tracker.sweep(T0 + 4_999 * MS, &mut events);
    assert_eq!(tally(&events).counted, 0);
    assert_eq!(settled_early(&events), 0);
}

#[test]
fn past_the_share_the_window_is_cut_where_the_youngest_fit_and_within_it_grows_back() {
    let whole = 3_200 * MS; // ages in 32nds: 100 ms each
    let held = |windows: &[(u64, u32)]| {
        let mut held = Held::default();
        for &(age_ms, count) in windows {
            held.add(age_ms * MS, count, whole);
        }
        held
    };
    let four = held(&[
        (50, 1),
        (150, 1),
        (250, 1),
        (350, 2),
        (3_000, 1),
        (9_000, 1),
    ]);
    assert_eq!(window_for(whole, &four, 0, whole), whole, "no bound");
    assert_eq!(
        window_for(1_000 * MS, &held(&[]), 4, whole),
        whole,
        "nothing held"
    );
    // Youngest first: 1, 2, 3, then the two opened 350 ms ago would make 5 of 4.
    assert_eq!(window_for(whole, &four, 4, whole), 300 * MS);
    // The last 32nd holds any older: the one opened 9 s ago.
    assert_eq!(window_for(whole, &four, 6, whole), 3_100 * MS);
    assert_eq!(window_for(whole, &four, 2, whole), 200 * MS);
    assert_eq!(
        window_for(whole, &held(&[(0, 3)]), 2, whole),
        0,
        "all of it cut"
    );
    // Within the share: scaled by share / held, by a 32nd at most, up to the whole.
    assert_eq!(window_for(whole, &four, 7, whole), whole);
    assert_eq!(
        window_for(1_000 * MS, &held(&[(50, 6)]), 7, whole),
        1_100 * MS
    );
    assert_eq!(
        window_for(1_000 * MS, &held(&[(50, 100)]), 105, whole),
        1_050 * MS
    );
    assert_eq!(
        window_for(1_000 * MS, &held(&[(50, 6)]), 6, whole),
        1_000 * MS
    );
    assert_eq!(
        window_for(3_150 * MS, &held(&[(50, 1)]), 6, whole),
        whole,
        "never past it"
    );
    assert_eq!(
        window_for(0, &held(&[(0, 1)]), 2, whole),
        100 * MS,
        "from nothing"
    );
}

#[test]
fn a_tracker_settling_only_when_asked_holds_every_attempt_until_then() {
    let tracker = Tracker::new(&config()).settling_only_when_asked();
    let mut events = Vec::new();
    let a = at(1, 100).fails(Outcome::Other).0;
    tracker.observe(T0, &a, &"op", &mut events);
    let b = at(1, 60_000).fails(Outcome::Other).0;
    tracker.observe(T0 + 60_000 * MS, &b, &"op", &mut events);
    assert_eq!(
        tally(&events).counted,
        0,
        "a replay's order must not matter"
    );
    tracker.finish(&mut events);
    assert_eq!(tally(&events).counted, 2);
}

#[test]
fn the_same_span_sent_twice_counts_once() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let a = at(1, 100).fails(Outcome::Other).0;
    assert!(tracker.observe(a.end, &a, &"op", &mut events).is_some());
    assert!(tracker.observe(a.end, &a, &"op", &mut events).is_none());
    tracker.finish(&mut events);
    assert_eq!(tally(&events).counted, 1);
}

#[test]
fn honored_refusals_are_counted_once_the_window_passes() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    for a in [discovery(), at(1, 100).fails(Outcome::NotSupported)] {
        tracker.observe(a.0.end, &a.0, &"op", &mut events);
    }
    let refusal_end = T0 + 120 * MS;
    tracker.sweep(refusal_end + WINDOW_MS * MS - 1, &mut events);
    assert_eq!(
        tally(&events).honored,
        0,
        "not before the window has passed"
    );
    tracker.sweep(refusal_end + WINDOW_MS * MS, &mut events);
    assert_eq!(tally(&events).honored, 1);
    tracker.sweep(refusal_end + 2 * WINDOW_MS * MS, &mut events);
    assert_eq!(tally(&events).honored, 1, "counted once");
}

#[test]
fn retried_and_unverified_refusals_are_not_honored() {
    let retried = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported),
        at(1, 5000).fails(Outcome::NotSupported),
    ]);
    // The first was retried within the window; the second was not.
    assert_eq!(retried.honored, 1);
    let unverified = run(&[at(1, 100).fails(Outcome::NotSupported)]);
    assert_eq!(unverified.honored, 0);
    let later = run(&[
        discovery(),
        at(1, 100).fails(Outcome::NotSupported),
        at(1, 100 + 20 + WINDOW_MS + 1),
    ]);
    assert_eq!(
        later.honored, 1,
        "a retry after the window does not undo honoring"
    );
}

#[test]
fn an_attempt_at_the_instant_a_refusal_of_no_length_ended_follows_it_after_it_left_the_history() {
    // Issue 29's shrunk case: the read at 50 ms starts the instant the refusal ends, so it
    // follows it (DESIGN §5), though ordered before it. Five attempts on one key of depth 4:
    // the read leaves the history when they settle, before the refusal is judged.
    let at_instant = |ms| at(1, ms).lasting(0);
    let mut refusal = at_instant(50).fails(Outcome::NotSupported).read();
    refusal.0.span_id = [0, 0, 0, 0, 0, 0, 0, 2];
    let mut first_read = at_instant(50).read();
    first_read.0.span_id = [0, 0, 0, 0, 0, 0, 0, 1];
    let later = |id: u8| {
        let mut a = at_instant(50 + 20 + WINDOW_MS).read();
        a.0.span_id = [0, 0, 0, 0, 0, 0, 0, id];
        a
    };
    let attempts = [later(0), first_read, refusal, later(3), later(4)];
    let cfg = TrackerConfig {
        max_retries: 2,
        ..config()
    };
    let counts = run_with(cfg.clone(), &attempts);
    assert_eq!(counts.kinds.get("protocol_not_supported"), Some(&1));
    assert_eq!(counts.honored, 0, "followed at the instant it ended");
    // The same refusal, after a read on another key, with nothing at its instant: honored.
    let elsewhere = at(2, 10).lasting(0).read();
    let alone = run_with(
        cfg,
        &[elsewhere, later(0), refusal, later(3), later(4), later(5)],
    );
    assert_eq!(alone.honored, 1);
}

#[test]
fn keys_expire_after_key_ttl() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let a = at(1, 0).0;
    tracker.observe(T0, &a, &"op", &mut events);
    assert_eq!(tracker.keys(), 1);
    tracker.sweep(T0 + 3_599 * 1000 * MS, &mut events);
    assert_eq!(tracker.keys(), 1);
    tracker.sweep(T0 + 3_600 * 1000 * MS, &mut events);
    assert_eq!(tracker.keys(), 0);
    assert!(events.contains(&Event::Evicted {
        reason: Eviction::Ttl,
        keys: 1
    }));
    assert_eq!(
        tally(&events).counted,
        1,
        "its pending verdict was counted first"
    );
}

#[test]
fn past_max_keys_the_least_recently_used_go() {
    let cfg = TrackerConfig {
        max_keys: 4,
        ..config()
    };
    let tracker = Tracker::new(&cfg);
    let mut events = Vec::new();
    for op in 0..4u64 {
        let a = at(op, op * 100).client(op).0;
        tracker.observe(T0 + op, &a, &"op", &mut events);
    }
    // Touch key 0 again so that key 1 is now the least recently used in its shard.
    let again = at(0, 1000).client(0).0;
    tracker.observe(T0 + 10, &again, &"op", &mut events);
    let new = at(9, 2000).client(9).0;
    tracker.observe(T0 + 11, &new, &"op", &mut events);
    assert_eq!(tracker.keys(), 4);
    let c = tally(&events);
    assert_eq!(c.evicted, 1);
}

// --- bookkeeping: how many keys each shard holds ----------------------------------------

/// One shard of `max_keys`, and a key of client `n` observed at `T0 + n` ms.
fn one_shard(max_keys: usize) -> Tracker {
    Tracker::with_shards(
        &TrackerConfig {
            max_keys,
            ..config()
        },
        1,
    )
}

fn key(tracker: &Tracker, n: u64, events: &mut Vec<Event>) {
    let a = at(1, n).client(n).0;
    tracker.observe(T0 + n * MS, &a, &"op", events);
}

fn capacity_evictions(events: &[Event]) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Evicted {
                reason: Eviction::Capacity,
                keys,
            } => Some(*keys),
            _ => None,
        })
        .collect()
}

#[test]
fn shards_split_max_keys_exactly() {
    for (max_keys, shards) in [
        (10, 4),
        (16, 16),
        (17, 16),
        (3, 16),
        (1_000, 16),
        (100_001, 16),
    ] {
        let tracker = Tracker::with_shards(
            &TrackerConfig {
                max_keys,
                ..config()
            },
            shards,
        );
        let caps: Vec<usize> = tracker
            .shards
            .iter()
            .map(|s| s.lock().expect("unpoisoned").cap)
            .collect();
        assert_eq!(
            caps.len(),
            max_keys.min(shards),
            "{max_keys} keys, {shards} shards"
        );
        assert_eq!(caps.iter().sum::<usize>(), max_keys, "{caps:?}");
        let (least, most) = (caps.iter().min(), caps.iter().max());
        assert!(most.zip(least).is_some_and(|(m, l)| m - l <= 1), "{caps:?}");
        // The shards with one more come first.
        assert!(caps.windows(2).all(|w| w[0] >= w[1]), "{caps:?}");
    }
}

#[test]
fn a_full_shard_evicts_a_64th_of_its_share_oldest_first() {
    let tracker = one_shard(128);
    let mut events = Vec::new();
    for n in 0..128 {
        key(&tracker, n, &mut events);
    }
    assert!(capacity_evictions(&events).is_empty());
    key(&tracker, 128, &mut events);
    assert_eq!(capacity_evictions(&events), [2], "128 / 64 keys at once");
    assert_eq!(tracker.keys(), 127);
    let held = |n: u64| {
        tracker
            .peek(&at(1, n).client(n).0.group, 1, T0 + 200 * MS)
            .last
            .is_some()
    };
    assert!(
        !held(0) && !held(1) && held(2) && held(128),
        "the two oldest went"
    );
    // One more fills the shard again; the next evicts again, and no sooner.
    key(&tracker, 129, &mut events);
    assert_eq!(capacity_evictions(&events).len(), 1);
    key(&tracker, 130, &mut events);
    assert_eq!(capacity_evictions(&events), [2, 2]);
    assert_eq!(tracker.keys(), 127);
    // A shard smaller than 64 still evicts one key at a time.
    let small = one_shard(3);
    let mut events = Vec::new();
    for n in 0..5 {
        key(&small, n, &mut events);
    }
    assert_eq!(capacity_evictions(&events), [1, 1]);
    assert_eq!(small.keys(), 3);
}

#[test]
fn one_clients_keys_past_max_keys_go_oldest_first_as_many_clients_keys_do() {
    // One group holding every key of the shard: the batch evicted, the two oldest, is found
    // by its keys.
    let tracker = one_shard(128);
    let mut events = Vec::new();
    for op in 0..128 {
        let a = at(op, op).0;
        tracker.observe(T0 + op * MS, &a, &"op", &mut events);
    }
    events.clear();
    let a = at(128, 128).0;
    tracker.observe(T0 + 128 * MS, &a, &"op", &mut events);
    assert_eq!(capacity_evictions(&events), [2], "128 / 64 keys at once");
    assert_eq!(tracker.keys(), 127);
    let held = |op: u64| {
        let group = at(op, 0).0.group;
        tracker.peek(&group, op, T0 + 200 * MS).last.is_some()
    };
    assert!(
        !held(0) && !held(1) && held(2) && held(127) && held(128),
        "the client's two oldest keys went"
    );
    let removed = tally(&events);
    assert_eq!(removed.evicted, 2, "{events:?}");
    // Holding the room another shard lent it (two shards of 64), the client's shard evicts
    // 1/64 of what it holds, not of its share: a batch per 64th of its keys scanned.
    let lent = Tracker::with_shards(
        &TrackerConfig {
            max_keys: 128,
            ..config()
        },
        2,
    );
    let mut events = Vec::new();
    for op in 0..129 {
        let a = at(op, op).0;
        lent.observe(T0 + op * MS, &a, &"op", &mut events);
    }
    assert_eq!(capacity_evictions(&events), [2], "128 / 64 keys at once");
    assert_eq!(lent.keys(), 127);
}

#[test]
fn keys_swept_for_their_ttl_give_their_place_back() {
    let tracker = one_shard(16);
    let mut events = Vec::new();
    for n in 0..16 {
        key(&tracker, n, &mut events);
    }
    // A sweep that expires nothing says nothing.
    tracker.sweep(T0 + 60 * 1000 * MS, &mut events);
    assert!(!events.iter().any(|e| matches!(e, Event::Evicted { .. })));
    tracker.sweep(T0 + 3_601 * 1000 * MS, &mut events);
    assert_eq!(tracker.keys(), 0);
    // A long-running server's shard is empty again: 16 new keys evict nothing live.
    for n in 100..116 {
        let a = at(1, n).client(n).0;
        tracker.observe(T0 + 3_602 * 1000 * MS, &a, &"op", &mut events);
    }
    assert!(capacity_evictions(&events).is_empty(), "{events:?}");
    assert_eq!(tracker.keys(), 16);
}

#[test]
fn the_keys_of_one_group_expire_each_at_its_own_time_whatever_order_they_came_in() {
    let tracker = one_shard(16);
    let mut events = Vec::new();
    let ttl = 3_600 * 1000 * MS;
    // Replayed: the clock of the second key's attempt is before the first's.
    tracker.observe(T0 + 100 * 1000 * MS, &at(1, 0).0, &"a", &mut events);
    tracker.observe(T0 + 10 * 1000 * MS, &at(2, 0).0, &"b", &mut events);
    tracker.observe(T0 + 50 * 1000 * MS, &at(3, 0).0, &"c", &mut events);
    assert_eq!(tracker.keys(), 3);
    tracker.sweep(T0 + 10 * 1000 * MS + ttl - 1, &mut events);
    assert_eq!(tracker.keys(), 3, "none idle for key_ttl yet");
    tracker.sweep(T0 + 10 * 1000 * MS + ttl, &mut events);
    assert_eq!(
        tracker.keys(),
        2,
        "the key last seen earliest, though it came second"
    );
    tracker.sweep(T0 + 50 * 1000 * MS + ttl, &mut events);
    assert_eq!(
        tracker.keys(),
        1,
        "then the next: the group's oldest was looked up again"
    );
    tracker.sweep(T0 + 100 * 1000 * MS + ttl, &mut events);
    assert_eq!(tracker.keys(), 0);
}

#[test]
fn imported_keys_are_counted_in_their_shard_and_within_its_room() {
    let source = one_shard(64);
    let mut events = Vec::new();
    for n in 0..10 {
        key(&source, n, &mut events);
    }
    source.finish(&mut events);
    let state = source.export();
    // Read back into a tracker of 12: the 10 keys, then room for 2 more without eviction.
    let restored = one_shard(12);
    assert_eq!(restored.import(state.clone(), |l| l), 10);
    assert_eq!(restored.keys(), 10);
    // A group already held is not taken again (nor counted twice).
    assert_eq!(restored.import(state.clone(), |l| l), 0);
    assert_eq!(restored.keys(), 10);
    let mut events = Vec::new();
    for n in 100..102 {
        key(&restored, n, &mut events);
    }
    assert!(capacity_evictions(&events).is_empty());
    key(&restored, 102, &mut events);
    assert_eq!(capacity_evictions(&events).len(), 1, "full at 12");
    // Into a tracker of 4: only what fits is taken.
    let small = one_shard(4);
    assert_eq!(small.import(state, |l| l), 4);
    assert_eq!(small.keys(), 4);
}

#[test]
fn a_pass_over_the_tracker_hands_over_each_shards_events_apart() {
    let tracker = Tracker::with_shards(&config(), 4);
    let mut events = Vec::new();
    // Eight clients, two to a shard, each with a pending attempt.
    for n in 0..8 {
        key(&tracker, n, &mut events);
    }
    let mut batches = Vec::new();
    tracker.settle(
        T0,
        true,
        &mut EachShard(|e: &[Event]| batches.push(e.len())),
    );
    assert_eq!(batches, [2, 2, 2, 2], "one batch a shard, none held back");
    let mut all = Vec::new();
    for n in 8..16 {
        key(&tracker, n, &mut all);
    }
    tracker.finish(&mut all);
    assert_eq!(
        all.iter()
            .filter(|e| matches!(e, Event::Counted { .. }))
            .count(),
        8,
        "a Vec collects them all"
    );
}

#[test]
fn keys_of_one_operation_share_its_name_and_a_removed_keys_name_goes() {
    let tracker = one_shard(1000);
    let mut events = Vec::new();
    for n in 0..100 {
        key(&tracker, n, &mut events);
    }
    let names = |t: &Tracker| t.shards[0].lock().expect("unpoisoned").names.len();
    assert_eq!(names(&tracker), 1, "100 keys of operation \"op\"");
    for n in 0..100 {
        let a = at(1, n).client(n).0;
        tracker.observe(T0 + n * MS, &a, &format!("op {n}"), &mut events);
    }
    assert_eq!(
        names(&tracker),
        1,
        "a key keeps the name it was opened with"
    );
    for n in 1000..1100 {
        let a = at(1, n).client(n).0;
        tracker.observe(T0 + n * MS, &a, &format!("op {n}"), &mut events);
    }
    assert_eq!(names(&tracker), 101);
    tracker.sweep(T0 + 3_700 * 1000 * MS, &mut events);
    assert_eq!(tracker.keys(), 0);
    assert_eq!(names(&tracker), 0, "every key gone, every name with it");
}

// --- properties -------------------------------------------------------------------------

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Ok),
        2 => Just(Outcome::NotSupported),
        2 => Just(Outcome::NotFound),
        1 => Just(Outcome::Throttled),
        2 => Just(Outcome::Transient),
        2 => Just(Outcome::Other),
    ]
}

/// An attempt of client `client`: op 0 is a discovery path, op 3 is declared.
fn attempt(client: u64) -> impl Strategy<Value = Observation> {
    (0..4u64, 0..60u64, 1..40u64, outcome()).prop_map(move |(op, slot, dur, outcome)| {
        let mut a = at(op, slot * 10)
            .client(client)
            .lasting(dur)
            .fails(outcome)
            .0;
        a.discovery = asked(op == 0, outcome);
        a.declared = if op == 3 { Declared::Yes } else { Declared::No };
        a
    })
}

/// A stream of attempts from three clients, each with unique span ids.
fn stream() -> impl Strategy<Value = Vec<Observation>> {
    (
        prop::collection::vec(attempt(1), 0..16),
        prop::collection::vec(attempt(2), 0..16),
        prop::collection::vec(attempt(3), 0..16),
    )
        .prop_map(numbered)
}

/// Three clients' attempts in one stream, each given its own span id.
fn numbered((a, b, c): (Vec<Observation>, Vec<Observation>, Vec<Observation>)) -> Vec<Observation> {
    let mut all: Vec<Observation> = a.into_iter().chain(b).chain(c).collect();
    for (i, o) in all.iter_mut().enumerate() {
        o.span_id = (i as u64).to_be_bytes();
    }
    all
}

/// `items` in an order drawn from `seed`: a seeded Fisher-Yates shuffle, so that failures
/// shrink and reproduce.
fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut out = items.to_vec();
    let mut x = seed | 1;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    out
}

/// Feeds a stream in `order`, settling at each request boundary only when `settle_between`
/// is false (a request is just a run of consecutive observations), then finishes.
fn feed(stream: &[Observation], order: &[usize], splits: &[usize], cfg: &TrackerConfig) -> Counts {
    let tracker = Tracker::new(cfg);
    let mut events = Vec::new();
    let mut now = T0;
    let mut boundaries = splits.iter().copied().peekable();
    for (n, &i) in order.iter().enumerate() {
        if boundaries.peek() == Some(&n) {
            boundaries.next();
            now += MS; // a new request arrives a little later
        }
        tracker.observe(now, &stream[i], &"op", &mut events);
    }
    tracker.finish(&mut events);
    let mut c = tally(&events);
    c.evicted = 0;
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (a) Any arrival order and any split into requests gives the same counts.
    #[test]
    fn arrival_order_does_not_matter(
        stream in stream(),
        seed in any::<u64>(),
        splits in prop::collection::vec(0..48usize, 0..6),
    ) {
        let cfg = config();
        let in_order: Vec<usize> = (0..stream.len()).collect();
        let shuffled = shuffled(&in_order, seed);
        let mut splits = splits;
        splits.sort_unstable();
        let a = feed(&stream, &in_order, &[], &cfg);
        let b = feed(&stream, &shuffled, &splits, &cfg);
        prop_assert_eq!(a, b);
    }

    /// (b) Every attempt is counted exactly once, with one kind and at most one violation.
    #[test]
    fn every_attempt_counted_once(stream in stream()) {
        let tracker = Tracker::new(&config());
        let mut events = Vec::new();
        for o in &stream {
            tracker.observe(o.end, o, &"op", &mut events);
        }
        tracker.finish(&mut events);
        let mut seen = std::collections::HashSet::new();
        for e in &events {
            if let Event::Counted { span_id, kind, .. } = e {
                prop_assert!(seen.insert(*span_id), "counted twice");
                prop_assert!(Kind::ALL.contains(kind));
            }
        }
        prop_assert_eq!(seen.len(), stream.len());
    }

    /// (d) Observing in batches ([`Tracker::observe_all`]) is observing one at a time: the
    /// same verdicts and the same events, in the same order, across shards, with duplicates
    /// and keys that are new within a batch.
    #[test]
    fn batches_are_observed_as_one_at_a_time(
        stream in stream(),
        repeats in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        batch in 1..20usize,
    ) {
        let mut stream = stream;
        if !stream.is_empty() {
            for r in &repeats {
                let again = stream[r.index(stream.len())];
                stream.push(again);
            }
        }
        let cfg = TrackerConfig { max_keys: 6, ..config() };
        let (one, batched) = (Tracker::new(&cfg), Tracker::new(&cfg));
        let (mut one_events, mut batched_events) = (Vec::new(), Vec::new());
        let (mut one_verdicts, mut batched_verdicts) = (Vec::new(), Vec::new());
        for (n, chunk) in stream.chunks(batch).enumerate() {
            let now = T0 + n as u64 * MS;
            for o in chunk {
                one_verdicts.push(one.observe(now, o, &"op", &mut one_events));
            }
            let first = batched_verdicts.len();
            batched_verdicts.resize(first + chunk.len(), None);
            batched.observe_all(now, chunk, |o| (o, &"op"), &mut batched_events, |i, v| {
                batched_verdicts[first + i] = v;
            });
        }
        prop_assert_eq!(one_verdicts, batched_verdicts);
        prop_assert_eq!(one_events, batched_events);
    }

    /// (c) The number of keys never exceeds max_keys, and nothing is lost to eviction.
    #[test]
    fn keys_never_exceed_max_keys(
        max_keys in 1..40usize,
        ops in prop::collection::vec((0..8u64, 0..8u64), 1..200),
    ) {
        let cfg = TrackerConfig { max_keys, ..config() };
        let tracker = Tracker::new(&cfg);
        let mut events = Vec::new();
        for (i, (client, op)) in ops.iter().enumerate() {
            let mut a = at(*op, i as u64 * 10).client(*client).0;
            a.span_id = (i as u64).to_be_bytes();
            tracker.observe(T0 + i as u64, &a, &"op", &mut events);
            prop_assert!(tracker.keys() <= max_keys, "{} keys > {}", tracker.keys(), max_keys);
        }
        tracker.finish(&mut events);
        prop_assert_eq!(tally(&events).counted as usize, ops.len());
    }
}

#[test]
fn a_read_that_ended_exactly_when_the_attempt_started_counts() {
    // "Before A" means ended no later than A started: the edge is inclusive.
    let c = run(&[discovery(), at(1, 20).fails(Outcome::NotSupported)]);
    assert_eq!(c.kinds["protocol_not_supported"], 1);
    let c = run(&[discovery(), at(1, 19).fails(Outcome::NotSupported)]);
    assert_eq!(c.kinds["unverified_refusal"], 1);
}

#[test]
fn a_flooded_key_stays_bounded_and_loses_nothing() {
    // 2,000 attempts on one key within one reorder window: the oldest settle early, in
    // batches, so the key holds at most depth + 32 attempts, and each is counted once.
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    for n in 0..2000u64 {
        let a = at(1, n).lasting(0).fails(Outcome::Transient).0;
        tracker.observe(T0, &a, &"op", &mut events);
    }
    let early = tally(&events).counted;
    assert!(early >= 2000 - 32 - 5, "settled early: {early}");
    tracker.finish(&mut events);
    assert_eq!(tally(&events).counted, 2000);
}

// --- the contract, read on its own ------------------------------------------------------

/// DESIGN §4–§5 read straight from the text, over the whole set of attempts at once: no
/// history bounds, no arrival order, no fast path, nothing shared with the tracker but the
/// decision table of §4. Per span id: (kind, violation, read); and refusals honored per client.
type Verdicts = (
    BTreeMap<[u8; 8], (Kind, Option<Violation>, bool)>,
    BTreeMap<u32, u32>,
);

fn contract(all: &[Observation], max_retries: u32, window: Nanos) -> Verdicts {
    let order = |o: &Observation| (o.start, o.end, o.span_id);
    let same_key = |a: &Observation, b: &Observation| {
        a.group == b.group && a.operation == b.operation && a.span_id != b.span_id
    };
    // B is before A: it ended no later than A started (of two attempts of no length at the
    // same instant, each of which ended when the other started, the one earlier in order).
    let before = |b: &Observation, a: &Observation| {
        same_key(a, b) && b.end <= a.start && order(b) < order(a)
    };
    let read_before = |a: &Observation| {
        all.iter()
            .any(|r| r.group == a.group && r.discovery == Discovery::Read && r.end <= a.start)
    };
    let declared = |a: &Observation| match a.declared {
        Declared::No => Declared::No,
        _ => Declared::Unknown,
    };
    let kind = |a: &Observation| classify::classify(a.outcome, declared(a), read_before(a)).kind;
    let earlier = |a: &Observation| {
        let mut e: Vec<&Observation> = all.iter().filter(|b| before(b, a)).collect();
        e.sort_by_key(|b| std::cmp::Reverse(order(b)));
        e
    };
    let mut out = BTreeMap::new();
    for a in all {
        let earlier = earlier(a);
        let pred = earlier.first();
        let read = read_before(a);
        let budget = earlier.len() > max_retries as usize
            && earlier[..=max_retries as usize]
                .iter()
                .all(|b| kind(b).class().is_retryable_failure());
        let probe = a.declared == Declared::No
            && a.discovery == Discovery::None
            && all.iter().any(|r| {
                r.group == a.group
                    && r.span_id != a.span_id
                    && classify::is_refusal_signal(r.outcome, r.declared)
                    && r.end <= a.start
                    && a.start <= r.end + window
            });
        let violation = match pred {
            Some(b) if kind(b).class() == Class::Refusal => Some(Violation::RetryAfterRefusal),
            Some(b) if kind(b) == Kind::UnverifiedRefusal && !read => {
                Some(Violation::RetryWithoutDiscovery)
            }
            Some(b) if kind(b) == Kind::Ambiguous => Some(Violation::RetryAfterAmbiguous),
            Some(_) if budget => Some(Violation::RetryBudgetExhausted),
            Some(b)
                if kind(b).class().is_retryable_failure()
                    && b.retry_after.is_some_and(|d| a.start < b.end + d) =>
            {
                Some(Violation::RetryBeforeRetryAfter)
            }
            _ if probe => Some(Violation::ProbeAfterRefusal),
            _ => None,
        };
        out.insert(
            a.span_id,
            (kind(a), violation, a.discovery == Discovery::Read),
        );
    }
    let mut honored = BTreeMap::new();
    for r in all.iter().filter(|r| kind(r).class() == Class::Refusal) {
        let followed = all
            .iter()
            .any(|f| same_key(r, f) && f.start >= r.end && f.start <= r.end + window);
        if !followed {
            *honored.entry(r.labels).or_default() += 1;
        }
    }
    (out, honored)
}

/// What the tracker counted: the same shape as [`contract`]'s.
fn counted(events: &[Event]) -> Verdicts {
    let (mut verdicts, mut honored) = (BTreeMap::new(), BTreeMap::new());
    for e in events {
        match e {
            Event::Counted {
                kind,
                violation,
                discovery_read,
                span_id,
                ..
            } => {
                let again = verdicts.insert(*span_id, (*kind, *violation, *discovery_read));
                assert!(again.is_none(), "counted twice");
            }
            Event::Honored { labels } => *honored.entry(*labels).or_default() += 1,
            Event::Evicted { .. }
            | Event::Contradicted { .. }
            | Event::Unwitnessed { .. }
            | Event::SettledEarly { .. } => {}
        }
    }
    (verdicts, honored)
}

const RACE_WINDOW_MS: u64 = 150;

fn race_config() -> TrackerConfig {
    TrackerConfig {
        max_retries: 2,
        probe_window: Duration::from_millis(RACE_WINDOW_MS),
        ..config()
    }
}

/// An attempt with times on a coarse grid, so that starts and ends tie often: op 0 asks for
/// the discovery document, ops 1 and 2 are undeclared paths, op 3 is declared. Throttled and
/// transient failures often carry a server's delay (values the tracker keeps exactly).
fn racing_attempt(client: u64) -> impl Strategy<Value = Observation> {
    (
        0..4u64,
        0..40u64,
        prop_oneof![1 => Just(0u64), 6 => 1..6u64],
        outcome(),
        prop::option::of(prop_oneof![Just(10u64), Just(50), Just(120), Just(400)]),
    )
        .prop_map(move |(op, slot, dur, outcome, delay)| {
            let mut a = at(op, slot * 10)
                .client(client)
                .lasting(dur * 10)
                .fails(outcome)
                .0;
            a.discovery = asked(op == 0, outcome);
            a.declared = if op == 3 { Declared::Yes } else { Declared::No };
            a.retry_after = delay.map(|ms| ms * MS);
            a
        })
}

/// Streams of up to three clients whose attempts start and end together and overlap.
fn racing_stream() -> impl Strategy<Value = Vec<Observation>> {
    (
        prop::collection::vec(racing_attempt(1), 0..20),
        prop::collection::vec(racing_attempt(2), 0..12),
        prop::collection::vec(racing_attempt(3), 0..12),
    )
        .prop_map(numbered)
}

/// What the tracker counts of `stream` fed in start order, shuffled by `seed` one at a time
/// across requests of `batch`, and shuffled in batches ([`Tracker::observe_all`]), each named.
fn counted_in_any_order(
    stream: &[Observation],
    cfg: &TrackerConfig,
    seed: u64,
    batch: usize,
) -> [(&'static str, Verdicts); 3] {
    let mut in_order = stream.to_vec();
    in_order.sort_by_key(|o| (o.start, o.end));
    let shuffled = shuffled(stream, seed);
    [
        ("in order", &in_order, false),
        ("shuffled", &shuffled, false),
        ("shuffled in batches", &shuffled, true),
    ]
    .map(|(name, attempts, batched)| {
        let tracker = Tracker::new(cfg);
        let mut events = Vec::new();
        for (n, chunk) in attempts.chunks(batch).enumerate() {
            let now = T0 + n as u64 * MS;
            if batched {
                tracker.observe_all(now, chunk, |o| (o, &"op"), &mut events, |_, _| {});
            } else {
                for o in chunk {
                    tracker.observe(now, o, &"op", &mut events);
                }
            }
        }
        tracker.finish(&mut events);
        (name, counted(&events))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The contract's rule: arrival order and batching never change a verdict. The tracker
    /// fed in start order, shuffled one at a time across requests, and shuffled in batches
    /// ([`Tracker::observe_all`]) counts every attempt with exactly the kind and violation
    /// (all six, the server's delay among them), and the honored refusals, that the
    /// contract read on its own gives — with concurrent attempts, tied starts and ends, and
    /// attempts of no length.
    #[test]
    fn verdicts_follow_the_contract_in_any_arrival_order(
        stream in racing_stream(),
        seed in any::<u64>(),
        batch in 1..24usize,
    ) {
        let cfg = race_config();
        let want = contract(&stream, cfg.max_retries, RACE_WINDOW_MS * MS);
        for (name, got) in counted_in_any_order(&stream, &cfg, seed, batch) {
            prop_assert_eq!(&got, &want, "{}", name);
        }
    }
}

/// Racing attempts of lengths the tracker keeps rounded ([`super::entry::kept_end`]): any
/// number of nanoseconds up to 134 ms, and starts that fall on another attempt's end, as
/// given or as kept.
fn rounded_stream() -> impl Strategy<Value = Vec<Observation>> {
    (
        racing_stream(),
        prop::collection::vec((0..1u64 << 27, 0..3u8, 0..64usize), 44),
    )
        .prop_map(|(mut stream, extra)| {
            for (i, o) in stream.iter_mut().enumerate() {
                o.end = o.start + extra[i % extra.len()].0;
            }
            for i in 0..stream.len() {
                let (length, tie, other) = extra[i % extra.len()];
                let j = other % stream.len();
                let (start, end) = (stream[j].start, stream[j].end);
                stream[i].start = match tie {
                    0 => continue,
                    1 => end,
                    _ => super::entry::kept_end(start, end),
                };
                stream[i].end = stream[i].start + length;
            }
            stream
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An attempt's end is judged as the tracker keeps it, the same wherever it is compared:
    /// in any arrival order and batching the tracker counts what the contract reads of the
    /// attempts with their ends as kept.
    #[test]
    fn ends_are_judged_as_kept_in_any_arrival_order(
        stream in rounded_stream(),
        seed in any::<u64>(),
        batch in 1..24usize,
    ) {
        let cfg = race_config();
        let kept: Vec<Observation> = stream
            .iter()
            .map(|o| Observation { end: super::entry::kept_end(o.start, o.end), ..*o })
            .collect();
        let want = contract(&kept, cfg.max_retries, RACE_WINDOW_MS * MS);
        for (name, got) in counted_in_any_order(&stream, &cfg, seed, batch) {
            prop_assert_eq!(&got, &want, "{}", name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Taking back pending attempts (DESIGN §11: spans that became part of another attempt)
    /// leaves the tracker as if they had never come: every verdict and honored refusal is the
    /// contract's reading of the attempts that stay, whenever they are taken back.
    #[test]
    fn a_retracted_attempt_is_as_if_it_never_came(
        stream in racing_stream(),
        seed in any::<u64>(),
        taken in prop::collection::vec((any::<bool>(), 0..8usize), 44),
    ) {
        let cfg = race_config();
        let arrival = shuffled(&stream, seed);
        // Each attempt taken back is so some arrivals after its own.
        let mut due: Vec<(usize, &Observation)> = Vec::new();
        let tracker = Tracker::new(&cfg);
        let mut events = Vec::new();
        for (n, o) in arrival.iter().enumerate() {
            tracker.observe(T0, o, &"op", &mut events);
            let (take, after) = taken[n % taken.len()];
            if take {
                due.push((n + after, o));
            }
            for (_, o) in due.iter().filter(|(at, _)| *at == n) {
                prop_assert_eq!(tracker.retract(o), Retraction::Retracted);
            }
        }
        for (_, o) in due.iter().filter(|(at, _)| *at >= arrival.len()) {
            prop_assert_eq!(tracker.retract(o), Retraction::Retracted);
        }
        prop_assert_eq!(tracker.retract(&arrival.first().copied().map_or(at(9, 0).0, |mut o| {
            o.span_id = [9; 8];
            o
        })), Retraction::Missing);
        tracker.finish(&mut events);
        let gone: Vec<[u8; 8]> = due.iter().map(|(_, o)| o.span_id).collect();
        let kept: Vec<Observation> =
            stream.iter().filter(|o| !gone.contains(&o.span_id)).copied().collect();
        let want = contract(&kept, cfg.max_retries, RACE_WINDOW_MS * MS);
        prop_assert_eq!(counted(&events), want);
    }
}

#[test]
fn a_settled_attempt_is_not_taken_back_and_an_emptied_key_leaves() {
    let tracker = Tracker::new(&config());
    let mut events = Vec::new();
    let (a, b) = (at(1, 0).0, at(2, 0).0);
    tracker.observe(T0, &a, &"op", &mut events);
    tracker.observe(T0, &b, &"op", &mut events);
    assert_eq!(tracker.keys(), 2);
    tracker.settle(T0, true, &mut events);
    assert_eq!(tracker.retract(&a), Retraction::Settled);
    let c = at(2, 100).0;
    tracker.observe(T0, &c, &"op", &mut events);
    assert_eq!(tracker.retract(&c), Retraction::Retracted);
    assert_eq!(tracker.keys(), 2, "key 2 keeps its settled attempt");
    let d = at(3, 0).0;
    tracker.observe(T0, &d, &"op", &mut events);
    assert_eq!(tracker.keys(), 3);
    assert_eq!(tracker.retract(&d), Retraction::Retracted);
    assert_eq!(tracker.keys(), 2, "an emptied key leaves");
    assert_eq!(tracker.retract(&d), Retraction::Missing);
    tracker.finish(&mut events);
    assert_eq!(tally(&events).counted, 2);
}

#[test]
fn the_contract_reading_sees_each_violation() {
    // The property above is only as good as the streams it draws: each violation, and an
    // honored refusal, must be reachable in them. One hand-made stream shows each.
    let cfg = race_config();
    let s = |a: A| a.0;
    let stream = [
        s(at(0, 0).read().lasting(5)),
        s(at(1, 10).fails(Outcome::NotFound).undeclared()),
        s(at(1, 40).fails(Outcome::NotFound).undeclared()),
        s(at(2, 60).fails(Outcome::Other).undeclared()),
        s(at(2, 90).undeclared()),
        s(at(3, 0).fails(Outcome::Throttled).retry_after_ms(400)),
        s(at(3, 30).fails(Outcome::Transient)),
        s(at(3, 60).fails(Outcome::Transient)),
        s(at(3, 90)),
        s(at(1, 400).fails(Outcome::NotFound).undeclared().client(2)),
        s(at(1, 430).fails(Outcome::NotFound).undeclared().client(2)),
    ];
    let (verdicts, honored) = contract(&stream, cfg.max_retries, RACE_WINDOW_MS * MS);
    let seen: std::collections::BTreeSet<&str> = verdicts
        .values()
        .filter_map(|(_, v, _)| v.map(Violation::as_str))
        .collect();
    assert_eq!(
        seen,
        Violation::ALL.iter().map(|v| v.as_str()).collect(),
        "{verdicts:?}"
    );
    assert_eq!(honored.values().sum::<u32>(), 1);
    let tracker = Tracker::new(&cfg);
    let mut events = Vec::new();
    for o in &stream {
        tracker.observe(o.end, o, &"op", &mut events);
    }
    tracker.finish(&mut events);
    assert_eq!(counted(&events), (verdicts, honored));
}

#[test]
fn max_keys_bounds_the_whole_and_a_shard_lends_what_it_does_not_use() {
    // 16 shards of 4 keys' share; clients 0, 16 and 32 all hash to shard 0.
    let tracker = Tracker::new(&TrackerConfig {
        max_keys: 64,
        ..config()
    });
    let mut events = Vec::new();
    let observe = |client: u64, op: u64, ms: u64, events: &mut Vec<Event>| {
        let a = at(op, ms).client(client).0;
        tracker.observe(T0 + ms * MS, &a, &"op", events);
    };
    for op in 0..20 {
        for client in [0, 16, 32] {
            observe(client, op, op * 10 + client, &mut events);
        }
    }
    assert_eq!(
        tracker.keys(),
        60,
        "one shard holds 60 keys of 64: none evicted"
    );
    assert!(capacity_evictions(&events).is_empty());
    // The whole reached, a client of a shard under its share takes room back from shard 0.
    for op in 0..4 {
        observe(1, op, 1_000 + op, &mut events);
    }
    assert_eq!(tracker.keys(), 64);
    for op in 0..2 {
        observe(2, op, 1_100 + op, &mut events);
    }
    assert_eq!(tracker.keys(), 64);
    assert_eq!(
        capacity_evictions(&events),
        [1, 1],
        "a 64th of shard 0's share, twice"
    );
    let shard = |i: usize| tracker.shards[i].lock().expect("unpoisoned").keys;
    assert_eq!((shard(0), shard(1), shard(2)), (58, 4, 2));
    // A shard holding its share makes room in itself.
    for op in 4..6 {
        observe(1, op, 2_000 + op, &mut events);
    }
    assert_eq!(tracker.keys(), 64);
    assert_eq!((shard(0), shard(1), shard(2)), (58, 4, 2));
}

#[test]
fn two_attempts_at_the_same_instant_are_judged_in_one_order_whatever_their_arrival() {
    // Both take no time and start at once: the earlier by span id goes first, however they
    // arrive (the second to arrive is not simply put after the last).
    let refused = |id: u64| {
        let mut a = at(1, 100).lasting(0).fails(Outcome::NotSupported);
        a.0.span_id = id.to_be_bytes();
        a
    };
    let want = vec![(0, None), (1, None), (2, Some("retry_after_refusal"))];
    assert_eq!(violations(&[discovery(), refused(1), refused(2)]), want);
    assert_eq!(violations(&[discovery(), refused(2), refused(1)]), want);
}

#[test]
fn a_shard_is_the_remainder_of_the_id_whatever_the_number_of_shards() {
    for n in [1usize, 2, 3, 16, 24] {
        for id in [0u64, 1, 7, 16, 17, 0x9e37_79b9_7f4a_7c15, u64::MAX] {
            assert_eq!(pick(id, n), (id % n as u64) as usize, "{id} among {n}");
        }
    }
}

#[test]
fn more_testimonies_than_a_flush_holds_are_all_noted() {
    // 100 operations refused to one client and then served to another, all in one batch: more
    // testimonies than a flush holds at once (`HEARD`), so they are noted in several turns.
    let testimony = |about: u64, refused: bool| honesty::Testimony {
        about,
        refused,
        served: !refused,
        drift: None,
        witness: 1 + u32::from(refused),
        configured: true,
    };
    let mut items: Vec<Observation> = Vec::new();
    for k in 0..100u64 {
        let mut refused = at(k + 1, k).fails(Outcome::NotSupported).0;
        refused.testimony = testimony(k + 1, true);
        items.push(refused);
    }
    for k in 0..100u64 {
        let mut served = at(k + 1, 200 + k).0;
        served.group.client = 2;
        served.testimony = testimony(k + 1, false);
        items.push(served);
    }
    assert!(items.len() > HEARD);
    let now = T0 + 400 * MS;
    let contradictions = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e, Event::Contradicted { .. }))
            .count()
    };
    let batched = Tracker::new(&config());
    let mut events = Vec::new();
    batched.observe_all(now, &items, |o| (o, &"op"), &mut events, |_, _| {});
    assert_eq!(contradictions(&events), 100, "one an operation");
    let single = Tracker::new(&config());
    let mut one_by_one = Vec::new();
    for o in &items {
        single.observe(now, o, &"op", &mut one_by_one);
    }
    assert_eq!(contradictions(&one_by_one), 100);
    for about in 1..=100 {
        assert!(batched.contradicted(1, about, now), "operation {about}");
    }
}
