//! Tests of call assembly (DESIGN §11): the links, each merge rule, and the call trees the
//! real stacks record (FastMCP, the MCP SDK with the httpx instrumentation, an observed server).

use super::*;
use crate::extract::{Client, Said, UNKNOWN_CLIENT};
use crate::url::Origin;

const AGENT: Client<'static> = Client {
    name: "agent",
    instance: Some("pod-1"),
};

/// A client span of `family`; `verb target` its operation.
fn span(family: Family, verb: &'static str, target: &'static str) -> Attempt<'static> {
    sample(family, AGENT, verb, target)
}

fn mcp(verb: &'static str, target: &'static str) -> Attempt<'static> {
    span(Family::Mcp, verb, target)
}

/// An HTTP request to `path` on the MCP server, answered `status`.
fn post(path: &'static str, status: u16) -> Attempt<'static> {
    Attempt {
        origin: Origin::new("http", "mcp.test", Some(8080)),
        path: Some(path),
        http_method: Some("POST"),
        operation: Operation::new("POST", path, false),
        signal: Signal {
            http_status: Some(status),
            status_error: status >= 400,
            ..Signal::default()
        },
        ..span(Family::Http, "POST", path)
    }
}

fn client(attempt: Attempt<'static>) -> Member<'static> {
    Member {
        attempt,
        side: Side::Client,
        named: false,
    }
}

fn server(attempt: Attempt<'static>, named: bool) -> Member<'static> {
    Member {
        attempt: Attempt {
            client: if named {
                Client {
                    name: "prober/1.0",
                    instance: None,
                }
            } else {
                Client {
                    name: crate::extract::UNKNOWN_CLIENT,
                    instance: None,
                }
            },
            ..attempt
        },
        side: Side::Server(2),
        named,
    }
}

fn at(a: Attempt<'static>, start: u64, end: u64) -> Attempt<'static> {
    Attempt { start, end, ..a }
}

fn parent(p: usize, link: Link) -> Joined {
    Joined {
        parent: Some((p, link)),
        carrier: None,
    }
}

const ROOT: Joined = Joined {
    parent: None,
    carrier: None,
};

fn never_undeclared(_: &Attempt<'_>) -> bool {
    false
}

/// The attempts of a call, each with its interface, in member order.
fn attempts<'a>(calls: &Calls<'a>) -> Vec<(usize, Attempt<'a>, Option<usize>)> {
    (0..calls.roles.len())
        .filter_map(|i| {
            let a = calls.attempt(i)?;
            Some((i, a.attempt.clone(), a.interface))
        })
        .collect()
}

#[test]
fn links_join_only_the_spans_of_one_call() {
    let sdk = client(mcp("tools/call", "lookup"));
    let http = client(post("/mcp", 200));
    let other = Member {
        attempt: Attempt {
            client: Client {
                name: "other",
                instance: None,
            },
            ..post("/mcp", 200)
        },
        ..http.clone()
    };
    let cases = [
        (&http, &sdk, Some(Link::Transport)),
        (&other, &sdk, None), // another client
        (&http, &http, None), // HTTP under HTTP
        (
            &client(mcp("tools/call", "lookup")),
            &sdk,
            Some(Link::Nested),
        ),
        (&client(mcp("tools/call", "other")), &sdk, None),
        (
            &client(span(Family::A2a, "tools/call", "lookup")),
            &sdk,
            None,
        ),
        (
            &sdk,
            &client(span(Family::Grpc, "tools/call", "lookup")),
            None,
        ),
        (
            &client(span(Family::Grpc, "pkg.S", "M")),
            &client(span(Family::Grpc, "pkg.S", "M")),
            Some(Link::Nested),
        ),
        (
            &server(mcp("tools/call", "lookup"), false),
            &http,
            Some(Link::ServerOf),
        ),
        (
            &server(mcp("tools/call", "lookup"), false),
            &sdk,
            Some(Link::ServerOf),
        ),
        (
            &server(mcp("tools/call", "lookup"), false),
            &server(post("/mcp", 200), true),
            Some(Link::Carried),
        ),
        (
            &server(post("/mcp", 200), true),
            &server(mcp("x", ""), false),
            None,
        ),
        (&sdk, &server(post("/mcp", 200), true), None),
    ];
    for (i, (child, parent, want)) in cases.into_iter().enumerate() {
        assert_eq!(link(child, parent), want, "case {i}");
    }
    let mut elsewhere = server(post("/mcp", 200), true);
    elsewhere.side = Side::Server(3);
    assert_eq!(link(&server(mcp("x", ""), false), &elsewhere), None);
    // DESIGN §12.4: under an MCP call only a POST carries it; the stream's GET and a
    // session's DELETE are the transport's own. Under A2A any method does.
    let with_method = |m: &'static str| {
        client(Attempt {
            http_method: Some(m),
            ..post("/mcp", 405)
        })
    };
    assert_eq!(link(&with_method("GET"), &sdk), None);
    assert_eq!(link(&with_method("DELETE"), &sdk), None);
    assert_eq!(link(&with_method("post"), &sdk), Some(Link::Transport));
    let no_method = client(Attempt {
        http_method: None,
        ..post("/mcp", 200)
    });
    assert_eq!(link(&no_method, &sdk), Some(Link::Transport));
    let a2a = client(span(Family::A2a, "SendMessage", ""));
    assert_eq!(link(&with_method("GET"), &a2a), Some(Link::Transport));
}

#[test]
fn nested_spans_take_the_inner_facts_else_the_outer_and_fail_when_either_does() {
    let outer = Attempt {
        origin: Origin::new("http", "outer.test", None),
        path: Some("/outer"),
        http_method: Some("POST"),
        signal: Signal {
            error_type: Some("tool_error"),
            jsonrpc_code: Some(-32602),
            status_error: true,
            retry_after: Some(5),
            ..Signal::default()
        },
        ..mcp("tools/call", "lookup")
    };
    let inner = Attempt {
        span_id: &[2; 8],
        start: 110,
        ..mcp("tools/call", "lookup")
    };
    let call = nest(&outer, &inner);
    assert_eq!(call.signal.error_type, Some("tool_error"));
    assert_eq!(call.signal.jsonrpc_code, Some(-32602));
    assert!(call.signal.status_error);
    assert_eq!(call.signal.retry_after, Some(5));
    assert_eq!(
        call.origin.as_ref().map(Origin::as_str),
        Some("http://outer.test")
    );
    assert_eq!(call.path, Some("/outer"));
    assert_eq!(call.http_method, Some("POST"), "the outer's method");
    assert_eq!(
        (call.span_id, call.start),
        (&[2u8; 8][..], 110),
        "the inner span"
    );
    let inner_says = Attempt {
        origin: Origin::new("http", "inner.test", None),
        path: Some("/inner"),
        signal: Signal {
            error_type: Some("McpError"),
            jsonrpc_code: Some(-32601),
            http_status: Some(200),
            grpc_code: Some(3),
            timeout: Some("ReadTimeout"),
            ..Signal::default()
        },
        ..inner
    };
    let outer_says = Attempt {
        signal: Signal {
            http_status: Some(500),
            grpc_code: Some(14),
            timeout: Some("Deadline"),
            ..outer.signal
        },
        ..outer
    };
    let call = nest(&outer_says, &inner_says);
    assert_eq!(call.signal.error_type, Some("McpError"));
    assert_eq!(call.signal.jsonrpc_code, Some(-32601));
    assert_eq!(call.signal.http_status, Some(200));
    assert_eq!(call.signal.grpc_code, Some(3));
    assert_eq!(call.signal.timeout, Some("ReadTimeout"));
    assert_eq!(
        call.origin.as_ref().map(Origin::as_str),
        Some("http://inner.test")
    );
    assert_eq!(call.path, Some("/inner"));
    let both_fine = nest(&mcp("x", ""), &mcp("x", ""));
    assert!(!both_fine.signal.status_error);
}

#[test]
fn a_transport_request_is_an_attempt_of_its_calls_operation_and_the_last_carries_its_code() {
    let call = Attempt {
        signal: Signal {
            jsonrpc_code: Some(-32602),
            error_type: Some("-32602"),
            status_error: true,
            ..Signal::default()
        },
        ..mcp("tools/call", "lookup")
    };
    let request = Attempt {
        signal: Signal {
            retry_after: Some(7),
            timeout: Some("ReadTimeout"),
            ..post("/mcp", 503).signal
        },
        ..post("/mcp", 503)
    };
    let first = transport(&call, &request, false, false);
    assert_eq!(first.family, Family::Mcp);
    assert_eq!(
        first.operation,
        Operation::new("tools/call", "lookup", false)
    );
    assert_eq!(first.path, Some("/mcp"));
    assert_eq!(first.http_method, Some("POST"));
    assert_eq!(
        first.origin.as_ref().map(Origin::as_str),
        Some("http://mcp.test:8080")
    );
    assert_eq!(first.signal.http_status, Some(503));
    assert_eq!(first.signal.retry_after, Some(7));
    assert_eq!(first.signal.timeout, Some("ReadTimeout"));
    assert_eq!(first.signal.jsonrpc_code, None, "not the last");
    assert_eq!(first.signal.error_type, None);
    assert!(first.signal.status_error, "its own 503");
    let ok = post("/mcp", 200);
    let last = transport(&call, &ok, true, false);
    assert_eq!(last.signal.timeout, None);
    // The call timed out (its `error.type`) over a request answered 200: the last request
    // carries the timeout; an earlier one does not.
    let timed_out = Attempt {
        signal: Signal {
            timeout: Some("TimeoutError"),
            error_type: Some("TimeoutError"),
            status_error: true,
            ..Signal::default()
        },
        ..mcp("tools/call", "lookup")
    };
    let carried = transport(&timed_out, &ok, true, false);
    assert_eq!(carried.signal.timeout, Some("TimeoutError"));
    assert_eq!(carried.signal.error_type, Some("TimeoutError"));
    assert_eq!(
        transport(&timed_out, &ok, false, false).signal.timeout,
        None
    );
    assert_eq!(
        transport(&timed_out, &request, true, false).signal.timeout,
        Some("ReadTimeout"),
        "the request's own timeout first"
    );
    assert_eq!(last.signal.jsonrpc_code, Some(-32602));
    assert_eq!(last.signal.error_type, Some("-32602"));
    assert!(last.signal.status_error);
    assert!(
        !transport(&mcp("x", ""), &ok, true, false)
            .signal
            .status_error
    );
    // To an undeclared path: the path is part of the operation, and a 404 answers it.
    let refused = Attempt {
        signal: Signal {
            jsonrpc_code: Some(-32601),
            ..call.signal
        },
        ..call
    };
    let wrong = transport(&refused, &post("/mcp/sse", 404), true, true);
    assert_eq!(wrong.operation.via, "/mcp/sse");
    assert_eq!(wrong.operation.to_string(), "tools/call lookup /mcp/sse");
    assert_eq!(wrong.signal.jsonrpc_code, None);
    assert_eq!(wrong.signal.http_status, Some(404));
    let answered = transport(&refused, &post("/mcp/sse", 200), true, true);
    assert_eq!(answered.signal.jsonrpc_code, Some(-32601), "not a 404");
    let declared = transport(&refused, &post("/mcp", 404), true, false);
    assert_eq!(declared.operation.via, "");
    assert_eq!(declared.signal.jsonrpc_code, Some(-32601));
}

#[test]
fn the_server_side_fills_in_what_the_client_did_not_say() {
    let client_ok = post("/mcp", 200);
    let server = Attempt {
        path: Some("/srv"),
        signal: Signal {
            error_type: Some("ValidationError"),
            jsonrpc_code: Some(-32602),
            http_status: Some(500),
            grpc_code: Some(2),
            timeout: Some("Deadline"),
            retry_after: Some(9),
            status_error: true,
            said: Said::SessionGone,
        },
        ..mcp("tools/call", "lookup")
    };
    let call = with_server(&client_ok, &server);
    assert_eq!(call.signal.said, Said::SessionGone, "the server's words");
    assert_eq!(call.signal.http_status, Some(200), "the client's code");
    assert_eq!(call.signal.jsonrpc_code, Some(-32602), "else the server's");
    assert_eq!(call.signal.error_type, Some("ValidationError"));
    assert_eq!(call.signal.grpc_code, Some(2));
    assert_eq!(call.signal.timeout, Some("Deadline"));
    assert_eq!(call.signal.retry_after, Some(9));
    assert!(!call.signal.status_error, "a server's status says nothing");
    assert_eq!(call.path, Some("/mcp"));
    assert_eq!(call.operation, client_ok.operation);
    let pathless = with_server(&mcp("tools/call", "lookup"), &server);
    assert_eq!(pathless.path, Some("/srv"));
    let client_says = Attempt {
        signal: Signal {
            jsonrpc_code: Some(-32601),
            error_type: Some("McpError"),
            grpc_code: Some(12),
            timeout: Some("ReadTimeout"),
            retry_after: Some(1),
            status_error: true,
            ..client_ok.signal
        },
        ..client_ok
    };
    let call = with_server(&client_says, &server);
    assert_eq!(call.signal.jsonrpc_code, Some(-32601));
    assert_eq!(call.signal.error_type, Some("McpError"));
    assert_eq!(call.signal.grpc_code, Some(12));
    assert_eq!(call.signal.timeout, Some("ReadTimeout"));
    assert_eq!(call.signal.retry_after, Some(1));
    assert!(call.signal.status_error);
}

#[test]
fn fastmcp_a_framework_span_around_the_sdks_around_a_request_with_the_servers_span() {
    // FastMCP's client span (tool_error), the MCP SDK's (a good JSON-RPC answer), httpx's
    // POST, and FastMCP's server span under the POST (ValidationError).
    let outer = Attempt {
        signal: Signal {
            error_type: Some("tool_error"),
            status_error: true,
            ..Signal::default()
        },
        ..mcp("tools/call", "get_weather")
    };
    let members = [
        client(outer),
        client(at(mcp("tools/call", "get_weather"), 110, 190)),
        client(at(post("/mcp", 200), 120, 180)),
        server(
            Attempt {
                signal: Signal {
                    error_type: Some("ValidationError"),
                    ..Signal::default()
                },
                ..mcp("tools/call", "get_weather")
            },
            false,
        ),
    ];
    let joined = [
        ROOT,
        parent(0, Link::Nested),
        parent(1, Link::Transport),
        parent(2, Link::ServerOf),
    ];
    let roles = assemble(&members, &joined, never_undeclared);
    let found = attempts(&roles);
    assert_eq!(found.len(), 1, "{roles:?}");
    let (i, a, interface) = &found[0];
    assert_eq!(*i, 2, "the request is the attempt");
    assert_eq!(*interface, None, "it names its server");
    assert_eq!(a.family, Family::Mcp);
    assert_eq!(a.operation.to_string(), "tools/call get_weather");
    assert_eq!(a.client, AGENT);
    assert_eq!(a.signal.http_status, Some(200));
    assert_eq!(a.signal.error_type, Some("tool_error"), "the framework's");
    assert!(a.signal.status_error);
}

#[test]
fn the_mcp_sdk_with_httpx_and_an_observed_asgi_server_is_one_attempt() {
    // The client's MCP span and its POST; the server's ASGI span (child of the POST, naming
    // the client) and its MCP span (child of the client's MCP span through `_meta`, carried
    // by the ASGI span).
    let members = [
        client(mcp("tools/call", "lookup")),
        client(at(post("/mcp", 200), 110, 190)),
        server(post("/mcp", 200), true),
        server(
            Attempt {
                signal: Signal {
                    error_type: Some("tool_error"),
                    ..Signal::default()
                },
                ..mcp("tools/call", "lookup")
            },
            false,
        ),
    ];
    let joined = [
        ROOT,
        parent(0, Link::Transport),
        parent(1, Link::ServerOf),
        Joined {
            parent: Some((0, Link::ServerOf)),
            carrier: Some(2),
        },
    ];
    let roles = assemble(&members, &joined, never_undeclared);
    let found = attempts(&roles);
    assert_eq!(found.len(), 1, "{roles:?}");
    let (i, a, _) = &found[0];
    assert_eq!(*i, 1);
    assert_eq!(a.client, AGENT);
    assert_eq!(
        a.signal.error_type,
        Some("tool_error"),
        "the server's tool error"
    );
}

#[test]
fn an_http_client_span_whose_server_span_is_a_protocol_call_is_that_call() {
    // The MCP Go SDK on otelhttp: the client's POST alone; the server's ASGI span under it,
    // carrying its MCP span (-32601).
    let refused = Attempt {
        signal: Signal {
            jsonrpc_code: Some(-32601),
            ..Signal::default()
        },
        ..mcp("completion/complete", "")
    };
    let members = [
        client(at(post("/mcp", 200), 110, 190)),
        server(post("/mcp", 200), true),
        server(refused, false),
    ];
    let joined = [
        ROOT,
        parent(0, Link::ServerOf),
        Joined {
            parent: Some((1, Link::Carried)),
            carrier: Some(1),
        },
    ];
    let undeclared = |a: &Attempt<'_>| a.path == Some("/mcp/v2");
    let found = attempts(&assemble(&members, &joined, undeclared));
    assert_eq!(found.len(), 1, "{found:?}");
    let (i, a, _) = &found[0];
    assert_eq!(*i, 0, "the client's request is the attempt");
    assert_eq!(a.family, Family::Mcp, "of the server's call");
    assert_eq!(a.operation.to_string(), "completion/complete");
    assert_eq!(a.signal.jsonrpc_code, Some(-32601));
    assert_eq!((a.path, a.signal.http_status), (Some("/mcp"), Some(200)));
    assert_eq!(a.client, AGENT);
    // Sent to a path its interface does not declare: about that path, as a transport request.
    let elsewhere = with_protocol_server(&post("/mcp/v2", 200), &members[2].attempt, true);
    assert_eq!(
        elsewhere.operation.to_string(),
        "completion/complete /mcp/v2"
    );
    let here = with_protocol_server(&post("/mcp", 200), &members[2].attempt, false);
    assert_eq!(here.operation.via, "");
    // An HTTP server span alone (a 404 before the server's MCP handler) changes no family,
    // nor the client's operation when a proxy gave the server another path.
    let alone = assemble(&members[..2], &joined[..2], never_undeclared);
    let found = attempts(&alone);
    assert_eq!(found[0].1.family, Family::Http);
    assert_eq!(found[0].1.operation.to_string(), "POST /mcp");
    let proxied = [
        client(post("/v1/orders", 201)),
        server(post("/orders", 201), true),
    ];
    let found = attempts(&assemble(&proxied, &joined[..2], never_undeclared));
    assert_eq!(found[0].1.operation.to_string(), "POST /v1/orders");
    // A client span that says which call it was keeps its word: the server's span of it may
    // name less (here, no tool).
    let says = [
        client(at(mcp("tools/call", "lookup"), 110, 190)),
        server(post("/mcp", 200), true),
        server(mcp("tools/call", ""), false),
    ];
    let found = attempts(&assemble(&says, &joined, never_undeclared));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1.operation.to_string(), "tools/call lookup");
}

#[test]
fn a_client_that_names_no_server_goes_where_the_server_span_is() {
    let members = [
        client(Attempt {
            signal: Signal {
                jsonrpc_code: Some(-32601),
                ..Signal::default()
            },
            ..mcp("completion/complete", "")
        }),
        server(
            Attempt {
                path: Some("/mcp"),
                ..mcp("completion/complete", "")
            },
            false,
        ),
    ];
    let roles = assemble(
        &members,
        &[ROOT, parent(0, Link::ServerOf)],
        never_undeclared,
    );
    let found = attempts(&roles);
    assert_eq!(found.len(), 1);
    let (i, a, interface) = &found[0];
    assert_eq!((*i, *interface), (0, Some(2)));
    assert_eq!(a.path, Some("/mcp"));
    assert_eq!(a.signal.jsonrpc_code, Some(-32601));
    assert_eq!(roles.roles[1], Role::Part);
}

#[test]
fn server_spans_alone_are_the_attempt_under_the_client_their_carrier_names() {
    let carrier = server(post("/mcp", 200), true);
    let carried = server(mcp("tools/call", "lookup"), false);
    let roles = assemble(
        &[carrier.clone(), carried.clone()],
        &[
            ROOT,
            Joined {
                parent: None,
                carrier: Some(0),
            },
        ],
        never_undeclared,
    );
    let found = attempts(&roles);
    assert_eq!(found.len(), 1);
    let (i, a, interface) = &found[0];
    assert_eq!((*i, *interface), (1, Some(2)));
    assert_eq!(a.client.name, "prober/1.0");
    // Alone, each is its own attempt; the protocol span under nobody.
    let roles = assemble(&[carried], &[ROOT], never_undeclared);
    let found = attempts(&roles);
    assert_eq!(found[0].1.client.name, UNKNOWN_CLIENT);
    let mut named = server(mcp("tools/call", "lookup"), true);
    named.attempt.client.name = "alice";
    let roles = assemble(
        &[carrier, named],
        &[
            ROOT,
            Joined {
                parent: None,
                carrier: Some(0),
            },
        ],
        never_undeclared,
    );
    assert_eq!(
        attempts(&roles)[0].1.client.name,
        "alice",
        "its own name first"
    );
}

#[test]
fn transport_retries_are_attempts_and_the_last_carries_the_calls_code() {
    let call = Attempt {
        signal: Signal {
            jsonrpc_code: Some(-32602),
            ..Signal::default()
        },
        ..mcp("tools/call", "flaky")
    };
    let members = [
        client(call),
        client(at(post("/mcp", 503), 110, 120)),
        client(at(post("/mcp", 200), 150, 170)),
        client(at(post("/mcp", 503), 130, 140)),
        server(post("/mcp", 200), true),
    ];
    let joined = [
        ROOT,
        parent(0, Link::Transport),
        parent(0, Link::Transport),
        parent(0, Link::Transport),
        parent(3, Link::ServerOf),
    ];
    let roles = assemble(&members, &joined, never_undeclared);
    let found = attempts(&roles);
    let codes: Vec<_> = found
        .iter()
        .map(|(i, a, _)| (*i, a.signal.http_status, a.signal.jsonrpc_code))
        .collect();
    assert_eq!(
        codes,
        [
            (1, Some(503), None),
            (2, Some(200), Some(-32602)),
            (3, Some(503), None)
        ]
    );
    assert_eq!(roles.roles[4], Role::Part, "the server side of the third");
}

#[test]
fn a_server_span_of_a_protocol_call_goes_to_the_request_it_answered_else_the_last() {
    let members = [
        client(mcp("tools/call", "x")),
        client(at(post("/mcp", 503), 110, 120)),
        client(at(post("/mcp", 200), 150, 170)),
        server(
            Attempt {
                signal: Signal {
                    error_type: Some("Boom"),
                    ..Signal::default()
                },
                ..mcp("tools/call", "x")
            },
            false,
        ),
    ];
    let to = |joined: Joined| {
        let all = [
            ROOT,
            parent(0, Link::Transport),
            parent(0, Link::Transport),
            joined,
        ];
        attempts(&assemble(&members, &all, never_undeclared))
            .into_iter()
            .filter(|(_, a, _)| a.signal.error_type == Some("Boom"))
            .map(|(i, _, _)| i)
            .collect::<Vec<_>>()
    };
    assert_eq!(to(parent(1, Link::ServerOf)), [1]);
    assert_eq!(to(parent(0, Link::ServerOf)), [2], "the last");
    // A protocol server span under the client's protocol span, carried by the HTTP server
    // span of the first request: the first.
    let carried = [
        client(mcp("tools/call", "x")),
        client(at(post("/mcp", 503), 110, 120)),
        client(at(post("/mcp", 200), 150, 170)),
        members[3].clone(),
        server(post("/mcp", 503), true),
    ];
    let all = [
        ROOT,
        parent(0, Link::Transport),
        parent(0, Link::Transport),
        Joined {
            parent: Some((0, Link::ServerOf)),
            carrier: Some(4),
        },
        parent(1, Link::ServerOf),
    ];
    let found: Vec<usize> = attempts(&assemble(&carried, &all, never_undeclared))
        .into_iter()
        .filter(|(_, a, _)| a.signal.error_type == Some("Boom"))
        .map(|(i, _, _)| i)
        .collect();
    assert_eq!(found, [1]);
}

#[test]
fn assembly_survives_ids_that_loop() {
    let members = [client(mcp("x", "")), client(mcp("x", ""))];
    let joined = [parent(1, Link::Nested), parent(0, Link::Nested)];
    let roles = assemble(&members, &joined, never_undeclared);
    assert_eq!(roles.roles.len(), 2);
    let members = [server(mcp("x", ""), false), client(mcp("x", ""))];
    let joined = [parent(1, Link::ServerOf), parent(1, Link::Nested)];
    assert_eq!(assemble(&members, &joined, never_undeclared).roles.len(), 2);
}

#[test]
fn a_gateways_server_span_and_the_servers_behind_it_are_one_call() {
    // Caddy's span (naming the client), the MCP server's ASGI span under it, and the MCP
    // span that span carries.
    let gateway = server(post("/mcp", 200), true);
    let backend = server(post("/mcp", 200), false);
    let protocol = server(
        Attempt {
            signal: Signal {
                error_type: Some("tool_error"),
                ..Signal::default()
            },
            ..mcp("tools/call", "lookup")
        },
        false,
    );
    assert_eq!(link(&backend, &gateway), Some(Link::Proxied));
    assert_eq!(link(&protocol, &gateway), Some(Link::Carried));
    // Alone: the MCP span is the attempt, under the client the gateway names.
    let alone = [gateway.clone(), backend.clone(), protocol.clone()];
    let joined = [
        ROOT,
        parent(0, Link::Proxied),
        Joined {
            parent: None,
            carrier: Some(1),
        },
    ];
    let calls = assemble(&alone, &joined, never_undeclared);
    let found = attempts(&calls);
    assert_eq!(found.len(), 1, "{calls:?}");
    assert_eq!((found[0].0, found[0].2), (2, Some(2)));
    assert_eq!(found[0].1.client.name, "prober/1.0");
    assert_eq!(&calls.roles[..2], &[Role::Part, Role::Part]);
    // With the client's call: one attempt, the client's request, with the server's facts.
    let with_client = [
        client(mcp("tools/call", "lookup")),
        client(at(post("/mcp", 200), 110, 190)),
        gateway,
        backend,
        protocol,
    ];
    let joined = [
        ROOT,
        parent(0, Link::Transport),
        parent(1, Link::ServerOf),
        parent(2, Link::Proxied),
        Joined {
            parent: None,
            carrier: Some(3),
        },
    ];
    let calls = assemble(&with_client, &joined, never_undeclared);
    let found = attempts(&calls);
    assert_eq!(found.len(), 1, "{calls:?}");
    assert_eq!(found[0].0, 1);
    assert_eq!(found[0].1.client, AGENT);
    assert_eq!(found[0].1.signal.error_type, Some("tool_error"));
    // A gateway's span alone is an attempt of its own.
    let calls = assemble(&with_client[2..3], &[ROOT], never_undeclared);
    assert_eq!(attempts(&calls)[0].1.client.name, "prober/1.0");
}

#[test]
fn the_protocol_server_spans_facts_come_before_its_http_carriers() {
    // The carrier says only that HTTP failed; the MCP span it carries says how.
    let carrier = server(
        Attempt {
            signal: Signal {
                error_type: Some("500"),
                ..Signal::default()
            },
            ..post("/mcp", 200)
        },
        true,
    );
    let carried = server(
        Attempt {
            signal: Signal {
                error_type: Some("tool_error"),
                ..Signal::default()
            },
            ..mcp("tools/call", "lookup")
        },
        false,
    );
    let members = [client(post("/mcp", 200)), carrier, carried];
    let joined = [
        ROOT,
        parent(0, Link::ServerOf),
        Joined {
            parent: None,
            carrier: Some(1),
        },
    ];
    let found = attempts(&assemble(&members, &joined, never_undeclared));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1.signal.error_type, Some("tool_error"));
}

