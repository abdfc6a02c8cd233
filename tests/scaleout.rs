//! Scale-out, simulated with real processes: a fleet of clients plays its attempts through a
//! router into three refusal-gate binaries. Routed by a consistent hash of the client's
//! identity, its resource's `service.name` and `service.instance.id` (the rule of the
//! Collector's load-balancing exporter with `routing_key: attributes` on those two), the
//! replicas' summed violation counts equal those of a single process; routed at random, they
//! do not — each replica sees only part of a client's history, so retries after a refusal go
//! unseen. Both figures are printed.

mod common;

use common::{http_span, kv, Reaper};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

const CLIENTS: u64 = 40;
const REPLICAS: usize = 3;

/// A refusal-gate binary on free ports; its admin and OTLP/HTTP addresses.
struct Replica {
    http: u16,
    admin: u16,
    _reaper: Reaper,
}

async fn replica(dir: &std::path::Path, name: &str) -> Replica {
    let (config, ports) = common::binary_config(
        dir,
        name,
        "interfaces:
  - name: orders-api
    protocol: http
    url: http://api.test
    endpoints:
      - path: /v1/orders
",
    );
    Replica {
        http: ports.http,
        admin: ports.admin,
        _reaper: common::spawn_binary(&config, ports.admin, std::process::Stdio::null()).await,
    }
}

/// Client `c`'s attempts, in order: it reads the contract, POSTs an undeclared path (404),
/// does it again (a retry after an authoritative refusal), then fails six times in a row
/// on a declared one with 503 (the last two past a budget of three retries).
fn attempts(c: u64) -> Vec<Span> {
    let t = c * 100;
    let mut spans = vec![
        http_span(t, "GET", "http://api.test/openapi.json", 200),
        http_span(t + 1, "POST", "http://api.test/v1/refunds", 404),
        http_span(t + 2, "POST", "http://api.test/v1/refunds", 404),
    ];
    spans.extend((0..6).map(|k| http_span(t + 3 + k, "GET", "http://api.test/v1/orders", 503)));
    spans
}

/// The resource attributes of client `c`.
fn resource(c: u64) -> Resource {
    Resource {
        attributes: vec![
            kv(
                "service.name",
                Value::StringValue(format!("agent-{}", c % 7)),
            ),
            kv(
                "service.instance.id",
                Value::StringValue(format!("pod-{c}")),
            ),
        ],
        ..Default::default()
    }
}

/// One export request: one span of one client, as an SDK exporting promptly sends it.
fn request(c: u64, span: Span) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource(c)),
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// FNV-1a, 64 bits: a stable hash for the ring (the same in every router instance).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A consistent-hash ring of `replicas` with 100 virtual nodes each, as the Collector's
/// load-balancing exporter builds over its resolved endpoints; a key goes to the first node
/// at or after its hash.
struct Ring(Vec<(u64, usize)>);

impl Ring {
    fn new(replicas: usize) -> Ring {
        let mut nodes: Vec<(u64, usize)> = (0..replicas)
            .flat_map(|r| (0..100).map(move |v| (fnv(format!("replica-{r}-{v}").as_bytes()), r)))
            .collect();
        nodes.sort_unstable();
        Ring(nodes)
    }

    /// The replica for a resource: by the hash of its identifying attributes.
    fn route(&self, resource: &Resource) -> usize {
        let key: String = resource
            .attributes
            .iter()
            .map(|a| format!("{}={:?};", a.key, a.value))
            .collect();
        let h = fnv(key.as_bytes());
        let at = self.0.partition_point(|(node, _)| *node < h);
        self.0[at % self.0.len()].1
    }
}

async fn post(client: &reqwest::Client, port: u16, body: Vec<u8>) {
    let response = client
        .post(format!("http://127.0.0.1:{port}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .expect("the replica answers");
    assert_eq!(response.status(), 200);
}

/// The violations a replica counted, by violation.
async fn violations(client: &reqwest::Client, admin: u16) -> (f64, f64) {
    let m = client
        .get(format!("http://127.0.0.1:{admin}/metrics"))
        .send()
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    let sum = |v: &str| -> f64 {
        m.lines()
            .filter(|l| l.starts_with("refusal_gate_violations_total{"))
            .filter(|l| l.contains(&format!("violation=\"{v}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (sum("retry_after_refusal"), sum("retry_budget_exhausted"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_by_client_keeps_every_detection_and_random_routing_loses_them() {
    let dir = std::env::temp_dir().join(format!("rg-scaleout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let client = reqwest::Client::new();
    let ring = Ring::new(REPLICAS);

    // The fleet's requests, interleaved across clients in time order.
    let plays: Vec<Vec<Span>> = (0..CLIENTS).map(attempts).collect();
    let steps = plays[0].len();
    let requests: Vec<(u64, Vec<u8>)> = (0..steps)
        .flat_map(|step| {
            plays
                .iter()
                .zip(0..)
                .map(move |(play, c)| (c, request(c, play[step].clone())))
        })
        .collect();

    let single = replica(&dir, "single").await;
    for (_, body) in &requests {
        post(&client, single.http, body.clone()).await;
    }
    let expected = violations(&client, single.admin).await;
    assert_eq!(
        expected,
        (CLIENTS as f64, CLIENTS as f64 * 2.0),
        "one retry after refusal and two retries past the budget a client"
    );

    let mut figures = Vec::new();
    for routing in ["by client", "random"] {
        let mut replicas = Vec::new();
        for r in 0..REPLICAS {
            replicas.push(replica(&dir, &format!("{routing}-{r}").replace(' ', "-")).await);
        }
        // A deterministic "random": a linear congruential generator, fixed seed.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut used = [0usize; REPLICAS];
        for (c, body) in &requests {
            let to = if routing == "by client" {
                ring.route(&resource(*c))
            } else {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (seed >> 33) as usize % REPLICAS
            };
            used[to] += 1;
            post(&client, replicas[to].http, body.clone()).await;
        }
        assert!(
            used.iter().all(|n| *n > 0),
            "{routing}: every replica used: {used:?}"
        );
        let mut total = (0.0, 0.0);
        for r in &replicas {
            let (a, b) = violations(&client, r.admin).await;
            total = (total.0 + a, total.1 + b);
        }
        figures.push((routing, total));
    }
    println!(
        "violations (retry_after_refusal, retry_budget_exhausted): one process {expected:?}; \
         three replicas routed by client {:?}; routed at random {:?}",
        figures[0].1, figures[1].1
    );
    assert_eq!(figures[0].1, expected, "routed by client: nothing lost");
    assert!(
        figures[1].1 .0 < expected.0 && figures[1].1 .1 < expected.1,
        "routed at random, detections are lost: {:?}",
        figures[1].1
    );
    std::fs::remove_dir_all(&dir).ok();
}
