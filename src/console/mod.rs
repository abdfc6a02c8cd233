//! The console: what a person looks at — the fleet (who wastes requests, on which
//! interfaces, how), the firing alerts, one client's story attempt by attempt, the
//! interfaces and the receivers' health — as the JSON the live page (`GET /` on the admin
//! port) and scripts read, and as the self-contained HTML report of `replay --format html`.
//!
//! Core, but for reading the pipeline's state: no sockets. The page itself is HTML, CSS and
//! plain JavaScript embedded in the binary (`page.html`, `console.css`, `console.js`); the
//! report is the same page with its data inlined, so it needs no network.

use crate::alert::Cause;
use crate::classify::{Class, Kind};
use crate::pipeline::Pipeline;
use crate::tracker::{GroupHistory, Nanos, Recent, Violation};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The page's HTML shell.
pub const PAGE: &str = include_str!("page.html");
/// Its style sheet.
pub const CSS: &str = include_str!("console.css");
/// Its script.
pub const JS: &str = include_str!("console.js");

/// Rows of the fleet table a page asks for at most.
pub const MAX_LIMIT: usize = 500;

/// How the fleet table is asked for: filtered by substrings of client and interface, sorted
/// by a column, one page of it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct FleetQuery {
    /// Rows whose client contains this.
    pub client: String,
    /// Rows whose interface contains this.
    pub interface: String,
    /// The column: `avoidable` (the default), `attempts`, `client`, `interface`,
    /// `last_violation`, or a class or violation name.
    pub sort: String,
    /// `asc`, or descending (the default).
    pub order: String,
    /// Rows skipped.
    pub offset: usize,
    /// Rows returned (default 50; the admin API allows at most [`MAX_LIMIT`]).
    pub limit: Option<usize>,
}

/// One (client, interface) row of the fleet; its latest violation links to its trace when
/// `trace_url` is a template.
fn row(p: &crate::metrics::PairFigures, trace_url: Option<&str>) -> Value {
    let mut classes = Map::new();
    for class in Class::ALL {
        classes.insert(class.as_str().into(), 0.into());
    }
    let mut kinds = Map::new();
    for (k, kind) in Kind::ALL.iter().enumerate() {
        let n = p.attempts[k];
        kinds.insert(kind.as_str().into(), n.into());
        let c = classes
            .entry(kind.class().as_str())
            .or_insert_with(|| 0.into());
        *c = (c.as_u64().unwrap_or(0) + n).into();
    }
    let trace = p.last_violation_trace.map(|t| crate::alert::hex(&t));
    let mut violations = Map::new();
    let mut avoidable = 0;
    for (v, violation) in Violation::ALL.iter().enumerate() {
        let n = p.violations[v];
        if n > 0 {
            violations.insert(violation.as_str().into(), n.into());
        }
        if violation.is_avoidable() {
            avoidable += n;
        }
    }
    json!({
        "client": &*p.client,
        "interface": &*p.interface,
        "attempts": p.attempts.iter().sum::<u64>(),
        "classes": classes,
        "kinds": kinds,
        "violations": violations,
        "avoidable": avoidable,
        "reads": p.reads,
        "honored": p.honored,
        "last_seen": p.last_seen,
        "last_violation": (p.last_violation > 0).then_some(p.last_violation),
        "last_violation_trace": trace.as_deref(),
        "last_violation_trace_url": trace
            .as_deref()
            .and_then(|t| trace_url.map(|u| u.replace("{trace_id}", t))),
    })
}

/// A (client, interface) pair's figures, with the sums the fleet sorts by.
struct Line<'a> {
    p: &'a crate::metrics::PairFigures,
    attempts: u64,
    avoidable: u64,
}

impl Line<'_> {
    /// The number a column sorts by (0 for the text columns).
    fn number(&self, column: &str) -> u64 {
        let p = self.p;
        match column {
            "attempts" => self.attempts,
            "avoidable" => self.avoidable,
            "reads" => p.reads,
            "honored" => p.honored,
            "last_violation" => p.last_violation,
            other => {
                if let Some(v) = Violation::ALL.iter().position(|v| v.as_str() == other) {
                    return p.violations[v];
                }
                Kind::ALL
                    .iter()
                    .enumerate()
                    .filter(|(_, k)| k.class().as_str() == other || k.as_str() == other)
                    .map(|(k, _)| p.attempts[k])
                    .sum()
            }
        }
    }
}

