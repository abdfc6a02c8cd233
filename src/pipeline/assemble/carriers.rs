//! Which HTTP server span carries each protocol server span by time (DESIGN §9), found in
//! time linear in the spans (a Fenwick tree over their starts and ends); and which protocol
//! span wraps a protocol CLIENT span of the same call with spans in between (§12.5).
//!
//! Core: pure.

use super::super::calls::SpanKey;
use super::NodeMeta;
use crate::extract::call::{Member, Side};
use crate::extract::Family;
use crate::tracker::Nanos;
use foldhash::{HashMap, HashSet};

/// Which HTTP server span of the same resource and export carries each protocol server span
/// by time (DESIGN §9): for a protocol span that names no client and whose parent is not an
/// HTTP server span of the export — as when the MCP SDK parents its span to the client's own
/// span (trace context propagated in `_meta`) — the one HTTP span whose time contains it, when
/// it contains no other such span and no other contains it.
pub(in crate::pipeline) fn carriers(members: &[Member<'_>], nodes: &mut [NodeMeta]) {
    let is_protocol = |i: usize| {
        matches!(
            members[i].attempt.family,
            Family::Mcp | Family::A2a | Family::JsonRpc
        )
    };
    let http = |i: usize| members[i].attempt.family == Family::Http;
    let http_keys: HashSet<SpanKey> = (0..nodes.len())
        .filter(|&h| http(h))
        .map(|h| nodes[h].key)
        .collect();
    let protocol_parents: HashSet<SpanKey> = (0..nodes.len())
        .filter(|&i| is_protocol(i))
        .filter_map(|i| nodes[i].parent)
        .collect();
    let orphans: Vec<usize> = (0..nodes.len())
        .filter(|&i| is_protocol(i) && !members[i].named && nodes[i].carrier.is_none())
        .filter(|&i| !nodes[i].parent.is_some_and(|p| http_keys.contains(&p)))
        .collect();
    if orphans.is_empty() {
        return;
    }
    let parents: Vec<usize> = (0..nodes.len())
        .filter(|&h| http(h) && !protocol_parents.contains(&nodes[h].key))
        .collect();
    let span = |i: usize| (members[i].attempt.start, members[i].attempt.end);
    // The parents whose time contains each orphan: how many, and which when one.
    let around = containing(&parents, &orphans, span);
    // The orphans each parent's time contains: how many.
    let inside = contained(&parents, &orphans, span);
    for (k, &i) in orphans.iter().enumerate() {
        if let (1, Some(p)) = around[k] {
            if inside[p] == 1 {
                nodes[i].carrier = Some(nodes[parents[p]].key);
            }
        }
    }
}

/// Which span of the same export and client wraps each protocol CLIENT span whose parent is
/// none of them (DESIGN §12.5: an INTERNAL `execute_tool` span to which an MCP instrumentation
/// added its attributes, with a framework's span between it and the SDK's): a client-side
/// protocol span of the same trace, family and operation whose time contains it — the latest
/// to start of them. It is given as the span's carrier, which the call's assembly takes as a
/// nesting ([`crate::extract::call::Link::Nested`]).
pub(in crate::pipeline) fn wrappers(members: &[Member<'_>], nodes: &mut [NodeMeta]) {
    let protocol = |i: usize| {
        members[i].side == Side::Client
            && matches!(
                members[i].attempt.family,
                Family::Mcp | Family::A2a | Family::JsonRpc
            )
    };
    let keys: HashSet<SpanKey> = nodes.iter().map(|n| n.key).collect();
    let mut by_trace: HashMap<&[u8], Vec<usize>> = HashMap::default();
    for i in (0..nodes.len()).filter(|&i| protocol(i)) {
        by_trace
            .entry(members[i].attempt.trace_id)
            .or_default()
            .push(i);
    }
    for i in 0..nodes.len() {
        let orphan = nodes[i].parent.is_some_and(|p| !keys.contains(&p));
        if !orphan || !protocol(i) || nodes[i].carrier.is_some() {
            continue;
        }
        let a = &members[i].attempt;
        let wrapper = by_trace[a.trace_id]
            .iter()
            .copied()
            .filter(|&w| {
                let o = &members[w].attempt;
                w != i
                    && o.client == a.client
                    && o.family == a.family
                    && o.operation == a.operation
                    && o.start <= a.start
                    && o.end >= a.end
            })
            .max_by_key(|&w| {
                (
                    members[w].attempt.start,
                    std::cmp::Reverse(members[w].attempt.end),
                )
            });
        nodes[i].carrier = wrapper.map(|w| nodes[w].key);
    }
}

/// For each of `inner` (by its place there): how many of `outer` contain its time (start no
/// later, end no earlier), and the place in `outer` of the one when exactly one does. A sweep
/// by start over a Fenwick tree of ends: O((m + n) log m).
pub(super) fn containing(
    outer: &[usize],
    inner: &[usize],
    span: impl Fn(usize) -> (Nanos, Nanos),
) -> Vec<(usize, Option<usize>)> {
    let mut ends: Vec<Nanos> = outer.iter().map(|&h| span(h).1).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut by_start: Vec<usize> = (0..outer.len()).collect();
    by_start.sort_unstable_by_key(|&p| span(outer[p]).0);
    let mut queries: Vec<usize> = (0..inner.len()).collect();
    queries.sort_unstable_by_key(|&k| span(inner[k]).0);
    // Counts, and sums of places (the one place when the count is one).
    let mut count = Fenwick::new(ends.len());
    let mut places = Fenwick::new(ends.len());
    let (mut added, mut next) = (0usize, 0usize);
    let mut out = vec![(0, None); inner.len()];
    for k in queries {
        let (start, end) = span(inner[k]);
        while next < by_start.len() && span(outer[by_start[next]]).0 <= start {
            let p = by_start[next];
            let at = ends.partition_point(|&e| e < span(outer[p]).1);
            count.add(at, 1);
            places.add(at, p as u64);
            added += 1;
            next += 1;
        }
        // Of those that started no later, the ones that end no earlier.
        let before = ends.partition_point(|&e| e < end);
        let n = added - count.sum(before) as usize;
        let place = places.total().wrapping_sub(places.sum(before));
        out[k] = (n, (n == 1).then_some(place as usize));
    }
    out
}

/// For each of `outer` (by its place there): how many of `inner` its time contains.
pub(super) fn contained(
    outer: &[usize],
    inner: &[usize],
    span: impl Fn(usize) -> (Nanos, Nanos),
) -> Vec<usize> {
    let mut ends: Vec<Nanos> = inner.iter().map(|&i| span(i).1).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut by_start: Vec<usize> = (0..inner.len()).collect();
    by_start.sort_unstable_by_key(|&k| std::cmp::Reverse(span(inner[k]).0));
    let mut queries: Vec<usize> = (0..outer.len()).collect();
    queries.sort_unstable_by_key(|&p| std::cmp::Reverse(span(outer[p]).0));
    let mut count = Fenwick::new(ends.len());
    let mut next = 0;
    let mut out = vec![0; outer.len()];
    for p in queries {
        let (start, end) = span(outer[p]);
        // The inner spans that start no earlier …
        while next < by_start.len() && span(inner[by_start[next]]).0 >= start {
            let at = ends.partition_point(|&e| e < span(inner[by_start[next]]).1);
            count.add(at, 1);
            next += 1;
        }
        // … and end no later.
        out[p] = count.sum(ends.partition_point(|&e| e <= end)) as usize;
    }
    out
}

/// Sums over a prefix of places, each added to in O(log n) (a Fenwick tree); wrapping, as the
/// sums of places are read only where one place was added.
pub(super) struct Fenwick(Vec<u64>);

impl Fenwick {
    pub(super) fn new(n: usize) -> Fenwick {
        Fenwick(vec![0; n + 1])
    }

    pub(super) fn add(&mut self, at: usize, v: u64) {
        let mut i = at + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].wrapping_add(v);
            i += i & i.wrapping_neg();
        }
    }

    /// The sum of places `0..end`.
    pub(super) fn sum(&self, end: usize) -> u64 {
        let (mut i, mut s) = (end, 0u64);
        while i > 0 {
            s = s.wrapping_add(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        s
    }

    pub(super) fn total(&self) -> u64 {
        self.sum(self.0.len() - 1)
    }
}
