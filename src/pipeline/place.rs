//! Where an attempt stands before the tracker sees it: its interface, whether that declares
//! its path, what its response said, its discovery use, and the tracker's and the metrics' ids
//! for it — and the `refusal_gate.*` tags its span is forwarded with.
//!
//! Core: pure but for the metric label handles it looks up (once per request and interface).

use super::Pipeline;
use crate::classify;
use crate::classify::Kind;
use crate::config::Protocol;
use crate::discovery::{Declared, InterfaceRef, Interfaces};
use crate::extract::{self, Attempt};
use crate::label;
use crate::otlp::tags::{self, Tag};
use crate::tracker::honesty::{Contradiction, Testimony};
use crate::tracker::{Asked, GroupId, Judgement, Observation, Violation};
use std::borrow::Cow;
use std::sync::LazyLock;

/// Where one attempt stands.
#[derive(Debug, Clone, Copy)]
pub struct Placed<'i> {
    /// Its interface.
    pub interface: InterfaceRef<'i>,
    /// The interface's name: the `interface` label.
    pub interface_name: &'i str,
    /// Whether the interface declares its path.
    pub declared: Declared,
    /// What its response said.
    pub outcome: classify::Outcome,
    /// The rule that fired.
    pub reason: classify::Reason<'i>,
    /// What it did with the interface's discovery document.
    pub discovery: extract::Discovery,
    /// The tracker's group: client instance and interface.
    pub group: GroupId,
    /// The tracker's id of its operation.
    pub operation: u64,
    /// What it asked, as far as telling a new question from a retry needs.
    pub asked: Asked,
    /// What it says about its interface (DESIGN §13).
    pub testimony: Testimony,
}

/// A resource's client, hashed once for all its spans, and the metric labels of the
/// interfaces its spans went to so far (a request's spans go to a handful).
pub struct ClientIds<'a> {
    /// The client.
    pub client: extract::Client<'a>,
    /// The tracker's id of the client instance.
    pub id: u64,
    /// Its name as a label value: cut to `metrics.max_label_bytes`.
    label: Cow<'a, str>,
    /// The hash of its label value, for the metric labels.
    name: u64,
    /// (interface id, labels), filled in turn.
    labels: [(u64, u32); 16],
    filled: usize,
}

