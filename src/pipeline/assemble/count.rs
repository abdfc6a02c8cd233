//! Counting the calls a request's join found (DESIGN §11): each call's spans assembled
//! into its attempts ([`crate::extract::call`]), what its spans were counted as before taken
//! back while pending, the attempts given to the tracker and tagged — and the calls whose
//! other side or parts may still come kept, held or remembered.
//!
//! Core, as the rest of the pipeline.

use super::super::calls::{
    At, Batch, Bound, Call, Calls, Kept, Part, RecentMember, SpanKey, State,
};
use super::super::outbox::Outbox;
use super::super::{place, ClientIds, Pipeline, Placed, RequestState};
use super::work::{From, Work};
use super::Memory;
use crate::config::Protocol;
use crate::discovery::{Declared, InterfaceRef, Interfaces};
use crate::extract::call::{self, Role, Side};
use crate::extract::{Attempt, Client, Family, Owned};
use crate::otlp::route;
use crate::otlp::tags::SpanTags;
use crate::tracker::{Event, Nanos, Observation, Retraction};
use foldhash::HashSet;

/// Where the request's nodes and roots stand: each one's place among the request's tags,
/// and in its body.
#[derive(Clone, Copy, Default)]
pub(super) struct Places<'r> {
    pub(super) slots: &'r [Option<usize>],
    pub(super) root_slots: &'r [Option<usize>],
    pub(super) at: &'r [At],
    pub(super) root_at: &'r [At],
}

/// What counting a call needs: the clock, where its events go, for the calls of a request
/// its tags and its count of attempts, and when forwarding the spans withheld for their
/// call's verdict.
pub(super) struct Counting<'r> {
    pub(super) now: Nanos,
    pub(super) events: &'r mut Vec<Event>,
    pub(super) tags: Option<&'r mut SpanTags>,
    pub(super) attempts: &'r mut u64,
    pub(super) outbox: Option<&'r mut Outbox>,
}

impl<'r> Counting<'r> {
    /// What counting the calls of request `r` needs.
    pub(super) fn of(r: &'r mut RequestState<'_>, outbox: Option<&'r mut Outbox>) -> Counting<'r> {
        Counting {
            now: r.now,
            events: &mut r.events,
            tags: r.tags.as_deref_mut(),
            attempts: &mut r.summary.attempts,
            outbox,
        }
    }

    /// A span of a call gets the tags `write` appends, its call's verdict so far: in the
    /// request, at `slot`; kept from an earlier request (no slot), in the outbox when it was
    /// withheld there.
    fn tag(&mut self, slot: Option<usize>, key: &SpanKey, write: impl FnOnce(&mut Vec<u8>)) {
        match slot {
            Some(slot) => {
                if let Some(tags) = self.tags.as_deref_mut() {
                    tags.write(slot, write);
                }
            }
            None => {
                if let Some(outbox) = self.outbox.as_deref_mut() {
                    outbox.verdict(key, write);
                }
            }
        }
    }

    /// The spans of a call (`group`) after it was counted: when it may still change (its
    /// server's span still to come, `last` false), the request's own are withheld; when it
    /// cannot, the ones withheld from earlier requests leave.
    fn settle_spans(&mut self, work: &Work<'_>, places: &Places<'_>, group: &[usize], last: bool) {
        for &i in group {
            match (slot(work, places, i), work.from[i]) {
                (Some(slot), _) if !last => {
                    if let Some(tags) = self.tags.as_deref_mut() {
                        tags.withhold(slot);
                    }
                }
                (None, From::Kept { .. }) if last => {
                    if let Some(outbox) = self.outbox.as_deref_mut() {
                        outbox.release(&work.keys[i]);
                    }
                }
                _ => {}
            }
        }
    }
}

impl Pipeline {
    /// Counts the held calls the bounds forced out (and any they force out in turn).
    pub(super) fn count_forced(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        mut forced: Vec<(Call, Bound)>,
        (now, events): (Nanos, &mut Vec<Event>),
        mut outbox: Option<&mut Outbox>,
    ) {
        while !forced.is_empty() {
            let bags: Vec<Call> = forced
                .drain(..)
                .map(|(call, bound)| {
                    self.metrics.held_forced(bound.as_str());
                    call
                })
                .collect();
            let at = (now, &mut *events);
            forced = self.count_kept(calls, interfaces, bags, at, outbox.as_deref_mut());
        }
    }

