//! The Gate API, black-box: `Decide` over gRPC and over the HTTP mirror answers every row of
//! the decision table with the class and kind a span with the same signal gets; after a
//! refusal observed from spans it routes elsewhere and names the interface that declares the
//! operation; a server's `Retry-After` sets the backoff, and an observed call back before it is
//! counted; `WatchAlerts` (and the SSE mirror) deliver the alert of a retry after refusal.

mod common;

use common::{export, kv, scrape, send, start, value};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use refusal_gate::app::Bound;
use refusal_gate::gate::proto::refusal_gate_client::RefusalGateClient;
use refusal_gate::gate::proto::{
    self, Client, DecideRequest, LastResponse, Protocol, WatchAlertsRequest,
};
use std::time::Duration;

const CONFIG: &str = "
receivers:
  otlp:
    grpc: { endpoint: 127.0.0.1:0 }
    http: { endpoint: 127.0.0.1:0 }
admin:
  endpoint: 127.0.0.1:0
interfaces:
  - name: legacy-api
    protocol: http
    url: http://old.test
    endpoints:
      - path: /v1/orders
        methods: [GET, POST]
  - name: catalog-v2
    protocol: http
    url: http://new.test
    endpoints:
      - path: /v1/items
        methods: [POST]
  - name: tools-mcp
    protocol: mcp
    url: http://mcp.test/mcp
    endpoints:
      - path: /mcp
        methods: [POST]
tracker:
  probe_window: 3s
";

/// One row: the call, its last response, and the kind the decision table gives it.
struct Row {
    protocol: Protocol,
    url: &'static str,
    http_method: &'static str,
    method: &'static str,
    response: LastResponse,
    /// Whether the client read the interface's discovery document first.
    read_first: bool,
    kind: &'static str,
}

fn http(status: u32) -> LastResponse {
    LastResponse {
        http_status: status,
        ..Default::default()
    }
}

fn grpc(code: u32) -> LastResponse {
    LastResponse {
        grpc_code: code,
        has_grpc_code: true,
        ..Default::default()
    }
}

fn jsonrpc(code: i64) -> LastResponse {
    LastResponse {
        jsonrpc_code: code,
        http_status: 200,
        ..Default::default()
    }
}

fn rows() -> Vec<Row> {
    let row = |protocol, url, http_method, method, response, read_first, kind| Row {
        protocol,
        url,
        http_method,
        method,
        response,
        read_first,
        kind,
    };
    use Protocol::{A2a, Grpc, Http, Jsonrpc, Mcp};
    let timeout = LastResponse {
        timed_out: true,
        ..Default::default()
    };
    let error = LastResponse {
        error_type: "ConnectionReset".into(),
        ..Default::default()
    };
    vec![
        row(
            Http,
            "http://old.test/v1/orders",
            "GET",
            "",
            http(200),
            false,
            "ok",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "DELETE",
            "",
            http(405),
            true,
            "protocol_not_supported",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "DELETE",
            "",
            http(405),
            false,
            "unverified_refusal",
        ),
        row(
            Http,
            "http://old.test/v1/nope",
            "GET",
            "",
            http(404),
            true,
            "interface_not_declared",
        ),
        row(
            Http,
            "http://old.test/v1/nope",
            "GET",
            "",
            http(404),
            false,
            "unverified_refusal",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "GET",
            "",
            http(404),
            true,
            "ambiguous",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "POST",
            "",
            http(429),
            false,
            "throttled",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "POST",
            "",
            http(503),
            false,
            "transient",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "POST",
            "",
            http(400),
            false,
            "ambiguous",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "POST",
            "",
            timeout.clone(),
            false,
            "transient",
        ),
        row(
            Http,
            "http://old.test/v1/orders",
            "POST",
            "",
            error,
            false,
            "ambiguous",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "tools/list",
            jsonrpc(-32601),
            true,
            "protocol_not_supported",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "tools/list",
            jsonrpc(-32601),
            false,
            "unverified_refusal",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "tools/call",
            jsonrpc(-32602),
            false,
            "ambiguous",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "tools/call",
            jsonrpc(-32001),
            false,
            "transient",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "tools/call",
            timeout,
            false,
            "transient",
        ),
        row(
            A2a,
            "http://agent.test/a2a",
            "",
            "GetTask",
            jsonrpc(-32001),
            false,
            "ambiguous",
        ),
        row(
            A2a,
            "http://agent.test/a2a",
            "",
            "SubscribeToTask",
            jsonrpc(-32004),
            true,
            "protocol_not_supported",
        ),
        row(
            Mcp,
            "http://mcp.test/mcp",
            "",
            "initialize",
            jsonrpc(-32022),
            true,
            "protocol_not_supported",
        ),
        row(
            Jsonrpc,
            "http://rpc.test/",
            "",
            "sum",
            jsonrpc(-32601),
            false,
            "unverified_refusal",
        ),
        row(
            Grpc,
            "http://stock.test:50051",
            "",
            "inventory.v1.Stock/Get",
            grpc(0),
            false,
            "ok",
        ),
        row(
            Grpc,
            "http://stock.test:50051",
            "",
            "inventory.v1.Stock/Get",
            grpc(14),
            false,
            "transient",
        ),
        row(
            Grpc,
            "http://stock.test:50051",
            "",
            "inventory.v1.Stock/Get",
            grpc(8),
            false,
            "throttled",
        ),
        row(
            Grpc,
            "http://stock.test:50051",
            "",
            "inventory.v1.Stock/Get",
            grpc(12),
            false,
            "unverified_refusal",
        ),
        row(
            Grpc,
            "http://stock.test:50051",
            "",
            "inventory.v1.Stock/Get",
            grpc(3),
            false,
            "ambiguous",
        ),
    ]
}

