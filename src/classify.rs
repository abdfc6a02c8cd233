//! Classification: the decision table of DESIGN §4.
//!
//! Core: pure functions, no I/O, no clock, no allocation. A [`Signal`] reduces to an
//! [`Outcome`] (what the response says, independent of the client's history), and
//! [`classify`] turns an outcome, the declared status of the path and whether the client had
//! read the interface's discovery document into a [`Verdict`]. The tracker re-runs
//! [`classify`] when a late discovery read changes the last input.

use crate::discovery::Declared;
use crate::extract::{Family, Said, Signal, GRPC_CODE_NAMES};
use std::fmt;

/// The class of an attempt: the four of the card, and `ok`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// It did not fail.
    Ok,
    /// The interface's contract says no.
    Refusal,
    /// The interface failed right now.
    Transient,
    /// The interface asked the client to slow down.
    Throttled,
    /// Anything else.
    Ambiguous,
}

/// The finer kind of an attempt.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Kind {
    /// It did not fail.
    Ok,
    /// JSON-RPC -32601 (and each protocol's own "not supported" codes), HTTP 405, gRPC
    /// UNIMPLEMENTED, after a discovery read.
    ProtocolNotSupported,
    /// HTTP 404 on an undeclared path, after a discovery read.
    InterfaceNotDeclared,
    /// A refusal from an interface whose contract the client has not read.
    UnverifiedRefusal,
    /// HTTP 429, gRPC RESOURCE_EXHAUSTED.
    Throttled,
    /// HTTP 5xx, a timeout, gRPC UNAVAILABLE or DEADLINE_EXCEEDED.
    Transient,
    /// Anything else that failed.
    Ambiguous,
    /// MCP `-32020` HeaderMismatch: the client must read before it sends again (DESIGN §12.2).
    HeaderMismatch,
    /// An MCP session that is gone: the client must start a new one before it sends again.
    SessionExpired,
}

/// What a client following the decision boundary does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Carry on.
    Proceed,
    /// Do not retry: use a declared interface that supports it, or abstain.
    RouteElsewhereOrAbstain,
    /// Read the discovery document before anything else.
    FetchDiscovery,
    /// Retry with backoff, within the budget.
    RetryWithBackoff,
    /// Do not retry.
    Abstain,
}

/// What a response says, before the client's history is taken into account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// No error.
    Ok,
    /// JSON-RPC -32601 (and each protocol's own "not supported" codes), HTTP 405, gRPC
    /// UNIMPLEMENTED.
    NotSupported,
    /// HTTP 404.
    NotFound,
    /// HTTP 429, gRPC RESOURCE_EXHAUSTED.
    Throttled,
    /// HTTP 5xx, a timeout, gRPC UNAVAILABLE or DEADLINE_EXCEEDED.
    Transient,
    /// Any other failure.
    Other,
    /// MCP `-32020` HeaderMismatch.
    HeaderMismatch,
    /// An MCP session that is gone: a 404 for a request that carried one, or an error saying
    /// `Session not found`.
    SessionGone,
}

impl Outcome {
    /// Every outcome, in the order declared.
    pub const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::NotSupported,
        Outcome::NotFound,
        Outcome::Throttled,
        Outcome::Transient,
        Outcome::Other,
        Outcome::HeaderMismatch,
        Outcome::SessionGone,
    ];
}

/// Which rule of the table fired, for the `refusal_gate.reason` span attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason<'a> {
    /// No error.
    Ok,
    /// A JSON-RPC error code decided.
    JsonRpc(i64),
    /// An HTTP status decided.
    Http(u16),
    /// An HTTP 404 on a path the interface does not declare.
    HttpUndeclared,
    /// A gRPC status decided.
    Grpc(i32),
    /// A timeout, with what said so.
    Timeout(&'a str),
    /// An error with no code, with its `error.type` when there is one.
    Error(Option<&'a str>),
    /// The error's words said more than its codes (DESIGN §12).
    Said(Said),
}

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Ok => f.write_str("ok"),
            Reason::JsonRpc(code) => write!(f, "jsonrpc {code}"),
            Reason::Http(status) => write!(f, "http {status}"),
            Reason::HttpUndeclared => f.write_str("http 404 undeclared path"),
            Reason::Grpc(code) => match GRPC_CODE_NAMES.get(*code as usize) {
                Some(name) => write!(f, "grpc {name}"),
                None => write!(f, "grpc {code}"),
            },
            Reason::Timeout(what) => write!(f, "timeout {what}"),
            Reason::Error(Some(what)) => write!(f, "error {what}"),
            Reason::Error(None) => f.write_str("error"),
            Reason::Said(Said::NotSupported) => f.write_str("a2a not supported"),
            Reason::Said(Said::VersionNotSupported) => f.write_str("a2a version not supported"),
            Reason::Said(Said::UnknownOperation) => f.write_str("unknown operation"),
            Reason::Said(Said::SessionGone) => f.write_str("session not found"),
            Reason::Said(Said::Nothing) => f.write_str("error"),
        }
    }
}

