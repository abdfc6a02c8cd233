//! Tests of extraction: one table per fact of DESIGN §3 (families, URLs, codes, timeouts,
//! operations, the server's delay, gRPC's two conventions, discovery).

use super::*;
use crate::otlp::fixtures::{d, i, s, span, strings};
use opentelemetry_proto::tonic::trace::v1::span::Event;
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span, Status};

fn resource() -> Vec<KeyValue> {
    vec![s("service.name", "agent"), s("service.instance.id", "i-1")]
}

#[test]
fn families_are_recognised_in_order() {
    let r = resource();
    let cases = [
        (
            vec![
                s("mcp.method.name", "tools/call"),
                s("http.request.method", "POST"),
            ],
            Family::Mcp,
        ),
        (vec![s("a2a.method.name", "SendMessage")], Family::A2a),
        (vec![s("rpc.system", "jsonrpc")], Family::JsonRpc),
        (vec![s("rpc.system.name", "jsonrpc")], Family::JsonRpc),
        (vec![s("rpc.system", "grpc")], Family::Grpc),
        (vec![s("http.request.method", "GET")], Family::Http),
        (vec![s("http.method", "GET")], Family::Http),
    ];
    for (attrs, family) in cases {
        let sp = span("x", attrs);
        assert_eq!(
            extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
                .expect("attempt")
                .family,
            family
        );
    }
    let none = span("x", vec![s("db.system", "postgresql")]);
    assert_eq!(
        extract(client_of(&r), &&none, DEFAULT_MAX_ATTRIBUTES),
        Err(Skip::NoProtocol)
    );
    let mut server = span("x", vec![s("http.request.method", "GET")]);
    server.kind = SpanKind::Server as i32;
    assert_eq!(
        extract(client_of(&r), &&server, DEFAULT_MAX_ATTRIBUTES),
        Err(Skip::NotClient)
    );
}

#[test]
fn urls_come_from_full_urls_or_their_parts() {
    let r = resource();
    let cases = [
        (
            vec![s("url.full", "http://Api.test:80/v1/x?q=1")],
            Some("http://api.test"),
            Some("/v1/x"),
        ),
        (
            vec![s("http.url", "https://api.test:8443/y")],
            Some("https://api.test:8443"),
            Some("/y"),
        ),
        (
            vec![
                s("url.scheme", "https"),
                s("server.address", "api.test"),
                i("server.port", 443),
                s("url.path", "/z"),
            ],
            Some("https://api.test"),
            Some("/z"),
        ),
        (
            vec![
                s("http.scheme", "http"),
                s("net.peer.name", "api.test"),
                i("net.peer.port", 8080),
                s("http.target", "/t?x"),
            ],
            Some("http://api.test:8080"),
            Some("/t"),
        ),
        (
            vec![s("server.address", "mcp.test"), i("server.port", 8080)],
            Some("http://mcp.test:8080"),
            None,
        ),
        (
            vec![s("server.address", "mcp.test"), i("server.port", 443)],
            Some("https://mcp.test"),
            None,
        ),
        (vec![s("url.path", "/only")], None, Some("/only")),
    ];
    for (mut attrs, origin, path) in cases {
        attrs.push(s("http.request.method", "GET"));
        let sp = span("x", attrs);
        let a = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
        assert_eq!(a.origin.as_ref().map(Origin::as_str), origin);
        assert_eq!(a.path, path);
    }
}

