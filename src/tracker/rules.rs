//! The violation rules of DESIGN §5 as pure functions of what a group holds: the verdict of
//! an attempt given its predecessor on the key, the group's discovery reads and refusals
//! ([`Lists`]) and the key's history — retries after a refusal, without discovery, after an
//! ambiguous answer, past the retry budget, before `Retry-After`, and probes after a refusal.
//!
//! Core: pure.

use super::entry::{Delay, Entry, Question, Tail, Verdict, ASKED, DECLARED_NO, FOLLOWED};
use super::{Nanos, Params, Violation};
use crate::classify::{self, Class, Kind};
use crate::discovery::Declared;

/// The refusals a group keeps: what probes are judged against.
pub(super) const REFUSALS_KEPT: usize = 32;

/// The reads and the successful MCP requests a group keeps: a retry after a header mismatch,
/// a gone session or a stream's refusal is judged by those just before it.
pub(super) const RECENT_KEPT: usize = 8;

/// The discovery reads and refusals of a group.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct Lists {
    /// The earliest discovery read's end: "had read before A" is `first_read <= A.start`,
    /// which is all the decision table and the violations ask of reads.
    pub(super) first_read: Option<Nanos>,
    /// The latest refusals' ends (verified or not), sorted: what probes are judged against.
    pub(super) refusals: Vec<Nanos>,
    /// Nobody owns the group's client name (DESIGN §12.6): no attempt is judged a violation.
    #[serde(default)]
    pub(super) anonymous: bool,
    /// The latest discovery reads' ends, sorted: a header mismatch or a gone session asks for
    /// a read after it (DESIGN §12.2).
    #[serde(default)]
    pub(super) reads: Vec<Nanos>,
    /// The latest successful MCP requests' ends, sorted: each shows a session (DESIGN §12.4).
    #[serde(default)]
    pub(super) sessions: Vec<Nanos>,
    /// The group has sent a GET or DELETE with no session known: only then can a successful
    /// MCP request that arrives late change a verdict.
    #[serde(default)]
    pub(super) streams: bool,
}

impl Lists {
    /// A group's lists before it has read, been refused or shown a session.
    pub(super) const EMPTY: Lists = Lists {
        first_read: None,
        refusals: Vec::new(),
        anonymous: false,
        reads: Vec::new(),
        sessions: Vec::new(),
        streams: false,
    };

    /// Notes an attempt that ended at `end`: a discovery read (`read`), a refusal (`refusal`),
    /// a successful MCP request (`in_session`), or none of them; the latest
    /// [`REFUSALS_KEPT`] refusals kept, and the latest [`RECENT_KEPT`] reads and sessions
    /// (a retry is judged by those just before it).
    ///
    /// Full, the refusals give up the one that answers no probe question the others do not
    /// answer when there is one ([`insert_bounded`] with `probe_window`), so that a burst of
    /// refusals judged late — calls waiting for their server's half — still shows its first.
    pub(super) fn note(
        &mut self,
        (read, refusal, in_session): (bool, bool, bool),
        end: Nanos,
        probe_window: Nanos,
    ) {
        if read {
            self.first_read = Some(self.first_read.map_or(end, |f| f.min(end)));
            insert_bounded(&mut self.reads, end, RECENT_KEPT, None);
        }
        if refusal {
            insert_bounded(&mut self.refusals, end, REFUSALS_KEPT, Some(probe_window));
        }
        if in_session {
            insert_bounded(&mut self.sessions, end, RECENT_KEPT, None);
        }
    }

    /// The verdict of `history[i]` given everything the group holds (DESIGN §4, §5).
    pub(super) fn judge(&self, history: &[Entry], i: usize, p: &Params) -> Verdict {
        let a = &history[i];
        // Attempts on the key before A: earlier in order, ended no later than A started.
        let pred = history[..i].iter().rev().find(|e| e.end() <= a.start);
        self.verdict(
            a,
            pred.map(|e| Predecessor {
                kind: e.kind(),
                attempt: e.attempt,
                start: e.start,
                end: e.end(),
                delay: e.delay,
                question: e.question,
            }),
            || budget_exhausted(history, i, p),
            p,
        )
    }

