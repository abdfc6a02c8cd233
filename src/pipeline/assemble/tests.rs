//! Tests of the join's pure parts: cycles of parent ids cut, the calls (sets) the joins make,
//! and which HTTP span's time contains which protocol span's, against the plain reading of both.

use super::carriers::{contained, containing};
use super::work::cut_cycles;
use crate::extract::call::{Joined, Link};
use crate::tracker::Nanos;
use proptest::prelude::*;

/// Spans `0..n` with the parents `parents` names (`None`: a root), each joined as nested.
fn joined(parents: &[Option<usize>]) -> Vec<Joined> {
    parents
        .iter()
        .map(|p| Joined {
            parent: p.map(|p| (p, Link::Nested)),
            carrier: None,
        })
        .collect()
}

fn parents(joined: &[Joined]) -> Vec<Option<usize>> {
    joined.iter().map(|j| j.parent.map(|(p, _)| p)).collect()
}

#[test]
fn a_cycle_is_cut_above_its_earliest_span_and_nothing_else_is_touched() {
    // 0 → 1 → 2 → 0, a ring; 3 under 1, a tail into it; 4 → 5 → 4 another; 6 a root.
    let mut j = joined(&[Some(1), Some(2), Some(0), Some(1), Some(5), Some(4), None]);
    // The earliest to start: 2 in the first ring, 5 in the second.
    let start = [30, 20, 10, 0, 50, 40, 0];
    assert_eq!(cut_cycles(&mut j, |i| start[i]), 2);
    assert_eq!(
        parents(&j),
        [Some(1), Some(2), None, Some(1), Some(5), None, None]
    );
    // A span that names itself.
    let mut j = joined(&[Some(0), None]);
    assert_eq!(cut_cycles(&mut j, |i| i), 1);
    assert_eq!(parents(&j), [None, None]);
    // No cycle, nothing cut: a chain and a star.
    let mut j = joined(&[None, Some(0), Some(1), Some(0), Some(0)]);
    assert_eq!(cut_cycles(&mut j, |i| i), 0);
    assert_eq!(parents(&j), [None, Some(0), Some(1), Some(0), Some(0)]);
}

proptest! {
    #[test]
    fn after_the_cut_every_span_reaches_a_root_and_only_cycles_lost_a_parent(
        raw in proptest::collection::vec(proptest::option::of(0usize..12), 1..12),
    ) {
        let n = raw.len();
        let before: Vec<Option<usize>> = raw.iter().map(|p| p.map(|p| p % n)).collect();
        let mut j = joined(&before);
        let cut = cut_cycles(&mut j, |i| i);
        let after = parents(&j);
        // Every walk up ends at a root within n steps.
        for i in 0..n {
            let mut at = i;
            let mut steps = 0;
            while let Some(p) = after[at] {
                at = p;
                steps += 1;
                prop_assert!(steps <= n, "span {i} still loops: {after:?}");
            }
        }
        // Each cut span was on a cycle before: walking up from it came back to it.
        let on_cycle = |i: usize| {
            let mut at = before[i];
            for _ in 0..n {
                match at {
                    Some(p) if p == i => return true,
                    Some(p) => at = before[p],
                    None => return false,
                }
            }
            false
        };
        let lost: Vec<usize> = (0..n).filter(|&i| before[i] != after[i]).collect();
        prop_assert_eq!(lost.len(), cut);
        for &i in &lost {
            prop_assert!(on_cycle(i), "{i} lost its parent but was on no cycle");
            prop_assert_eq!(after[i], None);
        }
    }

    #[test]
    fn the_sweeps_count_containment_as_the_plain_reading_does(
        outer in proptest::collection::vec((0u64..40, 0u64..40), 0..12),
        inner in proptest::collection::vec((0u64..40, 0u64..40), 0..12),
    ) {
        // Spans 0..m are the outer ones, m.. the inner ones; each (start, start + length).
        let times: Vec<(Nanos, Nanos)> = outer.iter().chain(&inner).map(|&(s, l)| (s, s + l)).collect();
        let span = |i: usize| times[i];
        let outer: Vec<usize> = (0..outer.len()).collect();
        let inner: Vec<usize> = (outer.len()..times.len()).collect();
        let contains = |h: usize, i: usize| span(h).0 <= span(i).0 && span(i).1 <= span(h).1;
        let around = containing(&outer, &inner, span);
        for (k, &i) in inner.iter().enumerate() {
            let plain: Vec<usize> = (0..outer.len()).filter(|&p| contains(outer[p], i)).collect();
            prop_assert_eq!(around[k].0, plain.len());
            let one = (plain.len() == 1).then(|| plain[0]);
            prop_assert_eq!(around[k].1, one);
        }
        let inside = contained(&outer, &inner, span);
        for (p, &h) in outer.iter().enumerate() {
            prop_assert_eq!(inside[p], inner.iter().filter(|&&i| contains(h, i)).count());
        }
    }
}