impl Pipeline {
    /// A resource's client with its ids, and the labels of the pairs the metrics have for it
    /// so far (one lookup for the client, not one for each interface its spans went to). A
    /// name cut to `metrics.max_label_bytes` has none found so: each of its pairs is then
    /// looked up, and counted in `refusal_gate_label_truncated_total`, as before.
    pub fn client_ids<'a>(&self, client: extract::Client<'a>) -> ClientIds<'a> {
        let label = label::shorten(client.name, self.metrics.max_label_bytes());
        let name = self.id(&*label);
        let mut labels = [(0, 0); 16];
        let filled = match label {
            Cow::Borrowed(_) => self.metrics.client_pairs(name, &mut labels),
            Cow::Owned(_) => 0,
        };
        ClientIds {
            client,
            id: self.id(client),
            name,
            label,
            labels,
            filled,
        }
    }

    /// The metric labels handle of (client, interface), looked up once per request and
    /// interface; `interface` is the hash of `interface_name`. Names longer than
    /// `metrics.max_label_bytes` are cut ([`label::shorten`]) and keyed by what they are cut
    /// to, as a state file's names are when they are read back.
    pub fn labels(&self, client: &mut ClientIds<'_>, interface: u64, interface_name: &str) -> u32 {
        let known = &client.labels[..client.filled.min(client.labels.len())];
        if let Some((_, labels)) = known.iter().find(|(i, _)| *i == interface) {
            return *labels;
        }
        let short = label::shorten(interface_name, self.metrics.max_label_bytes());
        let interface_label = match &short {
            Cow::Borrowed(_) => interface,
            Cow::Owned(cut) => {
                self.metrics.label_truncated("interface");
                self.id(cut.as_str())
            }
        };
        if matches!(client.label, Cow::Owned(_)) {
            self.metrics.label_truncated("client");
        }
        let labels = self
            .metrics
            .labels(client.name, &client.label, interface_label, &short);
        client.labels[client.filled % client.labels.len()] = (interface, labels);
        client.filled += 1;
        labels
    }

    /// Where an attempt stands: its interface, whether that declares the path, what the
    /// response said, and the tracker's ids for it (`client` is its client's id).
    pub fn place<'i>(
        &self,
        interfaces: &'i Interfaces,
        attempt: &'i Attempt<'_>,
        client: u64,
    ) -> Placed<'i> {
        let origin = attempt.origin.as_ref().map(|o| o.as_str());
        let mut interface = match origin {
            Some(_) => interfaces.resolve(origin, attempt.path),
            None if attempt.family == extract::Family::Grpc => {
                interfaces.resolve_grpc(attempt.operation.verb)
            }
            None => InterfaceRef::Unknown,
        };
        // A path matters only to a configured interface: a gRPC attempt's is built for one
        // alone (and may then choose among the interfaces on its origin).
        let mut room = None;
        let path = match interface {
            InterfaceRef::Configured(_) if attempt.path.is_none() => {
                let path = attempt.path_or_grpc(&mut room);
                if origin.is_some() && path.is_some() {
                    interface = interfaces.resolve(origin, path);
                }
                path
            }
            _ => attempt.path,
        };
        self.place_in(interfaces, interface, attempt, path, client)
    }

    /// Where an attempt on `interface`, with `path` (its own, or the one built for it),
    /// stands: the rest of [`Pipeline::place`], and all of it for an attempt whose interface
    /// is known beforehand (a SERVER span of an observed interface).
    pub fn place_in<'i>(
        &self,
        interfaces: &'i Interfaces,
        interface: InterfaceRef<'i>,
        attempt: &'i Attempt<'_>,
        path: Option<&str>,
        client: u64,
    ) -> Placed<'i> {
        let interface_name = interfaces.name(interface);
        // A tool, prompt or resource the server does not have is an undeclared operation
        // (DESIGN §12.3), whatever its path.
        let declared = match attempt.signal.said {
            extract::Said::UnknownOperation => Declared::No,
            _ => interfaces.declared(interface, path),
        };
        let (mut outcome, reason) = classify::outcome(attempt.family, &attempt.signal, declared);
        let succeeded = outcome == classify::Outcome::Ok;
        let mcp = match interface {
            InterfaceRef::Configured(i) => interfaces
                .get(i)
                .is_some_and(|i| i.protocol == Protocol::Mcp),
            _ => false,
        };
        // A GET or DELETE to a path the interface does not declare is no part of its
        // transport (DESIGN §12.4, contract 6): an ordinary http attempt.
        let stream = is_stream(attempt) && declared != Declared::No;
        let session = attempt.request.session;
        let discovery = extract::discovery(attempt, succeeded, interfaces, interface);
        let operation = self.id(attempt.operation);
        // A 404 on a declared MCP endpoint for a request that carried a session: the session
        // is gone (DESIGN §12.2). With no session known it stays what it was.
        if outcome == classify::Outcome::NotFound
            && declared == Declared::Yes
            && session != 0
            && (mcp || attempt.family == extract::Family::Mcp)
        {
            outcome = classify::Outcome::SessionGone;
        }
        Placed {
            interface,
            interface_name,
            declared,
            outcome,
            reason: classify::reason(outcome, declared, reason),
            discovery,
            group: GroupId {
                client,
                interface: self.id(interface_name),
            },
            // The same GET or DELETE in another session is another question (DESIGN §12.4).
            operation: if stream && session != 0 {
                self.id((attempt.operation, session))
            } else {
                operation
            },
            testimony: testimony(
                attempt,
                (interfaces, interface, path),
                (outcome, declared, discovery),
                || {
                    (
                        self.about(attempt, Some(operation)),
                        Testimony::client(client),
                    )
                },
            ),
            asked: Asked {
                version: attempt.request.version,
                arguments: attempt.request.arguments,
                version_refused: classify::refuses_version(attempt.family, &attempt.signal),
                sessionless: stream && mcp && session == 0,
                // A successful MCP request shows a session; so does a successful POST to a
                // declared endpoint of an MCP interface, all that a client traced only at
                // HTTP shows of its `initialize` (the TypeScript SDK over undici's
                // instrumentation).
                in_session: succeeded
                    && (attempt.family == extract::Family::Mcp
                        || (mcp && declared == Declared::Yes && has_method(attempt, &["POST"]))),
            },
        }
    }
}