    /// The verdict of `a`, appended after a history whose tail [`Tail::precedes`] it: what
    /// [`Lists::judge`] gives it there, reading the history's last attempt only for what it
    /// asked (`last`), and only when that can matter: a failed predecessor and an attempt that
    /// says what it asks.
    pub(super) fn judge_after(
        &self,
        tail: &Tail,
        a: &Entry,
        last: impl FnOnce() -> Question,
        p: &Params,
    ) -> Verdict {
        let question = if tail.kind != Kind::Ok && a.question != Question::default() {
            last()
        } else {
            Question::default()
        };
        self.verdict(
            a,
            Some(Predecessor {
                kind: tail.kind,
                attempt: tail.attempt,
                start: tail.start,
                end: tail.end(),
                delay: tail.delay,
                question,
            }),
            || usize::from(tail.retryable_run) > p.max_retries as usize,
            p,
        )
    }

    /// The client had read the discovery document by `at`: a read ended no later.
    pub(super) fn read_before(&self, at: Nanos) -> bool {
        self.first_read.is_some_and(|r| r <= at)
    }

    /// A discovery read ended after `after` and no later than `by`.
    fn read_between(&self, after: Nanos, by: Nanos) -> bool {
        between(&self.reads, after, by)
    }

    /// A successful MCP request ended after `after` and no later than `by`: a session.
    fn session_between(&self, after: Nanos, by: Nanos) -> bool {
        between(&self.sessions, after, by)
    }

    /// The decision table of DESIGN §5 for `a`, given its predecessor on the key and
    /// whether the retry budget was spent before it.
    pub(super) fn verdict(
        &self,
        a: &Entry,
        pred: Option<Predecessor>,
        budget_spent: impl FnOnce() -> bool,
        p: &Params,
    ) -> Verdict {
        let read_before = self.read_before(a.start);
        let kind = classify::classify(a.outcome(), a.declared(), read_before).kind;
        if self.anonymous {
            return (kind, None, 1);
        }
        let Some(pred) = pred else {
            return (kind, self.probe(a, p), 1);
        };
        // A new question, not a retry (DESIGN §12.1, §12.4): another version after one that
        // was refused; a stream's GET or DELETE in a session opened since the last.
        if (pred.question.version_refused() && a.question.other_version(pred.question))
            || (a.question.sessionless() && self.session_between(pred.end, a.start))
        {
            return (kind, self.probe(a, p), 1);
        }
        let attempt = if pred.kind == Kind::Ok {
            1
        } else {
            pred.attempt.saturating_add(1)
        };
        let violation = if pred.kind.class() == Class::Refusal {
            Some(Violation::RetryAfterRefusal)
        } else if pred.kind == Kind::UnverifiedRefusal && !read_before {
            // A read that ended while the refused attempt was in flight counts too.
            Some(Violation::RetryWithoutDiscovery)
        } else if matches!(pred.kind, Kind::HeaderMismatch | Kind::SessionExpired)
            && !self.read_between(pred.start, a.start)
        {
            // Only a read after that answer started informs the retry (DESIGN §12.2).
            Some(Violation::RetryWithoutDiscovery)
        } else if pred.kind == Kind::Ambiguous && !a.question.other_arguments(pred.question) {
            // Other arguments after an ambiguous answer are a corrected call (§12.1).
            Some(Violation::RetryAfterAmbiguous)
        } else if budget_spent() {
            Some(Violation::RetryBudgetExhausted)
        } else if pred.kind.class().is_retryable_failure()
            && a.start < pred.end.saturating_add(pred.delay.nanos())
        {
            Some(Violation::RetryBeforeRetryAfter)
        } else {
            self.probe(a, p)
        };
        (kind, violation, attempt)
    }

