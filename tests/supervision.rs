//! Supervision: a task that should run until shutdown and ends by itself — here the OTLP/HTTP
//! receiver's serve loop, failed by the debug builds' test-only hook (`REFUSAL_GATE_FAIL`) —
//! turns `/readyz` to 503 at once, and the binary shuts down in stages and exits non-zero,
//! saying which task ended.

mod common;

use common::{binary_config, spawn_binary, CONFIG};
use refusal_gate::app::Server;
use refusal_gate::config::Config;
use std::time::Duration;

const FAILING: &str = "OTLP/HTTP receiver";

async fn status(url: &str) -> Option<u16> {
    reqwest::get(url).await.ok().map(|r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_fails_turns_readyz_503_and_the_binary_exits_non_zero() {
    // The binary: it comes up ready, then exits with an error naming the task.
    let dir = std::env::temp_dir().join(format!("refusal-gate-supervision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) = binary_config(&dir, "supervised", "");
    let log = dir.join("server.log");
    let stderr = std::fs::File::create(&log).expect("a log file");
    std::env::set_var("REFUSAL_GATE_FAIL", FAILING);
    let mut binary = spawn_binary(&config, ports.admin, stderr.into()).await;
    let exit = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = binary.0.try_wait().expect("waitable") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the binary did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .expect("joined");
    assert_eq!(exit.code(), Some(2), "a non-zero exit");
    let log = std::fs::read_to_string(&log).expect("the log");
    assert!(
        log.contains("A task ended unexpectedly; not ready."),
        "{log}"
    );
    assert!(
        log.contains(&format!("the {FAILING} ended unexpectedly")),
        "{log}"
    );
    assert!(
        log.contains("refusal-gate stopped."),
        "the staged shutdown ran: {log}"
    );

    // In process, where nothing shuts it down: /readyz is 503 once the receiver has ended,
    // while the process stays alive (/healthz 200).
    let mut server = Server::start(&Config::parse(CONFIG).expect("valid"))
        .await
        .expect("starts");
    let admin = server.bound.admin;
    assert_eq!(status(&format!("http://{admin}/readyz")).await, Some(200));
    let ended = tokio::time::timeout(Duration::from_secs(10), server.ended())
        .await
        .expect("the injected failure happens");
    assert_eq!(ended, FAILING);
    assert_eq!(status(&format!("http://{admin}/readyz")).await, Some(503));
    assert_eq!(status(&format!("http://{admin}/healthz")).await, Some(200));
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
