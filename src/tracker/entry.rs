//! The packed attempt: one attempt in a key's history as the tracker keeps it (48 bytes),
//! its length, outcome, verdict, flags and the server's delay packed into a few bytes, the
//! state file's unpacked form of it, and the tail of a history that the in-order path reads
//! instead of the history (DESIGN §5).
//!
//! Core: pure data.

use super::{Nanos, Observation, Violation};
use crate::classify::{Kind, Outcome};
use crate::discovery::Declared;
use crate::extract::Discovery;

/// One attempt in a key's history: 48 bytes (a test keeps it so; it is most of a key's
/// memory) — 40 until contract 5 asked for what a request carried ([`Question`]). Its length, and so its end, is kept to one part in 2^18 ([`Length`]); its
/// outcome, kind, violation and flags share two bytes ([`Bits`]); its number in its row of
/// failures saturates at 255 (`tracker.max_retries` is at most 64, so every retry budget is
/// judged exactly). The state file keeps every field apart, as before ([`EntryState`]).
/// Its fields lie in the order written (`repr(C)`), what it asked last: the bytes just before
/// where the next attempt in the history begins, which [`super::group::Group::touch`] reads.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(from = "EntryState", into = "EntryState")]
#[repr(C)]
pub(super) struct Entry {
    pub(super) start: Nanos,
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    pub(super) length: Length,
    pub(super) attempt: u8,
    pub(super) bits: Bits,
    /// The server's delay (`Retry-After`).
    pub(super) delay: Delay,
    /// What it asked.
    pub(super) question: Question,
}

/// What an attempt asked ([`super::Asked`]) in 8 bytes: its arguments' fingerprint folded to
/// 32 bits, its version's to 30, and two flags (version refused, sessionless). 0 is unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Question {
    pub(super) arguments: u32,
    pub(super) version: u32,
}

impl Question {
    const VERSION_REFUSED: u32 = 1 << 30;
    const SESSIONLESS: u32 = 1 << 31;
    const VERSION: u32 = (1 << 30) - 1;

    /// `asked` packed.
    pub(super) fn of(asked: &super::Asked) -> Question {
        let fold = |h: u64, mask: u64| match h {
            0 => 0,
            h => ((h ^ h >> 32) & mask).max(1) as u32,
        };
        Question {
            arguments: fold(asked.arguments, u64::from(u32::MAX)),
            version: fold(asked.version, u64::from(Question::VERSION))
                | if asked.version_refused {
                    Question::VERSION_REFUSED
                } else {
                    0
                }
                | if asked.sessionless {
                    Question::SESSIONLESS
                } else {
                    0
                },
        }
    }

    /// Its answer refused the protocol version.
    pub(super) fn version_refused(self) -> bool {
        self.version & Question::VERSION_REFUSED != 0
    }

    /// A GET or DELETE on an MCP interface that named no session.
    pub(super) fn sessionless(self) -> bool {
        self.version & Question::SESSIONLESS != 0
    }

    /// Both named a protocol version, and not the same.
    pub(super) fn other_version(self, than: Question) -> bool {
        let (a, b) = (
            self.version & Question::VERSION,
            than.version & Question::VERSION,
        );
        a != 0 && b != 0 && a != b
    }

    /// Both carried their arguments, and not the same.
    pub(super) fn other_arguments(self, than: Question) -> bool {
        self.arguments != 0 && than.arguments != 0 && self.arguments != than.arguments
    }
}

/// A verdict: the kind, the violation, the number in the row of failures.
pub(super) type Verdict = (Kind, Option<Violation>, u8);

