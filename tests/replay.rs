//! Black-box tests of `refusal-gate replay` on the recorded federation of DESIGN §1
//! (`examples/federation.jsonl`, made by `examples/federation.rs` with the OpenTelemetry
//! SDK): the report's figures, arrival order and file splits that change nothing, gzip and
//! standard input, and a corrupt line that is reported and skipped.

mod common;

use common::example;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_refusal-gate");

fn temp_dir(tag: &str) -> PathBuf {
    common::fresh_dir("replay", tag)
}

fn replay(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(BIN)
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut input = child.stdin.take().expect("a stdin");
    input
        .write_all(stdin.unwrap_or_default())
        .expect("writing stdin");
    drop(input);
    let out = child.wait_with_output().expect("finishes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn client<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .find(|c| c["client"] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {report}"))
}

fn lines() -> Vec<String> {
    std::fs::read_to_string(example("federation.jsonl"))
        .expect("the recording")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_federation_report() {
    let recording = example("federation.jsonl");
    let out = replay(
        &["--format", "json", recording.to_str().expect("UTF-8")],
        None,
    );
    let r = report(&out);
    let prober = client(&r, "prober-agent");
    assert_eq!(prober["attempts"], 22);
    assert_eq!(prober["violations"]["retry_after_refusal"], 19);
    assert_eq!(prober["violations"]["probe_after_refusal"], 2);
    assert_eq!(prober["avoidable"], 19);
    assert_eq!(prober["needed"], 3);
    let assistant = client(&r, "assistant-agent");
    assert_eq!(assistant["violations"]["retry_after_ambiguous"], 2);
    assert_eq!(assistant["avoidable"], 2);
    let planner = client(&r, "planner-agent");
    assert_eq!(planner["violations"], serde_json::json!({}));
    assert_eq!(planner["avoidable"], 0);
    assert_eq!(
        r["clients"][0]["client"], "prober-agent",
        "most avoidable first"
    );
    assert_eq!(r["total"]["avoidable"], 21);
    assert_eq!(r["spans"], 29);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("federation.yaml"),
        "says which configuration it used"
    );

    // The table says the same.
    let out = replay(&[recording.to_str().expect("UTF-8")], None);
    let table = String::from_utf8(out.stdout).expect("UTF-8");
    let columns = |prefix: &str| -> Vec<&str> {
        table
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("a {prefix} row"))
            .split_whitespace()
            .collect()
    };
    let (header, row) = (columns("client"), columns("prober-agent"));
    assert_eq!(
        header,
        [
            "client",
            "reads",
            "attempts",
            "ok",
            "refusal",
            "transient",
            "throttled",
            "ambiguous",
            "after_ref",
            "no_disc",
            "after_amb",
            "budget",
            "too_soon",
            "probes",
            "avoidable",
            "needed",
            "honored"
        ]
    );
    let cell = |name: &str| row[header.iter().position(|h| *h == name).expect(name)];
    assert_eq!(cell("attempts"), "22");
    assert_eq!(cell("after_ref"), "19");
    assert_eq!(cell("too_soon"), "0");
    assert_eq!(cell("probes"), "2");
    assert_eq!(cell("avoidable"), "19");
    assert_eq!(cell("needed"), "3");
    assert!(table.lines().any(|l| l.starts_with("TOTAL")));
}

