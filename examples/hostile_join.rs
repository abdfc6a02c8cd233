//! Times the call join (DESIGN §11) on the hostile shapes of issue 44: one trace whose parent
//! ids form a ring, a star, a chain, protocol server spans carried by one HTTP server span, HTTP server spans each carrying the
//! protocol server span inside its time, a
//! gateway comb (a chain of proxied HTTP server spans, a protocol span under each), and
//! siblings of a parent that never comes, sent one a request. Each shape at N spans and at 4N,
//! in one process, one thread: the time of each, and the ratio (4 for a join linear in its spans, 16
//! for a quadratic one).
//!
//!     cargo run --release --example hostile_join [N]
//!
//! N is 16,000 by default. Prints a table; asserts nothing.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use refusal_gate::config::Config;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use std::time::Instant;

const CONFIG: &str = "
interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
    server: { service_names: [weather-server] }
tracker:
  reorder_window: 60s
  max_held_spans: 1000000
  max_held_mib: 1024
";

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn id(n: usize) -> Vec<u8> {
    (n as u64 + 1).to_be_bytes().to_vec()
}

/// Span `n` of the one trace, under span `parent` (`None`: a parent that never comes).
fn span(n: usize, parent: Option<usize>, kind: i32, attributes: Vec<KeyValue>) -> Span {
    let t = 1_700_000_000_000_000_000 + n as u64 * 1_000;
    Span {
        trace_id: vec![7; 16],
        span_id: id(n),
        parent_span_id: parent.map_or_else(|| vec![0xee; 8], id),
        kind,
        start_time_unix_nano: t,
        end_time_unix_nano: t + 500,
        attributes,
        ..Default::default()
    }
}

fn mcp_client(n: usize, parent: Option<usize>) -> Span {
    span(
        n,
        parent,
        3,
        vec![
            kv("mcp.method.name", "tools/call"),
            kv("url.full", "http://mcp.test:8080/mcp"),
        ],
    )
}

fn http_client(n: usize, parent: Option<usize>) -> Span {
    span(
        n,
        parent,
        3,
        vec![
            kv("http.request.method", "POST"),
            kv("url.full", "http://mcp.test:8080/mcp"),
        ],
    )
}

fn http_server(n: usize, parent: Option<usize>) -> Span {
    span(
        n,
        parent,
        2,
        vec![
            kv("http.request.method", "POST"),
            kv("url.path", "/mcp"),
            kv("client.address", "10.0.0.9"),
        ],
    )
}

fn mcp_server(n: usize, parent: Option<usize>) -> Span {
    span(n, parent, 2, vec![kv("mcp.method.name", "tools/call")])
}

fn export(service: &str, spans: Vec<Span>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", service)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The requests of one shape at `n` spans.
fn shape(name: &str, n: usize) -> Vec<Vec<u8>> {
    match name {
        "ring" => vec![export(
            "agent",
            (0..n).map(|i| mcp_client(i, Some((i + 1) % n))).collect(),
        )],
        "star" => vec![export(
            "agent",
            std::iter::once(mcp_client(0, None))
                .chain((1..n).map(|i| http_client(i, Some(0))))
                .collect(),
        )],
        "chain" => vec![export(
            "agent",
            (0..n).map(|i| mcp_client(i, i.checked_sub(1))).collect(),
        )],
        "carriers by time" => vec![export(
            "weather-server",
            (0..n)
                .map(|i| {
                    // HTTP server spans, each around the protocol server span after it, whose
                    // parent (the client's span) is not in the export.
                    let mut s = if i % 2 == 0 {
                        http_server(i, None)
                    } else {
                        mcp_server(i, None)
                    };
                    if i % 2 == 0 {
                        s.parent_span_id.clear();
                        s.end_time_unix_nano += 2_000;
                    } else {
                        s.start_time_unix_nano -= 900;
                    }
                    s
                })
                .collect(),
        )],
        "carriers" => vec![export(
            "weather-server",
            std::iter::once(http_server(0, None))
                .chain((1..n).map(|i| mcp_server(i, Some(0))))
                .collect(),
        )],
        "gateway comb" => vec![export(
            "weather-server",
            (0..n)
                .map(|i| {
                    if i % 2 == 0 {
                        http_server(i, i.checked_sub(2))
                    } else {
                        mcp_server(i, Some(i - 1))
                    }
                })
                .collect(),
        )],
        "siblings, a request each" => (0..n)
            .map(|i| export("agent", vec![http_client(i, None)]))
            .collect(),
        _ => unreachable!(),
    }
}

/// Seconds of handling `requests` on a fresh pipeline, in this thread.
fn time(requests: &[Vec<u8>]) -> f64 {
    let config = Config::parse(CONFIG).expect("valid");
    let pipeline = Pipeline::from_config(&config);
    let now = refusal_gate::clock::now();
    let started = Instant::now();
    for body in requests {
        let _ = pipeline.handle(Transport::Http, body, Encoding::Protobuf, now);
    }
    started.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16_000);
    println!(
        "| shape | {n} spans | {} spans | ratio (4: linear, 16: quadratic) |",
        4 * n
    );
    println!("|---|---|---|---|");
    for name in [
        "ring",
        "star",
        "chain",
        "carriers",
        "carriers by time",
        "gateway comb",
        "siblings, a request each",
    ] {
        let small = shape(name, n);
        let large = shape(name, 4 * n);
        let (a, b) = (time(&small), time(&large));
        println!("| {name} | {a:.3} s | {b:.3} s | {:.1} |", b / a.max(1e-6));
    }
}