    /// A asks for an undeclared path within `probe_window` after a refusal's end, and is
    /// not a request for the discovery document (what the boundary asks for after one).
    pub(super) fn probe(&self, a: &Entry, p: &Params) -> Option<Violation> {
        if !a.has(DECLARED_NO) || a.has(ASKED) {
            return None;
        }
        let after = a.start.saturating_sub(p.probe_window);
        let from = self.refusals.partition_point(|r| *r < after);
        // A refusal that took no time ends where it starts: it is not a probe after itself.
        let own = classify::is_refusal_signal(a.outcome(), Declared::No) && a.end() == a.start;
        let needed = 1 + usize::from(own);
        self.refusals
            .get(from + needed - 1)
            .filter(|r| **r <= a.start)
            .map(|_| Violation::ProbeAfterRefusal)
    }
}

/// What the verdict of an attempt needs of its predecessor on the key.
pub(super) struct Predecessor {
    kind: Kind,
    /// Its number in its row of failures.
    attempt: u8,
    start: Nanos,
    end: Nanos,
    /// The server's delay it carried.
    delay: Delay,
    /// What it asked (only when its verdict may turn on it).
    question: Question,
}

/// The latest `max_retries + 1` attempts before A all failed transient or throttled.
pub(super) fn budget_exhausted(history: &[Entry], i: usize, p: &Params) -> bool {
    let a = &history[i];
    let needed = p.max_retries as usize + 1;
    let mut seen = 0;
    for e in history[..i].iter().rev().filter(|e| e.end() <= a.start) {
        if !e.kind().class().is_retryable_failure() {
            return false;
        }
        seen += 1;
        if seen == needed {
            return true;
        }
    }
    false
}

/// Whether an attempt on the key follows the refusal `history[i]` within `probe_window`: one
/// that started no earlier than it ended and no later than the window's end (DESIGN §5). Of
/// the attempts ordered before it, only one that started the instant a refusal of no length
/// ended can; once such an attempt has left the history, the refusal's [`FOLLOWED`] flag says so.
pub(super) fn followed(history: &[Entry], i: usize, p: &Params) -> bool {
    let r = &history[i];
    r.has(FOLLOWED)
        || history
            .iter()
            .enumerate()
            .any(|(j, f)| j != i && follows(r, f, p))
}

/// Whether the attempt `f` started within the refusal `r`'s `probe_window` — no earlier than
/// `r` ended, no later than the window's end — and asks again what `r` was refused: after a
/// refused version, an attempt naming another is a new question (DESIGN §12.1).
pub(super) fn follows(r: &Entry, f: &Entry, p: &Params) -> bool {
    f.start >= r.end()
        && f.start <= r.end().saturating_add(p.probe_window)
        && !(r.question.version_refused() && f.question.other_version(r.question))
}

/// Whether a sorted list holds a value after `after` and no later than `by`.
fn between(v: &[Nanos], after: Nanos, by: Nanos) -> bool {
    let from = v.partition_point(|x| *x <= after);
    v.get(from).is_some_and(|x| *x <= by)
}

