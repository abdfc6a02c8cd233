//! Real agent stacks exporting their own telemetry (DESIGN §11): FastMCP 4's client and
//! server with their native OpenTelemetry, the official MCP SDK 2's client against the MCP
//! SDK's server behind the ASGI instrumentation, and that client again through a Caddy gateway
//! with its `tracing` on in front of another such server — the clients over httpx2 with
//! `opentelemetry-instrumentation-httpx` — each playing DESIGN §1's three clients and a
//! careful one, every process exporting over OTLP/HTTP to the binary. Each stack describes a
//! call in several spans (FastMCP's, the SDK's, httpx's, the server's); the counters must be
//! what §11 makes of the spans the stacks really sent: one attempt per HTTP request (each
//! client also records its spans, and the test counts them there), none on `unknown` or
//! under `unknown_client`, the prober's undeclared paths refused on keys of their own, the
//! assistant's two retries after an ambiguous answer, the planner stopped at -32601.
//!
//! And DESIGN §12's flows, each a compliant SDK doing what the MCP specification asks of it
//! against a real server using the transport's freedoms: the MCP Python SDK, FastMCP and the
//! MCP TypeScript SDK (traced by OpenTelemetry's undici instrumentation) — no violation for
//! what the specification tells them to do, two retries after a refusal for the tool that is
//! not there.
//!
//! And DESIGN §11.5 on all of them, each forwarding every span to a next hop: every attempt's
//! span leaves once, tagged with the verdict `/metrics` counts for its call — among them the
//! OpenAI Agents SDK's MCP client under OpenInference's instrumentation, whose client spans
//! name no server and come before the server's.
//!
//! The Python side lives in `tests/agents/` and runs in the agents' virtual environment, which
//! the README's test command makes (`REFUSAL_GATE_AGENT_PYTHON`); the TypeScript side in
//! `tests/agents/ts/`, its packages installed by the same command
//! (`REFUSAL_GATE_AGENT_NODE_MODULES`); plain `cargo test` skips.

mod common;