#[test]
fn shuffled_and_split_into_files_gives_the_same_report() {
    let config = example("federation.yaml");
    let config = config.to_str().expect("UTF-8");
    let whole = report(&replay(
        &[
            "--config",
            config,
            "--format",
            "json",
            example("federation.jsonl").to_str().expect("UTF-8"),
        ],
        None,
    ));

    let mut shuffled = lines();
    // A fixed permutation: every 7th line, wrapping (29 lines, 7 coprime to 29).
    let n = shuffled.len();
    shuffled = (0..n).map(|i| shuffled[(i * 7) % n].clone()).collect();
    let dir = temp_dir("split");
    let third = n / 3;
    let a = dir.join("a.jsonl");
    let b = dir.join("b.jsonl.gz");
    let c = dir.join("c.jsonl");
    std::fs::write(&a, shuffled[..third].join("\n")).expect("writing");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(shuffled[third..2 * third].join("\n").as_bytes())
        .expect("compressing");
    std::fs::write(&b, gz.finish().expect("compressing")).expect("writing");
    std::fs::write(&c, shuffled[2 * third..].join("\n")).expect("writing");
    let split = report(&replay(
        &[
            "--config",
            config,
            "--format",
            "json",
            c.to_str().expect("UTF-8"),
            b.to_str().expect("UTF-8"),
            "-",
        ],
        Some(std::fs::read(&a).expect("reading").as_slice()),
    ));
    assert_eq!(whole, split);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_line_is_reported_and_the_rest_counted() {
    let mut recording = lines();
    recording.insert(5, "{\"resourceSpans\": [ this is not JSON".to_owned());
    let dir = temp_dir("corrupt");
    let file = dir.join("corrupt.jsonl");
    std::fs::write(&file, recording.join("\n")).expect("writing");
    let config = example("federation.yaml");
    let out = replay(
        &[
            "--config",
            config.to_str().expect("UTF-8"),
            "--format",
            "json",
            file.to_str().expect("UTF-8"),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:6: skipped", file.display())),
        "the line is reported with file and number: {stderr}"
    );
    let r = report(&out);
    assert_eq!(r["malformed_lines"], 1);
    assert_eq!(r["spans"], 29);
    assert_eq!(
        client(&r, "prober-agent")["violations"]["retry_after_refusal"],
        19
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The federation as its MCP server saw it (`examples/federation-server.jsonl`, recorded by
/// `scripts/record-server-federation` from the official MCP Python SDK's server behind the
/// ASGI instrumentation, the clients sending nothing): the same three stories as the client
/// spans tell, and the one instrumented client's calls, exported by both sides, counted once.
#[test]
fn the_federation_from_the_servers_side_tells_the_same_stories() {
    let recording = example("federation-server.jsonl");
    let out = replay(
        &["--format", "json", recording.to_str().expect("UTF-8")],
        None,
    );
    let r = report(&out);
    let prober = client(&r, "prober-agent/1.0");
    assert_eq!(prober["attempts"], 22);
    assert_eq!(prober["violations"]["retry_after_refusal"], 19);
    assert_eq!(prober["violations"]["probe_after_refusal"], 2);
    assert_eq!(prober["avoidable"], 19);
    let assistant = client(&r, "assistant-agent/1.0");
    assert_eq!(assistant["violations"]["retry_after_ambiguous"], 2);
    assert_eq!(assistant["avoidable"], 2);
    let planner = client(&r, "planner-agent/1.0");
    assert_eq!(planner["violations"], serde_json::json!({}));
    assert_eq!(planner["avoidable"], 0);
    // Its two POSTs, each the HTTP span of a call whose MCP span only the server recorded:
    // `initialize` (the read) and `tools/call` (the attempt), each counted once.
    let careful = client(&r, "careful-agent");
    assert_eq!(careful["discovery_reads"], 1);
    assert_eq!(careful["attempts"], 1);
    assert_eq!(careful["classes"], serde_json::json!({ "ok": 1 }));
    assert_eq!(r["total"]["avoidable"], 21);
    let names: Vec<_> = r["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .map(|c| c["client"].as_str().expect("a name").to_owned())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n == "careful-agent/1.0" || n == "unknown_client"),
        "{names:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("federation-server.yaml"),
        "says which configuration it used"
    );
}

/// A span of a hand-made recording: name, kind, span id, parent id, start (ms), attributes.
type JsonSpan<'a> = (&'a str, u8, &'a str, &'a str, u64, &'a [(&'a str, &'a str)]);

/// One OTLP/JSON line of `spans` of `service`.
fn line(service: &str, spans: &[JsonSpan<'_>]) -> String {
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|(name, kind, id, parent, start, attributes)| {
            let t = 1_793_498_400_000_000_000u64 + start * 1_000_000;
            serde_json::json!({
                "traceId": "5eaaa129a740b09f6e77185319f628bf",
                "spanId": id,
                "parentSpanId": parent,
                "name": name,
                "kind": kind,
                "startTimeUnixNano": t.to_string(),
                "endTimeUnixNano": (t + 20_000_000).to_string(),
                "attributes": attributes.iter().map(|(k, v)| serde_json::json!(
                    {"key": k, "value": {"stringValue": v}})).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"spans": spans}],
    }]})
    .to_string()
}

/// A call in four spans over two lines, the HTTP child a line before its MCP parent and the
/// server's span (DESIGN §11): replay counts it once, as the request, with the server's facts.
#[test]
fn a_call_in_several_spans_over_several_lines_is_one_attempt() {
    let dir = temp_dir("calls");
    let config = dir.join("calls.yaml");
    std::fs::write(
        &config,
        "interfaces:
  - name: weather-mcp
    protocol: mcp
    url: http://mcp.test:8080/mcp
    endpoints: [{ path: /mcp, methods: [POST] }]
    server: { service_names: [weather-server] }
",
    )
    .expect("writing");
    let post: &[(&str, &str)] = &[
        ("http.request.method", "POST"),
        ("url.full", "http://mcp.test:8080/mcp"),
        ("http.response.status_code", "200"),
    ];
    let call: &[(&str, &str)] = &[
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "lookup"),
    ];
    let failed: &[(&str, &str)] = &[
        ("mcp.method.name", "tools/call"),
        ("gen_ai.tool.name", "lookup"),
        ("error.type", "tool_error"),
    ];
    let recording = [
        line(
            "agent",
            &[("POST", 3, "0000000000000002", "0000000000000001", 5, post)],
        ),
        line(
            "weather-server",
            &[(
                "tools/call lookup",
                2,
                "0000000000000003",
                "0000000000000001",
                8,
                failed,
            )],
        ),
        line(
            "agent",
            &[(
                "MCP send tools/call lookup",
                3,
                "0000000000000001",
                "",
                0,
                call,
            )],
        ),
    ];
    let file = dir.join("calls.jsonl");
    std::fs::write(&file, recording.join("\n")).expect("writing");
    let out = replay(
        &[
            "--config",
            config.to_str().expect("UTF-8"),
            "--format",
            "json",
            file.to_str().expect("UTF-8"),
        ],
        None,
    );
    let r = report(&out);
    let agent = client(&r, "agent");
    assert_eq!(agent["attempts"], 1, "{r}");
    assert_eq!(
        agent["classes"]["ambiguous"], 1,
        "the server's tool error: {r}"
    );
    assert!(
        !r["clients"]
            .as_array()
            .expect("clients")
            .iter()
            .any(|c| c["client"] == "unknown_client"),
        "{r}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A line with a span nested 100,000 deep (an attribute's value in arrays within arrays) beside
/// a good one: the good span is replayed, and the line reported malformed, never dropped
/// without a word.
#[test]
fn a_line_with_a_span_too_deep_to_read_is_reported_and_the_rest_replayed() {
    let good = line(
        "deep-agent",
        &[(
            "GET",
            3,
            "00f067aa0ba902b7",
            "",
            0,
            &[
                ("http.request.method", "GET"),
                ("url.full", "http://api.test/v1/orders"),
            ],
        )],
    );
    let mut request: serde_json::Value = serde_json::from_str(&good).expect("JSON");
    let spans = &mut request["resourceSpans"][0]["scopeSpans"][0]["spans"];
    let mut deep = spans[0].clone();
    deep["spanId"] = "00f067aa0ba902b8".into();
    spans.as_array_mut().expect("spans").push(deep);
    let text = request.to_string();
    // The second span's last attribute becomes a value 100,000 arrays deep.
    let at = text
        .rfind(r#"{"stringValue":"http://api.test/v1/orders"}"#)
        .expect("there");
    let nested = format!(
        "{}{{\"stringValue\":\"x\"}}{}",
        r#"{"arrayValue":{"values":["#.repeat(100_000),
        "]}}".repeat(100_000)
    );
    let text = format!(
        "{}{}{}",
        &text[..at],
        nested,
        &text[at + r#"{"stringValue":"http://api.test/v1/orders"}"#.len()..]
    );
    let out = replay(&["--format", "json", "-"], Some(text.as_bytes()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("-:1: skipped"), "{stderr}");
    assert!(
        stderr.contains("1 of its spans could not be read"),
        "{stderr}"
    );
    let r = report(&out);
    assert_eq!(r["malformed_lines"], 1);
    assert_eq!(r["spans"], 1, "the good span replayed");
}
