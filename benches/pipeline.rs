//! Criterion benchmarks of each stage of the ingest path, on a realistic agent payload
//! (`refusal_gate::workload`): 100 client spans a request, 10 attributes each, a mix of
//! HTTP, MCP, gRPC and A2A attempts, a fifth of them failing. The reference is prost's owned
//! decode of the same request; `path/whole_*` is everything the server does per request
//! without forwarding, and `path/whole_tree_*` the same for the same calls as real stacks
//! describe them (`workload::Trees`: an agent's span, a protocol span, its HTTP child, half of
//! the calls split over two requests; about 99 spans a request). Also the tracker's sharding:
//! two threads at once, one lock vs sixteen; and a scrape of `/metrics` at 10,000 series in
//! the 0.0.4 text format and in OpenMetrics with exemplars, and the OTLP push of the same.
//! And what a new key costs below `tracker.max_keys` and past it (each past it evicts), its
//! keys one client's or spread over a thousand clients'.
//!
//!     cargo bench --bench pipeline

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use refusal_gate::classify::Kind;
use refusal_gate::classify::{self, Outcome};
use refusal_gate::clock;
use refusal_gate::config::{Config, MetricsConfig, TrackerConfig};
use refusal_gate::discovery::Declared;
use refusal_gate::extract::{self, Discovery};
use refusal_gate::metrics::Metrics;
use refusal_gate::openmetrics::Format;
use refusal_gate::otlp::wire;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use refusal_gate::tracker::{Event, GroupId, Observation, Tracker, Violation};
use refusal_gate::workload;
use std::hint::black_box;
use std::sync::Arc;

const SPANS: usize = 100;

fn request(n: usize, clients: usize) -> ExportTraceServiceRequest {
    workload::request(n, clients, SPANS)
}

/// A pipeline on the default configuration, warmed with every key of the workload so the
/// benches measure the steady state.
fn warm_pipeline(bodies: &[Vec<u8>]) -> Pipeline {
    let pipeline = Pipeline::from_config(&Config::default());
    for body in bodies {
        pipeline
            .handle(Transport::Grpc, body, Encoding::Protobuf, clock::now())
            .expect("valid");
    }
    pipeline.settle(true, clock::now());
    pipeline
}

fn stages(c: &mut Criterion) {
    // 64 distinct requests from 16 clients, each encoded once.
    let bodies: Vec<Vec<u8>> = (0..64).map(|n| request(n, 16).encode_to_vec()).collect();
    let body = &bodies[0];
    let mut g = c.benchmark_group("stage");
    g.throughput(Throughput::Elements(SPANS as u64));
    g.bench_function("prost_owned_decode", |b| {
        b.iter(|| ExportTraceServiceRequest::decode(black_box(&body[..])).expect("valid"))
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let mut n = 0;
            for rs in wire::each(black_box(body), 1).map_while(Result::ok) {
                for ss in wire::each(rs, 2).map_while(Result::ok) {
                    for span in wire::each(ss, 2).map_while(Result::ok) {
                        black_box(wire::SpanRef::parse(span).expect("valid"));
                        n += 1;
                    }
                }
            }
            n
        })
    });
    let spans: Vec<wire::SpanRef<'_>> = wire::each(body, 1)
        .map_while(Result::ok)
        .flat_map(|rs| wire::each(rs, 2).map_while(Result::ok))
        .flat_map(|ss| wire::each(ss, 2).map_while(Result::ok))
        .map(|span| wire::SpanRef::parse(span).expect("valid"))
        .collect();
    let client = extract::Client {
        name: "agent-0",
        instance: Some("pod-0"),
    };
    g.bench_function("extract_classify", |b| {
        b.iter(|| {
            for span in &spans {
                let a = extract::extract(client, span, extract::DEFAULT_MAX_ATTRIBUTES)
                    .expect("an attempt");
                let (o, _) = classify::outcome(a.family, black_box(&a.signal), Declared::Unknown);
                black_box(classify::classify(o, Declared::Unknown, true));
            }
        })
    });
    let tracker = Tracker::new(&TrackerConfig::default());
    let mut events = Vec::with_capacity(256);
    let mut round = 0u64;
    g.bench_function("track", |b| {
        b.iter(|| {
            round += 1;
            for n in 0..SPANS as u64 {
                let mut o = observation(0, n);
                o.start += round * 1_000_000_000;
                o.end += round * 1_000_000_000;
                tracker.observe(o.end, &o, &"op", &mut events);
            }
            tracker.settle(0, true, &mut events);
            events.clear();
        })
    });
    let pipeline = warm_pipeline(&bodies);
    let counted: Vec<Event> = (0..SPANS as u32)
        .map(|n| Event::Counted {
            operation: None,
            labels: n % 16,
            kind: if n % 5 == 0 {
                Kind::Transient
            } else {
                Kind::Ok
            },
            violation: None,
            discovery_read: false,
            trace_id: [0; 16],
            span_id: [0; 8],
            end: 0,
        })
        .collect();
    g.bench_function("count", |b| {
        b.iter(|| pipeline.metrics().record(black_box(&counted)))
    });
    g.finish();

    // The whole path in its steady state: every request carries fresh span ids and later
    // times (as a real fleet's do), from 16 clients (every key's state stays in the cache)
    // and from 100 (it does not: 4,500 keys).
    let mut g = c.benchmark_group("path");
    g.throughput(Throughput::Elements(SPANS as u64));
    g.bench_function("prost_owned_decode", |b| {
        let mut n = 0;
        b.iter(|| {
            n = (n + 1) % bodies.len();
            ExportTraceServiceRequest::decode(black_box(&bodies[n][..])).expect("valid")
        })
    });
    for clients in [16, 100] {
        let requests = 512;
        let encoded: Vec<workload::Encoded> = (0..requests)
            .map(|n| workload::Encoded::new(n, clients, SPANS))
            .collect();
        let pass = (requests * SPANS) as u64 * 1_000_000;
        let mut send = 0u64;
        let next = move || {
            let body =
                encoded[send as usize % requests].stamped(send, send / requests as u64 * pass);
            send += 1;
            body
        };
        let name = format!("whole_decode_extract_classify_track_count/{clients}_clients");
        whole(&mut g, &name, requests, next);
    }
    // The same calls as call trees, a client's requests in order (its split calls completed
    // by its next request).
    let clients = 100;
    let trees: Vec<workload::Trees> = (0..clients)
        .map(|n| workload::Trees::new(n, clients, SPANS))
        .collect();
    let mut seq = vec![0u64; clients];
    let mut sent = 0usize;
    let next = move || {
        let tree = &trees[sent % clients];
        sent += 1;
        seq[tree.client()] += 1;
        tree.stamped(seq[tree.client()])
    };
    g.throughput(Throughput::Elements((SPANS / 3 * 3) as u64));
    whole(
        &mut g,
        &format!("whole_tree/{clients}_clients"),
        4 * clients,
        next,
    );
    g.finish();
}

