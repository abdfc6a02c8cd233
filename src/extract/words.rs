//! What an error's words say that its codes do not (DESIGN §12): an A2A "not supported"
//! reason as the gRPC and HTTP bindings carry it, an MCP tool, prompt or resource the server
//! does not have, an MCP session that is gone.
//!
//! Core: pure, and read only for a failed span; it allocates nothing (words are compared
//! without regard to case, in place).

use super::{Family, Said, SpanView};

/// A2A's "not supported" reasons, lower case, with nothing between words.
const A2A_REASONS: [&str; 5] = [
    "unsupportedoperation",
    "pushnotificationnotsupported",
    "contenttypenotsupported",
    "versionnotsupported",
    "extendedagentcardnotconfigured",
];

/// MCP's "resource not found" (revision 2025-06-18 and later).
const MCP_RESOURCE_NOT_FOUND: i64 = -32002;
/// JSON-RPC's invalid params, which MCP servers answer an unknown tool or prompt with.
const INVALID_PARAMS: i64 = -32602;

/// What a failed span of `family` and `method` says in words: its `error.type`, its status
/// description, its `exception` events' messages.
pub(super) fn said<'a>(
    family: Family,
    method: &str,
    jsonrpc_code: Option<i64>,
    error_type: Option<&'a str>,
    span: &dyn SpanView<'a>,
) -> Said {
    if family == Family::Mcp
        && method == "resources/read"
        && jsonrpc_code == Some(MCP_RESOURCE_NOT_FOUND)
    {
        return Said::UnknownOperation;
    }
    if family != Family::Mcp {
        if let Some(said) = error_type.and_then(a2a_reason) {
            return said;
        }
    }
    let said = heard(
        family,
        method,
        jsonrpc_code,
        error_type,
        span.status_message(),
    );
    if said != Said::Nothing {
        return said;
    }
    let mut said = Said::Nothing;
    span.exceptions(&mut |_, message| {
        said = message.map_or(Said::Nothing, |m| {
            heard(family, method, jsonrpc_code, error_type, m)
        });
        said != Said::Nothing
    });
    said
}

/// What one message says.
fn heard(
    family: Family,
    method: &str,
    jsonrpc_code: Option<i64>,
    error_type: Option<&str>,
    text: &str,
) -> Said {
    if text.is_empty() {
        return Said::Nothing;
    }
    if family != Family::Mcp {
        return a2a_reason(text).unwrap_or(Said::Nothing);
    }
    if contains(text, "session not found") {
        return Said::SessionGone;
    }
    if unknown_operation(method, jsonrpc_code, error_type, text) {
        return Said::UnknownOperation;
    }
    Said::Nothing
}

/// An MCP `tools/call`, `prompts/get` or `resources/read` answered with words that say the
/// tool, prompt or resource does not exist (`Unknown tool: x`, `Tool x not found`), by
/// invalid params, a resource's not found (`-32002`, which needs no words for a
/// `resources/read`: [`said`]), or as a tool error with no code.
fn unknown_operation(
    method: &str,
    jsonrpc_code: Option<i64>,
    error_type: Option<&str>,
    text: &str,
) -> bool {
    let noun = match method {
        "tools/call" => "tool",
        "prompts/get" => "prompt",
        "resources/read" => "resource",
        _ => return false,
    };
    let answered = match jsonrpc_code {
        Some(code) => code == INVALID_PARAMS || code == MCP_RESOURCE_NOT_FOUND,
        None => error_type.is_some(),
    };
    answered && says_unknown(noun, text)
}

/// `unknown <noun>` anywhere, or `<noun> … not found` from the message's start (after an
/// optional `Name: ` prefix), without regard to case.
fn says_unknown(noun: &str, text: &str) -> bool {
    let bytes = text.as_bytes();
    let unknown = bytes.windows(8 + noun.len()).any(|w| {
        w[..8].eq_ignore_ascii_case(b"unknown ") && w[8..].eq_ignore_ascii_case(noun.as_bytes())
    });
    if unknown {
        return true;
    }
    let bare = match text.trim().split_once(": ") {
        Some((name, rest)) if !name.contains(char::is_whitespace) => rest,
        _ => text.trim(),
    };
    bare.len() > noun.len()
        && bare.as_bytes()[..noun.len()].eq_ignore_ascii_case(noun.as_bytes())
        && bare.as_bytes()[noun.len()] == b' '
        && contains(bare, " not found")
}

