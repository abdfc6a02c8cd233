//! The first tier's role (`tracker.role: join`): every span leaves stamped with its call's
//! client — both sides of a call with the client's, a call seen only from its server with the
//! client its server names, a span of no call with its resource's — one client per request,
//! without verdict tags, and nothing is counted.

use super::server_view::{asgi, mcp, send, span};
use super::*;
use crate::otlp::fixtures::i;

/// An observed `weather` interface's replica in the first tier, forwarding.
fn joiner() -> Pipeline {
    forwarding(weather_observed_by("weather-mcp").with_role(crate::config::Role::Join))
}

/// An agent's HTTP request `id` (under its span `parent`, 0: none) to the observed interface,
/// answered 200.
fn call(id: u8, parent: u8) -> Span {
    let mut call = span(
        3,
        id,
        parent,
        &[
            ("http.request.method", "POST"),
            ("url.full", "http://mcp.test:8080/mcp"),
        ],
    );
    call.attributes.push(i("http.response.status_code", 200));
    call
}

/// Each request forwarded since the last call: each span's id, with its stamp (client and
/// instance) and whether any other `refusal_gate.*` tag came with it.
fn requests(p: &Pipeline) -> Vec<Vec<(u8, String, bool)>> {
    let exporter = p.exporter().expect("forwarding");
    let mut out = Vec::new();
    for body in exporter.take_queued() {
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("a valid request");
        let spans = request.resource_spans.iter().flat_map(|r| &r.scope_spans);
        out.push(
            spans
                .flat_map(|s| &s.spans)
                .map(|span| {
                    let stamp = |key: &str| {
                        span.attributes
                            .iter()
                            .find(|kv| kv.key == key)
                            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                                any_value::Value::StringValue(s) => Some(s.clone()),
                                _ => None,
                            })
                            .unwrap_or_default()
                    };
                    let tagged = span.attributes.iter().any(|kv| {
                        kv.key.starts_with("refusal_gate.")
                            && !kv.key.starts_with("refusal_gate.client")
                    });
                    let who = format!("{}@{}", stamp(route::CLIENT), stamp(route::CLIENT_INSTANCE));
                    (span.span_id[0], who, tagged)
                })
                .collect(),
        );
    }
    out
}

#[test]
fn a_joiner_stamps_each_span_with_its_calls_client_one_client_a_request_and_counts_nothing() {
    let p = joiner();
    let send = |service: &str, spans: Vec<Span>, now: Nanos| send(&p, service, spans, now);
    // The agent's call (1, under its own span 9) to the observed interface.
    let call = call(1, 9);
    let agent = span(1, 9, 0, &[("gen_ai.operation.name", "invoke_agent")]);
    send("my-agent", vec![call, agent], 1);
    let first = requests(&p);
    assert_eq!(
        first,
        [vec![(9, "my-agent@".to_owned(), false)]],
        "the call waits for its server"
    );
    // The server's side of it (2, 3); a call only the server saw (5, 6), from the client its
    // spans name; and a span of no call (8).
    let own = span(1, 8, 0, &[("db.system", "sqlite")]);
    send(
        "weather-mcp",
        vec![
            asgi(2, 1, "/mcp", "200"),
            mcp(3, 2, "tools/list"),
            mcp(6, 5, "initialize"),
            asgi(5, 0, "/mcp", "200"),
            own,
        ],
        2,
    );
    p.sweep(p.tracker().reorder_window() + 10);
    let mut rest = requests(&p);
    for request in &mut rest {
        request.sort();
    }
    rest.sort();
    assert_eq!(
        rest,
        [
            vec![(1, "my-agent@".to_owned(), false)],
            vec![
                (2, "my-agent@".to_owned(), false),
                (3, "my-agent@".to_owned(), false)
            ],
            vec![
                (5, "planner/1.0@10.0.0.7".to_owned(), false),
                (6, "planner/1.0@10.0.0.7".to_owned(), false)
            ],
            vec![(8, "weather-mcp@".to_owned(), false)],
        ]
    );
    p.settle(true, p.tracker().reorder_window() + 20);
    let text = p.metrics().render();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("refusal_gate_attempts_total{")),
        "a joiner counts nothing: {text}"
    );
}

#[test]
fn withheld_spans_of_two_clients_leaving_together_leave_each_with_its_own_clients_stamp() {
    let p = joiner();
    let send = |service: &str, spans: Vec<Span>, now: Nanos| send(&p, service, spans, now);
    // Two agents' calls, each withheld for its server's side, which comes in one export.
    send("agent-a", vec![call(1, 0)], 1);
    send("agent-b", vec![call(11, 0)], 1);
    assert_eq!(
        requests(&p),
        Vec::<Vec<_>>::new(),
        "both wait for the server"
    );
    let halves = vec![
        asgi(2, 1, "/mcp", "200"),
        mcp(3, 2, "tools/list"),
        asgi(12, 11, "/mcp", "200"),
        mcp(13, 12, "tools/list"),
    ];
    send("weather-mcp", halves, 2);
    let mut out: Vec<Vec<(u8, String, bool)>> = requests(&p);
    for request in &mut out {
        request.sort();
    }
    out.sort();
    let a = |id: u8| (id, "agent-a@".to_owned(), false);
    let b = |id: u8| (id, "agent-b@".to_owned(), false);
    assert_eq!(
        out,
        [
            vec![a(1)],
            vec![a(2), a(3)],
            vec![b(11)],
            vec![b(12), b(13)]
        ]
    );
}
