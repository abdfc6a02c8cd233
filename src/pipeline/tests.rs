//! Tests of the processor on its one entry point: a broken span costs only itself and the
//! rest is forwarded; broken framing is malformed on both encodings; attributes past the
//! limit are not read; a gRPC attempt is placed by its path; discovery asked and read; a
//! scrape during a sweep counts what the sweep settled; a client back after its series
//! expired is counted again.

use super::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

mod join;
mod orders;

/// A pipeline with one MCP interface, `weather` (`http://mcp.test:8080/mcp`, `POST /mcp`),
/// whose server's spans come from the service `server`.
fn weather_observed_by(server: &str) -> Pipeline {
    let config = format!(
        "
interfaces:
  - name: weather
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints: [{{ path: /mcp, methods: [POST] }}]
    server: {{ service_names: [{server}] }}
"
    );
    Pipeline::from_config(&crate::config::Config::parse(&config).expect("valid"))
}

/// `p`, forwarding to a next hop nobody sends to: what it forwards stays in its queue
/// ([`forwarded`]).
fn forwarding(p: Pipeline) -> Pipeline {
    let config =
        crate::config::Config::parse("exporters: { otlp: { endpoint: http://127.0.0.1:9 } }")
            .expect("valid");
    p.with_exporter(config.exporters.otlp.as_ref().expect("an exporter"))
}

/// A forwarded span: its id and its `refusal_gate.*` tags (the prefix taken off), as strings.
type Forwarded = (Vec<u8>, Vec<(String, String)>);

/// Each span `p` forwarded since the last call, in order.
fn forwarded(p: &Pipeline) -> Vec<Forwarded> {
    let exporter = p.exporter().expect("forwarding");
    let mut out = Vec::new();
    for body in exporter.take_queued() {
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("a valid request");
        for span in request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
        {
            let tags = span
                .attributes
                .iter()
                .filter_map(|kv| {
                    let key = kv.key.strip_prefix("refusal_gate.")?;
                    let value = match kv.value.as_ref()?.value.as_ref()? {
                        any_value::Value::StringValue(s) => s.clone(),
                        any_value::Value::IntValue(i) => i.to_string(),
                        any_value::Value::BoolValue(b) => b.to_string(),
                        other => format!("{other:?}"),
                    };
                    Some((key.to_owned(), value))
                })
                .collect();
            out.push((span.span_id.clone(), tags));
        }
    }
    out
}

/// One tag of a forwarded span.
fn tag<'t>(tags: &'t [(String, String)], key: &str) -> Option<&'t str> {
    tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn request(spans: usize) -> ExportTraceServiceRequest {
    let span = Span {
        name: "GET".into(),
        kind: 3,
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource::default()),
            scope_spans: vec![ScopeSpans {
                spans: vec![span; spans],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[test]
fn one_broken_protobuf_span_costs_only_itself() {
    let good = request(1).resource_spans[0].scope_spans[0].spans[0].encode_to_vec();
    let bad = vec![0x0a, 0x05, 0xff]; // name: a string field whose length runs past its span
    let mut scope = Vec::new();
    for span in [&good, &bad, &good] {
        scope.push(0x12); // ScopeSpans.spans
        prost::encoding::encode_varint(span.len() as u64, &mut scope);
        scope.extend_from_slice(span);
    }
    let mut rs = vec![0x12];
    prost::encoding::encode_varint(scope.len() as u64, &mut rs);
    rs.extend_from_slice(&scope);
    let mut body = vec![0x0a];
    prost::encoding::encode_varint(rs.len() as u64, &mut body);
    body.extend_from_slice(&rs);

    // The framing holds down to the spans; the broken one is rejected, the rest forwarded.
    assert_eq!(frame::check(&body).expect("framing is valid"), 3);
    let pipeline = Pipeline::from_config(&crate::config::Config::default());
    let mut tags = SpanTags::default();
    let (summary, malformed_at) = pipeline.ingest(Transport::Grpc, &body, 0, 1, Some(&mut tags));
    assert_eq!((summary.accepted, summary.rejected), (2, 1));
    assert_eq!(malformed_at, vec![1]);
    assert_eq!(tags.len(), 2);
    let forwarded = frame::retag(&body, &malformed_at, &tags).expect("re-framed");
    let request = ExportTraceServiceRequest::decode(&forwarded[..]).expect("a valid request");
    assert_eq!(request.resource_spans[0].scope_spans[0].spans.len(), 2);
}

#[test]
fn broken_framing_is_malformed_on_both_encodings() {
    let pipeline = Pipeline::from_config(&crate::config::Config::default());
    let cases: [(&[u8], Encoding); 5] = [
        (b"\xff\xff\xff\xff not a message", Encoding::Protobuf),
        (b"\x0a\x10short", Encoding::Protobuf),
        (b"{\"resourceSpans\": [", Encoding::Json),
        (b"[1,2]", Encoding::Json),
        (b"{\"resourceSpans\": 5}", Encoding::Json),
    ];
    for (body, encoding) in cases {
        assert!(
            matches!(
                pipeline.handle(Transport::Http, body, encoding, 1),
                Err(IngestError::Malformed { .. })
            ),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    assert!(pipeline.metrics().render().contains(
        "refusal_gate_receiver_refused_requests_total{reason=\"malformed\",transport=\"http\"} 5"
    ));
}

#[test]
fn a_json_span_that_does_not_deserialize_is_rejected_and_counted() {
    let pipeline = Pipeline::from_config(&crate::config::Config::default());
    let body = br#"{"resourceSpans":[{"scopeSpans":[{"spans":[
        {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"x","kind":3},
        {"traceId":"not hex","spanId":"zz","name":"bad"}]}]}]}"#;
    let summary = pipeline
        .handle(Transport::Http, body, Encoding::Json, 1)
        .expect("accepted");
    assert_eq!((summary.accepted, summary.rejected), (1, 1));
    assert!(pipeline.metrics().render().contains(
        "refusal_gate_receiver_refused_spans_total{reason=\"malformed_span\",transport=\"http\"} 1"
    ));
}

