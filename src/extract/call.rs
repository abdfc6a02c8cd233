//! One call, one attempt (DESIGN §11): the spans that describe one call — an agent
//! framework's span, the protocol SDK's under it, the HTTP client's under that, and on the
//! other side the server's — assembled into the attempts of that call.
//!
//! Core: pure. It is given the spans of one call, already extracted ([`Member`]), and how each
//! is joined to its parent ([`link`]); it says what each span is ([`assemble`]): an attempt,
//! with the facts of every span of the call that belong to it, or a part of another's. It
//! finds no spans, holds nothing and knows no interface beyond the closure it is given.

#[cfg(test)]
use super::Client;
use super::{Attempt, Family, Operation, Signal};

/// Which side of a call a span was recorded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A CLIENT span of the caller.
    Client,
    /// A SERVER span of an interface observed from its side (DESIGN §9): the index of that
    /// interface among the configured ones.
    Server(usize),
}

/// One span of a call, read as an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Member<'a> {
    /// The span read as an attempt; a server span's client is the one it names itself, else
    /// `unknown_client`.
    pub attempt: Attempt<'a>,
    /// Its side.
    pub side: Side,
    /// A server span that names its client itself (`client_from`).
    pub named: bool,
}

/// How a span of a call is joined to its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// An HTTP CLIENT span under an mcp, a2a or jsonrpc CLIENT span of the same client: a
    /// transport request of that call (§11.1).
    Transport,
    /// A protocol CLIENT span under a CLIENT span of the same client, family and operation: a
    /// framework's span around the SDK's (§11.2).
    Nested,
    /// A SERVER span under a CLIENT span: the other side of the call (§11.3).
    ServerOf,
    /// A protocol SERVER span inside an HTTP SERVER span of the same interface, which names
    /// its client (§9): by parentage, or by time within one export.
    Carried,
    /// An HTTP SERVER span under an HTTP SERVER span of the same interface: the request a
    /// gateway in front of the server (Caddy, Envoy) received, as the server behind it got
    /// it. One request, seen twice; the server's view is the nearer to the call.
    Proxied,
}

fn is_protocol(family: Family) -> bool {
    matches!(family, Family::Mcp | Family::A2a | Family::JsonRpc)
}

/// Whether an HTTP request under a protocol call of `family` can carry it: under an MCP call,
/// only a `POST` (streamable HTTP's); a `GET` (the optional server stream) or `DELETE`
/// (ending a session) is the transport's own request, an attempt of its own (DESIGN §12.4).
fn carries_call(request: &Attempt<'_>, family: Family) -> bool {
    family != Family::Mcp
        || request
            .http_method
            .is_none_or(|m| m.eq_ignore_ascii_case("POST"))
}

/// How `child` is joined to `parent`, when they are one call (DESIGN §11.1–3, §9). The two
/// are known to be child and parent (or carried and carrier); this says whether that makes
/// them one call.
pub fn link(child: &Member<'_>, parent: &Member<'_>) -> Option<Link> {
    let (c, p) = (&child.attempt, &parent.attempt);
    match (child.side, parent.side) {
        (Side::Client, Side::Client) if c.client == p.client => {
            if c.family == Family::Http && is_protocol(p.family) && carries_call(c, p.family) {
                Some(Link::Transport)
            } else if c.family != Family::Http && c.family == p.family && c.operation == p.operation
            {
                Some(Link::Nested)
            } else {
                None
            }
        }
        (Side::Server(_), Side::Client) => Some(Link::ServerOf),
        (Side::Server(a), Side::Server(b)) if a == b && p.family == Family::Http => {
            if is_protocol(c.family) {
                Some(Link::Carried)
            } else if c.family == Family::Http {
                Some(Link::Proxied)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// What one span of a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An attempt of the call: the index of its facts in [`Calls::attempts`].
    Attempt(usize),
    /// Part of another span's attempt: skipped as `same_call`.
    Part,
}

/// An attempt of a call, with the facts of every span of it that belong to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assembled<'a> {
    /// The attempt.
    pub attempt: Attempt<'a>,
    /// The configured interface it belongs to when that is decided here: a server span's, and
    /// a client attempt's that named no server when a server span of its call did. `None`: by
    /// its own server and path (DESIGN §3).
    pub interface: Option<usize>,
}

/// What the spans of calls are: each span's role, and the attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct Calls<'a> {
    /// Each span's role, in the order of the spans.
    pub roles: Vec<Role>,
    /// The attempts the roles point to.
    pub attempts: Vec<Assembled<'a>>,
}

impl<'a> Calls<'a> {
    /// Span `i`'s attempt, if it is one.
    pub fn attempt(&self, i: usize) -> Option<&Assembled<'a>> {
        match self.roles[i] {
            Role::Attempt(a) => self.attempts.get(a),
            Role::Part => None,
        }
    }
}

