//! Extraction: one OTLP span (and its resource) → one [`Attempt`] (DESIGN §3).
//!
//! Core: pure. It reads each attribute once, borrows every string it keeps from the
//! request, and allocates nothing (the normalised origin is built in a fixed buffer). A span
//! is read through [`SpanView`]: straight from the protobuf bytes (every request), from a
//! Gate API question, or from prost's owned types (tests). It does not classify, log, count or look at
//! a clock; a span that is not an attempt comes back as a [`Skip`] reason.

pub mod call;
pub mod owned;
mod words;

pub use owned::Owned;

use crate::discovery::{is_reflection, InterfaceRef, Interfaces};
pub use crate::otlp::{SpanView, Val};
use crate::url::{self, Origin};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

/// The protocol family of an attempt, which decides how its codes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Model Context Protocol (`mcp.method.name`).
    Mcp,
    /// Agent2Agent (`a2a.method.name`).
    A2a,
    /// Plain JSON-RPC (`rpc.system` = `jsonrpc`).
    JsonRpc,
    /// gRPC (`rpc.system` = `grpc`).
    Grpc,
    /// Plain HTTP (`http.request.method`).
    Http,
}

/// Why a span is not an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its kind is not CLIENT.
    NotClient,
    /// A client span of no protocol family refusal-gate knows.
    NoProtocol,
}

impl Skip {
    /// The `reason` label of `refusal_gate_spans_skipped_total`.
    pub fn label(self) -> &'static str {
        match self {
            Skip::NotClient => "not_client",
            Skip::NoProtocol => "no_protocol",
        }
    }
}

/// Who sent an attempt: resource `service.name` and `service.instance.id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Client<'a> {
    /// `service.name`, or `unknown_service`.
    pub name: &'a str,
    /// `service.instance.id`, when present.
    pub instance: Option<&'a str>,
}

/// What an attempt asked for; the third part of the tracker's key. Borrowed parts stand for
/// `METHOD path`, `method target` or `service/method` without formatting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation<'a> {
    /// HTTP method, JSON-RPC method, or gRPC service.
    pub verb: &'a str,
    /// Path, target (tool, prompt, resource), or gRPC method; may be empty.
    pub target: &'a str,
    /// Whether this is a gRPC `service/method`.
    pub grpc: bool,
    /// The undeclared path a protocol call was sent to (DESIGN §11.1: `initialize /mcp/sse`,
    /// so that each undeclared path is a key of its own); empty for every other attempt.
    pub via: &'a str,
}

impl Operation<'_> {
    /// An operation of `verb` and `target`, sent where it should be.
    pub fn new<'a>(verb: &'a str, target: &'a str, grpc: bool) -> Operation<'a> {
        Operation {
            verb,
            target,
            grpc,
            via: "",
        }
    }
}

/// Hashed as it was before `via` existed when it is empty, so that keys kept in a state
/// file keep their ids.
impl std::hash::Hash for Operation<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.verb.hash(state);
        self.target.hash(state);
        self.grpc.hash(state);
        if !self.via.is_empty() {
            self.via.hash(state);
        }
    }
}

impl std::fmt::Display for Operation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.grpc, self.target.is_empty()) {
            (_, true) => f.write_str(self.verb)?,
            (true, false) => write!(f, "{}/{}", self.verb, self.target)?,
            (false, false) => write!(f, "{} {}", self.verb, self.target)?,
        }
        if !self.via.is_empty() {
            write!(f, " {}", self.via)?;
        }
        Ok(())
    }
}

/// The response signals of an attempt, as read from its attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signal<'a> {
    /// `http.response.status_code` / `http.status_code`.
    pub http_status: Option<u16>,
    /// A non-zero JSON-RPC error code.
    pub jsonrpc_code: Option<i64>,
    /// A gRPC status code.
    pub grpc_code: Option<i32>,
    /// What says the attempt timed out (an `error.type` or `exception.type`), if anything.
    pub timeout: Option<&'a str>,
    /// `error.type`, when present.
    pub error_type: Option<&'a str>,
    /// The span's status is ERROR.
    pub status_error: bool,
    /// The server's delay (`Retry-After`), in nanoseconds from the span's end: how long it
    /// asked the client to wait before coming back. `None` when it said nothing parseable.
    pub retry_after: Option<u64>,
    /// What the error's words say that its codes do not (DESIGN §12).
    pub said: Said,
}