#[test]
fn codes_are_read_by_family() {
    let r = resource();
    let cases: Vec<(Vec<KeyValue>, Signal)> = vec![
        (
            vec![
                s("http.request.method", "GET"),
                i("http.response.status_code", 404),
            ],
            Signal {
                http_status: Some(404),
                ..Default::default()
            },
        ),
        (
            vec![s("http.method", "GET"), s("http.status_code", "503")],
            Signal {
                http_status: Some(503),
                ..Default::default()
            },
        ),
        (
            vec![
                s("rpc.system", "jsonrpc"),
                i("rpc.jsonrpc.error_code", -32601),
            ],
            Signal {
                jsonrpc_code: Some(-32601),
                ..Default::default()
            },
        ),
        (
            vec![
                s("mcp.method.name", "x"),
                s("rpc.response.status_code", "-32602"),
            ],
            Signal {
                jsonrpc_code: Some(-32602),
                ..Default::default()
            },
        ),
        (
            vec![s("a2a.method.name", "x"), s("rpc.status_code", "-32001")],
            Signal {
                jsonrpc_code: Some(-32001),
                ..Default::default()
            },
        ),
        (
            vec![s("mcp.method.name", "x"), s("error.type", "-32601")],
            Signal {
                jsonrpc_code: Some(-32601),
                error_type: Some("-32601"),
                ..Default::default()
            },
        ),
        (
            vec![s("http.request.method", "GET"), s("error.type", "-32601")],
            Signal {
                error_type: Some("-32601"),
                ..Default::default()
            },
        ),
        (
            vec![s("rpc.system", "grpc"), i("rpc.grpc.status_code", 12)],
            Signal {
                grpc_code: Some(12),
                ..Default::default()
            },
        ),
        (
            vec![
                s("rpc.system", "grpc"),
                s("rpc.response.status_code", "UNAVAILABLE"),
            ],
            Signal {
                grpc_code: Some(14),
                ..Default::default()
            },
        ),
        (
            vec![s("rpc.system.name", "grpc"), s("rpc.status_code", "8")],
            Signal {
                grpc_code: Some(8),
                ..Default::default()
            },
        ),
        (
            vec![
                s("http.request.method", "GET"),
                s("error.type", "java.net.SocketTimeoutException"),
            ],
            Signal {
                timeout: Some("java.net.SocketTimeoutException"),
                error_type: Some("java.net.SocketTimeoutException"),
                ..Default::default()
            },
        ),
    ];
    for (attrs, want) in cases {
        let sp = span("x", attrs.clone());
        assert_eq!(
            extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
                .expect("attempt")
                .signal,
            want,
            "{attrs:?}"
        );
    }
}

#[test]
fn timeouts_come_from_exception_events_and_status_is_read() {
    let r = resource();
    let mut sp = span("x", vec![s("http.method", "GET")]);
    sp.events.push(Event {
        name: "exception".into(),
        attributes: vec![s("exception.type", "httpx.ReadTimeout")],
        ..Default::default()
    });
    sp.status = Some(Status {
        code: StatusCode::Error as i32,
        message: String::new(),
    });
    let a = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
    assert_eq!(a.signal.timeout, Some("httpx.ReadTimeout"));
    assert!(a.signal.status_error);
}