/// The protocol call a framework's span and the SDK's span under it describe (§11.2): the
/// inner span's facts, else the outer's; failed when either failed.
pub fn nest<'a>(outer: &Attempt<'a>, inner: &Attempt<'a>) -> Attempt<'a> {
    let (o, i) = (&outer.signal, &inner.signal);
    let origin_from = if inner.origin.is_some() { inner } else { outer };
    Attempt {
        origin: origin_from.origin,
        path: inner.path.or(outer.path),
        http_method: inner.http_method.or(outer.http_method),
        signal: Signal {
            http_status: i.http_status.or(o.http_status),
            jsonrpc_code: i.jsonrpc_code.or(o.jsonrpc_code),
            grpc_code: i.grpc_code.or(o.grpc_code),
            timeout: i.timeout.or(o.timeout),
            error_type: i.error_type.or(o.error_type),
            status_error: i.status_error || o.status_error,
            retry_after: i.retry_after.or(o.retry_after),
            said: i.said.or(o.said),
        },
        request: inner.request.or(outer.request),
        ..inner.clone()
    }
}

/// A transport request of a protocol call as an attempt (§11.1): the call's family and
/// operation, the request's own server, path, status, server's delay and timeout; the request
/// that ended `last` also carries the call's JSON-RPC code, `error.type` (and the timeout read
/// from it) and failure. A request
/// to a path its interface declares `no` (`undeclared`) is about that path: the path follows
/// the operation, and a `404` is that path's answer whatever JSON-RPC code the call reports.
pub fn transport<'a>(
    call: &Attempt<'a>,
    request: &Attempt<'a>,
    last: bool,
    undeclared: bool,
) -> Attempt<'a> {
    let (c, r) = (&call.signal, &request.signal);
    let via = match (undeclared, request.path) {
        (true, Some(path)) => path,
        _ => "",
    };
    let jsonrpc_code = match (last, undeclared && r.http_status == Some(404)) {
        (true, false) => c.jsonrpc_code,
        _ => None,
    };
    Attempt {
        family: call.family,
        operation: Operation {
            via,
            ..call.operation
        },
        // The request's own grpc code is none: an HTTP span's never is one.
        signal: Signal {
            jsonrpc_code,
            error_type: if last {
                c.error_type.or(r.error_type)
            } else {
                r.error_type
            },
            // A timeout read from the call's `error.type` (§3) goes with it.
            timeout: if last {
                r.timeout.or(c.timeout)
            } else {
                r.timeout
            },
            status_error: r.status_error || (last && c.status_error),
            said: if last { c.said.or(r.said) } else { r.said },
            ..*r
        },
        request: request.request.or(call.request),
        ..request.clone()
    }
}

/// A client attempt with the facts of the server's span of the same call (§11.3): failed when
/// either side says so (a server span by a code or an `error.type`: its status is not read),
/// with the client's codes, else the server's; the server's path when the client has none.
pub fn with_server<'a>(client: &Attempt<'a>, server: &Attempt<'a>) -> Attempt<'a> {
    let (c, s) = (&client.signal, &server.signal);
    Attempt {
        path: client.path.or(server.path),
        signal: Signal {
            http_status: c.http_status.or(s.http_status),
            jsonrpc_code: c.jsonrpc_code.or(s.jsonrpc_code),
            grpc_code: c.grpc_code.or(s.grpc_code),
            timeout: c.timeout.or(s.timeout),
            error_type: c.error_type.or(s.error_type),
            status_error: c.status_error,
            retry_after: c.retry_after.or(s.retry_after),
            said: c.said.or(s.said),
        },
        request: client.request.or(server.request),
        ..client.clone()
    }
}