#[test]
fn attributes_past_the_limit_are_not_read_and_the_span_is_counted() {
    let pipeline = Pipeline::from_config(&crate::config::Config::default()).with_max_attributes(8);
    let filler = |n: usize| {
        (0..n)
            .map(|i| KeyValue {
                key: format!("filler.{i}"),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(i as i64)),
                }),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    let method = KeyValue {
        key: "http.request.method".into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue("GET".into())),
        }),
        ..Default::default()
    };
    let request = |attributes: Vec<KeyValue>| {
        let mut r = request(1);
        r.resource_spans[0].scope_spans[0].spans[0].attributes = attributes;
        r.encode_to_vec()
    };
    // The method is the ninth attribute: past the limit, so the span has no protocol.
    let late = request([filler(8), vec![method.clone()]].concat());
    let early = request([vec![method], filler(8)].concat());
    for (body, attempts) in [(late, 0), (early, 1)] {
        for encoding in [Encoding::Protobuf, Encoding::Json] {
            let body = match encoding {
                Encoding::Protobuf => body.clone(),
                Encoding::Json => serde_json::to_vec(
                    &ExportTraceServiceRequest::decode(&body[..]).expect("valid"),
                )
                .expect("serialises"),
            };
            let summary = pipeline
                .handle(Transport::Http, &body, encoding, 1)
                .expect("accepted");
            assert_eq!((summary.attempts, summary.truncated), (attempts, 1));
        }
    }
    assert!(pipeline
        .metrics()
        .render()
        .contains("refusal_gate_receiver_truncated_spans_total{transport=\"http\"} 4"));
}

#[test]
fn a_grpc_attempt_is_placed_by_its_path_on_a_configured_origin() {
    use crate::otlp::fixtures::{i, s, span};
    let config = crate::config::Config::parse(
        "
interfaces:
  - name: a
    protocol: grpc
    url: http://g.test:50051
    endpoints: [{ path: /pkg.A/Get }]
  - name: b
    protocol: grpc
    url: http://g.test:50051/pkg.B
    endpoints: [{ path: /pkg.B/Get }]
",
    )
    .expect("valid");
    let pipeline = Pipeline::from_config(&config);
    let interfaces = pipeline.catalog().current();
    let place = |service: &str, server: bool| {
        let mut attributes = vec![
            s("rpc.system", "grpc"),
            s("rpc.service", service),
            s("rpc.method", "Get"),
        ];
        if server {
            attributes.push(s("server.address", "g.test"));
            attributes.push(i("server.port", 50051));
        }
        let sp = span("x", attributes);
        let attempt = extract::extract(extract::client_of(&[]), &&sp, 64).expect("an attempt");
        pipeline
            .place(&interfaces, &attempt, 0)
            .interface_name
            .to_owned()
    };
    // /pkg.B/Get: under b's base path, on the origin both serve from.
    assert_eq!(place("pkg.B", true), "b");
    assert_eq!(place("pkg.A", true), "a");
    // No server: the interface that declares the service.
    assert_eq!(place("pkg.B", false), "b");
    assert_eq!(place("pkg.Nobody", false), "unknown");
}

#[test]
fn discovery_is_asked_for_whatever_the_answer_and_read_on_success() {
    use crate::extract::Discovery;
    use crate::otlp::fixtures::{i, s, span};
    let config = crate::config::Config::parse(
        "
interfaces:
  - name: a
    protocol: a2a
    url: http://agent.test/a2a
",
    )
    .expect("valid");
    let pipeline = Pipeline::from_config(&config);
    let interfaces = pipeline.catalog().current();
    let of = |attrs: Vec<KeyValue>| {
        let sp = span("x", attrs);
        let a = extract::extract(extract::client_of(&[]), &&sp, 64).expect("attempt");
        pipeline.place(&interfaces, &a, 0).discovery
    };
    let get = |path: &str, status: i64| {
        vec![
            s("http.request.method", "GET"),
            s("url.full", &format!("http://agent.test{path}")),
            i("http.response.status_code", status),
        ]
    };
    assert_eq!(
        of(get("/.well-known/agent-card.json", 200)),
        Discovery::Read
    );
    assert_eq!(
        of(get("/.well-known/agent-card.json", 404)),
        Discovery::Asked
    );
    assert_eq!(
        of(get("/.well-known/agent-card.json", 304)),
        Discovery::Asked,
        "a read is a 2xx"
    );
    assert_eq!(of(get("/a2a/tasks", 200)), Discovery::None);
    assert_eq!(
        of(vec![s("a2a.method.name", "GetExtendedAgentCard")]),
        Discovery::Read
    );
    assert_eq!(
        of(vec![
            s("a2a.method.name", "GetExtendedAgentCard"),
            s("rpc.response.status_code", "-32007")
        ]),
        Discovery::Asked
    );
    assert_eq!(
        of(vec![
            s("rpc.system", "grpc"),
            s(
                "rpc.method",
                "grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
            ),
        ]),
        Discovery::Read
    );
}

/// A request from `client` (`service.name`) of one GET on `http://o.test/x` answered 200,
/// at `at` and `id` its span's id.
fn get_from(client: &str, at: Nanos, id: u64) -> ResourceSpans {
    get_on(client, "http://o.test/x", at, id)
}

use crate::otlp::fixtures::get_on;

/// Sends `resource_spans` in one OTLP/HTTP request at `at`.
fn send(pipeline: &Pipeline, resource_spans: Vec<ResourceSpans>, at: Nanos) {
    let body = ExportTraceServiceRequest { resource_spans }.encode_to_vec();
    pipeline
        .handle(Transport::Http, &body, Encoding::Protobuf, at)
        .expect("accepted");
}