/// Class, kind and decision of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// One of the four classes, or `ok`.
    pub class: Class,
    /// The finer kind.
    pub kind: Kind,
    /// What to do next.
    pub decision: Decision,
}

const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_RESOURCE_EXHAUSTED: i32 = 8;
const GRPC_UNIMPLEMENTED: i32 = 12;
const GRPC_UNAVAILABLE: i32 = 14;
const JSONRPC_METHOD_NOT_FOUND: i64 = -32601;
/// MCP's HeaderMismatch (revision 2026-07-28): a header disagrees with the body.
const MCP_HEADER_MISMATCH: i64 = -32020;
/// The MCP SDKs' request timeout; in A2A the same number is TaskNotFound.
const MCP_REQUEST_TIMEOUT: i64 = -32001;
/// A2A v1.0's statements about what the agent does not support: PushNotificationNotSupported,
/// UnsupportedOperation, ContentTypeNotSupported, ExtendedAgentCardNotConfigured,
/// VersionNotSupported. Other families give these numbers other meanings.
const A2A_NOT_SUPPORTED: [i64; 5] = [-32003, -32004, -32005, -32007, -32009];
/// MCP's UnsupportedProtocolVersion (revision 2026-07-28) and MissingRequiredClientCapability
/// (DESIGN §12.5). The rest of -32000…-32019 is implementation-defined in MCP: no refusal.
const MCP_NOT_SUPPORTED: [i64; 2] = [-32022, -32021];

/// Whether a JSON-RPC code says, in its family, that the operation is not supported here
/// (DESIGN §4 row 1): `-32601` in every family, and each protocol's own codes.
fn not_supported(family: Family, code: i64) -> bool {
    code == JSONRPC_METHOD_NOT_FOUND
        || match family {
            Family::A2a => A2A_NOT_SUPPORTED.contains(&code),
            Family::Mcp => MCP_NOT_SUPPORTED.contains(&code),
            Family::JsonRpc | Family::Grpc | Family::Http => false,
        }
}

/// MCP's UnsupportedProtocolVersion and A2A's VersionNotSupported.
const MCP_VERSION_NOT_SUPPORTED: i64 = -32022;
const A2A_VERSION_NOT_SUPPORTED: i64 = -32009;

/// Whether the answer refused the protocol version the request named, not the operation
/// (DESIGN §12.1): an attempt naming another version after it is a new question.
pub fn refuses_version(family: Family, signal: &Signal<'_>) -> bool {
    match (family, signal.jsonrpc_code) {
        (Family::Mcp, Some(MCP_VERSION_NOT_SUPPORTED)) => true,
        (Family::A2a, Some(A2A_VERSION_NOT_SUPPORTED)) => true,
        _ => signal.said == Said::VersionNotSupported,
    }
}

