//! The hot path allocates nothing per span once a span's key is known: ingesting a
//! request of 1,000 spans costs exactly as many heap allocations as one of 100 (warm keys,
//! same shape) — with forwarding on too, where every span is tagged and the request
//! re-framed. A counting global allocator (the `allocation-counter` crate) measures it, so
//! the property cannot silently regress. Counting settled attempts allocates nothing per
//! span either.

mod common;

use common::{export, http_span};
use refusal_gate::config::Config;
use refusal_gate::discovery::loader::Catalog;
use refusal_gate::metrics::Metrics;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use refusal_gate::tracker::Tracker;
use std::sync::Arc;

/// The tracker's clock throughout: any time will do, the same for every run.
const NOW: u64 = common::T0;

fn pipeline() -> Pipeline {
    let config = Config::default();
    pipeline_on(&config)
}

/// A pipeline that forwards what it ingests (to an exporter whose sending task never runs:
/// the queue only fills, which is all ingestion sees of it).
fn forwarding_pipeline() -> Pipeline {
    let config =
        Config::parse("exporters:\n  otlp: { endpoint: http://127.0.0.1:1 }\n").expect("valid");
    let exporter = config.exporters.otlp.clone().expect("an exporter");
    pipeline_on(&config).with_exporter(&exporter)
}

fn pipeline_on(config: &Config) -> Pipeline {
    Pipeline::new(
        Arc::new(Catalog::new(config.interfaces.clone(), Default::default())),
        Tracker::new(&config.tracker),
        Metrics::new(&config.metrics),
        &config.alerting,
    )
}

/// `spans` attempts of one client, each on a key of its own (`POST /items/{k}`), round
/// `round` (later times, new span ids); every seventh fails with 503.
fn request(spans: u64, round: u64) -> Vec<u8> {
    let spans = (0..spans)
        .map(|k| {
            let status = if k % 7 == 0 { 503 } else { 200 };
            let mut s = http_span(
                k,
                "POST",
                &format!("http://api.test:8080/items/{k}"),
                status,
            );
            let shift = round * 3_600_000_000_000;
            s.start_time_unix_nano += shift;
            s.end_time_unix_nano += shift;
            s.span_id = (round * 1_000_000 + k + 1).to_be_bytes().to_vec();
            s
        })
        .collect();
    export("alloc-agent", spans)
}

/// Allocations made by ingesting round 1 of `spans` keys, after round 0 warmed them.
fn ingest_allocations(p: Pipeline, spans: u64) -> u64 {
    p.handle(Transport::Grpc, &request(spans, 0), Encoding::Protobuf, NOW)
        .expect("valid");
    p.settle(true, NOW);
    let body = request(spans, 1);
    let info = allocation_counter::measure(|| {
        p.handle(Transport::Grpc, &body, Encoding::Protobuf, NOW)
            .expect("valid");
    });
    info.count_total
}

#[test]
fn ingesting_known_keys_allocates_nothing_per_span() {
    let small = ingest_allocations(pipeline(), 100);
    let large = ingest_allocations(pipeline(), 1000);
    assert_eq!(
        large, small,
        "1,000 spans made {large} allocations, 100 spans {small}: the difference is per span"
    );
}

#[test]
fn tagging_and_re_framing_for_forwarding_allocates_nothing_per_span() {
    let small = ingest_allocations(forwarding_pipeline(), 100);
    let large = ingest_allocations(forwarding_pipeline(), 1000);
    assert_eq!(
        large, small,
        "forwarding 1,000 spans made {large} allocations, 100 spans {small}: the difference is per span"
    );
    // Forwarding costs a few allocations a request (the tags' buffer, the re-framed
    // request), not none: the test above would not see it disappear.
    assert!(small > ingest_allocations(pipeline(), 100));
}

#[test]
fn counting_settled_attempts_allocates_nothing_per_span() {
    let settle_allocations = |spans: u64| {
        let p = pipeline();
        p.handle(Transport::Grpc, &request(spans, 0), Encoding::Protobuf, NOW)
            .expect("valid");
        p.settle(true, NOW);
        p.handle(Transport::Grpc, &request(spans, 1), Encoding::Protobuf, NOW)
            .expect("valid");
        allocation_counter::measure(|| p.settle(true, NOW)).count_total
    };
    let (small, large) = (settle_allocations(100), settle_allocations(1000));
    // The events buffer grows with the number of attempts (amortised doubling), so a
    // logarithmic difference is allowed; a per-span allocation would be hundreds.
    assert!(
        large <= small + 8,
        "settling 1,000 attempts made {large} allocations, 100 made {small}"
    );
}