/// The attempts every live (client, interface) pair has counted.
fn counted(pipeline: &Pipeline) -> u64 {
    let fleet = pipeline.metrics().fleet();
    fleet.iter().map(|p| p.attempts.iter().sum::<u64>()).sum()
}

#[test]
fn a_scrape_during_a_sweep_counts_what_the_sweep_settled() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let pipeline = Arc::new(Pipeline::from_config(&crate::config::Config::default()));
    let window = pipeline.tracker().reorder_window();
    // The sweeper sweeps one window after `now`, and says when a sweep began and how long
    // the last one took.
    let (now, begun, took, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let sweeper = {
        let (pipeline, now, begun, took, done) = (
            Arc::clone(&pipeline),
            Arc::clone(&now),
            Arc::clone(&begun),
            Arc::clone(&took),
            Arc::clone(&done),
        );
        std::thread::spawn(move || {
            while !done.load(SeqCst) {
                let started = std::time::Instant::now();
                begun.fetch_add(1, SeqCst);
                pipeline.sweep(now.load(SeqCst) + window);
                took.store(started.elapsed().as_nanos() as u64, SeqCst);
            }
        })
    };
    // Groups enough that a sweep takes a while to pass them and to count their attempts.
    const SPANS: u64 = 2_000;
    for round in 0..10 {
        let at = (round + 1) * 3 * window;
        // Of clients `0..SPANS`: each its own group, spread over the tracker's shards.
        let clients = (0..SPANS).map(|k| get_from(&format!("c{k}"), at, at + k));
        send(&pipeline, clients.collect(), at);
        // The attempts become due for the sweeper; a scrape comes halfway through a sweep,
        // when some of them are settled and not yet counted.
        now.store(at, SeqCst);
        let seen = begun.load(SeqCst);
        while begun.load(SeqCst) == seen {
            std::hint::spin_loop();
        }
        std::thread::sleep(std::time::Duration::from_nanos(took.load(SeqCst) / 2));
        pipeline.settle(true, at);
        assert_eq!(counted(&pipeline), (round + 1) * SPANS, "round {round}");
    }
    done.store(true, SeqCst);
    sweeper.join().expect("the sweeper ends");
}

#[test]
fn a_client_back_after_its_series_expired_is_counted_again() {
    let config = crate::config::Config::parse("metrics: { series_ttl: 60s }").expect("valid");
    let pipeline = Pipeline::from_config(&config);
    let second = crate::clock::SECOND;
    let attempt = |at: Nanos| {
        send(&pipeline, vec![get_from("c", at, at)], at);
        pipeline.settle(true, at);
    };
    // The metrics' clock starts at the wall clock's.
    let start = crate::clock::now();
    attempt(start);
    assert_eq!(counted(&pipeline), 1);
    // Two minutes without an attempt: the series leaves /metrics; the key (an hour) stays.
    pipeline.sweep(start + 120 * second);
    assert_eq!(pipeline.metrics().fleet().len(), 0);
    assert_eq!(pipeline.tracker().keys(), 1);
    // The client comes back: its attempts are counted under a new series.
    attempt(start + 200 * second);
    assert_eq!(counted(&pipeline), 1);
}

#[test]
fn long_names_are_cut_alike_everywhere_they_are_shown_and_stay_distinct() {
    let pipeline = Pipeline::from_config(&crate::config::Config::default());
    let long = |last: char| format!("{}{last}", "c".repeat(100_000));
    let (a, b) = (long('a'), long('b'));
    // An origin of 160 bytes: within what an origin may be (192), past the label's 128.
    let host = format!("{}.test", "h".repeat(150));
    let url = format!("http://{host}/x");
    let mut tags = SpanTags::default();
    let body = ExportTraceServiceRequest {
        resource_spans: vec![get_on(&a, &url, 1, 1), get_on(&b, &url, 1, 2)],
    }
    .encode_to_vec();
    pipeline.ingest(Transport::Http, &body, 1, 1, Some(&mut tags));
    pipeline.settle(true, 2);
    let fleet = pipeline.metrics().fleet();
    let mut clients: Vec<&str> = fleet.iter().map(|p| &*p.client).collect();
    clients.sort_unstable();
    let short = |v: &str| crate::label::shorten(v, 128).into_owned();
    assert_eq!(clients, [short(&a), short(&b)]);
    assert!(fleet
        .iter()
        .all(|p| *p.interface == short(&format!("http://{host}"))));
    assert!(fleet
        .iter()
        .all(|p| p.client.len() <= 128 && p.interface.len() <= 128));
    // The forwarded tag names the interface as the label does.
    let forwarded = frame::retag(&body, &[], &tags).expect("re-framed");
    let forwarded = ExportTraceServiceRequest::decode(&forwarded[..]).expect("valid");
    let tagged = forwarded.resource_spans[0].scope_spans[0].spans[0]
        .attributes
        .iter()
        .find(|kv| kv.key == "refusal_gate.interface")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(
        tagged,
        Some(any_value::Value::StringValue(
            fleet[0].interface.to_string()
        ))
    );
    let text = pipeline.metrics().render();
    for (label, n) in [("client", 2), ("interface", 2)] {
        let line = format!("refusal_gate_label_truncated_total{{label=\"{label}\"}} {n}");
        assert!(text.contains(&line), "{line} not in {text}");
    }
}