/// What an attempt says about its interface (DESIGN §13): that it refused the operation
/// (row 1 or 1'), served it, or contradicted its document — served what it declares `no`, or
/// refused what it declares (a 405 for a method the endpoint lists, `UNIMPLEMENTED` for a
/// declared gRPC method, a 404 on a declared path that is one resource). An attempt that
/// names no server says nothing; a request for the discovery document is no operation of
/// the document's. `about` gives the operation and the witness (the client; a caller that
/// joined the server's side of the call makes it [`crate::tracker::honesty::SERVER`]).
fn testimony(
    attempt: &Attempt<'_>,
    (interfaces, interface, path): (&Interfaces, InterfaceRef<'_>, Option<&str>),
    (outcome, declared, discovery): (classify::Outcome, Declared, extract::Discovery),
    about: impl FnOnce() -> (u64, u32),
) -> Testimony {
    use classify::Outcome;
    use extract::Family;
    if interface == InterfaceRef::Unknown {
        return Testimony::default();
    }
    let refused = outcome == Outcome::NotSupported;
    let served = outcome == Outcome::Ok;
    let drift = match (outcome, declared) {
        _ if discovery != extract::Discovery::None => None,
        (Outcome::Ok, Declared::No) => Some(Contradiction::UndeclaredServed),
        (Outcome::NotSupported | Outcome::NotFound, Declared::Yes) => {
            let (listed, literal) = interfaces.declares(interface, path, attempt.http_method);
            let refuses = match outcome {
                Outcome::NotFound => literal,
                _ => listed && matches!(attempt.family, Family::Http | Family::Grpc),
            };
            refuses.then_some(Contradiction::DeclaredRefused)
        }
        _ => None,
    };
    if !(refused || served || drift.is_some()) {
        return Testimony::default();
    }
    let (about, witness) = about();
    Testimony {
        about,
        refused,
        served,
        drift,
        witness,
        configured: matches!(interface, InterfaceRef::Configured(_)),
    }
}

impl Pipeline {
    /// The operation as DESIGN §13 compares them, an id as the tracker's operations are
    /// (`operation`, the id of the attempt's own, when the caller has it): for HTTP, the
    /// method and the path with a trailing `/`, doubled `/` and case taken away; else the
    /// method and target. Never 0. A path already so (nearly every one) costs no more hashing.
    pub fn about(&self, attempt: &Attempt<'_>, operation: Option<u64>) -> u64 {
        let op = attempt.operation;
        let id = |op: extract::Operation<'_>| self.id(op).max(1);
        if attempt.family != extract::Family::Http || is_plain(op.verb, op.target) {
            return operation.map_or_else(|| id(op), |o| o.max(1));
        }
        let mut room = [0u8; 512];
        match plain(op.verb, op.target, &mut room) {
            Some((verb, target)) => id(extract::Operation::new(verb, target, false)),
            // A path longer than the room: by its own bytes.
            None => id(op),
        }
    }
}

/// Whether an HTTP method and path are as §13 compares them already: an upper-case method, a
/// lower-case path with no doubled `/` and no trailing one (but the root).
fn is_plain(verb: &str, path: &str) -> bool {
    let b = path.as_bytes();
    // One pass over the path: the previous byte tells a doubled `/`.
    let mut previous = 0u8;
    let path_plain = b.iter().all(|&c| {
        let plain = !(c.is_ascii_uppercase() || (c == b'/' && previous == b'/'));
        previous = c;
        plain
    });
    path_plain
        && !(b.len() > 1 && previous == b'/')
        && !verb.bytes().any(|c| c.is_ascii_lowercase())
}

/// The method upper case and the path lower case with doubled and trailing `/` taken away,
/// written into `room`; `None` when they do not fit.
fn plain<'r>(verb: &str, path: &str, room: &'r mut [u8; 512]) -> Option<(&'r str, &'r str)> {
    if verb.len() + path.len() > room.len() {
        return None;
    }
    let (v, rest) = room.split_at_mut(verb.len());
    for (to, from) in v.iter_mut().zip(verb.bytes()) {
        *to = from.to_ascii_uppercase();
    }
    let mut len = 0;
    let mut slash = false;
    for b in path.bytes() {
        if b == b'/' {
            slash = true;
            continue;
        }
        if slash {
            rest[len] = b'/';
            len += 1;
            slash = false;
        }
        rest[len] = b.to_ascii_lowercase();
        len += 1;
    }
    if len == 0 && path.starts_with('/') {
        rest[0] = b'/';
        len = 1;
    }
    // ASCII changed into ASCII, `/` taken away: still UTF-8.
    Some((
        std::str::from_utf8(v).ok()?,
        std::str::from_utf8(&rest[..len]).ok()?,
    ))
}