    /// Counts kept calls as they are (their wait is over): every parent still awaited is
    /// given up on. Returns the held calls that remembering them forced out.
    pub(super) fn count_kept(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        bags: Vec<Call>,
        (now, events): (Nanos, &mut Vec<Event>),
        outbox: Option<&mut Outbox>,
    ) -> Vec<(Call, Bound)> {
        if bags.is_empty() {
            return Vec::new();
        }
        let mut work = Work::with_capacity(bags.iter().map(|c| c.members.len()).sum());
        self.push_kept(&mut work, &bags);
        let mut attempts = 0;
        let mut counting = Counting {
            now,
            events,
            tags: None,
            attempts: &mut attempts,
            outbox,
        };
        self.run(
            calls,
            interfaces,
            &work,
            &bags,
            &mut counting,
            Places::default(),
            None,
        )
    }

    /// Counts (or, when `may_hold`, holds) every call of the work set. Returns the held calls
    /// the bounds forced out.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        calls: &mut Calls,
        interfaces: &Interfaces,
        work: &Work<'_>,
        taken: &[Call],
        counting: &mut Counting<'_>,
        places: Places<'_>,
        mut batch: Option<&mut Batch>,
    ) -> Vec<(Call, Bound)> {
        // The calls of a request may wait for spans to come; kept calls counted now may not.
        let may_hold = batch.is_some();
        let (joined, groups, cut) = work.calls();
        if cut > 0 {
            self.metrics.call_cycles_cut(cut);
        }
        let undeclared = |a: &Attempt<'_>| {
            let origin = a.origin.as_ref().map(|o| o.as_str());
            let interface = interfaces.resolve(origin, a.path);
            interfaces.declared(interface, a.path) == Declared::No
        };
        // Every call of the work set at once: calls do not reach into each other.
        let roles = call::assemble(&work.members, &joined, undeclared);
        let mut forced = Vec::new();
        let mut open: Vec<SpanKey> = Vec::new();
        let mut counted: Vec<Observation> = Vec::new();
        for group in groups.iter() {
            let counted_before = group.iter().any(|&i| match work.from[i] {
                From::Root(_) => true,
                From::Kept { call, .. } => !taken[call].is_held(),
                From::Node(_) => false,
            });
            open.clear();
            open.extend(
                group
                    .iter()
                    .filter(|&&i| work.open[i])
                    .filter_map(|&i| work.parents[i]),
            );
            if may_hold && !open.is_empty() && !counted_before {
                forced.extend(calls.keep(held(work, group, taken, (&open, counting.now))));
                // Its verdict is still to come: the request's spans of it are withheld.
                counting.settle_spans(work, &places, group, false);
                continue;
            }
            let kept_call = self.count_call(
                interfaces,
                work,
                (&roles, group),
                taken,
                counting,
                places,
                &mut counted,
            );
            let parts = |i: usize| roles.roles[i] == Role::Part;
            match kept_call {
                Some(Memory::Remembered) => {
                    let call = Call {
                        members: group
                            .iter()
                            .map(|&i| kept(work, taken, i, parts(i)))
                            .collect(),
                        state: State::Counted {
                            attempts: counted.clone(),
                        },
                        since: counting.now,
                    };
                    forced.extend(calls.keep(call));
                }
                Some(Memory::Recent) => {
                    if let Some(batch) = batch.as_deref_mut() {
                        let members = recent_members(work, group, taken, places, parts);
                        batch.call(members, &counted);
                    }
                }
                None => {}
            }
        }
        forced
    }

    /// Counts one call of the work set (the spans `group`, whose `roles` are assembled): takes
    /// back what its spans were counted as before, counts its attempts and tags them (a client
    /// attempt on an observed interface only once its server's side is in: never with a verdict
    /// that is not the call's). Says how long to keep it when more of it may still come (its
    /// attempts left in `counted`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn count_call(
        &self,
        interfaces: &Interfaces,
        work: &Work<'_>,
        (calls, group): (&call::Calls<'_>, &[usize]),
        taken: &[Call],
        counting: &mut Counting<'_>,
        places: Places<'_>,
        counted: &mut Vec<Observation>,
    ) -> Option<Memory> {
        let settled = self.take_back(interfaces, (work, group), taken, counting);
        counted.clear();
        let mut remember = false;
        let (has_server, may_grow) = shape(work, group);
        let slot_of = |i: usize| slot(work, &places, i);
        let settled_span = |i: usize| !settled.is_empty() && settled.contains(&work.keys[i]);
        // A span counted as an attempt of its own, settled, and now a part of its call (a
        // protocol span before its request, settled by a scrape or by the window): it stays
        // counted, and the client attempts it lends its call to are that attempt again,
        // skipped as `same_call`.
        let settled_part = group
            .iter()
            .any(|&i| calls.attempt(i).is_none() && settled_span(i));
        // Whether the call may still change: a client attempt of it waits for its server's
        // span (DESIGN §11.5).
        let mut waits = false;
        // A first tier's replica stamps every span of the call with its client instead.
        let client = self.join.then(|| call_client(calls, group)).flatten();
        let untag = |i: usize, c: &mut Counting<'_>| {
            c.tag(slot_of(i), &work.keys[i], |buf| stamp(buf, client));
        };
        for &i in group {
            match calls.attempt(i) {
                None => {
                    let before = match work.from[i] {
                        From::Kept { call, member } => taken[call].members[member].skipped,
                        _ => false,
                    };
                    if !before && !settled_span(i) {
                        self.metrics.span_skipped("same_call");
                    }
                    untag(i, counting);
                }
                Some(call::Assembled { attempt, interface }) => {
                    if settled_span(i) {
                        continue;
                    }
                    if settled_part && work.members[i].side == Side::Client {
                        self.metrics.span_skipped("same_call");
                        untag(i, counting);
                        continue;
                    }
                    let mut ids = self.client_ids(attempt.client);
                    let p = self.place_call(interfaces, (attempt, *interface), &ids, has_server);
                    let observed = interfaces.client_from(p.interface).is_some();
                    let client = work.members[i].side == Side::Client;
                    if client && (observed || attempt.origin.is_none()) {
                        remember = true;
                        // Its server's side still to come: its verdict is not the call's yet.
                        waits |= interfaces.any_observed() && !answered(work, group, interfaces);
                    }
                    let labels = self.labels(&mut ids, p.group.interface, p.interface_name);
                    let obs = place::observation(&p, attempt, labels);
                    *counting.attempts += 1;
                    let judged = self.tracker.observe(
                        counting.now,
                        &obs,
                        &attempt.operation,
                        counting.events,
                    );
                    let Some(judgement) = judged else {
                        self.metrics.span_skipped("duplicate");
                        continue;
                    };
                    counted.push(obs);
                    if attempt.tagged || self.join {
                        // Tagged upstream: forwarded as it came; a joiner's: stamped.
                        if self.join {
                            untag(i, counting);
                        }
                        continue;
                    }
                    let max = self.metrics.max_label_bytes();
                    counting.tag(slot_of(i), &work.keys[i], |buf| {
                        let reason = p.reason.to_string();
                        place::write_place_tags(buf, &reason, p.interface_name, max);
                        place::write_verdict_tags(buf, &judgement);
                    });
                }
            }
        }
        counting.settle_spans(work, &places, group, !waits);
        Memory::of(remember, may_grow)
    }

    /// Where a call's attempt stands: on the interface its server's span placed it on, when
    /// one did; said by the interface's own spans when the call has one (DESIGN §13
    /// witnesses).
    fn place_call<'i>(
        &self,
        interfaces: &'i Interfaces,
        (attempt, interface): (&'i Attempt<'_>, Option<usize>),
        ids: &ClientIds<'_>,
        has_server: bool,
    ) -> Placed<'i> {
        let mut p = match interface {
            Some(index) => {
                let mut room = None;
                let path = attempt.path_or_grpc(&mut room);
                let configured = InterfaceRef::Configured(index);
                self.place_in(interfaces, configured, attempt, path, ids.id)
            }
            None => self.place(interfaces, attempt, ids.id),
        };
        if has_server {
            p.testimony.witness = crate::tracker::honesty::SERVER;
        }
        p
    }

    /// Takes back what the spans of a call (`group`) were counted as before, while pending;
    /// returns the spans of those that stay — settled, or no longer held by the tracker
    /// (settled early by a flooded key and gone from its history, or its key evicted): they
    /// were counted, and counting them again would count the call twice.
    fn take_back(
        &self,
        interfaces: &Interfaces,
        (work, group): (&Work<'_>, &[usize]),
        taken: &[Call],
        counting: &mut Counting<'_>,
    ) -> Vec<SpanKey> {
        let mut settled: Vec<SpanKey> = Vec::new();
        let mut taken_from: Option<usize> = None;
        let mut retract = |obs: &Observation| {
            if self.tracker.retract(obs) != Retraction::Retracted {
                settled.push((obs.trace_id, obs.span_id));
            }
        };
        for &i in group {
            match work.from[i] {
                From::Kept { call, .. } if taken_from != Some(call) => {
                    taken_from = Some(call);
                    if let State::Counted { attempts } = &taken[call].state {
                        attempts.iter().for_each(&mut retract);
                    }
                }
                From::Root(_) => {
                    retract(&self.observation_again(interfaces, &work.members[i].attempt));
                    // Counted by its request as an attempt of its own: now part of a call.
                    *counting.attempts = counting.attempts.saturating_sub(1);
                }
                _ => {}
            }
        }
        settled
    }

    /// Counts the held calls whose wait is over at `now` (all of them when `all`).
    pub(in crate::pipeline) fn release_held(&self, now: Nanos, all: bool, out: &mut Vec<Event>) {
        let mut calls = self.calls();
        let mut outbox = self.outbox(false);
        if !calls.is_empty() {
            let interfaces = self.catalog.current();
            let due = calls.due(now, all);
            let window = self.tracker.reorder_window();
            let mut forced = Vec::new();
            for call in due {
                // Counted as at the end of its wait, not at the sweep's or the scrape's: what
                // its client sent after it is still pending then, and is judged with it
                // (whatever the order, §11), not settled first because the sweep came late.
                let at = match all {
                    true => now,
                    false => call.since.saturating_add(window).min(now),
                };
                let counting = (at, &mut *out);
                let kept = self.count_kept(
                    &mut calls,
                    &interfaces,
                    vec![call],
                    counting,
                    outbox.as_deref_mut(),
                );
                forced.extend(kept);
            }
            self.count_forced(
                &mut calls,
                &interfaces,
                forced,
                (now, out),
                outbox.as_deref_mut(),
            );
            self.held_gauge(&calls);
        }
        // The withheld spans whose wait is over leave with the verdict counted by now.
        drop(calls);
        if let Some(outbox) = outbox.as_deref_mut() {
            outbox.due(now);
            self.outbox_gauges(outbox);
            self.forward_ready(Some(outbox), now);
        }
    }

    pub(super) fn held_gauge(&self, calls: &Calls) {
        self.held
            .store(calls.spans(), std::sync::atomic::Ordering::Relaxed);
        let (spans, bytes) = calls.recent();
        self.metrics
            .set_held(calls.spans() + spans, calls.bytes() + bytes);
    }
}

