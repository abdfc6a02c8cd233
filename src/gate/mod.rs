//! The Gate API: an agent asks, before it retries, whether it should (`proto/refusal_gate/v1/
//! gate.proto`; gRPC on the OTLP/gRPC port, an HTTP mirror on the admin port).
//!
//! Not pure: the Gate answers from the live pipeline, and an observed question is tracked and
//! counted. A [`Question`] is turned into the client span its call would produce
//! ([`QuestionSpan`]), which goes through the same extraction, placing, classification and
//! tracker state as every span ([`assess`]): there is no second implementation of the
//! decision table. [`answer`] then adds what only a question needs: the
//! backoff and budget left for a retry, the discovery document to fetch, and the declared
//! interfaces to route to instead. [`grpc`] and [`http`] are the thin edges.

pub mod grpc;
pub mod http;
pub mod proto;

use crate::alert::{Alert, Severity};
use crate::classify::{Class, Decision, Kind};
use crate::clock::Nanos;
use crate::config::Protocol as InterfaceProtocol;
use crate::extract::{self, Client, SpanView, Val};
use crate::pipeline::Pipeline;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The first wait before a retry; it doubles with each attempt up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait suggested before a retry.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The protocol of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Plain HTTP.
    Http,
    /// Model Context Protocol.
    Mcp,
    /// Agent2Agent.
    A2a,
    /// gRPC.
    Grpc,
    /// Any other JSON-RPC 2.0 server.
    Jsonrpc,
}

/// Who asks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Asker {
    /// `service.name`.
    pub service_name: String,
    /// `service.instance.id`, empty when none.
    pub service_instance_id: String,
}

/// The last response of the attempt asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LastResponse {
    /// The HTTP status, 0 when none.
    pub http_status: u16,
    /// The JSON-RPC error code, 0 when none.
    pub jsonrpc_code: i64,
    /// The gRPC status code, when there is one.
    pub grpc_code: Option<i32>,
    /// The call timed out.
    pub timed_out: bool,
    /// `error.type`, when nothing else says.
    pub error_type: String,
    /// Which attempt in a row this was (1 for the first; 0: unknown).
    pub attempt: u32,
    /// The server's delay (its `Retry-After`) in milliseconds; 0 when none.
    pub retry_after_ms: u64,
}

/// One `Decide` question, as the gRPC message and the HTTP mirror's JSON carry it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// Who asks.
    #[serde(default)]
    pub client: Asker,
    /// The protocol of the call.
    pub protocol: Protocol,
    /// The full URL called (or, for gRPC, the authority as a URL).
    #[serde(default)]
    pub url: String,
    /// Or the target by the name of a configured interface.
    #[serde(default)]
    pub interface: String,
    /// The HTTP method.
    #[serde(default)]
    pub http_method: String,
    /// The MCP, A2A or JSON-RPC method, or gRPC's `package.Service/Method`.
    #[serde(default)]
    pub method: String,
    /// The tool of an MCP `tools/call`.
    #[serde(default)]
    pub tool: String,
    /// The last response; absent: the call has not been made yet.
    #[serde(default)]
    pub last_response: Option<LastResponse>,
    /// Count the call as an attempt.
    #[serde(default)]
    pub observe: bool,
}

/// An interface that declares the operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alternative {
    /// Its name.
    pub interface: String,
    /// Where it serves the operation.
    pub url: String,
    /// `mcp`, `a2a`, `http` or `grpc`.
    pub protocol: String,
}

/// The answer to a [`Question`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// `ok`, `refusal`, `transient`, `throttled` or `ambiguous`.
    pub class: String,
    /// The finer kind.
    pub kind: String,
    /// What to do next.
    pub decision: String,
    /// The rule that fired.
    pub rule: String,
    /// The interface of the target.
    pub interface: String,
    /// For a retry: how long to wait, in milliseconds.
    pub backoff_ms: u64,
    /// For a retry: the retries the budget has left after it.
    pub retries_left: u32,
    /// For `fetch_discovery`: the document to read first.
    pub discovery_url: String,
    /// Declared interfaces that support the operation.
    pub alternatives: Vec<Alternative>,
    /// Whether the call was counted as an attempt.
    pub observed: bool,
    /// The interface refused this operation and served it within `tracker.honesty_window`
    /// (DESIGN §13): its refusal may not be authoritative.
    pub contradicted: bool,
}

