//! The join index: the spans being joined (the request's and the kept calls taken out for
//! them), each one's parent and carrier, grouped into calls in one pass (union-find), with
//! the cycles of parent ids cut.
//!
//! Core: pure.

use super::super::calls::SpanKey;
use crate::extract::call::{self, Joined, Link, Member};
use foldhash::HashMap;

/// Where a span of the work set comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum From {
    /// A node of the request (`Joins::nodes`), with its tag slot.
    Node(usize),
    /// A root of the request (`Joins::roots`), counted already.
    Root(usize),
    /// Span `member` of kept call `call` (of the calls taken out).
    Kept { call: usize, member: usize },
}

/// The spans being joined: the request's and the kept calls taken out for them.
pub(super) struct Work<'w> {
    pub(super) members: Vec<Member<'w>>,
    pub(super) keys: Vec<SpanKey>,
    pub(super) parents: Vec<Option<SpanKey>>,
    pub(super) carriers: Vec<Option<SpanKey>>,
    pub(super) from: Vec<From>,
    /// Its parent is still to come (not among the spans, not seen in the request, and not
    /// given up on).
    pub(super) open: Vec<bool>,
}

impl<'w> Work<'w> {
    pub(super) fn with_capacity(n: usize) -> Work<'w> {
        Work::with_members(Vec::with_capacity(n), n)
    }

    /// A work set whose first spans are `members`, each to be described in turn
    /// ([`Work::describe`]); room for `n` spans in all.
    pub(super) fn with_members(members: Vec<Member<'w>>, n: usize) -> Work<'w> {
        Work {
            members,
            keys: Vec::with_capacity(n),
            parents: Vec::with_capacity(n),
            carriers: Vec::with_capacity(n),
            from: Vec::with_capacity(n),
            open: Vec::with_capacity(n),
        }
    }

    pub(super) fn push(
        &mut self,
        member: Member<'w>,
        key: SpanKey,
        parent: Option<SpanKey>,
        from: From,
    ) {
        self.members.push(member);
        self.describe(key, parent, None, from);
    }

    /// Describes the next span of the work set, whose attempt is in `members` already.
    pub(super) fn describe(
        &mut self,
        key: SpanKey,
        parent: Option<SpanKey>,
        carrier: Option<SpanKey>,
        from: From,
    ) {
        self.keys.push(key);
        self.parents.push(parent);
        self.carriers.push(carrier);
        self.from.push(from);
        self.open.push(false);
    }

    /// Each span's join to the others (DESIGN §11), the calls they form (sets of indexes),
    /// and how many cycles of parent ids were cut.
    pub(super) fn calls(&self) -> (Vec<Joined>, Groups, usize) {
        let n = self.members.len();
        let mut index: HashMap<SpanKey, usize> =
            HashMap::with_capacity_and_hasher(n, Default::default());
        index.extend(self.keys.iter().enumerate().map(|(i, k)| (*k, i)));
        let mut joined = vec![Joined::default(); n];
        let mut set = Sets::new(n);
        let found = |k: &Option<SpanKey>| k.as_ref().and_then(|k| index.get(k)).copied();
        for (i, joined) in joined.iter_mut().enumerate() {
            let member = &self.members[i];
            if let Some(p) = found(&self.parents[i]).filter(|&p| p != i) {
                match call::link(member, &self.members[p]) {
                    Some(Link::Carried) => joined.carrier = Some(p),
                    Some(link) => joined.parent = Some((p, link)),
                    None => {}
                }
            }
            if joined.carrier.is_none() {
                // A carrier by time (§9), or a protocol span wrapping it (§12.5).
                match found(&self.carriers[i])
                    .filter(|&h| h != i)
                    .map(|h| (h, call::link(member, &self.members[h])))
                {
                    Some((h, Some(Link::Carried))) => joined.carrier = Some(h),
                    Some((h, Some(Link::Nested))) if joined.parent.is_none() => {
                        joined.parent = Some((h, Link::Nested));
                    }
                    _ => {}
                }
            }
            for j in joined
                .parent
                .map(|(p, _)| p)
                .into_iter()
                .chain(joined.carrier)
            {
                set.join(i, j);
            }
        }
        let cut = cut_cycles(&mut joined, |i| {
            let a = &self.members[i].attempt;
            (a.start, a.span_id)
        });
        (joined, set.groups(), cut)
    }
}