/// Where the tags of span `i` of the work set go: its slot in the request (none for a span
/// kept from an earlier one).
/// The client of a call (the spans `group`): its first attempt's.
fn call_client<'c>(calls: &call::Calls<'c>, group: &[usize]) -> Option<Client<'c>> {
    group
        .iter()
        .find_map(|&i| calls.attempt(i))
        .map(|a| a.attempt.client)
}

/// Appends the stamp of `client` (a joiner's call's client; none elsewhere) to `buf`.
fn stamp(buf: &mut Vec<u8>, client: Option<Client<'_>>) {
    if let Some(c) = client {
        route::stamp(buf, c.name, c.instance);
    }
}

fn slot(work: &Work<'_>, places: &Places<'_>, i: usize) -> Option<usize> {
    match work.from[i] {
        From::Node(n) => places.slots.get(n).copied().flatten(),
        From::Root(n) => places.root_slots.get(n).copied().flatten(),
        From::Kept { .. } => None,
    }
}

/// Whether the call of the spans `group` has a server span, and whether a part of it may
/// still come after it: a part under a client attempt (§11.1–2), which no HTTP span has.
fn shape(work: &Work<'_>, group: &[usize]) -> (bool, bool) {
    let has_server = group
        .iter()
        .any(|&i| matches!(work.members[i].side, Side::Server(_)));
    let may_grow = group.iter().any(|&i| {
        let m = &work.members[i];
        m.side == Side::Client && m.attempt.family != Family::Http
    });
    (has_server, may_grow)
}