/// What an error's words — its status description, an `exception.message`, its `error.type` —
/// say that its codes do not (DESIGN §12.2, §12.3, §12.5). Read only from failed spans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Said {
    /// Nothing more than the codes.
    #[default]
    Nothing,
    /// An A2A "not supported" reason (`UNSUPPORTED_OPERATION`, …): row 1 whatever the code.
    NotSupported,
    /// A2A's `VERSION_NOT_SUPPORTED`: row 1, of the version and not the operation.
    VersionNotSupported,
    /// An MCP tool, prompt or resource the server does not have: an undeclared operation.
    UnknownOperation,
    /// An MCP session that is gone (`Session not found`).
    SessionGone,
}

impl Said {
    /// This, else `other`.
    pub fn or(self, other: Said) -> Said {
        if self == Said::Nothing {
            other
        } else {
            self
        }
    }
}

/// What a request carried that tells one question from another (DESIGN §12.1, §12.2, §12.4):
/// fingerprints of its MCP session, its protocol version and its arguments, each 0 when the
/// span does not say. Only compared, never shown: a fingerprint keeps no string alive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Request {
    /// `mcp.session.id`, or the captured `Mcp-Session-Id` request header.
    pub session: u64,
    /// `mcp.protocol.version` / `a2a.protocol.version`, or the captured `MCP-Protocol-Version`
    /// / `A2A-Version` request header.
    pub version: u64,
    /// `gen_ai.tool.call.arguments`, else the `mcp.request.argument.*` attributes (in any
    /// order).
    pub arguments: u64,
}

impl Request {
    /// Each fact of this one, else `other`'s.
    pub fn or(self, other: Request) -> Request {
        let or = |a: u64, b: u64| if a == 0 { b } else { a };
        Request {
            session: or(self.session, other.session),
            version: or(self.version, other.version),
            arguments: or(self.arguments, other.arguments),
        }
    }
}

/// The fingerprint of an attribute's value (an array's first element, as a captured header
/// is one): FNV-1a over its bytes, never 0; 0 for a value that is no string or integer. A
/// string's bytes are hashed as they came, unchecked as UTF-8: only their sameness matters.
fn fingerprint(v: Val<'_>, seed: u64) -> u64 {
    let int;
    let bytes: &[u8] = match v.first() {
        Val::Int(i) => {
            int = i.to_le_bytes();
            &int
        }
        Val::Str(s) => s.as_bytes(),
        Val::Raw(b) => b,
        _ => return 0,
    };
    fnv(seed, bytes).max(1)
}

/// FNV-1a of `bytes`, starting from `seed`.
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// FNV-1a's offset basis.
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// One client span read as one attempt of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt<'a> {
    /// Who sent it.
    pub client: Client<'a>,
    /// Its protocol family.
    pub family: Family,
    /// `scheme://host[:port]` of the server, when the span names one.
    pub origin: Option<Origin>,
    /// The URL's path, when the span has one.
    pub path: Option<&'a str>,
    /// The HTTP method, when the span has one.
    pub http_method: Option<&'a str>,
    /// What it asked for.
    pub operation: Operation<'a>,
    /// How it ended.
    pub signal: Signal<'a>,
    /// It already carries `refusal_gate.*` attributes (tagged by an upstream refusal-gate):
    /// it is forwarded as it is.
    pub tagged: bool,
    /// Start, in Unix nanoseconds.
    pub start: u64,
    /// End, in Unix nanoseconds; never before `start`.
    pub end: u64,
    /// The span's trace id (16 bytes when valid).
    pub trace_id: &'a [u8],
    /// The span's id (8 bytes when valid).
    pub span_id: &'a [u8],
    /// Its parent's id; empty for a root span.
    pub parent_span_id: &'a [u8],
    /// What the request carried that tells one question from another.
    pub request: Request,
}

