//! `refusal-gate replay`: recorded traces, analysed offline through the same pipeline as
//! the server, and a report of what each client wasted.
//!
//! Edge. It reads OTLP JSON lines (one `ExportTraceServiceRequest` a line, as the
//! Collector's file exporter writes them; plain, gzip, or `-` for standard input), feeds every
//! line to the server's own [`Pipeline`] with the tracker's clock following span time, and
//! settles everything at the end — so arrival order across lines and files does not matter.
//! The report is read back from the pipeline's own Prometheus counters ([`Report::from_metrics`]):
//! nothing is counted twice or a second way.

use crate::config::{Config, MetricsConfig};
use crate::discovery::loader::{self, Catalog};
use crate::metrics::Metrics;
use crate::otlp::{json, wire};
use crate::pipeline::{Encoding, IngestError, Pipeline, Transport};
use crate::tracker::Tracker;
use crate::tracker::Violation;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::Path;
use std::sync::Arc;

/// What one client did, summed over its instances and interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientReport {
    /// `service.name`.
    pub client: String,
    /// Attempts at operations: every attempt but the discovery reads.
    pub attempts: u64,
    /// Successful reads of a discovery document (counted apart: they are how a client
    /// learns the contract, not attempts at an operation).
    pub discovery_reads: u64,
    /// Attempts by class (`ok`, `refusal`, `transient`, `throttled`, `ambiguous`);
    /// `ok` does not count the discovery reads.
    pub classes: BTreeMap<String, u64>,
    /// Violations by kind.
    pub violations: BTreeMap<String, u64>,
    /// Requests a client following the decision boundary would not have sent.
    pub avoidable: u64,
    /// The requests such a client would have needed: attempts less avoidable ones.
    pub needed: u64,
    /// Refusals not retried within `probe_window`.
    pub honored: u64,
}

impl ClientReport {
    fn add(&mut self, other: &ClientReport) {
        self.attempts += other.attempts;
        self.discovery_reads += other.discovery_reads;
        for (k, v) in &other.classes {
            *self.classes.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.violations {
            *self.violations.entry(k.clone()).or_default() += v;
        }
        self.avoidable += other.avoidable;
        self.needed += other.needed;
        self.honored += other.honored;
    }
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// One row per client, most avoidable requests first.
    pub clients: Vec<ClientReport>,
    /// All clients together.
    pub total: ClientReport,
    /// Spans read.
    pub spans: u64,
    /// Lines that were not OTLP JSON, skipped.
    pub malformed_lines: u64,
}

fn label<'a>(m: &'a prometheus::proto::Metric, name: &str) -> &'a str {
    m.get_label()
        .iter()
        .find(|l| l.name() == name)
        .map_or("", |l| l.value())
}