/// An HTTP GET or DELETE: on an MCP endpoint, the optional server stream or a session's end,
/// parts of the transport and not a call (DESIGN §12.4).
fn is_stream(attempt: &Attempt<'_>) -> bool {
    has_method(attempt, &["GET", "DELETE"])
}

/// Whether `attempt` is a plain HTTP request with one of `methods`.
fn has_method(attempt: &Attempt<'_>, methods: &[&str]) -> bool {
    attempt.family == extract::Family::Http
        && attempt
            .http_method
            .is_some_and(|m| methods.iter().any(|k| m.eq_ignore_ascii_case(k)))
}

/// What the tracker takes of a placed attempt.
pub fn observation(p: &Placed<'_>, attempt: &Attempt<'_>, labels: u32) -> Observation {
    let (trace_id, span_id) = ids(attempt.trace_id, attempt.span_id);
    Observation {
        group: p.group,
        operation: p.operation,
        labels,
        start: attempt.start,
        end: attempt.end,
        outcome: p.outcome,
        declared: p.declared,
        discovery: p.discovery,
        retry_after: attempt.signal.retry_after,
        trace_id,
        span_id,
        anonymous: attempt.client.name == extract::UNKNOWN_CLIENT
            && attempt.client.instance.is_none(),
        asked: p.asked,
        testimony: p.testimony,
    }
}

/// The tracker's ids of a span whose protobuf ids are `trace` and `span`. Valid ids (16 and
/// 8 bytes) are kept as they are; ids of another length (or absent) still tell the span
/// apart — the trace id is then all zero, which no valid trace id is, and the span id a hash
/// of both — but are never shown as an exemplar (an exemplar names a real trace).
pub fn ids(trace: &[u8], span: &[u8]) -> ([u8; 16], [u8; 8]) {
    if let (Ok(trace_id), Ok(span_id)) = (trace.try_into(), span.try_into()) {
        return (trace_id, span_id);
    }
    // FNV-1a over both ids and their lengths: the same wrong ids give the same key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let lengths = [trace.len() as u8, span.len() as u8];
    for b in lengths.iter().chain(trace).chain(span) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    ([0; 16], h.to_be_bytes())
}

/// Appends the `refusal_gate.*` attributes of DESIGN §6 that do not depend on the verdict
/// to `out`: the rule (`reason`, already written out) and the interface, named as its label
/// is (cut to `max_label_bytes`).
pub fn write_place_tags(out: &mut Vec<u8>, reason: &str, interface: &str, max_label_bytes: usize) {
    tags::push(out, "refusal_gate.reason", Tag::Str(reason));
    let interface = label::shorten(interface, max_label_bytes);
    tags::push(out, "refusal_gate.interface", Tag::Str(&interface));
}

/// The class, kind and decision tags of each kind, encoded once: a verdict's tags are
/// then mostly copies (every forwarded attempt writes them).
static KIND_TAGS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    Kind::ALL
        .iter()
        .map(|k| {
            let mut out = Vec::new();
            tags::push(&mut out, "refusal_gate.class", Tag::Str(k.class().as_str()));
            tags::push(&mut out, "refusal_gate.kind", Tag::Str(k.as_str()));
            let decision = k.decision().as_str();
            tags::push(&mut out, "refusal_gate.decision", Tag::Str(decision));
            out
        })
        .collect()
});

/// The `discovery_read` tag, false and true, encoded once.
static READ_TAGS: LazyLock<[Vec<u8>; 2]> = LazyLock::new(|| {
    [false, true].map(|read| {
        let mut out = Vec::new();
        tags::push(&mut out, "refusal_gate.discovery_read", Tag::Bool(read));
        out
    })
});

/// The `violation` tag of each violation, encoded once.
static VIOLATION_TAGS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    Violation::ALL
        .iter()
        .map(|v| {
            let mut out = Vec::new();
            tags::push(&mut out, "refusal_gate.violation", Tag::Str(v.as_str()));
            out
        })
        .collect()
});

