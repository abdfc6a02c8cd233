//! The console in a real browser: Debian's `chromium`, headless, loads the page from the
//! binary's admin port after DESIGN §1's federation was sent to it, and the report
//! `replay --format html` writes, from disk; the tests read the DOM the page's script built
//! (`--dump-dom`), as a person would read the page, and save screenshots in
//! `target/console/` to look at. A token-guarded console shows its token form and its API
//! refuses without the token. At the label caps (1,000 clients × 10 interfaces), the API's
//! page and the page's load are measured and printed (`--nocapture`), not asserted.
//!
//! Every client's story is reached the way a person reaches it, in the live console and in
//! the report alike: the fleet page loaded, the client's own link clicked (over Chromium's
//! DevTools protocol), the story read — for names holding every character a URL treats
//! specially.
//!
//! An interface that refused a tool to one client and served it to another is listed on the
//! page with the operation, the time and both calls' traces (DESIGN §13).
//!
//! The README's test command installs `chromium`; without it, plain `cargo test` skips.

mod common;

use common::browser::{file_url, Browser};
use common::{binary_config, chromium, dom, example, external, free_port, spawn_binary};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_refusal-gate");

fn temp_dir(tag: &str) -> PathBuf {
    common::fresh_dir("console", tag)
}

/// Where screenshots go: `target/console/`.
fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console");
    std::fs::create_dir_all(&dir).expect("target/console");
    dir
}

fn screenshot(dir: &Path, url: &str, name: &str) {
    let path = shots().join(name);
    chromium(dir, &[&format!("--screenshot={}", path.display())], url);
    assert!(path.exists(), "{} was saved", path.display());
}

/// Sends every line of a recording (OTLP/JSON export requests) to the OTLP/HTTP receiver.
async fn send_recording(http: u16, recording: &Path) {
    let client = reqwest::Client::new();
    for line in std::fs::read_to_string(recording)
        .expect("the recording")
        .lines()
    {
        let answer = client
            .post(format!("http://127.0.0.1:{http}/v1/traces"))
            .header("content-type", "application/json")
            .body(line.to_owned())
            .send()
            .await
            .expect("the receiver answers");
        assert_eq!(answer.status(), 200);
    }
}