#[test]
fn operations_and_clients() {
    let r = resource();
    let cases = [
        (
            span(
                "POST",
                vec![
                    s("http.request.method", "POST"),
                    s("url.full", "http://h/a?b"),
                ],
            ),
            "POST /a",
        ),
        (
            span(
                "MCP send tools/call get_weather",
                vec![s("mcp.method.name", "tools/call")],
            ),
            "tools/call get_weather",
        ),
        (
            span(
                "x",
                vec![
                    s("mcp.method.name", "tools/call"),
                    s("gen_ai.tool.name", "lookup"),
                ],
            ),
            "tools/call lookup",
        ),
        (
            span(
                "x",
                vec![
                    s("mcp.method.name", "prompts/get"),
                    s("gen_ai.prompt.name", "p"),
                ],
            ),
            "prompts/get p",
        ),
        (
            span(
                "x",
                vec![
                    s("mcp.method.name", "resources/read"),
                    s("mcp.resource.uri", "file:///a"),
                ],
            ),
            "resources/read file:///a",
        ),
        (
            span("x", vec![s("mcp.method.name", "initialize")]),
            "initialize",
        ),
        (
            span(
                "x",
                vec![
                    s("rpc.system", "grpc"),
                    s("rpc.service", "pkg.Svc"),
                    s("rpc.method", "Get"),
                ],
            ),
            "pkg.Svc/Get",
        ),
        (
            span(
                "x",
                vec![s("rpc.system", "jsonrpc"), s("rpc.method", "eth_call")],
            ),
            "eth_call",
        ),
    ];
    for (sp, want) in cases {
        assert_eq!(
            extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
                .expect("attempt")
                .operation
                .to_string(),
            want
        );
    }
    let sp = span("x", vec![s("http.method", "GET")]);
    let a = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
    assert_eq!(
        a.client,
        Client {
            name: "agent",
            instance: Some("i-1")
        }
    );
    let a = extract(client_of(&[]), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
    assert_eq!(a.client.name, "unknown_service");
}

#[test]
fn the_server_delay_is_read_from_a_captured_header() {
    let r = resource();
    let delay = |attrs: Vec<KeyValue>| {
        let mut attrs = attrs;
        attrs.push(s("http.request.method", "POST"));
        let sp = span("x", attrs);
        extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .signal
            .retry_after
    };
    const S: u64 = 1_000_000_000;
    assert_eq!(
        delay(vec![strings(
            "http.response.header.retry-after",
            &["3", "9"]
        )]),
        Some(3 * S),
        "the first value of the array"
    );
    assert_eq!(
        delay(vec![strings("http.response.header.retry_after", &["4"])]),
        Some(4 * S),
        "Python's older instrumentations"
    );
    assert_eq!(
        delay(vec![
            strings("http.response.header.retry_after", &["4"]),
            strings("http.response.header.retry-after", &["5"]),
        ]),
        Some(5 * S),
        "the stable name wins"
    );
    assert_eq!(
        delay(vec![s("http.response.header.retry-after", "6")]),
        Some(6 * S)
    );
    assert_eq!(
        delay(vec![i("http.response.header.retry-after", 7)]),
        Some(7 * S)
    );
    assert_eq!(
        delay(vec![strings("http.response.header.retry-after", &[])]),
        None
    );
    assert_eq!(delay(vec![]), None);
}

#[test]
fn grpc_operations_read_both_conventions_alike() {
    let r = resource();
    let op = |attrs: Vec<KeyValue>, name: &str| {
        let mut attrs = attrs;
        attrs.push(s("rpc.system", "grpc"));
        let sp = span(name, attrs);
        let a = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
        let mut room = None;
        let parts = (a.operation.verb.to_owned(), a.operation.target.to_owned());
        (
            parts,
            a.operation.to_string(),
            a.path_or_grpc(&mut room).map(str::to_owned),
        )
    };
    let split = ("pkg.Svc".to_owned(), "Get".to_owned());
    let path = Some("/pkg.Svc/Get".to_owned());
    let cases = [
        (
            vec![s("rpc.service", "pkg.Svc"), s("rpc.method", "Get")],
            "x",
        ),
        (vec![s("rpc.method", "pkg.Svc/Get")], "x"),
        (vec![s("rpc.method", "/pkg.Svc/Get")], "x"),
        (
            vec![s("rpc.service", "pkg.Svc"), s("rpc.method", "/pkg.Svc/Get")],
            "x",
        ),
        (
            vec![
                s("rpc.service", "other.Svc"),
                s("rpc.method", "pkg.Svc/Get"),
            ],
            "x",
        ),
        (
            vec![s("rpc.service", "pkg.Svc"), s("rpc.method", "pkg.Svc/Get")],
            "x",
        ),
        (vec![], "pkg.Svc/Get"),
    ];
    for (attrs, name) in cases {
        assert_eq!(
            op(attrs.clone(), name),
            (split.clone(), "pkg.Svc/Get".to_owned(), path.clone()),
            "{attrs:?} {name}"
        );
    }
    let (_, shown, path) = op(vec![s("rpc.method", "Get")], "x");
    assert_eq!((shown.as_str(), path), ("Get", None));
    // A URL path, when the span has one, is the path.
    let (_, _, path) = op(
        vec![s("rpc.method", "pkg.Svc/Get"), s("url.path", "/custom")],
        "x",
    );
    assert_eq!(path.as_deref(), Some("/custom"));
    let long = format!("pkg.{}/Get", "S".repeat(GrpcPath::MAX));
    let (_, _, path) = op(vec![s("rpc.method", &long)], "x");
    assert_eq!(path, None, "too long to build: no path");
}

#[test]
fn a_scheme_on_the_span_names_a_server_on_a_port_of_its_own() {
    // Only `url.scheme` or `http.scheme` can say that port 8443 speaks https; the stable name
    // first.
    let r = resource();
    let cases = [
        (vec![s("url.scheme", "https")], "https://api.test:8443"),
        (vec![s("http.scheme", "https")], "https://api.test:8443"),
        (
            vec![s("http.scheme", "http"), s("url.scheme", "https")],
            "https://api.test:8443",
        ),
        (vec![], "http://api.test:8443"),
    ];
    for (mut attrs, want) in cases {
        attrs.extend([
            s("server.address", "api.test"),
            i("server.port", 8443),
            s("http.request.method", "GET"),
        ]);
        let sp = span("x", attrs.clone());
        let a = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES).expect("attempt");
        assert_eq!(
            a.origin.as_ref().map(Origin::as_str),
            Some(want),
            "{attrs:?}"
        );
    }
}