#[test]
fn a_clients_pairs_found_at_once_count_as_pairs_looked_up_one_by_one_do() {
    let pipeline = Pipeline::from_config(&crate::config::Config::default());
    let long = "c".repeat(1_000);
    // Two requests each: the second finds the short client's pairs at once (issue 66).
    for n in 0..2u64 {
        let body = ExportTraceServiceRequest {
            resource_spans: vec![
                get_on("short", "http://a.test/x", 10 + n, 1 + 4 * n),
                get_on("short", "http://b.test/x", 10 + n, 2 + 4 * n),
                get_on(&long, "http://a.test/x", 10 + n, 3 + 4 * n),
            ],
        }
        .encode_to_vec();
        pipeline.ingest(Transport::Http, &body, 1, 1, None);
    }
    pipeline.settle(true, 2);
    let mut fleet: Vec<(String, String, u64)> = pipeline
        .metrics()
        .fleet()
        .iter()
        .map(|p| {
            (
                p.client.to_string(),
                p.interface.to_string(),
                p.attempts.iter().sum(),
            )
        })
        .collect();
    fleet.sort_unstable();
    let cut = crate::label::shorten(&long, 128).into_owned();
    assert_eq!(
        fleet,
        [
            (cut, "http://a.test".into(), 2),
            ("short".into(), "http://a.test".into(), 2),
            ("short".into(), "http://b.test".into(), 2),
        ]
    );
    // A cut name's pairs are still looked up, and its cut counted, once a request.
    let text = pipeline.metrics().render();
    assert!(text.contains("refusal_gate_label_truncated_total{label=\"client\"} 2"));
}

/// The server view's tests: a resource observed from the server's side, and its spans.
mod server_view {
    use super::*;

    use crate::otlp::fixtures::{i, s as kv};

    /// A span of `kind` in trace 7 with id `id` and parent `parent` (0: none).
    pub(super) fn span(kind: i32, id: u8, parent: u8, attributes: &[(&str, &str)]) -> Span {
        Span {
            name: "span".into(),
            kind,
            trace_id: vec![7; 16],
            span_id: vec![id; 8],
            parent_span_id: if parent == 0 { vec![] } else { vec![parent; 8] },
            start_time_unix_nano: 1_000 + u64::from(id),
            end_time_unix_nano: 2_000,
            attributes: attributes.iter().map(|(k, v)| kv(k, v)).collect(),
            ..Default::default()
        }
    }

    /// What the ASGI instrumentation records for a request (its default, legacy names).
    pub(super) fn asgi(id: u8, parent: u8, path: &str, status: &str) -> Span {
        let url = format!("http://mcp.test:8080{path}");
        span(
            2,
            id,
            parent,
            &[
                ("http.method", "POST"),
                ("http.url", &url),
                ("http.status_code", status),
                ("http.user_agent", "planner/1.0"),
                ("net.peer.ip", "10.0.0.7"),
            ],
        )
    }

    /// What the MCP Python SDK's server records for a message.
    pub(super) fn mcp(id: u8, parent: u8, method: &str) -> Span {
        span(2, id, parent, &[("mcp.method.name", method)])
    }

