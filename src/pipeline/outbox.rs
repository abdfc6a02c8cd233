//! The spans withheld from forwarding until their call's verdict is final (DESIGN §11.5): a
//! span whose call may still change — one of its spans held for a parent still to come, or a
//! client attempt whose observed server's span has not come yet — leaves when it cannot,
//! with its call's tags, or after `tracker.reorder_window` with the verdict counted then.
//!
//! Core: pure state, fed the tracker's clock; the pipeline frames what leaves and queues it.
//! Each span is kept as its bytes and its envelope ([`Envelope`]: its resource and scope,
//! shared by the spans of one scope), and found by its key when a later request counts its
//! call. Bounded by `tracker.max_held_spans` spans and `tracker.max_held_mib`, apart from the
//! calls the tracker holds: a span that does not fit is not withheld ([`Outbox::hold`] says
//! so), and leaves untagged at once. Every span withheld leaves exactly once: on its
//! verdict, at its deadline, or untagged when the outbox is emptied at shutdown.

use super::calls::SpanKey;
use crate::otlp::frame::{self, Envelope};
use crate::tracker::Nanos;
use foldhash::HashMap;
use std::collections::VecDeque;

/// One withheld span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parcel {
    /// What it stood in.
    pub envelope: Envelope,
    /// The span.
    pub span: Box<[u8]>,
    /// The tags it leaves with (its call's verdict as last counted; empty: none).
    pub tags: Vec<u8>,
    /// When it arrived (tracker clock).
    pub since: Nanos,
}

impl Parcel {
    /// The memory it takes, counted against `tracker.max_held_mib`: its bytes, its tags and
    /// its envelope (counted for each span, though spans of one scope share it).
    fn bytes(&self) -> usize {
        std::mem::size_of::<Parcel>() + self.span.len() + self.tags.capacity() + self.envelope.len()
    }
}

/// The withheld spans.
#[derive(Debug, Default)]
pub struct Outbox {
    parcels: HashMap<SpanKey, Parcel>,
    /// Keys by arrival, for their deadlines; a key that left early stays until its turn (or a
    /// compaction) and is passed over then.
    order: VecDeque<(Nanos, SpanKey)>,
    bytes: usize,
    max_spans: usize,
    max_bytes: usize,
    window: Nanos,
    /// Spans whose verdict is final, to be forwarded.
    ready: Vec<Parcel>,
}

impl Outbox {
    /// An outbox of at most `max_spans` spans and `max_bytes` bytes, each kept `window` at
    /// most.
    pub fn new(window: Nanos, max_spans: usize, max_bytes: usize) -> Outbox {
        Outbox {
            window,
            max_spans,
            max_bytes,
            ..Outbox::default()
        }
    }

    /// Withholds `parcel` as span `key`; `false` when it does not fit (the bounds reached),
    /// and it is not kept. A span withheld already keeps its place, with these tags.
    pub fn hold(&mut self, key: SpanKey, parcel: Parcel) -> bool {
        if let Some(kept) = self.parcels.get_mut(&key) {
            self.bytes -= kept.bytes();
            kept.tags = parcel.tags;
            self.bytes += kept.bytes();
            return true;
        }
        let bytes = parcel.bytes();
        if self.parcels.len() >= self.max_spans || self.bytes + bytes > self.max_bytes {
            return false;
        }
        self.bytes += bytes;
        self.order.push_back((parcel.since, key));
        self.parcels.insert(key, parcel);
        if self.order.len() > 2 * self.max_spans.max(1) {
            // Keys that left early: dropped from the order before it grows past twice the
            // bound.
            let parcels = &self.parcels;
            self.order
                .retain(|(since, k)| parcels.get(k).is_some_and(|p| p.since == *since));
        }
        true
    }

    /// Gives withheld span `key` the tags its call was counted with (`write` appends them).
    /// Nothing when it is not withheld.
    pub fn verdict(&mut self, key: &SpanKey, write: impl FnOnce(&mut Vec<u8>)) {
        let Some(parcel) = self.parcels.get_mut(key) else {
            return;
        };
        self.bytes -= parcel.bytes();
        parcel.tags.clear();
        write(&mut parcel.tags);
        self.bytes += parcel.bytes();
    }

