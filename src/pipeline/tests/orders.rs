//! The property of DESIGN §11: within the reorder window, the spans of generated call trees
//! give the same counters whatever order they arrive in and however they are split across
//! exports. Each tree is a protocol CLIENT span (MCP `tools/call` or A2A `SendMessage`, naming
//! its server or not, failed by a JSON-RPC code — a number or words — or a timeout, or not),
//! maybe a framework's
//! span around it (nested, §11.2), its transport requests (none to three, retried, §11.1) and,
//! on the observed interface, the server's span (§11.3); one to three such calls by one client.
//! And the property of §11.5 on the same trees: forwarded, every span leaves exactly once, and
//! every tagged span with the verdict `/metrics` counts for its call, a shutdown included.

use super::*;
use crate::otlp::fixtures::{i as int, s as kv};
use proptest::prelude::*;

const CLIENT: &str = "agent";
const SERVER: &str = "weather-server";

/// Span times start here, a call a second apart.
const T0: u64 = crate::workload::T0;
const MS: u64 = 1_000_000;

/// One generated call.
#[derive(Debug, Clone)]
struct Tree {
    /// A2A `SendMessage`, else MCP `tools/call`.
    a2a: bool,
    /// On the observed interface (MCP only), else a server nobody observes.
    observed: bool,
    /// The protocol span names its server (`url.full`).
    named: bool,
    /// The protocol span's JSON-RPC code, if it failed by one.
    code: Option<i64>,
    /// It timed out (`error.type`).
    timeout: bool,
    /// Its codes are in words (the status message, §11.4), not numbers.
    words: bool,
    /// A span around it of the same operation (the SDK's span, inner), with its own code.
    inner: Option<Option<i64>>,
    /// Its transport requests' HTTP statuses, in order.
    requests: Vec<i64>,
    /// The server's span (observed only): whether it says the tool failed.
    server: Option<bool>,
}

fn tree() -> impl Strategy<Value = Tree> {
    let code = prop::option::of(prop::sample::select(vec![-32601_i64, -32602, -32603]));
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        code.clone(),
        (prop::bool::weighted(0.2), any::<bool>()),
        prop::option::of(code),
        prop::collection::vec(prop::sample::select(vec![200_i64, 404, 429, 503]), 0..=3),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(a2a, observed, named, code, (timeout, words), inner, requests, server)| {
                let observed = observed && !a2a;
                Tree {
                    a2a,
                    observed,
                    named,
                    code,
                    timeout,
                    words,
                    inner,
                    requests,
                    server: server.filter(|_| observed),
                }
            },
        )
}