use common::sink::{start_sink, string, Sink};
use common::{
    admin_metrics as metrics, agent_node_modules, agent_python, binary_config, free_port,
    fresh_dir, series, spawn_binary, value,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Starts an MCP server script (`command`: its name, then its options) on `port`, exporting
/// its spans as `service` to `otlp` every 100 ms.
async fn mcp_server(
    python: &str,
    command: &[&str],
    port: u16,
    service: &str,
    otlp: u16,
) -> tokio::process::Child {
    common::mcp_server_every(python, command, (port, service), otlp, 100).await
}

/// Starts Caddy on `port` in front of the server on `upstream`, its `tracing` exporting as
/// `caddy-gateway` to `otlp`.
async fn gateway(
    python: &str,
    dir: &std::path::Path,
    port: u16,
    upstream: u16,
    otlp: u16,
) -> tokio::process::Child {
    let caddy = std::path::Path::new(python).with_file_name("caddy");
    let config = dir.join("Caddyfile");
    std::fs::write(
        &config,
        format!(
            "{{\n  admin off\n}}\n:{port} {{\n  tracing {{\n    span gateway\n  }}\n  reverse_proxy 127.0.0.1:{upstream}\n}}\n"
        ),
    )
    .expect("the Caddyfile is written");
    let mut caddy = tokio::process::Command::new(caddy)
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&config)
        .env("OTEL_SERVICE_NAME", "caddy-gateway")
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("Caddy starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "Caddy never listened");
        if let Some(status) = caddy.try_wait().expect("waitable") {
            panic!("Caddy exited: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    caddy
}

/// The configuration of an MCP interface `name` served on `port` at `/mcp` (streamable HTTP:
/// `POST`, `GET` and `DELETE`), observed through the spans of `services`.
fn mcp_interface(name: &str, port: u16, services: &str) -> String {
    format!(
        "  - name: {name}
    protocol: mcp
    url: http://127.0.0.1:{port}/mcp
    endpoints: [{{ path: /mcp, methods: [POST, GET, DELETE] }}]
    server: {{ service_names: [{services}] }}
"
    )
}

/// The exporter block of a configuration forwarding every span to `sink` over OTLP/gRPC.
fn forwarding_to(sink: SocketAddr) -> String {
    format!("exporters:\n  otlp: {{ endpoint: 'http://{sink}', protocol: grpc }}\n")
}

/// DESIGN §11.5 over a run's stacks: once every span the binary on `admin` accepted has been
/// forwarded to `sink` (none withheld or queued), each left exactly once, and the spans tagged
/// are the attempts `/metrics` counted, each with its call's verdict — per (client, interface,
/// class, kind), for the clients named `clients` — none untagged for want of room.
async fn every_attempt_left_once_tagged_as_counted(admin: u16, sink: &Sink, clients: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(admin).await;
        let accepted = value(&m, "refusal_gate_receiver_accepted_spans_total", &[]);
        let sent = value(&m, "refusal_gate_exporter_sent_spans_total", &[]);
        let withheld = value(&m, "refusal_gate_exporter_withheld_spans", &[]);
        if sent == accepted && withheld == 0.0 && sink.every().len() as f64 == sent {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} of {accepted} spans forwarded, {withheld} withheld\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        value(&m, "refusal_gate_exporter_untagged_spans_total", &[]),
        0.0,
        "{m}"
    );
    let every = sink.every();
    let mut seen = std::collections::HashSet::new();
    let mut tagged: BTreeMap<[String; 4], f64> = BTreeMap::new();
    for (resource, span) in &every {
        assert!(
            seen.insert(span.span_id.clone()),
            "{} forwarded twice",
            span.name
        );
        let client = string(&resource.attributes, "service.name").unwrap_or_default();
        let tag = |key: &str| string(&span.attributes, &format!("refusal_gate.{key}"));
        let (Some(interface), Some(class), Some(kind)) =
            (tag("interface"), tag("class"), tag("kind"))
        else {
            continue;
        };
        if clients.contains(&client) {
            *tagged.entry([client, interface, class, kind]).or_default() += 1.0;
        }
    }
    let counted: BTreeMap<[String; 4], f64> = series(&m, "refusal_gate_attempts_total")
        .into_iter()
        .filter(|(labels, n)| *n > 0.0 && clients.contains(&labels["client"]))
        .map(|(l, n)| {
            let key = ["client", "interface", "class", "kind"].map(|k| l[k].clone());
            (key, n)
        })
        .collect();
    assert_eq!(
        tagged, counted,
        "tagged spans against the attempts counted\n{m}"
    );
}

/// Runs one story of one stack against `base`; returns the HTTP requests its spans record
/// (the transport requests, and the SDK's requests that carry no protocol span).
async fn story(
    python: &str,
    dir: &std::path::Path,
    stack: &str,
    name: &str,
    base: &str,
    otlp: u16,
) -> usize {
    let record = dir.join(format!("{stack}-{name}.jsonl"));
    let run = ("stack_client.py", &[stack, name, base][..]);
    requests(&run_client(python, run, &[], &record, otlp).await)
}

/// Runs the client script `script_name` with `args` (and `env`), its spans exported to
/// `otlp` and recorded in `record`; returns the recording (OTLP/JSON lines).
async fn run_client(
    python: &str,
    (script_name, args): (&str, &[&str]),
    env: &[(&str, &str)],
    record: &std::path::Path,
    otlp: u16,
) -> String {
    let mut command = tokio::process::Command::new(python);
    command
        .arg(common::agent_script(script_name))
        .args(args)
        .env("RECORD", record)
        .envs(env.iter().copied());
    common::exporting_to(otlp, command).await;
    std::fs::read_to_string(record).expect("the client recorded its spans")
}

/// The CLIENT spans of a recording (OTLP/JSON lines).
fn client_spans(recorded: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for line in recorded.lines() {
        let mut request: serde_json::Value = serde_json::from_str(line).expect("an OTLP/JSON line");
        let resources = request["resourceSpans"]
            .as_array_mut()
            .into_iter()
            .flatten();
        let scopes = resources.flat_map(|rs| rs["scopeSpans"].as_array_mut().into_iter().flatten());
        let spans = scopes.flat_map(|ss| ss["spans"].as_array_mut().into_iter().flatten());
        out.extend(spans.map(std::mem::take).filter(|s| s["kind"] == 3));
    }
    out
}

/// A span's attribute `key` as a string (a captured header's first value).
fn attribute(span: &serde_json::Value, key: &str) -> Option<String> {
    let kv = span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?;
    let v = &kv["value"];
    let v = v["arrayValue"]["values"][0]["stringValue"]
        .as_str()
        .or(v["stringValue"].as_str())?;
    Some(v.to_string())
}

/// The HTTP method of an HTTP span, under either convention.
fn http_method(span: &serde_json::Value) -> Option<String> {
    attribute(span, "http.method").or_else(|| attribute(span, "http.request.method"))
}

/// The HTTP CLIENT spans of a recording (OTLP/JSON lines).
fn requests(recorded: &str) -> usize {
    client_spans(recorded)
        .iter()
        .filter(|span| http_method(span).is_some())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_the_mcp_sdk_and_a_gateway_tell_the_federations_stories_each_call_counted_once() {
    let Some(python) = agent_python() else {
        return;
    };
    let dir = fresh_dir("stacks", "federation");
    let (fast, sdk, behind, front) = (free_port(), free_port(), free_port(), free_port());
    let (next_hop, sink) = start_sink().await;
    // The gateway's interface is observed through both its own spans and the server's behind it.
    let interface = mcp_interface;
    let (config, ports) = binary_config(
        &dir,
        "stacks",
        &format!(
            "interfaces:\n{}{}{}{}",
            interface("weather-fastmcp", fast, "weather-fastmcp"),
            interface("weather-sdk", sdk, "weather-sdk"),
            interface("weather-gateway", front, "caddy-gateway, weather-behind"),
            forwarding_to(next_hop),
        ),
    );
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let server = |command: &'static [&'static str], port, service| {
        mcp_server(&python, command, port, service, ports.http)
    };
    let _fastmcp = server(&["fastmcp_server.py"], fast, "weather-fastmcp").await;
    let _sdk = server(&["mcp_server.py"], sdk, "weather-sdk").await;
    let _behind = server(&["mcp_server.py"], behind, "weather-behind").await;
    let _caddy = gateway(&python, &dir, front, behind, ports.http).await;

    let stories = ["planner", "prober", "assistant", "careful"];
    let mut expected = Vec::new();
    for (stack, port) in [("fastmcp", fast), ("mcp", sdk), ("gateway", front)] {
        let base = format!("http://127.0.0.1:{port}");
        for name in stories {
            let requests = story(&python, &dir, stack, name, &base, ports.http).await;
            expected.push((format!("{stack}-{name}"), requests));
        }
    }
    let m = common::attempts_reach(ports.admin, &expected).await;
    let of = |client: &str, labels: &[(&str, &str)]| {
        let mut all = vec![("client", client)];
        all.extend_from_slice(labels);
        value(&m, "refusal_gate_attempts_total", &all)
    };
    let violations = |client: &str, violation: &str| {
        let mut labels = vec![("client", client)];
        if !violation.is_empty() {
            labels.push(("violation", violation));
        }
        value(&m, "refusal_gate_violations_total", &labels)
    };
    for (stack, interface) in [
        ("fastmcp", "weather-fastmcp"),
        ("mcp", "weather-sdk"),
        ("gateway", "weather-gateway"),
    ] {
        let client = |story: &str| format!("{stack}-{story}");
        // Every call placed on its interface: the MCP SDK's spans name no server, the
        // httpx spans under them do.
        for story in stories {
            let c = client(story);
            assert_eq!(of(&c, &[("interface", "unknown")]), 0.0, "{c}\n{m}");
            assert_eq!(of(&c, &[]), of(&c, &[("interface", interface)]), "{c}\n{m}");
            assert!(
                value(&m, "refusal_gate_discovery_reads_total", &[("client", &c)]) >= 1.0,
                "{c} read the contract first\n{m}"
            );
        }
        // The planner read the contract, was refused -32601, and stopped.
        let planner = client("planner");
        assert_eq!(
            of(&planner, &[("kind", "protocol_not_supported")]),
            1.0,
            "{m}"
        );
        assert_eq!(violations(&planner, ""), 0.0, "{m}");
        // The prober: 22 requests to three undeclared paths, each refused by its 404 on a key
        // of its own (the SDK reports -32601). The MCP SDK (through the gateway too, whose 404
        // is the server's) sends one request a connection: 3
        // keys, so 19 retries after a refusal and 2 probes, DESIGN §1's figures. FastMCP's
        // client tries `server/discover`, then `initialize`: two requests a connection, 6 keys,
        // so 16 retries and 5 probes.
        let prober = client("prober");
        let (retries, probes) = if stack == "fastmcp" {
            (16.0, 5.0)
        } else {
            (19.0, 2.0)
        };
        assert_eq!(
            of(&prober, &[("kind", "interface_not_declared")]),
            22.0,
            "{m}"
        );
        assert_eq!(violations(&prober, "retry_after_refusal"), retries, "{m}");
        assert_eq!(violations(&prober, "probe_after_refusal"), probes, "{m}");
        // The assistant retried a failing tool twice. Its client saw a tool result marked as an
        // error (FastMCP's own span says `tool_error`; the MCP SDK's span saw a good JSON-RPC
        // answer), and the server recorded the failure: ambiguous either way.
        let assistant = client("assistant");
        assert_eq!(of(&assistant, &[("kind", "ambiguous")]), 3.0, "{m}");
        assert_eq!(violations(&assistant, "retry_after_ambiguous"), 2.0, "{m}");
        assert_eq!(violations(&assistant, ""), 2.0, "{m}");
        // The careful agent: nothing to say.
        let careful = client("careful");
        assert_eq!(violations(&careful, ""), 0.0, "{m}");
        assert_eq!(of(&careful, &[("class", "ok")]), of(&careful, &[]), "{m}");
    }
    // Every server span was the other side of a client's call: the gateway's and the server's
    // behind it, each the same request.
    assert_eq!(
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "unknown_client")]
        ),
        0.0,
        "{m}"
    );
    let clients: Vec<String> = expected.iter().map(|(c, _)| c.clone()).collect();
    every_attempt_left_once_tagged_as_counted(ports.admin, &sink, &clients).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs one flow of `tests/agents/flow_client.py` on `stack` against `base`, as `client`, its
