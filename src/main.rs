//! The `refusal-gate` command: parse the command line, load the configuration, run.
//!
//! Edge. Configuration errors are reported and exit non-zero before any port is bound.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use refusal_gate::config::{Config, DEFAULT_CONFIG};
use std::path::PathBuf;
use std::process::ExitCode;

/// Classifies agents' client spans and catches retries after refusals.
#[derive(Parser)]
#[command(name = "refusal-gate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The configuration file (for `serve`, the default command). Without it, the embedded
    /// defaults are used.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Receive OTLP traces and serve metrics (the default).
    Serve,
    /// Check a configuration file, the documents and TLS files it names, and exit.
    Validate,
    /// Print the default configuration, every key with its default.
    DefaultConfig,
    /// Analyse recorded traces (OTLP JSON lines, plain or gzip; `-` for standard input)
    /// offline and report what each client wasted. Without --config, a configuration
    /// beside the first recording (`rec.jsonl` → `rec.yaml`) is used when there is one.
    Replay {
        /// The report's format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// The recordings.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<String>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Table,
    Json,
    Html,
}

/// The configuration a recording comes with: `NAME.yaml` beside `NAME.jsonl[.gz]`.
fn beside(recording: &str) -> Option<PathBuf> {
    if recording == "-" {
        return None;
    }
    let path = std::path::Path::new(recording);
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gz").unwrap_or(name);
    let stem = stem
        .strip_suffix(".jsonl")
        .or_else(|| stem.strip_suffix(".json"))
        .unwrap_or(stem);
    let candidate = path.with_file_name(format!("{stem}.yaml"));
    candidate.is_file().then_some(candidate)
}

fn load(path: Option<&PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Config::load(p).map_err(anyhow::Error::from),
        None => Ok(Config::default()),
    }
}

/// Reads every file document and `interfaces_from` glob: `validate` fails on any that does
/// not load (serving would go on without it). URL documents are not fetched.
/// Reads the TLS files the configuration names (every listener's, the exporter's) and checks
/// them as `serve` would at start.
fn validate_tls(config: &Config) -> anyhow::Result<()> {
    let listeners = [
        ("receivers.otlp.grpc", &config.receivers.otlp.grpc.tls),
        ("receivers.otlp.http", &config.receivers.otlp.http.tls),
        ("admin", &config.admin.tls),
    ];
    for (what, tls) in listeners {
        if let Some(tls) = tls {
            refusal_gate::tls::Tls::load(tls, &config.base_dir, &[])
                .map_err(|e| anyhow::anyhow!("{what}.tls: {e}"))?;
        }
    }
    if let Some(push) = &config.exporters.otlp_metrics {
        refusal_gate::export::check_next_hop_tls(
            &push.endpoint,
            push.tls.as_ref(),
            "exporters.otlp_metrics",
            &config.base_dir,
        )?;
    }
    match &config.exporters.otlp {
        Some(otlp) => refusal_gate::export::check_tls(otlp, &config.base_dir),
        None => Ok(()),
    }
}

fn validate_documents(config: &Config) -> anyhow::Result<usize> {
    let (interfaces, _, reports) = refusal_gate::discovery::loader::load_local(config);
    let bad: Vec<String> = reports
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.source)))
        .collect();
    if bad.is_empty() {
        Ok(interfaces.len())
    } else {
        Err(anyhow::anyhow!("{}", bad.join("\n")))
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    // A replay prints a report; its log (alerts firing, documents loaded) would only bury it.
    let default_level = if matches!(cli.command, Some(Command::Replay { .. })) {
        "error"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command.take().unwrap_or(Command::Serve) {
        Command::DefaultConfig => {
            print!("{DEFAULT_CONFIG}");
            Ok(())
        }
        Command::Validate => match &cli.config {
            None => Err(anyhow::anyhow!("validate needs --config FILE")),
            Some(path) => load(Some(path))
                .and_then(|config| validate_tls(&config).and_then(|()| validate_documents(&config)))
                .map(|n| println!("{}: valid ({n} interfaces)", path.display())),
        },
        Command::Replay { format, files } => {
            let config = match (&cli.config, files.first().and_then(|f| beside(f))) {
                (None, Some(found)) => {
                    eprintln!(
                        "refusal-gate: using {} (beside the recording)",
                        found.display()
                    );
                    load(Some(&found))
                }
                (given, _) => load(given.as_ref()),
            };
            config.and_then(|config| {
                let output = match format {
                    Format::Table => refusal_gate::replay::Output::Table,
                    Format::Json => refusal_gate::replay::Output::Json,
                    Format::Html => refusal_gate::replay::Output::Html,
                };
                refusal_gate::replay::run(&config, &files, output).map(|_| ())
            })
        }
        Command::Serve => load(cli.config.as_ref()).and_then(|config| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the async runtime")?;
            let served = runtime.block_on(refusal_gate::app::run(config, cli.config.clone()));
            // A state write abandoned at service.shutdown_timeout still runs on a blocking
            // thread: the process ends without waiting for it (dropping the runtime would),
            // and the next start removes its temporary file.
            runtime.shutdown_background();
            served
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("refusal-gate: {e:#}");
            ExitCode::from(2)
        }
    }
}