/// An [`Entry`] as the state file holds it: the layout of the versions before entries were
/// packed, so that a state file written by any of them loads, and they load this one's.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct EntryState {
    pub(super) start: Nanos,
    pub(super) end: Nanos,
    pub(super) trace_id: [u8; 16],
    pub(super) span_id: [u8; 8],
    pub(super) outcome: Outcome,
    pub(super) kind: Kind,
    pub(super) violation: Option<Violation>,
    pub(super) flags: u8,
    pub(super) attempt: u16,
    /// The server's delay (`Retry-After`); written by versions that read it.
    #[serde(default)]
    pub(super) delay: Delay,
    /// What it asked; written by versions of contract 5 and later.
    #[serde(default)]
    pub(super) question: Question,
}

impl From<EntryState> for Entry {
    fn from(e: EntryState) -> Entry {
        Entry {
            start: e.start,
            trace_id: e.trace_id,
            span_id: e.span_id,
            length: Length::of(e.end.saturating_sub(e.start)),
            attempt: u8::try_from(e.attempt).unwrap_or(u8::MAX),
            bits: Bits::new(e.outcome, e.kind, e.violation, e.flags),
            delay: e.delay,
            question: e.question,
        }
    }
}

impl From<Entry> for EntryState {
    fn from(e: Entry) -> EntryState {
        EntryState {
            start: e.start,
            end: e.end(),
            trace_id: e.trace_id,
            span_id: e.span_id,
            outcome: e.outcome(),
            kind: e.kind(),
            violation: e.violation(),
            flags: e.bits.flags(),
            attempt: u16::from(e.attempt),
            delay: e.delay,
            question: e.question,
        }
    }
}

/// How long an attempt took, in three bytes: nanoseconds as a 19-bit mantissa and a 5-bit
/// exponent (`m << e` ns). Exact to 524,287 ns, then rounded down by less than one part in
/// 2^18 (under 4 µs a second); at most about 13 days (a longer one is kept as that). The
/// tracker judges an attempt by its end as kept ([`kept_end`]), wherever it compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Length(pub(super) [u8; 3]);

impl Length {
    pub(super) const MANTISSA_BITS: u32 = 19;
    pub(super) const MANTISSA: u64 = (1 << Length::MANTISSA_BITS) - 1;
    pub(super) const MAX_EXPONENT: u64 = 31;

    /// `nanos` kept as described above.
    #[inline]
    pub(super) fn of(nanos: Nanos) -> Length {
        let exponent =
            u64::from((u64::BITS - nanos.leading_zeros()).saturating_sub(Length::MANTISSA_BITS));
        let packed = if exponent > Length::MAX_EXPONENT {
            Length::MAX_EXPONENT << Length::MANTISSA_BITS | Length::MANTISSA
        } else {
            exponent << Length::MANTISSA_BITS | nanos >> exponent
        };
        let [a, b, c, ..] = packed.to_le_bytes();
        Length([a, b, c])
    }

    /// The end of an attempt of this length that started at `start`.
    #[inline]
    pub(super) fn after(self, start: Nanos) -> Nanos {
        start.saturating_add(self.nanos())
    }

    /// The length in nanoseconds.
    #[inline]
    pub(super) fn nanos(self) -> Nanos {
        let [a, b, c] = self.0;
        let packed = u64::from_le_bytes([a, b, c, 0, 0, 0, 0, 0]);
        (packed & Length::MANTISSA) << (packed >> Length::MANTISSA_BITS)
    }
}

/// The end of an attempt from `start` to `end` as the tracker keeps it (see [`Length`]).
#[inline]
pub(super) fn kept_end(start: Nanos, end: Nanos) -> Nanos {
    Length::of(end.saturating_sub(start)).after(start)
}

/// An entry's outcome, kind, violation and flags in two bytes: the flags in bits 0–5, the
/// outcome in 6–8, the kind in 9–12 and the violation (0 for none, else 1 + its place in
/// [`Violation::ALL`]) in 13–15.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bits(pub(super) u16);

impl Bits {
    pub(super) const FLAGS: u16 = 0x3f;
    pub(super) const OUTCOME: u32 = 6;
    pub(super) const KIND: u32 = 9;
    pub(super) const VIOLATION: u32 = 13;