/// The span of a row's call, at time slot `i`.
fn span_of(r: &Row, i: u64) -> Span {
    let mut span = common::http_span(i, r.http_method, r.url, 0);
    span.attributes.clear();
    let s = |k: &str, v: &str| kv(k, Value::StringValue(v.into()));
    let n = |k: &str, v: i64| kv(k, Value::IntValue(v));
    span.attributes.push(s("url.full", r.url));
    match r.protocol {
        Protocol::Http => span
            .attributes
            .push(s("http.request.method", r.http_method)),
        Protocol::Mcp => {
            span.attributes.push(s("http.request.method", "POST"));
            span.attributes.push(s("mcp.method.name", r.method));
        }
        Protocol::A2a => {
            span.attributes.push(s("http.request.method", "POST"));
            span.attributes.push(s("a2a.method.name", r.method));
        }
        Protocol::Jsonrpc => {
            span.attributes.push(s("http.request.method", "POST"));
            span.attributes.push(s("rpc.system", "jsonrpc"));
            span.attributes.push(s("rpc.method", r.method));
        }
        Protocol::Grpc | Protocol::Unspecified => {
            let (service, method) = r.method.rsplit_once('/').expect("service/method");
            span.attributes.push(s("rpc.system", "grpc"));
            span.attributes.push(s("rpc.service", service));
            span.attributes.push(s("rpc.method", method));
        }
    }
    let l = &r.response;
    if l.http_status != 0 {
        span.attributes
            .push(n("http.response.status_code", i64::from(l.http_status)));
    }
    if l.jsonrpc_code != 0 {
        span.attributes
            .push(n("rpc.jsonrpc.error_code", l.jsonrpc_code));
    }
    if l.has_grpc_code {
        span.attributes
            .push(n("rpc.grpc.status_code", i64::from(l.grpc_code)));
    }
    if l.timed_out {
        span.attributes.push(s("error.type", "timeout"));
    } else if !l.error_type.is_empty() {
        span.attributes.push(s("error.type", &l.error_type));
    }
    if l.timed_out || !l.error_type.is_empty() {
        span.status = Some(opentelemetry_proto::tonic::trace::v1::Status {
            code: 2,
            ..Default::default()
        });
    }
    span
}

/// A discovery read of the row's interface, at time slot `i`.
fn read_of(r: &Row, i: u64) -> Span {
    let origin = r.url.split('/').take(3).collect::<Vec<_>>().join("/");
    let document = match r.protocol {
        Protocol::Mcp => "/.well-known/mcp.json",
        _ => "/openapi.json",
    };
    common::http_span(i, "GET", &format!("{origin}{document}"), 200)
}

fn decide_request(r: &Row, client: &str) -> DecideRequest {
    DecideRequest {
        client: Some(Client {
            service_name: client.into(),
            service_instance_id: String::new(),
        }),
        protocol: r.protocol as i32,
        url: r.url.into(),
        http_method: r.http_method.into(),
        method: r.method.into(),
        last_response: Some(r.response.clone()),
        ..Default::default()
    }
}