#[test]
fn sets_come_out_in_the_order_of_their_first_index_each_in_index_order() {
    use super::work::Sets;
    let mut sets = Sets::new(8);
    // {0, 5, 6}: joined so that 6's root, not 0, leads the set; {1, 3}; {2}; {4, 7}.
    sets.join(6, 5);
    sets.join(6, 0);
    sets.join(3, 1);
    sets.join(7, 4);
    let groups = sets.groups();
    let got: Vec<Vec<usize>> = groups.iter().map(<[usize]>::to_vec).collect();
    assert_eq!(got, [vec![0, 5, 6], vec![1, 3], vec![2], vec![4, 7]]);
    assert_eq!(groups.ends, [3, 5, 6, 8]);
    assert_eq!(Sets::new(0).groups().iter().count(), 0);
}

#[test]
fn a_carrier_is_only_a_span_that_carries_by_the_rules_of_the_call() {
    use super::work::{From, Work};
    use crate::extract::call::{sample, Member, Side};
    use crate::extract::{Client, Family};
    let agent = Client {
        name: "agent",
        instance: None,
    };
    let span = |family: Family, side: Side| Member {
        attempt: sample(family, agent, "tools/call", "lookup"),
        side,
        named: false,
    };
    let key = |id: u8| ([1; 16], [id; 8]);
    // A protocol server span whose carrier's key names, in turn, the observed interface's
    // HTTP server span (it carries it) and an HTTP client span (a key reused: it does not).
    for (carrier_side, carried) in [(Side::Server(0), true), (Side::Client, false)] {
        let mut work = Work::with_capacity(2);
        work.push(
            span(Family::Mcp, Side::Server(0)),
            key(1),
            None,
            From::Node(0),
        );
        work.push(
            span(Family::Http, carrier_side),
            key(2),
            None,
            From::Node(1),
        );
        work.carriers[0] = Some(key(2));
        let (joined, groups, _) = work.calls();
        assert_eq!(joined[0].carrier.is_some(), carried, "{carrier_side:?}");
        assert_eq!(groups.iter().count(), if carried { 1 } else { 2 });
    }
}