/// HTTP spans carrying the session and version request headers; returns what the client
/// recorded of its spans (OTLP/JSON lines).
async fn flow(
    python: &str,
    dir: &std::path::Path,
    (stack, name, base, client): (&str, &str, &str, &str),
    otlp: u16,
) -> String {
    let headers = [(
        "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST",
        "mcp-session-id,mcp-protocol-version",
    )];
    let record = dir.join(format!("{client}.jsonl"));
    let run = ("flow_client.py", &[stack, name, base, client][..]);
    run_client(python, run, &headers, &record, otlp).await
}

/// How many of a recording's HTTP `GET` and `DELETE` CLIENT spans repeat one of the same
/// method in the same session (the captured `mcp-session-id` header): what the MCP Python
/// SDK sends again when it reconnects a refused stream.
fn repeated_in_session(recorded: &str) -> usize {
    let mut seen = std::collections::HashMap::<(String, String), usize>::new();
    for span in client_spans(recorded) {
        let method = http_method(&span);
        let session = attribute(&span, "http.request.header.mcp_session_id");
        if let (Some(method @ ("GET" | "DELETE")), Some(session)) = (method.as_deref(), session) {
            *seen.entry((method.to_string(), session)).or_default() += 1;
        }
    }
    seen.values().map(|n| n - 1).sum()
}

