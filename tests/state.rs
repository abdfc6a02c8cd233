//! The tracker's state across restarts, black-box with the binary: stopped with SIGTERM
//! after a refusal and started again on the same `state_file`, it counts the retry as a
//! retry after refusal; a corrupt or foreign state file is reported and set aside; a file
//! written by an earlier build still loads.

mod common;

use common::{export, http_span, value, Ports, Reaper};
use std::path::Path;
use std::process::{Child, Stdio};

/// The configuration of these tests, with `tracker_lines` added under `tracker:`.
fn config_with(dir: &Path, tracker_lines: &str) -> (std::path::PathBuf, Ports) {
    common::binary_config(
        dir,
        "config",
        &format!(
            "interfaces:
  - name: orders-api
    protocol: http
    url: http://api.test
    endpoints:
      - path: /v1/orders
tracker:
  state_file: tracker-state.json.gz
{tracker_lines}"
        ),
    )
}

fn config(dir: &Path) -> (std::path::PathBuf, Ports) {
    config_with(dir, "")
}

async fn serve(config: &Path, admin: u16) -> Reaper {
    common::spawn_binary(config, admin, Stdio::piped()).await
}

/// SIGTERM, and the exit status; the process's log.
fn terminate(mut reaper: Reaper) -> String {
    let child: &mut Child = &mut reaper.0;
    common::sigterm(child);
    let exit = child.wait().expect("it exits");
    assert!(exit.success(), "a clean exit on SIGTERM: {exit}");
    let mut log = String::new();
    if let Some(mut err) = child.stderr.take() {
        std::io::Read::read_to_string(&mut err, &mut log).ok();
    }
    log
}

fn retry_after_refusal(m: &str) -> f64 {
    value(
        m,
        "refusal_gate_violations_total",
        &[("client", "storm"), ("violation", "retry_after_refusal")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_retry_storm_still_catches_the_next_retry() {
    let dir = std::env::temp_dir().join(format!("rg-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) = config(&dir);

    // Before the restart: the client reads the contract and is refused an undeclared path.
    let first = serve(&config, ports.admin).await;
    common::post_traces(
        format!("127.0.0.1:{}", ports.http),
        export(
            "storm",
            vec![
                http_span(1, "GET", "http://api.test/openapi.json", 200),
                http_span(2, "POST", "http://api.test/v1/refunds", 404),
            ],
        ),
    )
    .await;
    let before = common::admin_metrics(ports.admin).await;
    assert_eq!(retry_after_refusal(&before), 0.0);
    terminate(first);
    assert!(
        dir.join("tracker-state.json.gz").exists(),
        "written on shutdown"
    );

    // After it: the retry is caught.
    let _second = serve(&config, ports.admin).await;
    common::post_traces(
        format!("127.0.0.1:{}", ports.http),
        export(
            "storm",
            vec![http_span(3, "POST", "http://api.test/v1/refunds", 404)],
        ),
    )
    .await;
    let after = common::admin_metrics(ports.admin).await;
    assert_eq!(
        retry_after_refusal(&after),
        1.0,
        "the refusal survived the restart"
    );
    assert_eq!(value(&after, "refusal_gate_tracker_keys", &[]), 2.0);
    std::fs::remove_dir_all(&dir).ok();
}

/// `tests/fixtures/state/d701a11.json.gz` was written by the build of d701a11 (main when issue
/// 31 was filed), with this file's configuration, after `storm` read the contract and was
/// refused `POST /v1/refunds` (spans 1 and 2 of `http_span`), and stopped with SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_written_by_an_earlier_build_still_loads() {
    let dir = std::env::temp_dir().join(format!("rg-state-old-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    // Its keys were last seen when it was written.
    let (config, ports) = config_with(&dir, "  key_ttl: 87600h\n");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state/d701a11.json.gz");
    std::fs::copy(fixture, dir.join("tracker-state.json.gz")).expect("copied");
    let _server = serve(&config, ports.admin).await;
    assert_eq!(
        value(
            &common::admin_metrics(ports.admin).await,
            "refusal_gate_tracker_keys",
            &[]
        ),
        2.0,
        "both keys restored"
    );
    common::post_traces(
        format!("127.0.0.1:{}", ports.http),
        export(
            "storm",
            vec![http_span(3, "POST", "http://api.test/v1/refunds", 404)],
        ),
    )
    .await;
    assert_eq!(
        retry_after_refusal(&common::admin_metrics(ports.admin).await),
        1.0,
        "the refusal it remembers catches the retry"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_foreign_state_file_is_reported_set_aside_and_never_overwritten() {
    let dir = std::env::temp_dir().join(format!("rg-state-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) = config(&dir);
    let state = dir.join("tracker-state.json.gz");
    let foreign = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(
            &mut gz,
            br#"{"format":"refusal-gate/tracker-state","version":99,"groups":[]}"#,
        )
        .expect("compressed");
        gz.finish().expect("compressed")
    };
    for (contents, says) in [
        (b"not gzip at all".to_vec(), "corrupt"),
        (foreign, "version 99, this build reads version 1"),
    ] {
        std::fs::write(&state, &contents).expect("written");
        let child = serve(&config, ports.admin).await;
        common::post_traces(
            format!("127.0.0.1:{}", ports.http),
            export(
                "fresh",
                vec![http_span(1, "GET", "http://api.test/v1/orders", 200)],
            ),
        )
        .await;
        let m = common::admin_metrics(ports.admin).await;
        assert_eq!(
            value(&m, "refusal_gate_tracker_keys", &[]),
            1.0,
            "it started empty"
        );
        let log = terminate(child);
        assert!(
            log.contains("State file unusable; set aside"),
            "reported: {log}"
        );
        assert!(log.contains(says), "{says}: {log}");
        // Set aside whole, not overwritten by the state written at shutdown (another
        // version's file is a newer release's state, which a rollback must not lose).
        let aside: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .expect("readable")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    n.to_string_lossy()
                        .starts_with("tracker-state.json.gz.unusable-")
                })
            })
            .collect();
        assert_eq!(aside.len(), 1, "{says}: set aside once: {aside:?}");
        assert_eq!(
            std::fs::read(&aside[0]).expect("kept"),
            contents,
            "{says}: whole"
        );
        std::fs::remove_file(&aside[0]).expect("removed");
        assert_ne!(std::fs::read(&state).expect("written anew"), contents);
    }
    std::fs::remove_dir_all(&dir).ok();
}