    pub(super) fn new(
        outcome: Outcome,
        kind: Kind,
        violation: Option<Violation>,
        flags: u8,
    ) -> Bits {
        let violation = violation.map_or(0, |v| v as u16 + 1);
        Bits(
            u16::from(flags) & Bits::FLAGS
                | (outcome as u16) << Bits::OUTCOME
                | (kind as u16) << Bits::KIND
                | violation << Bits::VIOLATION,
        )
    }

    pub(super) fn flags(self) -> u8 {
        (self.0 & Bits::FLAGS) as u8
    }

    pub(super) fn outcome(self) -> Outcome {
        Outcome::ALL[usize::from(self.0 >> Bits::OUTCOME & 7)]
    }

    pub(super) fn kind(self) -> Kind {
        Kind::ALL[usize::from(self.0 >> Bits::KIND & 15)]
    }

    pub(super) fn violation(self) -> Option<Violation> {
        match usize::from(self.0 >> Bits::VIOLATION & 7) {
            0 => None,
            v => Some(Violation::ALL[v - 1]),
        }
    }
}

/// The server's delay of an attempt in two bytes: milliseconds as a 12-bit mantissa and a
/// 4-bit exponent (`m << e` ms). Exact to 4.095 s, then rounded down by less than 1 part in
/// 2,048; at most about 37 hours (a longer delay is kept as that). Rounding down errs on the
/// client's side: a retry is never judged too early for a delay the server did not ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Delay(pub(super) u16);

impl Delay {
    pub(super) const MANTISSA: u64 = 0xfff;
    pub(super) const MAX_EXPONENT: u32 = 15;

    /// `nanos` (none: no delay) kept to the millisecond, as described above.
    #[inline]
    pub(super) fn of(nanos: Option<Nanos>) -> Delay {
        let Some(nanos) = nanos else {
            return Delay(0);
        };
        let ms = nanos / 1_000_000;
        let exponent = (u64::BITS - ms.leading_zeros()).saturating_sub(12);
        if exponent > Delay::MAX_EXPONENT {
            return Delay((Delay::MAX_EXPONENT << 12) as u16 | Delay::MANTISSA as u16);
        }
        Delay((exponent << 12) as u16 | (ms >> exponent) as u16)
    }

    /// The delay in nanoseconds; 0 for none.
    pub(super) fn nanos(self) -> Nanos {
        let mantissa = u64::from(self.0) & Delay::MANTISSA;
        (mantissa << (self.0 >> 12)) * 1_000_000
    }
}

/// The path is declared `no`.
pub(super) const DECLARED_NO: u8 = 1;
/// It read the interface's discovery document.
pub(super) const READ: u8 = 2;
/// Its verdict is final and counted.
pub(super) const SETTLED: u8 = 4;
/// As a refusal, it has been judged honored or not.
pub(super) const JUDGED: u8 = 8;
/// It asked for the interface's discovery document (read it or not): never a probe.
pub(super) const ASKED: u8 = 16;
/// As a refusal of no length, an attempt that started the instant it ended — ordered before
/// it, so no longer in the history — follows it: it is not honored (see [`followed`]).
pub(super) const FOLLOWED: u8 = 32;

impl Entry {
    /// The entry of an attempt the tracker is given, not judged yet.
    pub(super) fn of(obs: &Observation) -> Entry {
        let declared = match obs.declared {
            Declared::No => DECLARED_NO,
            _ => 0,
        };
        let discovery = match obs.discovery {
            Discovery::Read => READ | ASKED,
            Discovery::Asked => ASKED,
            Discovery::None => 0,
        };
        Entry {
            start: obs.start,
            trace_id: obs.trace_id,
            span_id: obs.span_id,
            length: Length::of(obs.end.saturating_sub(obs.start)),
            attempt: 1,
            bits: Bits::new(obs.outcome, Kind::Ok, None, declared | discovery),
            delay: Delay::of(obs.retry_after),
            question: Question::of(&obs.asked),
        }
    }