impl Report {
    /// Builds the report from the pipeline's counters.
    pub fn from_metrics(metrics: &Metrics) -> Report {
        let mut clients: BTreeMap<String, ClientReport> = BTreeMap::new();
        let mut spans = 0;
        for family in metrics.gather() {
            for m in family.get_metric() {
                let n = m.get_counter().get_value() as u64;
                if family.name() == "refusal_gate_receiver_accepted_spans_total" {
                    spans += n;
                    continue;
                }
                let client = label(m, "client");
                if client.is_empty() {
                    continue;
                }
                let row = clients
                    .entry(client.to_owned())
                    .or_insert_with(|| ClientReport {
                        client: client.to_owned(),
                        ..ClientReport::default()
                    });
                match family.name() {
                    "refusal_gate_attempts_total" => {
                        row.attempts += n;
                        *row.classes.entry(label(m, "class").to_owned()).or_default() += n;
                    }
                    "refusal_gate_violations_total" => {
                        let violation = label(m, "violation");
                        *row.violations.entry(violation.to_owned()).or_default() += n;
                        if Violation::ALL
                            .iter()
                            .any(|v| v.as_str() == violation && v.is_avoidable())
                        {
                            row.avoidable += n;
                        }
                    }
                    "refusal_gate_refusals_honored_total" => row.honored += n,
                    "refusal_gate_discovery_reads_total" => row.discovery_reads += n,
                    _ => {}
                }
            }
        }
        let mut clients: Vec<ClientReport> = clients
            .into_values()
            .filter(|c| c.attempts > 0)
            .map(|mut c| {
                // A discovery read is an `ok` attempt of its own; set it apart.
                c.attempts = c.attempts.saturating_sub(c.discovery_reads);
                if let Some(ok) = c.classes.get_mut("ok") {
                    *ok = ok.saturating_sub(c.discovery_reads);
                }
                c.needed = c.attempts.saturating_sub(c.avoidable);
                c
            })
            .collect();
        clients.sort_by(|a, b| {
            b.avoidable
                .cmp(&a.avoidable)
                .then_with(|| a.client.cmp(&b.client))
        });
        let mut total = ClientReport {
            client: "TOTAL".to_owned(),
            ..ClientReport::default()
        };
        for c in &clients {
            total.add(c);
        }
        Report {
            clients,
            total,
            spans,
            malformed_lines: 0,
        }
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        const CLASSES: [&str; 5] = ["ok", "refusal", "transient", "throttled", "ambiguous"];
        let width = self
            .clients
            .iter()
            .map(|c| c.client.len())
            .max()
            .unwrap_or(0)
            .max(6);
        let mut out = format!("{:<width$} {:>5} {:>8}", "client", "reads", "attempts");
        for c in CLASSES {
            out.push_str(&format!(" {c:>9}"));
        }
        for v in Violation::ALL {
            out.push_str(&format!(" {:>9}", short(v)));
        }
        out.push_str(&format!(
            " {:>9} {:>7} {:>7}\n",
            "avoidable", "needed", "honored"
        ));
        for row in self.clients.iter().chain(std::iter::once(&self.total)) {
            out.push_str(&format!(
                "{:<width$} {:>5} {:>8}",
                row.client, row.discovery_reads, row.attempts
            ));
            for c in CLASSES {
                out.push_str(&format!(" {:>9}", row.classes.get(c).copied().unwrap_or(0)));
            }
            for v in Violation::ALL {
                out.push_str(&format!(
                    " {:>9}",
                    row.violations.get(v.as_str()).copied().unwrap_or(0)
                ));
            }
            out.push_str(&format!(
                " {:>9} {:>7} {:>7}\n",
                row.avoidable, row.needed, row.honored
            ));
        }
        out.push_str(&format!(
            "{} spans read, {} malformed lines skipped\nreads: discovery documents read (not attempts); after_ref: retries after refusal; no_disc: retries without discovery;\nafter_amb: retries after ambiguous; budget: retries past the budget; too_soon: retries before the server's Retry-After;\nprobes: probes after refusal (reported, not avoidable)\n",
            self.spans, self.malformed_lines
        ));
        out
    }
}

fn short(v: Violation) -> &'static str {
    match v {
        Violation::RetryAfterRefusal => "after_ref",
        Violation::RetryWithoutDiscovery => "no_disc",
        Violation::RetryAfterAmbiguous => "after_amb",
        Violation::RetryBudgetExhausted => "budget",
        Violation::RetryBeforeRetryAfter => "too_soon",
        Violation::ProbeAfterRefusal => "probes",
    }
}

/// A malformed line: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// The file (`-` for standard input).
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// What was wrong.
    pub error: String,
}

/// Replays recordings through one pipeline.
pub struct Replay {
    pipeline: Pipeline,
    bad: Vec<BadLine>,
    malformed: u64,
    /// The latest span time replayed so far: the tracker's clock.
    latest: crate::clock::Nanos,
}

/// Bad lines kept for reporting; the rest are only counted.
const BAD_LINES_KEPT: usize = 100;

impl Replay {
    /// A replay under `config`'s interfaces and tracker settings. The caps on distinct label
    /// values are lifted (a report names every client); names are cut to
    /// `metrics.max_label_bytes` as when serving, so a report names a client as `/metrics` does.
    pub fn new(config: &Config) -> Replay {
        let (interfaces, documents, reports) = loader::load_local(config);
        for r in reports.iter().filter(|r| r.error.is_some()) {
            eprintln!(
                "refusal-gate: {}: {}",
                r.source,
                r.error.as_deref().unwrap_or("")
            );
        }
        let metrics = MetricsConfig {
            max_clients: usize::MAX,
            max_interfaces: usize::MAX,
            max_series: usize::MAX,
            // A replay never sweeps; its report shows every pair.
            series_ttl: std::time::Duration::ZERO,
            max_label_bytes: config.metrics.max_label_bytes,
        };
        Replay {
            pipeline: Pipeline::new(
                Arc::new(Catalog::new(interfaces, documents)),
                // It settles at the end, whatever the order of its lines.
                Tracker::new(&config.tracker).settling_only_when_asked(),
                Metrics::new(&metrics),
                &config.alerting,
            ),
            bad: Vec::new(),
            malformed: 0,
            latest: 0,
        }
    }