/// Reduces a signal on a path of `declared` status to its outcome and the reason for it. A
/// JSON-RPC code beats an HTTP status; the rows are tried in the table's order, so the first
/// that matches wins: a `404` on a path declared `no` is row 2 whatever else the span says,
/// and one on a declared or unknown path that timed out is row 4, a timeout (contract 6).
pub fn outcome<'a>(
    family: Family,
    signal: &Signal<'a>,
    declared: Declared,
) -> (Outcome, Reason<'a>) {
    let jsonrpc = signal.jsonrpc_code;
    // When a JSON-RPC code is present, the HTTP status says nothing about the operation.
    let http = if jsonrpc.is_some() {
        None
    } else {
        signal.http_status
    };
    let grpc = signal.grpc_code.filter(|c| *c != 0);
    let mcp_timeout = family == Family::Mcp && jsonrpc == Some(MCP_REQUEST_TIMEOUT);

    match signal.said {
        Said::NotSupported | Said::VersionNotSupported => {
            return (Outcome::NotSupported, Reason::Said(signal.said))
        }
        // An undeclared operation: row 2 on the declared status the caller gives it
        // (`Declared::No`, DESIGN §12.3).
        Said::UnknownOperation => return (Outcome::NotFound, Reason::Said(signal.said)),
        Said::SessionGone if family == Family::Mcp => {
            return (Outcome::SessionGone, Reason::Said(signal.said))
        }
        Said::Nothing | Said::SessionGone => {}
    }
    if family == Family::Mcp && jsonrpc == Some(MCP_HEADER_MISMATCH) {
        return (
            Outcome::HeaderMismatch,
            Reason::JsonRpc(MCP_HEADER_MISMATCH),
        );
    }
    if let Some(code) = jsonrpc.filter(|c| not_supported(family, *c)) {
        return (Outcome::NotSupported, Reason::JsonRpc(code));
    }
    if http == Some(405) {
        return (Outcome::NotSupported, Reason::Http(405));
    }
    if grpc == Some(GRPC_UNIMPLEMENTED) {
        return (Outcome::NotSupported, Reason::Grpc(GRPC_UNIMPLEMENTED));
    }
    if http == Some(404) && (declared == Declared::No || signal.timeout.is_none()) {
        return (Outcome::NotFound, Reason::Http(404));
    }
    if http == Some(429) {
        return (Outcome::Throttled, Reason::Http(429));
    }
    if grpc == Some(GRPC_RESOURCE_EXHAUSTED) {
        return (Outcome::Throttled, Reason::Grpc(GRPC_RESOURCE_EXHAUSTED));
    }
    if let Some(status) = http.filter(|s| (500..600).contains(s)) {
        return (Outcome::Transient, Reason::Http(status));
    }
    if let Some(what) = signal.timeout {
        return (Outcome::Transient, Reason::Timeout(what));
    }
    if mcp_timeout {
        return (Outcome::Transient, Reason::Timeout("-32001"));
    }
    if let Some(code) = grpc.filter(|c| *c == GRPC_UNAVAILABLE || *c == GRPC_DEADLINE_EXCEEDED) {
        return (Outcome::Transient, Reason::Grpc(code));
    }
    if let Some(code) = jsonrpc {
        return (Outcome::Other, Reason::JsonRpc(code));
    }
    if let Some(status) = http.filter(|s| *s >= 400) {
        return (Outcome::Other, Reason::Http(status));
    }
    if let Some(code) = grpc {
        return (Outcome::Other, Reason::Grpc(code));
    }
    if signal.status_error || signal.error_type.is_some() {
        return (Outcome::Other, Reason::Error(signal.error_type));
    }
    (Outcome::Ok, Reason::Ok)
}

/// Whether an outcome on a path with this declared status is a refusal, verified or not
/// (rows 1, 1', 2, 2'). It does not depend on discovery, so the tracker can keep the
/// refusals a probe is judged against without re-classifying.
pub fn is_refusal_signal(outcome: Outcome, declared: Declared) -> bool {
    outcome == Outcome::NotSupported || (outcome == Outcome::NotFound && declared == Declared::No)
}

/// The decision table (DESIGN §4): first matching row wins.
pub fn classify(outcome: Outcome, declared: Declared, discovery_read: bool) -> Verdict {
    let v = |class, kind, decision| Verdict {
        class,
        kind,
        decision,
    };
    let unverified = v(
        Class::Ambiguous,
        Kind::UnverifiedRefusal,
        Decision::FetchDiscovery,
    );
    match outcome {
        Outcome::Ok => v(Class::Ok, Kind::Ok, Decision::Proceed),
        Outcome::NotSupported if discovery_read => v(
            Class::Refusal,
            Kind::ProtocolNotSupported,
            Decision::RouteElsewhereOrAbstain,
        ),
        Outcome::NotSupported => unverified,
        Outcome::NotFound if declared == Declared::No && discovery_read => v(
            Class::Refusal,
            Kind::InterfaceNotDeclared,
            Decision::RouteElsewhereOrAbstain,
        ),
        Outcome::NotFound if declared == Declared::No => unverified,
        Outcome::Throttled => v(
            Class::Throttled,
            Kind::Throttled,
            Decision::RetryWithBackoff,
        ),
        Outcome::Transient => v(
            Class::Transient,
            Kind::Transient,
            Decision::RetryWithBackoff,
        ),
        Outcome::NotFound | Outcome::Other => {
            v(Class::Ambiguous, Kind::Ambiguous, Decision::Abstain)
        }
        Outcome::HeaderMismatch => v(
            Class::Ambiguous,
            Kind::HeaderMismatch,
            Decision::FetchDiscovery,
        ),
        Outcome::SessionGone => v(
            Class::Ambiguous,
            Kind::SessionExpired,
            Decision::FetchDiscovery,
        ),
    }
}

