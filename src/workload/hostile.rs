//! The hostile call trees of issue 44, as export requests: one trace whose parent ids form a
//! ring, a star, a chain, protocol server spans carried by one HTTP server span, HTTP server
//! spans each carrying the protocol server span inside its time, a gateway comb (a chain of
//! proxied HTTP server spans, a protocol span under each), and siblings of a parent that never
//! comes, sent one a request. What `examples/hostile_join` times and `tests/abuse.rs` sends.
//!
//! Core: pure builders; deterministic for the same arguments.

use super::s;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// The configuration the shapes are meant for: an MCP interface observed from its side, and
/// room to hold every span of the largest shape for the window.
pub const CONFIG: &str = "
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

fn id(n: usize) -> Vec<u8> {
    (n as u64 + 1).to_be_bytes().to_vec()
}

/// Span `n` of the shape's trace, under span `parent` (`None`: a parent that never comes).
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
            s("mcp.method.name", "tools/call"),
            s("url.full", "http://mcp.test:8080/mcp"),
        ],
    )
}

fn http_client(n: usize, parent: Option<usize>) -> Span {
    span(
        n,
        parent,
        3,
        vec![
            s("http.request.method", "POST"),
            s("url.full", "http://mcp.test:8080/mcp"),
        ],
    )
}

fn http_server(n: usize, parent: Option<usize>) -> Span {
    span(
        n,
        parent,
        2,
        vec![
            s("http.request.method", "POST"),
            s("url.path", "/mcp"),
            s("client.address", "10.0.0.9"),
        ],
    )
}

fn mcp_server(n: usize, parent: Option<usize>) -> Span {
    span(n, parent, 2, vec![s("mcp.method.name", "tools/call")])
}

/// One export request of `service`'s `spans`, all of trace `trace` (each shape a trace of its
/// own, so that shapes sent to one server do not share span ids).
fn export(trace: u8, service: &str, mut spans: Vec<Span>) -> Vec<u8> {
    for span in &mut spans {
        span.trace_id = vec![trace; 16];
    }
    ExportTraceServiceRequest {
        resource_spans: vec![super::resource_spans(
            vec![s("service.name", service)],
            spans,
        )],
    }
    .encode_to_vec()
}

/// The shapes, by name.
pub const SHAPES: [&str; 7] = [
    "ring",
    "star",
    "chain",
    "carriers",
    "carriers by time",
    "gateway comb",
    "siblings, a request each",
];

/// The export requests (OTLP protobuf) of shape `name` (one of [`SHAPES`]) at `n` spans.
///
/// # Panics
/// When `name` is not one of [`SHAPES`].
pub fn requests(name: &str, n: usize) -> Vec<Vec<u8>> {
    let trace = SHAPES
        .iter()
        .position(|s| *s == name)
        .map_or(0, |i| i as u8 + 1);
    match name {
        "ring" => vec![export(
            trace,
            "agent",
            (0..n).map(|i| mcp_client(i, Some((i + 1) % n))).collect(),
        )],
        "star" => vec![export(
            trace,
            "agent",
            std::iter::once(mcp_client(0, None))
                .chain((1..n).map(|i| http_client(i, Some(0))))
                .collect(),
        )],
        "chain" => vec![export(
            trace,
            "agent",
            (0..n).map(|i| mcp_client(i, i.checked_sub(1))).collect(),
        )],
        "carriers by time" => vec![export(
            trace,
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
            trace,
            "weather-server",
            std::iter::once(http_server(0, None))
                .chain((1..n).map(|i| mcp_server(i, Some(0))))
                .collect(),
        )],
        "gateway comb" => vec![export(
            trace,
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
            .map(|i| export(trace, "agent", vec![http_client(i, None)]))
            .collect(),
        _ => panic!("no shape named {name:?}"),
    }
}
