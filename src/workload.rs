//! A realistic agent workload, for benchmarks, the load generator and generated
//! recordings: requests of client spans mixing HTTP, MCP, gRPC and A2A attempts with 10
//! attributes each (about 400 bytes a span encoded), a fifth of them failing — and the same
//! calls as real agent stacks describe them ([`Trees`]): an agent's INTERNAL span, a protocol
//! CLIENT span under it, and the HTTP CLIENT span under that, half of them split over two
//! requests (the HTTP child a request before its parents, as SDKs export them).
//!
//! Core: pure builders; deterministic for the same arguments.

use crate::otlp::wire;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use std::ops::Range;

pub mod hostile;

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

/// `spans` under one resource of `attributes`, in one scope.
fn resource_spans(attributes: Vec<KeyValue>, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(Resource {
            attributes,
            ..Default::default()
        }),
        scope_spans: vec![ScopeSpans {
            spans,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Request `n` of the workload: one resource (client `agent-{n % clients}`) with
/// `spans` client spans.
pub fn request(n: usize, clients: usize, spans: usize) -> ExportTraceServiceRequest {
    let client = n % clients.max(1);
    ExportTraceServiceRequest {
        resource_spans: vec![resource_spans(
            vec![
                s("service.name", &format!("agent-{client}")),
                s("service.instance.id", &format!("pod-{client:012}")),
                s("telemetry.sdk.language", "rust"),
            ],
            (0..spans).map(|k| span(k, n, spans)).collect(),
        )],
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
    /// Where the twelve digits of each span's tool name are (a [`fresh_keys_request`]).
    tools: Vec<Range<usize>>,
}

/// The tool name of every span of a [`fresh_keys_request`] before [`Encoded::set_keys`]
/// numbers it: `tool-` and twelve digits.
const FRESH_TOOL: &str = "tool-000000000000";

/// Request `n` of the fresh-keys workload: [`request`]'s, span `k` with the attributes of the
/// workload's MCP `tools/call` span `4k + 1` (a fifth of them failing, as the workload's spans
/// do), each of its own tool ([`FRESH_TOOL`], numbered by [`Encoded::set_keys`]): every span
/// opens a key, as a client that calls a new tool each time does — what eviction past
/// `tracker.max_keys` is measured by.
pub fn fresh_keys_request(n: usize, clients: usize, spans: usize) -> ExportTraceServiceRequest {
    let mut r = request(n, clients, spans);
    for (k, span) in r.resource_spans[0].scope_spans[0]
        .spans
        .iter_mut()
        .enumerate()
    {
        let mcp = self::span(4 * k + 1, n, spans);
        span.attributes = mcp.attributes;
        for a in &mut span.attributes {
            if a.key == "gen_ai.tool.name" {
                a.value = Some(AnyValue {
                    value: Some(Value::StringValue(FRESH_TOOL.into())),
                });
            }
        }
    }
    r
}

impl Encoded {
    /// Request `n` of the workload (see [`request`]).
    pub fn new(n: usize, clients: usize, spans: usize) -> Encoded {
        Encoded::of(
            request(n, clients, spans).encode_to_vec(),
            n,
            clients,
            spans,
        )
    }

    /// Request `n` of the fresh-keys workload (see [`fresh_keys_request`]): each send is
    /// given its own tools by [`Encoded::set_keys`].
    pub fn fresh_keys(n: usize, clients: usize, spans: usize) -> Encoded {
        let body = fresh_keys_request(n, clients, spans).encode_to_vec();
        let mut encoded = Encoded::of(body, n, clients, spans);
        let digits = FRESH_TOOL.len() - "tool-".len();
        encoded.tools = encoded
            .body
            .windows(FRESH_TOOL.len())
            .enumerate()
            .filter(|(_, w)| *w == FRESH_TOOL.as_bytes())
            .map(|(at, _)| at + FRESH_TOOL.len() - digits..at + FRESH_TOOL.len())
            .collect();
        assert_eq!(encoded.tools.len(), spans, "every span names its tool once");
        encoded
    }

    /// `body`, request `n` of a fleet of `clients` with `spans` spans, and where its stamps
    /// go.
    fn of(body: Vec<u8>, n: usize, clients: usize, spans: usize) -> Encoded {
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
            tools: Vec::new(),
        }
    }

    /// Gives each span of a stamped copy of send number `send` a tool of its own, never
    /// named by another send (a [`Encoded::fresh_keys`] request; others have no tools to
    /// number).
    pub fn set_keys(&self, body: &mut [u8], send: u64) {
        let spans = self.tools.len() as u64;
        for (i, at) in self.tools.iter().enumerate() {
            let digits = format!("{:012}", (send * spans + i as u64) % 1_000_000_000_000);
            body[at.clone()].copy_from_slice(digits.as_bytes());
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

/// One span of a [`Trees`] request: what it is in its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The agent's INTERNAL span, the root of the call.
    Agent,
    /// The protocol SDK's CLIENT span.
    Protocol,
    /// The HTTP client's CLIENT span: the transport request.
    Http,
    /// The MCP server's SERVER span of the call, the child of its transport request: what
    /// the server exports of it ([`Trees::server_stamped`]).
    Server,
}

/// The `service.name` of the MCP server of the tree workload's MCP calls, whose SERVER spans
/// [`Trees::server_stamped`] gives: observe `http://mcp.example:8080/mcp` through it to run the
/// workload with the server view (DESIGN §9).
pub const SERVER_SERVICE: &str = "mcp-server";

/// Calls split over two requests, of a [`Trees`] request's 33 (a hundred spans), unless
/// asked otherwise ([`Trees::with_split`]).
pub const SPLIT: usize = 16;

/// The `role` span of call `call` of a [`Trees`] request (ids and times are stamped later):
/// MCP `tools/call` and A2A `SendMessage` in turn over HTTP, every fifth request failing 503.
fn tree_span(call: usize, role: Role) -> Span {
    let fail = call % 5 == 0;
    let mcp = call % 2 == 0;
    let (kind, name, attributes) = match role {
        Role::Agent => (
            1,
            "invoke_agent planner".to_owned(),
            vec![
                s("gen_ai.operation.name", "invoke_agent"),
                s("gen_ai.agent.name", "planner"),
                s("gen_ai.system", "openai"),
                s("gen_ai.request.model", "gpt-5"),
                i("gen_ai.usage.input_tokens", 1200),
            ],
        ),
        Role::Protocol if mcp => (
            3,
            format!("MCP send tools/call tool_{}", call % 13),
            vec![
                s("mcp.method.name", "tools/call"),
                s("gen_ai.tool.name", &format!("tool_{}", call % 13)),
                s("gen_ai.operation.name", "execute_tool"),
                s("jsonrpc.request.id", &call.to_string()),
                s("mcp.session.id", "5f1c3c7e"),
                s("network.transport", "tcp"),
            ],
        ),
        Role::Protocol => (
            3,
            "SendMessage".to_owned(),
            vec![
                s("a2a.method.name", "SendMessage"),
                s("a2a.context.id", "ctx-42"),
                s("a2a.task.id", &format!("task-{}", call % 17)),
                s("network.transport", "tcp"),
            ],
        ),
        Role::Server => (
            2,
            format!("MCP handle tools/call tool_{}", call % 13),
            vec![
                s("mcp.method.name", "tools/call"),
                s("gen_ai.tool.name", &format!("tool_{}", call % 13)),
                s("gen_ai.operation.name", "execute_tool"),
                s("jsonrpc.request.id", &call.to_string()),
                s("mcp.session.id", "5f1c3c7e"),
                s("mcp.protocol.version", "2026-07-28"),
            ],
        ),
        Role::Http => {
            let url = if mcp {
                "http://mcp.example:8080/mcp"
            } else {
                "http://agent.example/a2a/v1"
            };
            (
                3,
                "POST".to_owned(),
                vec![
                    s("http.request.method", "POST"),
                    s("url.full", url),
                    s(
                        "server.address",
                        if mcp { "mcp.example" } else { "agent.example" },
                    ),
                    i("server.port", if mcp { 8080 } else { 80 }),
                    i("http.response.status_code", if fail { 503 } else { 200 }),
                    s("network.protocol.version", "1.1"),
                    s("user_agent.original", "python-httpx/0.28.1"),
                    s("error.type", if fail { "503" } else { "" }),
                ],
            )
        }
    };
    Span {
        trace_id: vec![0; 16],
        span_id: vec![0; 8],
        parent_span_id: if role == Role::Agent {
            Vec::new()
        } else {
            vec![0; 8]
        },
        name,
        kind,
        start_time_unix_nano: T0,
        end_time_unix_nano: T0,
        attributes,
        ..Default::default()
    }
}

/// Where one span of a [`Trees`] request takes its ids and times from.
#[derive(Debug, Clone, Copy)]
struct TreeStamp {
    /// Where its trace id, span id, parent span id (if any), start and end are.
    at: [Option<usize>; 5],
    /// Its call among the request's, and its role.
    call: usize,
    role: Role,
    /// The call is the previous request's (its HTTP span went out with that one).
    previous: bool,
}

/// Request `n` of the tree workload, encoded once (see [`tree_request`]), with where its ids
/// and times stand: [`Trees::stamped`] gives the calls of one client's `seq`-th request ids of
/// their own, and the parents of the calls split from request `seq - 1` the ids those
/// children had, as one SDK process sends them.
#[derive(Debug, Clone)]
pub struct Trees {
    body: Vec<u8>,
    stamps: Vec<TreeStamp>,
    /// The MCP server's request of the same calls, and where its spans' ids and times stand.
    server: Vec<u8>,
    server_stamps: Vec<TreeStamp>,
    client: usize,
}

/// Request `n` of the tree workload: one resource (client `agent-{n % clients}`) with the
/// spans of `spans / 3` calls: the parents (protocol and agent spans) of the `split` calls
/// (at most half of them) whose HTTP spans went with the client's previous request, the
/// whole of the others, and the HTTP spans alone of the next `split` — each in the order an
/// SDK ends them.
pub fn tree_request(
    n: usize,
    clients: usize,
    spans: usize,
    split: usize,
) -> ExportTraceServiceRequest {
    let mut r = request(n, clients, 0);
    r.resource_spans[0].scope_spans[0].spans = tree_layout(spans, split)
        .into_iter()
        .map(|(call, role, _)| tree_span(call, role))
        .collect();
    r
}

/// The spans of a tree request of which `split` calls are split: (call, role, whether the call
/// is the previous request's).
fn tree_layout(spans: usize, split: usize) -> Vec<(usize, Role, bool)> {
    let calls = spans / 3;
    let split = split.min(calls / 2);
    let mut out = Vec::with_capacity(calls * 3);
    for call in 0..split {
        out.extend([(call, Role::Protocol, true), (call, Role::Agent, true)]);
    }
    for call in split..calls {
        out.extend([
            (call, Role::Http, false),
            (call, Role::Protocol, false),
            (call, Role::Agent, false),
        ]);
    }
    for call in 0..split {
        out.push((call, Role::Http, false));
    }
    out
}

impl Trees {
    /// Request `n` of the tree workload (see [`tree_request`]), [`SPLIT`] of its calls split.
    pub fn new(n: usize, clients: usize, spans: usize) -> Trees {
        Trees::with_split(n, clients, spans, SPLIT)
    }

    /// Request `n` of the tree workload with `split` of its calls split over two requests (at
    /// most half of them; none with 0, every call's spans in one request).
    pub fn with_split(n: usize, clients: usize, spans: usize, split: usize) -> Trees {
        let body = tree_request(n, clients, spans, split).encode_to_vec();
        let stamps = tree_stamps(&body, &tree_layout(spans, split));
        // The server's spans of the request's MCP calls, in the order it ends them.
        let layout: Vec<(usize, Role, bool)> = (0..spans / 3)
            .filter(|call| call % 2 == 0)
            .map(|call| (call, Role::Server, false))
            .collect();
        let mut server = request(n, clients, 0);
        server.resource_spans[0].resource = Some(Resource {
            attributes: vec![s("service.name", SERVER_SERVICE)],
            ..Default::default()
        });
        server.resource_spans[0].scope_spans[0].spans = layout
            .iter()
            .map(|&(call, role, _)| tree_span(call, role))
            .collect();
        let server = server.encode_to_vec();
        Trees {
            server_stamps: tree_stamps(&server, &layout),
            server,
            body,
            stamps,
            client: n % clients.max(1),
        }
    }

    /// The client (`agent-{client}`) that sends it.
    pub fn client(&self) -> usize {
        self.client
    }

    /// A copy as the client's `seq`-th request: every call's trace and span ids its own (its
    /// client's, its request's), times moving on a millisecond a call.
    pub fn stamped(&self, seq: u64) -> Vec<u8> {
        self.stamp(&self.body, &self.stamps, seq)
    }

    /// The MCP server's request of the MCP calls of the client's `seq`-th request (their HTTP
    /// spans': a split call's parents come with the next): a SERVER span of each from
    /// [`SERVER_SERVICE`], the child of the call's transport request, in its trace.
    pub fn server_stamped(&self, seq: u64) -> Vec<u8> {
        self.stamp(&self.server, &self.server_stamps, seq)
    }

    /// How many spans [`Trees::server_stamped`] holds.
    pub fn server_spans(&self) -> usize {
        self.server_stamps.len()
    }

    fn stamp(&self, body: &[u8], stamps: &[TreeStamp], seq: u64) -> Vec<u8> {
        let mut body = body.to_vec();
        let calls = (self.stamps.len() / 3).max(1) as u64;
        for st in stamps {
            let seq = if st.previous {
                seq.wrapping_sub(1)
            } else {
                seq
            };
            // A call's id: unique per client, request and call.
            let call = ((self.client as u64) << 40) | ((seq & 0xff_ffff) << 12) | st.call as u64;
            // Two bits of role: the server's span takes the one the client's spans leave.
            let id = |role: Role| {
                let bits = match role {
                    Role::Server => 0,
                    role => role as u64 + 1,
                };
                ((call << 2) | bits).to_be_bytes()
            };
            let start = T0 + (seq * calls + st.call as u64) * 1_000_000;
            let (begin, end) = match st.role {
                Role::Agent => (start, start + 900_000),
                Role::Protocol => (start + 100_000, start + 800_000),
                Role::Http => (start + 200_000, start + 700_000),
                Role::Server => (start + 250_000, start + 650_000),
            };
            let parent = match st.role {
                Role::Agent => None,
                Role::Protocol => Some(id(Role::Agent)),
                Role::Http => Some(id(Role::Protocol)),
                Role::Server => Some(id(Role::Http)),
            };
            let mut trace = [0u8; 16];
            trace[8..].copy_from_slice(&call.to_be_bytes());
            let [trace_at, span_at, parent_at, start_at, end_at] = st.at;
            let mut put = |at: Option<usize>, bytes: &[u8]| {
                if let Some(at) = at {
                    body[at..at + bytes.len()].copy_from_slice(bytes);
                }
            };
            put(trace_at, &trace);
            put(span_at, &id(st.role));
            if let Some(parent) = parent {
                put(parent_at, &parent);
            }
            put(start_at, &begin.to_le_bytes());
            put(end_at, &end.to_le_bytes());
        }
        body
    }
}

/// Where the ids and times of each span of the encoded request `body` stand, its spans
/// laid out as `layout` (call, role, whether the call is the previous request's).
fn tree_stamps(body: &[u8], layout: &[(usize, Role, bool)]) -> Vec<TreeStamp> {
    let mut stamps = Vec::with_capacity(layout.len());
    for rs in fields(body, 0..body.len(), 1) {
        for ss in fields(body, rs, 2) {
            for span in fields(body, ss, 2) {
                let at = |number: u32| fields(body, span.clone(), number).next().map(|r| r.start);
                let (call, role, previous) = layout[stamps.len()];
                stamps.push(TreeStamp {
                    at: [at(1), at(2), at(4), at(7), at(8)],
                    call,
                    role,
                    previous,
                });
            }
        }
    }
    stamps
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

    #[test]
    fn each_send_of_a_fresh_keys_request_calls_tools_no_other_send_called() {
        let encoded = Encoded::fresh_keys(3, 16, 100);
        let tools = |send: u64| {
            let mut body = encoded.stamped(send, 0);
            encoded.set_keys(&mut body, send);
            let r = ExportTraceServiceRequest::decode(&body[..]).expect("valid");
            let spans = r.resource_spans[0].scope_spans[0].spans.clone();
            assert_eq!(spans.len(), 100);
            spans
                .iter()
                .map(|span| {
                    let value = |key: &str| {
                        span.attributes
                            .iter()
                            .find(|a| a.key == key)
                            .and_then(|a| a.value.clone()?.value)
                    };
                    assert_eq!(
                        value("mcp.method.name"),
                        Some(Value::StringValue("tools/call".into()))
                    );
                    match value("gen_ai.tool.name") {
                        Some(Value::StringValue(tool)) => tool,
                        other => panic!("a tool name: {other:?}"),
                    }
                })
                .collect::<Vec<_>>()
        };
        // Span k is the workload's MCP span 4k + 1 but for its tool: a fifth of them fail.
        let fresh = fresh_keys_request(3, 16, 100);
        for (k, span) in fresh.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .enumerate()
        {
            let like = self::span(4 * k + 1, 3, 100);
            let other = |attributes: &[KeyValue]| {
                attributes
                    .iter()
                    .filter(|a| a.key != "gen_ai.tool.name")
                    .cloned()
                    .collect::<Vec<_>>()
            };
            assert_eq!(other(&span.attributes), other(&like.attributes), "span {k}");
        }
        let (first, second) = (tools(7), tools(8));
        assert_eq!(first[0], "tool-000000000700");
        assert_eq!(first[99], "tool-000000000799");
        assert_eq!(second[0], "tool-000000000800");
        let all: std::collections::BTreeSet<_> = first.iter().chain(&second).collect();
        assert_eq!(all.len(), 200, "no tool twice");
    }

    #[test]
    fn a_tree_requests_split_calls_find_their_parents_in_the_clients_next_request() {
        let trees = Trees::new(3, 16, 100);
        assert_eq!(trees.client(), 3);
        let decode = |seq| {
            ExportTraceServiceRequest::decode(&trees.stamped(seq)[..])
                .expect("valid")
                .resource_spans[0]
                .scope_spans[0]
                .spans
                .clone()
        };
        let (first, next) = (decode(5), decode(6));
        assert_eq!(first.len(), 99);
        let layout = tree_layout(100, SPLIT);
        let by = |spans: &[Span], call: usize, role: Role, previous: bool| {
            let at = layout
                .iter()
                .position(|l| *l == (call, role, previous))
                .expect("in the layout");
            spans[at].clone()
        };
        for call in 0..SPLIT {
            // Its HTTP span went with request 5; its parents come with request 6.
            let http = by(&first, call, Role::Http, false);
            let protocol = by(&next, call, Role::Protocol, true);
            let agent = by(&next, call, Role::Agent, true);
            assert_eq!(http.parent_span_id, protocol.span_id, "call {call}");
            assert_eq!(protocol.parent_span_id, agent.span_id);
            assert_eq!(http.trace_id, protocol.trace_id);
            assert!(agent.parent_span_id.is_empty());
            assert!(protocol.start_time_unix_nano <= http.start_time_unix_nano);
            assert!(http.end_time_unix_nano <= protocol.end_time_unix_nano);
        }
        for call in SPLIT..33 {
            let http = by(&first, call, Role::Http, false);
            let protocol = by(&first, call, Role::Protocol, false);
            assert_eq!(http.parent_span_id, protocol.span_id, "call {call}");
            assert_eq!((http.kind, protocol.kind), (3, 3));
            assert_eq!(by(&first, call, Role::Agent, false).kind, 1);
        }
        let ids: std::collections::BTreeSet<Vec<u8>> = first
            .iter()
            .chain(&next)
            .map(|s| s.span_id.clone())
            .collect();
        assert_eq!(ids.len(), 2 * 99, "every span its own id");
    }

    #[test]
    fn a_tree_request_without_splits_has_every_call_whole() {
        let trees = Trees::with_split(3, 16, 100, 0);
        let spans = ExportTraceServiceRequest::decode(&trees.stamped(5)[..])
            .expect("valid")
            .resource_spans[0]
            .scope_spans[0]
            .spans
            .clone();
        assert_eq!(spans.len(), 99);
        let ids: std::collections::BTreeSet<&[u8]> = spans.iter().map(|s| &s.span_id[..]).collect();
        // Every parent named is in the request: 33 HTTP and 33 protocol spans name one.
        let mut named = spans.iter().filter(|s| !s.parent_span_id.is_empty());
        assert_eq!(named.clone().count(), 66);
        assert!(named.all(|s| ids.contains(&s.parent_span_id[..])));
        // Asked for more than half, half of them are split: the default's 16 of 33.
        assert_eq!(tree_layout(100, 40), tree_layout(100, SPLIT));
    }

    #[test]
    fn the_servers_spans_are_the_children_of_the_mcp_calls_transport_requests() {
        let trees = Trees::new(3, 16, 100);
        let decode = |body: Vec<u8>| {
            let r = ExportTraceServiceRequest::decode(&body[..]).expect("valid");
            let service = r.resource_spans[0]
                .resource
                .clone()
                .expect("a resource")
                .attributes[0]
                .clone();
            (r.resource_spans[0].scope_spans[0].spans.clone(), service)
        };
        let (client, _) = decode(trees.stamped(5));
        let (server, service) = decode(trees.server_stamped(5));
        assert_eq!(service, s("service.name", SERVER_SERVICE));
        // One for each of the 17 MCP calls of 33, each under its call's POST to the MCP server.
        assert_eq!((server.len(), trees.server_spans()), (17, 17));
        let posts: Vec<&Span> = client
            .iter()
            .filter(|c| {
                c.attributes
                    .contains(&s("url.full", "http://mcp.example:8080/mcp"))
            })
            .collect();
        assert_eq!(posts.len(), 17);
        for span in &server {
            assert_eq!(span.kind, 2);
            let post = posts
                .iter()
                .find(|p| p.span_id == span.parent_span_id)
                .expect("its transport request");
            assert_eq!(post.trace_id, span.trace_id);
            assert!(post.start_time_unix_nano < span.start_time_unix_nano);
            assert!(span.end_time_unix_nano < post.end_time_unix_nano);
            let tool = |s: &Span| {
                s.attributes
                    .iter()
                    .find(|a| a.key == "gen_ai.tool.name")
                    .cloned()
            };
            let call = client.iter().find(|c| c.span_id == post.parent_span_id);
            // The split calls' protocol spans come with the next request: the tool is the
            // server's to say.
            if let Some(call) = call {
                assert_eq!(tool(call), tool(span));
            }
        }
        let ids: std::collections::BTreeSet<&[u8]> = client
            .iter()
            .chain(&server)
            .map(|s| &s.span_id[..])
            .collect();
        assert_eq!(ids.len(), client.len() + server.len(), "ids of their own");
    }
}