/// An HTTP client attempt whose server's span of the call is a protocol span (mcp, a2a,
/// jsonrpc): an SDK whose HTTP client alone is instrumented (the MCP Go SDK on `otelhttp`, the
/// MCP Java SDK under the Java agent). It is [`with_server`], of the server span's family and
/// operation, as a transport request is of its call's (§11.1): the request's own server, path
/// and status, and a path its interface declares `no` (`undeclared`) following the operation.
pub fn with_protocol_server<'a>(
    client: &Attempt<'a>,
    server: &Attempt<'a>,
    undeclared: bool,
) -> Attempt<'a> {
    let via = match (undeclared, client.path) {
        (true, Some(path)) => path,
        _ => "",
    };
    Attempt {
        family: server.family,
        operation: Operation {
            via,
            ..server.operation
        },
        ..with_server(client, server)
    }
}

/// How one span of a call is joined to the others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Joined {
    /// Its parent within the call and how it is joined to it ([`Link::Transport`],
    /// [`Link::Nested`] or [`Link::ServerOf`]); `None` for a root of the call.
    pub parent: Option<(usize, Link)>,
    /// For a protocol SERVER span, the HTTP SERVER span carrying it ([`Link::Carried`]): its
    /// parent, or the one whose time contains it within one export (DESIGN §9).
    pub carrier: Option<usize>,
}

/// What each span of one call is (DESIGN §11), given how each is joined to the others.
/// `undeclared` says whether a transport request's path is one its interface declares `no`.
///
/// Client side, from the outermost span in: a protocol span around a nested one of the same
/// operation is part of it and lends it its facts; a protocol span with transport requests
/// under it is part of them, each one an attempt; any other client span is an attempt.
/// Server side: an HTTP server span carrying a protocol span is part of it (and names its
/// client); a server span of a call with a client attempt is part of that attempt, which takes
/// its facts; any other server span is an attempt of its own.
pub fn assemble<'a>(
    members: &[Member<'a>],
    joined: &[Joined],
    undeclared: impl Fn(&Attempt<'_>) -> bool,
) -> Calls<'a> {
    let n = members.len();
    let below = Below::of(members, joined);
    let order = by_depth(joined);
    // A client span with spans under it lends them its call and is no attempt itself.
    let lends = |i: usize| {
        members[i].side == Side::Client
            && (below.nested[i].is_some()
                || (is_protocol(members[i].attempt.family) && below.last_transport[i].is_some()))
    };
    let lending = (0..n).filter(|&i| lends(i)).count();
    let mut out = Calls {
        roles: vec![Role::Part; n],
        attempts: Vec::with_capacity(n - lending),
    };
    // Client facts flow from parent to child: the call of each client span that has spans
    // under it, as its nesting says (found by the span's index, never by a search).
    let mut calls: Vec<Attempt<'a>> = Vec::with_capacity(lending);
    let mut call_at: Vec<Option<usize>> = vec![None; n];
    for &i in &order {
        let m = &members[i];
        if m.side != Side::Client {
            continue;
        }
        let call_of = |p: usize| call_at[p].map(|at| &calls[at]);
        let own = match joined[i].parent {
            Some((p, Link::Nested)) => call_of(p).map(|outer| nest(outer, &m.attempt)),
            Some((p, Link::Transport)) => call_of(p).map(|c| {
                let last = below.last_transport[p] == Some(i);
                transport(c, &m.attempt, last, undeclared(&m.attempt))
            }),
            _ => None,
        };
        let own = own.unwrap_or_else(|| m.attempt.clone());
        if lends(i) {
            call_at[i] = Some(calls.len());
            calls.push(own);
        } else {
            out.roles[i] = Role::Attempt(out.attempts.len());
            out.attempts.push(Assembled {
                attempt: own,
                interface: None,
            });
        }
    }
    let attached = server_attempts(members, joined, (&below, &order), &mut out);
    attach(members, attached, undeclared, &mut out);
    out
}