/// A question the gate cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unanswerable {
    /// Neither a URL nor an interface, or an interface that is not configured.
    #[error("{0}")]
    NoTarget(String),
    /// The question does not make an attempt of its protocol (no method, no HTTP method).
    #[error("not an attempt of its protocol: {0}")]
    NotAnAttempt(&'static str),
    /// It would observe a call as a client the asker's token may not speak for, or the token
    /// only reads (DESIGN §7): refused, counted, never judged.
    #[error("this token may not observe calls as that client")]
    NotPermitted,
}

/// The client a question asks as: its `service.name`, `unknown_service` when it gives none
/// (as a span's resource without one).
pub fn client_name(q: &Question) -> &str {
    if q.client.service_name.is_empty() {
        "unknown_service"
    } else {
        &q.client.service_name
    }
}

/// Whether a token with `grant` may ask `q`: any question that does not observe; one that
/// does only as a client the grant speaks for and observes as.
///
/// # Errors
/// [`Unanswerable::NotPermitted`].
pub fn permitted(grant: &crate::access::Grant, q: &Question) -> Result<(), Unanswerable> {
    if q.observe && !grant.observes_as(client_name(q)) {
        Err(Unanswerable::NotPermitted)
    } else {
        Ok(())
    }
}

/// The client span a question's call would produce.
pub struct QuestionSpan<'q> {
    attributes: Vec<(&'static str, Val<'q>)>,
    start: u64,
    end: u64,
    status_error: bool,
    trace_id: [u8; 16],
    span_id: [u8; 8],
}

impl<'q> SpanView<'q> for &'q QuestionSpan<'q> {
    fn kind(&self) -> i32 {
        3 // CLIENT
    }
    fn name(&self) -> &'q str {
        ""
    }
    fn start(&self) -> u64 {
        self.start
    }
    fn end(&self) -> u64 {
        self.end
    }
    fn trace_id(&self) -> &'q [u8] {
        &self.trace_id
    }
    fn span_id(&self) -> &'q [u8] {
        &self.span_id
    }
    fn status_error(&self) -> bool {
        self.status_error
    }
    fn attributes(&self, max: usize, f: &mut dyn FnMut(&'q [u8], Val<'q>)) {
        for (k, v) in self.attributes.iter().take(max) {
            f(k.as_bytes(), *v);
        }
    }
    fn attribute_count(&self) -> usize {
        self.attributes.len()
    }
    fn exceptions(&self, _: &mut dyn FnMut(Option<&'q str>, Option<&'q str>) -> bool) {}
}

/// The span `q`'s call to `url` would produce, ending at `now` (Unix nanoseconds); `id`
/// makes its span id unique.
pub fn span_of<'q>(q: &'q Question, url: &'q str, now: u64, id: u64) -> QuestionSpan<'q> {
    let mut a: Vec<(&'static str, Val<'q>)> = Vec::with_capacity(12);
    let s = |v: &'q str| Val::Str(v);
    let http_method = match (q.http_method.as_str(), q.protocol) {
        ("", Protocol::Mcp | Protocol::A2a | Protocol::Jsonrpc) => "POST",
        (m, _) => m,
    };
    if !url.is_empty() {
        a.push(("url.full", s(url)));
    }
    if !http_method.is_empty() && q.protocol != Protocol::Grpc {
        a.push(("http.request.method", s(http_method)));
    }
    match q.protocol {
        Protocol::Http => {}
        Protocol::Mcp => {
            a.push(("mcp.method.name", s(&q.method)));
            if !q.tool.is_empty() {
                a.push(("gen_ai.tool.name", s(&q.tool)));
            }
        }
        Protocol::A2a => a.push(("a2a.method.name", s(&q.method))),
        Protocol::Jsonrpc => {
            a.push(("rpc.system", s("jsonrpc")));
            a.push(("rpc.method", s(&q.method)));
        }
        Protocol::Grpc => {
            a.push(("rpc.system", s("grpc")));
            let (service, method) = q.method.rsplit_once('/').unwrap_or(("", &q.method));
            a.push(("rpc.service", s(service.trim_start_matches('/'))));
            a.push(("rpc.method", s(method)));
        }
    }
    let mut status_error = false;
    if let Some(r) = &q.last_response {
        if r.http_status != 0 {
            a.push((
                "http.response.status_code",
                Val::Int(i64::from(r.http_status)),
            ));
        }
        if r.jsonrpc_code != 0 {
            a.push(("rpc.jsonrpc.error_code", Val::Int(r.jsonrpc_code)));
        }
        if let Some(code) = r.grpc_code {
            a.push(("rpc.grpc.status_code", Val::Int(i64::from(code))));
        }
        if r.timed_out {
            a.push(("error.type", s("timeout")));
        } else if !r.error_type.is_empty() {
            a.push(("error.type", s(&r.error_type)));
        }
        status_error = r.timed_out || !r.error_type.is_empty();
    }
    let mut span_id = [0; 8];
    span_id.copy_from_slice(&id.to_be_bytes());
    QuestionSpan {
        attributes: a,
        start: now.saturating_sub(1),
        end: now,
        status_error,
        trace_id: [0x9a; 16],
        span_id,
    }
}