/// Whether `text` contains `needle` (lower case ASCII), without regard to case.
fn contains(text: &str, needle: &str) -> bool {
    text.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// What the first word of `text` (up to a `:`, a space or its end) says when it is an A2A
/// "not supported" reason: any case, `_` or `-` or nothing between words, an `Error` suffix
/// allowed. `VERSION_NOT_SUPPORTED` refuses the version, the others the operation.
fn a2a_reason(text: &str) -> Option<Said> {
    let word = text
        .trim_start()
        .split([':', ' ', '\t', '('])
        .next()
        .unwrap_or("");
    // The shortest reason squeezed (`versionnotsupported`), and the longest with its suffix
    // and a separator between each of its words: nearly every `error.type` is shorter.
    if !(SHORTEST_REASON..=48).contains(&word.len()) {
        return None;
    }
    let mut squeezed = [0u8; 48];
    let mut len = 0;
    for b in word.bytes().filter(|b| *b != b'_' && *b != b'-') {
        squeezed[len] = b.to_ascii_lowercase();
        len += 1;
    }
    let squeezed = &squeezed[..len];
    let bare = squeezed.strip_suffix(b"error").unwrap_or(squeezed);
    match A2A_REASONS.iter().position(|r| r.as_bytes() == bare) {
        Some(VERSION) => Some(Said::VersionNotSupported),
        Some(_) => Some(Said::NotSupported),
        None => None,
    }
}

/// Where `versionnotsupported` stands in [`A2A_REASONS`].
const VERSION: usize = 3;

/// The length of the shortest of [`A2A_REASONS`].
const SHORTEST_REASON: usize = 19;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a2a_reasons_in_every_spelling() {
        for yes in [
            "UNSUPPORTED_OPERATION: streaming is not offered",
            "PushNotificationNotSupportedError",
            "content-type-not-supported",
            "VersionNotSupported",
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            "  unsupported_operation (grpc)",
        ] {
            assert!(a2a_reason(yes).is_some(), "{yes}");
        }
        for no in [
            "task t-9 is already completed",
            "UnsupportedOperations",
            "the operation UNSUPPORTED_OPERATION",
            "",
            "Error",
        ] {
            assert_eq!(a2a_reason(no), None, "{no}");
        }
        let shortest = A2A_REASONS.iter().map(|r| r.len()).min();
        assert_eq!(shortest, Some(SHORTEST_REASON));
        assert_eq!(
            a2a_reason("VERSION_NOT_SUPPORTED: 0.3"),
            Some(Said::VersionNotSupported)
        );
        assert_eq!(
            a2a_reason("VersionNotSupportedError"),
            Some(Said::VersionNotSupported)
        );
        assert_eq!(
            a2a_reason("UnsupportedOperationError"),
            Some(Said::NotSupported)
        );
    }

    #[test]
    fn unknown_tools_prompts_and_resources() {
        let tool = |code, error_type, text| unknown_operation("tools/call", code, error_type, text);
        assert!(tool(Some(-32602), None, "Unknown tool: lookup_v0"));
        assert!(tool(
            Some(-32602),
            None,
            "McpError: Tool lookup_v1 not found"
        ));
        assert!(tool(None, Some("tool_error"), "unknown tool 'x'"));
        assert!(tool(
            None,
            Some("NotFoundError"),
            "Tool lookup_v1 not found"
        ));
        assert!(!tool(
            Some(-32602),
            None,
            "Invalid arguments for tool lookup: q"
        ));
        assert!(!tool(Some(-32603), None, "Unknown tool: x"), "another code");
        assert!(!tool(None, None, "Unknown tool: x"), "no error at all");
        assert!(!tool(None, Some("tool_error"), "division by zero"));
        assert!(!tool(Some(-32602), None, "the tool said: record not found"));
        assert!(
            !tool(Some(-32602), None, "the tool said: Tool lookup not found"),
            "a prefix of words is no name: the message does not start with the noun"
        );
        assert!(!tool(Some(-32602), None, "Tool"), "the noun alone");
        assert!(!tool(Some(-32602), None, "  tool  "));
        let prompt = |text| unknown_operation("prompts/get", Some(-32602), None, text);
        assert!(prompt("unknown prompt 'summary'"));
        assert!(prompt("Prompt summary not found"));
        let resource = |code, text| unknown_operation("resources/read", code, None, text);
        assert!(resource(
            Some(-32002),
            "Resource file:///gone.txt not found"
        ));
        assert!(resource(
            Some(-32602),
            "Resource file:///gone.txt not found"
        ));
        assert!(!resource(
            Some(-32603),
            "Resource file:///gone.txt not found"
        ));
        assert!(!tool(Some(-32002), None, "no such row"));
        assert!(!unknown_operation(
            "tools/list",
            Some(-32602),
            None,
            "Unknown tool: x"
        ));
    }

    /// A failed span saying `status` in its status and `exceptions` in its exception events,
    /// one an event between `|` (`""`: none).
    fn failed(status: &str, exceptions: &str) -> opentelemetry_proto::tonic::trace::v1::Span {
        use crate::otlp::fixtures::{s, span};
        use opentelemetry_proto::tonic::trace::v1::{span::Event, Status};
        let mut sp = span("x", Vec::new());
        sp.status = Some(Status {
            message: status.into(),
            code: 2,
        });
        for exception in exceptions.split('|').filter(|e| !e.is_empty()) {
            sp.events.push(Event {
                name: "exception".into(),
                attributes: vec![s("exception.message", exception)],
                ..Default::default()
            });
        }
        sp
    }

    #[test]
    fn a_failed_span_is_read_in_its_error_type_status_and_exceptions_in_turn() {
        use opentelemetry_proto::tonic::trace::v1::Span;
        let said = |family, method, code, error_type, sp: Span| {
            said(family, method, code, error_type, &&sp)
        };
        // A resource MCP says it does not have, by its code alone.
        assert_eq!(
            said(
                Family::Mcp,
                "resources/read",
                Some(-32002),
                None,
                failed("", "")
            ),
            Said::UnknownOperation
        );
        for (method, code) in [
            ("tools/call", Some(-32002)),
            ("resources/read", Some(-32603)),
        ] {
            assert_eq!(
                said(Family::Mcp, method, code, None, failed("", "")),
                Said::Nothing,
                "{method} {code:?}"
            );
        }
        assert_eq!(
            said(
                Family::Grpc,
                "resources/read",
                Some(-32002),
                None,
                failed("", "")
            ),
            Said::Nothing,
            "MCP's code on another protocol"
        );
        // A2A's reason in `error.type`, read on any protocol but MCP.
        let reason = Some("UnsupportedOperationError");
        assert_eq!(
            said(Family::Http, "POST", None, reason, failed("", "")),
            Said::NotSupported
        );
        assert_eq!(
            said(Family::Mcp, "tools/call", None, reason, failed("", "")),
            Said::Nothing
        );
        // The status description, then each exception's message.
        let gone = |status, exception| {
            said(
                Family::Mcp,
                "tools/call",
                Some(-32600),
                None,
                failed(status, exception),
            )
        };
        assert_eq!(gone("Session not found", ""), Said::SessionGone);
        assert_eq!(gone("Bad Request", "Session not found"), Said::SessionGone);
        assert_eq!(gone("Bad Request", "no such thing"), Said::Nothing);
        // Every exception is read until one says something; the first that does decides.
        assert_eq!(gone("", "retrying|Session not found"), Said::SessionGone);
        assert_eq!(gone("", "Session not found|retrying"), Said::SessionGone);
        assert_eq!(gone("", ""), Said::Nothing);
    }

    #[test]
    fn what_a_message_says_by_family() {
        let mcp = |text| heard(Family::Mcp, "tools/call", Some(-32600), None, text);
        assert_eq!(mcp("Session not found"), Said::SessionGone);
        assert_eq!(mcp("Bad Request: session NOT FOUND"), Said::SessionGone);
        assert_eq!(
            mcp("UNSUPPORTED_OPERATION"),
            Said::Nothing,
            "A2A's words on MCP"
        );
        assert_eq!(mcp(""), Said::Nothing);
        let a2a = |text| heard(Family::Grpc, "a2a.v1.A2AService", None, None, text);
        assert_eq!(a2a("UNSUPPORTED_OPERATION: no"), Said::NotSupported);
        assert_eq!(a2a("Session not found"), Said::Nothing);
    }
}