/// Inserts `value` into a sorted vector of at most `cap` values. Full, it drops the smallest —
/// or, with a `window`, the second smallest when the smallest three lie within it: a probe
/// question ("a refusal that ended within `window` before this start?") that the second
/// answers, the first or the third answers too, so the list keeps the first of a burst and
/// answers every question the latest `cap` would.
fn insert_bounded(v: &mut Vec<Nanos>, value: Nanos, cap: usize, window: Option<Nanos>) {
    let at = v.partition_point(|x| *x <= value);
    if v.len() == cap && cap > 0 {
        // Full, as a group's lists soon are: one value leaves as this one comes in, the
        // values between the two moving one place — not the whole list shifted up and back
        // (two `memmove`s an attempt: 1.3 % of the server's time, perf).
        let with = |i: usize| match i.cmp(&at) {
            std::cmp::Ordering::Less => v[i],
            std::cmp::Ordering::Equal => value,
            std::cmp::Ordering::Greater => v[i - 1],
        };
        let thin = window.is_some_and(|w| cap >= 3 && with(2).saturating_sub(with(0)) <= w);
        let drop = usize::from(thin);
        if at > drop {
            v.copy_within(drop + 1..at, drop);
            v[at - 1] = value;
        } else if at < drop {
            v[at] = value;
        }
        return;
    }
    v.insert(at, value);
    if v.len() > cap {
        v.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::insert_bounded;

    #[test]
    fn a_full_bounded_list_is_as_if_the_value_were_inserted_and_the_smallest_dropped() {
        for value in 0..12 {
            for cap in 1..6 {
                let full: Vec<u64> = (1..=cap as u64).map(|x| x * 2).collect();
                let mut plain = full.clone();
                let at = plain.partition_point(|x| *x <= value);
                plain.insert(at, value);
                plain.remove(0);
                let mut v = full.clone();
                insert_bounded(&mut v, value, cap, None);
                assert_eq!(v, plain, "{value} into {full:?}");
            }
        }
        let mut none = Vec::new();
        insert_bounded(&mut none, 3, 0, None);
        insert_bounded(&mut none, 3, 0, Some(10));
        assert!(none.is_empty(), "a list of no room keeps nothing");
    }

    #[test]
    fn a_bounded_list_keeps_the_largest_values_up_to_its_cap_sorted() {
        let mut v = Vec::new();
        for x in [5, 1, 4, 2, 3, 4] {
            insert_bounded(&mut v, x, 3, None);
        }
        assert_eq!(v, [4, 4, 5], "the latest refusals kept, as many as the cap");
    }

    /// Whether a sorted list holds a value within `window` before `start`: a probe's question.
    fn answers(v: &[u64], start: u64, window: u64) -> bool {
        v.iter()
            .any(|r| *r <= start && start.saturating_sub(window) <= *r)
    }

    // `cap > 0` read as `cap >= 0` is an equivalent mutant: with no room and nothing held,
    // either way the value is not kept.
    #[test]
    fn a_thinned_list_answers_every_probe_question_the_latest_would_and_keeps_a_bursts_first() {
        // Every order of inserting a few refusal ends, small caps and windows: whatever the
        // latest `cap` answer, the thinned list answers; and it answers nothing the whole
        // history would not.
        let ends = [3u64, 4, 5, 9, 10, 20, 21, 22, 40];
        for window in [0u64, 1, 2, 5, 15, 100] {
            for cap in 1..6 {
                for rotate in 0..ends.len() {
                    for reverse in [false, true] {
                        let mut order = ends.to_vec();
                        order.rotate_left(rotate);
                        if reverse {
                            order.reverse();
                        }
                        let (mut thin, mut latest, mut all) = (Vec::new(), Vec::new(), Vec::new());
                        for (n, e) in order.iter().enumerate() {
                            insert_bounded(&mut thin, *e, cap, Some(window));
                            insert_bounded(&mut latest, *e, cap, None);
                            insert_bounded(&mut all, *e, usize::MAX, None);
                            assert!(thin.len() <= cap && thin.is_sorted(), "{thin:?}");
                            for start in 0..50 {
                                let (t, l) = (
                                    answers(&thin, start, window),
                                    answers(&latest, start, window),
                                );
                                assert!(t || !l, "{order:?}[..={n}] cap {cap} window {window} start {start}: {thin:?} against {latest:?}");
                                assert!(!t || answers(&all, start, window), "{thin:?} invents one");
                            }
                        }
                    }
                }
            }
        }
        // Which one leaves: the second when the first three lie within the window, measured
        // as their distance; else the first.
        let full = |window: u64| {
            let mut v = vec![10, 14, 19];
            insert_bounded(&mut v, 30, 3, Some(window));
            v
        };
        assert_eq!(full(9), [10, 19, 30], "19 - 10 within 9: the second leaves");
        assert_eq!(full(8), [14, 19, 30], "19 - 10 past 8: the first leaves");
        assert_eq!(full(1), [14, 19, 30]);
        // Measured on the list with the newcomer in it, wherever it goes.
        let mut v = vec![10, 11, 30];
        insert_bounded(&mut v, 9, 3, Some(5));
        assert_eq!(v, [9, 11, 30], "9, 10, 11 within 5: 10 leaves");
        // A prober's burst of 44 refusals, noted at once: the first stays beside the latest.
        let mut v = Vec::new();
        for end in (0..44u64).rev() {
            insert_bounded(&mut v, 10 + end, 32, Some(1_000));
        }
        assert_eq!(v.len(), 32);
        assert_eq!((v[0], v[1], v[31]), (10, 23, 53), "{v:?}");
    }
}
