//! Tests of the kept calls: found by their spans and the parents they wait for, waits over
//! by the clock, and both bounds.

use super::*;
use crate::extract::{Attempt, Client, Family, Operation, Signal};

fn fact(span: u8) -> Owned {
    Owned::of(&Attempt {
        client: Client {
            name: "agent",
            instance: None,
        },
        family: Family::Http,
        origin: None,
        path: Some("/x"),
        http_method: Some("GET"),
        operation: Operation::new("GET", "/x", false),
        signal: Signal::default(),
        tagged: false,
        start: 0,
        end: 1,
        trace_id: &[1; 16],
        span_id: &[span; 8],
        parent_span_id: &[],
        request: Default::default(),
    })
}

fn span(id: u8) -> SpanKey {
    key(&[1; 16], &[id; 8])
}

fn kept(id: u8, parent: Option<u8>) -> Kept {
    Kept {
        facts: fact(id),
        side: Side::Client,
        named: false,
        key: span(id),
        parent: parent.map(span),
        carrier: None,
        skipped: false,
    }
}

/// A held call of span `id`, waiting for `parent`, since `since`.
fn held(id: u8, parent: u8, since: Nanos) -> Call {
    Call {
        members: vec![kept(id, Some(parent))],
        state: State::Held {
            open: vec![span(parent)],
        },
        since,
    }
}

fn counted(id: u8, since: Nanos) -> Call {
    Call {
        members: vec![kept(id, None)],
        state: State::Counted {
            attempts: Vec::new(),
        },
        since,
    }
}

fn ids(call: &Call) -> Vec<u8> {
    let mut ids: Vec<u8> = call.members.iter().map(|m| m.key.1[0]).collect();
    ids.sort_unstable();
    ids
}

const BIG: usize = 1 << 30;

#[test]
fn a_kept_call_is_found_by_its_spans_and_by_the_parent_it_waits_for() {
    let mut calls = Calls::new(5, 100, BIG);
    assert!(calls.keep(held(2, 1, 0)).is_empty());
    assert!(calls.keep(counted(7, 0)).is_empty());
    assert!(calls.holds(&span(2)) && calls.holds(&span(7)));
    assert!(!calls.holds(&span(1)), "a parent waited for is not kept");
    assert_eq!((calls.spans(), calls.held()), (2, 1));
    assert!(calls.any_awaiting());
    let taken = calls.take_awaiting(&span(1)).expect("waits for 1");
    assert_eq!(ids(&taken), [2]);
    assert!(!calls.holds(&span(2)) && !calls.any_awaiting());
    assert_eq!(
        calls
            .take_member(&span(7), |_, _| None, recount)
            .map(|c| ids(&c)),
        Some(vec![7])
    );
    assert!(calls.is_empty());
    assert_eq!((calls.spans(), calls.bytes()), (0, 0));
}

#[test]
fn siblings_waiting_for_the_same_parent_are_kept_as_one() {
    let mut calls = Calls::new(5, 100, BIG);
    calls.keep(held(2, 1, 3));
    calls.keep(held(3, 1, 1));
    let both = calls
        .take_member(&span(2), |_, _| None, recount)
        .expect("kept");
    assert_eq!(ids(&both), [2, 3]);
    assert_eq!(both.since, 1, "the earlier arrival");
    assert!(calls.is_empty());
}

#[test]
fn held_calls_are_due_after_the_window_and_counted_ones_are_forgotten_after_a_minute() {
    let mut calls = Calls::new(5, 100, BIG);
    calls.keep(counted(9, 0));
    calls.keep(held(2, 1, 1));
    calls.keep(held(4, 3, 3));
    assert!(calls.due(5, false).is_empty());
    // A counted call before them does not hold them up.
    let due: Vec<Vec<u8>> = calls.due(6, false).iter().map(ids).collect();
    assert_eq!(due, [vec![2]]);
    assert!(calls.holds(&span(9)));
    let minute = 60 * crate::clock::SECOND;
    assert_eq!(calls.due(minute - 1, false).len(), 1, "held 4");
    assert!(calls.holds(&span(9)), "still remembered");
    assert!(
        calls.due(minute, false).is_empty(),
        "forgotten, not counted"
    );
    assert!(calls.is_empty());
    calls.keep(held(2, 1, 100));
    calls.keep(counted(9, 100));
    let all = calls.due(100, true);
    assert_eq!(all.iter().map(ids).collect::<Vec<_>>(), [vec![2]]);
    assert!(calls.holds(&span(9)), "all held ones, not the remembered");
}