/// The fleet: every (client, interface) row matching `q`, sorted and paged, the totals, and
/// the clients with the most avoidable requests. Only the page's rows are written out.
fn fleet(pipeline: &Pipeline, q: &FleetQuery, trace_url: Option<&str>) -> Value {
    let figures = pipeline.metrics().fleet();
    let mut lines: Vec<Line<'_>> = figures
        .iter()
        .filter(|p| p.client.contains(q.client.as_str()))
        .filter(|p| p.interface.contains(q.interface.as_str()))
        .map(|p| Line {
            p,
            attempts: p.attempts.iter().sum(),
            avoidable: Violation::ALL
                .iter()
                .zip(&p.violations)
                .filter(|(v, _)| v.is_avoidable())
                .map(|(_, n)| n)
                .sum(),
        })
        .collect();
    let mut by_client: HashMap<&str, (u64, u64)> = HashMap::new();
    let (mut attempts, mut avoidable) = (0, 0);
    for l in &lines {
        let e = by_client.entry(&l.p.client).or_default();
        e.0 += l.attempts;
        e.1 += l.avoidable;
        attempts += l.attempts;
        avoidable += l.avoidable;
    }
    let mut top: Vec<(&str, (u64, u64))> = by_client.into_iter().collect();
    top.sort_by(|a, b| {
        b.1 .1
            .cmp(&a.1 .1)
            .then(b.1 .0.cmp(&a.1 .0))
            .then(a.0.cmp(b.0))
    });
    let clients = top.len();
    top.truncate(10);
    let sort = if q.sort.is_empty() {
        "avoidable"
    } else {
        q.sort.as_str()
    };
    let text = |l: &Line<'_>| -> (String, String) {
        match sort {
            "interface" => (l.p.interface.to_string(), l.p.client.to_string()),
            _ => (l.p.client.to_string(), l.p.interface.to_string()),
        }
    };
    if sort == "client" || sort == "interface" {
        lines.sort_by_cached_key(text);
        if q.order != "asc" {
            lines.reverse();
        }
    } else {
        lines.sort_by(|a, b| {
            let by = a.number(sort).cmp(&b.number(sort));
            let by = if q.order == "asc" { by } else { by.reverse() };
            by.then_with(|| (&*a.p.client, &*a.p.interface).cmp(&(&*b.p.client, &*b.p.interface)))
        });
    }
    let total = lines.len();
    let limit = q.limit.unwrap_or(50);
    let page: Vec<Value> = lines
        .iter()
        .skip(q.offset)
        .take(limit)
        .map(|l| row(l.p, trace_url))
        .collect();
    json!({
        "totals": { "attempts": attempts, "avoidable": avoidable, "clients": clients, "pairs": total },
        "top": top.iter().map(|(c, (a, v))| json!({"client": c, "attempts": a, "avoidable": v})).collect::<Vec<_>>(),
        "rows": { "total": total, "offset": q.offset, "limit": limit, "rows": page },
    })
}

/// The firing alerts, each with its trace's link when `trace_url` is a template.
pub fn alerts(pipeline: &Pipeline, now: Nanos, trace_url: Option<&str>) -> Value {
    pipeline
        .alerter()
        .firing(now)
        .iter()
        .map(|a| {
            // An all-zero trace id is none (a span whose ids were not valid): no link.
            let trace = (a.trace_id != [0; 16]).then(|| a.trace_id_hex());
            json!({
                "alertname": a.key.alertname,
                "severity": a.severity.as_str(),
                "client": &*a.key.client,
                "interface": &*a.key.interface,
                "violation": a.cause.violation().map(Violation::as_str),
                "kind": match a.cause {
                    Cause::Contradiction(c) => Some(c.as_str()),
                    Cause::Violation(_) => None,
                },
                "operation": &*a.operation,
                "summary": a.summary(),
                "trace_url": trace
                    .as_deref()
                    .and_then(|trace| trace_url.map(|t| t.replace("{trace_id}", trace))),
                "trace_id": trace,
                "starts_at": a.starts_at / crate::clock::SECOND,
            })
        })
        .collect()
}