/// The reason to show for an attempt: a 404 that the table read as undeclared says so.
pub fn reason<'a>(outcome: Outcome, declared: Declared, reason: Reason<'a>) -> Reason<'a> {
    if outcome == Outcome::NotFound && declared == Declared::No && reason == Reason::Http(404) {
        Reason::HttpUndeclared
    } else {
        reason
    }
}

impl Class {
    /// Every class, in label order.
    pub const ALL: [Class; 5] = [
        Class::Ok,
        Class::Refusal,
        Class::Transient,
        Class::Throttled,
        Class::Ambiguous,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Refusal => "refusal",
            Class::Transient => "transient",
            Class::Throttled => "throttled",
            Class::Ambiguous => "ambiguous",
        }
    }

    /// Whether the attempt failed in a way that spends the retry budget.
    pub fn is_retryable_failure(self) -> bool {
        matches!(self, Class::Transient | Class::Throttled)
    }
}

impl Kind {
    /// Every kind, in label order.
    pub const ALL: [Kind; 9] = [
        Kind::Ok,
        Kind::ProtocolNotSupported,
        Kind::InterfaceNotDeclared,
        Kind::UnverifiedRefusal,
        Kind::Throttled,
        Kind::Transient,
        Kind::Ambiguous,
        Kind::HeaderMismatch,
        Kind::SessionExpired,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::ProtocolNotSupported => "protocol_not_supported",
            Kind::InterfaceNotDeclared => "interface_not_declared",
            Kind::UnverifiedRefusal => "unverified_refusal",
            Kind::Throttled => "throttled",
            Kind::Transient => "transient",
            Kind::Ambiguous => "ambiguous",
            Kind::HeaderMismatch => "header_mismatch",
            Kind::SessionExpired => "session_expired",
        }
    }

    /// What a client following the decision boundary does after an attempt of this kind.
    pub fn decision(self) -> Decision {
        match self {
            Kind::Ok => Decision::Proceed,
            Kind::ProtocolNotSupported | Kind::InterfaceNotDeclared => {
                Decision::RouteElsewhereOrAbstain
            }
            Kind::UnverifiedRefusal | Kind::HeaderMismatch | Kind::SessionExpired => {
                Decision::FetchDiscovery
            }
            Kind::Throttled | Kind::Transient => Decision::RetryWithBackoff,
            Kind::Ambiguous => Decision::Abstain,
        }
    }

    /// The class every attempt of this kind has.
    pub fn class(self) -> Class {
        match self {
            Kind::Ok => Class::Ok,
            Kind::ProtocolNotSupported | Kind::InterfaceNotDeclared => Class::Refusal,
            Kind::UnverifiedRefusal
            | Kind::Ambiguous
            | Kind::HeaderMismatch
            | Kind::SessionExpired => Class::Ambiguous,
            Kind::Throttled => Class::Throttled,
            Kind::Transient => Class::Transient,
        }
    }
}