#[test]
fn past_a_bound_the_oldest_call_goes_a_held_one_to_be_counted() {
    let mut calls = Calls::new(5, 2, BIG);
    assert!(calls.keep(counted(9, 0)).is_empty());
    assert!(calls.keep(held(2, 1, 1)).is_empty());
    // The counted call is the oldest: forgotten, nothing to count.
    assert!(calls.keep(held(4, 3, 2)).is_empty());
    assert!(!calls.holds(&span(9)));
    let forced = calls.keep(held(6, 5, 3));
    assert_eq!(forced.len(), 1);
    assert_eq!((ids(&forced[0].0), forced[0].1), (vec![2], Bound::Spans));
    assert_eq!(calls.spans(), 2);
    // Bytes: room for two calls of one span.
    let one = held(2, 1, 0).bytes();
    let mut calls = Calls::new(5, 100, 2 * one + one / 2);
    assert!(calls.keep(held(2, 1, 0)).is_empty());
    assert!(calls.keep(held(4, 3, 1)).is_empty());
    let forced = calls.keep(held(6, 5, 2));
    assert_eq!((ids(&forced[0].0), forced[0].1), (vec![2], Bound::Bytes));
    assert!(calls.bytes() <= 2 * one + one / 2);
}

#[test]
fn with_no_room_nothing_is_kept_and_a_held_call_is_counted_at_once() {
    let mut calls = Calls::new(5, 0, BIG);
    let forced = calls.keep(held(2, 1, 0));
    assert_eq!((ids(&forced[0].0), forced[0].1), (vec![2], Bound::Spans));
    assert!(calls.keep(counted(9, 0)).is_empty());
    assert!(calls.is_empty());
}

#[test]
fn two_bags_merged_keep_every_span_and_every_parent_waited_for() {
    let merged = merge(held(2, 1, 4), held(3, 5, 2));
    assert_eq!(merged.since, 2);
    assert_eq!(ids(&merged), [2, 3]);
    assert_eq!(
        merged.state,
        State::Held {
            open: vec![span(1), span(5)]
        }
    );
    let counted_wins = merge(held(2, 1, 0), counted(3, 0));
    assert!(!counted_wins.is_held());
}

#[test]
fn a_calls_memory_is_itself_what_it_waits_for_and_its_spans_strings() {
    let path = "/x".repeat(5_000);
    let mut call = held(2, 1, 0);
    call.members[0].facts = Owned::of(&Attempt {
        path: Some(&path),
        ..call.members[0].facts.attempt()
    });
    let strings = call.members[0].facts.heap_bytes();
    assert!(strings >= 10_000);
    let key = std::mem::size_of::<SpanKey>();
    let base = std::mem::size_of::<Call>() + std::mem::size_of::<Kept>() + strings;
    assert_eq!(call.bytes(), base + key, "waiting for one parent");
    let counted = Call {
        state: State::Counted {
            attempts: vec![observed(0); 2],
        },
        ..call
    };
    let observation = std::mem::size_of::<Observation>();
    assert_eq!(
        counted.bytes(),
        base + 2 * observation,
        "counted as two attempts"
    );
    let mut calls = Calls::new(5, 100, BIG);
    calls.keep(counted);
    assert_eq!(calls.bytes(), base + 2 * observation);
}

