//! A real OpenTelemetry Collector (tests/collector/, built from the Collector's own Go
//! modules by the README's test command, which names it in `REFUSAL_GATE_COLLECTOR`), run as a
//! process on loopback ports.

use std::time::Duration;

/// The Collector binary, or `None`: failing under the test command, skipping otherwise.
pub fn collector_binary() -> Option<std::path::PathBuf> {
    let binary = std::env::var_os("REFUSAL_GATE_COLLECTOR").map(Into::into);
    if binary.is_none() {
        assert!(
            std::env::var_os("REFUSAL_GATE_REQUIRE_EXTERNAL").is_none(),
            "REFUSAL_GATE_COLLECTOR is not set; the README's test command builds the Collector"
        );
        eprintln!("skipped: no Collector (the README's test command builds one)");
    }
    binary
}

/// A running Collector, killed when dropped.
pub struct Collector {
    _child: super::Reaper,
    /// Its OTLP/gRPC receiver's port.
    pub grpc: u16,
    /// Its OTLP/HTTP receiver's port.
    pub http: u16,
    log: std::path::PathBuf,
}

impl Collector {
    /// Starts `binary` with an OTLP receiver on free ports and `rest` (the `exporters:` and
    /// `service:` sections; `{grpc}` and `{http}` in it stand for the receiver's ports), and
    /// returns once its OTLP/HTTP receiver answers.
    pub async fn start(binary: &std::path::Path, dir: &std::path::Path, rest: &str) -> Collector {
        let ports = (super::free_port(), super::free_port());
        Collector::start_on(binary, dir, rest, ports).await
    }

    /// [`Collector::start`] with its receiver on the ports (`grpc`, `http`): a Collector
    /// restarted where its senders send.
    pub async fn start_on(
        binary: &std::path::Path,
        dir: &std::path::Path,
        rest: &str,
        (grpc, http): (u16, u16),
    ) -> Collector {
        let config = dir.join("collector.yaml");
        let text = format!(
            "receivers:
  otlp:
    protocols:
      grpc: {{ endpoint: 127.0.0.1:{grpc} }}
      http: {{ endpoint: 127.0.0.1:{http} }}
{rest}"
        );
        std::fs::write(&config, text).expect("the Collector's configuration is written");
        let log = dir.join("collector.log");
        let child = super::Reaper(
            std::process::Command::new(binary)
                .arg("--config")
                .arg(&config)
                .stderr(std::fs::File::create(&log).expect("a log file"))
                .spawn()
                .expect("the Collector starts"),
        );
        let collector = Collector {
            _child: child,
            grpc,
            http,
            log,
        };
        for _ in 0..200 {
            let answer = reqwest::Client::new()
                .post(format!("http://127.0.0.1:{http}/v1/traces"))
                .header("content-type", "application/x-protobuf")
                .body(Vec::new())
                .send()
                .await;
            if answer.is_ok() {
                return collector;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the Collector did not come up: {}", collector.log_text());
    }

    /// What it has logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