/// The spans of call `n` (its trace), each with the service that sent it.
fn spans(n: u8, t: &Tree) -> Vec<(&'static str, Span)> {
    let at = T0 + u64::from(n) * 1_000 * MS;
    let origin = match (t.a2a, t.observed) {
        (true, _) => "http://agent.test:9000/a2a",
        (false, true) => "http://mcp.test:8080/mcp",
        (false, false) => "http://tools.test:8080/mcp",
    };
    let span = |id: u8, parent: u8, kind: i32, (start, end): (u64, u64), attributes| Span {
        name: "span".into(),
        kind,
        trace_id: vec![n; 16],
        span_id: vec![n, id, 0, 0, 0, 0, 0, 1],
        parent_span_id: if parent == 0 {
            Vec::new()
        } else {
            vec![n, parent, 0, 0, 0, 0, 0, 1]
        },
        start_time_unix_nano: at + start * MS,
        end_time_unix_nano: at + end * MS,
        attributes,
        status: None,
        ..Default::default()
    };
    // A failed span, its JSON-RPC code in words when the tree says so.
    let failed = |mut s: Span, code: Option<i64>| {
        let message = match code.filter(|_| t.words) {
            Some(-32601) => "Method not found",
            Some(-32602) => "Invalid params",
            Some(_) => "Internal error",
            None => "",
        };
        s.status = Some(opentelemetry_proto::tonic::trace::v1::Status {
            code: 2,
            message: message.into(),
        });
        s
    };
    let method = |code: Option<i64>| {
        let mut a = if t.a2a {
            vec![kv("a2a.method.name", "SendMessage")]
        } else {
            vec![
                kv("mcp.method.name", "tools/call"),
                kv("gen_ai.tool.name", "get_weather"),
            ]
        };
        a.extend(
            code.filter(|_| !t.words)
                .map(|c| int("rpc.jsonrpc.error_code", c)),
        );
        a
    };
    let mut out = Vec::new();
    let mut outer = method(t.code);
    if t.named {
        outer.push(kv("url.full", origin));
    }
    if t.timeout {
        outer.push(kv("error.type", "TimeoutError"));
    }
    let outer = span(1, 0, 3, (0, 100), outer);
    out.push(if t.code.is_some() || t.timeout {
        failed(outer, t.code)
    } else {
        outer
    });
    let mut under = 1;
    if let Some(code) = t.inner {
        let inner = span(2, 1, 3, (1, 99), method(code));
        out.push(if code.is_some() {
            failed(inner, code)
        } else {
            inner
        });
        under = 2;
    }
    for (k, status) in t.requests.iter().enumerate() {
        let k = k as u64;
        let request = span(
            10 + k as u8,
            under,
            3,
            (2 + 30 * k, 2 + 30 * k + 25),
            vec![
                kv("http.request.method", "POST"),
                kv("url.full", origin),
                int("http.response.status_code", *status),
            ],
        );
        out.push(if *status >= 400 {
            failed(request, None)
        } else {
            request
        });
    }
    let mut out: Vec<(&'static str, Span)> = out.into_iter().map(|s| (CLIENT, s)).collect();
    if let Some(tool_failed) = t.server {
        let mut a = method(None);
        if tool_failed {
            a.push(kv("error.type", "tool_error"));
        }
        out.push((SERVER, span(20, 1, 2, (5, 90), a)));
    }
    out
}

/// An export of `spans`, each service's under a resource of its own.
fn export(spans: &[(&str, Span)]) -> Vec<u8> {
    let mut resources: Vec<ResourceSpans> = Vec::new();
    for (service, span) in spans {
        let named = |r: &ResourceSpans| {
            r.resource.as_ref().is_some_and(|r| {
                r.attributes
                    .iter()
                    .any(|a| a.value == kv("service.name", service).value)
            })
        };
        match resources.iter_mut().find(|r| named(r)) {
            Some(r) => r.scope_spans[0].spans.push(span.clone()),
            None => resources.push(ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span.clone()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
    }
    ExportTraceServiceRequest {
        resource_spans: resources,
    }
    .encode_to_vec()
}

/// What a fresh pipeline counts of `exports`, sent one after another within the reorder
/// window: every series of attempts and violations.
fn counted(exports: &[Vec<u8>]) -> Vec<String> {
    let p = weather_observed_by(SERVER);
    // Sent a few seconds after the calls, a millisecond apart: well within the window.
    let sent = T0 + 4_000 * MS;
    for (k, body) in exports.iter().enumerate() {
        p.ingest(Transport::Grpc, body, 0, sent + k as u64 * MS, None);
    }
    p.finish(sent + 10 * MS);
    let mut lines: Vec<String> = p
        .metrics()
        .render()
        .lines()
        .filter(|l| {
            l.starts_with("refusal_gate_attempts_total{")
                || l.starts_with("refusal_gate_violations_total{")
        })
        .filter(|l| !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// The spans `all` in the arrival `order`, cut into exports after span `k` when `cuts[k]`.
fn cut<'a>(all: &[(&'a str, Span)], order: &[usize], cuts: &[bool]) -> Vec<Vec<(&'a str, Span)>> {
    let mut exports = vec![Vec::new()];
    for (k, &at) in order.iter().enumerate() {
        if k > 0 && cuts[k - 1] {
            exports.push(Vec::new());
        }
        exports.last_mut().expect("one").push(all[at].clone());
    }
    exports
}

/// Calls, an arrival order of their spans, and where the exports are cut.
type Case = (Vec<Tree>, Vec<usize>, Vec<bool>);

/// One to three calls, one arrival order of all their spans, and where the exports are cut
/// (after span `k` when `cuts[k]`).
fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(tree(), 1..=3).prop_flat_map(|trees| {
        let n: usize = trees
            .iter()
            .enumerate()
            .map(|(k, t)| spans(k as u8 + 1, t).len())
            .sum();
        let order = Just((0..n).collect::<Vec<usize>>()).prop_shuffle();
        (Just(trees), order, prop::collection::vec(any::<bool>(), n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_order_and_split_of_a_clients_calls_gives_the_same_counters(
        (trees, order, cuts) in case(),
    ) {
        let all: Vec<(&str, Span)> = trees
            .iter()
            .enumerate()
            .flat_map(|(n, t)| spans(n as u8 + 1, t))
            .collect();
        let whole = counted(&[export(&all)]);
        let exports = cut(&all, &order, &cuts);
        let bodies: Vec<Vec<u8>> = exports.iter().map(|e| export(e)).collect();
        let split = counted(&bodies);
        let ids: Vec<Vec<(u8, u8)>> = exports
            .iter()
            .map(|e| e.iter().map(|(_, s)| (s.span_id[0], s.span_id[1])).collect())
            .collect();
        prop_assert_eq!(&split, &whole, "{:?}\nexports (call, span): {:?}", trees, ids);
    }
}

/// The pipeline after `exports`, forwarding, sent one after another within the reorder window;
/// then either its sweeps past the window, or a shutdown before it (`early`). Returns every
/// span forwarded, (call, span) with its tags, and `/metrics` settled.
fn forwarded_after(exports: &[Vec<u8>], early: bool) -> (Vec<Forwarded>, String) {
    let p = forwarding(weather_observed_by(SERVER));
    let sent = T0 + 4_000 * MS;
    let mut out = Vec::new();
    let mut take = |p: &Pipeline| out.extend(forwarded(p));
    for (k, body) in exports.iter().enumerate() {
        p.handle(
            Transport::Grpc,
            body,
            Encoding::Protobuf,
            sent + k as u64 * MS,
        )
        .expect("accepted");
        take(&p);
    }
    let end = sent + p.tracker().reorder_window() + 1_000 * MS;
    if early {
        p.forward_withheld(end);
    } else {
        p.sweep(end);
    }
    take(&p);
    p.settle(true, end);
    (out, p.metrics().render())
}

/// The (interface, class, kind) of each attempt counted, one entry an attempt.
fn counted_attempts(metrics: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("refusal_gate_attempts_total{"))
    {
        let label = |name: &str| {
            let at = line.find(&format!("{name}=\"")).expect("labelled") + name.len() + 2;
            line[at..].split('"').next().expect("closed").to_owned()
        };
        let n: usize = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        out.extend(std::iter::repeat_n(
            (label("interface"), label("class"), label("kind")),
            n,
        ));
    }
    out.sort();
    out
}

/// One to three calls, their spans in one arrival order, cut into exports, and whether the
/// pipeline is shut down before the reorder window ends.
fn forwarded_case() -> impl Strategy<Value = (Case, bool)> {
    (case(), prop::bool::weighted(0.3))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_span_leaves_once_and_tagged_with_the_verdict_counted_for_its_call(
        ((trees, order, cuts), early) in forwarded_case(),
    ) {
        let all: Vec<(&str, Span)> = trees
            .iter()
            .enumerate()
            .flat_map(|(n, t)| spans(n as u8 + 1, t))
            .collect();
        let exports = cut(&all, &order, &cuts);
        let bodies: Vec<Vec<u8>> = exports.iter().map(|e| export(e)).collect();
        let (out, metrics) = forwarded_after(&bodies, early);
        // A call is whole, as §11.5 reads it, once its protocol span has come with the server
        // it names, or with a transport request or its server's span that names one: its
        // spans leave then (a call on a server nobody observes, at once, as every flat span
        // does). Should another part of it come in a later export (SDKs end children first:
        // a stream's, or another processor's), the counters follow it, and the spans' tags were
        // the verdict when they left. Such cases (some half of those generated) are held to the
        // first promise alone.
        let export_of = |n: u8, id: u8| exports.iter().position(|e| {
            e.iter().any(|(_, s)| s.span_id[0] == n && s.span_id[1] == id)
        });
        let late_part = trees.iter().enumerate().any(|(n, t)| {
            let n = n as u8 + 1;
            let tree = spans(n, t);
            let at = |s: &Span| export_of(n, s.span_id[1]).expect("exported");
            let outer = export_of(n, 1).expect("exported");
            let naming = tree
                .iter()
                .filter(|(_, s)| s.span_id[1] >= 10)
                .map(|(_, s)| at(s))
                .min();
            let whole = match (t.named, naming) {
                (true, _) => Some(outer),
                (false, Some(first)) => Some(first.max(outer)),
                (false, None) => None,
            };
            whole.is_some_and(|whole| {
                tree.iter()
                    .any(|(service, s)| *service == CLIENT && at(s) > whole)
            })
        });
        // Every span once.
        let mut sent: Vec<(u8, u8)> = all.iter().map(|(_, s)| (s.span_id[0], s.span_id[1])).collect();
        let mut left: Vec<(u8, u8)> = out.iter().map(|(id, _)| (id[0], id[1])).collect();
        sent.sort_unstable();
        left.sort_unstable();
        prop_assert_eq!(&left, &sent, "{:?}", trees);
        // Every tagged span with its call's verdict as counted: each attempt's tags once.
        let mut tagged: Vec<(String, String, String)> = out
            .iter()
            .filter_map(|(_, tags)| {
                let t = |k| tag(tags, k).map(str::to_owned);
                Some((t("interface")?, t("class")?, t("kind")?))
            })
            .collect();
        tagged.sort();
        let counted = counted_attempts(&metrics);
        if late_part {
            return Ok(());
        }
        if early {
            // Those still withheld at the shutdown left untagged: the rest, as counted.
            let mut rest = counted.clone();
            for t in &tagged {
                let at = rest.iter().position(|c| c == t);
                prop_assert!(at.is_some(), "{:?} tagged, not counted: {:?}\n{:?}", t, counted, trees);
                rest.remove(at.expect("found"));
            }
        } else {
            prop_assert_eq!(&tagged, &counted, "{:?}\nforwarded: {:?}", trees, out);
        }
    }
}
