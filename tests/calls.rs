//! One call, one attempt, in any arrival order (DESIGN §11): the four spans of one MCP call as
//! the MCP SDK with the httpx instrumentation and an observed server record it — the client's
//! protocol span, its HTTP child, the server's HTTP span and the server's MCP span — sent to
//! the server over OTLP/HTTP in every one of their 24 orders, each split across exports in
//! every one of the 8 ways (all four in one export, one span per export, and between). Every
//! order and split must give the same counters. Then the examples of each way a call's spans
//! can come apart: a busy key, a flood past the bounds, a ring of parent ids, a timeout, a
//! discovery call on an undeclared path, a part that comes after its call was counted.

mod common;

use common::{kv, scrape, send, start, value, T0};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

const CONFIG: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
    server: { service_names: [weather-server] }
tracker:
  probe_window: 3s
";

const SERVER: &str = "weather-server";

fn s(key: &str, v: &str) -> opentelemetry_proto::tonic::common::v1::KeyValue {
    kv(key, Value::StringValue(v.into()))
}

fn i(key: &str, v: i64) -> opentelemetry_proto::tonic::common::v1::KeyValue {
    kv(key, Value::IntValue(v))
}

/// A span of call `call` of run `run` (its trace), id `id`, under `parent` (0: none), `kind`
/// (2 SERVER, 3 CLIENT), from `start` to `end` ms after the call began.
fn span(run: u8, call: u8, id: u8, parent: u8, kind: i32, (start, end): (u64, u64)) -> Span {
    let at = T0 + u64::from(call) * 100_000_000;
    Span {
        trace_id: [[call, run], [7; 2]].concat().repeat(4),
        span_id: vec![run, call, id, 0, 0, 0, 0, 1],
        parent_span_id: if parent == 0 {
            Vec::new()
        } else {
            vec![run, call, parent, 0, 0, 0, 0, 1]
        },
        kind,
        start_time_unix_nano: at + start * 1_000_000,
        end_time_unix_nano: at + end * 1_000_000,
        ..Default::default()
    }
}

/// The four spans of one `tools/call get_weather`, as (service, span): the server recorded the
/// tool's failure (`tool_error`); the client saw a good JSON-RPC answer over HTTP 200.
fn chain(client: &str, run: u8, call: u8) -> [(String, Span); 4] {
    let span = |id, parent, kind, times| span(run, call, id, parent, kind, times);
    let mut protocol = span(1, 0, 3, (0, 40));
    protocol.name = "MCP send tools/call get_weather".into();
    protocol.attributes = vec![
        s("mcp.method.name", "tools/call"),
        s("jsonrpc.request.id", "7"),
    ];
    let mut http = span(2, 1, 3, (5, 35));
    http.name = "POST".into();
    http.attributes = vec![
        s("http.method", "POST"),
        s("http.url", "http://mcp.test:8080/mcp"),
        s("http.status_code", "200"),
    ];
    let mut server_http = span(3, 2, 2, (10, 30));
    server_http.name = "POST /mcp".into();
    server_http.attributes = vec![
        s("http.request.method", "POST"),
        s("url.path", "/mcp"),
        i("http.response.status_code", 200),
        s("user_agent.original", "python-httpx/0.28.1"),
        s("client.address", "10.0.0.9"),
    ];
    // The MCP SDK's server parents its span to the client's protocol span (`_meta`).
    let mut server_mcp = span(4, 1, 2, (12, 28));
    server_mcp.name = "MCP handle tools/call get_weather".into();
    server_mcp.attributes = vec![
        s("mcp.method.name", "tools/call"),
        s("gen_ai.tool.name", "get_weather"),
        s("error.type", "tool_error"),
    ];
    [
        (client.to_owned(), protocol),
        (client.to_owned(), http),
        (SERVER.to_owned(), server_http),
        (SERVER.to_owned(), server_mcp),
    ]
}