/// The same request as the HTTP mirror's JSON.
fn decide_json(r: &DecideRequest) -> serde_json::Value {
    let protocol = match Protocol::try_from(r.protocol).expect("a protocol") {
        Protocol::Http => "http",
        Protocol::Mcp => "mcp",
        Protocol::A2a => "a2a",
        Protocol::Grpc => "grpc",
        Protocol::Jsonrpc => "jsonrpc",
        Protocol::Unspecified => "",
    };
    let mut json = serde_json::json!({
        "client": { "serviceName": r.client.as_ref().map(|c| c.service_name.clone()) },
        "protocol": protocol,
        "url": r.url,
        "httpMethod": r.http_method,
        "method": r.method,
    });
    if let Some(l) = &r.last_response {
        let mut last = serde_json::json!({
            "httpStatus": l.http_status,
            "jsonrpcCode": l.jsonrpc_code,
            "timedOut": l.timed_out,
            "errorType": l.error_type,
            "attempt": l.attempt,
        });
        if l.has_grpc_code {
            last["grpcCode"] = l.grpc_code.into();
        }
        if l.retry_after_ms != 0 {
            last["retryAfterMs"] = l.retry_after_ms.into();
        }
        json["lastResponse"] = last;
    }
    if r.observe {
        json["observe"] = true.into();
    }
    json
}

async fn gate(b: &Bound) -> RefusalGateClient<tonic::transport::Channel> {
    RefusalGateClient::connect(format!("http://{}", b.grpc))
        .await
        .expect("the gate answers")
}

async fn decide_http(b: &Bound, request: &DecideRequest) -> serde_json::Value {
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/decide", b.admin))
        .header("content-type", "application/json")
        .body(decide_json(request).to_string())
        .send()
        .await
        .expect("the mirror answers");
    assert_eq!(response.status(), 200);
    serde_json::from_str(&response.text().await.expect("a body")).expect("JSON")
}

