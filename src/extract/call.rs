//! One call, one attempt (DESIGN §11): the spans that describe one call — an agent
//! framework's span, the protocol SDK's under it, the HTTP client's under that, and on the
//! other side the server's — assembled into the attempts of that call.
//!
//! Core: pure. It is given the spans of one call, already extracted ([`Member`]), and how each
//! is joined to its parent ([`link`]); it says what each span is ([`assemble`]): an attempt,
//! with the facts of every span of the call that belong to it, or a part of another's. It
//! finds no spans, holds nothing and knows no interface beyond the closure it is given.

use super::{Attempt, Client, Family, Operation, Signal, UNKNOWN_CLIENT};

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
}

fn is_protocol(family: Family) -> bool {
    matches!(family, Family::Mcp | Family::A2a | Family::JsonRpc)
}

/// How `child` is joined to `parent`, when they are one call (DESIGN §11.1–3, §9). The two
/// are known to be child and parent (or carried and carrier); this says whether that makes
/// them one call.
pub fn link(child: &Member<'_>, parent: &Member<'_>) -> Option<Link> {
    let (c, p) = (&child.attempt, &parent.attempt);
    match (child.side, parent.side) {
        (Side::Client, Side::Client) if c.client == p.client => {
            if c.family == Family::Http && is_protocol(p.family) {
                Some(Link::Transport)
            } else if c.family != Family::Http && c.family == p.family && c.operation == p.operation
            {
                Some(Link::Nested)
            } else {
                None
            }
        }
        (Side::Server(_), Side::Client) => Some(Link::ServerOf),
        (Side::Server(a), Side::Server(b))
            if a == b && is_protocol(c.family) && p.family == Family::Http =>
        {
            Some(Link::Carried)
        }
        _ => None,
    }
}

/// What one span of a call is.
// An attempt is a few hundred bytes and a part none: a call's roles live as long as it takes
// to count it, a handful at a time, so they are not boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Role<'a> {
    /// An attempt of the call, with the facts of every span of it that belong to it.
    Attempt {
        /// The attempt, assembled.
        attempt: Attempt<'a>,
        /// The configured interface it belongs to when that is decided here: a server span's,
        /// and a client attempt's that named no server when a server span of its call did.
        /// `None`: by its own server and path (DESIGN §3).
        interface: Option<usize>,
    },
    /// Part of another span's attempt: skipped as `same_call`.
    Part,
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
        },
        ..inner.clone()
    }
}

/// A transport request of a protocol call as an attempt (§11.1): the call's family and
/// operation, the request's own server, path, status, server's delay and timeout; the request
/// that ended `last` also carries the call's JSON-RPC code, `error.type` and failure. A request
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
        signal: Signal {
            jsonrpc_code,
            grpc_code: None,
            error_type: if last {
                c.error_type.or(r.error_type)
            } else {
                r.error_type
            },
            status_error: r.status_error || (last && c.status_error),
            ..*r
        },
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
        },
        ..client.clone()
    }
}