/// The attributes extraction reads, one slot each, filled in one pass.
#[derive(Default)]
struct Slots<'a> {
    tagged: bool,
    mcp_method: Option<&'a str>,
    a2a_method: Option<&'a str>,
    rpc_system: Option<&'a str>,
    rpc_method: Option<&'a str>,
    rpc_service: Option<&'a str>,
    http_method: Option<&'a str>,
    http_method_legacy: Option<&'a str>,
    url_full: Option<&'a str>,
    http_url: Option<&'a str>,
    url_scheme: Option<&'a str>,
    http_scheme: Option<&'a str>,
    // Checked as UTF-8 only when used: a URL, when there is one, names the server instead.
    server_address: Option<Val<'a>>,
    net_peer_name: Option<Val<'a>>,
    server_port: Option<i64>,
    net_peer_port: Option<i64>,
    url_path: Option<&'a str>,
    http_target: Option<&'a str>,
    http_route: Option<&'a str>,
    status: Option<i64>,
    status_legacy: Option<i64>,
    jsonrpc_error_code: Option<Val<'a>>,
    rpc_response_status: Option<Val<'a>>,
    rpc_status: Option<Val<'a>>,
    grpc_status: Option<i64>,
    error_type: Option<&'a str>,
    tool: Option<&'a str>,
    prompt: Option<&'a str>,
    resource_uri: Option<&'a str>,
    retry_after: Option<Val<'a>>,
    retry_after_legacy: Option<Val<'a>>,
    session: Option<Val<'a>>,
    version: Option<Val<'a>>,
    arguments: Option<Val<'a>>,
    /// The `mcp.request.argument.*` attributes' fingerprints, summed (so in any order).
    argument_sum: u64,
}

fn as_str(v: Val<'_>) -> Option<&str> {
    v.as_str()
}

/// An integer, or a string holding one.
fn as_int(v: Val<'_>) -> Option<i64> {
    let v = v.decoded();
    match v {
        Val::Int(i) => Some(i),
        Val::Str(_) | Val::Raw(_) => v.as_str()?.trim().parse().ok(),
        Val::Double(d) if d.fract() == 0.0 => Some(d as i64),
        _ => None,
    }
}

impl<'a> Slots<'a> {
    fn fill(&mut self, span: &dyn SpanView<'a>, max_attributes: usize) {
        span.attributes(max_attributes, &mut |key, v| self.read(key, v));
    }

    fn read(&mut self, key: &'a [u8], v: Val<'a>) {
        match key {
            b"mcp.method.name" => self.mcp_method = as_str(v),
            b"a2a.method.name" => self.a2a_method = as_str(v),
            b"rpc.system" | b"rpc.system.name" => self.rpc_system = self.rpc_system.or(as_str(v)),
            b"rpc.method" => self.rpc_method = as_str(v),
            b"rpc.service" => self.rpc_service = as_str(v),
            b"http.request.method" => self.http_method = as_str(v),
            b"http.method" => self.http_method_legacy = as_str(v),
            b"url.full" => self.url_full = as_str(v),
            b"http.url" => self.http_url = as_str(v),
            b"url.scheme" => self.url_scheme = as_str(v),
            b"http.scheme" => self.http_scheme = as_str(v),
            b"server.address" => self.server_address = Some(v),
            b"net.peer.name" => self.net_peer_name = Some(v),
            b"server.port" => self.server_port = as_int(v),
            b"net.peer.port" => self.net_peer_port = as_int(v),
            b"url.path" => self.url_path = as_str(v),
            b"http.target" => self.http_target = as_str(v),
            b"http.route" => self.http_route = as_str(v),
            b"http.response.status_code" => self.status = as_int(v),
            b"http.status_code" => self.status_legacy = as_int(v),
            b"rpc.jsonrpc.error_code" => self.jsonrpc_error_code = Some(v),
            b"rpc.response.status_code" => self.rpc_response_status = Some(v),
            b"rpc.status_code" => self.rpc_status = Some(v),
            b"rpc.grpc.status_code" => self.grpc_status = as_int(v),
            // An empty error.type says nothing: some SDKs set it on every span.
            b"error.type" => self.error_type = as_str(v).filter(|t| !t.is_empty()),
            b"gen_ai.tool.name" => self.tool = as_str(v),
            b"gen_ai.prompt.name" => self.prompt = as_str(v),
            b"mcp.resource.uri" => self.resource_uri = as_str(v),
            b"http.response.header.retry-after" => self.retry_after = Some(v),
            // Python's older instrumentations normalise header names with an underscore.
            b"http.response.header.retry_after" => self.retry_after_legacy = Some(v),
            b"refusal_gate.class" => self.tagged = true,
            b"mcp.session.id"
            | b"http.request.header.mcp-session-id"
            | b"http.request.header.mcp_session_id" => self.session = self.session.or(Some(v)),
            b"mcp.protocol.version"
            | b"a2a.protocol.version"
            | b"http.request.header.mcp-protocol-version"
            | b"http.request.header.mcp_protocol_version"
            | b"http.request.header.a2a-version"
            | b"http.request.header.a2a_version" => self.version = self.version.or(Some(v)),
            b"gen_ai.tool.call.arguments" => self.arguments = Some(v),
            // The first byte first: most keys that reach here are not MCP's.
            [b'm', ..] if key.starts_with(b"mcp.request.argument.") => {
                let value = fingerprint(v, fnv(FNV_BASIS, key));
                self.argument_sum = self.argument_sum.wrapping_add(value);
            }
            _ => {}
        }
    }