/// The server spans of a call: each attached to the client attempt of its call (with the
/// server spans in front of it), or an attempt of its own in `out`. Returns the attached, as
/// (attempt span, server span).
fn server_attempts<'a>(
    members: &[Member<'a>],
    joined: &[Joined],
    (below, order): (&Below, &[usize]),
    out: &mut Calls<'a>,
) -> Vec<(usize, usize)> {
    if !members.iter().any(|m| matches!(m.side, Side::Server(_))) {
        // Client spans only (every call of an agent's own telemetry): nothing to attach.
        return Vec::new();
    }
    let n = members.len();
    let up = Up::of(members, joined, below, order);
    let mut attached: Vec<(usize, usize)> = Vec::new();
    // The attempt each server span in front of another was attached to, so that a gateway's
    // span in front of many is walked to once.
    let mut attached_to: Vec<Option<usize>> = vec![None; n];
    for i in 0..n {
        let Side::Server(interface) = members[i].side else {
            continue;
        };
        if below.carries[i] {
            continue;
        }
        // The server spans in front of it: its carrier, and the gateways' before either.
        let front = joined[i].carrier.unwrap_or(i);
        match up.attempt_of(joined, i) {
            Some(a) => {
                attached.push((a, i));
                let mut at = Some(front)
                    .filter(|&h| h != i)
                    .or_else(|| proxied(joined, i));
                while let Some(h) = at.filter(|&h| attached_to[h] != Some(a) && h != i) {
                    attached_to[h] = Some(a);
                    attached.push((a, h));
                    at = proxied(joined, h);
                }
            }
            None => {
                let named = if members[i].named {
                    Some(i)
                } else if front != i {
                    up.named[front]
                } else {
                    proxied(joined, i).and_then(|p| up.named[p])
                };
                // Named nowhere: nobody's, with the address its carrier saw (DESIGN §12.6).
                let client =
                    named.map_or(members[front].attempt.client, |h| members[h].attempt.client);
                out.roles[i] = Role::Attempt(out.attempts.len());
                out.attempts.push(Assembled {
                    attempt: Attempt {
                        client,
                        ..members[i].attempt.clone()
                    },
                    interface: Some(interface),
                });
            }
        }
    }
    attached
}