    /// Reads one recording: `-` is standard input; gzip is recognised by its magic bytes.
    /// `progress` shows a bar on standard error.
    ///
    /// # Errors
    /// When the file cannot be opened or read (a malformed line is not an error: it is
    /// reported and skipped).
    pub fn read(&mut self, name: &str, progress: bool) -> std::io::Result<()> {
        let (raw, size): (Box<dyn Read>, Option<u64>) = if name == "-" {
            (Box::new(std::io::stdin().lock()), None)
        } else {
            let file = std::fs::File::open(Path::new(name))?;
            let size = file.metadata().ok().map(|m| m.len());
            (Box::new(file), size)
        };
        let bar = progress.then(|| progress_bar(name, size));
        let raw: Box<dyn Read> = match &bar {
            Some(bar) => Box::new(bar.wrap_read(raw)),
            None => raw,
        };
        let mut reader = BufReader::with_capacity(1 << 20, raw);
        let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn BufRead> = if gzip {
            Box::new(BufReader::with_capacity(
                1 << 20,
                flate2::read::MultiGzDecoder::new(reader),
            ))
        } else {
            Box::new(reader)
        };
        for (n, line) in reader.split(b'\n').enumerate() {
            let line = line?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            // The tracker's clock follows span time: each line is taken at its latest end.
            let replayed = json::to_protobuf(&line)
                .map_err(IngestError::from)
                .and_then(|(protobuf, left_out)| {
                    let now = wire::latest_end(&protobuf).max(self.latest);
                    self.latest = now;
                    let encoding = Encoding::Protobuf;
                    self.pipeline
                        .handle(Transport::Http, &protobuf, encoding, now)
                        .map(|_| left_out)
                });
            // A line some of whose spans could not be read (nested too deep, an id that is not
            // hex) is malformed too: the rest of it is replayed.
            let replayed = match replayed {
                Ok(0) => Ok(()),
                Ok(left_out) => Err(format!(
                    "{left_out} of its spans could not be read; the rest replayed"
                )),
                Err(e) => Err(e.to_string()),
            };
            match replayed {
                Ok(()) => {}
                Err(e) => {
                    self.malformed += 1;
                    if self.bad.len() < BAD_LINES_KEPT {
                        self.bad.push(BadLine {
                            file: name.to_owned(),
                            line: n as u64 + 1,
                            error: e,
                        });
                    }
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(())
    }

    /// Settles everything and builds the report; returns it with the malformed lines.
    pub fn finish(self) -> (Report, Vec<BadLine>) {
        let (report, bad, _, _) = self.finish_with_pipeline();
        (report, bad)
    }

    /// As [`Replay::finish`], keeping the pipeline (for the HTML report's stories).
    fn finish_with_pipeline(self) -> (Report, Vec<BadLine>, Pipeline, crate::clock::Nanos) {
        self.pipeline.finish(self.latest);
        let mut report = Report::from_metrics(self.pipeline.metrics());
        report.malformed_lines = self.malformed;
        (report, self.bad, self.pipeline, self.latest)
    }
}

fn progress_bar(name: &str, size: Option<u64>) -> indicatif::ProgressBar {
    let bar = match size {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(name.to_owned());
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar
}

/// What `replay` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The table.
    Table,
    /// The report as JSON.
    Json,
    /// One self-contained HTML page: the console's fleet and every client's story.
    Html,
}

/// The replay command: reads every file, prints the report (a table, JSON, or an HTML page)
/// on standard output and the malformed lines on standard error.
///
/// # Errors
/// When a file cannot be read.
pub fn run(config: &Config, files: &[String], output: Output) -> anyhow::Result<Report> {
    use anyhow::Context;
    let mut replay = Replay::new(config);
    let progress = std::io::stderr().is_terminal();
    for file in files {
        replay
            .read(file, progress)
            .with_context(|| format!("cannot read {file}"))?;
    }
    let (report, bad, pipeline, latest) = replay.finish_with_pipeline();
    for b in &bad {
        eprintln!("{}:{}: skipped: {}", b.file, b.line, b.error);
    }
    if report.malformed_lines > bad.len() as u64 {
        eprintln!(
            "... and {} more malformed lines",
            report.malformed_lines - bad.len() as u64
        );
    }
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => print!("{}", report.table()),
        Output::Html => {
            let data = crate::console::report_data(&pipeline, latest, report.spans, files);
            print!("{}", crate::console::report_html(&data));
        }
    }
    Ok(report)
}