    /// What the request carried (see [`Request`]).
    fn request(&self) -> Request {
        let of = |v: Option<Val<'_>>| v.map_or(0, |v| fingerprint(v, FNV_BASIS));
        let arguments = match self.arguments {
            Some(v) => fingerprint(v, FNV_BASIS),
            None => self.argument_sum,
        };
        Request {
            session: of(self.session),
            version: of(self.version),
            arguments: if self.argument_sum == 0 && self.arguments.is_none() {
                0
            } else {
                arguments.max(1)
            },
        }
    }

    fn family(&self) -> Option<Family> {
        if self.mcp_method.is_some() {
            Some(Family::Mcp)
        } else if self.a2a_method.is_some() {
            Some(Family::A2a)
        } else if self.rpc_system == Some("jsonrpc") {
            Some(Family::JsonRpc)
        } else if self.rpc_system == Some("grpc") {
            Some(Family::Grpc)
        } else if self.http_method.or(self.http_method_legacy).is_some() {
            Some(Family::Http)
        } else {
            None
        }
    }
}

/// The gRPC status codes by name, indexed by number.
pub const GRPC_CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A gRPC code given as a number or a name (`UNIMPLEMENTED`, `unimplemented`).
fn grpc_code(v: Val<'_>) -> Option<i32> {
    if let Some(n) = as_int(v) {
        return i32::try_from(n).ok();
    }
    let name = as_str(v)?.trim();
    GRPC_CODE_NAMES
        .iter()
        .position(|c| c.eq_ignore_ascii_case(name))
        .map(|i| i as i32)
}

fn says_timeout(text: &str) -> bool {
    const WORDS: [&[u8]; 3] = [b"timeout", b"timedout", b"deadline"];
    let bytes = text.as_bytes();
    WORDS.iter().any(|w| {
        bytes
            .windows(w.len())
            .any(|window| window.eq_ignore_ascii_case(w))
    })
}

/// The word after `method` in a span name such as `MCP send tools/call get_weather`.
fn target_in_name<'a>(name: &'a str, method: &str) -> Option<&'a str> {
    let mut words = name.split_ascii_whitespace();
    words.by_ref().find(|w| *w == method)?;
    words.next()
}

/// The client a resource names: `service.name` (else `unknown_service`) and
/// `service.instance.id`. Read once per resource, not per span.
pub fn client<'a>(attributes: impl FnOnce(&mut dyn FnMut(&'a [u8], Val<'a>))) -> Client<'a> {
    let mut client = Client {
        name: "unknown_service",
        instance: None,
    };
    attributes(&mut |key, v| match key {
        b"service.name" => {
            if let Some(name) = as_str(v).filter(|n| !n.is_empty()) {
                client.name = name;
            }
        }
        b"service.instance.id" => client.instance = as_str(v),
        _ => {}
    });
    client
}

/// The client of a resource given as prost attributes.
pub fn client_of(resource: &[KeyValue]) -> Client<'_> {
    client(|f| {
        for kv in resource {
            f(kv.key.as_bytes(), Val::of(kv.value.as_ref()));
        }
    })
}

pub use crate::config::DEFAULT_MAX_ATTRIBUTES;

/// Reads one span of `client` as an attempt, from its first `max_attributes` attributes: a
/// CLIENT span, or an INTERNAL one with an MCP or A2A method (DESIGN §12.5).
///
/// # Errors
/// A [`Skip`] when the span is not such a span or belongs to no known protocol family.
pub fn extract<'a>(
    client: Client<'a>,
    span: &dyn SpanView<'a>,
    max_attributes: usize,
) -> Result<Attempt<'a>, Skip> {
    let kind = span.kind();
    if kind == SpanKind::Internal as i32 && names_protocol_method(span, max_attributes) {
        // An INTERNAL span an MCP or A2A instrumentation gave its attributes (an
        // `execute_tool` span) is an attempt as a CLIENT span would be (DESIGN §12.5).
        return read(client, span, max_attributes, false);
    }
    if kind != SpanKind::Client as i32 {
        return Err(Skip::NotClient);
    }
    read(client, span, max_attributes, false)
}