#[test]
fn a_sibling_joins_its_held_call_in_place_and_its_memory_is_counted_as_if_kept_anew() {
    let mut calls = Calls::new(5, 1_000, BIG);
    // 2 waits for 1; 3 for 1 and 7: one call, waiting for both.
    calls.keep(held(2, 1, 1));
    let mut three = held(3, 1, 2);
    if let State::Held { open } = &mut three.state {
        open.push(span(7));
    }
    assert!(calls.keep(three).is_empty());
    // 4 waits for 7 only: found by it, and the call waits for 7 once.
    calls.keep(held(4, 7, 3));
    assert_eq!(calls.spans(), 3);
    let whole = calls.take_awaiting(&span(7)).expect("one call");
    assert_eq!(ids(&whole), [2, 3, 4]);
    assert_eq!(whole.since, 1);
    assert_eq!(
        whole.state,
        State::Held {
            open: vec![span(1), span(7)]
        }
    );
    assert!(calls.is_empty() && !calls.any_awaiting());
    assert_eq!(
        (calls.spans(), calls.bytes()),
        (0, 0),
        "what was added went"
    );
    // Kept again, then joined one by one: the bytes as if the whole were kept at once.
    let at_once = whole.bytes();
    calls.keep(held(2, 1, 1));
    calls.keep(held(3, 1, 2));
    calls.keep(held(4, 1, 3));
    let one_by_one = calls.bytes();
    let whole = calls.take_awaiting(&span(1)).expect("one call");
    assert_eq!(one_by_one, whole.bytes());
    assert!(at_once > one_by_one, "7 no longer waited for");
}

#[test]
fn an_older_sibling_makes_the_call_older_and_it_is_due_by_the_older() {
    let mut calls = Calls::new(5, 100, BIG);
    calls.keep(held(2, 1, 3));
    calls.keep(held(3, 1, 1));
    let due: Vec<Vec<u8>> = calls.due(6, false).iter().map(ids).collect();
    assert_eq!(due, [vec![2, 3]], "due at 1 + 5, not 3 + 5");
}

#[test]
fn a_counted_call_forgotten_past_a_bound_is_known_as_counted_for_a_minute() {
    let mut calls = Calls::new(5, 1, BIG);
    calls.keep(counted(9, 0));
    assert!(!calls.was_counted(&span(9)), "still kept");
    calls.keep(counted(8, 1));
    assert!(calls.was_counted(&span(9)), "forgotten past the bound");
    assert!(!calls.was_counted(&span(8)));
    let minute = 60 * crate::clock::SECOND;
    calls.due(minute - 1, false);
    assert!(calls.was_counted(&span(9)));
    calls.due(minute, false);
    assert!(
        !calls.was_counted(&span(9)),
        "no longer than it would have been kept"
    );
    // At most four times the bound (here 1): the oldest go first.
    for id in 10..16 {
        calls.counted_gone(span(id), minute);
    }
    assert!(!calls.was_counted(&span(11)) && calls.was_counted(&span(12)));
    assert!(calls.was_counted(&span(15)));
    // Forgotten by time, never known as counted.
    let mut calls = Calls::new(5, 10, BIG);
    calls.keep(counted(9, 0));
    calls.due(minute, false);
    assert!(!calls.was_counted(&span(9)));
}

/// What attempt `n` was counted as (told apart by its operation).
fn observed(n: u64) -> Observation {
    Observation {
        group: crate::tracker::GroupId {
            client: 0,
            interface: 0,
        },
        operation: n,
        labels: 0,
        start: 0,
        end: 0,
        outcome: crate::classify::Outcome::Ok,
        declared: crate::discovery::Declared::Unknown,
        discovery: crate::extract::Discovery::None,
        retry_after: None,
        anonymous: false,
        asked: Default::default(),
        testimony: Default::default(),
        trace_id: [0; 16],
        span_id: [0; 8],
    }
}

/// Span `id` of a request, standing at `id` in it, under `parent`.
fn recent_member(id: u8, parent: Option<u8>) -> RecentMember {
    RecentMember {
        key: span(id),
        parent: parent.map(span),
        at: At {
            resource: (0, 0),
            span: (u32::from(id), 1),
        },
        skipped: parent.is_some(),
    }
}

/// Reads span `id` back as the byte it stands on in its request.
fn read_back(body: &[u8], at: At) -> Option<Owned> {
    let (_, span) = at.read(body)?;
    Some(fact(span[0]))
}

/// A root's attempt made again from its facts: [`observed`] of its span's number.
fn recount(facts: &Owned) -> Observation {
    observed(u64::from(facts.attempt().span_id[0]))
}

/// A request whose byte `i` is `i`: each span reads back as itself.
fn request() -> Vec<u8> {
    (0..=255).collect()
}