/// An export of these spans, each under its service's resource.
fn export(spans: &[(String, Span)]) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: spans
            .iter()
            .map(|(service, span)| ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![s("service.name", service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span.clone()],
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// Every order of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            out.push(order);
        }
    }
    out
}

/// What one client's run counted: attempts by interface, class and kind, violations, and the
/// spans skipped as the same call and counted under `unknown_client` meanwhile.
fn counted(text: &str, client: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = common::series(text, "refusal_gate_attempts_total")
        .into_iter()
        .chain(common::series(text, "refusal_gate_violations_total"))
        .filter(|(labels, _)| labels.get("client").map(String::as_str) == Some(client))
        .map(|(mut labels, v)| {
            labels.remove("client");
            (format!("{labels:?}"), v)
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_spans_of_one_call_give_the_same_counters_in_all_24_orders_and_all_splits() {
    let server = start(CONFIG).await;
    let bound = &server.bound;
    let skipped = |text: &str| {
        value(
            text,
            "refusal_gate_spans_skipped_total",
            &[("reason", "same_call")],
        )
    };
    let stranger = |text: &str| {
        value(
            text,
            "refusal_gate_attempts_total",
            &[("client", "unknown_client")],
        )
    };
    let all = orders(4);
    assert_eq!(all.len(), 24);
    let mut results = Vec::new();
    for (n, order) in all.iter().enumerate() {
        // Every split of the order into exports: bit k of `cuts` ends an export after its
        // span k (0: all in one export; 0b111: one span per export).
        for cuts in 0..8u8 {
            let run = (8 * n) as u8 + cuts;
            let client = format!("chain-{n}-{cuts:03b}");
            let before = scrape(bound).await;
            // The first call, whole, in one export; then its retry in the order under test.
            send(bound, export(&chain(&client, run, 1))).await;
            let retry = chain(&client, run, 2);
            let spans: Vec<(String, Span)> = order.iter().map(|&k| retry[k].clone()).collect();
            let mut from = 0;
            for k in 0..spans.len() {
                if k + 1 == spans.len() || cuts & (1 << k) != 0 {
                    send(bound, export(&spans[from..=k])).await;
                    from = k + 1;
                }
            }
            let after = scrape(bound).await;
            let got = (
                counted(&after, &client),
                skipped(&after) - skipped(&before),
                stranger(&after) - stranger(&before),
            );
            results.push((format!("{order:?} cut after {cuts:03b}"), got));
        }
    }
    let (first_order, want) = &results[0];
    // What §11 makes of them: two attempts of tools/call get_weather on weather-mcp, each
    // ambiguous (the server's tool error), the second a retry after it; three spans of each
    // call skipped as the same call; nothing under unknown_client.
    let ambiguous = want
        .0
        .iter()
        .find(|(labels, _)| {
            labels.contains("\"kind\": \"ambiguous\"") && labels.contains("weather-mcp")
        })
        .map(|(_, v)| *v);
    assert_eq!(ambiguous, Some(2.0), "{first_order}: {want:?}");
    let retries = want
        .0
        .iter()
        .find(|(labels, _)| labels.contains("retry_after_ambiguous"))
        .map(|(_, v)| *v);
    assert_eq!(retries, Some(1.0), "{first_order}: {want:?}");
    assert_eq!(want.0.len(), 2, "nothing else counted: {want:?}");
    assert_eq!((want.1, want.2), (6.0, 0.0), "{first_order}: {want:?}");
    for (order, got) in &results {
        assert_eq!(got, want, "{order} differs from {first_order}");
    }
}

/// Call `n`'s two halves: the client's `tools/call get_weather` (a protocol span with no
/// transport request under it) and the observed server's span of it, parented on it.
fn halves(client: &str, n: u32) -> [(String, Span); 2] {
    let at = T0 + u64::from(n) * 1_000_000_000;
    let trace = [n.to_be_bytes().as_slice(), &[9; 12]].concat();
    let id = |side: u8| [[side, 0, 0, 0].as_slice(), &n.to_be_bytes()].concat();
    let protocol = Span {
        trace_id: trace.clone(),
        span_id: id(1),
        kind: 3,
        name: "MCP send tools/call get_weather".into(),
        start_time_unix_nano: at,
        end_time_unix_nano: at + 40_000_000,
        attributes: vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "get_weather"),
            s("url.full", "http://mcp.test:8080/mcp"),
        ],
        ..Default::default()
    };
    let server = Span {
        trace_id: trace,
        span_id: id(2),
        parent_span_id: id(1),
        kind: 2,
        name: "MCP handle tools/call get_weather".into(),
        start_time_unix_nano: at + 10_000_000,
        end_time_unix_nano: at + 30_000_000,
        attributes: vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "get_weather"),
        ],
        ..Default::default()
    };
    [(client.to_owned(), protocol), (SERVER.to_owned(), server)]
}