#[test]
fn codes_sent_as_integral_doubles_are_read_and_fractions_are_not() {
    let r = resource();
    let read = |attrs: Vec<KeyValue>| {
        let sp = span("x", attrs);
        let signal = extract(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .signal;
        Signal {
            timeout: None,
            error_type: None,
            ..signal
        }
    };
    let http = read(vec![
        s("http.request.method", "GET"),
        d("http.response.status_code", 404.0),
    ]);
    assert_eq!(http.http_status, Some(404));
    let half = read(vec![
        s("http.request.method", "GET"),
        d("http.response.status_code", 404.5),
    ]);
    assert_eq!(half.http_status, None);
    let rpc = read(vec![
        s("mcp.method.name", "tools/list"),
        d("rpc.jsonrpc.error_code", -32601.0),
    ]);
    assert_eq!(rpc.jsonrpc_code, Some(-32601));
    let grpc = read(vec![
        s("rpc.system", "grpc"),
        d("rpc.grpc.status_code", 12.0),
    ]);
    assert_eq!(grpc.grpc_code, Some(12));
}

#[test]
fn a_span_tagged_by_an_upstream_refusal_gate_is_known() {
    let r = resource();
    let tagged = span(
        "x",
        vec![
            s("http.request.method", "GET"),
            s("refusal_gate.class", "ok"),
        ],
    );
    let plain = span("x", vec![s("http.request.method", "GET")]);
    let a = |sp: &Span| {
        extract(client_of(&r), &sp, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .tagged
    };
    assert!(a(&tagged));
    assert!(!a(&plain));
}

fn server_span(attributes: Vec<KeyValue>) -> Span {
    let mut sp = span("x", attributes);
    sp.kind = SpanKind::Server as i32;
    sp
}

#[test]
fn a_server_spans_instance_is_its_peer_address_under_any_convention() {
    let from = ["user_agent.original".to_owned()];
    let instance = |attrs: Vec<KeyValue>| {
        let mut attrs = attrs;
        attrs.push(s("user_agent.original", "prober/1.0"));
        let sp = server_span(attrs);
        server_client(&&sp, &from, DEFAULT_MAX_ATTRIBUTES)
            .0
            .instance
            .map(str::to_owned)
    };
    let ip = |n: u8| Some(format!("10.0.0.{n}"));
    assert_eq!(instance(vec![s("client.address", "10.0.0.1")]), ip(1));
    assert_eq!(instance(vec![s("net.sock.peer.addr", "10.0.0.2")]), ip(2));
    assert_eq!(instance(vec![s("net.peer.ip", "10.0.0.3")]), ip(3));
    assert_eq!(instance(vec![]), None);
    // The stable name first, then the older ones in turn.
    let all = vec![
        s("net.peer.ip", "10.0.0.3"),
        s("net.sock.peer.addr", "10.0.0.2"),
        s("client.address", "10.0.0.1"),
    ];
    assert_eq!(instance(all.clone()), ip(1));
    assert_eq!(instance(all[..2].to_vec()), ip(2));
}

#[test]
fn a_server_span_without_a_path_takes_its_route() {
    let r = resource();
    let route = |attrs: Vec<KeyValue>| {
        let mut attrs = attrs;
        attrs.extend([
            s("http.request.method", "GET"),
            s("http.route", "/users/{id}"),
        ]);
        let sp = server_span(attrs.clone());
        let server = extract_server(client_of(&r), &&sp, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .path
            .map(str::to_owned);
        let mut client = sp.clone();
        client.kind = SpanKind::Client as i32;
        let client = extract(client_of(&r), &&client, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .path
            .map(str::to_owned);
        (server, client)
    };
    let some = |p: &str| Some(p.to_owned());
    assert_eq!(route(vec![]), (some("/users/{id}"), None));
    assert_eq!(
        route(vec![s("url.path", "/users/7")]),
        (some("/users/7"), some("/users/7"))
    );
}

#[test]
fn a_protocol_span_that_gives_its_error_in_words_carries_its_code() {
    // DESIGN §11.4: the standard messages, without regard to case, after an optional
    // `Name: ` prefix; from the status description, else an exception event's message.
    let cases: [(&str, Option<i64>); 9] = [
        ("Parse error", Some(-32700)),
        ("invalid request", Some(-32600)),
        ("McpError: Method not found", Some(-32601)),
        (
            "mcp.shared.exceptions.McpError: Invalid params",
            Some(-32602),
        ),
        (" Internal error ", Some(-32603)),
        ("Method not found for prompt p", None),
        ("Not Found", None),
        ("an error: Method not found", None),
        ("", None),
    ];
    for (message, want) in cases {
        assert_eq!(standard_code(message), want, "{message:?}");
    }
    let r = resource();
    let read = |sp: &Span, server: bool| {
        let a = if server {
            extract_server(client_of(&r), &sp, DEFAULT_MAX_ATTRIBUTES)
        } else {
            extract(client_of(&r), &sp, DEFAULT_MAX_ATTRIBUTES)
        };
        a.expect("attempt").signal.jsonrpc_code
    };
    let mut status = span("x", vec![s("mcp.method.name", "tools/list")]);
    status.status = Some(Status {
        code: StatusCode::Error as i32,
        message: "McpError: Method not found".into(),
    });
    assert_eq!(read(&status, false), Some(-32601));
    let mut event = span("x", vec![s("a2a.method.name", "SendMessage")]);
    event.events.push(Event {
        name: "exception".into(),
        attributes: vec![
            s("exception.type", "A2AError"),
            s("exception.message", "Invalid params"),
        ],
        ..Default::default()
    });
    assert_eq!(read(&event, false), Some(-32602));
    event.kind = SpanKind::Server as i32;
    assert_eq!(read(&event, true), Some(-32602), "a server span too");
    // A numeric code wins; an HTTP span's words mean nothing.
    let mut coded = status.clone();
    coded
        .attributes
        .push(s("rpc.response.status_code", "-32602"));
    assert_eq!(read(&coded, false), Some(-32602));
    let mut http = status.clone();
    http.attributes = vec![s("http.request.method", "POST")];
    assert_eq!(read(&http, false), None);
}

#[test]
fn what_a_failed_spans_words_say_is_read_from_its_status_events_and_error_type() {
    // DESIGN §12.3, §12.5: A2A's reasons in any binding; MCP's unknown tools and gone
    // sessions; an A2A integer error.type from 100 to 599 is an HTTP status.
    let r = resource();
    let read = |sp: &Span| {
        let signal = extract(client_of(&r), &sp, DEFAULT_MAX_ATTRIBUTES)
            .expect("attempt")
            .signal;
        (signal.said, signal.http_status, signal.jsonrpc_code)
    };
    let failed = |attributes, message: &str| {
        let mut sp = span("x", attributes);
        sp.status = Some(Status {
            code: StatusCode::Error as i32,
            message: message.into(),
        });
        sp
    };
    let grpc = failed(
        vec![s("rpc.system", "grpc"), i("rpc.grpc.status_code", 9)],
        "UNSUPPORTED_OPERATION: streaming is not offered",
    );
    assert_eq!(read(&grpc).0, Said::NotSupported);
    let mut quiet = grpc.clone();
    quiet.status = None;
    assert_eq!(read(&quiet).0, Said::Nothing, "no words, nothing said");
    let a2a = span(
        "x",
        vec![
            s("a2a.method.name", "CreateTaskPushNotificationConfig"),
            s("error.type", "PushNotificationNotSupportedError"),
        ],
    );
    assert_eq!(read(&a2a).0, Said::NotSupported);
    let mut unknown = failed(
        vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "v0"),
        ],
        "",
    );
    unknown.attributes.push(s("error.type", "-32602"));
    unknown.events.push(Event {
        name: "exception".into(),
        attributes: vec![s("exception.message", "Unknown tool: v0")],
        ..Default::default()
    });
    assert_eq!(read(&unknown).0, Said::UnknownOperation);
    let gone = failed(
        vec![
            s("mcp.method.name", "tools/call"),
            s("error.type", "-32600"),
        ],
        "Session not found",
    );
    assert_eq!(read(&gone).0, Said::SessionGone);
    let resource_gone = span(
        "x",
        vec![
            s("mcp.method.name", "resources/read"),
            s("error.type", "-32002"),
        ],
    );
    assert_eq!(read(&resource_gone).0, Said::UnknownOperation);
    let ok = span(
        "x",
        vec![
            s("mcp.method.name", "tools/call"),
            s("gen_ai.tool.name", "unknown tool"),
        ],
    );
    assert_eq!(read(&ok).0, Said::Nothing, "a span that did not fail");
    let status = span(
        "x",
        vec![s("a2a.method.name", "GetTask"), s("error.type", "503")],
    );
    assert_eq!(read(&status), (Said::Nothing, Some(503), None));
    let code = span(
        "x",
        vec![s("a2a.method.name", "GetTask"), s("error.type", "-32001")],
    );
    assert_eq!(read(&code).2, Some(-32001));
    assert_eq!(read(&code).1, None);
    let mcp = span(
        "x",
        vec![s("mcp.method.name", "tools/call"), s("error.type", "503")],
    );
    assert_eq!(read(&mcp).2, Some(503), "only on a2a spans");
}

#[test]
fn an_internal_span_with_a_protocol_method_is_an_attempt_and_no_other_is() {
    // DESIGN §12.5: an `execute_tool` span an MCP instrumentation gave its attributes.
    let r = resource();
    let internal = |attrs| {
        let mut sp = span("execute_tool weather", attrs);
        sp.kind = SpanKind::Internal as i32;
        sp
    };
    let tool = internal(vec![
        s("gen_ai.operation.name", "execute_tool"),
        s("mcp.method.name", "tools/call"),
        s("gen_ai.tool.name", "weather"),
    ]);
    let a = extract(client_of(&r), &&tool, DEFAULT_MAX_ATTRIBUTES).expect("an attempt");
    assert_eq!(
        (a.family, a.operation.verb, a.operation.target),
        (Family::Mcp, "tools/call", "weather")
    );
    let a2a = internal(vec![s("a2a.method.name", "SendMessage")]);
    assert_eq!(
        extract(client_of(&r), &&a2a, DEFAULT_MAX_ATTRIBUTES).map(|a| a.family),
        Ok(Family::A2a)
    );
    for attrs in [
        vec![s("gen_ai.operation.name", "invoke_agent")],
        vec![s("rpc.system", "jsonrpc"), s("rpc.method", "x")],
        vec![s("http.request.method", "GET")],
    ] {
        let other = internal(attrs);
        assert_eq!(
            extract(client_of(&r), &&other, DEFAULT_MAX_ATTRIBUTES),
            Err(Skip::NotClient)
        );
    }
}

#[test]
fn a_fingerprint_is_of_the_bytes_as_they_came_whatever_they_hold() {
    let basis = FNV_BASIS;
    // The same text, checked or not, is the same fingerprint.
    assert_eq!(
        fingerprint(Val::Raw(b"{\"q\":1}"), basis),
        fingerprint(Val::Str("{\"q\":1}"), basis)
    );
    assert_ne!(
        fingerprint(Val::Raw(b"{\"q\":1}"), basis),
        fingerprint(Val::Raw(b"{\"q\":2}"), basis)
    );
    // Bytes that are no UTF-8 still tell two requests apart: only their sameness matters.
    let broken = fingerprint(Val::Raw(b"\xff\xfe1"), basis);
    assert_ne!(broken, 0);
    assert_ne!(broken, fingerprint(Val::Raw(b"\xff\xfe2"), basis));
    assert_eq!(
        fingerprint(Val::Int(7), basis),
        fnv(basis, &7i64.to_le_bytes()).max(1)
    );
    assert_eq!(
        fingerprint(Val::Bool(true), basis),
        0,
        "no string or integer"
    );
}
