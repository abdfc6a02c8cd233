//! Criterion benchmarks of each stage of the ingest path, on a realistic agent payload:
//! 100 client spans a request, 8–10 attributes each, a mix of HTTP, MCP and gRPC attempts,
//! a fifth of them failing. Also the tracker's sharding: two threads observing at once
//! with one lock versus sixteen.
//!
//!     cargo bench --bench pipeline

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use refusal_gate::classify::{self, Outcome};
use refusal_gate::config::{Config, TrackerConfig};
use refusal_gate::discovery::loader::Catalog;
use refusal_gate::discovery::Declared;
use refusal_gate::extract;
use refusal_gate::metrics::Metrics;
use refusal_gate::receiver::{decode, Encoding, Pipeline, Transport};
use refusal_gate::tracker::{GroupId, Observation, Tracker};
use refusal_gate::workload;
use std::hint::black_box;
use std::sync::Arc;

const SPANS: usize = 100;

fn request(n: usize, clients: usize) -> ExportTraceServiceRequest {
    workload::request(n, clients, SPANS)
}

fn stages(c: &mut Criterion) {
    let body = request(0, 1).encode_to_vec();
    let mut g = c.benchmark_group("stage");
    g.throughput(Throughput::Elements(SPANS as u64));
    g.bench_function("prost_owned_decode", |b| {
        b.iter(|| ExportTraceServiceRequest::decode(black_box(&body[..])).expect("valid"))
    });
    g.bench_function("decode", |b| {
        b.iter(|| decode(black_box(&body), Encoding::Protobuf).expect("valid"))
    });
    let batch = decode(&body, Encoding::Protobuf).expect("valid");
    let (resource, spans) = &batch.resources[0];
    g.bench_function("extract", |b| {
        b.iter(|| {
            for span in spans {
                black_box(extract::extract(resource, span).expect("an attempt"));
            }
        })
    });
    let attempts: Vec<_> = spans
        .iter()
        .map(|s| extract::extract(resource, s).expect("an attempt"))
        .collect();
    g.bench_function("classify", |b| {
        b.iter(|| {
            for a in &attempts {
                let (o, _) = classify::outcome(a.family, black_box(&a.signal));
                black_box(classify::classify(o, Declared::Unknown, true));
            }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(SPANS as u64));
    let config = Config::default();
    let pipeline = Pipeline::new(
        Arc::new(Catalog::new(config.interfaces.clone(), Default::default())),
        Tracker::new(&config.tracker),
        Metrics::new(&config.metrics),
        &config.alerting,
    );
    let bodies: Vec<Vec<u8>> = (0..64).map(|n| request(n, 16).encode_to_vec()).collect();
    let mut n = 0;
    g.bench_function("decode_extract_classify_track_count", |b| {
        b.iter(|| {
            n = (n + 1) % bodies.len();
            let batch = decode(&bodies[n], Encoding::Protobuf).expect("valid");
            pipeline.ingest(Transport::Grpc, &batch, 1_700_000_000_000_000_000)
        })
    });
    g.finish();
}

fn observation(thread: u64, n: u64) -> Observation {
    Observation {
        group: GroupId {
            client: thread * 1_000 + n % 64,
            interface: n % 8,
        },
        operation: n % 32,
        labels: 0,
        start: n * 1_000_000,
        end: n * 1_000_000 + 500_000,
        outcome: if n % 5 == 0 {
            Outcome::Transient
        } else {
            Outcome::Ok
        },
        declared: Declared::Unknown,
        discovery_read: false,
        trace_id: [0; 16],
        span_id: n.to_be_bytes(),
    }
}

/// Two threads observing 10,000 attempts each at once, with `shards` locks.
fn sharding(c: &mut Criterion) {
    let mut g = c.benchmark_group("tracker_two_threads");
    g.throughput(Throughput::Elements(20_000));
    for shards in [1, 16] {
        g.bench_function(format!("{shards}_shards"), |b| {
            b.iter_batched(
                || Arc::new(Tracker::with_shards(&TrackerConfig::default(), shards)),
                |tracker| {
                    let workers: Vec<_> = (0..2u64)
                        .map(|t| {
                            let tracker = Arc::clone(&tracker);
                            std::thread::spawn(move || {
                                let mut events = Vec::with_capacity(64);
                                for n in 0..10_000 {
                                    tracker.observe(n, &observation(t, n), &"op", &mut events);
                                    events.clear();
                                }
                            })
                        })
                        .collect();
                    for w in workers {
                        w.join().expect("the worker finishes");
                    }
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, stages, sharding);
criterion_main!(benches);