/// The kind the tracker counted for `client`'s row attempt (its discovery read, when it
/// has one, is the only other attempt, and it is `ok`).
fn span_kind(m: &str, client: &str, read_first: bool) -> String {
    let counted: Vec<(String, f64)> = m
        .lines()
        .filter(|l| l.starts_with("refusal_gate_attempts_total{"))
        .filter(|l| l.contains(&format!("client=\"{client}\"")))
        .filter_map(|l| {
            let kind = l.split("kind=\"").nth(1)?.split('"').next()?.to_owned();
            let n: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((kind, n))
        })
        .collect();
    let others: Vec<&(String, f64)> = counted.iter().filter(|(k, _)| k != "ok").collect();
    match others.as_slice() {
        [] => {
            let ok = counted
                .iter()
                .find(|(k, _)| k == "ok")
                .map_or(0.0, |(_, n)| *n);
            assert_eq!(
                ok,
                if read_first { 2.0 } else { 1.0 },
                "{client}: {counted:?}"
            );
            "ok".into()
        }
        [(kind, n)] => {
            assert_eq!(*n, 1.0, "{client}: {counted:?}");
            kind.clone()
        }
        _ => panic!("{client}: more than one kind: {counted:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decide_answers_every_row_as_spans_are_classified() {
    let server = start(CONFIG).await;
    let b = server.bound;
    let rows = rows();
    // Spans: each row from its own client, after its discovery read when it has one.
    for (i, r) in rows.iter().enumerate() {
        let i = i as u64;
        let mut spans = Vec::new();
        if r.read_first {
            spans.push(read_of(r, 10 * i));
        }
        spans.push(span_of(r, 10 * i + 1));
        send(&b, export(&format!("span-{i}"), spans)).await;
        // The question's asker reads the same document first, when the row says so.
        if r.read_first {
            send(&b, export(&format!("ask-{i}"), vec![read_of(r, 10 * i)])).await;
        }
    }
    let m = scrape(&b).await;
    let mut client = gate(&b).await;
    for (i, r) in rows.iter().enumerate() {
        let span = span_kind(&m, &format!("span-{i}"), r.read_first);
        assert_eq!(span, r.kind, "row {i}: the span's kind");
        let request = decide_request(r, &format!("ask-{i}"));
        let over_grpc = client
            .decide(request.clone())
            .await
            .expect("decided")
            .into_inner();
        assert_eq!(over_grpc.kind, span, "row {i} over gRPC: {over_grpc:?}");
        let class = m
            .lines()
            .find(|l| {
                l.contains(&format!("client=\"span-{i}\""))
                    && l.contains(&format!("kind=\"{span}\""))
            })
            .and_then(|l| l.split("class=\"").nth(1)?.split('"').next())
            .expect("the span's class")
            .to_owned();
        assert_eq!(over_grpc.class, class, "row {i}: class");
        assert!(
            !over_grpc.observed,
            "a question is not an attempt unless asked"
        );
        let over_http = decide_http(&b, &request).await;
        assert_eq!(
            over_http["kind"],
            span.as_str(),
            "row {i} over HTTP: {over_http}"
        );
        assert_eq!(over_http["class"], class.as_str());
        assert_eq!(over_http["decision"], over_grpc.decision.as_str());
    }
    // Questions that were not observed left no attempt behind.
    let m = scrape(&b).await;
    assert!(rows
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.read_first)
        .all(|(i, _)| !m.contains(&format!("client=\"ask-{i}\""))));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_refusal_decide_routes_to_the_interface_that_declares_the_operation() {
    let server = start(CONFIG).await;
    let b = server.bound;
    // The agent reads legacy-api's document, then POSTs a path it does not declare: 404.
    send(
        &b,
        export(
            "shopper",
            vec![
                common::http_span(1, "GET", "http://old.test/openapi.json", 200),
                common::http_span(2, "POST", "http://old.test/v1/items", 404),
            ],
        ),
    )
    .await;
    scrape(&b).await;
    let request = DecideRequest {
        client: Some(Client {
            service_name: "shopper".into(),
            service_instance_id: String::new(),
        }),
        protocol: Protocol::Http as i32,
        url: "http://old.test/v1/items".into(),
        http_method: "POST".into(),
        ..Default::default()
    };
    let answer = gate(&b)
        .await
        .decide(request.clone())
        .await
        .expect("decided")
        .into_inner();
    assert_eq!(answer.decision, "route_elsewhere_or_abstain", "{answer:?}");
    assert_eq!(answer.kind, "interface_not_declared");
    assert_eq!(answer.interface, "legacy-api");
    assert_eq!(
        answer.alternatives,
        vec![proto::Alternative {
            interface: "catalog-v2".into(),
            url: "http://new.test/v1/items".into(),
            protocol: "http".into(),
        }]
    );
    let mirrored = decide_http(&b, &request).await;
    assert_eq!(mirrored["decision"], "route_elsewhere_or_abstain");
    assert_eq!(mirrored["alternatives"][0]["interface"], "catalog-v2");

    // A client that was never refused may proceed.
    let mut fresh = request;
    fresh.client = Some(Client {
        service_name: "newcomer".into(),
        service_instance_id: String::new(),
    });
    let answer = gate(&b)
        .await
        .decide(fresh.clone())
        .await
        .expect("decided")
        .into_inner();
    assert_eq!(answer.decision, "proceed");
    assert!(answer.alternatives.is_empty());

    // An agent that sends no spans has its calls counted when it says so.
    fresh.observe = true;
    fresh.last_response = Some(http(503));
    let answer = gate(&b)
        .await
        .decide(fresh)
        .await
        .expect("decided")
        .into_inner();
    assert!(answer.observed);
    assert_eq!(answer.decision, "retry_with_backoff");
    let m = scrape(&b).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "newcomer"), ("kind", "transient")]
        ),
        1.0
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_alerts_delivers_a_retry_after_refusal() {
    let server = start(CONFIG).await;
    let b = server.bound;
    let mut stream = gate(&b)
        .await
        .watch_alerts(WatchAlertsRequest {
            client: "retrier".into(),
            ..Default::default()
        })
        .await
        .expect("watching")
        .into_inner();
    let mut sse = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/alerts/stream?client=retrier&minSeverity=critical",
            b.admin
        ))
        .send()
        .await
        .expect("the mirror streams");
    assert_eq!(sse.status(), 200);

    // Another client's violation, which the filter keeps out.
    let retry = |who: &str, t: u64| {
        export(
            who,
            vec![
                common::http_span(t, "GET", "http://old.test/openapi.json", 200),
                common::http_span(t + 1, "POST", "http://old.test/v1/items", 404),
                common::http_span(t + 2, "POST", "http://old.test/v1/items", 404),
            ],
        )
    };
    send(&b, retry("someone-else", 1)).await;
    send(&b, retry("retrier", 10)).await;
    let m = scrape(&b).await; // settles: the verdicts are counted and the alerts raised
    assert_eq!(
        value(
            &m,
            "refusal_gate_violations_total",
            &[("client", "retrier"), ("violation", "retry_after_refusal")]
        ),
        1.0
    );

    let alert = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("an alert within 5 s")
        .expect("the stream is open")
        .expect("an alert");
    assert_eq!(alert.client, "retrier");
    assert_eq!(alert.alertname, "RetryAfterAuthoritativeRefusal");
    assert_eq!(alert.severity, "critical");
    assert_eq!(alert.violation, "retry_after_refusal");
    assert_eq!(alert.operation, "POST /v1/items");
    assert_eq!(alert.span_id, format!("{:016x}", 13));

    // The first chunk that is not a keep-alive comment (one a second) is the alert.
    let text = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let chunk = sse
                .chunk()
                .await
                .expect("the stream is open")
                .expect("a chunk");
            if !chunk.starts_with(b":") {
                break String::from_utf8_lossy(&chunk).into_owned();
            }
        }
    })
    .await
    .expect("an event within 5 s");
    assert!(text.starts_with("event: alert\n"), "{text}");
    assert!(text.contains("\"client\":\"retrier\""), "{text}");
    assert!(text.contains("\"alertname\":\"RetryAfterAuthoritativeRefusal\""));

    // Open watches end when the server stops — cleanly, with an OK status, rather than
    // being cut when the drain deadline passes — so they do not hold up its shutdown.
    server.shutdown().await;
    let end = tokio::time::timeout(Duration::from_secs(2), stream.message())
        .await
        .expect("the stream ends with the server");
    assert!(
        matches!(end, Ok(None)),
        "a clean end of the stream: {end:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_delay_sets_the_backoff_and_an_observed_early_retry_is_counted() {
    let server = start(CONFIG).await;
    let b = server.bound;
    let ask = |attempt: u32| DecideRequest {
        client: Some(Client {
            service_name: "throttled-agent".into(),
            service_instance_id: String::new(),
        }),
        protocol: Protocol::Http as i32,
        url: "http://old.test/v1/orders".into(),
        http_method: "POST".into(),
        last_response: Some(LastResponse {
            http_status: 429,
            attempt,
            retry_after_ms: 5_000,
            ..Default::default()
        }),
        observe: true,
        ..Default::default()
    };
    // A 429 that asked for five seconds: the backoff is five seconds, not our first one.
    let first = gate(&b)
        .await
        .decide(ask(1))
        .await
        .expect("decided")
        .into_inner();
    assert_eq!(
        (
            first.decision.as_str(),
            first.backoff_ms,
            first.retries_left
        ),
        ("retry_with_backoff", 5_000, 2),
        "{first:?}"
    );
    assert!(
        first
            .rule
            .ends_with("the server asked to wait 5000 ms (Retry-After)"),
        "{first:?}"
    );
    // The same over the mirror, asked at once: the observed call is a retry before the delay.
    let second = decide_http(&b, &ask(2)).await;
    assert_eq!(second["backoffMs"], 5_000, "{second}");
    assert_eq!(second["observed"], true, "{second}");
    let m = scrape(&b).await;
    assert_eq!(
        value(
            &m,
            "refusal_gate_violations_total",
            &[
                ("client", "throttled-agent"),
                ("violation", "retry_before_retry_after")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "throttled-agent"), ("class", "throttled")]
        ),
        2.0
    );
    server.shutdown().await;
}