/// Whether a span has `mcp.method.name` or `a2a.method.name`.
fn names_protocol_method(span: &dyn SpanView<'_>, max_attributes: usize) -> bool {
    let mut found = false;
    span.attributes(max_attributes, &mut |key, _| {
        found |= key == b"mcp.method.name" || key == b"a2a.method.name";
    });
    found
}

/// Reads one SERVER span of an interface observed from its side as an attempt of `client`
/// (DESIGN §9): as a client span, but for its status, which says nothing of the client (a
/// 4xx is no error for a server), and with `http.route` for a path when nothing else gives one.
///
/// # Errors
/// A [`Skip`] when the span is not a SERVER span or belongs to no known protocol family.
pub fn extract_server<'a>(
    client: Client<'a>,
    span: &dyn SpanView<'a>,
    max_attributes: usize,
) -> Result<Attempt<'a>, Skip> {
    if span.kind() != SpanKind::Server as i32 {
        return Err(Skip::NotClient);
    }
    read(client, span, max_attributes, true)
}

/// The client of an observed interface's SERVER span (DESIGN §9): the value of the first of
/// `client_from` the span carries (each also under its legacy name), the instance its
/// `client.address` (`net.sock.peer.addr`, `net.peer.ip`), and whether it named one: a span
/// that names none is [`UNKNOWN_CLIENT`]'s, still with its address for an instance (DESIGN
/// §12.6: one address's attempts are one instance's).
pub fn server_client<'a>(
    span: &dyn SpanView<'a>,
    client_from: &[String],
    max_attributes: usize,
) -> (Client<'a>, bool) {
    let legacy = |name: &str| match name {
        "user_agent.original" => Some("http.user_agent"),
        _ => None,
    };
    let (mut best, mut name) = (usize::MAX, None);
    let mut instance: [Option<&'a str>; 3] = [None; 3];
    span.attributes(max_attributes, &mut |key, v| {
        match key {
            b"client.address" => instance[0] = as_str(v),
            b"net.sock.peer.addr" => instance[1] = as_str(v),
            b"net.peer.ip" => instance[2] = as_str(v),
            _ => {}
        }
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        let found = client_from
            .iter()
            .position(|c| c == key || legacy(c) == Some(key));
        if let (Some(at), Some(value)) = (found, as_str(v).filter(|v| !v.is_empty())) {
            if at < best {
                (best, name) = (at, Some(value));
            }
        }
    });
    let client = Client {
        name: name.unwrap_or(UNKNOWN_CLIENT),
        instance: instance.into_iter().flatten().next(),
    };
    (client, name.is_some())
}

/// The name of a server-side client that named itself nowhere.
pub const UNKNOWN_CLIENT: &str = "unknown_client";

fn read<'a>(
    client: Client<'a>,
    span: &dyn SpanView<'a>,
    max_attributes: usize,
    server: bool,
) -> Result<Attempt<'a>, Skip> {
    let mut s = Slots::default();
    s.fill(span, max_attributes);
    let family = s.family().ok_or(Skip::NoProtocol)?;

    let (origin, mut path) = locate(&s);
    if server && path.is_none() {
        path = s.http_route.map(url::path_of);
    }
    let http_method = s.http_method.or(s.http_method_legacy);

    let http_status = s
        .status
        .or(s.status_legacy)
        .or_else(|| a2a_status(&s, family))
        .and_then(|c| u16::try_from(c).ok());
    let (jsonrpc_code, grpc_code) = codes(&s, family);

    let timeout = timeout_of(&s, span);
    // Codes in words (DESIGN §11.4): a protocol span that gives its JSON-RPC error only as
    // its message.
    let jsonrpc_code = match family {
        Family::Mcp | Family::A2a | Family::JsonRpc if jsonrpc_code.is_none() => {
            code_in_words(span)
        }
        _ => jsonrpc_code,
    };

    let operation = operation_of(&s, family, span, (http_method, path));
    let failed = span.status_error()
        || s.error_type.is_some()
        || jsonrpc_code.is_some()
        || grpc_code.is_some_and(|c| c != 0);
    let said = if failed {
        words::said(family, operation.verb, jsonrpc_code, s.error_type, span)
    } else {
        Said::Nothing
    };

    Ok(Attempt {
        client,
        family,
        origin: origin.and_then(|(scheme, host, port)| Origin::new(scheme, host, port)),
        path,
        http_method,
        operation,
        signal: Signal {
            http_status,
            jsonrpc_code,
            grpc_code,
            timeout,
            error_type: s.error_type,
            status_error: !server && span.status_error(),
            retry_after: s
                .retry_after
                .or(s.retry_after_legacy)
                .and_then(|v| server_delay(v, span.end().max(span.start()))),
            said,
        },
        tagged: s.tagged,
        start: span.start(),
        end: span.end().max(span.start()),
        trace_id: span.trace_id(),
        span_id: span.span_id(),
        parent_span_id: span.parent_span_id(),
        request: s.request(),
    })
}