/// Benches the whole path on the requests `next` makes, after `warm` of them warmed a
/// pipeline.
fn whole(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    warm: usize,
    mut next: impl FnMut() -> Vec<u8>,
) {
    let pipeline = warm_pipeline(&(0..warm).map(|_| next()).collect::<Vec<_>>());
    g.bench_function(name, |b| {
        b.iter_batched(
            &mut next,
            |body| {
                pipeline
                    .handle(
                        Transport::Grpc,
                        black_box(&body),
                        Encoding::Protobuf,
                        clock::now(),
                    )
                    .expect("valid")
            },
            BatchSize::SmallInput,
        )
    });
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
        discovery: Discovery::None,
        retry_after: None,
        anonymous: false,
        asked: Default::default(),
        testimony: Default::default(),
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

/// A fresh key's attempt: the `n`-th operation of client `n % clients`.
fn fresh_key(n: u64, clients: u64) -> Observation {
    Observation {
        group: GroupId {
            client: n % clients,
            interface: 1,
        },
        operation: n,
        outcome: Outcome::Ok,
        ..observation(0, n)
    }
}

/// 10,000 attempts on fresh keys, into a tracker already holding 100,000: with room
/// (`max_keys` 1,000,000) and full (`max_keys` 100,000: each key evicts another), the keys
/// one client's or a thousand clients'.
fn past_max_keys(c: &mut Criterion) {
    const HELD: u64 = 100_000;
    const MORE: u64 = 10_000;
    let mut g = c.benchmark_group("tracker_fresh_keys");
    g.throughput(Throughput::Elements(MORE));
    g.sample_size(10);
    for clients in [1, 1_000] {
        for (name, max_keys) in [
            ("below_max_keys", 1_000_000),
            ("past_max_keys", HELD as usize),
        ] {
            g.bench_function(format!("{name}_{clients}_clients"), |b| {
                b.iter_batched(
                    || {
                        let config = TrackerConfig {
                            max_keys,
                            ..TrackerConfig::default()
                        };
                        let tracker = Tracker::new(&config);
                        let mut events = Vec::new();
                        for n in 0..HELD {
                            tracker.observe(n, &fresh_key(n, clients), &"op", &mut events);
                            events.clear();
                        }
                        tracker
                    },
                    |tracker| {
                        let mut events = Vec::with_capacity(64);
                        for n in HELD..HELD + MORE {
                            tracker.observe(n, &fresh_key(n, clients), &"op", &mut events);
                            events.clear();
                        }
                        tracker
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    g.finish();
}

/// `/metrics` written at 10,000 series: 2,000 (client, interface) pairs, each with an
/// attempt of class ok, a refusal, a violation, a discovery read and an honored refusal; the
/// refusal and violation series carry exemplars in OpenMetrics.
fn scrape(c: &mut Criterion) {
    let metrics = Metrics::new(&MetricsConfig {
        max_clients: 100_000,
        max_series: 100_000,
        ..MetricsConfig::default()
    });
    for n in 0..2_000u64 {
        let labels = metrics.labels(n, &format!("agent-{n}"), 7, "http://mcp.test:8080/mcp");
        let counted = |kind, violation| Event::Counted {
            operation: None,
            labels,
            kind,
            violation,
            discovery_read: violation.is_some(),
            trace_id: [n as u8; 16],
            span_id: n.to_be_bytes(),
            end: clock::now(),
        };
        metrics.record(&[
            counted(Kind::Ok, None),
            counted(
                Kind::InterfaceNotDeclared,
                Some(Violation::ProbeAfterRefusal),
            ),
            Event::Honored { labels },
        ]);
    }
    let mut g = c.benchmark_group("scrape_10000_series");
    g.throughput(Throughput::Elements(10_000));
    for (name, format) in [
        ("text_0.0.4", Format::Text),
        ("openmetrics_exemplars", Format::OpenMetrics("1.0.0")),
    ] {
        g.bench_function(name, |b| b.iter(|| metrics.render_as(black_box(format))));
    }
    // The same families as the OTLP metrics exporter pushes them, encoded.
    let resource = refusal_gate::push::resource("bench");
    g.bench_function("otlp_push_request", |b| {
        b.iter(|| {
            metrics.with_exemplars(|families, exemplar| {
                refusal_gate::push::request(families, exemplar, resource.clone(), 0, 1)
                    .encode_to_vec()
                    .len()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, stages, sharding, scrape, past_max_keys);
criterion_main!(benches);
