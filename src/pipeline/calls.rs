//! One call, counted once (DESIGN §9): the SERVER spans of interfaces observed from their
//! side that wait for the other span of their call, and the client calls on those
//! interfaces remembered for the server spans still to come.
//!
//! Core: pure state, fed the tracker's clock. A server span whose parent is not in its own
//! export — the client's CLIENT span, or the HTTP server span that names the client of a
//! protocol span — is *held* here, keyed by (trace, the parent it waits for), until that
//! parent arrives, or `reorder_window` passes and it is counted as it is. A client span on
//! an observed interface is *remembered* (for a minute at least), so that its server span,
//! arriving after it, is known for the same call. Both are bounded by `max_held_spans`.

use crate::tracker::Nanos;
use foldhash::HashMap;
use std::collections::VecDeque;

/// (trace id, span id): one span, or the parent a held span waits for.
pub type SpanKey = ([u8; 16], [u8; 8]);

/// The key of `trace` and `span` (shorter ids are padded with zeros, as the tracker does).
pub fn key(trace: &[u8], span: &[u8]) -> SpanKey {
    let mut k = ([0; 16], [0; 8]);
    let (t, s) = (trace.len().min(16), span.len().min(8));
    k.0[..t].copy_from_slice(&trace[..t]);
    k.1[..s].copy_from_slice(&span[..s]);
    k
}

/// How long a client call is remembered at least.
const REMEMBERED: Nanos = 60 * crate::clock::SECOND;

/// A SERVER span waiting for its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// When it arrived (tracker clock).
    pub arrived: Nanos,
    /// The span's protobuf bytes, read again when it is counted.
    pub span: Vec<u8>,
    /// The `service.name` of its resource: which interface it is an attempt on.
    pub service: String,
    /// The client its HTTP parent named (name, instance), when the span names none itself.
    pub client: Option<(String, Option<String>)>,
}

/// The held spans and the remembered client calls.
#[derive(Debug)]
pub struct Calls {
    held: HashMap<SpanKey, Held>,
    held_order: VecDeque<(Nanos, SpanKey)>,
    clients: HashMap<SpanKey, Nanos>,
    client_order: VecDeque<(Nanos, SpanKey)>,
    cap: usize,
    window: Nanos,
}

impl Calls {
    /// Holds spans for `window` (the tracker's reorder window); at most `cap` of each.
    pub fn new(window: Nanos, cap: usize) -> Calls {
        Calls {
            held: HashMap::default(),
            held_order: VecDeque::new(),
            clients: HashMap::default(),
            client_order: VecDeque::new(),
            cap,
            window,
        }
    }

    /// How many spans are held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A client span `call` on an observed interface arrived at `now`: remembered, and the
    /// server span held for it, if any, returned — the same call, not to be counted again.
    pub fn client_call(&mut self, call: SpanKey, now: Nanos) -> Option<Held> {
        if self.cap == 0 {
            return self.held.remove(&call);
        }
        if self.clients.insert(call, now).is_none() {
            self.client_order.push_back((now, call));
        }
        while self.clients.len() > self.cap {
            self.forget_oldest_client();
        }
        self.held.remove(&call)
    }

    /// Whether the client span `call` has been seen.
    pub fn seen_client(&self, call: &SpanKey) -> bool {
        self.clients.contains_key(call)
    }

    /// Holds `span` until the span `awaited` arrives. Returns a span to count at once: the
    /// oldest, when `max_held_spans` are held already (or `span` itself when holding is
    /// off), or the one held for `awaited` before (an exporter's retry of the same span).
    pub fn hold(&mut self, awaited: SpanKey, span: Held) -> Option<Held> {
        if self.cap == 0 {
            return Some(span);
        }
        self.held_order.push_back((span.arrived, awaited));
        if let Some(before) = self.held.insert(awaited, span) {
            return Some(before);
        }
        if self.held.len() > self.cap {
            return self.pop_oldest();
        }
        None
    }

    /// The span held for `parent`, which has just arrived.
    pub fn take(&mut self, parent: &SpanKey) -> Option<Held> {
        self.held.remove(parent)
    }

    /// The held spans whose wait is over at `now` (every one when `all`), oldest first;
    /// forgets client calls remembered long enough.
    pub fn due(&mut self, now: Nanos, all: bool) -> Vec<Held> {
        let mut out = Vec::new();
        while let Some(&(arrived, key)) = self.held_order.front() {
            if self.held.get(&key).is_none_or(|h| h.arrived != arrived) {
                // Taken since it was held.
                self.held_order.pop_front();
                continue;
            }
            if !all && now < arrived.saturating_add(self.window) {
                break;
            }
            out.extend(self.pop_oldest());
        }
        let remembered = self.window.max(REMEMBERED);
        while let Some(&(seen, _)) = self.client_order.front() {
            if now < seen.saturating_add(remembered) {
                break;
            }
            self.forget_oldest_client();
        }
        out
    }

    /// Removes the oldest held span (skipping order entries of spans taken since).
    fn pop_oldest(&mut self) -> Option<Held> {
        while let Some((arrived, key)) = self.held_order.pop_front() {
            if self.held.get(&key).is_some_and(|h| h.arrived == arrived) {
                return self.held.remove(&key);
            }
        }
        None
    }

    fn forget_oldest_client(&mut self) {
        while let Some((seen, key)) = self.client_order.pop_front() {
            if self.clients.get(&key) == Some(&seen) {
                self.clients.remove(&key);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(at: Nanos) -> Held {
        Held {
            arrived: at,
            span: vec![at as u8],
            service: "svc".into(),
            client: None,
        }
    }

    #[test]
    fn a_held_span_is_given_back_to_its_client_call_or_counted_after_the_window() {
        let mut calls = Calls::new(5, 10);
        let (a, b) = (key(&[1], &[1]), key(&[1], &[2]));
        assert_eq!(calls.hold(a, held(0)), None);
        assert_eq!(calls.hold(b, held(1)), None);
        // The client span of `a` arrives: the held span is the same call.
        assert_eq!(calls.client_call(a, 2), Some(held(0)));
        assert!(calls.seen_client(&a));
        assert_eq!(calls.due(5, false), vec![]);
        assert_eq!(calls.due(6, false), vec![held(1)]);
        assert_eq!(calls.held(), 0);
    }

    #[test]
    fn the_caps_bound_both_and_the_oldest_go_first() {
        let mut calls = Calls::new(5, 2);
        assert_eq!(calls.hold(key(&[1], &[1]), held(0)), None);
        assert_eq!(calls.hold(key(&[1], &[2]), held(1)), None);
        assert_eq!(calls.hold(key(&[1], &[3]), held(2)), Some(held(0)));
        for i in 0..3u8 {
            calls.client_call(key(&[2], &[i]), u64::from(i));
        }
        assert!(!calls.seen_client(&key(&[2], &[0])));
        assert!(calls.seen_client(&key(&[2], &[2])));
        // Forgotten after a minute.
        calls.due(REMEMBERED + 3, true);
        assert!(!calls.seen_client(&key(&[2], &[2])));
        assert_eq!(calls.held(), 0);
    }

    #[test]
    fn with_no_room_nothing_is_held() {
        let mut calls = Calls::new(5, 0);
        assert_eq!(calls.hold(key(&[1], &[1]), held(0)), Some(held(0)));
        assert_eq!(calls.client_call(key(&[1], &[1]), 0), None);
    }
}
