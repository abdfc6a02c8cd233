//! An attempt kept past its request: [`Owned`], the copy of an [`Attempt`] that a call still
//! waiting for its other spans holds (DESIGN §11) — the extracted facts and ids, not the span.
//!
//! Core: pure. One allocation an attempt: its strings, one after another, in one buffer.

use super::{Attempt, Client, Family, Operation, Request, Said, Signal};
use crate::url::Origin;
use std::ops::Range;

/// The strings of an attempt, in the order [`Owned`] keeps them.
#[derive(Clone, Copy)]
enum Text {
    Client,
    Instance,
    Path,
    HttpMethod,
    Verb,
    Target,
    Via,
    Timeout,
    ErrorType,
}

const TEXTS: usize = 9;

/// An [`Attempt`] with its strings owned: what a held or remembered call keeps of each span.
#[derive(Debug, Clone, PartialEq)]
pub struct Owned {
    text: String,
    /// Where each of [`Text`] stands in `text`; `None` for an absent optional one.
    at: [Option<(u32, u32)>; TEXTS],
    /// Kept as it is: an attempt read back is a copy, not normalised again.
    origin: Option<Origin>,
    family: Family,
    grpc: bool,
    http_status: Option<u16>,
    jsonrpc_code: Option<i64>,
    grpc_code: Option<i32>,
    status_error: bool,
    retry_after: Option<u64>,
    said: Said,
    tagged: bool,
    start: u64,
    end: u64,
    trace_id: Id<16>,
    span_id: Id<8>,
    parent_span_id: Id<8>,
    request: Request,
}

/// An id of at most `N` bytes (longer ones are cut: they are invalid, and only compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Id<const N: usize> {
    bytes: [u8; N],
    len: u8,
}

impl<const N: usize> Id<N> {
    fn of(bytes: &[u8]) -> Id<N> {
        let len = bytes.len().min(N);
        let mut id = Id {
            bytes: [0; N],
            len: len as u8,
        };
        id.bytes[..len].copy_from_slice(&bytes[..len]);
        id
    }

    fn get(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl Owned {
    /// The owned copy of `a`.
    pub fn of(a: &Attempt<'_>) -> Owned {
        let texts: [Option<&str>; TEXTS] = [
            Some(a.client.name),
            a.client.instance,
            a.path,
            a.http_method,
            Some(a.operation.verb),
            Some(a.operation.target),
            Some(a.operation.via),
            a.signal.timeout,
            a.signal.error_type,
        ];
        let mut text = String::with_capacity(texts.iter().flatten().map(|t| t.len()).sum());
        let mut at = [None; TEXTS];
        for (slot, t) in at.iter_mut().zip(texts) {
            *slot = t.map(|t| {
                let start = text.len() as u32;
                text.push_str(t);
                (start, t.len() as u32)
            });
        }
        Owned {
            text,
            at,
            origin: a.origin,
            family: a.family,
            grpc: a.operation.grpc,
            http_status: a.signal.http_status,
            jsonrpc_code: a.signal.jsonrpc_code,
            grpc_code: a.signal.grpc_code,
            status_error: a.signal.status_error,
            retry_after: a.signal.retry_after,
            said: a.signal.said,
            tagged: a.tagged,
            start: a.start,
            end: a.end,
            trace_id: Id::of(a.trace_id),
            span_id: Id::of(a.span_id),
            parent_span_id: Id::of(a.parent_span_id),
            request: a.request,
        }
    }

    fn text(&self, which: Text) -> Option<&str> {
        let (start, len) = self.at[which as usize]?;
        let range: Range<usize> = start as usize..(start + len) as usize;
        self.text.get(range)
    }

    /// The attempt, borrowed from this copy.
    pub fn attempt(&self) -> Attempt<'_> {
        let text = |t| self.text(t).unwrap_or("");
        Attempt {
            client: Client {
                name: text(Text::Client),
                instance: self.text(Text::Instance),
            },
            family: self.family,
            origin: self.origin,
            path: self.text(Text::Path),
            http_method: self.text(Text::HttpMethod),
            operation: Operation {
                verb: text(Text::Verb),
                target: text(Text::Target),
                grpc: self.grpc,
                via: text(Text::Via),
            },
            signal: Signal {
                http_status: self.http_status,
                jsonrpc_code: self.jsonrpc_code,
                grpc_code: self.grpc_code,
                timeout: self.text(Text::Timeout),
                error_type: self.text(Text::ErrorType),
                status_error: self.status_error,
                retry_after: self.retry_after,
                said: self.said,
            },
            tagged: self.tagged,
            start: self.start,
            end: self.end,
            trace_id: self.trace_id.get(),
            span_id: self.span_id.get(),
            parent_span_id: self.parent_span_id.get(),
            request: self.request,
        }
    }

    /// Moves it out, leaving it without strings (every one of them empty).
    pub fn take(&mut self) -> Owned {
        Owned {
            text: std::mem::take(&mut self.text),
            ..*self
        }
    }

    /// The memory its strings take on the heap, in bytes.
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_attempt_reads_back_as_the_attempt_it_copies() {
        let origin = Origin::new("https", "MCP.test", Some(8443));
        let full = Attempt {
            client: Client {
                name: "agent",
                instance: Some("pod-7"),
            },
            family: Family::Mcp,
            origin,
            path: Some("/mcp/sse"),
            http_method: Some("POST"),
            operation: Operation {
                verb: "tools/call",
                target: "get_weather",
                grpc: false,
                via: "/mcp/sse",
            },
            signal: Signal {
                http_status: Some(404),
                jsonrpc_code: Some(-32601),
                grpc_code: Some(12),
                timeout: Some("ReadTimeout"),
                error_type: Some("tool_error"),
                status_error: true,
                retry_after: Some(2_000),
                said: Said::SessionGone,
            },
            tagged: true,
            start: 100,
            end: 120,
            trace_id: &[1; 16],
            span_id: &[2; 8],
            parent_span_id: &[3; 8],
            request: Request {
                session: 1,
                version: 2,
                arguments: 3,
            },
        };
        let bare = Attempt {
            client: Client {
                name: "",
                instance: None,
            },
            origin: None,
            path: None,
            http_method: None,
            operation: Operation::new("x", "", true),
            signal: Signal::default(),
            tagged: false,
            trace_id: &[],
            span_id: &[4; 3],
            parent_span_id: &[],
            request: Request::default(),
            ..full.clone()
        };
        for a in [full, bare] {
            let owned = Owned::of(&a);
            assert_eq!(owned.attempt(), a);
            let strings = [
                a.client.name,
                a.operation.verb,
                a.operation.target,
                a.operation.via,
            ]
            .iter()
            .chain([a.client.instance, a.path, a.http_method].iter().flatten())
            .chain([a.signal.timeout, a.signal.error_type].iter().flatten())
            .map(|t| t.len())
            .sum::<usize>();
            assert_eq!(owned.heap_bytes(), strings, "one buffer, no more");
        }
    }
}