impl Decision {
    /// The span attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Proceed => "proceed",
            Decision::RouteElsewhereOrAbstain => "route_elsewhere_or_abstain",
            Decision::FetchDiscovery => "fetch_discovery",
            Decision::RetryWithBackoff => "retry_with_backoff",
            Decision::Abstain => "abstain",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sig() -> Signal<'static> {
        Signal::default()
    }

    /// One row per row of the table, and one per attribute variant that reaches it.
    #[test]
    fn the_decision_table() {
        use Declared::{No, Unknown, Yes};
        use Family::{A2a, Grpc, Http, JsonRpc, Mcp};
        let http = |s: u16| Signal {
            http_status: Some(s),
            ..sig()
        };
        let rpc = |c: i64| Signal {
            jsonrpc_code: Some(c),
            ..sig()
        };
        let grpc = |c: i32| Signal {
            grpc_code: Some(c),
            ..sig()
        };
        let said = |s: Signal<'static>, said| Signal { said, ..s };
        let timeout = |t: &'static str| Signal {
            timeout: Some(t),
            error_type: Some(t),
            status_error: true,
            ..sig()
        };
        #[rustfmt::skip]
        let rows: Vec<(&str, Family, Signal, Declared, bool, Kind, &str)> = vec![
            // row 0: no error
            ("0 http 200", Http, http(200), Yes, false, Kind::Ok, "ok"),
            ("0 http 302", Http, http(302), No, true, Kind::Ok, "ok"),
            ("0 nothing", Mcp, sig(), Unknown, false, Kind::Ok, "ok"),
            ("0 grpc OK", Grpc, grpc(0), Unknown, false, Kind::Ok, "ok"),
            // row 1 / 1': not supported
            ("1 jsonrpc -32601", Mcp, rpc(-32601), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32601"),
            ("1 a2a -32601", A2a, rpc(-32601), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32601"),
            ("1 http 405", Http, http(405), Yes, true, Kind::ProtocolNotSupported, "http 405"),
            ("1 grpc UNIMPLEMENTED", Grpc, grpc(12), Unknown, true, Kind::ProtocolNotSupported, "grpc UNIMPLEMENTED"),
            ("1' jsonrpc -32601 unread", JsonRpc, rpc(-32601), Unknown, false, Kind::UnverifiedRefusal, "jsonrpc -32601"),
            ("1' http 405 unread", Http, http(405), Yes, false, Kind::UnverifiedRefusal, "http 405"),
            ("1' grpc 12 unread", Grpc, grpc(12), Unknown, false, Kind::UnverifiedRefusal, "grpc UNIMPLEMENTED"),
            ("1 a2a -32003", A2a, rpc(-32003), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32003"),
            ("1 a2a -32004", A2a, rpc(-32004), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32004"),
            ("1 a2a -32005", A2a, rpc(-32005), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32005"),
            ("1 a2a -32007", A2a, rpc(-32007), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32007"),
            ("1 a2a -32009", A2a, rpc(-32009), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32009"),
            ("1 mcp -32022", Mcp, rpc(-32022), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32022"),
            ("1 mcp -32021", Mcp, rpc(-32021), Unknown, true, Kind::ProtocolNotSupported, "jsonrpc -32021"),
            ("1 a2a reason over grpc 9", Grpc, said(grpc(9), Said::NotSupported), Unknown, true, Kind::ProtocolNotSupported, "a2a not supported"),
            ("1 a2a reason over http 400", A2a, said(http(400), Said::NotSupported), Yes, true, Kind::ProtocolNotSupported, "a2a not supported"),
            ("1' a2a reason unread", A2a, said(http(400), Said::NotSupported), Yes, false, Kind::UnverifiedRefusal, "a2a not supported"),
            ("1' a2a -32004 unread", A2a, rpc(-32004), Unknown, false, Kind::UnverifiedRefusal, "jsonrpc -32004"),
            ("1 beats http 404", Mcp, Signal { http_status: Some(404), ..rpc(-32601) }, No, true, Kind::ProtocolNotSupported, "jsonrpc -32601"),
            // row 2 / 2': 404 undeclared
            ("2 http 404 undeclared", Http, http(404), No, true, Kind::InterfaceNotDeclared, "http 404 undeclared path"),
            ("2' http 404 undeclared unread", Http, http(404), No, false, Kind::UnverifiedRefusal, "http 404 undeclared path"),
            ("2 unknown tool", Mcp, said(rpc(-32602), Said::UnknownOperation), No, true, Kind::InterfaceNotDeclared, "unknown operation"),
            ("2' unknown tool unread", Mcp, said(rpc(-32602), Said::UnknownOperation), No, false, Kind::UnverifiedRefusal, "unknown operation"),
            // row 3: throttled
            ("3 http 429", Http, http(429), Unknown, false, Kind::Throttled, "http 429"),
            ("3 grpc RESOURCE_EXHAUSTED", Grpc, grpc(8), Unknown, false, Kind::Throttled, "grpc RESOURCE_EXHAUSTED"),
            // row 4: transient
            ("4 http 500", Http, http(500), Unknown, false, Kind::Transient, "http 500"),
            ("4 http 503", Http, http(503), No, true, Kind::Transient, "http 503"),
            ("4 http 504", Http, http(504), Unknown, false, Kind::Transient, "http 504"),
            ("4 ReadTimeout", Http, timeout("ReadTimeout"), Unknown, false, Kind::Transient, "timeout ReadTimeout"),
            ("4 grpc UNAVAILABLE", Grpc, grpc(14), Unknown, false, Kind::Transient, "grpc UNAVAILABLE"),
            ("4 grpc DEADLINE_EXCEEDED", Grpc, grpc(4), Unknown, false, Kind::Transient, "grpc DEADLINE_EXCEEDED"),
            ("4 mcp -32001", Mcp, rpc(-32001), Unknown, true, Kind::Transient, "timeout -32001"),
            ("4 timeout beats 404 declared", Http, Signal { http_status: Some(404), ..timeout("ReadTimeout") }, Yes, true, Kind::Transient, "timeout ReadTimeout"),
            ("4 timeout beats 404 unknown", Mcp, Signal { http_status: Some(404), ..timeout("TimeoutError") }, Unknown, false, Kind::Transient, "timeout TimeoutError"),
            ("2 undeclared 404 beats timeout", Http, Signal { http_status: Some(404), ..timeout("ReadTimeout") }, No, true, Kind::InterfaceNotDeclared, "http 404 undeclared path"),
            ("2' undeclared 404 beats timeout unread", Http, Signal { http_status: Some(404), ..timeout("ReadTimeout") }, No, false, Kind::UnverifiedRefusal, "http 404 undeclared path"),
            // row 5: anything else
            ("5 http 400", Http, http(400), Unknown, true, Kind::Ambiguous, "http 400"),
            ("5 http 403", Http, http(403), Yes, true, Kind::Ambiguous, "http 403"),
            ("5 http 404 declared", Http, http(404), Yes, true, Kind::Ambiguous, "http 404"),
            ("5 http 404 unknown", Http, http(404), Unknown, true, Kind::Ambiguous, "http 404"),
            ("5 jsonrpc -32602", Mcp, rpc(-32602), Unknown, true, Kind::Ambiguous, "jsonrpc -32602"),
            ("5 a2a -32002 TaskNotCancelable", A2a, rpc(-32002), Unknown, true, Kind::Ambiguous, "jsonrpc -32002"),
            ("5 a2a -32006 InvalidAgentResponse", A2a, rpc(-32006), Unknown, true, Kind::Ambiguous, "jsonrpc -32006"),
            ("5 mcp -32020 asks for a read", Mcp, rpc(-32020), Unknown, true, Kind::HeaderMismatch, "jsonrpc -32020"),
            ("5 jsonrpc -32020 is MCP's only", JsonRpc, rpc(-32020), Unknown, true, Kind::Ambiguous, "jsonrpc -32020"),
            ("5 mcp session not found", Mcp, said(Signal { http_status: Some(404), ..rpc(-32600) }, Said::SessionGone), Yes, true, Kind::SessionExpired, "session not found"),
            ("5 a2a session words mean nothing", A2a, said(rpc(-32600), Said::SessionGone), Yes, true, Kind::Ambiguous, "jsonrpc -32600"),
            ("5 mcp -32004 is not MCP's", Mcp, rpc(-32004), Unknown, true, Kind::Ambiguous, "jsonrpc -32004"),
            ("5 mcp -32003 is implementation-defined", Mcp, rpc(-32003), Unknown, true, Kind::Ambiguous, "jsonrpc -32003"),
            ("5 mcp -32019 is implementation-defined", Mcp, rpc(-32019), Unknown, true, Kind::Ambiguous, "jsonrpc -32019"),
            ("5 jsonrpc -32021 is MCP's only", JsonRpc, rpc(-32021), Unknown, true, Kind::Ambiguous, "jsonrpc -32021"),
            ("5 jsonrpc -32004 is A2A's only", JsonRpc, rpc(-32004), Unknown, true, Kind::Ambiguous, "jsonrpc -32004"),
            ("5 jsonrpc -32022 is MCP's only", JsonRpc, rpc(-32022), Unknown, true, Kind::Ambiguous, "jsonrpc -32022"),
            ("5 a2a -32001 is TaskNotFound", A2a, rpc(-32001), Unknown, true, Kind::Ambiguous, "jsonrpc -32001"),
            ("5 jsonrpc beats http 503", Mcp, Signal { http_status: Some(503), ..rpc(-32602) }, Unknown, true, Kind::Ambiguous, "jsonrpc -32602"),
            ("5 grpc PERMISSION_DENIED", Grpc, grpc(7), Unknown, true, Kind::Ambiguous, "grpc PERMISSION_DENIED"),
            ("5 error type only", Http, Signal { error_type: Some("ConnectError"), status_error: true, ..sig() }, Unknown, false, Kind::Ambiguous, "error ConnectError"),
            ("5 status only", Mcp, Signal { status_error: true, ..sig() }, Unknown, false, Kind::Ambiguous, "error"),
        ];
        for (name, family, signal, declared, read, kind, why) in rows {
            let (out, r) = outcome(family, &signal, declared);
            let verdict = classify(out, declared, read);
            assert_eq!(verdict.kind, kind, "{name}");
            assert_eq!(verdict.class, kind.class(), "{name}");
            assert_eq!(reason(out, declared, r).to_string(), why, "{name}");
        }
    }

    #[test]
    fn only_a_version_refusal_refuses_the_version() {
        let rpc = |c: i64| Signal {
            jsonrpc_code: Some(c),
            ..sig()
        };
        assert!(refuses_version(Family::Mcp, &rpc(-32022)));
        assert!(refuses_version(Family::A2a, &rpc(-32009)));
        assert!(!refuses_version(Family::A2a, &rpc(-32022)), "MCP's code");
        assert!(!refuses_version(Family::Mcp, &rpc(-32009)), "A2A's code");
        assert!(!refuses_version(Family::Mcp, &rpc(-32601)));
        let words = |said| Signal { said, ..sig() };
        assert!(refuses_version(
            Family::Grpc,
            &words(Said::VersionNotSupported)
        ));
        assert!(!refuses_version(Family::Grpc, &words(Said::NotSupported)));
    }

    #[test]
    fn decisions_follow_kinds() {
        let cases = [
            (Outcome::Ok, Declared::Unknown, false, Decision::Proceed),
            (
                Outcome::NotSupported,
                Declared::Unknown,
                true,
                Decision::RouteElsewhereOrAbstain,
            ),
            (
                Outcome::NotSupported,
                Declared::Unknown,
                false,
                Decision::FetchDiscovery,
            ),
            (
                Outcome::NotFound,
                Declared::No,
                true,
                Decision::RouteElsewhereOrAbstain,
            ),
            (
                Outcome::NotFound,
                Declared::No,
                false,
                Decision::FetchDiscovery,
            ),
            (
                Outcome::Throttled,
                Declared::Unknown,
                false,
                Decision::RetryWithBackoff,
            ),
            (
                Outcome::Transient,
                Declared::Unknown,
                false,
                Decision::RetryWithBackoff,
            ),
            (Outcome::Other, Declared::Unknown, false, Decision::Abstain),
        ];
        for (o, d, r, want) in cases {
            let v = classify(o, d, r);
            assert_eq!(v.decision, want, "{o:?} {d:?} {r}");
            assert_eq!(v.kind.decision(), want, "{o:?} {d:?} {r}");
        }
    }

    fn any_outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Ok),
            Just(Outcome::NotSupported),
            Just(Outcome::NotFound),
            Just(Outcome::Throttled),
            Just(Outcome::Transient),
            Just(Outcome::Other),
            Just(Outcome::HeaderMismatch),
            Just(Outcome::SessionGone),
        ]
    }

    fn any_declared() -> impl Strategy<Value = Declared> {
        prop_oneof![
            Just(Declared::Yes),
            Just(Declared::No),
            Just(Declared::Unknown)
        ]
    }

    proptest! {
        /// Every attempt gets exactly one class, consistent with its kind; a discovery read
        /// can only turn an unverified refusal into a refusal, never change anything else.
        #[test]
        fn one_class_per_attempt(o in any_outcome(), d in any_declared(), read in any::<bool>()) {
            let v = classify(o, d, read);
            prop_assert_eq!(v.class, v.kind.class());
            prop_assert_eq!(v.class == Class::Ok, o == Outcome::Ok);
            let other = classify(o, d, !read);
            if v != other {
                prop_assert!(is_refusal_signal(o, d));
            }
            prop_assert_eq!(is_refusal_signal(o, d), classify(o, d, true).class == Class::Refusal);
        }
    }
}
