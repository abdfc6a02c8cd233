//! A load generator for refusal-gate (or any OTLP receiver): the realistic agent workload
//! of `refusal_gate::workload` (HTTP, MCP, gRPC and A2A client spans, 10 attributes each),
//! pre-encoded once, sent over OTLP/gRPC or OTLP/HTTP by concurrent senders, as fast as
//! possible or at a fixed rate. Prints achieved spans/s and export latency percentiles.
//!
//! Like an SDK, which exports one batch at a time, a client's requests all come from one
//! sender, in order (so `--concurrency` above `--clients` adds no sender); each send carries
//! fresh span ids and later span times than the one before.
//!
//!     cargo run --release --example loadgen -- [--protocol grpc|http] [--endpoint URL]
//!         [--duration SECONDS] [--concurrency N] [--batch SPANS] [--clients N]
//!         [--requests N] [--rate SPANS_PER_SECOND] [--fresh-clients 1] [--workload flat|tree]
//!         [--split CALLS] [--server-view 1] [--connections N] [--fresh-keys 1]
//!
//! `--help` says what each option means and its default. An option given twice takes its last
//! value (benches/scale.sh passes `--rate` after the caller's `LOADGEN` options).
//!
//! Over gRPC the senders share `--connections` HTTP/2 connections (1 by default), taking them
//! in turn: many streams over few connections, as a Collector that fans many clients in
//! sends (OTLP/HTTP takes one HTTP/1 connection a sender).
//!
//! `--workload tree` sends the same calls as real agent stacks describe them
//! (`workload::Trees`): an agent's INTERNAL span, a protocol CLIENT span under it and its HTTP
//! CLIENT child, half of the calls split over two of a client's requests (the child a request
//! before its parents). Its spans/s count every span, the INTERNAL ones included. `--split`
//! sets how many of a tree request's calls are split (16 of 33 by default, at most half of
//! them; 0 sends every call whole). `--server-view 1` also sends the MCP server's side of the
//! tree workload's MCP calls (`workload::Trees::server_stamped`: a SERVER span of each, from
//! the service `mcp-server`), a client's request behind its calls — the server exports after
//! the client — for a server configured to observe `http://mcp.example:8080/mcp` through it
//! (benches/withheld.sh). Its spans/s count those spans too.
//!
//! `--requests` is how many distinct requests are pre-encoded and sent in turn: by default
//! 512, or one a client when the fleet is larger — every request of the workload covers all
//! 45 keys (interface × operation) of its client, so a fleet of N clients needs N requests
//! to reach its N × 45 keys. `--fresh-clients 1` sends every request from a client instance
//! never seen before (the soak test's churning fleet). `--fresh-keys 1` makes every span of
//! every request a `tools/call` of a tool never called before, so each opens a key of its
//! client (benches/eviction.sh: what a key past `tracker.max_keys` costs).
//!
//! The last line is machine-readable: `spans=… seconds=… spans_per_sec=… p50_us=… p99_us=… errors=…`.

use bytes::Bytes;
use refusal_gate::export::{RawCodec, EXPORT_PATH};
use refusal_gate::workload;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A load generator for refusal-gate (or any OTLP receiver): the realistic agent workload,
/// pre-encoded once, sent over OTLP/gRPC or OTLP/HTTP by concurrent senders, as fast as
/// possible or at a fixed rate; prints spans/s and export latency percentiles.
#[derive(Clone, clap::Parser)]
#[command(name = "loadgen", version, args_override_self = true)]
struct Options {
    /// `grpc` or `http` (OTLP/HTTP protobuf).
    #[arg(long, default_value = "grpc", value_parser = ["grpc", "http"])]
    protocol: String,
    /// Where to send: the OTLP/gRPC receiver, or the OTLP/HTTP base URL [default:
    /// http://127.0.0.1:4317, or :4318 for http].
    #[arg(long, default_value = "", hide_default_value = true)]
    endpoint: String,
    /// How long to send, in seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Concurrent senders (no more than there are clients: a client's requests come from one).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Spans a request.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Client instances in the fleet.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Distinct requests pre-encoded and sent in turn [default: 512, or one a client when the
    /// fleet is larger].
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    requests: usize,
    /// Spans a second in all; 0 sends as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// 1: every request from a client instance never seen before (a churning fleet).
    #[arg(long, default_value_t = 0)]
    fresh_clients: u8,
    /// 1: every span of every request a call of a tool never called before, so that each
    /// opens a key (flat workload only; what eviction past `tracker.max_keys` costs).
    #[arg(long, default_value_t = 0)]
    fresh_keys: u8,
    /// `flat` (one span a call) or `tree` (a call as real agent stacks describe it).
    #[arg(long, default_value = "flat", value_parser = ["flat", "tree"])]
    workload: String,
    /// Calls of a tree request split over two of a client's requests (at most half; 0: none).
    #[arg(long, default_value_t = workload::SPLIT)]
    split: usize,
    /// 1: also send the MCP server's side of the tree workload's MCP calls.
    #[arg(long, default_value_t = 0)]
    server_view: u8,
    /// HTTP/2 connections the gRPC senders share (at least 1).
    #[arg(long, default_value_t = 1)]
    connections: usize,
}

