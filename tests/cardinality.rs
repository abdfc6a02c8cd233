//! Hostile cardinality, black-box: the server binary receives a million spans, each from a
//! client instance and for a path never seen before, and must stay within its bounds —
//! resident memory under [`RSS_BOUND_MIB`], tracker keys at most `max_keys`, and `client`
//! label values at most `max_clients` plus `__overflow__`.

mod common;

use common::kv;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;
use std::collections::BTreeSet;

const SPANS: u64 = 1_000_000;
const BATCH: u64 = 2_000;
const MAX_KEYS: usize = 100_000;
const MAX_CLIENTS: usize = 100;
/// The documented bound (docs/operations.md, "Hostile cardinality"): with `max_keys: 100000`, the
/// server's resident memory stays under this however many new clients arrive.
const RSS_BOUND_MIB: u64 = 256;

/// One request of `BATCH` spans, each from its own client instance, for its own path.
fn batch(n: u64) -> Vec<u8> {
    let resource_spans = (n * BATCH..(n + 1) * BATCH)
        .map(|i| ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv(
                        "service.name",
                        Value::StringValue(format!("svc-{}", i % 1000)),
                    ),
                    kv(
                        "service.instance.id",
                        Value::StringValue(format!("pod-{i}")),
                    ),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![common::http_span(
                    i,
                    "GET",
                    &format!("http://api{}.test/items/{i}", i % 50),
                    if i % 7 == 0 { 404 } else { 200 },
                )],
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest { resource_spans }.encode_to_vec()
}

fn rss_mib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .expect("a memory figure")
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_new_clients_and_paths_stay_within_the_bounds() {
    let dir = std::env::temp_dir().join(format!("rg-cardinality-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) = common::binary_config(
        &dir,
        "config",
        &format!("tracker:\n  max_keys: {MAX_KEYS}\nmetrics:\n  max_clients: {MAX_CLIENTS}\n"),
    );
    let (http, admin) = (ports.http, ports.admin);
    let server = common::spawn_binary(&config, admin, std::process::Stdio::null()).await;
    let pid = server.0.id();

    let mut peak = 0;
    for n in 0..SPANS / BATCH {
        common::post_traces(format!("127.0.0.1:{http}"), batch(n)).await;
        if n % 50 == 0 {
            peak = peak.max(rss_mib(pid, "VmRSS:"));
        }
    }
    let metrics = common::admin_metrics(admin).await;
    let hwm = rss_mib(pid, "VmHWM:");
    println!("a million new clients: peak RSS {hwm} MiB (sampled {peak} MiB)");

    let keys = common::value(&metrics, "refusal_gate_tracker_keys", &[]);
    assert!(keys <= MAX_KEYS as f64 && keys > 0.0, "tracker keys {keys}");
    let evicted = common::value(
        &metrics,
        "refusal_gate_tracker_evictions_total",
        &[("reason", "capacity")],
    );
    assert!(
        evicted >= (SPANS as usize - MAX_KEYS) as f64,
        "evictions counted: {evicted}"
    );
    let clients: BTreeSet<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("refusal_gate_attempts_total{"))
        .filter_map(|l| l.split("client=\"").nth(1)?.split('"').next())
        .collect();
    assert!(clients.contains("__overflow__"));
    assert!(
        clients.len() <= MAX_CLIENTS + 1,
        "{} client label values",
        clients.len()
    );
    assert!(
        common::value(
            &metrics,
            "refusal_gate_label_overflow_total",
            &[("label", "client")]
        ) > 0.0
    );
    assert_eq!(
        common::value(
            &metrics,
            "refusal_gate_receiver_accepted_spans_total",
            &[("transport", "http")]
        ),
        SPANS as f64
    );
    assert!(hwm < RSS_BOUND_MIB, "peak RSS {hwm} MiB over the bound");
    std::fs::remove_dir_all(&dir).ok();
}

/// One client's request of `BATCH` spans, each for a path of its own: every span a new key of
/// the same client (issue 66).
fn one_clients_batch(n: u64) -> Vec<u8> {
    let spans = (n * BATCH..(n + 1) * BATCH)
        .map(|i| common::http_span(i, "GET", &format!("http://api.test/items/{i}"), 200))
        .collect();
    common::export("agent", spans)
}

/// Issue 66: past `max_keys`, one client's new keys evict its own oldest as a thousand
/// clients' do, and the admin endpoint answers all the while. `/readyz` is asked every 10 ms
/// while the client sends; each answer must be `ready`, and the slowest is printed (a test
/// asserts no wall-clock time: the release build's figures are `benches/eviction.sh`'s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_keys_past_max_keys_are_evicted_while_readyz_answers() {
    const KEYS: usize = 10_000;
    const BATCHES: u64 = 50;
    let dir = std::env::temp_dir().join(format!("rg-one-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (config, ports) =
        common::binary_config(&dir, "config", &format!("tracker:\n  max_keys: {KEYS}\n"));
    let (http, admin) = (ports.http, ports.admin);
    let _server = common::spawn_binary(&config, admin, std::process::Stdio::null()).await;
    let client = reqwest::Client::new();
    let sending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let poller = {
        let (client, sending) = (client.clone(), std::sync::Arc::clone(&sending));
        tokio::spawn(async move {
            let mut answers = Vec::new();
            while sending.load(std::sync::atomic::Ordering::Relaxed) {
                let asked = std::time::Instant::now();
                let response = client
                    .get(format!("http://127.0.0.1:{admin}/readyz"))
                    // Not a figure asserted: an admin endpoint that never answers fails the
                    // test instead of hanging it.
                    .timeout(std::time::Duration::from_secs(30))
                    .send()
                    .await
                    .expect("/readyz answers");
                let status = response.status();
                let body = response.text().await.expect("a body");
                answers.push((status, body, asked.elapsed()));
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            answers
        })
    };
    for n in 0..BATCHES {
        common::post_traces(format!("127.0.0.1:{http}"), one_clients_batch(n)).await;
    }
    sending.store(false, std::sync::atomic::Ordering::Relaxed);
    let answers = poller.await.expect("the poller ran");
    let slowest = answers.iter().map(|a| a.2).max().unwrap_or_default();
    println!(
        "one client, {} new keys past max_keys {KEYS}: /readyz asked {} times, slowest {slowest:?}",
        BATCHES * BATCH,
        answers.len()
    );
    assert!(answers.len() >= 2, "asked while the client sent");
    for (status, body, _) in &answers {
        assert_eq!((status.as_u16(), body.as_str()), (200, "ready\n"));
    }
    let metrics = common::admin_metrics(admin).await;
    let keys = common::value(&metrics, "refusal_gate_tracker_keys", &[]);
    assert!(keys <= KEYS as f64 && keys > 0.0, "tracker keys {keys}");
    assert!(
        common::value(
            &metrics,
            "refusal_gate_tracker_evictions_total",
            &[("reason", "capacity")]
        ) >= (BATCHES * BATCH) as f64 - KEYS as f64,
        "every key past the bound evicted another"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_max_keys_no_key_is_evicted_however_the_clients_hash() {
    // 20 clients of 20 keys each, 400 keys of 500: the tracker's 16 shards cannot each hold
    // one client, and a shard's even share (31 keys) is less than two clients' keys.
    let server = common::start(
        "receivers:\n  otlp:\n    grpc: { endpoint: 127.0.0.1:0 }\n    http: { endpoint: 127.0.0.1:0 }\nadmin:\n  endpoint: 127.0.0.1:0\ntracker:\n  max_keys: 500\n",
    )
    .await;
    let bound = &server.bound;
    for client in 0..20u64 {
        let spans = (0..20u64)
            .map(|k| {
                let url = format!("http://api.test/items/{k}");
                common::http_span(client * 100 + k, "GET", &url, 200)
            })
            .collect();
        common::send(bound, common::export(&format!("agent-{client}"), spans)).await;
    }
    let text = common::scrape(bound).await;
    assert_eq!(
        common::value(&text, "refusal_gate_tracker_keys", &[]),
        400.0
    );
    assert_eq!(
        common::value(
            &text,
            "refusal_gate_tracker_evictions_total",
            &[("reason", "capacity")]
        ),
        0.0
    );
}