/// What the pipeline says of an attempt put as a question ([`assess`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    /// Its kind, as a span with the same signal gets it.
    pub kind: Kind,
    /// The rule that fired, as spans are tagged (`refusal_gate.reason`).
    pub rule: String,
    /// Its interface's name.
    pub interface: String,
    /// The client's latest attempt of the same operation: its kind and number in a row.
    pub last: Option<(Kind, u32)>,
    /// Which attempt in a row of failures this is.
    pub attempt: u32,
    /// Whether it was tracked and counted.
    pub observed: bool,
    /// Its interface contradicted itself on the operation within the window (DESIGN §13).
    pub contradicted: bool,
    /// Other interfaces that declare the path: (name, URL, protocol).
    pub alternatives: Vec<(String, String, InterfaceProtocol)>,
    /// The interface's discovery document path, when one is known.
    pub discovery_path: Option<String>,
}

/// Assesses one attempt put as a question at `now`, with the same placing and classifier and
/// the live tracker state that spans get. With `observe`, and a response to observe, the
/// attempt is tracked and counted exactly as its span would be.
pub fn assess(
    pipeline: &Pipeline,
    attempt: &extract::Attempt<'_>,
    answered: bool,
    observe: bool,
    now: Nanos,
) -> Assessment {
    let interfaces = pipeline.catalog().current();
    let mut client = pipeline.client_ids(attempt.client);
    let p = pipeline.place(&interfaces, attempt, client.id);
    let peek = pipeline
        .tracker()
        .peek(&p.group, p.operation, attempt.start);
    let base = Assessment {
        kind: crate::classify::classify(p.outcome, p.declared, peek.read_before).kind,
        rule: p.reason.to_string(),
        interface: crate::label::shorten(p.interface_name, pipeline.metrics().max_label_bytes())
            .into_owned(),
        last: peek.last,
        attempt: peek
            .last
            .map_or(1, |(kind, n)| if kind == Kind::Ok { 1 } else { n + 1 }),
        observed: false,
        contradicted: pipeline.tracker().contradicted(
            p.group.interface,
            pipeline.about(attempt, None),
            now,
        ),
        alternatives: match attempt.path_or_grpc(&mut None) {
            Some(path) => interfaces.alternatives(p.interface, path),
            None => Vec::new(),
        },
        discovery_path: interfaces.discovery_path(p.interface).map(str::to_owned),
    };
    if !(observe && answered) {
        return base;
    }
    match pipeline.observe(attempt, &p, &mut client, now) {
        Some(j) => Assessment {
            kind: j.kind,
            attempt: j.attempt,
            observed: true,
            ..base
        },
        None => base,
    }
}