impl Options {
    fn trees(&self) -> bool {
        self.workload == "tree"
    }

    fn fresh_clients(&self) -> bool {
        self.fresh_clients != 0
    }

    fn fresh_keys(&self) -> bool {
        self.fresh_keys != 0
    }

    fn server_view(&self) -> bool {
        self.server_view != 0
    }
}

fn options() -> Options {
    let mut o = <Options as clap::Parser>::parse();
    o.connections = o.connections.max(1);
    if o.requests == 0 {
        o.requests = o.clients.max(512);
    }
    if o.endpoint.is_empty() {
        o.endpoint = match o.protocol.as_str() {
            "http" => "http://127.0.0.1:4318".into(),
            _ => "http://127.0.0.1:4317".into(),
        };
    }
    o
}

enum Sender {
    Grpc(tonic::client::Grpc<tonic::transport::Channel>),
    Http(reqwest::Client, String),
}

impl Sender {
    async fn send(&mut self, body: Bytes) -> bool {
        match self {
            Sender::Grpc(grpc) => {
                if grpc.ready().await.is_err() {
                    return false;
                }
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
                grpc.unary(tonic::Request::new(body), path, RawCodec)
                    .await
                    .is_ok()
            }
            Sender::Http(client, url) => client
                .post(url.as_str())
                .header("content-type", "application/x-protobuf")
                .body(body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success()),
        }
    }
}

fn main() {
    let o = options();
    // One thread: pinned to its own core by the e2e script, the generator competes with
    // nothing of the server's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(o));
}