/// The rows of the fleet table, in order: (client, avoidable).
fn fleet_rows(dom: &str) -> Vec<(String, u64)> {
    dom.split("<tr data-client=\"")
        .skip(1)
        .map(|row| {
            let client = row.split('"').next().unwrap_or_default().to_owned();
            let avoidable = row
                .split("data-avoidable=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX);
            (client, avoidable)
        })
        .collect()
}

/// What a person reads on the fleet page and on prober-agent's story, wherever they come from.
fn assert_federation(fleet: &str, story: &str) {
    let rows = fleet_rows(fleet);
    assert_eq!(
        rows.first(),
        Some(&("prober-agent".to_owned(), 19)),
        "prober-agent first, 19 avoidable: {rows:?}"
    );
    assert!(
        rows.contains(&("assistant-agent".to_owned(), 2)),
        "{rows:?}"
    );
    assert!(fleet.contains("id=\"top-chart\""), "the bar chart is drawn");
    assert!(
        fleet.contains("data-alert=\"RetryAfterAuthoritativeRefusal\""),
        "the alert is listed"
    );
    assert!(story.contains("<h1 id=\"story-client\">prober-agent</h1>"));
    assert!(
        story.contains("<h3>POST /mcp/mcp</h3>"),
        "the story names the operation"
    );
    assert!(
        story.contains("retried <code>POST /mcp/mcp</code>")
            && story.contains("after an authoritative 404"),
        "and its retries after the refusal"
    );
    assert!(story.contains("data-violation=\"retry_after_refusal\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_console_tells_the_federations_story_in_a_browser() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("live");
    // `admin.ui.trace_url` (the admin section goes on from the ports binary_config writes).
    let (config, ports) = binary_config(
        &dir,
        "console",
        &format!(
            "  ui: {{ trace_url: \"http://tempo.test/trace/{{trace_id}}\" }}\n{}",
            std::fs::read_to_string(example("federation.yaml")).expect("the interfaces")
        ),
    );
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    send_recording(ports.http, &example("federation.jsonl")).await;

    let base = format!("http://127.0.0.1:{}", ports.admin);
    let fleet = dom(&dir, &format!("{base}/"));
    let story = dom(&dir, &format!("{base}/clients/prober-agent"));
    assert_federation(&fleet, &story);

    // The JSON the page reads (one row of it), as scripts read it: the prober's row links
    // its latest violation to that call's trace.
    let status = reqwest::get(format!("{base}/api/v1/status?limit=1"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("a body");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    let prober = &status["fleet"]["rows"]["rows"][0];
    let trace = prober["last_violation_trace"].as_str().expect("a trace");
    assert!(
        std::fs::read_to_string(example("federation.jsonl"))
            .expect("the recording")
            .contains(&format!("\"traceId\":\"{trace}\"")),
        "{trace} is a trace of the recording"
    );
    let alerted: Vec<&str> = status["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .filter(|a| a["client"] == prober["client"] && a["interface"] == prober["interface"])
        .filter_map(|a| a["trace_id"].as_str())
        .collect();
    assert!(
        alerted.contains(&trace),
        "the latest violating call, as its alert names it: {trace} in {alerted:?}"
    );
    let link = format!("http://tempo.test/trace/{trace}");
    assert_eq!(prober["last_violation_trace_url"], link.as_str());
    assert!(
        fleet.contains(&format!("<a href=\"{link}\" data-trace=\"{trace}\"")),
        "the page links the row's last violation: {fleet}"
    );
    screenshot(&dir, &format!("{base}/"), "fleet.png");
    screenshot(&dir, &format!("{base}/clients/prober-agent"), "story.png");

    // The JSON the page reads, as scripts read it.
    assert_eq!(status["fleet"]["rows"]["total"], 3);
    assert_eq!(status["fleet"]["rows"]["rows"][0]["client"], "prober-agent");
    assert_eq!(status["fleet"]["top"][0]["avoidable"], 19);
    let missing = reqwest::get(format!("{base}/api/v1/clients/nobody"))
        .await
        .expect("answers");
    assert_eq!(missing.status(), 404);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_url_that_would_run_a_script_never_reaches_the_page() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("script-link");
    let interfaces = std::fs::read_to_string(example("federation.yaml")).expect("the interfaces");
    let ui = |template: &str| format!("  ui: {{ trace_url: \"{template}\" }}\n{interfaces}");
    let safe = "http://tempo.test/trace/{trace_id}";
    let hostile = "javascript:alert(document.domain)//{trace_id}";

    // Started with it, the server refuses and names the key: no page is ever served with it.
    let (config, _) = binary_config(&dir, "hostile", &ui(hostile));
    let mut started = Command::new(env!("CARGO_BIN_EXE_refusal-gate"))
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while started.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = started.kill();
            panic!("the server is serving with trace_url {hostile}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let refused = started.wait_with_output().expect("its output");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("admin.ui.trace_url"), "{said}");

    // A running server told to take it on SIGHUP keeps the links it had, as Chromium shows.
    let (config, ports) = binary_config(&dir, "console", &ui(safe));
    let log = dir.join("gate.log");
    let stderr = std::fs::File::create(&log).expect("a log file");
    let gate = spawn_binary(&config, ports.admin, stderr.into()).await;
    send_recording(ports.http, &example("federation.jsonl")).await;
    let text = std::fs::read_to_string(&config).expect("the configuration");
    std::fs::write(&config, text.replace(safe, hostile)).expect("rewritten");
    let hup = Command::new("kill")
        .args(["-HUP", &gate.0.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(hup.success());
    // The reload is refused, and said so, before the page is looked at.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .expect("the log")
        .contains("Reload refused")
    {
        assert!(Instant::now() < deadline, "no refused reload was logged");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let fleet = dom(&dir, &format!("http://127.0.0.1:{}/", ports.admin));
    assert!(
        fleet.contains("<a href=\"http://tempo.test/trace/"),
        "the row's trace link: {fleet}"
    );
    assert!(!fleet.contains("javascript:"), "{fleet}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interface_that_refused_and_served_a_tool_is_listed_with_both_calls() {
    use common::{export, http_span, kv};
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("contradicted");
    let interfaces = std::fs::read_to_string(example("federation.yaml")).expect("the interfaces");
    let extra =
        format!("  ui: {{ trace_url: \"http://tempo.test/trace/{{trace_id}}\" }}\n{interfaces}");
    let (config, ports) = binary_config(&dir, "console", &extra);
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    let call = |i: u64, trace: u8, code: Option<i64>| {
        let mut span = http_span(i, "POST", "http://mcp.test:8080/mcp", 200);
        span.trace_id = vec![trace; 16];
        span.attributes.extend([
            kv("mcp.method.name", Value::StringValue("tools/call".into())),
            kv("gen_ai.tool.name", Value::StringValue("export".into())),
        ]);
        if let Some(code) = code {
            span.attributes.push(kv(
                "rpc.response.status_code",
                Value::StringValue(code.to_string()),
            ));
        }
        span
    };
    let read = http_span(0, "GET", "http://mcp.test:8080/.well-known/mcp.json", 200);
    let client = reqwest::Client::new();
    for (service, spans) in [
        ("refused-agent", vec![read, call(1, 0xaa, Some(-32601))]),
        ("served-agent", vec![call(2, 0xbb, None)]),
    ] {
        let answer = client
            .post(format!("http://127.0.0.1:{}/v1/traces", ports.http))
            .header("content-type", "application/x-protobuf")
            .body(export(service, spans))
            .send()
            .await
            .expect("the receiver answers");
        assert_eq!(answer.status(), 200);
    }
    let page = dom(&dir, &format!("http://127.0.0.1:{}/", ports.admin));
    let listed = page
        .split("<li data-kind=\"refusal_contradicted\">")
        .nth(1)
        .and_then(|rest| rest.split("</li>").next())
        .unwrap_or_else(|| panic!("no contradiction listed: {page}"));
    assert!(
        listed.contains("<code>tools/call export</code>"),
        "{listed}"
    );
    for trace in ["bb", "aa"] {
        assert!(
            listed.contains(&format!("http://tempo.test/trace/{}", trace.repeat(16))),
            "both calls' traces, the later first: {listed}"
        );
    }
    screenshot(
        &dir,
        &format!("http://127.0.0.1:{}/", ports.admin),
        "contradicted.png",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guarded_console_asks_for_the_token_and_its_api_refuses_without_it() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("token");
    let (grpc, http, admin) = (free_port(), free_port(), free_port());
    let config = dir.join("guarded.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:
  otlp:
    grpc: {{ endpoint: 127.0.0.1:{grpc} }}
    http: {{ endpoint: 127.0.0.1:{http} }}
admin:
  endpoint: 127.0.0.1:{admin}
  auth: {{ tokens: [s3cret] }}
"
        ),
    )
    .expect("the configuration is written");
    let _gate = spawn_binary(&config, admin, std::process::Stdio::null()).await;
    let base = format!("http://127.0.0.1:{admin}");

    let page = dom(&dir, &format!("{base}/"));
    assert!(
        page.contains("A bearer token is required"),
        "the page asks for the token"
    );
    assert!(!page.contains("id=\"fleet\""), "and shows no data");
    screenshot(&dir, &format!("{base}/"), "token.png");
    let client = reqwest::Client::new();
    for path in ["/api/v1/status", "/api/v1/clients/prober-agent", "/metrics"] {
        let refused = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("answers");
        assert_eq!(refused.status(), 401, "{path}");
    }
    let admitted = client
        .get(format!("{base}/api/v1/status"))
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("answers");
    assert_eq!(admitted.status(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_replay_report_tells_the_same_story_from_disk() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("report");
    let out = Command::new(BIN)
        .args(["replay", "--format", "html"])
        .arg(example("federation.jsonl"))
        .output()
        .expect("replay runs");
    assert!(out.status.success());
    let html = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "nothing is fetched"
    );
    let report = dir.join("report.html");
    std::fs::write(&report, &html).expect("the report is written");
    let url = file_url(&report);
    let fleet = dom(&dir, &url);
    let story = dom(&dir, &format!("{url}#/clients/prober-agent"));
    assert_federation(&fleet, &story);
    screenshot(&dir, &url, "report.png");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_label_caps_the_page_stays_small_and_its_load_is_measured() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("caps");
    let (config, ports) = binary_config(&dir, "caps", "");
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    // 1,000 clients × 10 interfaces (origins): 10,000 pairs, the default max_series.
    let client = reqwest::Client::new();
    for c in 0..1000u64 {
        let spans = (0..10u64)
            .map(|i| {
                let mut s = common::http_span(
                    i,
                    "POST",
                    &format!("http://api-{i}.test/items"),
                    if c % 3 == 0 { 404 } else { 200 },
                );
                s.span_id = (c * 100 + i + 1).to_be_bytes().to_vec();
                s
            })
            .collect();
        let answer = client
            .post(format!("http://127.0.0.1:{}/v1/traces", ports.http))
            .header("content-type", "application/x-protobuf")
            .body(common::export(&format!("agent-{c:04}"), spans))
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), 200);
    }
    let base = format!("http://127.0.0.1:{}", ports.admin);
    let started = Instant::now();
    let status = reqwest::get(format!("{base}/api/v1/status"))
        .await
        .expect("answers")
        .text()
        .await
        .expect("a body");
    let api = started.elapsed();
    let json: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(json["fleet"]["rows"]["total"], 10_000);
    assert_eq!(
        json["fleet"]["rows"]["rows"].as_array().map(Vec::len),
        Some(50),
        "one page"
    );
    let started = Instant::now();
    let page = dom(&dir, &format!("{base}/"));
    let load = started.elapsed();
    assert_eq!(fleet_rows(&page).len(), 50);
    // The page notes when its first view was on screen (performance.now(), from navigation).
    let shown = page
        .split("data-shown-ms=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("?");
    eprintln!(
        "console at 1,000 clients x 10 interfaces: /api/v1/status {} KiB in {api:?}; \
         the page's first view on screen {shown} ms after navigation; headless chromium \
         start to exit {load:?}",
        status.len() / 1024
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Client names holding what a URL treats specially: `'`, `"`, `%`, `#`, `?`, `/`, `&`,
/// spaces, U+2028 and letters beyond ASCII, alone and all together.
const AWKWARD_NAMES: [&str; 11] = [
    "it's-agent",
    "say \"hi\"",
    "100% sure",
    "agent#7",
    "what?x=1",
    "team/agent",
    "a&b=c",
    "two  spaced agent",
    "line\u{2028}separated",
    "ñandú-日本-агент",
    "'\"%#?/& \u{2028}é %41",
];

/// One export request (OTLP/JSON) of `client`'s one call: a GET answered 404, then again.
fn one_call(k: usize, client: &str) -> String {
    let string =
        |key: &str, value: &str| serde_json::json!({"key": key, "value": {"stringValue": value}});
    let start = 1_793_498_400_000_000_000u64;
    let spans: Vec<serde_json::Value> = (0..2u64)
        .map(|n| {
            serde_json::json!({
                "traceId": format!("{:032x}", k * 2 + n as usize + 1),
                "spanId": format!("{:016x}", n + 1),
                "name": "GET",
                "kind": 3,
                "startTimeUnixNano": (start + n * 1_000_000_000).to_string(),
                "endTimeUnixNano": (start + n * 1_000_000_000 + 20_000_000).to_string(),
                "attributes": [
                    string("http.request.method", "GET"),
                    string("url.full", "http://api.test/x"),
                    {"key": "http.response.status_code", "value": {"intValue": "404"}},
                ],
            })
        })
        .collect();
    serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [string("service.name", client)]},
        "scopeSpans": [{"spans": spans}],
    }]})
    .to_string()
}

/// On the fleet page at `fleet`, clicks `client`'s link in its row and checks that the story
/// it opens is `client`'s, with its operation told.
fn click_to_story(browser: &mut Browser, fleet: &str, client: &str) {
    let name = serde_json::to_string(client).expect("a JS string");
    browser.navigate(fleet);
    let row = format!(
        "[...document.querySelectorAll('tr[data-client] a')].find((a) => a.closest('tr').dataset.client === {name})"
    );
    browser.wait_for(
        &format!("!!({row})"),
        &format!("{client:?}'s row on {fleet}"),
    );
    browser.wait_for(&format!("({row}).click() ?? true"), "the click");
    let shown = browser.wait_for(
        &format!(
            "(() => {{ const h = document.getElementById('story-client'); \
             return h && h.textContent === {name} && document.querySelector('#story .op h3') \
             && document.querySelector('#story .op h3').textContent; }})()"
        ),
        &format!("the story of {client:?}, opened from its link"),
    );
    assert_eq!(shown, "GET /x", "{client:?}'s story names its operation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_clients_link_opens_its_story_whatever_its_name() {
    if !external("chromium") {
        return;
    }
    let dir = temp_dir("links");
    let recording = dir.join("names.jsonl");
    let lines: Vec<String> = AWKWARD_NAMES
        .iter()
        .enumerate()
        .map(|(k, client)| one_call(k, client))
        .collect();
    std::fs::write(&recording, lines.join("\n")).expect("written");

    // The live console.
    let (config, ports) = binary_config(&dir, "links", "");
    let _gate = spawn_binary(&config, ports.admin, std::process::Stdio::null()).await;
    send_recording(ports.http, &recording).await;
    let live = format!("http://127.0.0.1:{}/", ports.admin);

    // The report of the same recording.
    let out = Command::new(BIN)
        .args(["replay", "--format", "html"])
        .arg(&recording)
        .output()
        .expect("replay runs");
    assert!(out.status.success());
    let report = dir.join("report.html");
    std::fs::write(&report, &out.stdout).expect("the report is written");
    let report = format!("{}#/", file_url(&report));

    let browser_dir = dir.clone();
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(&browser_dir);
        for client in AWKWARD_NAMES {
            click_to_story(&mut browser, &live, client);
            click_to_story(&mut browser, &report, client);
        }
    })
    .await
    .expect("every story opens");
    let _ = std::fs::remove_dir_all(&dir);
}