#[test]
fn a_protocol_client_span_under_a_span_that_is_no_attempt_is_wrapped_by_the_one_around_it() {
    // DESIGN §12.5: an INTERNAL `execute_tool` span with MCP attributes, a framework's span
    // (no attempt, not here) and the SDK's CLIENT span under that.
    use super::joins::NodeMeta;
    use crate::extract::call::{sample, Member, Side};
    use crate::extract::{Attempt, Client, Family};
    use crate::pipeline::calls::{key, At};
    let agent = Client {
        name: "agent",
        instance: None,
    };
    let other = Client {
        name: "other",
        instance: None,
    };
    let member = |client, target, (start, end): (u64, u64)| Member {
        attempt: Attempt {
            start,
            end,
            ..sample(Family::Mcp, client, "tools/call", target)
        },
        side: Side::Client,
        named: false,
    };
    let node = |id: u8, parent: Option<u8>| NodeMeta {
        key: key(&[1; 16], &[id; 8]),
        parent: parent.map(|p| key(&[1; 16], &[p; 8])),
        carrier: None,
        slot: None,
        at: At::default(),
    };
    let wrapped = |members: &[Member<'static>]| {
        // 0 wraps the others; each of them names span 9 (no attempt) as its parent.
        let mut nodes: Vec<NodeMeta> = (0..members.len() as u8)
            .map(|i| node(i, (i > 0).then_some(9)))
            .collect();
        super::wrappers(members, &mut nodes);
        nodes
            .iter()
            .map(|n| n.carrier.map(|k| k.1[0]))
            .collect::<Vec<_>>()
    };
    let outer = member(agent, "weather", (100, 200));
    assert_eq!(
        wrapped(&[outer.clone(), member(agent, "weather", (110, 150))]),
        [None, Some(0)]
    );
    for (why, inner) in [
        ("another tool", member(agent, "lookup", (110, 150))),
        ("another client", member(other, "weather", (110, 150))),
        ("not inside it", member(agent, "weather", (150, 250))),
    ] {
        assert_eq!(wrapped(&[outer.clone(), inner]), [None, None], "{why}");
    }
    // Of two around it, the nearer (the later to start).
    let near = member(agent, "weather", (105, 180));
    let mut nodes = vec![node(0, None), node(1, None), node(2, Some(9))];
    super::wrappers(
        &[outer, near, member(agent, "weather", (110, 150))],
        &mut nodes,
    );
    assert_eq!(nodes[2].carrier, Some(key(&[1; 16], &[1; 8])));
}

/// A request body of `n` spans under one resource and one scope, as the wire carries it.
fn body_of(n: usize) -> Vec<u8> {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans: vec![Span::default(); n],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}

/// A node of span `id` naming `parent`.
fn node(id: u8, parent: Option<u8>) -> super::joins::Node<'static> {
    use crate::extract::call::{sample, Member, Side};
    use crate::extract::{Client, Family};
    let key = |id: u8| ([id; 16], [id; 8]);
    super::joins::Node {
        member: Member {
            attempt: sample(
                Family::Mcp,
                Client {
                    name: "agent",
                    instance: None,
                },
                "tools/call",
                "search",
            ),
            side: Side::Client,
            named: false,
        },
        key: key(id),
        parent: parent.map(key),
        carrier: None,
        slot: None,
        at: Default::default(),
    }
}

#[test]
fn a_request_awaits_exactly_the_parents_its_nodes_name() {
    let body = body_of(3);
    let mut joins = super::joins::Joins {
        body: &body,
        ..Default::default()
    };
    assert!(joins.is_empty(), "nothing read, nothing to join");
    assert!(!joins.awaits(&([2; 16], [2; 8])), "no node yet");
    joins.node(node(1, Some(2)));
    assert!(!joins.is_empty());
    assert!(joins.awaits(&([2; 16], [2; 8])), "its parent");
    assert!(!joins.awaits(&([3; 16], [3; 8])), "another span");
    assert!(!joins.awaits(&([1; 16], [1; 8])), "the node itself");
}

#[test]
fn the_first_node_makes_room_for_the_requests_spans_and_half_as_many_again() {
    for (spans, room) in [(200, 300), (10, super::joins::ROOM), (10_000, 4_096)] {
        let body = body_of(spans);
        let mut joins = super::joins::Joins {
            body: &body,
            ..Default::default()
        };
        joins.node(node(1, None));
        assert_eq!(joins.nodes.capacity(), room, "{spans} spans");
        assert_eq!(joins.members.capacity(), room, "{spans} spans");
    }
}