/// Appends the `refusal_gate.*` attributes of an attempt's verdict to `out`: class, kind,
/// decision, discovery_read, attempt and, when it commits one, violation.
pub fn write_verdict_tags(out: &mut Vec<u8>, j: &Judgement) {
    let kind = Kind::ALL.iter().position(|k| *k == j.kind).unwrap_or(0);
    out.extend_from_slice(&KIND_TAGS[kind]);
    out.extend_from_slice(&READ_TAGS[usize::from(j.discovery_read)]);
    tags::push(out, "refusal_gate.attempt", Tag::Int(i64::from(j.attempt)));
    if let Some(v) = j.violation {
        let v = Violation::ALL.iter().position(|w| *w == v).unwrap_or(0);
        out.extend_from_slice(&VIOLATION_TAGS[v]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_compared_as_section_13_compares_them() {
        let mut room = [0u8; 512];
        for (verb, path, want) in [
            ("get", "/A//b/", ("GET", "/a/b")),
            ("GET", "/", ("GET", "/")),
            ("GET", "//", ("GET", "/")),
            ("POST", "relative/Path", ("POST", "relative/path")),
            ("DELETE", "/x///", ("DELETE", "/x")),
        ] {
            assert_eq!(plain(verb, path, &mut room), Some(want), "{verb} {path}");
            assert!(is_plain(want.0, want.1), "{want:?} is plain");
            assert!(
                !is_plain(verb, path) || (verb, path) == want,
                "{verb} {path}"
            );
        }
        assert_eq!(plain("GET", &"/x".repeat(300), &mut room), None, "too long");
        let p = Pipeline::from_config(&crate::config::Config::default());
        let http = |verb: &'static str, path: &'static str| {
            crate::extract::call::sample(
                extract::Family::Http,
                extract::Client {
                    name: "a",
                    instance: None,
                },
                verb,
                path,
            )
        };
        let plain_one = p.about(&http("GET", "/items/x"), None);
        for same in [http("get", "/Items//X/"), http("GET", "/items/x/")] {
            assert_eq!(p.about(&same, None), plain_one);
        }
        assert_ne!(p.about(&http("GET", "/items/y"), None), plain_one);
        assert_ne!(p.about(&http("POST", "/items/x"), None), plain_one);
        let own = p.id(http("GET", "/items/x").operation);
        assert_eq!(
            p.about(&http("GET", "/items/x"), Some(own)),
            plain_one,
            "the id given"
        );
    }

    #[test]
    fn the_verdict_tags_encoded_once_are_those_written_one_by_one() {
        for kind in Kind::ALL {
            for violation in std::iter::once(None).chain(Violation::ALL.map(Some)) {
                for discovery_read in [false, true] {
                    let j = Judgement {
                        kind,
                        violation,
                        attempt: 300,
                        discovery_read,
                    };
                    let mut want = Vec::new();
                    tags::push(
                        &mut want,
                        "refusal_gate.class",
                        Tag::Str(kind.class().as_str()),
                    );
                    tags::push(&mut want, "refusal_gate.kind", Tag::Str(kind.as_str()));
                    let decision = Tag::Str(kind.decision().as_str());
                    tags::push(&mut want, "refusal_gate.decision", decision);
                    let read = Tag::Bool(discovery_read);
                    tags::push(&mut want, "refusal_gate.discovery_read", read);
                    tags::push(&mut want, "refusal_gate.attempt", Tag::Int(300));
                    if let Some(v) = violation {
                        tags::push(&mut want, "refusal_gate.violation", Tag::Str(v.as_str()));
                    }
                    let mut got = Vec::new();
                    write_verdict_tags(&mut got, &j);
                    assert_eq!(got, want, "{kind:?} {violation:?} {discovery_read}");
                }
            }
        }
    }

    #[test]
    fn valid_ids_are_kept_and_others_tell_spans_apart_under_an_all_zero_trace() {
        assert_eq!(ids(&[7; 16], &[9; 8]), ([7; 16], [9; 8]));
        let wrong: [(&[u8], &[u8]); 6] = [
            (&[7; 15], &[9; 8]),
            (&[7; 17], &[9; 8]),
            (&[], &[9; 8]),
            (&[7; 16], &[9; 7]),
            (&[7; 16], &[9; 9]),
            (&[7; 16], &[]),
        ];
        let mut seen = std::collections::HashSet::new();
        for (trace, span) in wrong {
            let (trace_id, span_id) = ids(trace, span);
            assert_eq!(trace_id, [0; 16], "{trace:?} {span:?}");
            assert_eq!(ids(trace, span), (trace_id, span_id), "the same each time");
            assert!(seen.insert(span_id), "told apart: {trace:?} {span:?}");
        }
        // The lengths count: the same bytes split otherwise are another span.
        assert_ne!(ids(&[7; 15], &[7; 9]), ids(&[7; 14], &[7; 10]));
    }
}