    pub(super) fn has(&self, flag: u8) -> bool {
        self.bits.flags() & flag != 0
    }

    pub(super) fn set(&mut self, flag: u8) {
        self.bits.0 |= u16::from(flag);
    }

    /// Its end as kept ([`kept_end`]).
    #[inline]
    pub(super) fn end(&self) -> Nanos {
        self.length.after(self.start)
    }

    pub(super) fn outcome(&self) -> Outcome {
        self.bits.outcome()
    }

    pub(super) fn kind(&self) -> Kind {
        self.bits.kind()
    }

    pub(super) fn violation(&self) -> Option<Violation> {
        self.bits.violation()
    }

    /// Records its verdict.
    pub(super) fn judged(&mut self, (kind, violation, attempt): Verdict) {
        self.bits = Bits::new(self.outcome(), kind, violation, self.bits.flags());
        self.attempt = attempt;
    }

    pub(super) fn order(&self) -> (Nanos, Nanos, [u8; 8]) {
        (self.start, self.end(), self.span_id)
    }

    pub(super) fn declared(&self) -> Declared {
        if self.has(DECLARED_NO) {
            Declared::No
        } else {
            Declared::Unknown
        }
    }
}

/// What judging an attempt that arrives after all of its key's attempts needs of their
/// history, kept in the key itself: the in-order path (nearly every attempt) then reads no
/// entry of the history, whose latest one is rarely still in the cache. Packed (18 bytes,
/// its end kept as the entry keeps it): with the key's own small fields in the 6 bytes an
/// aligned tail would pad, a key takes 72 bytes, not 80 (a test keeps it so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(Rust, packed)]
pub(super) struct Tail {
    /// The history is not empty, and each attempt in it ended no later than the next one
    /// did: so every one ended by the time an attempt that starts after the last ended.
    pub(super) ordered: bool,
    /// The latest attempt's times, kind, number in its row of failures and server's delay.
    pub(super) start: Nanos,
    pub(super) length: Length,
    pub(super) kind: Kind,
    pub(super) attempt: u8,
    pub(super) delay: Delay,
    /// How many of the latest attempts in a row failed transient or throttled (saturating).
    pub(super) retryable_run: u16,
}

impl Tail {
    /// The tail of an empty history: nothing goes after it in order.
    pub(super) const EMPTY: Tail = Tail {
        ordered: false,
        start: 0,
        length: Length([0; 3]),
        kind: Kind::Ok,
        attempt: 0,
        delay: Delay(0),
        retryable_run: 0,
    };

    /// The tail of `history`.
    pub(super) fn of(history: &[Entry]) -> Tail {
        Tail::ordered(
            history,
            history.windows(2).all(|w| w[0].end() <= w[1].end()),
        )
    }

    /// The tail of `history` once an attempt was inserted at `at`, given the tail before
    /// (`was`): in an ordered history only the attempt's neighbours can put it out of order,
    /// so only they are read (the whole history when it was not known ordered).
    pub(super) fn inserted(history: &[Entry], at: usize, was: &Tail) -> Tail {
        if !was.ordered {
            return Tail::of(history);
        }
        let end = history[at].end();
        let after_previous = at == 0 || history[at - 1].end() <= end;
        let before_next = history.get(at + 1).is_none_or(|next| end <= next.end());
        Tail::ordered(history, after_previous && before_next)
    }

    /// The tail of `history`, whose order is `ordered`.
    fn ordered(history: &[Entry], ordered: bool) -> Tail {
        let Some(last) = history.last() else {
            return Tail::EMPTY;
        };
        let run = history
            .iter()
            .rev()
            .take_while(|e| e.kind().class().is_retryable_failure())
            .count();
        Tail {
            ordered,
            start: last.start,
            length: last.length,
            kind: last.kind(),
            attempt: last.attempt,
            delay: last.delay,
            retryable_run: u16::try_from(run).unwrap_or(u16::MAX),
        }
    }