/// A question naming an interface nobody configured is refused without the name: a name of a
/// megabyte does not come back as a megabyte over either transport (docs/hardening.md: names
/// not echoed in errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_interfaces_name_is_not_echoed() {
    let server = start(CONFIG).await;
    let b = server.bound;
    let name = "x".repeat(1 << 20);
    let request = DecideRequest {
        client: Some(Client {
            service_name: "asker".into(),
            service_instance_id: String::new(),
        }),
        protocol: Protocol::Http as i32,
        interface: name.clone(),
        http_method: "GET".into(),
        method: "/v1/orders".into(),
        ..Default::default()
    };
    let mut json = decide_json(&request);
    json["interface"] = name.clone().into();
    json.as_object_mut().expect("an object").remove("url");
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/decide", b.admin))
        .header("content-type", "application/json")
        .body(json.to_string())
        .send()
        .await
        .expect("the mirror answers");
    assert_eq!(response.status(), 400);
    let body = response.text().await.expect("a body");
    assert!(
        body.len() < 300,
        "{} bytes: {}",
        body.len(),
        &body[..200.min(body.len())]
    );
    assert!(body.contains("no interface of that name"), "{body}");
    let status = gate(&b).await.decide(request).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().len() < 300,
        "{} bytes of grpc-message",
        status.message().len()
    );
    assert!(status.message().contains(&format!("{} bytes", 1 << 20)));
}