#[test]
fn a_span_that_names_itself_as_its_parent_is_still_an_attempt() {
    // Ids that loop onto the span itself (a broken SDK): neither its own nested span nor its
    // own gateway.
    let calls = assemble(
        &[client(mcp("x", ""))],
        &[parent(0, Link::Nested)],
        never_undeclared,
    );
    assert_eq!(attempts(&calls).len(), 1);
    let calls = assemble(
        &[server(post("/mcp", 200), true)],
        &[parent(0, Link::Proxied)],
        never_undeclared,
    );
    assert_eq!(attempts(&calls).len(), 1);
}

#[test]
fn a_call_listed_from_its_innermost_span_out_is_assembled_alike() {
    // The order spans come in (children end first): the request, the SDK's span, the
    // framework's. Facts still flow from the outermost in.
    let outer = Attempt {
        signal: Signal {
            error_type: Some("tool_error"),
            status_error: true,
            ..Signal::default()
        },
        ..mcp("tools/call", "get_weather")
    };
    let members = [
        client(at(post("/mcp", 200), 120, 180)),
        client(at(mcp("tools/call", "get_weather"), 110, 190)),
        client(outer),
    ];
    let joined = [parent(1, Link::Transport), parent(2, Link::Nested), ROOT];
    let found = attempts(&assemble(&members, &joined, never_undeclared));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, 0);
    assert_eq!(found[0].1.signal.error_type, Some("tool_error"));
    assert_eq!(found[0].1.family, Family::Mcp);
}
