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
    let careful = client(&r, "careful-agent");
    assert_eq!(careful["attempts"], 2);
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