#[test]
fn a_call_kept_for_a_late_part_is_found_by_any_of_its_spans_once_and_read_again() {
    let mut calls = Calls::new(5, 100, BIG);
    let mut batch = calls.recent_batch();
    batch.root(span(1), recent_member(1, None).at);
    // Span 4 came in an earlier request: it is in a call the request took out, moved from
    // there when the batch is kept.
    let mut taken = vec![Call {
        members: vec![kept(9, None), kept(4, Some(3))],
        state: State::Held {
            open: vec![span(3)],
        },
        since: 8,
    }];
    batch.call(
        [
            Part::Here(recent_member(2, None)),
            Part::Here(recent_member(3, Some(2))),
            Part::Taken {
                key: span(4),
                call: 0,
                member: 1,
                skipped: false,
            },
        ],
        &[observed(2)],
    );
    calls.keep_recent((&request(), None), (batch, &mut taken), 10);
    assert_eq!(
        taken[0].members[1].facts.heap_bytes(),
        0,
        "moved, not copied"
    );
    assert_eq!(
        taken[0].members[0],
        kept(9, None),
        "the others left as they were"
    );
    assert_eq!(calls.recent().0, 4);
    let call = calls
        .take_member(&span(4), read_back, recount)
        .expect("kept");
    assert_eq!(
        ids(&call),
        vec![2, 3, 4],
        "found by a span kept from an earlier request too"
    );
    assert_eq!(call.members[2], kept(4, Some(3)));
    assert_eq!(
        call.members[0].facts,
        fact(2),
        "read again from the request"
    );
    assert_eq!(call.members[1].parent, Some(span(2)));
    assert!(call.members[1].skipped && !call.members[0].skipped);
    assert_eq!(call.since, 10);
    assert_eq!(
        call.state,
        State::Counted {
            attempts: vec![observed(2)]
        }
    );
    assert!(
        calls.take_member(&span(2), read_back, recount).is_none(),
        "taken once"
    );
    assert!(
        calls.take_member(&span(4), read_back, recount).is_none(),
        "never kept"
    );
    let call = calls
        .take_member(&span(1), read_back, recount)
        .expect("kept");
    assert_eq!(ids(&call), vec![1]);
    assert_eq!(call.members[0].parent, None);
    assert_eq!(
        call.state,
        State::Counted {
            attempts: vec![observed(1)]
        }
    );
}

#[test]
fn a_call_kept_for_a_late_part_is_forgotten_after_the_window_or_past_a_bound() {
    let mut calls = Calls::new(5, 2, BIG);
    for (id, at) in [(1, 10), (2, 12)] {
        let mut batch = calls.recent_batch();
        batch.call([Part::Here(recent_member(id, None))], &[observed(1)]);
        calls.keep_recent((&request(), None), (batch, &mut []), at);
    }
    calls.due(15, false);
    assert!(
        calls.take_member(&span(1), read_back, recount).is_none(),
        "its window over"
    );
    assert!(
        calls.take_member(&span(2), read_back, recount).is_some(),
        "within it"
    );
    // Two spans at most: a third request's call pushes out the oldest.
    for id in [3, 4, 5] {
        let mut batch = calls.recent_batch();
        batch.call([Part::Here(recent_member(id, None))], &[observed(1)]);
        calls.keep_recent((&request(), None), (batch, &mut []), 16);
    }
    assert_eq!(calls.recent().0, 2);
    assert!(
        calls.take_member(&span(3), read_back, recount).is_none(),
        "pushed out"
    );
    assert!(calls.take_member(&span(5), read_back, recount).is_some());
    // Bytes: the request's own count.
    let mut calls = Calls::new(5, 100, 700);
    for id in [6, 7] {
        let mut batch = calls.recent_batch();
        batch.call([Part::Here(recent_member(id, None))], &[observed(1)]);
        calls.keep_recent((&request(), None), (batch, &mut []), 16);
    }
    assert!(
        calls.take_member(&span(6), read_back, recount).is_none(),
        "256 bytes each, and what is kept of the call"
    );
    assert!(calls.take_member(&span(7), read_back, recount).is_some());
    assert!(calls.recent().1 >= 256);
}