/// Whether the call of the spans `group` has the server's word on what its protocol answered
/// (DESIGN §11.5): a SERVER span of the interface's own protocol — an MCP interface's MCP span,
/// an A2A one's A2A span, a gRPC one's gRPC span; any, for an HTTP interface. Its HTTP spans
/// alone (a gateway's, an ASGI span) do not say it — a tool error is a JSON-RPC answer inside
/// a 200 — so until the protocol span comes the call may still change.
fn answered(work: &Work<'_>, group: &[usize], interfaces: &Interfaces) -> bool {
    group.iter().any(|&i| match work.members[i].side {
        Side::Server(index) => {
            let family = work.members[i].attempt.family;
            match interfaces.get(index).map(|i| i.protocol) {
                Some(Protocol::Mcp) => family == Family::Mcp,
                Some(Protocol::A2a) => family == Family::A2a,
                Some(Protocol::Grpc) => family == Family::Grpc,
                Some(Protocol::Http) | None => true,
            }
        }
        Side::Client => false,
    })
}

/// The call of the spans `group`, held for the parents `open` (since its earliest kept
/// span came, else `now`).
fn held(
    work: &Work<'_>,
    group: &[usize],
    taken: &[Call],
    (open, now): (&[SpanKey], Nanos),
) -> Call {
    let since = group
        .iter()
        .filter_map(|&i| match work.from[i] {
            From::Kept { call, .. } => Some(taken[call].since),
            _ => None,
        })
        .min()
        .unwrap_or(now);
    Call {
        members: group.iter().map(|&i| kept(work, taken, i, false)).collect(),
        state: State::Held {
            open: open.to_vec(),
        },
        since,
    }
}