/// The JSON-RPC code and the gRPC status code a span's attributes give (by its family): a
/// gRPC span's status, else a JSON-RPC error code, from its attribute, its RPC status, or an
/// integer `error.type` on a protocol span; 0 is none.
#[inline]
fn codes(s: &Slots<'_>, family: Family) -> (Option<i64>, Option<i32>) {
    let rpc_status = s.rpc_response_status.or(s.rpc_status);
    if family == Family::Grpc {
        let code = s
            .grpc_status
            .and_then(|c| i32::try_from(c).ok())
            .or_else(|| rpc_status.and_then(grpc_code));
        (None, code)
    } else {
        let from_error_type = match family {
            Family::Mcp | Family::A2a | Family::JsonRpc => s
                .error_type
                .and_then(|t| t.trim().parse::<i64>().ok())
                .filter(|_| a2a_status(s, family).is_none()),
            _ => None,
        };
        let code = s
            .jsonrpc_error_code
            .and_then(as_int)
            .or_else(|| rpc_status.and_then(as_int))
            .or(from_error_type)
            .filter(|c| *c != 0);
        (code, None)
    }
}

/// On an a2a span, an integer `error.type` from 100 to 599 is an HTTP status, not a JSON-RPC
/// code (DESIGN §12.5: A2A's HTTP binding).
#[inline]
fn a2a_status(s: &Slots<'_>, family: Family) -> Option<i64> {
    if family != Family::A2a {
        return None;
    }
    s.error_type
        .and_then(|t| t.trim().parse::<i64>().ok())
        .filter(|c| (100..600).contains(c))
}

/// The timeout a span reports: its `error.type`, or an exception's type, saying one.
#[inline]
fn timeout_of<'a>(s: &Slots<'a>, span: &dyn SpanView<'a>) -> Option<&'a str> {
    let mut timeout = s.error_type.filter(|t| says_timeout(t));
    if timeout.is_none() {
        span.exceptions(&mut |t, _| {
            timeout = t.filter(|t| says_timeout(t));
            timeout.is_some()
        });
    }
    timeout
}

/// The operation of an attempt of `family`: an HTTP method and path, a gRPC service and
/// method, or a protocol method and its tool, prompt or resource.
#[inline]
fn operation_of<'a>(
    s: &Slots<'a>,
    family: Family,
    span: &dyn SpanView<'a>,
    (http_method, path): (Option<&'a str>, Option<&'a str>),
) -> Operation<'a> {
    match family {
        Family::Http => Operation::new(http_method.unwrap_or(""), path.unwrap_or("/"), false),
        Family::Grpc => {
            let (verb, target) = grpc_operation(s.rpc_service, s.rpc_method, span.name());
            Operation::new(verb, target, true)
        }
        Family::Mcp | Family::A2a | Family::JsonRpc => {
            let method = s
                .mcp_method
                .or(s.a2a_method)
                .or(s.rpc_method)
                .unwrap_or(span.name());
            let target = s
                .tool
                .or(s.prompt)
                .or(s.resource_uri)
                .or_else(|| target_in_name(span.name(), method))
                .unwrap_or("");
            Operation::new(method, target, false)
        }
    }
}

/// The JSON-RPC standard errors by message (JSON-RPC 2.0 §5.1).
const STANDARD_ERRORS: [(&str, i64); 5] = [
    ("Parse error", -32700),
    ("Invalid Request", -32600),
    ("Method not found", -32601),
    ("Invalid params", -32602),
    ("Internal error", -32603),
];

