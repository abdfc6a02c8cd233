//! A realistic agent workload, for benchmarks, the load generator and generated
//! recordings: requests of client spans mixing HTTP, MCP, gRPC and A2A attempts with 10
//! attributes each (about 400 bytes a span encoded), a fifth of them failing.
//!
//! Core: pure builders; deterministic for the same arguments.

use crate::otlp::wire;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use std::ops::Range;

/// Span times start here (2023-11-14T22:13:20Z), one millisecond apart.
pub const T0: u64 = 1_700_000_000_000_000_000;

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn s(key: &str, v: &str) -> KeyValue {
    kv(key, Value::StringValue(v.into()))
}

fn i(key: &str, v: i64) -> KeyValue {
    kv(key, Value::IntValue(v))
}

/// The `n`-th span of request `request`: HTTP, MCP, gRPC and A2A in turn, 10 attributes
/// each, every fifth failing (503, JSON-RPC -32602, UNAVAILABLE, A2A TaskNotFound).
pub fn span(n: usize, request: usize, spans_per_request: usize) -> Span {
    let fail = n % 5 == 0;
    let tail = |code: KeyValue| {
        if fail {
            [code, s("error.type", "failed")]
        } else {
            [s("thread.name", "worker-1"), i("thread.id", 7)]
        }
    };
    let mut attributes = match n % 4 {
        0 => vec![
            s("http.request.method", "POST"),
            s(
                "url.full",
                &format!("http://api{}.example:8080/v1/items/{}", n % 7, n % 11),
            ),
            s("server.address", &format!("api{}.example", n % 7)),
            i("server.port", 8080),
            i("http.response.status_code", if fail { 503 } else { 200 }),
            s("network.protocol.version", "1.1"),
            s("user_agent.original", "agent/1.0"),
            i("http.request.body.size", 512),
        ],
        1 => vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", &format!("tool_{}", n % 13)),
            s("gen_ai.operation.name", "execute_tool"),
            s("server.address", "mcp.example"),
            i("server.port", 8080),
            s("network.transport", "tcp"),
            s("jsonrpc.request.id", &n.to_string()),
            s("mcp.session.id", "5f1c3c7e"),
        ],
        2 => vec![
            s("rpc.system", "grpc"),
            s("rpc.service", "inventory.v1.Stock"),
            s("rpc.method", &format!("Get{}", n % 5)),
            i("rpc.grpc.status_code", if fail { 14 } else { 0 }),
            s("server.address", "stock.example"),
            i("server.port", 50051),
            s("network.peer.address", "10.0.0.7"),
            s("network.type", "ipv4"),
        ],
        _ => vec![
            s(
                "a2a.method.name",
                if n % 3 == 0 { "GetTask" } else { "SendMessage" },
            ),
            s("url.full", "http://agent.example/a2a/v1"),
            s("http.request.method", "POST"),
            s("server.address", "agent.example"),
            i("server.port", 80),
            s("network.transport", "tcp"),
            s("a2a.context.id", "ctx-42"),
            s("a2a.task.id", &format!("task-{}", n % 17)),
        ],
    };
    let code = match n % 4 {
        0 => s("http.response.body.size", "0"),
        2 => s("rpc.grpc.status_text", "UNAVAILABLE"),
        _ => s(
            "rpc.response.status_code",
            if n % 4 == 1 { "-32602" } else { "-32001" },
        ),
    };
    attributes.extend(tail(code));
    let seq = (request * spans_per_request + n) as u64;
    let start = T0 + seq * 1_000_000;
    Span {
        trace_id: u128::from(seq).to_be_bytes().to_vec(),
        span_id: (seq + 1).to_be_bytes().to_vec(),
        name: "call".into(),
        kind: 3,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 500_000,
        attributes,
        ..Default::default()
    }
}