/// The spans of a call counted whole (`group`) as kept for a late part: its client spans of
/// this request by where they stand in it, the rest (kept from an earlier request) by where
/// they stand among the calls taken out, to be moved when the request is done with them
/// (a span of this request that is no client's, rare, copied whole into such a call);
/// `parts` says which were skipped as `same_call`.
fn recent_members<'g>(
    work: &'g Work<'_>,
    group: &'g [usize],
    taken: &'g [Call],
    places: Places<'g>,
    parts: impl Fn(usize) -> bool + 'g,
) -> impl Iterator<Item = Part> + 'g {
    let at = move |i: usize| match work.from[i] {
        _ if work.members[i].side != Side::Client => None,
        From::Node(n) => places.at.get(n).copied(),
        From::Root(n) => places.root_at.get(n).copied(),
        From::Kept { .. } => None,
    };
    group.iter().map(move |&i| match (at(i), work.from[i]) {
        (Some(at), _) => Part::Here(RecentMember {
            key: work.keys[i],
            parent: work.parents[i],
            at,
            skipped: parts(i),
        }),
        (None, From::Kept { call, member }) => Part::Taken {
            key: work.keys[i],
            call: call as u32,
            member: member as u32,
            skipped: parts(i),
        },
        (None, _) => Part::Whole(Box::new(kept(work, taken, i, parts(i)))),
    })
}

/// Remembers each attempt counted at once whose other side is expected and that no span of
/// the request joined (`known`).
pub(super) fn keep_counted(
    calls: &mut Calls,
    remember: Vec<(SpanKey, Owned, Observation)>,
    known: &HashSet<SpanKey>,
    now: Nanos,
    forced: &mut Vec<(Call, Bound)>,
) {
    for (k, facts, obs) in remember {
        if known.contains(&k) {
            continue;
        }
        let call = Call {
            members: vec![Kept {
                facts,
                side: Side::Client,
                named: false,
                key: k,
                parent: None,
                carrier: None,
                skipped: false,
            }],
            state: State::Counted {
                attempts: vec![obs],
            },
            since: now,
        };
        forced.extend(calls.keep(call));
    }
}

/// Marks the spans whose parent is still to come: not among the spans, not a span the request
/// had, and (for a kept span) still awaited by its call.
pub(super) fn mark_open(
    work: &mut Work<'_>,
    taken: &[Call],
    known: &HashSet<SpanKey>,
    seen: impl Fn(&SpanKey) -> bool,
) {
    for i in 0..work.members.len() {
        let Some(p) = work.parents[i] else { continue };
        if known.contains(&p) || seen(&p) {
            continue;
        }
        work.open[i] = match work.from[i] {
            From::Node(_) => true,
            From::Root(_) => false,
            From::Kept { call, .. } => match &taken[call].state {
                State::Held { open } => open.contains(&p),
                State::Counted { .. } => false,
            },
        };
    }
}

/// Span `i` of the work set, kept: its facts owned (or moved from the call it was kept in).
pub(super) fn kept(work: &Work<'_>, taken: &[Call], i: usize, skipped: bool) -> Kept {
    if let From::Kept { call, member } = work.from[i] {
        let mut k = taken[call].members[member].clone();
        k.skipped |= skipped;
        return k;
    }
    let m = &work.members[i];
    Kept {
        facts: Owned::of(&m.attempt),
        side: m.side,
        named: m.named,
        key: work.keys[i],
        parent: work.parents[i],
        carrier: work.carriers[i],
        skipped,
    }
}