/// The JSON-RPC code a message names: one of the standard messages, compared without regard
/// to case, after an optional `Name: ` prefix (an exception's class, as in
/// `McpError: Method not found`).
pub fn standard_code(message: &str) -> Option<i64> {
    let message = message.trim();
    let bare = match message.split_once(": ") {
        Some((name, rest)) if !name.is_empty() && !name.contains(char::is_whitespace) => rest,
        _ => message,
    };
    STANDARD_ERRORS
        .iter()
        .find(|(m, _)| bare.trim().eq_ignore_ascii_case(m))
        .map(|(_, code)| *code)
}

/// The code a span's status description or one of its `exception` events' messages names
/// ([`standard_code`]), the status first.
fn code_in_words(span: &dyn SpanView<'_>) -> Option<i64> {
    let status = span.status_message();
    let mut code = if status.is_empty() {
        None
    } else {
        standard_code(status)
    };
    if code.is_none() {
        span.exceptions(&mut |_, message| {
            code = message.and_then(standard_code);
            code.is_some()
        });
    }
    code
}

/// Service and method of a gRPC attempt: `rpc.service` and `rpc.method`, or a fully
/// qualified `rpc.method` (`package.Service/Method`, semantic conventions 1.39 and later) split
/// in two — so that both conventions name the same operation — else the span name when it is
/// qualified (`package.Service/Method` is what gRPC instrumentations name their spans), else
/// the method or name alone.
fn grpc_operation<'a>(
    service: Option<&'a str>,
    method: Option<&'a str>,
    name: &'a str,
) -> (&'a str, &'a str) {
    let qualified = |m: &'a str| {
        m.strip_prefix('/')
            .unwrap_or(m)
            .rsplit_once('/')
            .filter(|(s, m)| !s.is_empty() && !m.is_empty())
    };
    match (service, method) {
        // The usual shape before 1.39: a bare method. Told apart from a qualified one by its
        // service prefix, without searching the method for a `/`.
        (Some(service), Some(method)) => {
            let bare = method.strip_prefix('/').unwrap_or(method);
            match bare.strip_prefix(service).and_then(|m| m.strip_prefix('/')) {
                Some(m) if !m.is_empty() => (service, m),
                _ if bare.len() < method.len() || bare.contains('/') => {
                    qualified(method).unwrap_or((service, method))
                }
                _ => (service, method),
            }
        }
        (Some(service), None) => (service, ""),
        (None, Some(method)) => qualified(method).unwrap_or((method, "")),
        (None, None) => qualified(name).unwrap_or((name, "")),
    }
}

/// The server's delay a captured `Retry-After` header asks for (DESIGN §3): its first value
/// when it is an array, read by [`retry_after`] against the span's `end`.
fn server_delay(v: Val<'_>, end: u64) -> Option<u64> {
    match v.first() {
        Val::Int(seconds) => u64::try_from(seconds)
            .ok()
            .map(|s| s.saturating_mul(1_000_000_000))
            .filter(|d| *d > 0),
        v => crate::retry::retry_after(v.as_str()?, end),
    }
}

/// The pieces of a server's origin (scheme, host, port), borrowed: the normalised
/// [`Origin`] is built once, where the attempt keeps it.
type OriginParts<'a> = (&'a str, &'a str, Option<u16>);

/// Origin and path from `url.full`/`http.url`, else from scheme, server, port and path.
fn locate<'a>(s: &Slots<'a>) -> (Option<OriginParts<'a>>, Option<&'a str>) {
    if let Some(Ok((scheme, host, port, path))) = s.url_full.or(s.http_url).map(url::parts) {
        return (Some((scheme, host, port)), Some(path));
    }
    let path = s.url_path.or(s.http_target).map(url::path_of);
    let Some(host) = s
        .server_address
        .and_then(as_str)
        .or_else(|| s.net_peer_name.and_then(as_str))
        .filter(|h| !h.is_empty())
    else {
        return (None, path);
    };
    let port = s
        .server_port
        .or(s.net_peer_port)
        .and_then(|p| u16::try_from(p).ok());
    // With no scheme on the span, 443 means https and anything else http: what the
    // MCP, A2A and JSON-RPC SDKs put on the wire in practice.
    let scheme = s
        .url_scheme
        .or(s.http_scheme)
        .unwrap_or(if port == Some(443) { "https" } else { "http" });
    (Some((scheme, host, port)), path)
}

