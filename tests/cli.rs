//! Black-box tests of the `refusal-gate` binary: its commands, its refusal of bad
//! configuration before binding any port, graceful shutdown, and serving on the embedded
//! defaults with no arguments at all.

mod common;

use common::{free_port, value};
use opentelemetry::trace::{SpanKind, Tracer, TracerProvider as _};
use opentelemetry::KeyValue;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_refusal-gate");

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("refusal-gate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing the file");
    path
}

fn config_on(grpc: u16, http: u16, admin: u16) -> String {
    format!(
        "receivers:\n  otlp:\n    grpc: {{ endpoint: 127.0.0.1:{grpc} }}\n    http: {{ endpoint: 127.0.0.1:{http} }}\nadmin:\n  endpoint: 127.0.0.1:{admin}\n"
    )
}

fn wait_healthy(child: &mut Child, admin: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        assert!(
            child.try_wait().expect("the child can be polled").is_none(),
            "refusal-gate exited early"
        );
        if std::net::TcpStream::connect(admin).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("refusal-gate did not listen on {admin} within 20 s");
}

fn terminate(child: &mut Child) -> (std::process::ExitStatus, Duration) {
    let started = Instant::now();
    common::sigterm(child);
    let deadline = started + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("the child can be polled") {
            return (status, started.elapsed());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("refusal-gate did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn default_config_prints_a_file_that_validates() {
    let out = Command::new(BIN)
        .arg("default-config")
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    for key in [
        "receivers:",
        "max_request_body_size_mib: 20",
        "probe_window: 10m",
        "max_keys: 500000",
        "max_clients: 1000",
    ] {
        assert!(text.contains(key), "default-config lacks {key}");
    }
    let path = temp_file("default.yaml", &text);
    let out = Command::new(BIN)
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_configuration_is_refused_with_the_key_named() {
    let cases = [
        (
            "tracker:\n  max_retries: 3\n  probe_windw: 10m\n",
            "probe_windw",
        ),
        (
            "tracker:\n  probe_window: ten minutes\n",
            "tracker.probe_window",
        ),
        (
            "interfaces:\n  - name: x\n    protocol: mcp\n    url: nowhere\n",
            "interfaces[0].url",
        ),
        // Templates the console would render as a live link that runs a script.
        (
            "admin:\n  ui: { trace_url: \"javascript:alert(1)//{trace_id}\" }\n",
            "admin.ui.trace_url",
        ),
        (
            "admin:\n  ui: { trace_url: \"JavaScript://%0Aalert(1)/{trace_id}\" }\n",
            "admin.ui.trace_url",
        ),
        (
            "admin:\n  ui: { trace_url: \"data:text/html,<script>x</script>{trace_id}\" }\n",
            "admin.ui.trace_url",
        ),
        (
            "admin:\n  ui: { trace_url: \" https://tempo.test/{trace_id}\" }\n",
            "admin.ui.trace_url",
        ),
        // A joiner that forwards nowhere, and a role there is not.
        ("tracker:\n  role: join\n", "tracker.role"),
        ("tracker:\n  role: relay\n", "tracker.role"),
    ];
    for (text, key) in cases {
        let path = temp_file("bad.yaml", text);
        for command in [&["validate", "--config"][..], &["serve", "--config"][..]] {
            let out = Command::new(BIN)
                .args(command)
                .arg(&path)
                .output()
                .expect("runs");
            assert!(!out.status.success(), "{command:?} accepted {text:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(key),
                "{command:?}: {stderr:?} does not name {key}"
            );
        }
    }
    let out = Command::new(BIN)
        .args(["validate", "--config", "/nonexistent/refusal-gate.yaml"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/refusal-gate.yaml"));
}

#[test]
fn a_bad_configuration_binds_no_port() {
    let admin = free_port();
    let text = format!(
        "{}tracker:\n  max_keys: 0\n",
        config_on(free_port(), free_port(), admin)
    );
    let path = temp_file("unbound.yaml", &text);
    let out = Command::new(BIN)
        .args(["--config"])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tracker.max_keys"));
    TcpListener::bind(("127.0.0.1", admin)).expect("the admin port was never bound");
}

#[test]
fn a_tls_file_that_holds_no_certificate_fails_validate_and_the_start_naming_it() {
    let not_pem = temp_file("not-a-ca.pem", "this is no certificate\n");
    let exporter = |protocol: &str| {
        format!(
            "exporters:\n  otlp: {{ endpoint: 'https://127.0.0.1:1', protocol: {protocol}, tls: {{ ca_file: {} }} }}\n",
            not_pem.display()
        )
    };
    let base = || config_on(free_port(), free_port(), free_port());
    let listener = base().replacen(
        " }\n",
        &format!(
            ", tls: {{ cert_file: {0}, key_file: {0} }} }}\n",
            not_pem.display()
        ),
        1,
    );
    let cases = [
        (base() + &exporter("grpc"), "exporters.otlp.tls.ca_file"),
        (
            base() + &exporter("http/protobuf"),
            "exporters.otlp.tls.ca_file",
        ),
        (listener, "receivers.otlp.grpc.tls: cert_file"),
    ];
    for (text, setting) in cases {
        let path = temp_file("bad-tls-file.yaml", &text);
        for command in ["validate", "serve"] {
            let out = Command::new(BIN)
                .args([command, "--config"])
                .arg(&path)
                .output()
                .expect("runs");
            assert_eq!(out.status.code(), Some(2), "{command}: {setting}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(setting) && stderr.contains("not-a-ca.pem"),
                "{command}: {setting}: {stderr}"
            );
        }
    }
}

#[test]
fn a_port_conflict_exits_non_zero_at_once() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("an address").port();
    let path = temp_file("conflict.yaml", &config_on(free_port(), port, free_port()));
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

#[test]
fn sigterm_stops_it_gracefully() {
    let admin = free_port();
    let path = temp_file("term.yaml", &config_on(free_port(), free_port(), admin));
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&path)
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_healthy(&mut child, SocketAddr::from(([127, 0, 0, 1], admin)));
    let (status, took) = terminate(&mut child);
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// `refusal-gate` with no arguments serves on 127.0.0.1:4317/4318/9464, and a span sent by
/// `opentelemetry-otlp` to the default endpoint shows up in `/metrics`.
#[test]
fn no_arguments_serves_on_the_default_ports() {
    for port in [4317, 4318, 9464] {
        TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("port {port} must be free for this test: {e}"));
    }
    let mut child = Command::new(BIN)
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_healthy(&mut child, SocketAddr::from(([127, 0, 0, 1], 9464)));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let provider = runtime.block_on(async {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .expect("the exporter builds with its default endpoint");
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("default-ports")
                    .build(),
            )
            .with_batch_exporter(exporter)
            .build()
    });
    let tracer = provider.tracer("cli");
    tracer
        .span_builder("GET")
        .with_kind(SpanKind::Client)
        .with_attributes(vec![
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("url.full", "http://api.test/x"),
            KeyValue::new("http.response.status_code", 503),
        ])
        .start(&tracer);
    provider.force_flush().expect("the export succeeds");
    let metrics = runtime.block_on(async {
        reqwest::get("http://127.0.0.1:9464/metrics")
            .await
            .expect("the admin port answers")
            .text()
            .await
            .expect("a body")
    });
    let (status, _) = terminate(&mut child);
    assert!(status.success());
    assert_eq!(
        value(
            &metrics,
            "refusal_gate_attempts_total",
            &[("client", "default-ports"), ("class", "transient")]
        ),
        1.0,
        "{metrics}"
    );
}

#[test]
fn validate_reads_documents_and_names_where_they_are_wrong() {
    let doc = temp_file(
        "broken-card.json",
        "{\"openapi\": \"3.0.0\",\n \"paths\": [1, 2]}",
    );
    let text = format!(
        "interfaces:\n  - name: broken\n    protocol: http\n    url: http://x.test\n    discovery:\n      document: {{ file: '{}' }}\n",
        doc.display()
    );
    let path = temp_file("with-doc.yaml", &text);
    let out = Command::new(BIN)
        .args(["validate", "--config"])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("broken-card.json") && stderr.contains("$.paths"),
        "{stderr}"
    );
}

#[test]
fn sighup_reloads_the_interfaces() {
    let admin = free_port();
    let dir = std::env::temp_dir().join(format!("refusal-gate-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let card = |url: &str| {
        format!("{{\"title\": \"Hup\", \"remotes\": [{{\"type\": \"streamable-http\", \"url\": \"{url}\"}}]}}")
    };
    std::fs::write(dir.join("hup.json"), card("http://hup.test/mcp")).expect("writing the card");
    let text = format!(
        "{}interfaces_from: ['hup.json']\n",
        config_on(free_port(), free_port(), admin)
    );
    std::fs::write(dir.join("hup.yaml"), text).expect("writing the configuration");
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(dir.join("hup.yaml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_healthy(&mut child, SocketAddr::from(([127, 0, 0, 1], admin)));
    std::fs::write(dir.join("hup.json"), card("http://hup.test/mcp2")).expect("rewriting the card");
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(hup.success());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut loaded = 0.0;
    while Instant::now() < deadline && loaded < 2.0 {
        std::thread::sleep(Duration::from_millis(100));
        let m = runtime.block_on(async {
            reqwest::get(format!("http://127.0.0.1:{admin}/metrics"))
                .await
                .expect("the admin port answers")
                .text()
                .await
                .expect("a body")
        });
        loaded = value(
            &m,
            "refusal_gate_discovery_document_loads_total",
            &[("interface", "Hup"), ("outcome", "loaded")],
        );
    }
    let (status, _) = terminate(&mut child);
    assert!(status.success());
    assert_eq!(loaded, 2.0, "the document was loaded again on SIGHUP");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_load_generator_says_its_options_and_refuses_one_it_does_not_have() {
    // `cargo test` builds the examples beside the test binaries: target/<profile>/examples.
    let exe = std::env::current_exe().expect("the test binary");
    let loadgen = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>")
        .join("examples/loadgen");
    let help = Command::new(&loadgen)
        .arg("--help")
        .output()
        .expect("loadgen runs");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for option in [
        "--protocol",
        "--clients",
        "--workload",
        "--server-view",
        "--connections",
    ] {
        assert!(text.contains(option), "{option} in\n{text}");
    }
    assert!(text.contains("[default: 100]"), "each default said: {text}");
    let bad = Command::new(&loadgen)
        .args(["--bogus", "1"])
        .output()
        .expect("loadgen runs");
    assert_eq!(bad.status.code(), Some(2), "a usage error, not a panic");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unexpected argument '--bogus'"));
}