    /// Makes withheld span `key` ready to leave, with the tags it has: its call can no longer
    /// change. Nothing when it is not withheld.
    pub fn release(&mut self, key: &SpanKey) {
        if let Some(parcel) = self.parcels.remove(key) {
            self.bytes -= parcel.bytes();
            self.ready.push(parcel);
        }
    }

    /// Makes ready every span withheld `window` or longer at `now`.
    pub fn due(&mut self, now: Nanos) {
        while let Some(&(since, key)) = self.order.front() {
            if since.saturating_add(self.window) > now {
                break;
            }
            self.order.pop_front();
            if self.parcels.get(&key).is_some_and(|p| p.since == since) {
                self.release(&key);
            }
        }
    }

    /// The spans ready to leave, taken.
    pub fn take_ready(&mut self) -> Vec<Parcel> {
        std::mem::take(&mut self.ready)
    }

    /// Whether spans are ready to leave.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Every span, ready or withheld, taken: what leaves at shutdown. The second count is of
    /// those still withheld, which leave untagged.
    pub fn take_all(&mut self) -> (Vec<Parcel>, usize) {
        let mut all = self.take_ready();
        let waiting = self.parcels.len();
        all.extend(self.parcels.drain().map(|(_, mut parcel)| {
            parcel.tags.clear();
            parcel
        }));
        self.order.clear();
        self.bytes = 0;
        (all, waiting)
    }

    /// How many spans are withheld (not counting those ready).
    pub fn len(&self) -> usize {
        self.parcels.len()
    }

    /// How many spans it has, withheld or ready to leave.
    pub fn pending(&self) -> usize {
        self.parcels.len() + self.ready.len()
    }