    /// Whether `a` goes after every attempt of the history, each of which ended by the
    /// time it started: then its predecessor is the latest attempt and nothing after it
    /// needs judging again.
    /// (A saturated run of failures is left to the history to count.)
    pub(super) fn precedes(&self, a: &Entry) -> bool {
        let end = self.end();
        self.ordered
            && self.retryable_run < u16::MAX
            && end <= a.start
            && (self.start, end) < (a.start, a.end())
    }

    /// The latest attempt's end, as its entry keeps it.
    #[inline]
    pub(super) fn end(&self) -> Nanos {
        self.length.after(self.start)
    }

    /// The tail once `a` (judged) is appended after it.
    pub(super) fn push(&mut self, a: &Entry) {
        self.retryable_run = if a.kind().class().is_retryable_failure() {
            self.retryable_run.saturating_add(1)
        } else {
            0
        };
        self.start = a.start;
        self.length = a.length;
        self.kind = a.kind();
        self.attempt = a.attempt;
        self.delay = a.delay;
    }
}

#[cfg(test)]
mod tests {
    use super::{Bits, Delay, Entry, Length, Question};
    use crate::classify::{Kind, Outcome};
    use crate::tracker::Violation;

    #[test]
    fn a_length_is_exact_to_half_a_millisecond_then_rounded_down_by_less_than_a_2_18th() {
        for nanos in [0, 1, 2, 499_999, (1 << 19) - 1] {
            assert_eq!(Length::of(nanos).nanos(), nanos, "{nanos} exact");
        }
        for nanos in [
            1 << 19,
            (1 << 19) + 1,
            (1 << 20) - 1,
            1_500_000_001,
            60_000_000_007,
            1 << 40,
            3_600_000_000_000 + 12_345,
            (1 << 49) + (1 << 31) - 1,
        ] {
            let kept = Length::of(nanos).nanos();
            assert!(
                kept <= nanos && (nanos - kept) << 18 < nanos,
                "{nanos} kept as {kept}"
            );
            assert_eq!(Length::of(kept).nanos(), kept, "{nanos}: kept as kept");
        }
        assert_eq!(
            Length::of((1 << 20) - 1).nanos(),
            (1 << 20) - 2,
            "one bit gone"
        );
        let longest = ((1u64 << 19) - 1) << 31;
        assert_eq!(Length::of(u64::MAX).nanos(), longest, "about 13 days");
        assert_eq!(Length::of(longest).nanos(), longest);
        assert_eq!(Length::of(longest + (1 << 31)).nanos(), longest);
        assert_eq!(super::kept_end(7, 7 + (1 << 20) - 1), 7 + (1 << 20) - 2);
        assert_eq!(super::kept_end(u64::MAX - 1, u64::MAX), u64::MAX);
    }