/// Every attempt counted for `client`, whatever its labels.
fn attempts_of(text: &str, client: &str) -> f64 {
    common::series(text, "refusal_gate_attempts_total")
        .into_iter()
        .filter(|(labels, _)| labels.get("client").map(String::as_str) == Some(client))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_counted_once_however_many_calls_come_before_its_late_server_half() {
    // A window no machine's slowness outlasts: the test is about how busy the key is, not
    // about the window.
    let server = start(&CONFIG.replace(
        "probe_window: 3s",
        "probe_window: 3s\n  reorder_window: 120s",
    ))
    .await;
    let bound = &server.bound;
    let mut first = 0;
    for (calls, per_request) in [(10, 1), (40, 1), (100, 1), (2_000, 100)] {
        let client = format!("busy-{calls}-{per_request}");
        let all: Vec<[(String, Span); 2]> =
            (first..first + calls).map(|n| halves(&client, n)).collect();
        first += calls;
        // The client's halves first, then the server's, `per_request` in each export.
        for side in 0..2 {
            for request in all.chunks(per_request as usize) {
                let spans: Vec<(String, Span)> = request.iter().map(|h| h[side].clone()).collect();
                send(bound, export_many(&spans)).await;
            }
        }
        let text = scrape(bound).await;
        assert_eq!(
            attempts_of(&text, &client),
            f64::from(calls),
            "{calls} calls, {per_request} a request, the server's halves late: {:?}",
            counted(&text, &client)
        );
    }
}

/// An export of these spans, those of one service under one resource.
fn export_many(spans: &[(String, Span)]) -> Vec<u8> {
    let mut services: Vec<(String, Vec<Span>)> = Vec::new();
    for (service, span) in spans {
        match services.iter_mut().find(|(s, _)| s == service) {
            Some((_, list)) => list.push(span.clone()),
            None => services.push((service.clone(), vec![span.clone()])),
        }
    }
    ExportTraceServiceRequest {
        resource_spans: services
            .into_iter()
            .map(|(service, spans)| ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![s("service.name", &service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// Span `k` of a ring of `n` MCP client spans of one `tools/call get_weather`, each naming the
/// next as its parent: a call with no root, as no SDK records it and anyone can send it.
fn ring_span(client: &str, trace: u8, n: u32, k: u32) -> (String, Span) {
    let id = |k: u32| [[7, 7, 7, 7].as_slice(), &k.to_be_bytes()].concat();
    let at = T0 + u64::from(k) * 1_000;
    let span = Span {
        trace_id: vec![trace; 16],
        span_id: id(k),
        parent_span_id: id((k + 1) % n),
        kind: 3,
        name: "MCP send tools/call get_weather".into(),
        start_time_unix_nano: at,
        end_time_unix_nano: at + 500,
        attributes: vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "get_weather"),
            s("url.full", "http://mcp.test:8080/mcp"),
        ],
        ..Default::default()
    };
    (client.to_owned(), span)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_parent_ids_form_a_ring_is_counted_once_and_the_cut_is_counted() {
    let server = start(CONFIG).await;
    let bound = &server.bound;
    let cut = |text: &str| value(text, "refusal_gate_call_cycles_cut_total", &[]);
    const N: u32 = 1_000;
    // The ring in one export, in order and reversed; and split over two exports.
    let ways: [(&str, Vec<Vec<u32>>); 3] = [
        ("in-order", vec![(0..N).collect()]),
        ("reversed", vec![(0..N).rev().collect()]),
        (
            "split",
            vec![(0..N).step_by(2).collect(), (1..N).step_by(2).collect()],
        ),
    ];
    for (trace, (way, exports)) in (1..).zip(ways) {
        let client = format!("ring-{way}");
        let before = scrape(bound).await;
        for spans in exports {
            let spans: Vec<(String, Span)> = spans
                .iter()
                .map(|&k| ring_span(&client, trace, N, k))
                .collect();
            send(bound, export_many(&spans)).await;
        }
        let after = scrape(bound).await;
        assert_eq!(
            attempts_of(&after, &client),
            1.0,
            "{way}: one call, one attempt: {:?}",
            counted(&after, &client)
        );
        assert_eq!(cut(&after) - cut(&before), 1.0, "{way}: the cut is counted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_held_spans_a_forgotten_call_is_still_counted_once() {
    // Room for 100 spans: the first 200 client calls are forgotten before their server's
    // halves come.
    let config = CONFIG.replace(
        "probe_window: 3s",
        "probe_window: 3s\n  reorder_window: 120s\n  max_held_spans: 100",
    );
    let server = start(&config).await;
    let bound = &server.bound;
    let client = "flood";
    let all: Vec<[(String, Span); 2]> = (0..300).map(|n| halves(client, n)).collect();
    for side in 0..2 {
        for request in all.chunks(10) {
            let spans: Vec<(String, Span)> = request.iter().map(|h| h[side].clone()).collect();
            send(bound, export_many(&spans)).await;
        }
    }
    let text = scrape(bound).await;
    assert_eq!(
        attempts_of(&text, client),
        300.0,
        "{:?}",
        counted(&text, client)
    );
    assert_eq!(
        attempts_of(&text, "unknown_client"),
        0.0,
        "no server half counted on its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_spans_timeout_goes_with_its_transport_request() {
    let server = start(CONFIG).await;
    let bound = &server.bound;
    let client = "timed-out";
    // `tools/call` timed out (`error.type` TimeoutError) over a POST answered 200, twice.
    for n in 0..2u32 {
        let [(_, mut protocol), _] = halves(client, 5_000 + n);
        protocol.attributes.push(s("error.type", "TimeoutError"));
        protocol.status = Some(opentelemetry_proto::tonic::trace::v1::Status {
            code: 2,
            ..Default::default()
        });
        let request = Span {
            trace_id: protocol.trace_id.clone(),
            span_id: [protocol.span_id.as_slice(), &[]]
                .concat()
                .iter()
                .rev()
                .copied()
                .collect(),
            parent_span_id: protocol.span_id.clone(),
            kind: 3,
            name: "POST".into(),
            start_time_unix_nano: protocol.start_time_unix_nano + 1_000_000,
            end_time_unix_nano: protocol.end_time_unix_nano - 1_000_000,
            attributes: vec![
                s("http.request.method", "POST"),
                s("url.full", "http://mcp.test:8080/mcp"),
                i("http.response.status_code", 200),
            ],
            ..Default::default()
        };
        send(
            bound,
            export_many(&[(client.to_owned(), request), (client.to_owned(), protocol)]),
        )
        .await;
    }
    let text = scrape(bound).await;
    let got = counted(&text, client);
    assert_eq!(
        got,
        vec![(
            "{\"class\": \"transient\", \"interface\": \"weather-mcp\", \"kind\": \"transient\"}"
                .to_owned(),
            2.0
        )],
        "two transient attempts of tools/call, the retry no violation"
    );
}

/// Call `n` of `client`: an MCP `method` (its JSON-RPC `code`, if any) over one POST to `path`
/// on the MCP server, answered `status`, the request exported before its call.
fn over(
    client: &str,
    n: u32,
    method: &str,
    code: Option<i64>,
    (path, status): (&str, i64),
) -> Vec<(String, Span)> {
    let at = T0 + u64::from(n) * 1_000_000_000;
    let trace = [n.to_be_bytes().as_slice(), &[5; 12]].concat();
    let mut attributes = vec![s("mcp.method.name", method)];
    if method == "tools/call" {
        attributes.push(s("gen_ai.tool.name", "get_weather"));
    }
    let failed = code.map(|c| {
        attributes.push(i("rpc.jsonrpc.error_code", c));
        opentelemetry_proto::tonic::trace::v1::Status {
            code: 2,
            ..Default::default()
        }
    });
    let call = Span {
        trace_id: trace.clone(),
        span_id: [[1, 0, 0, 0].as_slice(), &n.to_be_bytes()].concat(),
        kind: 3,
        name: format!("MCP send {method}"),
        start_time_unix_nano: at,
        end_time_unix_nano: at + 40_000_000,
        attributes,
        status: failed,
        ..Default::default()
    };
    let request = Span {
        trace_id: trace,
        span_id: [[2, 0, 0, 0].as_slice(), &n.to_be_bytes()].concat(),
        parent_span_id: call.span_id.clone(),
        kind: 3,
        name: "POST".into(),
        start_time_unix_nano: at + 5_000_000,
        end_time_unix_nano: at + 35_000_000,
        attributes: vec![
            s("http.request.method", "POST"),
            s("url.full", &format!("http://mcp.test:8080{path}")),
            i("http.response.status_code", status),
        ],
        ..Default::default()
    };
    vec![(client.to_owned(), request), (client.to_owned(), call)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_call_served_on_an_undeclared_path_is_a_read() {
    let server = start(CONFIG).await;
    let bound = &server.bound;
    // `initialize` served on the SDK's fallback path, then a tool the server does not have.
    let client = "fallback-reader";
    let mut spans = over(client, 6_000, "initialize", None, ("/mcp/sse", 200));
    spans.extend(over(
        client,
        6_001,
        "tools/call",
        Some(-32601),
        ("/mcp", 200),
    ));
    send(bound, export_many(&spans)).await;
    let text = scrape(bound).await;
    let refusals = value(
        &text,
        "refusal_gate_attempts_total",
        &[("client", client), ("kind", "protocol_not_supported")],
    );
    assert_eq!(
        refusals,
        1.0,
        "a verified refusal: {:?}",
        counted(&text, client)
    );
    // A 405, then `server/discover` served on an undeclared path: reading, never a probe.
    let client = "reader-after-405";
    let mut spans = over(client, 6_100, "tools/call", None, ("/mcp", 405));
    spans.extend(over(
        client,
        6_101,
        "server/discover",
        None,
        ("/mcp/discover", 200),
    ));
    send(bound, export_many(&spans)).await;
    let text = scrape(bound).await;
    assert_eq!(
        value(
            &text,
            "refusal_gate_violations_total",
            &[("client", client), ("violation", "probe_after_refusal")],
        ),
        0.0,
        "{:?}",
        counted(&text, client)
    );
    assert_eq!(
        value(
            &text,
            "refusal_gate_discovery_reads_total",
            &[("client", client)]
        ),
        1.0
    );
}

/// A CLIENT span of call `n` (its trace), id `id` under `parent` (0: none), from `start` to
/// `end` ms after the call began, with these attributes; `failed` sets an error status.
fn part(
    n: u32,
    (id, parent): (u8, u8),
    (start, end): (u64, u64),
    attributes: Vec<KeyValue>,
) -> Span {
    let at = T0 + u64::from(n) * 1_000_000_000;
    let id_of = |id: u8| [[id, 0, 0, 0].as_slice(), &n.to_be_bytes()].concat();
    let failed = attributes.iter().any(|a| {
        a.key == "rpc.jsonrpc.error_code"
            || a.key == "error.type"
            || (a.key == "http.response.status_code"
                && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()), Some(Value::IntValue(c)) if *c >= 400))
    });
    Span {
        trace_id: [n.to_be_bytes().as_slice(), &[3; 12]].concat(),
        span_id: id_of(id),
        parent_span_id: if parent == 0 {
            Vec::new()
        } else {
            id_of(parent)
        },
        kind: 3,
        name: format!("span {id}"),
        start_time_unix_nano: at + start * 1_000_000,
        end_time_unix_nano: at + end * 1_000_000,
        attributes,
        status: failed.then(|| opentelemetry_proto::tonic::trace::v1::Status {
            code: 2,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Sends `spans` (of `client`) three ways, each as a client of its own: all in one export; the
/// first `split` in one export and the rest in the next; the rest first, then the first
/// `split`. Returns what each of the three counted.
async fn three_ways(
    bound: &refusal_gate::app::Bound,
    client: &str,
    spans: &[Span],
    split: usize,
) -> [Vec<(String, f64)>; 3] {
    // Each way in a trace of its own.
    let named = |name: &str, spans: &[Span]| -> Vec<(String, Span)> {
        spans
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.trace_id[15] = name.len() as u8;
                (name.to_owned(), s)
            })
            .collect()
    };
    let (head, tail) = spans.split_at(split);
    let names = [
        format!("{client}-one"),
        format!("{client}-first"),
        format!("{client}-inverse"),
    ];
    send(bound, export_many(&named(&names[0], spans))).await;
    send(bound, export_many(&named(&names[1], head))).await;
    send(bound, export_many(&named(&names[1], tail))).await;
    send(bound, export_many(&named(&names[2], tail))).await;
    send(bound, export_many(&named(&names[2], head))).await;
    let text = scrape(bound).await;
    names.map(|name| counted(&text, &name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_that_comes_after_the_rest_of_its_call_was_counted_joins_that_call() {
    let server = start(CONFIG).await;
    let bound = &server.bound;
    let origin = "http://agent.test:9000/a2a";
    // An a2a SendMessage span that names its server, its inner SendMessage (-32602) late:
    // one ambiguous attempt (§11.2).
    let outer = part(
        7_000,
        (1, 0),
        (0, 40),
        vec![s("a2a.method.name", "SendMessage"), s("url.full", origin)],
    );
    let inner = part(
        7_000,
        (2, 1),
        (5, 45),
        vec![
            s("a2a.method.name", "SendMessage"),
            i("rpc.jsonrpc.error_code", -32602),
        ],
    );
    let [one, first, last] = three_ways(bound, "nested", &[outer, inner], 1).await;
    let want = vec![(
        "{\"class\": \"ambiguous\", \"interface\": \"http://agent.test:9000\", \"kind\": \"ambiguous\"}"
            .to_owned(),
        1.0,
    )];
    assert_eq!(one, want, "one export");
    assert_eq!(first, want, "the outer span first");
    assert_eq!(last, want, "the inner span first");
    // GetTask (-32602) that names its server, its POST (404) late: one attempt, not two.
    let call = part(
        7_001,
        (1, 0),
        (0, 40),
        vec![
            s("a2a.method.name", "GetTask"),
            s("url.full", origin),
            i("rpc.jsonrpc.error_code", -32602),
        ],
    );
    let request = part(
        7_001,
        (2, 1),
        (5, 35),
        vec![
            s("http.request.method", "POST"),
            s("url.full", origin),
            i("http.response.status_code", 404),
        ],
    );
    let [one, first, last] = three_ways(bound, "transport", &[call, request], 1).await;
    let attempts = |c: &[(String, f64)]| {
        c.iter()
            .filter(|(l, _)| !l.contains("violation"))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    assert_eq!(attempts(&one), 1.0, "{one:?}");
    assert_eq!(first, one, "the call first");
    assert_eq!(last, one, "the request first");
    // tools/call (-32602) and its first POST (503) in one export, its second POST (200, ends
    // last) late: two attempts of tools/call, transient then ambiguous (§11.1).
    let origin = "http://tools.test:8080/mcp";
    let call = part(
        7_002,
        (1, 0),
        (0, 100),
        vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "lookup"),
            s("url.full", origin),
            i("rpc.jsonrpc.error_code", -32602),
        ],
    );
    let post = |id, times, status| {
        part(
            7_002,
            (id, 1),
            times,
            vec![
                s("http.request.method", "POST"),
                s("url.full", origin),
                i("http.response.status_code", status),
            ],
        )
    };
    let spans = [call, post(2, (5, 30), 503), post(3, (40, 101), 200)];
    let [one, first, last] = three_ways(bound, "retried", &spans, 2).await;
    let classes: Vec<(String, f64)> = vec![
        ("{\"class\": \"ambiguous\", \"interface\": \"http://tools.test:8080\", \"kind\": \"ambiguous\"}".to_owned(), 1.0),
        ("{\"class\": \"transient\", \"interface\": \"http://tools.test:8080\", \"kind\": \"transient\"}".to_owned(), 1.0),
    ];
    let no_violations = |c: &[(String, f64)]| {
        c.iter()
            .filter(|(l, _)| !l.contains("violation"))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(no_violations(&one), classes, "{one:?}");
    assert_eq!(first, one, "the call and its first request first");
    assert_eq!(last, one, "the second request first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_calls_whose_parts_come_late_keeps_them_within_max_held_mib() {
    // 40 requests of 20 tools/call spans, each with 16 KiB of arguments (12.8 MiB in all), on
    // a server nobody observes: each call is kept for a late transport request of its own,
    // within a mebibyte.
    let config = CONFIG.replace(
        "probe_window: 3s",
        "probe_window: 3s\n  reorder_window: 120s\n  max_held_mib: 1",
    );
    let server = start(&config).await;
    let bound = &server.bound;
    let origin = "http://tools.test:8080/mcp";
    let arguments = "x".repeat(16 << 10);
    let call = |n: u32| {
        part(
            n,
            (1, 0),
            (0, 40),
            vec![
                s("mcp.method.name", "tools/call"),
                s("gen_ai.tool.name", "lookup"),
                s("url.full", origin),
                s("gen_ai.tool.call.arguments", &arguments),
            ],
        )
    };
    let post = |n: u32| {
        part(
            n,
            (2, 1),
            (5, 35),
            vec![
                s("http.request.method", "POST"),
                s("url.full", origin),
                i("http.response.status_code", 200),
            ],
        )
    };
    let client = |spans: Vec<Span>| -> Vec<(String, Span)> {
        spans
            .into_iter()
            .map(|s| ("flooder".to_owned(), s))
            .collect()
    };
    for request in 0..40u32 {
        let calls = (request * 20..request * 20 + 20).map(call).collect();
        send(bound, export_many(&client(calls))).await;
    }
    // The last request's calls are still kept: their transport requests join them.
    send(bound, export_many(&client((780..800).map(post).collect()))).await;
    let text = scrape(bound).await;
    let held = value(&text, "refusal_gate_held_bytes", &[]);
    eprintln!("a flood of 12.8 MiB of calls kept for a late part: {held} bytes held");
    assert!(
        held > 0.0 && held <= f64::from(1 << 20),
        "held {held} bytes of a 12.8 MiB flood"
    );
    assert_eq!(
        attempts_of(&text, "flooder"),
        800.0,
        "each late request joined its call: {:?}",
        counted(&text, "flooder")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_kept_for_a_late_part_counts_the_buffer_its_receiver_read_it_into() {
    // Calls on a server nobody observes, each kept for a late part of its own: over OTLP/gRPC
    // an export of some 30 KiB is a view of tonic's buffer of just under 128 KiB, and keeping
    // it keeps that buffer; a small one is copied out of it.
    // A scrape settles what is kept: each case on a server of its own.
    let config = CONFIG.replace(
        "probe_window: 3s",
        "probe_window: 3s\n  reorder_window: 120s",
    );
    let connect = |bound: refusal_gate::app::Bound| async move {
        opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient::connect(
            format!("http://{}", bound.grpc),
        )
        .await
        .expect("connects")
    };
    let export = |first: u32, n: u32, argument_bytes: usize| {
        let arguments = "x".repeat(argument_bytes);
        let spans = (first..first + n)
            .map(|n| {
                let span = part(
                    n,
                    (1, 0),
                    (0, 40),
                    vec![
                        s("mcp.method.name", "tools/call"),
                        s("gen_ai.tool.name", "lookup"),
                        s("url.full", "http://tools.test:8080/mcp"),
                        s("gen_ai.tool.call.arguments", &arguments),
                    ],
                );
                ("keeper".to_owned(), span)
            })
            .collect::<Vec<_>>();
        ExportTraceServiceRequest::decode(&export_many(&spans)[..]).expect("decodes")
    };
    let held = |text: &str| value(text, "refusal_gate_held_bytes", &[]);
    // Four exports of 20 calls with 1.5 KiB of arguments each: some 30 KiB.
    let server = start(&config).await;
    let mut client = connect(server.bound).await;
    for request in 0..4u32 {
        let body = export(request * 20, 20, 1536);
        assert!((24 << 10..64 << 10).contains(&body.encoded_len()));
        client.export(body).await.expect("exported");
    }
    let large = held(&scrape(&server.bound).await);
    assert!(
        large >= 4.0 * f64::from((128 << 10) - 64),
        "four exports of 30 KiB hold {large} bytes: each its receive buffer"
    );
    // Four exports of one call: a few hundred bytes each, copied.
    let server = start(&config).await;
    let mut client = connect(server.bound).await;
    for request in 0..4u32 {
        let body = export(request, 1, 16);
        client.export(body).await.expect("exported");
    }
    let small = held(&scrape(&server.bound).await);
    assert!(
        small > 0.0 && small < 4.0 * 4096.0,
        "four small exports hold {small} bytes: their own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_whose_parent_never_comes_is_judged_with_the_attempts_after_it() {
    // A window short enough to wait out; a path the interface does not declare.
    let server = start(
        "receivers:\n  otlp:\n    grpc: { endpoint: 127.0.0.1:0 }\n    http: { endpoint: 127.0.0.1:0 }\n\
         admin:\n  endpoint: 127.0.0.1:0\n\
         interfaces:\n  - name: items\n    protocol: http\n    url: http://api.test\n    endpoints: [{ path: /items, methods: [GET] }]\n\
         tracker:\n  reorder_window: 1s\n",
    )
    .await;
    let bound = &server.bound;
    for (client, dangling, n) in [("orphan", true, 1), ("rooted", false, 11)] {
        // A 404 on the undeclared path, its parent (an agent's span another exporter sent)
        // never coming; then the same request again: a retry without discovery (§5).
        let mut first = common::http_span(n, "GET", "http://api.test/undeclared", 404);
        if dangling {
            first.parent_span_id = vec![0xee; 8];
        }
        let again = common::http_span(n + 1, "GET", "http://api.test/undeclared", 404);
        send(bound, common::export(client, vec![first])).await;
        send(bound, common::export(client, vec![again])).await;
    }
    // A scrape while the first is held must not settle the retry without it.
    scrape(bound).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = scrape(bound).await;
        let violations = |client| {
            value(
                &text,
                "refusal_gate_violations_total",
                &[("client", client), ("violation", "retry_without_discovery")],
            )
        };
        if violations("orphan") == 1.0 || std::time::Instant::now() > deadline {
            assert_eq!(violations("rooted"), 1.0);
            assert_eq!(
                violations("orphan"),
                1.0,
                "the retry of a span held for its parent: {:?}",
                counted(&text, "orphan")
            );
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