    /// The memory the withheld spans take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `parcels` framed as one export request, each in its own envelope with its tags.
pub fn frame(parcels: &[Parcel]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parcels {
        frame::enclose(&mut out, &p.envelope, &p.span, &p.tags);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn parcel(since: Nanos, tag: &[u8]) -> Parcel {
        Parcel {
            envelope: Envelope {
                resource: Arc::from(&b"r"[..]),
                scope: Arc::from(&b"s"[..]),
            },
            span: Box::from(&b"span"[..]),
            tags: tag.to_vec(),
            since,
        }
    }

    fn key(n: u8) -> SpanKey {
        ([n; 16], [n; 8])
    }

    fn tags(parcels: &[Parcel]) -> Vec<&[u8]> {
        parcels.iter().map(|p| &p.tags[..]).collect()
    }

    #[test]
    fn a_span_leaves_on_its_final_verdict_with_it() {
        let mut o = Outbox::new(100, 10, 1 << 20);
        assert!(o.hold(key(1), parcel(5, b"")));
        assert_eq!(o.len(), 1);
        o.verdict(&key(1), |t| t.extend_from_slice(b"first"));
        assert!(!o.has_ready(), "not final");
        o.verdict(&key(1), |t| t.extend_from_slice(b"last"));
        o.release(&key(1));
        assert!(o.has_ready());
        assert_eq!((o.len(), o.pending()), (0, 1), "ready, not withheld");
        assert_eq!(tags(&o.take_ready()), [&b"last"[..]]);
        assert_eq!(o.len(), 0);
        assert_eq!(o.bytes(), 0, "all given back");
        // A verdict for a span not withheld: nothing.
        o.verdict(&key(2), |t| t.push(1));
        o.release(&key(2));
        assert!(o.take_ready().is_empty());
    }

    #[test]
    fn a_span_leaves_at_its_deadline_with_the_verdict_counted_then() {
        let mut o = Outbox::new(100, 10, 1 << 20);
        o.hold(key(1), parcel(5, b"a"));
        o.hold(key(2), parcel(50, b"b"));
        o.verdict(&key(1), |t| t.extend_from_slice(b"c"));
        o.due(104);
        assert!(!o.has_ready(), "before its deadline");
        o.due(105);
        assert_eq!(tags(&o.take_ready()), [&b"c"[..]]);
        o.due(1_000);
        assert_eq!(tags(&o.take_ready()), [&b"b"[..]]);
        assert_eq!(o.len(), 0);
    }

    #[test]
    fn a_span_that_left_early_is_passed_over_at_its_deadline() {
        let mut o = Outbox::new(100, 10, 1 << 20);
        o.hold(key(1), parcel(5, b""));
        o.release(&key(1));
        assert_eq!(o.take_ready().len(), 1);
        // The same span again later (an exporter's retry): its own deadline, not the first's.
        o.hold(key(1), parcel(60, b"x"));
        o.due(105);
        assert!(!o.has_ready());
        o.due(160);
        assert_eq!(tags(&o.take_ready()), [&b"x"[..]]);
    }

    #[test]
    fn a_span_counts_its_bytes_its_tags_and_its_envelope() {
        let mut o = Outbox::new(100, 10, 1 << 20);
        let entry = std::mem::size_of::<Parcel>();
        o.hold(key(1), parcel(5, b""));
        // "span" and the envelope's "r" and "s".
        assert_eq!(o.bytes(), entry + 4 + 2);
        o.verdict(&key(1), |t| t.extend_from_slice(&[7; 100]));
        let tagged = o.bytes();
        assert!((entry + 106..entry + 140).contains(&tagged), "{tagged}");
        o.hold(key(2), parcel(5, b"xyz"));
        assert!(o.bytes() >= tagged + entry + 4 + 2 + 3);
    }

    #[test]
    fn the_bounds_refuse_a_span_and_holding_one_again_keeps_its_place() {
        let mut o = Outbox::new(100, 2, 1 << 20);
        assert!(o.hold(key(1), parcel(5, b"")));
        assert!(o.hold(key(2), parcel(6, b"")));
        assert!(!o.hold(key(3), parcel(7, b"")), "two spans at most");
        assert!(o.hold(key(1), parcel(8, b"again")), "held already");
        assert_eq!(o.len(), 2);
        o.due(105);
        assert_eq!(
            tags(&o.take_ready()),
            [&b"again"[..]],
            "at its first deadline"
        );
        let one = parcel(0, b"").bytes();
        let mut small = Outbox::new(100, 10, 2 * one);
        assert!(small.hold(key(1), parcel(0, b"")));
        assert!(small.hold(key(2), parcel(0, b"")));
        assert_eq!(small.bytes(), 2 * one);
        assert!(!small.hold(key(3), parcel(0, b"")), "the bytes' bound");
    }

    #[test]
    fn the_order_is_compacted_past_twice_the_bound() {
        let mut o = Outbox::new(100, 2, 1 << 20);
        for n in 0..10 {
            assert!(o.hold(key(n), parcel(u64::from(n), b"")));
            o.release(&key(n));
        }
        assert!(o.order.len() <= 4, "{}", o.order.len());
        assert_eq!(o.take_ready().len(), 10);
    }

    #[test]
    fn at_shutdown_every_span_leaves_and_the_withheld_ones_untagged() {
        let mut o = Outbox::new(100, 10, 1 << 20);
        o.hold(key(1), parcel(5, b"kept"));
        o.hold(key(2), parcel(6, b""));
        o.verdict(&key(2), |t| t.extend_from_slice(b"final"));
        o.release(&key(2));
        let (all, waiting) = o.take_all();
        assert_eq!(waiting, 1);
        assert_eq!(tags(&all), [&b"final"[..], &b""[..]]);
        assert!(o.len() == 0 && o.bytes() == 0 && o.order.is_empty());
    }

    #[test]
    fn parcels_frame_as_one_request() {
        let parcels = [parcel(0, b"t"), parcel(0, b"")];
        let mut want = Vec::new();
        for p in &parcels {
            frame::enclose(&mut want, &p.envelope, &p.span, &p.tags);
        }
        assert_eq!(frame(&parcels), want);
        assert!(frame(&[]).is_empty());
    }
}