    pub(super) fn body(service: &str, spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", service)],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    fn attempts(pipeline: &Pipeline, client: &str) -> u64 {
        pipeline.settle(true, 10);
        let text = pipeline.metrics().render();
        text.lines()
            .filter(|l| {
                l.starts_with("refusal_gate_attempts_total{")
                    && l.contains(&format!("client=\"{client}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    fn pipeline() -> Pipeline {
        weather_observed_by("weather-mcp")
    }

    /// `spans` exported by `service` at `now`.
    pub(super) fn send(p: &Pipeline, service: &str, spans: Vec<Span>, now: Nanos) {
        p.handle(
            Transport::Grpc,
            &body(service, spans),
            Encoding::Protobuf,
            now,
        )
        .expect("accepted");
    }

    #[test]
    fn a_protocol_span_takes_its_client_from_its_http_parent_and_the_pair_is_one_call() {
        let p = pipeline();
        // Together, the child first (it ends first).
        send(
            &p,
            "weather-mcp",
            vec![mcp(2, 1, "initialize"), asgi(1, 0, "/mcp", "200")],
            1,
        );
        assert_eq!(attempts(&p, "planner/1.0"), 1);
        // Apart: the child in one export, its parent in the next.
        send(&p, "weather-mcp", vec![mcp(4, 3, "tools/list")], 2);
        assert_eq!(attempts(&p, "planner/1.0"), 1, "held for its parent");
        assert_eq!(
            p.calls().held(),
            1,
            "a read of the counters does not release it"
        );
        send(&p, "weather-mcp", vec![asgi(3, 0, "/mcp", "200")], 3);
        assert_eq!(attempts(&p, "planner/1.0"), 2);
        assert_eq!(attempts(&p, UNKNOWN_CLIENT_NAME), 0);
        // A request that carries no protocol span is an attempt of its own.
        send(&p, "weather-mcp", vec![asgi(5, 0, "/mcp/mcp", "404")], 4);
        assert_eq!(attempts(&p, "planner/1.0"), 3);
    }

    #[test]
    fn a_server_span_of_a_client_span_is_the_same_call_whichever_comes_first() {
        let p = pipeline();
        let client = |id: u8| {
            let mut s = span(
                3,
                id,
                0,
                &[
                    ("http.request.method", "POST"),
                    ("url.full", "http://mcp.test:8080/mcp"),
                ],
            );
            s.attributes.push(i("http.response.status_code", 200));
            s
        };
        send(&p, "my-agent", vec![client(1)], 1);
        send(&p, "weather-mcp", vec![asgi(2, 1, "/mcp", "200")], 2);
        send(&p, "weather-mcp", vec![asgi(4, 3, "/mcp", "200")], 3);
        send(&p, "my-agent", vec![client(3)], 4);
        assert_eq!(attempts(&p, "my-agent"), 2);
        assert_eq!(attempts(&p, "planner/1.0"), 0);
    }

    #[test]
    fn a_held_span_whose_parent_never_comes_is_counted_after_the_reorder_window() {
        let p = pipeline();
        let window = p.tracker().reorder_window();
        send(&p, "weather-mcp", vec![asgi(2, 1, "/mcp", "200")], 1);
        send(&p, "weather-mcp", vec![mcp(4, 3, "initialize")], 1);
        p.sweep(window);
        assert_eq!(p.calls().held(), 2, "still waiting");
        p.sweep(window + 1);
        assert_eq!(p.calls().held(), 0);
        // Each counted as it is: the HTTP span under the client it names, the MCP span under
        // none.
        assert_eq!(attempts(&p, "planner/1.0"), 1);
        assert_eq!(attempts(&p, UNKNOWN_CLIENT_NAME), 1);
    }

    #[test]
    fn a_client_span_whose_server_is_observed_is_withheld_until_the_servers_span_comes() {
        let p = forwarding(pipeline());
        // A request under the agent's own span (9), both in one export.
        let mut client = span(
            3,
            1,
            9,
            &[
                ("http.request.method", "POST"),
                ("url.full", "http://mcp.test:8080/mcp"),
            ],
        );
        client.attributes.push(i("http.response.status_code", 200));
        let agent = span(1, 9, 0, &[("gen_ai.operation.name", "invoke_agent")]);
        let body = body("my-agent", vec![client, agent]);
        let summary = p
            .handle(Transport::Grpc, &body, Encoding::Protobuf, 1)
            .expect("accepted");
        assert_eq!(summary.attempts, 1);
        let now = forwarded(&p);
        assert_eq!(
            now.iter().map(|(id, _)| id[0]).collect::<Vec<_>>(),
            [9],
            "the agent's own span at once; the client's withheld: its verdict is not the call's yet"
        );
        // Its server's HTTP span, later: the call, counted once, by the client that sent it
        // (the client's span remembered for it: the server's is not held, nor counted on its
        // own) — but an MCP interface's HTTP span does not say what MCP answered: withheld
        // still, the server's span with it.
        send(&p, "weather-mcp", vec![asgi(2, 1, "/mcp", "200")], 2);
        assert_eq!(p.calls().held(), 0);
        assert_eq!(forwarded(&p), []);
        // The server's MCP span: the call is whole, and its spans leave with its verdict.
        send(&p, "weather-mcp", vec![mcp(3, 2, "tools/list")], 3);
        let later = forwarded(&p);
        let client = later.iter().find(|(id, _)| id[0] == 1).expect("forwarded");
        assert_eq!(tag(&client.1, "interface"), Some("weather"));
        assert_eq!(tag(&client.1, "class"), Some("ok"));
        assert_eq!(later.len(), 3, "and the server's spans: {later:?}");
        p.sweep(p.tracker().reorder_window() + 10);
        assert_eq!(attempts(&p, "my-agent"), 1);
        assert_eq!(attempts(&p, "planner/1.0"), 0);
        assert_eq!(forwarded(&p), [], "each once");
    }

    #[test]
    fn a_client_span_whose_servers_protocol_span_never_comes_leaves_after_the_window() {
        let p = forwarding(pipeline());
        let mut client = span(
            3,
            1,
            0,
            &[
                ("http.request.method", "POST"),
                ("url.full", "http://mcp.test:8080/mcp"),
            ],
        );
        client.attributes.push(i("http.response.status_code", 200));
        send(&p, "my-agent", vec![client], 1);
        send(&p, "weather-mcp", vec![asgi(2, 1, "/mcp", "200")], 2);
        let window = p.tracker().reorder_window();
        p.sweep(window);
        assert_eq!(forwarded(&p), [], "within the window");
        // Each at the end of its own wait: the client's span came first.
        p.sweep(window + 2);
        let out = forwarded(&p);
        assert_eq!(out.len(), 2, "{out:?}");
        let client = out.iter().find(|(id, _)| id[0] == 1).expect("forwarded");
        assert_eq!(tag(&client.1, "class"), Some("ok"), "as counted");
        let text = p.metrics().render();
        assert!(
            text.contains("refusal_gate_exporter_withheld_seconds_count 2"),
            "each wait recorded: {text}"
        );
        assert!(text.contains("refusal_gate_exporter_withheld_seconds_bucket{le=\"6\"} 2"));
        assert!(text.contains("refusal_gate_exporter_withheld_seconds_bucket{le=\"4\"} 0"));
        assert_eq!(
            tag(
                &out.iter().find(|(id, _)| id[0] == 2).expect("forwarded").1,
                "class"
            ),
            None
        );
    }

    #[test]
    fn a_server_span_kept_with_a_call_for_a_late_part_comes_back_a_server_span() {
        let p = pipeline();
        let all = |p: &Pipeline| {
            p.settle(true, 10);
            let text = p.metrics().render();
            text.lines()
                .filter(|l| l.starts_with("refusal_gate_attempts_total{"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        // An agent's call through a gateway nobody observes: kept for a late part.
        let call = span(
            3,
            1,
            0,
            &[
                ("mcp.method.name", "tools/call"),
                ("gen_ai.tool.name", "x"),
                ("server.address", "gateway.test"),
            ],
        );
        send(&p, "my-agent", vec![call], 1);
        // The weather server's span of it, then the call's transport request, late.
        send(&p, "weather-mcp", vec![mcp(2, 1, "tools/call")], 2);
        let post = span(
            3,
            3,
            1,
            &[
                ("http.request.method", "POST"),
                ("url.full", "http://gateway.test/mcp"),
                ("http.response.status_code", "200"),
            ],
        );
        send(&p, "my-agent", vec![post], 3);
        // One attempt, the request's: the server's span, kept whole with the call, comes back
        // as the server's (read again from its request as a client's, the call is lost).
        assert_eq!(
            all(&p),
            [concat!(
                "refusal_gate_attempts_total{class=\"ok\",client=\"my-agent\",",
                "interface=\"http://gateway.test\",kind=\"ok\"} 1"
            )]
        );
    }

    #[test]
    fn a_server_span_counted_at_once_is_tagged_and_one_not_an_attempt_is_not() {
        let p = pipeline();
        let body = body(
            "weather-mcp",
            vec![mcp(2, 1, "initialize"), asgi(1, 0, "/mcp", "200")],
        );
        let mut tags = SpanTags::default();
        let (summary, _) = p.ingest(Transport::Grpc, &body, 0, 1, Some(&mut tags));
        assert_eq!(summary.accepted, 2);
        let tagged = String::from_utf8_lossy(tags.get(0)).into_owned();
        assert!(tagged.contains("refusal_gate.interface"), "{tagged}");
        assert!(tagged.contains("weather"), "{tagged}");
        assert!(tags.get(1).is_empty(), "the HTTP parent is not an attempt");
    }

    #[test]
    fn an_mcp_span_parented_to_the_clients_own_span_is_paired_with_the_request_around_it() {
        let p = pipeline();
        let window = p.tracker().reorder_window();
        // The client propagated its context in `_meta`: the MCP span is the child of the
        // client's span 9, in the client's trace 8; the ASGI span stands alone in trace 7.
        let mut child = mcp(2, 9, "initialize");
        child.trace_id = vec![8; 16];
        send(&p, "weather-mcp", vec![child, asgi(1, 0, "/mcp", "200")], 1);
        // One call of two spans, held for the client's own span, which never comes; then the
        // MCP span's, under the client the ASGI span names.
        assert_eq!(p.calls().held(), 2);
        p.sweep(window + 2);
        assert_eq!(attempts(&p, "planner/1.0"), 1);
        assert_eq!(attempts(&p, UNKNOWN_CLIENT_NAME), 0);
        // Two such spans inside one request: which is which cannot be told; nothing is paired.
        let (mut a, mut b) = (mcp(12, 19, "tools/list"), mcp(13, 19, "tools/list"));
        a.trace_id = vec![8; 16];
        b.trace_id = vec![9; 16];
        send(&p, "weather-mcp", vec![a, b, asgi(11, 0, "/mcp", "200")], 3);
        p.sweep(2 * window + 10);
        assert_eq!(attempts(&p, "planner/1.0"), 2);
        assert_eq!(attempts(&p, UNKNOWN_CLIENT_NAME), 2);
    }

    const UNKNOWN_CLIENT_NAME: &str = crate::extract::UNKNOWN_CLIENT;
}

/// Calls in several spans (DESIGN §11) through the whole pipeline: what is held, what is
/// tagged, what the bounds force, an exporter's retry of a held span.
mod calls {
    use super::server_view::{body as export, span as any_span};
    use super::*;

    const CONFIG: &str = "
interfaces:
  - name: weather
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints: [{ path: /mcp, methods: [POST] }]
tracker: { max_held_spans: 3 }
";

    /// A CLIENT span: id, parent (0: none), attributes.
    fn span(id: u8, parent: u8, attributes: &[(&str, &str)]) -> Span {
        any_span(3, id, parent, attributes)
    }

    /// The MCP SDK's span of a call: no server named.
    fn protocol(id: u8) -> Span {
        span(
            id,
            0,
            &[("mcp.method.name", "tools/call"), ("gen_ai.tool.name", "x")],
        )
    }

    /// httpx's request under the call `parent`.
    fn post(id: u8, parent: u8) -> Span {
        span(
            id,
            parent,
            &[
                ("http.request.method", "POST"),
                ("url.full", "http://mcp.test:8080/mcp"),
                ("http.response.status_code", "200"),
            ],
        )
    }

    fn body(spans: Vec<Span>) -> Vec<u8> {
        export("agent", spans)
    }

    fn pipeline() -> Pipeline {
        Pipeline::from_config(&crate::config::Config::parse(CONFIG).expect("valid"))
    }

    /// The value of the series of `metric` whose line contains `part`, after a settle.
    fn count(p: &Pipeline, metric: &str, part: &str) -> u64 {
        p.settle(true, 10);
        p.metrics()
            .render()
            .lines()
            .filter(|l| l.starts_with(metric) && l.contains(part))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    #[test]
    fn a_request_held_for_its_call_is_counted_once_the_call_arrives_and_tagged_with_it() {
        let p = pipeline();
        let mut tags = SpanTags::default();
        p.ingest(
            Transport::Grpc,
            &body(vec![post(2, 1)]),
            0,
            1,
            Some(&mut tags),
        );
        assert!(tags.get(0).is_empty(), "held: its verdict is not known yet");
        assert_eq!(p.calls().held(), 1);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "agent"), 0);
        // The call arrives with a request of its own, in one export: both counted, each once,
        // the new request tagged with its call's operation and interface.
        let mut tags = SpanTags::default();
        let spans = vec![post(4, 3), protocol(3), protocol(1)];
        let (summary, _) = p.ingest(Transport::Grpc, &body(spans), 0, 2, Some(&mut tags));
        assert_eq!(summary.attempts, 2);
        assert_eq!(p.calls().held(), 0);
        let tagged = String::from_utf8_lossy(tags.get(0)).into_owned();
        assert!(tagged.contains("refusal_gate.interface") && tagged.contains("weather"));
        assert!(
            tags.get(1).is_empty() && tags.get(2).is_empty(),
            "the calls are not attempts"
        );
        assert_eq!(
            count(&p, "refusal_gate_attempts_total", "interface=\"weather\""),
            2
        );
        assert_eq!(
            count(&p, "refusal_gate_spans_skipped_total", "same_call"),
            2
        );
        assert_eq!(count(&p, "refusal_gate_attempts_total", "unknown"), 0);
    }

    #[test]
    fn a_call_counted_before_its_request_arrived_is_taken_back_and_its_tags_with_it() {
        let p = pipeline();
        // The call first, alone: an attempt on `unknown` (it names no server), pending.
        p.ingest(Transport::Grpc, &body(vec![protocol(1)]), 0, 1, None);
        // Its request in the next export: the call is taken back, the request counted.
        p.ingest(Transport::Grpc, &body(vec![post(2, 1)]), 0, 2, None);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "unknown"), 0);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 1);
        // In one export, the call before its request: the call's tags are cleared.
        let mut tags = SpanTags::default();
        let spans = vec![protocol(5), post(6, 5)];
        p.ingest(Transport::Grpc, &body(spans), 0, 3, Some(&mut tags));
        assert!(
            tags.get(0).is_empty(),
            "{:?}",
            String::from_utf8_lossy(tags.get(0))
        );
        assert!(!tags.get(1).is_empty());
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 2);
    }

    #[test]
    fn past_max_held_spans_the_oldest_held_call_is_counted_at_once() {
        let p = pipeline();
        for n in 0..4u8 {
            let parent = 100 + n;
            p.ingest(
                Transport::Grpc,
                &body(vec![post(n + 1, parent)]),
                0,
                u64::from(n),
                None,
            );
        }
        assert_eq!(p.calls().held(), 3);
        assert_eq!(
            count(&p, "refusal_gate_held_calls_forced_total", "max_held_spans"),
            1
        );
        // Counted as it is, a plain request: pending while its client has spans held (a read
        // of the counters does not settle it: a held span may come before it), its verdict
        // final with theirs below.
        assert_eq!(p.tracker().keys(), 1);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 0);
        // An exporter sends a held span again: not held twice.
        p.ingest(Transport::Grpc, &body(vec![post(4, 103)]), 0, 9, None);
        assert_eq!(p.calls().held(), 3);
        assert_eq!(
            count(&p, "refusal_gate_spans_skipped_total", "duplicate"),
            1
        );
        // Their wait ends: each counted as it is.
        p.sweep(p.tracker().reorder_window() + 10);
        assert_eq!(p.calls().held(), 0);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 4);
    }