/// Cuts every cycle of parent ids (spans that name each other as parents, which no SDK
/// records but anyone can send): the span of the cycle that comes first by `first` (the
/// earliest to start) loses its parent, so the call has a root and is counted once, whatever
/// order its spans came in. One pass over the spans; returns how many cycles were cut.
pub(super) fn cut_cycles<K: Ord>(joined: &mut [Joined], first: impl Fn(usize) -> K) -> usize {
    const NEW: u32 = u32::MAX;
    const DONE: u32 = u32::MAX - 1;
    // Each span's state: NEW, DONE, or the walk that is on it now.
    let mut state = vec![NEW; joined.len()];
    let mut path: Vec<usize> = Vec::new();
    let mut cut = 0;
    for start in 0..joined.len() {
        let walk = start as u32;
        let mut at = Some(start);
        path.clear();
        while let Some(i) = at.filter(|&i| state[i] == NEW) {
            state[i] = walk;
            path.push(i);
            at = joined[i].parent.map(|(p, _)| p);
        }
        if let Some(i) = at.filter(|&i| state[i] == walk) {
            // Back on this walk's own path: the spans from `i` on are a cycle.
            let from = path.iter().position(|&p| p == i).unwrap_or(0);
            if let Some(&root) = path[from..].iter().min_by_key(|&&c| first(c)) {
                joined[root].parent = None;
                cut += 1;
            }
        }
        path.iter().for_each(|&i| state[i] = DONE);
    }
    cut
}

/// Disjoint sets of indexes (union by size, path halving).
pub(super) struct Sets {
    pub(super) parent: Vec<usize>,
    pub(super) size: Vec<usize>,
}

impl Sets {
    pub(super) fn new(n: usize) -> Sets {
        Sets {
            parent: (0..n).collect(),
            size: vec![1; n],
        }
    }

    pub(super) fn find(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    pub(super) fn join(&mut self, a: usize, b: usize) {
        let (mut a, mut b) = (self.find(a), self.find(b));
        if a == b {
            return;
        }
        if self.size[a] < self.size[b] {
            std::mem::swap(&mut a, &mut b);
        }
        self.parent[b] = a;
        self.size[a] += self.size[b];
    }

    /// The sets, each in index order, in the order of their first index: every index, set
    /// after set, and where each set ends. Placed in one pass, not sorted: a set's room is
    /// given when its first index is met, as long as its size.
    pub(super) fn groups(mut self) -> Groups {
        let n = self.parent.len();
        let roots: Vec<usize> = (0..n).map(|i| self.find(i)).collect();
        // Where the next index of each set (by its root) goes.
        let mut next = vec![usize::MAX; n];
        let mut ends = Vec::new();
        let mut end = 0;
        for &root in &roots {
            if next[root] == usize::MAX {
                next[root] = end;
                end += self.size[root];
                ends.push(end);
            }
        }
        let mut members = vec![0; n];
        for (i, &root) in roots.iter().enumerate() {
            members[next[root]] = i;
            next[root] += 1;
        }
        Groups { members, ends }
    }
}

/// Sets of indexes, one after another: set `k` is `members[ends[k - 1]..ends[k]]`.
pub(super) struct Groups {
    pub(super) members: Vec<usize>,
    pub(super) ends: Vec<usize>,
}

impl Groups {
    pub(super) fn iter(&self) -> impl Iterator<Item = &[usize]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.members[a..b])
    }
}