async fn run(o: Options) {
    let bodies: Arc<Vec<workload::Encoded>> = Arc::new(if o.trees() {
        Vec::new()
    } else {
        (0..o.requests)
            .map(|n| {
                if o.fresh_keys() {
                    workload::Encoded::fresh_keys(n, o.clients, o.batch)
                } else {
                    workload::Encoded::new(n, o.clients, o.batch)
                }
            })
            .collect()
    });
    let trees: Arc<Vec<workload::Trees>> = Arc::new(if o.trees() {
        (0..o.requests)
            .map(|n| workload::Trees::with_split(n, o.clients, o.batch, o.split))
            .collect()
    } else {
        Vec::new()
    });
    let requests = bodies.len().max(trees.len());
    let endpoint =
        tonic::transport::Endpoint::from_shared(o.endpoint.clone()).expect("a valid endpoint");
    let channels: Vec<_> = (0..o.connections)
        .map(|_| endpoint.connect_lazy())
        .collect();
    let url = format!("{}/v1/traces", o.endpoint.trim_end_matches('/'));
    let http = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let spans = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::<u32>::with_capacity(1 << 20)));
    // A client's requests are one sender's (see below), so with fewer clients than senders
    // some senders have nothing to send.
    let senders = if o.fresh_clients() {
        o.concurrency
    } else {
        o.concurrency.min(o.clients.max(1))
    };
    // A fixed rate is split evenly over the senders: each sends one request every `gap`.
    let gap =
        (o.rate > 0.0).then(|| Duration::from_secs_f64(o.batch as f64 * senders as f64 / o.rate));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..senders {
        let mut sender = match o.protocol.as_str() {
            "http" => Sender::Http(http.clone(), url.clone()),
            _ => Sender::Grpc(tonic::client::Grpc::new(
                channels[worker % channels.len()].clone(),
            )),
        };
        let trees = Arc::clone(&trees);
        let (bodies, stop, spans, errors, latencies) = (
            Arc::clone(&bodies),
            Arc::clone(&stop),
            Arc::clone(&spans),
            Arc::clone(&errors),
            Arc::clone(&latencies),
        );
        // A tree request holds whole calls of three spans.
        let batch = if o.trees() {
            (o.batch / 3 * 3) as u64
        } else {
            o.batch as u64
        };
        let fresh_clients = o.fresh_clients();
        let server_view = o.server_view();
        let span_ns = (o.requests * o.batch) as u64 * 1_000_000;
        // The requests this sender sends, in order. An SDK exports one batch at a time
        // (the OpenTelemetry specification forbids concurrent calls to one exporter), so a
        // client instance's requests never overtake each other: each client is one sender's.
        // Fresh instances have no order to keep; the senders take the requests in turn.
        let owner = |j: usize| {
            if fresh_clients {
                j % o.concurrency
            } else {
                j % o.clients.max(1) % o.concurrency
            }
        };
        let order: Vec<usize> = (0..requests).filter(|&j| owner(j) == worker).collect();
        let clients = o.clients.max(1);
        tasks.push(tokio::spawn(async move {
            let mut next = Instant::now();
            let mut mine = Vec::with_capacity(1 << 16);
            // Each client's requests so far: a tree request's split calls are completed by
            // the client's next one.
            let mut seq = vec![0u64; if trees.is_empty() { 0 } else { clients }];
            for (i, &j) in order.iter().cycle().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(gap) = gap {
                    next += gap;
                    tokio::time::sleep_until(next.into()).await;
                }
                // Each pass over the pre-encoded requests moves time on by their whole span.
                let round = (i / order.len()) as u64;
                let body = if let Some(tree) = trees.get(j) {
                    seq[tree.client()] += 1;
                    tree.stamped(seq[tree.client()])
                } else {
                    let send = round * bodies.len() as u64 + j as u64;
                    let encoded = &bodies[j];
                    let mut body = encoded.stamped(send, round * span_ns);
                    if fresh_clients {
                        // Every request from an instance never seen before.
                        encoded.set_instance(&mut body, send);
                    }
                    // Every span a tool never called before (a no-op unless `--fresh-keys`).
                    encoded.set_keys(&mut body, send);
                    body
                };
                let body = Bytes::from(body);
                let t = Instant::now();
                if sender.send(body).await {
                    spans.fetch_add(batch, Ordering::Relaxed);
                    mine.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                // The server's spans of the client's previous request: it exports later.
                let previous = trees.get(j).map(|t| (t, seq[t.client()].saturating_sub(1)));
                if let Some((tree, seq)) = previous.filter(|&(_, seq)| server_view && seq > 0) {
                    if sender.send(Bytes::from(tree.server_stamped(seq))).await {
                        spans.fetch_add(tree.server_spans() as u64, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().expect("not poisoned").extend(mine);
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(o.duration)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut l = latencies.lock().expect("not poisoned").clone();
    l.sort_unstable();
    let pct = |p: f64| {
        l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let sent = spans.load(Ordering::Relaxed);
    println!(
        "{} over {}: {:.0} spans/s, {} requests, latency p50 {} us, p99 {} us, {} errors",
        o.protocol,
        o.endpoint,
        sent as f64 / seconds,
        l.len(),
        pct(0.50),
        pct(0.99),
        errors.load(Ordering::Relaxed)
    );
    println!(
        "spans={sent} seconds={seconds:.3} spans_per_sec={:.0} p50_us={} p99_us={} errors={}",
        sent as f64 / seconds,
        pct(0.50),
        pct(0.99),
        errors.load(Ordering::Relaxed)
    );
}