/// The interfaces: what each declares, whether its own side is observed, its document's
/// latest load, and where it contradicted itself or its document (DESIGN §13), newest first,
/// with the traces of the calls that showed it.
fn interfaces(pipeline: &Pipeline, trace_url: Option<&str>) -> Value {
    let catalog = pipeline.catalog();
    let seen = pipeline.metrics().contradictions();
    let max = pipeline.metrics().max_label_bytes();
    let link = |trace: &[u8; 16]| {
        let hex = crate::alert::hex(trace);
        // An all-zero trace id is none: no link.
        (trace != &[0; 16]).then(|| (trace_url.map(|t| t.replace("{trace_id}", &hex)), hex))
    };
    catalog
        .current()
        .iter()
        .map(|i| {
            let load = catalog.last_load(&i.name).map(|(r, at)| {
                json!({ "source": r.source, "outcome": r.outcome.as_str(), "error": r.error, "at": at })
            });
            json!({
                "name": i.name,
                "protocol": i.protocol.as_str(),
                "bases": i.bases.iter().map(|(o, b)| format!("{o}{}", if b == "/" { "" } else { b })).collect::<Vec<_>>(),
                "declared": i.paths,
                "server_view": i.client_from.is_some(),
                "document": load,
                "contradictions": seen
                    .iter()
                    .filter(|c| *c.interface == *crate::label::shorten(&i.name, max))
                    .map(|c| {
                        let traces: Vec<Value> = std::iter::once(&c.trace_id)
                            .chain(c.other_trace.as_ref())
                            .filter_map(&link)
                            .map(|(url, id)| json!({ "trace_id": id, "trace_url": url }))
                            .collect();
                        json!({
                            "kind": c.kind.as_str(),
                            "operation": &*c.operation,
                            "at": c.at,
                            "traces": traces,
                        })
                    })
                    .collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// `GET /api/v1/status`: the fleet, alerts, interfaces and health at `now`.
pub fn status(pipeline: &Pipeline, q: &FleetQuery, now: Nanos, trace_url: Option<&str>) -> Value {
    json!({
        "now": now / crate::clock::SECOND,
        "fleet": fleet(pipeline, q, trace_url),
        "alerts": alerts(pipeline, now, trace_url),
        "interfaces": interfaces(pipeline, trace_url),
        "health": pipeline.metrics().health(),
        "trace_url": trace_url,
    })
}

/// What the decision boundary asks instead of a violation.
fn instead(v: Violation) -> &'static str {
    match v {
        Violation::RetryAfterRefusal => "stopped: the refusal was authoritative",
        Violation::RetryWithoutDiscovery => "read the discovery document before retrying",
        Violation::RetryAfterAmbiguous => "not retried the same request unchanged",
        Violation::RetryBudgetExhausted => "stopped after max_retries retries",
        Violation::RetryBeforeRetryAfter => "waited as long as the server's Retry-After asked",
        Violation::ProbeAfterRefusal => "read the discovery document instead of guessing paths",
    }
}

/// What a refusal's kind says, in words.
fn refusal_words(kind: Kind) -> &'static str {
    match kind {
        Kind::InterfaceNotDeclared => "an authoritative 404 (the path is not declared)",
        Kind::ProtocolNotSupported => {
            "an authoritative \"not supported\" (405, -32601, UNIMPLEMENTED)"
        }
        Kind::UnverifiedRefusal => "an unverified refusal (the contract was not read)",
        Kind::Ambiguous => "an ambiguous failure",
        Kind::Transient => "a transient failure",
        Kind::Throttled => "a throttled answer",
        Kind::Ok => "a success",
        Kind::HeaderMismatch => "a header mismatch (the contract asks for a read first)",
        Kind::SessionExpired => "a session that was gone (the contract asks for a new one first)",
    }
}

/// The sentences that explain one operation's violations: "retried `POST /mcp/mcp` 4 times
/// in its latest 5 attempts after an authoritative 404 (…)".
fn explain(operation: &str, attempts: &[Recent]) -> Vec<Value> {
    let kept = attempts.len();
    let mut counts: Vec<(Violation, Kind, u64)> = Vec::new();
    let mut before: Option<Kind> = None;
    for a in attempts {
        if let Some(v) = a.violation {
            let after = before.unwrap_or(a.kind);
            match counts.iter_mut().find(|(w, k, _)| *w == v && *k == after) {
                Some(c) => c.2 += 1,
                None => counts.push((v, after, 1)),
            }
        }
        before = Some(a.kind);
    }
    counts
        .into_iter()
        .map(|(v, after, n)| {
            // The tracker keeps an operation's latest attempts only: say how many of them.
            let times = if n == 1 {
                format!("once in its latest {kept} attempts")
            } else {
                format!("{n} times in its latest {kept} attempts")
            };
            let text = match v {
                Violation::ProbeAfterRefusal => {
                    format!("probed `{operation}` {times} after a refusal on another path")
                }
                Violation::RetryBeforeRetryAfter => {
                    format!("retried `{operation}` {times} before the server's Retry-After")
                }
                Violation::RetryBudgetExhausted => {
                    format!("retried `{operation}` {times} past its retry budget")
                }
                _ => format!(
                    "retried `{operation}` {times} after {}",
                    refusal_words(after)
                ),
            };
            json!({ "violation": v.as_str(), "count": n, "text": text, "instead": instead(v) })
        })
        .collect()
}

fn recent(a: &Recent) -> Value {
    json!({
        "start": a.start,
        "end": a.end,
        "kind": a.kind.as_str(),
        "class": a.kind.class().as_str(),
        "violation": a.violation.map(Violation::as_str),
        "attempt": a.attempt,
        "read_before": a.read,
        "discovery": a.asked,
        "settled": a.settled,
        "trace_id": crate::alert::hex(&a.trace_id),
    })
}

/// One client's story from what the tracker keeps of `histories` (its groups), named by
/// `name(labels)` (its client and interface labels); `figures` are its fleet rows.
pub fn story(
    client: &str,
    histories: &[GroupHistory],
    name: impl Fn(u32) -> Option<(String, String)>,
    figures: Vec<Value>,
    trace_url: Option<&str>,
) -> Value {
    let mut interfaces: Vec<Value> = histories
        .iter()
        .map(|g| {
            let interface = name(g.labels).map(|(_, i)| i).unwrap_or_default();
            let operations: Vec<Value> = g
                .operations
                .iter()
                .map(|o| {
                    json!({
                        "operation": o.operation,
                        "attempts": o.attempts.iter().map(recent).collect::<Vec<_>>(),
                        "story": explain(&o.operation, &o.attempts),
                    })
                })
                .collect();
            json!({ "interface": interface, "first_read": g.first_read, "operations": operations })
        })
        .collect();
    interfaces.sort_by(|a, b| a["interface"].as_str().cmp(&b["interface"].as_str()));
    json!({
        "client": client,
        "figures": figures,
        "interfaces": interfaces,
        "trace_url": trace_url,
    })
}

/// `GET /api/v1/clients/{client}`: the client's fleet rows and its story; `None` when the
/// client is not known.
pub fn client(pipeline: &Pipeline, client: &str, trace_url: Option<&str>) -> Option<Value> {
    stories(pipeline, |name| name == client, trace_url).remove(client)
}

/// The stories of every client `wanted` accepts, by name: one pass over the fleet's pairs and
/// one over the tracker's groups, whatever the number of clients.
fn stories(
    pipeline: &Pipeline,
    wanted: impl Fn(&str) -> bool,
    trace_url: Option<&str>,
) -> Map<String, Value> {
    let metrics = pipeline.metrics();
    let mut figures: HashMap<Arc<str>, Vec<Value>> = HashMap::new();
    for p in metrics.fleet().iter().filter(|p| wanted(&p.client)) {
        figures
            .entry(Arc::clone(&p.client))
            .or_default()
            .push(row(p, trace_url));
    }
    let mut histories: HashMap<Arc<str>, Vec<GroupHistory>> = HashMap::new();
    // Compared as they are: one group's names are not copied to be looked at.
    let groups = pipeline
        .tracker()
        .histories(|labels| metrics.label_names(labels).is_some_and(|(c, _)| wanted(&c)));
    for g in groups {
        if let Some((client, _)) = metrics.label_names(g.labels) {
            histories.entry(client).or_default().push(g);
        }
    }
    let name = |labels: u32| {
        metrics
            .label_names(labels)
            .map(|(c, i)| (c.to_string(), i.to_string()))
    };
    let mut clients: Vec<Arc<str>> = figures.keys().chain(histories.keys()).cloned().collect();
    clients.sort_unstable();
    clients.dedup();
    clients
        .into_iter()
        .map(|client| {
            let figures = figures.remove(&client).unwrap_or_default();
            let groups = histories.remove(&client).unwrap_or_default();
            let story = story(&client, &groups, name, figures, trace_url);
            (client.to_string(), story)
        })
        .collect()
}

/// The data of a report on what `pipeline` holds at `now`: the whole fleet, the alerts
/// firing then, the interfaces, every client's story, and where it came from.
pub fn report_data(pipeline: &Pipeline, now: Nanos, spans: u64, files: &[String]) -> Value {
    let all = FleetQuery {
        limit: Some(usize::MAX),
        ..FleetQuery::default()
    };
    let status = status(pipeline, &all, now, None);
    let named: std::collections::HashSet<&str> = status["fleet"]["rows"]["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row["client"].as_str())
        .collect();
    let clients = stories(pipeline, |client| named.contains(client), None);
    json!({ "status": status, "clients": clients, "spans": spans, "files": files })
}

/// `data` as JSON to inline in a `<script>` element, so that no value can change how the
/// page parses: `<`, `>` and `&` (which could end the element, or open a comment that the
/// tokenizer's "script data escaped" states would swallow the page into) and U+2028 and
/// U+2029 are written as `\u` escapes. They only ever stand inside JSON strings, where the
/// escapes mean the same characters.
pub fn script_json(data: &Value) -> String {
    let json = data.to_string();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The HTML page around `data` (a `status` and the stories of its clients) for a file: the
/// style sheet and script inlined, the data in the page, nothing fetched.
pub fn report_html(data: &Value) -> String {
    let data = script_json(data);
    PAGE.replace(
        "<link rel=\"stylesheet\" href=\"/console.css\">",
        &format!("<style>\n{CSS}</style>"),
    )
    .replace(
        "<script src=\"/console.js\"></script>",
        &format!("<script id=\"report\" type=\"application/json\">{data}</script>\n<script>\n{JS}</script>"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: Kind, violation: Option<Violation>) -> Recent {
        Recent {
            start: 0,
            end: 0,
            kind,
            violation,
            attempt: 1,
            read: true,
            asked: false,
            settled: true,
            trace_id: [0; 16],
        }
    }

    #[test]
    fn a_story_names_the_operation_its_retries_and_what_they_came_after() {
        let refused = |v| entry(Kind::InterfaceNotDeclared, v);
        let history = [
            refused(None),
            refused(Some(Violation::RetryAfterRefusal)),
            refused(Some(Violation::RetryAfterRefusal)),
        ];
        let told = explain("POST /mcp/mcp", &history);
        assert_eq!(told.len(), 1);
        assert_eq!(
            told[0]["text"],
            "retried `POST /mcp/mcp` 2 times in its latest 3 attempts after an authoritative 404 (the path is not declared)"
        );
        assert_eq!(told[0]["instead"], "stopped: the refusal was authoritative");
    }

    #[test]
    fn the_report_inlines_everything_and_its_data_cannot_end_its_script() {
        let html = report_html(&json!({ "x": "</script><b>" }));
        assert!(!html.contains("console.css"));
        assert!(!html.contains("console.js"));
        assert!(html.contains("\\u003c/script\\u003e\\u003cb\\u003e"));
        assert_eq!(html.matches("</script>").count(), 2);
    }

    #[test]
    fn inlined_data_has_no_character_that_could_change_how_the_page_parses() {
        let value = "<!--<script>&amp;\u{2028}\u{2029}</script>-->";
        let data = json!({ "client": value, "list": [value] });
        let inlined = script_json(&data);
        for c in ['<', '>', '&', '\u{2028}', '\u{2029}'] {
            assert!(!inlined.contains(c), "{c:?} in {inlined}");
        }
        // The escapes mean the same characters.
        let back: Value = serde_json::from_str(&inlined).expect("still JSON");
        assert_eq!(back, data);
    }
}
