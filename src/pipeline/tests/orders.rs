//! The property of DESIGN §11: within the reorder window, the spans of generated call trees
//! give the same counters whatever order they arrive in and however they are split across
//! exports. Each tree is a protocol CLIENT span (MCP `tools/call` or A2A `SendMessage`, naming
//! its server or not, failed by a JSON-RPC code — a number or words — or a timeout, or not),
//! maybe a framework's
//! span around it (nested, §11.2), its transport requests (none to three, retried, §11.1) and,
//! on the observed interface, the server's span (§11.3); one to three such calls by one client.

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

/// One to three calls, one arrival order of all their spans, and where the exports are cut
/// (after span `k` when `cuts[k]`).
fn case() -> impl Strategy<Value = (Vec<Tree>, Vec<usize>, Vec<bool>)> {
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
        let mut exports = vec![Vec::new()];
        for (k, &at) in order.iter().enumerate() {
            if k > 0 && cuts[k - 1] {
                exports.push(Vec::new());
            }
            exports.last_mut().expect("one").push(all[at].clone());
        }
        let bodies: Vec<Vec<u8>> = exports.iter().map(|e| export(e)).collect();
        let split = counted(&bodies);
        let ids: Vec<Vec<(u8, u8)>> = exports
            .iter()
            .map(|e| e.iter().map(|(_, s)| (s.span_id[0], s.span_id[1])).collect())
            .collect();
        prop_assert_eq!(&split, &whole, "{:?}\nexports (call, span): {:?}", trees, ids);
    }
}