#[test]
fn a_kept_request_held_by_reference_counts_the_buffer_it_keeps_and_a_small_one_is_copied() {
    let keep_with = |body: &bytes::Bytes, owner: Option<Owner<'_>>| {
        let mut calls = Calls::new(5, 100, BIG);
        let mut batch = calls.recent_batch();
        batch.call([Part::Here(recent_member(1, None))], &[observed(1)]);
        calls.keep_recent((body, owner), (batch, &mut []), 10);
        (calls.recent().1, calls.recent.newest().map(|b| b.as_ptr()))
    };
    let body = bytes::Bytes::from(request());
    // What is kept of the call beside its request's bytes.
    let call = keep_with(&body, None).0 - body.len();
    let keep = |body: &bytes::Bytes, allocated: usize| {
        let owner = Owner {
            bytes: body,
            allocated,
        };
        let (bytes, held) = keep_with(body, Some(owner));
        (bytes - call, held == Some(body.as_ptr()))
    };
    // A buffer of up to eight times the body: held where it is, all of it counted.
    assert_eq!(keep(&body, 2048), (2048, true));
    assert_eq!(keep(&body, 2055), (2055, true));
    // One larger, or of a size not known: the body copied, its length counted.
    assert_eq!(keep(&body, 2056), (256, false));
    assert_eq!(keep(&body, usize::MAX), (256, false));
    // A buffer reported smaller than the body counts the body.
    assert_eq!(keep(&body, 10), (256, true));
    // A body that is not the owner's own is copied, its length counted.
    let other = bytes::Bytes::from(request());
    let owner = Owner {
        bytes: &other,
        allocated: 256,
    };
    let (bytes, held) = keep_with(&body, Some(owner));
    assert_eq!(bytes, 256 + call);
    assert!(held != Some(body.as_ptr()) && held != Some(other.as_ptr()));
}

#[test]
fn a_request_that_leaves_no_call_to_keep_keeps_nothing_not_even_its_bytes() {
    let mut calls = Calls::new(5, 100, BIG);
    let batch = calls.recent_batch();
    calls.keep_recent((&request(), None), (batch, &mut []), 10);
    assert_eq!(calls.recent(), (0, 0));
    assert!(calls.recent.newest().is_none());
}

#[test]
fn a_call_joined_since_is_not_kept_and_settled_ones_leave_their_ids() {
    let mut calls = Calls::new(5, 100, BIG);
    let mut batch = calls.recent_batch();
    batch.call([Part::Here(recent_member(1, None))], &[observed(1)]);
    batch.call([Part::Here(recent_member(2, None))], &[observed(2)]);
    batch.drop_joined(|k| *k == span(1));
    calls.keep_recent((&request(), None), (batch, &mut []), 10);
    assert!(
        calls.take_member(&span(1), read_back, recount).is_none(),
        "joined since"
    );
    let mut batch = calls.recent_batch();
    batch.call([Part::Here(recent_member(3, None))], &[observed(3)]);
    calls.keep_recent((&request(), None), (batch, &mut []), 11);
    assert!(calls.take_member(&span(3), read_back, recount).is_some());
    calls.recent_settled();
    assert_eq!(calls.recent(), (0, 0));
    assert!(calls.take_member(&span(2), read_back, recount).is_none());
    assert!(
        calls.was_counted(&span(2)),
        "kept but not taken: its ids stay"
    );
    assert!(
        !calls.was_counted(&span(3)),
        "taken: counted again with its part"
    );
    // Nothing kept when nothing may be held.
    let mut calls = Calls::new(5, 0, BIG);
    let mut batch = calls.recent_batch();
    batch.call([Part::Here(recent_member(4, None))], &[observed(4)]);
    calls.keep_recent((&request(), None), (batch, &mut []), 10);
    assert!(calls.take_member(&span(4), read_back, recount).is_none());
}

#[test]
fn where_a_span_stands_reads_back_only_within_its_request() {
    let body = request();
    let at = At::of(&body, &body[4..20], &body[8..10]);
    assert_eq!(
        at,
        At {
            resource: (4, 16),
            span: (8, 2)
        }
    );
    assert_eq!(at.read(&body), Some((&body[4..20], &body[8..10])));
    assert_eq!(at.read(&body[..9]), None, "past its end");
}