    #[test]
    fn a_held_call_that_grows_waits_from_its_first_span_not_its_latest() {
        let p = pipeline();
        let window = p.tracker().reorder_window();
        // A call under an agent's span (9) that never comes, held from 1.
        let call = span(
            3,
            9,
            &[("mcp.method.name", "tools/call"), ("gen_ai.tool.name", "x")],
        );
        p.ingest(Transport::Grpc, &body(vec![call]), 0, 1, None);
        // Its request comes half a window later: one call, still waiting for 9.
        p.ingest(
            Transport::Grpc,
            &body(vec![post(4, 3)]),
            0,
            window / 2,
            None,
        );
        assert_eq!(p.calls().held(), 2);
        // A window after its first span, it is counted; not a window after its latest.
        p.sweep(window + 2);
        assert_eq!(p.calls().held(), 0, "the wait began at its first span");
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 1);
        assert_eq!(
            count(&p, "refusal_gate_spans_skipped_total", "same_call"),
            1
        );
    }

    #[test]
    fn a_404_on_an_undeclared_path_is_that_paths_answer_whatever_code_the_call_reports() {
        use crate::otlp::fixtures::s as kv;
        let p = pipeline();
        // A call that reports -32601, each time over a request answered 404: once to the
        // endpoint the interface declares, once to a path it does not (an SDK's fallback).
        let call = |id: u8| {
            let mut c = protocol(id);
            c.attributes.push(kv("rpc.jsonrpc.error_code", "-32601"));
            c
        };
        let request = |id: u8, parent: u8, url: &str| {
            let mut r = post(id, parent);
            r.attributes
                .retain(|a| a.key != "url.full" && a.key != "http.response.status_code");
            r.attributes.push(kv("url.full", url));
            r.attributes.push(kv("http.response.status_code", "404"));
            r
        };
        let spans = vec![
            request(2, 1, "http://mcp.test:8080/mcp"),
            call(1),
            request(4, 3, "http://mcp.test:8080/mcp/sse"),
            call(3),
        ];
        p.ingest(Transport::Grpc, &body(spans), 0, 1, None);
        // Both refusals, unverified (nothing was read): over the declared endpoint by the
        // call's -32601, over the other by the path's 404 — neither a 404 on a declared path
        // (ambiguous).
        let kind = |k: &str| count(&p, "refusal_gate_attempts_total", &format!("kind=\"{k}\""));
        assert_eq!(kind("unverified_refusal"), 2);
        assert_eq!(kind("ambiguous"), 0);
    }

    #[test]
    fn a_call_that_named_no_server_is_remembered_past_the_window_for_its_request() {
        let p = pipeline();
        let window = p.tracker().reorder_window();
        // The call alone, naming no server: counted on `unknown`, its request expected.
        p.ingest(Transport::Grpc, &body(vec![protocol(1)]), 0, 1, None);
        p.sweep(window + 10);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "unknown"), 1);
        // Its request, past the window, its call's verdict settled: joined to it (it is
        // not held for it), it is the attempt counted already, and is skipped as `same_call`
        // — a call is never counted twice (docs/semantics.md).
        let (summary, _) = p.ingest(
            Transport::Grpc,
            &body(vec![post(2, 1)]),
            0,
            window + 20,
            None,
        );
        assert_eq!(summary.attempts, 0);
        assert_eq!(p.calls().held(), 0, "joined, not held for its call");
        assert_eq!(count(&p, "refusal_gate_attempts_total", "unknown"), 1);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 0);
        assert_eq!(
            count(&p, "refusal_gate_spans_skipped_total", "same_call"),
            1,
            "the request; the call's span stays its attempt"
        );
    }

    #[test]
    fn a_call_settled_by_a_scrape_is_not_counted_again_when_its_request_comes_in_the_window() {
        let p = pipeline();
        // The call alone; a scrape settles it (`count` settles as a scrape does).
        p.ingest(Transport::Grpc, &body(vec![protocol(1)]), 0, 1, None);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "unknown"), 1);
        // Its request, well within the window: one call, counted once — where it was counted,
        // its facts not merged (docs/semantics.md: a read of `/metrics` settles).
        let (summary, _) = p.ingest(Transport::Grpc, &body(vec![post(2, 1)]), 0, 2, None);
        assert_eq!(summary.attempts, 0);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "agent"), 1);
        assert_eq!(
            count(&p, "refusal_gate_spans_skipped_total", "same_call"),
            1
        );
    }

    #[test]
    fn the_held_spans_gauge_adds_the_spans_kept_for_a_late_part_to_those_held() {
        let p = pipeline();
        // Read as a scrape reads it: a settle would end the wait of what is kept.
        let gauge = |p: &Pipeline| {
            let text = p.metrics().render();
            let line = text
                .lines()
                .find(|l| l.starts_with("refusal_gate_held_spans "));
            line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        // A plain request under an agent's span, counted whole: nothing can come under it.
        let mut agent = span(7, 0, &[("gen_ai.operation.name", "invoke_agent")]);
        agent.kind = 1;
        p.ingest(Transport::Grpc, &body(vec![post(8, 7), agent]), 0, 1, None);
        assert_eq!(gauge(&p), Some(0), "a request is kept for nothing");
        // A call counted whole, kept for a late part (its server's side, say): two spans.
        let spans = vec![post(2, 1), protocol(1)];
        p.ingest(Transport::Grpc, &body(spans), 0, 1, None);
        assert_eq!(p.calls().held(), 0);
        assert_eq!(gauge(&p), Some(2), "kept, not held");
        // And a request held for its call: one more.
        p.ingest(Transport::Grpc, &body(vec![post(4, 3)]), 0, 2, None);
        assert_eq!(p.calls().held(), 1);
        assert_eq!(gauge(&p), Some(3));
    }

    #[test]
    fn a_span_naming_a_parent_that_is_no_call_is_counted_as_soon_as_the_parent_is_seen() {
        let p = pipeline();
        // An agent's INTERNAL span, the parent of a plain request, in the next export.
        p.ingest(Transport::Grpc, &body(vec![post(2, 1)]), 0, 1, None);
        let mut agent = span(1, 0, &[("gen_ai.operation.name", "invoke_agent")]);
        agent.kind = 1;
        p.ingest(Transport::Grpc, &body(vec![agent]), 0, 2, None);
        assert_eq!(p.calls().held(), 0);
        assert_eq!(count(&p, "refusal_gate_attempts_total", "weather"), 1);
    }
}

