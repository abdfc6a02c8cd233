//! One call, one attempt, in any arrival order (DESIGN §11): the four spans of one MCP call as
//! the MCP SDK with the httpx instrumentation and an observed server record it — the client's
//! protocol span, its HTTP child, the server's HTTP span and the server's MCP span — sent to
//! the server over OTLP/HTTP in every one of their 24 orders, one span per export and all four
//! in one export. Every order must give the same counters.

mod common;

use common::{kv, scrape, send, start, value, T0};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
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
async fn the_four_spans_of_one_call_give_the_same_counters_in_all_24_orders() {
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
        for together in [false, true] {
            let run = (2 * n + usize::from(together)) as u8;
            let client = format!("chain-{n}-{}", if together { "one" } else { "each" });
            let before = scrape(bound).await;
            // The first call, whole, in one export; then its retry in the order under test.
            send(bound, export(&chain(&client, run, 1))).await;
            let retry = chain(&client, run, 2);
            let spans: Vec<(String, Span)> = order.iter().map(|&k| retry[k].clone()).collect();
            if together {
                send(bound, export(&spans)).await;
            } else {
                for one in &spans {
                    send(bound, export(std::slice::from_ref(one))).await;
                }
            }
            let after = scrape(bound).await;
            let got = (
                counted(&after, &client),
                skipped(&after) - skipped(&before),
                stranger(&after) - stranger(&before),
            );
            results.push((
                format!(
                    "{order:?} {}",
                    if together {
                        "in one export"
                    } else {
                        "one per export"
                    }
                ),
                got,
            ));
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