/// Answers `q` with `pipeline`'s classifier and tracker state; `id` makes an observed
/// call's span id unique.
///
/// # Errors
/// [`Unanswerable`] when the question names no target or is not an attempt.
pub fn decide(
    pipeline: &Pipeline,
    q: &Question,
    now: u64,
    id: u64,
) -> Result<Answer, Unanswerable> {
    let url = if q.url.is_empty() {
        let interfaces = pipeline.catalog().current();
        let configured = (0..interfaces.len())
            .filter_map(|i| interfaces.get(i))
            .find(|i| i.name == q.interface)
            .ok_or_else(|| {
                Unanswerable::NoTarget(if q.interface.is_empty() {
                    "name the target: url or interface".into()
                } else {
                    // The name is not echoed: it is the asker's, of any length.
                    format!(
                        "no interface of that name is configured (a name of {} bytes)",
                        q.interface.len()
                    )
                })
            })?;
        let (origin, base) = configured
            .bases
            .first()
            .ok_or_else(|| Unanswerable::NoTarget(format!("{} has no URL", q.interface)))?;
        format!("{origin}{base}")
    } else {
        q.url.clone()
    };
    let span = span_of(q, &url, now, id);
    let client = Client {
        name: client_name(q),
        instance: Some(q.client.service_instance_id.as_str()).filter(|i| !i.is_empty()),
    };
    let mut attempt = extract::extract(client, &&span, usize::MAX).map_err(|_| {
        Unanswerable::NotAnAttempt(match q.protocol {
            Protocol::Http => "an HTTP call needs its httpMethod",
            _ => "name the method",
        })
    })?;
    // The server's delay as the question gives it, to the millisecond: what a span's
    // captured Retry-After header would have said.
    attempt.signal.retry_after = q
        .last_response
        .as_ref()
        .map(|r| r.retry_after_ms.saturating_mul(1_000_000))
        .filter(|d| *d > 0);
    let assessed = assess(
        pipeline,
        &attempt,
        q.last_response.is_some(),
        q.observe,
        now,
    );
    let origin = attempt.origin.as_ref().map(|o| o.as_str().to_owned());
    let default_discovery = match q.protocol {
        Protocol::A2a => Some("/.well-known/agent-card.json"),
        Protocol::Mcp => Some("/.well-known/mcp/server-card.json"),
        Protocol::Http => Some("/openapi.json"),
        Protocol::Grpc | Protocol::Jsonrpc => None,
    };
    let discovery = assessed.discovery_path.as_deref().or(default_discovery);
    let discovery_url = match (origin, discovery) {
        (Some(o), Some(p)) => format!("{o}{p}"),
        _ => String::new(),
    };
    Ok(answer(
        q.last_response.as_ref(),
        &assessed,
        pipeline.tracker().max_retries(),
        discovery_url,
    ))
}

/// Composes the answer from what the pipeline assessed: without a response, what the
/// client was told last time decides; with one, its kind does, and a retry gets its backoff
/// and budget — a backoff never shorter than the server's own delay, when it gave one.
pub fn answer(
    last_response: Option<&LastResponse>,
    a: &Assessment,
    max_retries: u32,
    discovery_url: String,
) -> Answer {
    let remembered = a.last.filter(|(kind, _)| {
        matches!(kind.class(), Class::Refusal) || *kind == Kind::UnverifiedRefusal
    });
    let (kind, mut rule) = match (last_response, remembered) {
        (None, Some((kind, _))) => (kind, format!("refused before: {}", kind.as_str())),
        (None, None) => (Kind::Ok, "no response yet".to_owned()),
        (Some(_), _) => (a.kind, a.rule.clone()),
    };
    let mut decision = kind.decision();
    let (mut backoff_ms, mut retries_left) = (0, 0);
    if decision == Decision::RetryWithBackoff {
        let asked = last_response.map_or(0, |r| r.attempt);
        let n = if asked > 0 { asked } else { a.attempt.max(1) };
        if n > max_retries {
            decision = Decision::Abstain;
            rule = format!("{rule}; retry budget of {max_retries} exhausted");
        } else {
            let doubled = FIRST_BACKOFF.saturating_mul(1 << (n - 1).min(16));
            backoff_ms = u64::try_from(doubled.min(MAX_BACKOFF).as_millis()).unwrap_or(u64::MAX);
            let server = last_response.map_or(0, |r| r.retry_after_ms);
            if server > backoff_ms {
                backoff_ms = server;
                rule = format!("{rule}; the server asked to wait {server} ms (Retry-After)");
            }
            retries_left = max_retries - n;
        }
    }
    let alternatives = if decision == Decision::RouteElsewhereOrAbstain {
        a.alternatives
            .iter()
            .map(|(interface, url, protocol)| Alternative {
                interface: interface.clone(),
                url: url.clone(),
                protocol: protocol_name(*protocol).to_owned(),
            })
            .collect()
    } else {
        Vec::new()
    };
    Answer {
        class: kind.class().as_str().to_owned(),
        kind: kind.as_str().to_owned(),
        decision: decision.as_str().to_owned(),
        rule,
        interface: a.interface.clone(),
        backoff_ms,
        retries_left,
        discovery_url: if decision == Decision::FetchDiscovery {
            discovery_url
        } else {
            String::new()
        },
        alternatives,
        observed: a.observed,
        contradicted: a.contradicted,
    }
}