#[test]
fn a_post_to_an_mcp_endpoint_shows_a_session_as_an_mcp_request_does() {
    use crate::otlp::fixtures::{i, s, span};
    let pipeline = weather_observed_by("weather-server");
    let interfaces = pipeline.catalog().current();
    let in_session = |attrs: Vec<KeyValue>| {
        let sp = span("x", attrs);
        let a = extract::extract(extract::client_of(&[]), &&sp, 64).expect("attempt");
        pipeline.place(&interfaces, &a, 0).asked.in_session
    };
    let http = |method: &str, path: &str, status: i64| {
        vec![
            s("http.request.method", method),
            s("url.full", &format!("http://mcp.test:8080{path}")),
            i("http.response.status_code", status),
        ]
    };
    // A client traced only at HTTP (DESIGN §12.4): its `initialize` is a POST.
    assert!(in_session(http("POST", "/mcp", 200)));
    assert!(in_session(vec![s("mcp.method.name", "initialize")]));
    assert!(!in_session(http("POST", "/mcp", 503)), "a failed request");
    assert!(!in_session(http("POST", "/other", 200)), "not the endpoint");
    assert!(
        !in_session(http("GET", "/mcp", 200)),
        "the stream is no request"
    );
    assert!(!in_session(http("DELETE", "/mcp", 200)));
}