/// MCP and A2A methods that read an interface's contract.
const DISCOVERY_METHODS: &[&str] = &[
    "server/discover",
    "initialize",
    // The MCP list methods read what the server offers (DESIGN §12.2).
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "GetExtendedAgentCard",
    "agent/getAuthenticatedExtendedCard",
];

/// What an attempt did with its interface's discovery document (DESIGN §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Discovery {
    /// It did not ask for it.
    #[default]
    None,
    /// It asked for it (a GET of a discovery path, an MCP or A2A discovery method, gRPC
    /// reflection) and did not get it. Still never a probe: asking is what the decision
    /// boundary wants after a refusal.
    Asked,
    /// It read it: the request succeeded (a 2xx for a GET of a discovery path).
    Read,
}

/// How `attempt` used `interface`'s discovery document: a GET of a discovery path, an MCP or
/// A2A discovery method, or gRPC server reflection; read when it `succeeded` (classified `ok`)
/// and, for a GET, its status was 2xx. A discovery method sent to an undeclared path is a read
/// when it succeeded, and otherwise not even asking.
pub fn discovery(
    attempt: &Attempt<'_>,
    succeeded: bool,
    interfaces: &Interfaces,
    interface: InterfaceRef<'_>,
) -> Discovery {
    let read_if = |ok: bool| {
        if ok && succeeded {
            Discovery::Read
        } else {
            Discovery::Asked
        }
    };
    let http_get = attempt
        .http_method
        .is_some_and(|m| m.eq_ignore_ascii_case("GET"));
    if http_get
        && attempt
            .path
            .is_some_and(|p| interfaces.is_discovery_path(interface, p))
    {
        return read_if(
            attempt
                .signal
                .http_status
                .is_some_and(|s| (200..300).contains(&s)),
        );
    }
    let asks = match attempt.family {
        Family::Mcp | Family::A2a => DISCOVERY_METHODS.contains(&attempt.operation.verb),
        Family::Grpc => is_reflection(attempt.operation.verb),
        Family::JsonRpc | Family::Http => false,
    };
    match (asks, attempt.operation.via.is_empty()) {
        (true, true) => read_if(true),
        // Sent to a path the interface does not declare (DESIGN §11.1): a key of its own, and
        // what that path answered — a read when it succeeded (an SDK's fallback path that
        // served it), else no asking either, so that probing paths is seen.
        (true, false) if succeeded => Discovery::Read,
        _ => Discovery::None,
    }
}

/// Room for a gRPC attempt's path, `/package.Service/Method`, built without the heap
/// ([`Attempt::path_or_grpc`]).
pub struct GrpcPath {
    buf: [u8; GrpcPath::MAX],
}

impl GrpcPath {
    /// The longest path built; a longer one is taken as no path.
    pub const MAX: usize = 256;

    /// An empty buffer.
    pub fn new() -> GrpcPath {
        GrpcPath {
            buf: [0; GrpcPath::MAX],
        }
    }
}

impl Default for GrpcPath {
    fn default() -> GrpcPath {
        GrpcPath::new()
    }
}

impl<'a> Attempt<'a> {
    /// The attempt's path (DESIGN §3): its URL's, or for a gRPC attempt without one, the
    /// HTTP/2 path gRPC uses, `/package.Service/Method`, written into `room` (made only then:
    /// every other attempt pays for an empty `Option`, not for a buffer).
    pub fn path_or_grpc<'b>(&'b self, room: &'b mut Option<GrpcPath>) -> Option<&'b str> {
        if self.path.is_some() || self.family != Family::Grpc {
            return self.path;
        }
        let Operation { verb, target, .. } = self.operation;
        let len = 2 + verb.len() + target.len();
        if verb.is_empty() || target.is_empty() || len > GrpcPath::MAX {
            return None;
        }
        let buf = &mut room.insert(GrpcPath::new()).buf[..len];
        buf[0] = b'/';
        buf[1..=verb.len()].copy_from_slice(verb.as_bytes());
        buf[1 + verb.len()] = b'/';
        buf[2 + verb.len()..].copy_from_slice(target.as_bytes());
        std::str::from_utf8(buf).ok()
    }
}

#[cfg(test)]
mod tests;