/// Gives each client attempt the facts of the server spans attached to it; an HTTP client
/// attempt takes a protocol server span's call ([`with_protocol_server`]).
fn attach<'a>(
    members: &[Member<'a>],
    mut attached: Vec<(usize, usize)>,
    undeclared: impl Fn(&Attempt<'_>) -> bool,
    out: &mut Calls<'a>,
) {
    // Server spans attached to a client attempt, carried ones (the protocol's) first: they
    // say more of the call than the HTTP spans carrying them.
    attached.sort_by_key(|&(a, s)| (a, members[s].attempt.family == Family::Http, s));
    attached.dedup();
    for (a, s) in attached {
        let (Side::Server(interface), Role::Attempt(at)) = (members[s].side, out.roles[a]) else {
            continue;
        };
        let found = &mut out.attempts[at];
        if found.attempt.origin.is_none() && found.interface.is_none() {
            found.interface = Some(interface);
        }
        let server = &members[s].attempt;
        found.attempt = if found.attempt.family == Family::Http && is_protocol(server.family) {
            with_protocol_server(&found.attempt, server, undeclared(&found.attempt))
        } else {
            with_server(&found.attempt, server)
        };
    }
}

/// What stands below each span of a call, found in one pass.
struct Below {
    /// A protocol span nested in it (the first, if several).
    nested: Vec<Option<usize>>,
    /// Of its transport requests, the one that ended last (ties: the later to start, then
    /// the higher span id): the one that carries the call's code.
    last_transport: Vec<Option<usize>>,
    /// It is the HTTP server span carrying a protocol server span, or a gateway's span in
    /// front of the server's: a nearer span tells the call.
    carries: Vec<bool>,
}

impl Below {
    fn of(members: &[Member<'_>], joined: &[Joined]) -> Below {
        let n = members.len();
        let mut below = Below {
            nested: vec![None; n],
            last_transport: vec![None; n],
            carries: vec![false; n],
        };
        let later = |i: usize| {
            let a = &members[i].attempt;
            (a.end, a.start, a.span_id)
        };
        for (i, j) in joined.iter().enumerate() {
            match j.parent {
                Some((p, Link::Nested)) if p != i => {
                    below.nested[p].get_or_insert(i);
                }
                Some((p, Link::Transport)) => {
                    let last = &mut below.last_transport[p];
                    if last.is_none_or(|l| later(i) > later(l)) {
                        *last = Some(i);
                    }
                }
                Some((p, Link::Proxied)) if p != i => below.carries[p] = true,
                _ => {}
            }
            if let Some(h) = j.carrier {
                below.carries[h] = true;
            }
        }
        below
    }
}

/// What is found by walking up from each span, computed once for all, parents first.
struct Up {
    /// The client span a span (or a gateway's span it is proxied through) is the server side
    /// of.
    client: Vec<Option<usize>>,
    /// The first span naming its client among a server span and the gateways' spans it is
    /// proxied through, nearest first.
    named: Vec<Option<usize>>,
    /// A client span followed down its nesting to the innermost span, then to that span's last
    /// transport request: the attempt a server span of it belongs to.
    attempt: Vec<usize>,
}

impl Up {
    fn of(members: &[Member<'_>], joined: &[Joined], below: &Below, order: &[usize]) -> Up {
        let n = joined.len();
        let mut up = Up {
            client: vec![None; n],
            named: vec![None; n],
            attempt: (0..n).collect(),
        };
        for &i in order {
            up.client[i] = match joined[i].parent {
                Some((c, Link::ServerOf)) => Some(c),
                Some((p, Link::Proxied)) if p != i => up.client[p],
                _ => None,
            };
            up.named[i] = if members[i].named {
                Some(i)
            } else {
                proxied(joined, i).and_then(|p| up.named[p])
            };
        }
        // Innermost first: a nested span comes after the span around it in `order`.
        for &i in order.iter().rev() {
            up.attempt[i] = match below.nested[i] {
                Some(inner) if inner != i => up.attempt[inner],
                _ => below.last_transport[i].unwrap_or(i),
            };
        }
        up
    }

    /// The client attempt server span `s` belongs to, if its call has one: the client span it
    /// (or its HTTP carrier) is the server side of, followed down to that span's attempt — a
    /// nested span's innermost one; of a protocol span's transport requests, the last.
    fn attempt_of(&self, joined: &[Joined], s: usize) -> Option<usize> {
        // The carrier's client first: an HTTP server span answers one transport request.
        let client = joined[s]
            .carrier
            .and_then(|h| self.client[h])
            .or(self.client[s])?;
        Some(self.attempt[client])
    }
}

/// The server span `s` is proxied through (a gateway's in front of it), if any.
fn proxied(joined: &[Joined], s: usize) -> Option<usize> {
    match joined[s].parent {
        Some((p, Link::Proxied)) if p != s => Some(p),
        _ => None,
    }
}

/// Indexes in an order where every parent comes before its children, found in one pass from
/// the roots; spans whose parent ids form a cycle (no root above them) come last, in index
/// order.
fn by_depth(joined: &[Joined]) -> Vec<usize> {
    let n = joined.len();
    // Each span's children, as one list sliced by parent (counting sort).
    let mut first = vec![0usize; n + 1];
    for j in joined {
        if let Some((p, _)) = j.parent {
            first[p + 1] += 1;
        }
    }
    for p in 0..n {
        first[p + 1] += first[p];
    }
    let mut fill = first.clone();
    let mut children = vec![0usize; first[n]];
    for (i, j) in joined.iter().enumerate() {
        if let Some((p, _)) = j.parent {
            children[fill[p]] = i;
            fill[p] += 1;
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| joined[i].parent.is_none()).collect();
    let mut placed = vec![false; n];
    order.iter().for_each(|&i| placed[i] = true);
    let (mut at, mut scan) = (0, 0);
    loop {
        while at < order.len() {
            let p = order[at];
            at += 1;
            for &c in &children[first[p]..first[p + 1]] {
                if !placed[c] {
                    placed[c] = true;
                    order.push(c);
                }
            }
        }
        // A cycle of ids: entered at its first span, as if cut above it.
        while scan < n && placed[scan] {
            scan += 1;
        }
        if scan == n {
            return order;
        }
        placed[scan] = true;
        order.push(scan);
    }
}

/// A client attempt of `family` by `client` (`verb target` its operation, ids of trace 1 and
/// span 1, no parent, from 100 to 200), for tests to adjust.
#[cfg(test)]
pub(crate) fn sample(
    family: Family,
    client: Client<'static>,
    verb: &'static str,
    target: &'static str,
) -> Attempt<'static> {
    Attempt {
        client,
        family,
        origin: None,
        path: None,
        http_method: None,
        operation: Operation::new(verb, target, family == Family::Grpc),
        signal: Signal::default(),
        tagged: false,
        start: 100,
        end: 200,
        trace_id: &[1; 16],
        span_id: &[1; 8],
        parent_span_id: &[],
        request: super::Request::default(),
    }
}

#[cfg(test)]
mod tests;