/// The client nobody named.
const UNKNOWN: Client<'static> = Client {
    name: UNKNOWN_CLIENT,
    instance: None,
};

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
) -> Vec<Role<'a>> {
    let n = members.len();
    let has_child = |p: usize, link: Link| joined.iter().any(|j| j.parent == Some((p, link)));
    // Client facts flow from parent to child: each client span's call as its nesting says.
    let mut call: Vec<Option<Attempt<'a>>> = vec![None; n];
    let mut roles: Vec<Role<'a>> = vec![Role::Part; n];
    for i in by_depth(joined) {
        let m = &members[i];
        if m.side != Side::Client {
            continue;
        }
        let own = match joined[i].parent {
            Some((p, Link::Nested)) => call[p].as_ref().map(|outer| nest(outer, &m.attempt)),
            Some((p, Link::Transport)) => call[p].as_ref().map(|c| {
                let last = last_transport(members, joined, p) == Some(i);
                transport(c, &m.attempt, last, undeclared(&m.attempt))
            }),
            _ => None,
        };
        let own = own.unwrap_or_else(|| m.attempt.clone());
        let carries = is_protocol(m.attempt.family) && has_child(i, Link::Transport);
        if !has_child(i, Link::Nested) && !carries {
            roles[i] = Role::Attempt {
                attempt: own.clone(),
                interface: None,
            };
        }
        call[i] = Some(own);
    }
    // Server spans: each to the client attempt of its call, or an attempt of its own.
    let mut servers: Vec<(usize, usize)> = Vec::new();
    for i in 0..n {
        let Side::Server(interface) = members[i].side else {
            continue;
        };
        if joined.iter().any(|j| j.carrier == Some(i)) {
            continue;
        }
        match attempt_of(members, joined, i) {
            Some(a) => servers.push((a, i)),
            None => {
                let carrier = joined[i]
                    .carrier
                    .filter(|&h| members[h].named)
                    .map(|h| members[h].attempt.client);
                let client = if members[i].named {
                    members[i].attempt.client
                } else {
                    carrier.unwrap_or(UNKNOWN)
                };
                roles[i] = Role::Attempt {
                    attempt: Attempt {
                        client,
                        ..members[i].attempt.clone()
                    },
                    interface: Some(interface),
                };
            }
        }
    }
    // Server spans attached to a client attempt, carried ones (the protocol's) first: they
    // say more of the call than the HTTP spans carrying them.
    let mut attached: Vec<(usize, usize)> = servers
        .iter()
        .flat_map(|&(a, s)| std::iter::once((a, s)).chain(joined[s].carrier.map(|h| (a, h))))
        .collect();
    attached.sort_by_key(|&(a, s)| (a, members[s].attempt.family == Family::Http, s));
    attached.dedup();
    for (a, s) in attached {
        let Side::Server(interface) = members[s].side else {
            continue;
        };
        if let Role::Attempt {
            attempt,
            interface: placed,
        } = &mut roles[a]
        {
            if attempt.origin.is_none() && placed.is_none() {
                *placed = Some(interface);
            }
            *attempt = with_server(attempt, &members[s].attempt);
        }
    }
    roles
}

/// Indexes in an order where every parent comes before its children.
fn by_depth(joined: &[Joined]) -> Vec<usize> {
    let depth = |mut i: usize| {
        let mut d = 0;
        while let Some((p, _)) = joined[i].parent {
            d += 1;
            i = p;
            if d > joined.len() {
                break; // A cycle of ids: cut anywhere.
            }
        }
        d
    };
    let mut order: Vec<usize> = (0..joined.len()).collect();
    order.sort_by_key(|&i| depth(i));
    order
}

/// The transport request under `p` that ended last (ties: the later to start, then the
/// higher span id): the one that carries the call's code.
fn last_transport(members: &[Member<'_>], joined: &[Joined], p: usize) -> Option<usize> {
    (0..members.len())
        .filter(|&i| joined[i].parent == Some((p, Link::Transport)))
        .max_by_key(|&i| {
            let a = &members[i].attempt;
            (a.end, a.start, a.span_id)
        })
}

/// The client attempt a server span belongs to, if its call has one: the client span it (or
/// its HTTP carrier) is the server side of, followed down to that span's attempt — a nested
/// span's innermost one; of a protocol span's transport requests, the one the server span
/// (or its carrier) is the server side of, else the last.
fn attempt_of(members: &[Member<'_>], joined: &[Joined], s: usize) -> Option<usize> {
    let up = |i: usize| match joined[i].parent {
        Some((c, Link::ServerOf)) => Some(c),
        _ => None,
    };
    let via_carrier = joined[s].carrier.and_then(up);
    let mut client = up(s).or(via_carrier)?;
    // Followed down to an attempt; bounded by the call's size (ids may form a cycle).
    for _ in 0..=members.len() {
        let below =
            |link: Link| (0..members.len()).find(|&i| joined[i].parent == Some((client, link)));
        if let Some(inner) = below(Link::Nested) {
            client = inner;
            continue;
        }
        let through = (0..members.len()).find(|&i| {
            joined[i].parent == Some((client, Link::Transport))
                && (up(s) == Some(i) || via_carrier == Some(i))
        });
        return through
            .or_else(|| last_transport(members, joined, client))
            .or(Some(client));
    }
    None
}

#[cfg(test)]
mod tests;