/// Request `n` of the workload: one resource (client `agent-{n % clients}`) with
/// `spans` client spans.
pub fn request(n: usize, clients: usize, spans: usize) -> ExportTraceServiceRequest {
    let client = n % clients.max(1);
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    s("service.name", &format!("agent-{client}")),
                    s("service.instance.id", &format!("pod-{client:012}")),
                    s("telemetry.sdk.language", "rust"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: (0..spans).map(|k| span(k, n, spans)).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A request of the workload encoded once, with where its spans' ids and times stand, so
/// that every send can stamp new ones (fresh span ids, later times) into a copy without
/// re-encoding: a real fleet never sends the same span twice, and a benchmark that replays
/// old spans measures the tracker's duplicate and out-of-order paths instead of its
/// steady state.
#[derive(Debug, Clone)]
pub struct Encoded {
    body: Vec<u8>,
    /// For each span: where its span id, start time and end time are.
    stamps: Vec<[usize; 3]>,
    /// Where the twelve digits of the client's `service.instance.id` are.
    instance: Range<usize>,
}

impl Encoded {
    /// Request `n` of the workload (see [`request`]).
    pub fn new(n: usize, clients: usize, spans: usize) -> Encoded {
        let body = request(n, clients, spans).encode_to_vec();
        let mut stamps = Vec::with_capacity(spans);
        let marker = format!("pod-{:012}", n % clients.max(1));
        let at = body
            .windows(marker.len())
            .position(|w| w == marker.as_bytes())
            .expect("the workload writes the instance id");
        let instance = at + 4..at + marker.len();
        for rs in fields(&body, 0..body.len(), 1) {
            for ss in fields(&body, rs, 2) {
                for span in fields(&body, ss, 2) {
                    let at = |number: u32| {
                        fields(&body, span.clone(), number)
                            .next()
                            .map(|r| r.start)
                            .expect("the workload writes it")
                    };
                    stamps.push([at(2), at(7), at(8)]);
                }
            }
        }
        Encoded {
            body,
            stamps,
            instance,
        }
    }

    /// Makes a stamped copy come from client instance `n` (`pod-` and twelve digits)
    /// instead: what a fleet whose instances come and go looks like.
    pub fn set_instance(&self, body: &mut [u8], n: u64) {
        let digits = format!("{:012}", n % 1_000_000_000_000);
        body[self.instance.clone()].copy_from_slice(digits.as_bytes());
    }

    /// A copy for send number `send`: span ids made unique to it, times moved on by `shift`
    /// nanoseconds.
    pub fn stamped(&self, send: u64, shift: u64) -> Vec<u8> {
        let mut body = self.body.clone();
        for (i, &[id, start, end]) in self.stamps.iter().enumerate() {
            body[id..id + 8].copy_from_slice(&(send << 24 | i as u64).to_be_bytes());
            for at in [start, end] {
                let mut t = [0; 8];
                t.copy_from_slice(&body[at..at + 8]);
                body[at..at + 8].copy_from_slice(&(u64::from_le_bytes(t) + shift).to_le_bytes());
            }
        }
        body
    }
}

/// Where the values of the fields numbered `wanted` stand in the message at `within`: the
/// bytes of a length-delimited field, the eight bytes of a fixed64. Panics on broken
/// framing (the workload's own encoding is never broken).
fn fields(
    buf: &[u8],
    within: Range<usize>,
    wanted: u32,
) -> impl Iterator<Item = Range<usize>> + '_ {
    let base = buf.as_ptr() as usize;
    wire::raw_fields(&buf[within])
        .map(|f| f.expect("valid framing"))
        .filter(move |f| f.number == wanted)
        .map(move |f| {
            // A fixed64 is the last eight bytes of its field.
            let value = f.payload.unwrap_or(&f.raw[f.raw.len().saturating_sub(8)..]);
            let start = value.as_ptr() as usize - base;
            start..start + value.len()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_workload_is_realistic() {
        let r = request(3, 16, 100);
        let bytes = r.encode_to_vec().len();
        assert!(
            (30_000..60_000).contains(&bytes),
            "about 400 bytes a span: {bytes}"
        );
        let spans = &r.resource_spans[0].scope_spans[0].spans;
        let failing = spans
            .iter()
            .filter(|s| s.attributes.iter().any(|a| a.key == "error.type"))
            .count();
        assert_eq!(failing, 20, "a fifth fail");
        assert!(spans.iter().all(|s| (8..=10).contains(&s.attributes.len())));
    }

    #[test]
    fn a_stamped_copy_has_new_ids_and_later_times() {
        let encoded = Encoded::new(3, 16, 100);
        let original = request(3, 16, 100);
        let copy =
            ExportTraceServiceRequest::decode(&encoded.stamped(7, 5_000)[..]).expect("valid");
        let (a, b) = (
            &original.resource_spans[0].scope_spans[0].spans,
            &copy.resource_spans[0].scope_spans[0].spans,
        );
        assert_eq!(a.len(), b.len());
        for (i, (a, b)) in a.iter().zip(b).enumerate() {
            assert_eq!(b.span_id, (7u64 << 24 | i as u64).to_be_bytes());
            assert_eq!(b.start_time_unix_nano, a.start_time_unix_nano + 5_000);
            assert_eq!(b.end_time_unix_nano, a.end_time_unix_nano + 5_000);
            assert_eq!(b.attributes, a.attributes);
        }
        let mut body = encoded.stamped(7, 0);
        encoded.set_instance(&mut body, 42);
        let moved = ExportTraceServiceRequest::decode(&body[..]).expect("valid");
        let resource = moved.resource_spans[0]
            .resource
            .as_ref()
            .expect("a resource");
        assert!(resource
            .attributes
            .iter()
            .any(|kv| kv.key == "service.instance.id"
                && kv.value.as_ref().and_then(|v| v.value.as_ref())
                    == Some(&Value::StringValue("pod-000000000042".into()))));
    }
}