fn protocol_name(p: InterfaceProtocol) -> &'static str {
    match p {
        InterfaceProtocol::Mcp => "mcp",
        InterfaceProtocol::A2a => "a2a",
        InterfaceProtocol::Http => "http",
        InterfaceProtocol::Grpc => "grpc",
    }
}

/// The alerts `filter` admits, raised from now on, until `stop` turns true (the server
/// shutting down: an open watch must not hold up a graceful stop); `None` when
/// `alerting.max_watchers` watchers are already open (counted by `endpoint`). A watcher that
/// falls [`crate::alert::delivery::WATCH_BUFFER`] behind skips what it missed.
pub fn alerts_until(
    alerter: &crate::alert::delivery::Alerter,
    filter: Filter,
    stop: tokio::sync::watch::Receiver<bool>,
    endpoint: &str,
) -> Option<impl tokio_stream::Stream<Item = Alert> + Send + 'static> {
    use tokio_stream::wrappers::{BroadcastStream, WatchStream};
    use tokio_stream::StreamExt;
    enum Item {
        Alert(Alert),
        Stop,
    }
    let (receiver, permit) = alerter.subscribe(endpoint)?;
    // The stream holds the permit: the watcher's place is given back when it is dropped.
    let alerts = BroadcastStream::new(receiver).filter_map(move |a| {
        let _held = &permit;
        a.ok().filter(|a| filter.admits(a)).map(Item::Alert)
    });
    let stop = WatchStream::new(stop)
        .filter(|stopping| *stopping)
        .map(|_| Item::Stop);
    Some(
        alerts
            .merge(stop)
            .take_while(|item| matches!(item, Item::Alert(_)))
            .filter_map(|item| match item {
                Item::Alert(a) => Some(a),
                Item::Stop => None,
            }),
    )
}

/// Which alerts a watcher wants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Filter {
    /// Only this client; empty: all.
    pub client: String,
    /// Only this interface; empty: all.
    pub interface: String,
    /// Only this severity and above; empty: all.
    pub min_severity: String,
}

impl Filter {
    /// The filter with its client and interface named as their labels are (cut to
    /// `max_label_bytes`), so that a client with a long name finds its own alerts.
    pub fn as_labels(self, max_label_bytes: usize) -> Filter {
        let cut = |name: String| match crate::label::shorten(&name, max_label_bytes) {
            std::borrow::Cow::Borrowed(_) => name,
            std::borrow::Cow::Owned(short) => short,
        };
        Filter {
            client: cut(self.client),
            interface: cut(self.interface),
            min_severity: self.min_severity,
        }
    }