/// Runs one flow of `tests/agents/ts/flow_client.mjs` (the MCP TypeScript SDK) against `base`:
/// the script is copied into `dir` beside a link to the installed `modules`, where Node.js
/// resolves its imports.
async fn ts_flow(
    modules: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    base: &str,
    otlp: u16,
) {
    let here = dir.join("ts");
    if !here.exists() {
        std::fs::create_dir_all(&here).expect("a directory for the TypeScript client");
        std::os::unix::fs::symlink(modules, here.join("node_modules")).expect("a link");
        std::fs::copy(
            common::agent_script("ts/flow_client.mjs"),
            here.join("flow_client.mjs"),
        )
        .expect("the client is copied");
    }
    let mut node = tokio::process::Command::new("node");
    node.arg(here.join("flow_client.mjs")).args([name, base]);
    common::exporting_to(otlp, node).await;
}

/// DESIGN §12 on real SDKs doing what the MCP specification tells them to, each against a real
/// server that uses the freedoms the transport gives it: the MCP Python SDK's stateful server
/// refusing the `GET` stream and the `DELETE` with 405 and forgetting idle sessions, and a
/// stateless FastMCP server. Compliant flows get no violation; the client that calls a tool
/// the server does not have, three times after listing the tools, gets two retries after a
/// refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compliant_sdks_doing_what_the_mcp_specification_asks_are_no_violators() {
    let Some(python) = agent_python() else {
        return;
    };
    let Some(modules) = agent_node_modules() else {
        return;
    };
    let dir = fresh_dir("stacks", "flows");
    let (stateful, fast) = (free_port(), free_port());
    let (next_hop, sink) = start_sink().await;
    let (config, ports) = binary_config(
        &dir,
        "flows",
        &format!(
            "interfaces:\n{}{}{}",
            mcp_interface("weather-stateful", stateful, "weather-stateful"),
            mcp_interface("weather-fastmcp", fast, "weather-fastmcp"),
            forwarding_to(next_hop),
        ),
    );
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let stateful_server = [
        "mcp_server.py",
        "--stateful",
        "--refuse-stream",
        "--idle",
        "1",
    ];
    let _stateful = mcp_server(
        &python,
        &stateful_server,
        stateful,
        "weather-stateful",
        ports.http,
    )
    .await;
    let _fast = mcp_server(
        &python,
        &["fastmcp_server.py"],
        fast,
        "weather-fastmcp",
        ports.http,
    )
    .await;
    let (on_stateful, on_fast) = (
        format!("http://127.0.0.1:{stateful}"),
        format!("http://127.0.0.1:{fast}"),
    );
    let py =
        |stack, name, base, client| flow(&python, &dir, (stack, name, base, client), ports.http);
    // The MCP Python SDK takes a 405 for a dropped stream and opens it again a second later,
    // once (`MAX_RECONNECTION_ATTEMPTS`): in a session that lasts past that, the same GET in
    // the same session after the server said it offers none is a retry after a refusal, as it
    // should be. How many it sent again is in its own spans.
    let stream_retries = |recorded: String| repeated_in_session(&recorded) as f64;
    let stream = stream_retries(py("mcp", "stream", &on_stateful, "mcp-stream").await);
    let expired = stream_retries(py("mcp", "expired", &on_stateful, "mcp-expired").await);
    let version = stream_retries(py("mcp", "version", &on_stateful, "mcp-version").await);
    py("mcp", "unknown", &on_fast, "mcp-unknown").await;
    py("fastmcp", "unknown", &on_fast, "fastmcp-unknown").await;
    py("mcp", "unknown", &on_stateful, "mcp-unknown-wordless").await;
    // The expired flow's first session pauses longer than that: it did send one again.
    assert!(expired >= 1.0, "the SDK's reconnect, seen in its spans");
    ts_flow(&modules, &dir, "stream", &on_fast, ports.http).await;
    ts_flow(&modules, &dir, "delete", &on_stateful, ports.http).await;

    // (client, interface, kind, attempts of that kind) the flows must have counted.
    let (s, f) = ("weather-stateful", "weather-fastmcp");
    let kinds = [
        // Three sessions, each refused its GET stream and its DELETE (the clients had read).
        ("mcp-stream", s, "protocol_not_supported", 6.0),
        // The gone session, then a new one.
        ("mcp-expired", s, "session_expired", 1.0),
        // The version the server does not know, at its first `server/discover`: before any
        // read, so unverified.
        ("mcp-version", s, "unverified_refusal", 1.0),
        // The tool that is not there, after `tools/list`: FastMCP's server says so.
        ("mcp-unknown", f, "interface_not_declared", 3.0),
        ("fastmcp-unknown", f, "interface_not_declared", 3.0),
        // The MCP Python SDK's server records it as a bare `tool_error`: a failed tool.
        ("mcp-unknown-wordless", s, "ambiguous", 3.0),
        // The TypeScript SDK is traced at HTTP only: its `initialize` is a POST, a read only
        // where the server's own span of it says it was `initialize` (the MCP SDK's server,
        // behind the ASGI instrumentation: an HTTP client span takes its server's protocol
        // call, the note of issue 65); FastMCP's server spans are no child of the POST.
        ("ts-stream", f, "unverified_refusal", 3.0),
        ("ts-delete", s, "protocol_not_supported", 6.0),
    ];
    // The servers export every 100 ms: once their last spans are in, every call is whole. (A
    // read of /metrics settles what is pending, so none is made before.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let m = loop {
        let m = metrics(ports.admin).await;
        let counted = |(client, interface, kind, _): &(&str, &str, &str, f64)| {
            let labels = [
                ("client", *client),
                ("interface", *interface),
                ("kind", *kind),
            ];
            value(&m, "refusal_gate_attempts_total", &labels)
        };
        if kinds.iter().all(|k| counted(k) >= k.3) {
            for k in &kinds {
                assert_eq!(counted(k), k.3, "{k:?}\n{m}");
            }
            break m;
        }
        assert!(Instant::now() < deadline, "{kinds:?}\n{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let violations = |client: &str, violation: &str| {
        let mut labels = vec![("client", client)];
        if !violation.is_empty() {
            labels.push(("violation", violation));
        }
        value(&m, "refusal_gate_violations_total", &labels)
    };
    for client in ["ts-stream", "ts-delete"] {
        assert_eq!(violations(client, ""), 0.0, "{client}\n{m}");
    }
    // The Python flows: nothing but the stream the SDK opened again in a session (none in a
    // session shorter than a second). The gone session asked for a new one, and the call
    // again in it is no retry; nor is the other version.
    for (client, again) in [
        ("mcp-stream", stream),
        ("mcp-expired", expired),
        ("mcp-version", version),
    ] {
        assert_eq!(
            violations(client, "retry_after_refusal"),
            again,
            "{client}\n{m}"
        );
        assert_eq!(violations(client, ""), again, "{client}\n{m}");
    }
    for client in ["mcp-unknown", "fastmcp-unknown"] {
        assert_eq!(
            violations(client, "retry_after_refusal"),
            2.0,
            "{client}\n{m}"
        );
        assert_eq!(violations(client, ""), 2.0, "{client}\n{m}");
    }
    // Where the server's span says no more than `tool_error`, the retries are those after a
    // failed call (DESIGN §12.3: any other failure stays ambiguous).
    assert_eq!(
        violations("mcp-unknown-wordless", "retry_after_ambiguous"),
        2.0,
        "{m}"
    );
    for client in ["mcp-stream", "mcp-expired", "mcp-version", "mcp-unknown"] {
        assert_eq!(
            value(
                &m,
                "refusal_gate_attempts_total",
                &[("client", client), ("interface", "unknown")]
            ),
            0.0,
            "{client}\n{m}"
        );
    }
    let clients: Vec<String> = kinds.iter().map(|k| k.0.to_string()).collect();
    every_attempt_left_once_tagged_as_counted(ports.admin, &sink, &clients).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many SERVER spans of `tools/call` the service `server` sent that were forwarded to