    #[test]
    fn an_entry_keeps_every_outcome_kind_violation_and_flag() {
        let violations = std::iter::once(None).chain(Violation::ALL.map(Some));
        for outcome in Outcome::ALL {
            for kind in Kind::ALL {
                for violation in violations.clone() {
                    for flags in [0, 1, 0b10_1010, 0b01_0101, 0x3f] {
                        let bits = Bits::new(outcome, kind, violation, flags);
                        assert_eq!(
                            (bits.outcome(), bits.kind(), bits.violation(), bits.flags()),
                            (outcome, kind, violation, flags)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_entry_goes_to_the_state_file_and_back_whole() {
        let entry = Entry {
            start: 1_700_000_000_000_000_000,
            trace_id: [7; 16],
            span_id: [9; 8],
            length: Length::of(1_500_000_001),
            attempt: 200,
            bits: Bits::new(
                Outcome::Throttled,
                Kind::Throttled,
                Some(Violation::RetryBeforeRetryAfter),
                super::SETTLED | super::READ,
            ),
            delay: Delay::of(Some(2_000_000_000)),
            question: Question {
                arguments: 7,
                version: 8 | Question::VERSION_REFUSED,
            },
        };
        let json = serde_json::to_value(&entry).expect("serialises");
        assert_eq!(json["end"], entry.start + Length::of(1_500_000_001).nanos());
        assert_eq!(json["attempt"], 200);
        assert_eq!(json["kind"], serde_json::json!("Throttled"));
        let back: Entry = serde_json::from_value(json).expect("deserialises");
        assert_eq!(
            (back.start, back.end(), back.trace_id, back.span_id),
            (entry.start, entry.end(), entry.trace_id, entry.span_id)
        );
        assert_eq!(
            (back.attempt, back.bits, back.delay, back.question),
            (200, entry.bits, entry.delay, entry.question)
        );
        let mut long = serde_json::to_value(&entry).expect("serialises");
        long["attempt"] = 1000.into();
        let back: Entry = serde_json::from_value(long).expect("deserialises");
        assert_eq!(back.attempt, u8::MAX, "a longer row saturates");
    }

    #[test]
    fn an_entry_is_48_bytes() {
        assert_eq!(std::mem::size_of::<super::Entry>(), 48);
        assert_eq!(
            std::mem::offset_of!(super::Entry, question),
            40,
            "what it asked lies last, beside the next attempt"
        );
    }

    #[test]
    fn a_delay_is_kept_to_the_millisecond_then_rounded_down_by_less_than_a_2048th() {
        const MS: u64 = 1_000_000;
        assert_eq!(Delay::of(None).nanos(), 0);
        assert_eq!(
            Delay::of(Some(MS - 1)).nanos(),
            0,
            "under a millisecond: none"
        );
        for ms in [1, 2, 999, 1000, 1500, 4095, 4096, 60_000, 86_400_000] {
            let kept = Delay::of(Some(ms * MS + 123)).nanos() / MS;
            assert!(
                kept <= ms && (ms - kept) * 2048 < ms.max(2048),
                "{ms} ms kept as {kept}"
            );
        }
        assert_eq!(
            Delay::of(Some(4095 * MS)).nanos(),
            4095 * MS,
            "exact to 4.095 s"
        );
        let longest = Delay::of(Some(u64::MAX)).nanos();
        assert_eq!(longest, (4095 << 15) * MS, "at most about 37 hours");
        assert_eq!(Delay::of(Some(longest)).nanos(), longest);
    }

    #[test]
    fn an_inserted_attempts_tail_reads_its_neighbours_as_the_whole_history_would() {
        use super::Tail;
        // (start, end) of each attempt, in the order of the history.
        let entry = |(start, end): (u64, u64)| Entry {
            start,
            trace_id: [0; 16],
            span_id: start.to_be_bytes(),
            length: Length::of(end - start),
            attempt: 1,
            bits: Bits::new(Outcome::Transient, Kind::Transient, None, 0),
            delay: Delay::default(),
            question: Question::default(),
        };
        let histories: [&[(u64, u64)]; 4] = [
            &[(10, 20), (30, 40), (50, 60)],
            &[(10, 20)],
            &[],
            // Not ordered: the first ended after the second.
            &[(10, 45), (30, 40), (50, 60)],
        ];
        for history in histories {
            let before: Vec<Entry> = history.iter().copied().map(entry).collect();
            let was = Tail::of(&before);
            for at in 0..=before.len() {
                // Ends that keep the order, and ends that break it on either side.
                for arriving in [(at as u64 * 20 + 1, at as u64 * 20 + 5), (0, 100), (25, 26)] {
                    let mut after = before.clone();
                    after.insert(at, entry(arriving));
                    assert_eq!(
                        Tail::inserted(&after, at, &was),
                        Tail::of(&after),
                        "{arriving:?} at {at} of {history:?}"
                    );
                }
            }
        }
    }
}