    /// Whether `alert` passes.
    pub fn admits(&self, alert: &Alert) -> bool {
        let min = match self.min_severity.to_ascii_lowercase().as_str() {
            "critical" => Severity::Critical,
            "info" => Severity::Info,
            _ => Severity::Warning,
        };
        (self.client.is_empty() || *alert.key.client == *self.client)
            && (self.interface.is_empty() || *alert.key.interface == *self.interface)
            && alert.severity >= min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assessed(kind: Kind, last: Option<(Kind, u32)>, attempt: u32) -> Assessment {
        Assessment {
            kind,
            rule: "r".into(),
            interface: "i".into(),
            last,
            attempt,
            observed: false,
            contradicted: false,
            alternatives: vec![(
                "other".into(),
                "http://o.test/x".into(),
                InterfaceProtocol::Http,
            )],
            discovery_path: None,
        }
    }

    #[test]
    fn a_client_watching_by_its_whole_long_name_finds_its_alerts() {
        use crate::alert::{Alert, AlertKey};
        use crate::tracker::Violation;
        let name = "w".repeat(1000);
        let short = crate::label::shorten(&name, 128);
        let alert = Alert {
            key: AlertKey {
                alertname: Violation::RetryAfterRefusal.alert_name(),
                client: short.as_ref().into(),
                interface: "i".into(),
            },
            severity: Severity::Critical,
            cause: crate::alert::Cause::Violation(Violation::RetryAfterRefusal),
            operation: "POST /x".into(),
            trace_id: [0; 16],
            span_id: [0; 8],
            starts_at: 0,
            ends_at: 0,
        };
        let filter = Filter {
            client: name,
            interface: "i".into(),
            min_severity: String::new(),
        };
        assert!(
            !filter.clone().admits(&alert),
            "the whole name is not the label"
        );
        assert!(filter.as_labels(128).admits(&alert));
    }

    fn response(attempt: u32) -> LastResponse {
        LastResponse {
            attempt,
            ..LastResponse::default()
        }
    }

    #[test]
    fn a_retry_gets_a_doubling_backoff_until_the_budget_is_spent() {
        let a = assessed(Kind::Transient, None, 1);
        let waits: Vec<(String, u64, u32)> = (1..=4)
            .map(|n| {
                let r = answer(Some(&response(n)), &a, 3, String::new());
                (r.decision, r.backoff_ms, r.retries_left)
            })
            .collect();
        assert_eq!(
            waits,
            vec![
                ("retry_with_backoff".into(), 1000, 2),
                ("retry_with_backoff".into(), 2000, 1),
                ("retry_with_backoff".into(), 4000, 0),
                ("abstain".into(), 0, 0),
            ]
        );
        let far = answer(Some(&response(9)), &a, 64, String::new());
        assert_eq!(far.backoff_ms, 30_000, "at most 30 s");
    }

    #[test]
    fn a_backoff_is_never_shorter_than_the_servers_delay_and_says_so() {
        let a = assessed(Kind::Throttled, None, 1);
        let asked = |attempt: u32, retry_after_ms: u64| {
            let r = LastResponse {
                attempt,
                retry_after_ms,
                ..LastResponse::default()
            };
            let answer = answer(Some(&r), &a, 3, String::new());
            (answer.backoff_ms, answer.rule)
        };
        assert_eq!(
            asked(1, 2500),
            (
                2500,
                "r; the server asked to wait 2500 ms (Retry-After)".to_owned()
            )
        );
        assert_eq!(asked(2, 1500), (2000, "r".to_owned()), "ours is longer");
        assert_eq!(
            asked(3, 90_000).0,
            90_000,
            "past our own cap: the server's word stands"
        );
        assert_eq!(asked(1, 0), (1000, "r".to_owned()));
    }

    #[test]
    fn without_a_response_what_was_refused_before_decides() {
        let fresh = answer(None, &assessed(Kind::Ok, None, 1), 3, String::new());
        assert_eq!(
            (fresh.kind.as_str(), fresh.decision.as_str()),
            ("ok", "proceed")
        );
        assert!(fresh.alternatives.is_empty());
        let refused = answer(
            None,
            &assessed(Kind::Ok, Some((Kind::InterfaceNotDeclared, 1)), 2),
            3,
            String::new(),
        );
        assert_eq!(refused.decision, "route_elsewhere_or_abstain");
        assert_eq!(refused.rule, "refused before: interface_not_declared");
        assert_eq!(refused.alternatives[0].interface, "other");
        let unverified = answer(
            None,
            &assessed(Kind::Ok, Some((Kind::UnverifiedRefusal, 1)), 2),
            3,
            "http://a.test/.well-known/agent-card.json".into(),
        );
        assert_eq!(unverified.decision, "fetch_discovery");
        assert_eq!(
            unverified.discovery_url,
            "http://a.test/.well-known/agent-card.json"
        );
    }
}