/// `sink`.
fn server_calls(sink: &Sink, server: &str) -> usize {
    sink.every()
        .iter()
        .filter(|(resource, span)| {
            span.kind == 2
                && string(&resource.attributes, "service.name").as_deref() == Some(server)
                && string(&span.attributes, "mcp.method.name").as_deref() == Some("tools/call")
        })
        .count()
}

/// The OpenAI Agents SDK's MCP client, traced by OpenInference's instrumentation of the SDK
/// and the MCP SDK's own CLIENT spans (which name no server), against the MCP SDK's server,
/// whose spans come a couple of seconds after the client's: each call counted on the observed
/// interface, whatever the client's span said alone (its client saw a tool error as a result,
/// not as an error), and each client span forwarded with that verdict, not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_sdk_under_openinference_each_call_leaves_with_the_servers_verdict() {
    let Some(python) = agent_python() else {
        return;
    };
    let dir = fresh_dir("stacks", "agents");
    let port = free_port();
    let (next_hop, sink) = start_sink().await;
    let (config, ports) = binary_config(
        &dir,
        "agents",
        &format!(
            "interfaces:\n{}{}",
            mcp_interface("weather-agents", port, "weather-agents"),
            forwarding_to(next_hop),
        ),
    );
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let server = ["mcp_server.py"];
    let at = (port, "weather-agents");
    let _server = common::mcp_server_every(&python, &server, at, ports.http, 2_000).await;
    let base = format!("http://127.0.0.1:{port}");
    let stories = ["careful", "assistant", "unknown"];
    for story in stories {
        let record = dir.join(format!("agents-{story}.jsonl"));
        let run = ("agents_client.py", &[story, base.as_str()][..]);
        run_client(&python, run, &[], &record, ports.http).await;
    }
    let clients: Vec<String> = stories.iter().map(|s| format!("agents-{s}")).collect();
    // The server's spans come two seconds later; once its seven tool calls' spans are
    // forwarded, every call is whole. (A read of /metrics settles what is pending — a client's
    // call then stays as its own spans said — so none is made before.)
    let deadline = Instant::now() + Duration::from_secs(30);
    while server_calls(&sink, "weather-agents") < 7 {
        assert!(Instant::now() < deadline, "the server's spans never came");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = metrics(ports.admin).await;
    for client in &clients {
        let of = |labels: &[(&str, &str)]| {
            let mut all = vec![("client", client.as_str())];
            all.extend_from_slice(labels);
            value(&m, "refusal_gate_attempts_total", &all)
        };
        assert_eq!(of(&[("interface", "unknown")]), 0.0, "{client}\n{m}");
        assert_eq!(
            of(&[]),
            of(&[("interface", "weather-agents")]),
            "{client}\n{m}"
        );
    }
    // The tool errors, seen only from the server's side: each story's three calls ambiguous,
    // two of them retries after an ambiguous answer; the careful agent's call a success.
    for client in ["agents-assistant", "agents-unknown"] {
        let labels = [("client", client), ("violation", "retry_after_ambiguous")];
        assert_eq!(
            value(&m, "refusal_gate_violations_total", &labels),
            2.0,
            "{m}"
        );
    }
    let careful = [("client", "agents-careful"), ("class", "ok")];
    assert_eq!(
        value(&m, "refusal_gate_attempts_total", &careful),
        value(
            &m,
            "refusal_gate_attempts_total",
            &[("client", "agents-careful")]
        ),
        "{m}"
    );
    every_attempt_left_once_tagged_as_counted(ports.admin, &sink, &clients).await;
    let _ = std::fs::remove_dir_all(&dir);
}