#[test]
fn spans_before_the_first_node_are_counted_not_recorded() {
    let mut joins = super::joins::Joins::default();
    joins.seen(([1; 16], [1; 8]), None);
    joins.seen(([2; 16], [2; 8]), None);
    joins.seen(([3; 16], [3; 8]), None);
    assert_eq!(joins.unrecorded, 3);
    assert!(joins.seen.is_empty() && joins.is_empty());
    joins.recording = true;
    joins.seen(([4; 16], [4; 8]), None);
    assert_eq!((joins.unrecorded, joins.seen.len()), (3, 1));
    assert!(
        !joins.is_empty(),
        "a span seen is something to join against"
    );
}

/// A span of `family` on `side` from `start` to `end`, operation `verb target`, as a member
/// and its node (span `id`, naming `parent`).
fn spanned(
    (family, side): (crate::extract::Family, crate::extract::call::Side),
    (verb, target): (&'static str, &'static str),
    (start, end): (Nanos, Nanos),
    (id, parent): (u8, Option<u8>),
) -> (crate::extract::call::Member<'static>, super::NodeMeta) {
    let mut n = node(id, parent);
    n.member.attempt = crate::extract::Attempt {
        start,
        end,
        ..crate::extract::call::sample(family, n.member.attempt.client, verb, target)
    };
    n.member.side = side;
    let meta = super::NodeMeta {
        key: n.key,
        parent: n.parent,
        carrier: None,
        slot: None,
        at: n.at,
    };
    (n.member, meta)
}

#[test]
fn an_http_span_is_no_orphan_to_carry_and_does_not_crowd_the_protocol_span_out() {
    use crate::extract::call::Side;
    use crate::extract::Family;
    let server = Side::Server(0);
    // An HTTP server span, a protocol server span inside it that names no parent, and
    // another HTTP server span inside it too (a request of its own, not a protocol span).
    let (members, mut nodes): (Vec<_>, Vec<_>) = [
        spanned(
            (Family::Http, server),
            ("POST", "/mcp"),
            (0, 100),
            (1, None),
        ),
        spanned(
            (Family::Mcp, server),
            ("tools/call", "search"),
            (10, 90),
            (2, None),
        ),
        spanned(
            (Family::Http, server),
            ("GET", "/health"),
            (20, 30),
            (3, None),
        ),
    ]
    .into_iter()
    .unzip();
    super::carriers::carriers(&members, &mut nodes);
    let carriers: Vec<_> = nodes.iter().map(|n| n.carrier).collect();
    assert_eq!(carriers, [None, Some(([1; 16], [1; 8])), None]);
}

#[test]
fn only_a_protocol_client_span_is_wrapped() {
    use crate::extract::call::Side;
    use crate::extract::Family;
    // Two HTTP CLIENT spans of one trace and operation, one inside the other, the inner one
    // naming a parent the request does not have: HTTP spans are not wrapped (§12.5).
    let http = |span, ids| spanned((Family::Http, Side::Client), ("POST", "/mcp"), span, ids);
    let mcp = |span, ids| spanned((Family::Mcp, Side::Client), ("tools/call", "x"), span, ids);
    let (mut members, mut nodes): (Vec<_>, Vec<_>) = [
        http((0, 100), (1, None)),
        http((10, 90), (2, Some(9))),
        // The same with protocol spans: the inner one is wrapped.
        mcp((0, 100), (3, None)),
        mcp((10, 90), (4, Some(9))),
        // One whose parent the request has is joined to it, not wrapped.
        mcp((20, 80), (5, Some(3))),
    ]
    .into_iter()
    .unzip();
    // And one given its carrier already (an HTTP span's, by time) keeps it.
    let (member, mut meta) = mcp((30, 70), (6, Some(9)));
    meta.carrier = Some(([7; 16], [7; 8]));
    members.push(member);
    nodes.push(meta);
    super::carriers::wrappers(&members, &mut nodes);
    let carriers: Vec<_> = nodes.iter().map(|n| n.carrier).collect();
    let wrapped = Some(([3; 16], [3; 8]));
    let kept = Some(([7; 16], [7; 8]));
    assert_eq!(carriers, [None, None, None, wrapped, None, kept]);
}