#[test]
fn only_a_get_or_delete_on_a_declared_path_is_the_transports_own_part() {
    use crate::otlp::fixtures::{i, s, span};
    let pipeline = weather_observed_by("weather-server");
    let interfaces = pipeline.catalog().current();
    let place = |method: &str, path: &str, session: Option<&str>| {
        let mut attrs = vec![
            s("http.request.method", method),
            s("url.full", &format!("http://mcp.test:8080{path}")),
            i("http.response.status_code", 405),
        ];
        attrs.extend(session.map(|id| s("mcp.session.id", id)));
        let sp = span("x", attrs);
        let a = extract::extract(extract::client_of(&[]), &&sp, 64).expect("attempt");
        let p = pipeline.place(&interfaces, &a, 0);
        (p.asked.sessionless, p.operation)
    };
    // The MCP endpoint's GET: the transport's part, told apart by its session (DESIGN §12.4).
    assert!(place("GET", "/mcp", None).0);
    assert!(place("DELETE", "/mcp", None).0);
    assert_ne!(
        place("GET", "/mcp", Some("a")).1,
        place("GET", "/mcp", Some("b")).1
    );
    // A path the interface does not declare (contract 6): an ordinary http attempt, the same
    // question in every session.
    assert!(!place("GET", "/mcp/sse", None).0);
    assert!(!place("DELETE", "/mcp/sse", None).0);
    assert_eq!(
        place("GET", "/mcp/sse", Some("a")).1,
        place("GET", "/mcp/sse", Some("b")).1
    );
    assert_eq!(
        place("GET", "/mcp/sse", Some("a")).1,
        place("GET", "/mcp/sse", None).1
    );
}
