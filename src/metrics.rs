//! The Prometheus registry (DESIGN §6) and the cached label handles the hot path uses.
//!
//! Edge. Every (client, interface) pair gets a small integer id the first time it is seen;
//! its counters are atomics in the pair, only incremented, and its series are made from them
//! when `/metrics` is written ([`PairFamilies`]): no lock or hash per span, and no object per
//! series. Label values are capped:
//! past `max_clients` client names or `max_interfaces` interface names the value is
//! `__overflow__`, counted in `refusal_gate_label_overflow_total`; and past `max_series`
//! pairs a new pair shares the (`__overflow__`, `__overflow__`) one (counted with
//! `label="series"`), so `/metrics` stays small enough to scrape whatever the fleet does. A pair with no attempt
//! counted for `series_ttl` is expired: its series leave `/metrics`, its names free their
//! places under the caps, and its id is reused (an id carries a generation, so a stale one
//! is never taken for its successor), counted in `refusal_gate_series_expired_total`.

use crate::classify::{Class, Kind};
use crate::config::MetricsConfig;
use crate::openmetrics::{self, Exemplar, Format};
use crate::otlp::Transport;
use crate::tracker::{Event, Violation};
use foldhash::HashMap;
use prometheus::proto::{Metric, MetricFamily};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// The label value that stands for every value past a cap.
pub const OVERFLOW: &str = "__overflow__";

/// The counters of one (client, interface) pair: plain atomics, read at scrape time by
/// [`PairFamilies`]. A series appears once its count is above zero, as a counter created at
/// its first increment would.
struct Pair {
    /// Its id: slot and generation.
    id: u32,
    /// Its key in [`Names::pairs`] (hashes, 0 for an overflowed name).
    key: (u64, u64),
    client: Arc<str>,
    interface: Arc<str>,
    /// The coarse clock (seconds) when an attempt of it was last counted.
    last_seen: AtomicU64,
    attempts: [AtomicU64; Kind::ALL.len()],
    violations: [AtomicU64; Violation::ALL.len()],
    discovery_reads: AtomicU64,
    honored: AtomicU64,
    /// The coarse clock when it last committed a violation (0: never).
    last_violation: AtomicU64,
    /// The latest attempt counted in each of its series that carry one (a violation, or a
    /// kind of class `refusal`), for OpenMetrics' exemplars: only the series that have one,
    /// so a pair that never refused costs an empty vector.
    exemplars: Mutex<Vec<(Series, Exemplar)>>,
}

/// A series of a pair that carries an exemplar: of `refusal_gate_violations_total`, or of
/// `refusal_gate_attempts_total` (a kind of class `refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Series {
    Violation(Violation),
    Attempts(Kind),
}

impl Pair {
    /// Notes `exemplar` as the latest attempt counted in `series`.
    fn exemplar(&self, series: Series, exemplar: Exemplar) {
        let mut kept = self
            .exemplars
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match kept.iter_mut().find(|(s, _)| *s == series) {
            Some((_, e)) => *e = exemplar,
            None => {
                // A place for each series seen, no more: most pairs have one or two.
                kept.reserve_exact(1);
                kept.push((series, exemplar));
            }
        }
    }
}

/// Bits of a pair id that name its slot; the rest is the slot's generation.
const SLOT_BITS: u32 = 24;

/// A place for a pair; its generation grows each time its pair expires.
#[derive(Default)]
struct Slot {
    generation: u32,
    pair: Option<Arc<Pair>>,
}

/// Which pair each (client, interface) hash has, and each admitted name's copy and how many
/// live pairs use it (a name's place under its cap is freed when the last one expires).
#[derive(Default)]
struct Names {
    pairs: HashMap<(u64, u64), u32>,
    clients: HashMap<u64, Name>,
    interfaces: HashMap<u64, Name>,
    /// Slots of expired pairs, to reuse.
    free: Vec<u32>,
}

/// An admitted client or interface name: the one copy its pairs' series share, and how many
/// live pairs hold it.
struct Name {
    text: Arc<str>,
    pairs: u32,
}

/// The counters the exporter keeps.
pub struct ExportMetrics {
    /// `refusal_gate_exporter_sent_spans_total`.
    pub sent: IntCounter,
    /// `refusal_gate_exporter_failed_spans_total{reason}`.
    pub failed: IntCounterVec,
    /// `refusal_gate_exporter_queue_spans`.
    pub queued: IntGauge,
    /// `refusal_gate_exporter_queue_bytes`.
    pub queued_bytes: IntGauge,
}

/// The counters one listener's connections keep (`grpc`, `http` or `admin`), resolved once.
#[derive(Clone)]
pub struct ListenerMetrics {
    /// `refusal_gate_listener_connections{listener}`: open now.
    pub connections: IntGauge,
    /// `refusal_gate_listener_limits_total{listener, limit="max_connections"}`.
    pub max_connections: IntCounter,
    /// `…{limit="read_header_timeout"}`.
    pub read_header_timeout: IntCounter,
    /// `…{limit="read_timeout"}`.
    pub read_timeout: IntCounter,
    /// `…{limit="idle_timeout"}`.
    pub idle_timeout: IntCounter,
    /// `refusal_gate_tls_handshake_failures_total{listener}`, on a TLS listener.
    pub tls_failures: Option<IntCounter>,
}

/// What one (client, interface) pair has counted, by kind and by violation (indexed as
/// [`Kind::ALL`] and [`Violation::ALL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairFigures {
    /// Its labels handle (the tracker's groups carry it).
    pub labels: u32,
    /// The `client` label.
    pub client: Arc<str>,
    /// The `interface` label.
    pub interface: Arc<str>,
    /// Attempts by kind.
    pub attempts: [u64; Kind::ALL.len()],
    /// Violations by kind.
    pub violations: [u64; Violation::ALL.len()],
    /// Discovery documents read.
    pub reads: u64,
    /// Refusals honored.
    pub honored: u64,
    /// Unix seconds (coarse) of its latest counted attempt.
    pub last_seen: u64,
    /// Unix seconds (coarse) of its latest violation; 0 when none.
    pub last_violation: u64,
    /// The trace of its latest violating attempt, when it has one.
    pub last_violation_trace: Option<[u8; 16]>,
}

/// The receivers', tracker's and exporter's running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    /// Spans accepted by both receivers.
    pub accepted_spans: u64,
    /// Spans refused (malformed spans, full queue).
    pub refused_spans: u64,
    /// Requests refused whole.
    pub refused_requests: u64,
    /// Keys the tracker holds.
    pub tracker_keys: u64,
    /// Keys evicted (TTL and capacity).
    pub evictions: u64,
    /// Spans waiting to be forwarded.
    pub queue_spans: u64,
    /// Bytes waiting to be forwarded.
    pub queue_bytes: u64,
    /// Spans forwarded.
    pub forwarded_spans: u64,
}

/// All of refusal-gate's metrics.
pub struct Metrics {
    registry: Registry,
    config: MetricsConfig,
    names: Mutex<Names>,
    // Read on every recorded event, written once per new or expired pair: a RwLock keeps
    // readers apart. Shared with the registry's [`PairFamilies`].
    pairs: Arc<RwLock<Vec<Slot>>>,
    /// Seconds, advanced by [`Metrics::tick`]: what `last_seen` is stamped with.
    clock: AtomicU64,
    series_expired: IntCounter,
    cycles_cut: IntCounter,
    accepted_spans: [IntCounter; 2],
    /// Cached handles: `not_client`, `no_protocol`, `duplicate`, `same_call`.
    skipped_by: [IntCounter; 4],
    /// Cached handles, by transport.
    batch_duration_by: [prometheus::Histogram; 2],
    refused_spans: IntCounterVec,
    refused_requests: IntCounterVec,
    truncated_spans: IntCounterVec,
    tls_failures: IntCounterVec,
    listener_limits: IntCounterVec,
    listener_connections: IntGaugeVec,
    skipped: IntCounterVec,
    tracker_keys: IntGauge,
    held_spans: IntGauge,
    held_bytes: IntGauge,
    held_forced: IntCounterVec,
    evictions: IntCounterVec,
    label_overflow: IntCounterVec,
    label_truncated: IntCounterVec,
    metric_pushes: IntCounterVec,
    document_loads: IntCounterVec,
    alerts: IntCounterVec,
    alert_deliveries: IntCounterVec,
    alert_watchers_refused: IntCounterVec,
    exporter_sent: IntCounter,
    exporter_failed: IntCounterVec,
    exporter_queue: IntGauge,
    exporter_queue_bytes: IntGauge,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric names are valid");
    registry
        .register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

/// The families of the (client, interface) pairs — `refusal_gate_attempts_total`,
/// `refusal_gate_violations_total`, `refusal_gate_discovery_reads_total` and
/// `refusal_gate_refusals_honored_total` — collected at scrape time from the pairs' atomics.
/// A counter of the `prometheus` crate is an object of its own, with its own copy of its
/// description and label pairs (some 500 bytes; 290 MiB at 10,000 clients each its own
/// series); a pair's counters here are 16 words in the pair, and a series is one only while
/// `/metrics` is written.
struct PairFamilies {
    pairs: Arc<RwLock<Vec<Slot>>>,
    /// Attempts, violations, discovery reads, honored refusals.
    descs: [prometheus::core::Desc; 4],
}

impl PairFamilies {
    fn new(pairs: Arc<RwLock<Vec<Slot>>>) -> PairFamilies {
        let desc = |name: &str, help: &str, labels: &[&str]| {
            prometheus::core::Desc::new(
                name.to_owned(),
                help.to_owned(),
                labels.iter().map(|l| (*l).to_owned()).collect(),
                std::collections::HashMap::new(),
            )
            .expect("metric names are valid")
        };
        PairFamilies {
            pairs,
            descs: [
                desc(
                    "refusal_gate_attempts_total",
                    "Client attempts, by class and kind of the decision table.",
                    &["client", "interface", "class", "kind"],
                ),
                desc(
                    "refusal_gate_violations_total",
                    "Attempts a client following the decision boundary would not have sent, and probes.",
                    &["client", "interface", "violation"],
                ),
                desc(
                    "refusal_gate_discovery_reads_total",
                    "Successful reads of an interface's discovery document.",
                    &["client", "interface"],
                ),
                desc(
                    "refusal_gate_refusals_honored_total",
                    "Refusals not retried within probe_window.",
                    &["client", "interface"],
                ),
            ],
        }
    }
}

/// One counter sample of a pair: `client`, `interface` and the `extra` labels, sorted by
/// name as the `prometheus` crate sorts a series' labels.
fn pair_sample(p: &Pair, extra: &[(&str, &str)], value: u64) -> prometheus::proto::Metric {
    let label = |name: &str, value: &str| {
        let mut l = prometheus::proto::LabelPair::default();
        l.set_name(name.to_owned());
        l.set_value(value.to_owned());
        l
    };
    let mut labels: Vec<_> = [("client", &*p.client), ("interface", &*p.interface)]
        .into_iter()
        .chain(extra.iter().copied())
        .map(|(n, v)| label(n, v))
        .collect();
    labels.sort_by(|a, b| a.name().cmp(b.name()));
    let mut counter = prometheus::proto::Counter::default();
    counter.set_value(value as f64);
    let mut m = prometheus::proto::Metric::from_label(labels);
    m.set_counter(counter);
    m
}

impl prometheus::core::Collector for PairFamilies {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families: [Vec<prometheus::proto::Metric>; 4] = Default::default();
        let pairs = self.pairs.read().unwrap_or_else(PoisonError::into_inner);
        for p in pairs.iter().filter_map(|slot| slot.pair.as_deref()) {
            let mut sample = |family: usize, extra: &[(&str, &str)], count: &AtomicU64| {
                let value = count.load(Ordering::Relaxed);
                if value > 0 {
                    families[family].push(pair_sample(p, extra, value));
                }
            };
            for kind in Kind::ALL {
                let extra = [("class", kind.class().as_str()), ("kind", kind.as_str())];
                sample(0, &extra, &p.attempts[kind as usize]);
            }
            for v in Violation::ALL {
                sample(1, &[("violation", v.as_str())], &p.violations[v as usize]);
            }
            sample(2, &[], &p.discovery_reads);
            sample(3, &[], &p.honored);
        }
        drop(pairs);
        self.descs
            .iter()
            .zip(families)
            // (A family with no series is left out by the registry.)
            .map(|(desc, metrics)| {
                let mut family = prometheus::proto::MetricFamily::default();
                family.set_name(desc.fq_name.clone());
                family.set_help(desc.help.clone());
                family.set_field_type(prometheus::proto::MetricType::COUNTER);
                family.set_metric(metrics);
                family
            })
            .collect()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new(config: &MetricsConfig) -> Metrics {
        let r = Registry::new();
        let pairs = Arc::new(RwLock::new(Vec::new()));
        r.register(Box::new(PairFamilies::new(Arc::clone(&pairs))))
            .expect("each metric is registered once");
        let accepted = counter_vec(
            &r,
            "refusal_gate_receiver_accepted_spans_total",
            "Spans accepted by the receivers.",
            &["transport"],
        );
        let refused_spans = counter_vec(
            &r,
            "refusal_gate_receiver_refused_spans_total",
            "Spans the receivers could not decode and rejected.",
            &["transport", "reason"],
        );
        let refused_requests = counter_vec(
            &r,
            "refusal_gate_receiver_refused_requests_total",
            "Whole requests refused (malformed, too large, wrong type or encoding), whose spans cannot be counted.",
            &["transport", "reason"],
        );
        let truncated_spans = counter_vec(
            &r,
            "refusal_gate_receiver_truncated_spans_total",
            "Spans with more attributes than max_attributes_per_span; the rest were not read.",
            &["transport"],
        );
        let tls_failures = counter_vec(
            &r,
            "refusal_gate_tls_handshake_failures_total",
            "TLS handshakes that failed or timed out (no or a wrong client certificate, plain text on a TLS port), by listener.",
            &["listener"],
        );
        let listener_limits = counter_vec(
            &r,
            "refusal_gate_listener_limits_total",
            "Times a listener's connection limit fired: max_connections (a connection accepted and closed), read_header_timeout and idle_timeout (a connection closed), read_timeout (a request's body not received in time).",
            &["listener", "limit"],
        );
        let listener_connections = IntGaugeVec::new(
            Opts::new(
                "refusal_gate_listener_connections",
                "Connections open now, by listener.",
            ),
            &["listener"],
        )
        .expect("metric names are valid");
        r.register(Box::new(listener_connections.clone()))
            .expect("each metric is registered once");
        let skipped = counter_vec(
            &r,
            "refusal_gate_spans_skipped_total",
            "Spans that are not attempts (not CLIENT, no known protocol, duplicate, the same call as another span).",
            &["reason"],
        );
        let tracker_keys = IntGauge::new("refusal_gate_tracker_keys", "Keys the tracker holds.")
            .expect("metric names are valid");
        r.register(Box::new(tracker_keys.clone()))
            .expect("each metric is registered once");
        let held_spans = IntGauge::new(
            "refusal_gate_held_spans",
            "Spans of calls kept for the rest of their call (tracker.max_held_spans).",
        )
        .expect("metric names are valid");
        r.register(Box::new(held_spans.clone()))
            .expect("each metric is registered once");
        let held_bytes = IntGauge::new(
            "refusal_gate_held_bytes",
            "Bytes those spans' facts take (tracker.max_held_mib).",
        )
        .expect("metric names are valid");
        r.register(Box::new(held_bytes.clone()))
            .expect("each metric is registered once");
        let held_forced = counter_vec(
            &r,
            "refusal_gate_held_calls_forced_total",
            "Held calls counted before the rest of their call arrived, because a bound was reached.",
            &["bound"],
        );
        let evictions = counter_vec(
            &r,
            "refusal_gate_tracker_evictions_total",
            "Keys the tracker forgot, by reason.",
            &["reason"],
        );
        let series_expired = IntCounter::new(
            "refusal_gate_series_expired_total",
            "(client, interface) pairs whose series were removed after series_ttl without an attempt.",
        )
        .expect("metric names are valid");
        r.register(Box::new(series_expired.clone()))
            .expect("each metric is registered once");
        let cycles_cut = IntCounter::new(
            "refusal_gate_call_cycles_cut_total",
            "Cycles of parent span ids cut to join a call (a span naming its own descendant as its parent).",
        )
        .expect("metric names are valid");
        r.register(Box::new(cycles_cut.clone()))
            .expect("each metric is registered once");
        let label_overflow = counter_vec(
            &r,
            "refusal_gate_label_overflow_total",
            "Attempts whose client or interface label was replaced by __overflow__.",
            &["label"],
        );
        let metric_pushes = counter_vec(
            &r,
            "refusal_gate_exporter_metric_pushes_total",
            "Pushes of the OTLP metrics exporter: sent, retried (a try that failed and is tried again) or failed (given up).",
            &["outcome"],
        );
        let label_truncated = counter_vec(
            &r,
            "refusal_gate_label_truncated_total",
            "Label values cut to metrics.max_label_bytes and given a hash suffix, counted once per request and series that used one.",
            &["label"],
        );
        let document_loads = counter_vec(
            &r,
            "refusal_gate_discovery_document_loads_total",
            "Loads of interfaces' discovery documents, by outcome (loaded, not_modified, invalid, refused, failed).",
            &["interface", "outcome"],
        );
        let alerts = counter_vec(
            &r,
            "refusal_gate_alerts_total",
            "Alerts raised, one per violation at or above the minimum severity.",
            &["alertname", "severity"],
        );
        let alert_deliveries = counter_vec(
            &r,
            "refusal_gate_alert_deliveries_total",
            "Alert deliveries by receiver and outcome (sent, failed and retried, rejected, dropped).",
            &["receiver", "outcome"],
        );
        let alert_watchers_refused = counter_vec(
            &r,
            "refusal_gate_alert_watchers_refused_total",
            "Alert watchers (WatchAlerts streams, /v1/alerts/stream subscribers) refused at alerting.max_watchers.",
            &["endpoint"],
        );
        let exporter_sent = IntCounter::new(
            "refusal_gate_exporter_sent_spans_total",
            "Spans forwarded and accepted downstream.",
        )
        .expect("metric names are valid");
        r.register(Box::new(exporter_sent.clone()))
            .expect("each metric is registered once");
        let exporter_failed = counter_vec(
            &r,
            "refusal_gate_exporter_failed_spans_total",
            "Spans not forwarded (queue_full, refused, partial_success, shutdown, too_large), and spans of each failed try that is retried (retried).",
            &["reason"],
        );
        let exporter_queue = IntGauge::new(
            "refusal_gate_exporter_queue_spans",
            "Spans waiting to be forwarded.",
        )
        .expect("metric names are valid");
        r.register(Box::new(exporter_queue.clone()))
            .expect("each metric is registered once");
        let exporter_queue_bytes = IntGauge::new(
            "refusal_gate_exporter_queue_bytes",
            "Bytes of tagged requests waiting to be forwarded (or reserved for them).",
        )
        .expect("metric names are valid");
        r.register(Box::new(exporter_queue_bytes.clone()))
            .expect("each metric is registered once");
        let batch_duration = HistogramVec::new(
            HistogramOpts::new(
                "refusal_gate_batch_duration_seconds",
                "Time to decode and process one export request.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            ]),
            &["transport"],
        )
        .expect("metric names are valid");
        r.register(Box::new(batch_duration.clone()))
            .expect("each metric is registered once");
        let build_info = IntGaugeVec::new(
            Opts::new(
                "refusal_gate_build_info",
                "Always 1; the version is a label.",
            ),
            &["version"],
        )
        .expect("metric names are valid");
        r.register(Box::new(build_info.clone()))
            .expect("each metric is registered once");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Series a dashboard plots are created at zero, so they show 0 rather than no data.
        for reason in ["ttl", "capacity"] {
            evictions.with_label_values(&[reason]);
        }
        let skipped_by = ["not_client", "no_protocol", "duplicate", "same_call"]
            .map(|r| skipped.with_label_values(&[r]));
        for transport in [Transport::Grpc, Transport::Http] {
            refused_spans.with_label_values(&[transport.as_str(), "malformed_span"]);
        }
        let accepted_spans = [
            accepted.with_label_values(&[Transport::Grpc.as_str()]),
            accepted.with_label_values(&[Transport::Http.as_str()]),
        ];
        let batch_duration_by = [Transport::Grpc, Transport::Http]
            .map(|t| batch_duration.with_label_values(&[t.as_str()]));
        Metrics {
            registry: r,
            skipped_by,
            batch_duration_by,
            config: config.clone(),
            names: Mutex::new(Names::default()),
            pairs,
            // Now, not 0: a pair made before the first sweep is stamped with the time it
            // was made, not with the epoch (which the first sweep would take as long gone).
            clock: AtomicU64::new(crate::clock::now() / crate::clock::SECOND),
            series_expired,
            cycles_cut,
            accepted_spans,
            refused_spans,
            refused_requests,
            truncated_spans,
            tls_failures,
            listener_limits,
            listener_connections,
            skipped,
            tracker_keys,
            held_spans,
            held_bytes,
            held_forced,
            evictions,
            label_overflow,
            label_truncated,
            metric_pushes,
            document_loads,
            alerts,
            alert_deliveries,
            alert_watchers_refused,
            exporter_sent,
            exporter_failed,
            exporter_queue,
            exporter_queue_bytes,
        }
    }

    /// The id of the (client, interface) pair, by the hashes of their names; the names are
    /// copied only the first time. Applies the label caps: a name past its cap shares the
    /// `__overflow__` pair, and is admitted later if a place frees up.
    pub fn labels(
        &self,
        client_hash: u64,
        client: &str,
        interface_hash: u64,
        interface: &str,
    ) -> u32 {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = names.pairs.get(&(client_hash, interface_hash)) {
            return *id;
        }
        let admit = |set: &HashMap<u64, Name>, hash: u64, cap: usize, label: &str| {
            let ok = set.contains_key(&hash) || set.len() < cap;
            if !ok {
                self.label_overflow.with_label_values(&[label]).inc();
            }
            ok
        };
        let client_ok = admit(
            &names.clients,
            client_hash,
            self.config.max_clients,
            "client",
        );
        let interface_ok = admit(
            &names.interfaces,
            interface_hash,
            self.config.max_interfaces,
            "interface",
        );
        // Overflowed names share the pair of their overflow value and are not remembered
        // one by one, so a flood of new names costs no memory.
        let key = (
            if client_ok { client_hash } else { 0 },
            if interface_ok { interface_hash } else { 0 },
        );
        if let Some(id) = names.pairs.get(&key) {
            return *id;
        }
        // The pairs are capped too: names each under their caps still make their product.
        let (key, client_ok, interface_ok) = if names.pairs.len() >= self.config.max_series {
            self.label_overflow.with_label_values(&["series"]).inc();
            if let Some(id) = names.pairs.get(&(0, 0)) {
                return *id;
            }
            ((0, 0), false, false)
        } else {
            (key, client_ok, interface_ok)
        };
        // A name is copied once however many pairs hold it (a client calls many interfaces).
        let hold = |set: &mut HashMap<u64, Name>, ok: bool, hash: u64, text: &str| {
            if !ok {
                return Arc::from(OVERFLOW);
            }
            let name = set.entry(hash).or_insert_with(|| Name {
                text: Arc::from(text),
                pairs: 0,
            });
            name.pairs += 1;
            Arc::clone(&name.text)
        };
        let client = hold(&mut names.clients, client_ok, client_hash, client);
        let interface = hold(
            &mut names.interfaces,
            interface_ok,
            interface_hash,
            interface,
        );
        let mut pairs = self.pairs.write().unwrap_or_else(PoisonError::into_inner);
        let slot = names.free.pop().unwrap_or_else(|| {
            pairs.push(Slot::default());
            u32::try_from(pairs.len() - 1).unwrap_or(u32::MAX)
        });
        let place = &mut pairs[slot as usize];
        let id = slot | (place.generation << SLOT_BITS);
        place.pair = Some(Arc::new(Pair {
            id,
            key,
            client,
            interface,
            last_seen: AtomicU64::new(self.clock.load(Ordering::Relaxed)),
            attempts: Default::default(),
            violations: Default::default(),
            discovery_reads: AtomicU64::new(0),
            honored: AtomicU64::new(0),
            last_violation: AtomicU64::new(0),
            exemplars: Mutex::new(Vec::new()),
        }));
        names.pairs.insert(key, id);
        id
    }

    fn pair(&self, id: u32) -> Option<Arc<Pair>> {
        self.pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get((id & ((1 << SLOT_BITS) - 1)) as usize)
            .and_then(|slot| slot.pair.as_ref())
            .filter(|p| p.id == id)
            .cloned()
    }

    /// Advances the coarse clock pairs are stamped with (Unix seconds).
    fn tick(&self, now_secs: u64) {
        self.clock.store(now_secs, Ordering::Relaxed);
    }

    /// The periodic sweep at `now_secs` (Unix seconds): advances the clock and expires the
    /// pairs with no attempt counted for `series_ttl` (when it is not 0). Returns how many
    /// expired.
    pub fn sweep(&self, now_secs: u64) -> usize {
        self.tick(now_secs);
        let ttl = self.config.series_ttl.as_secs();
        if self.config.series_ttl.is_zero() {
            return 0;
        }
        self.expire_series(ttl.max(1))
    }

    /// Expires the pairs with no attempt counted for `ttl` seconds: removes their series,
    /// frees their names' places under the caps and their ids. Returns how many expired.
    fn expire_series(&self, ttl: u64) -> usize {
        let now = self.clock.load(Ordering::Relaxed);
        let mut guard = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let names = &mut *guard;
        let mut pairs = self.pairs.write().unwrap_or_else(PoisonError::into_inner);
        let mut expired = 0;
        for (slot, place) in pairs.iter_mut().enumerate() {
            let Some(p) = place.pair.as_ref() else {
                continue;
            };
            if p.last_seen.load(Ordering::Relaxed).saturating_add(ttl) > now {
                continue;
            }
            // Its series leave `/metrics` with it (see PairFamilies).
            let p = Arc::clone(p);
            names.pairs.remove(&p.key);
            for (set, hash) in [
                (&mut names.clients, p.key.0),
                (&mut names.interfaces, p.key.1),
            ] {
                if let Some(n) = set.get_mut(&hash) {
                    n.pairs -= 1;
                    if n.pairs == 0 {
                        set.remove(&hash);
                    }
                }
            }
            // The next pair in this slot has a new id: a stale id finds nothing.
            place.pair = None;
            place.generation = (place.generation + 1) & ((1 << (32 - SLOT_BITS)) - 1);
            names.free.push(u32::try_from(slot).unwrap_or(u32::MAX));
            expired += 1;
        }
        self.series_expired.inc_by(expired as u64);
        expired
    }

    /// Records what the tracker reported.
    pub fn record(&self, events: &[Event]) {
        // A request's events come in runs of the same pair: looked up once a run.
        let mut last: Option<Arc<Pair>> = None;
        for event in events {
            match *event {
                Event::Counted {
                    labels,
                    kind,
                    violation,
                    discovery_read,
                    trace_id,
                    span_id,
                    end,
                    ..
                } => {
                    if last.as_ref().is_none_or(|p| p.id != labels) {
                        last = self.pair(labels);
                    }
                    let Some(p) = &last else { continue };
                    p.last_seen
                        .store(self.clock.load(Ordering::Relaxed), Ordering::Relaxed);
                    p.attempts[kind as usize].fetch_add(1, Ordering::Relaxed);
                    let exemplar = Exemplar {
                        trace_id,
                        span_id,
                        at: end,
                    };
                    // Only a real trace's ids (all-zero ones are none, §6: the pipeline gives
                    // ids of the wrong length an all-zero trace id).
                    let exemplar = (trace_id != [0; 16] && span_id != [0; 8]).then_some(exemplar);
                    if let (Class::Refusal, Some(exemplar)) = (kind.class(), exemplar) {
                        p.exemplar(Series::Attempts(kind), exemplar);
                    }
                    if let Some(v) = violation {
                        p.last_violation
                            .store(self.clock.load(Ordering::Relaxed), Ordering::Relaxed);
                        p.violations[v as usize].fetch_add(1, Ordering::Relaxed);
                        if let Some(exemplar) = exemplar {
                            p.exemplar(Series::Violation(v), exemplar);
                        }
                    }
                    if discovery_read {
                        p.discovery_reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Event::Honored { labels } => {
                    let Some(p) = self.pair(labels) else { continue };
                    p.honored.fetch_add(1, Ordering::Relaxed);
                }
                Event::Evicted { reason, keys } => {
                    self.evictions
                        .with_label_values(&[reason.as_str()])
                        .inc_by(keys as u64);
                }
            }
        }
    }

    /// Counts spans a receiver accepted.
    pub fn accepted(&self, transport: Transport, spans: u64) {
        self.accepted_spans[transport as usize].inc_by(spans);
    }

    /// Counts spans a receiver rejected.
    pub fn refused_spans(&self, transport: Transport, reason: &str, spans: u64) {
        self.refused_spans
            .with_label_values(&[transport.as_str(), reason])
            .inc_by(spans);
    }

    /// Counts spans whose attributes past the limit were not read.
    pub fn truncated_spans(&self, transport: Transport, spans: u64) {
        self.truncated_spans
            .with_label_values(&[transport.as_str()])
            .inc_by(spans);
    }

    /// The counters of the listener `listener` (`grpc`, `http`, `admin`), created at zero;
    /// its TLS handshake failures too when it serves `tls`.
    pub fn listener(&self, listener: &str, tls: bool) -> ListenerMetrics {
        let limit = |l: &str| self.listener_limits.with_label_values(&[listener, l]);
        ListenerMetrics {
            connections: self.listener_connections.with_label_values(&[listener]),
            max_connections: limit("max_connections"),
            read_header_timeout: limit("read_header_timeout"),
            read_timeout: limit("read_timeout"),
            idle_timeout: limit("idle_timeout"),
            tls_failures: tls.then(|| self.tls_failures.with_label_values(&[listener])),
        }
    }

    /// Counts a whole request refused.
    pub fn refused_request(&self, transport: Transport, reason: &str) {
        self.refused_requests
            .with_label_values(&[transport.as_str(), reason])
            .inc();
    }

    /// Counts one span that is not an attempt.
    pub fn span_skipped(&self, reason: &str) {
        self.spans_skipped_by(reason, 1);
    }

    /// Counts spans that are not attempts.
    pub fn spans_skipped_by(&self, reason: &str, n: u64) {
        match reason {
            "not_client" => self.skipped_by[0].inc_by(n),
            "no_protocol" => self.skipped_by[1].inc_by(n),
            "duplicate" => self.skipped_by[2].inc_by(n),
            "same_call" => self.skipped_by[3].inc_by(n),
            other => self.skipped.with_label_values(&[other]).inc_by(n),
        }
    }

    /// What every live (client, interface) pair has counted: the console's fleet.
    pub fn fleet(&self) -> Vec<PairFigures> {
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|slot| slot.pair.as_ref())
            .map(|p| PairFigures {
                labels: p.id,
                client: Arc::clone(&p.client),
                interface: Arc::clone(&p.interface),
                attempts: std::array::from_fn(|k| count(&p.attempts[k])),
                violations: std::array::from_fn(|v| count(&p.violations[v])),
                reads: count(&p.discovery_reads),
                honored: count(&p.honored),
                last_seen: p.last_seen.load(Ordering::Relaxed),
                last_violation: p.last_violation.load(Ordering::Relaxed),
                last_violation_trace: p
                    .exemplars
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .filter(|(s, _)| matches!(s, Series::Violation(_)))
                    .max_by_key(|(_, e)| e.at)
                    .map(|(_, e)| e.trace_id),
            })
            .collect()
    }

    /// The receivers', tracker's and exporter's figures the console shows.
    pub fn health(&self) -> Health {
        use prometheus::core::Collector;
        let sum = |v: &IntCounterVec| -> u64 {
            v.collect()
                .iter()
                .flat_map(|f| f.get_metric())
                .map(|m| m.get_counter().get_value() as u64)
                .sum()
        };
        Health {
            accepted_spans: self.accepted_spans.iter().map(IntCounter::get).sum(),
            refused_spans: sum(&self.refused_spans),
            refused_requests: sum(&self.refused_requests),
            tracker_keys: u64::try_from(self.tracker_keys.get()).unwrap_or(0),
            evictions: sum(&self.evictions),
            queue_spans: u64::try_from(self.exporter_queue.get()).unwrap_or(0),
            queue_bytes: u64::try_from(self.exporter_queue_bytes.get()).unwrap_or(0),
            forwarded_spans: self.exporter_sent.get(),
        }
    }

    /// Sets the gauges of the spans kept for the rest of their call.
    pub fn set_held(&self, spans: usize, bytes: usize) {
        self.held_spans
            .set(i64::try_from(spans).unwrap_or(i64::MAX));
        self.held_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts `cut` cycles of parent ids cut in a call's join.
    pub fn call_cycles_cut(&self, cut: usize) {
        self.cycles_cut.inc_by(cut as u64);
    }

    /// Counts a held call counted early because `bound` was reached.
    pub fn held_forced(&self, bound: &str) {
        self.held_forced.with_label_values(&[bound]).inc();
    }

    /// Sets the tracker's key gauge.
    pub fn set_tracker_keys(&self, keys: usize) {
        self.tracker_keys
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// The alert counters, for the alerter: (`refusal_gate_alerts_total`,
    /// `refusal_gate_alert_deliveries_total`, `refusal_gate_alert_watchers_refused_total`).
    pub fn alert_counters(&self) -> (IntCounterVec, IntCounterVec, IntCounterVec) {
        (
            self.alerts.clone(),
            self.alert_deliveries.clone(),
            self.alert_watchers_refused.clone(),
        )
    }

    /// The exporter's counters.
    pub fn export_metrics(&self) -> ExportMetrics {
        ExportMetrics {
            sent: self.exporter_sent.clone(),
            failed: self.exporter_failed.clone(),
            queued: self.exporter_queue.clone(),
            queued_bytes: self.exporter_queue_bytes.clone(),
        }
    }

    /// The longest `client` or `interface` label value: longer ones are cut
    /// ([`crate::label::shorten`]) before they reach [`Metrics::labels`].
    pub fn max_label_bytes(&self) -> usize {
        self.config.max_label_bytes
    }

    /// Counts a `client` or `interface` (`label`) value cut to `max_label_bytes`.
    pub fn label_truncated(&self, label: &str) {
        self.label_truncated.with_label_values(&[label]).inc();
    }

    /// The most bytes one (client, interface) pair can add to `/metrics` with label values of
    /// at most `max_label_bytes`: one line for each kind of attempt and each violation, one
    /// for discovery reads and one for honored refusals, every label value as long as it may
    /// be with each of its bytes escaped to two (`\\`, `\"`), every count 20 digits long. With
    /// the default caps (128 bytes, 10,000 pairs and the overflow pair) `/metrics` is at most
    /// 10,001 times this (9,270 bytes): 92.7 MB (88.4 MiB), and the other families' few
    /// kilobytes.
    pub fn max_pair_bytes(max_label_bytes: usize) -> usize {
        // `name{client="…",interface="…"` and ` 18446744073709551615\n`.
        let line = |name: &str| name.len() + r#"{client="",interface=""} "#.len() + 20 + 1;
        let values = 2 * 2 * max_label_bytes;
        let attempts: usize = Kind::ALL
            .iter()
            .map(|k| {
                let (class, kind) = (k.class().as_str(), k.as_str());
                let extra = format!(",class=\"{class}\",kind=\"{kind}\"");
                line("refusal_gate_attempts_total") + extra.len() + values
            })
            .sum();
        let violations: usize = Violation::ALL
            .iter()
            .map(|v| {
                let extra = format!(",violation=\"{}\"", v.as_str());
                line("refusal_gate_violations_total") + extra.len() + values
            })
            .sum();
        attempts
            + violations
            + line("refusal_gate_discovery_reads_total")
            + values
            + line("refusal_gate_refusals_honored_total")
            + values
    }

    /// The (client, interface) label values of a pair id.
    pub fn label_names(&self, id: u32) -> Option<(Arc<str>, Arc<str>)> {
        self.pair(id)
            .map(|p| (p.client.clone(), p.interface.clone()))
    }

    /// Counts one load of a discovery document.
    pub fn document_load(&self, interface: &str, outcome: &str) {
        self.document_loads
            .with_label_values(&[interface, outcome])
            .inc();
    }

    /// Observes the time one request took.
    pub fn batch_duration(&self, transport: Transport, seconds: f64) {
        self.batch_duration_by[transport as usize].observe(seconds);
    }

    /// Every metric family, as the text exposition would show it (for reports).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.registry.gather()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        self.render_as(Format::Text)
    }

    /// Every metric in `format`: the 0.0.4 text format, or OpenMetrics text with an
    /// exemplar on each series that has one (see [`Pair::exemplars`]).
    pub fn render_as(&self, format: Format) -> String {
        if format == Format::Text {
            let mut buf = Vec::new();
            // Encoding into a Vec cannot fail for the text format.
            let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
            return String::from_utf8(buf).unwrap_or_default();
        }
        self.with_exemplars(|families, exemplar| openmetrics::encode(families, exemplar))
    }

    /// Calls `f` with every metric family and the exemplar of a series of them (the latest
    /// attempt counted in a violation series, or in an attempts series of class `refusal`):
    /// what the OpenMetrics format and the OTLP push write.
    pub fn with_exemplars<R>(
        &self,
        f: impl FnOnce(&[MetricFamily], &dyn Fn(&MetricFamily, &Metric) -> Option<Exemplar>) -> R,
    ) -> R {
        let families = self.registry.gather();
        // The pairs with an exemplar, by their label values: the series' labels are all
        // a writer has to go by.
        let pairs: Vec<Arc<Pair>> = self
            .pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|slot| slot.pair.clone())
            .filter(|p| {
                !p.exemplars
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .is_empty()
            })
            .collect();
        let by_names: HashMap<(&str, &str), &Pair> = pairs
            .iter()
            .map(|p| ((&*p.client, &*p.interface), &**p))
            .collect();
        f(&families, &|family, metric| {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value())
            };
            let series = match family.name() {
                "refusal_gate_violations_total" => {
                    let v = label("violation")?;
                    Series::Violation(*Violation::ALL.iter().find(|x| x.as_str() == v)?)
                }
                "refusal_gate_attempts_total" => {
                    let k = label("kind")?;
                    Series::Attempts(*Kind::ALL.iter().find(|x| x.as_str() == k)?)
                }
                _ => return None,
            };
            let pair = by_names.get(&(label("client")?, label("interface")?))?;
            let kept = pair
                .exemplars
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            kept.iter().find(|(s, _)| *s == series).map(|(_, e)| *e)
        })
    }

    /// Counts a push of the OTLP metrics exporter: `sent`, `retried` (a try that failed and
    /// is tried again) or `failed` (given up: refused, or the next push was due).
    pub fn metric_push(&self, outcome: &str) {
        self.metric_pushes.with_label_values(&[outcome]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(labels: u32) -> Event {
        counted_as(labels, Kind::Ok, None)
    }

    /// An attempt of `kind` counted, committing `violation` (and then read the document).
    fn counted_as(labels: u32, kind: Kind, violation: Option<Violation>) -> Event {
        Event::Counted {
            operation: None,
            labels,
            kind,
            violation,
            discovery_read: violation.is_some(),
            trace_id: [0; 16],
            span_id: [0; 8],
            end: 0,
        }
    }

    fn metrics(series_ttl: u64) -> Metrics {
        Metrics::new(&MetricsConfig {
            max_clients: 2,
            max_interfaces: 10,
            max_series: 100,
            series_ttl: std::time::Duration::from_secs(series_ttl),
            ..MetricsConfig::default()
        })
    }

    #[test]
    fn a_pair_adds_at_most_max_pair_bytes_to_the_exposition() {
        let m = metrics(0);
        // Label values of 128 bytes, each of which the exposition escapes to two.
        let client = "\\".repeat(128);
        let interface = "\"".repeat(128);
        let labels = m.labels(1, &client, 2, &interface);
        let mut events: Vec<Event> = Kind::ALL
            .iter()
            .map(|&kind| counted_as(labels, kind, None))
            .collect();
        events.extend(Violation::ALL.map(|v| counted_as(labels, Kind::Ok, Some(v))));
        events.push(Event::Honored { labels });
        m.record(&events);
        let text = m.render();
        let pair: usize = text
            .lines()
            .filter(|l| l.contains("client=\""))
            .map(|l| l.len() + 1)
            .sum();
        // Each of its 15 lines counts to one digit here, not 20.
        assert_eq!(pair, Metrics::max_pair_bytes(128) - 15 * 19, "{text}");
        // The figure the documentation gives.
        assert_eq!(Metrics::max_pair_bytes(128), 9_270);
    }

    #[test]
    fn every_family_keeps_its_name_and_type_in_openmetrics() {
        let m = metrics(0);
        let text = m.render_as(Format::OpenMetrics("1.0.0"));
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert!(types.len() >= 5, "{text}");
        assert!(
            !types.iter().any(|l| l.ends_with(" unknown")),
            "every counter is named _total, so none is written as unknown: {types:?}"
        );
        for family in m.gather() {
            let name = family.name();
            let meta = name.strip_suffix("_total").unwrap_or(name);
            assert!(
                types
                    .iter()
                    .any(|l| l.starts_with(&format!("# TYPE {meta} "))),
                "{name} in {types:?}"
            );
        }
    }

    /// `counted_as` of a span whose ids and end are `n`.
    fn counted_span(labels: u32, kind: Kind, violation: Option<Violation>, n: u8) -> Event {
        let mut event = counted_as(labels, kind, violation);
        if let Event::Counted {
            trace_id,
            span_id,
            end,
            ..
        } = &mut event
        {
            *trace_id = [n; 16];
            *span_id = [n; 8];
            *end = u64::from(n) * 1_000_000_000;
        }
        event
    }

    #[test]
    fn openmetrics_shows_each_refusal_and_violation_series_its_latest_attempt() {
        let m = metrics(0);
        let a = m.labels(1, "a", 2, "i");
        let b = m.labels(3, "b", 2, "i");
        m.record(&[
            counted_span(a, Kind::InterfaceNotDeclared, None, 1),
            counted_span(
                a,
                Kind::InterfaceNotDeclared,
                Some(Violation::ProbeAfterRefusal),
                2,
            ),
            counted_span(a, Kind::Transient, Some(Violation::RetryBudgetExhausted), 3),
            counted_span(b, Kind::Ok, None, 4),
            counted_span(b, Kind::ProtocolNotSupported, None, 5),
        ]);
        let text = m.render_as(Format::OpenMetrics("1.0.0"));
        assert!(text.ends_with("# EOF\n"));
        let with = |ids: u8| {
            format!(
                " # {{trace_id=\"{}\",span_id=\"{}\"}} 1 {ids}.000",
                format!("{ids:02x}").repeat(16),
                format!("{ids:02x}").repeat(8)
            )
        };
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("refusal_gate_attempts") || l.starts_with("refusal_gate_violations")
            })
            .collect();
        assert_eq!(
            lines,
            [
                r#"refusal_gate_attempts_total{class="ok",client="b",interface="i",kind="ok"} 1"#.to_owned(),
                r#"refusal_gate_attempts_total{class="refusal",client="a",interface="i",kind="interface_not_declared"} 2"#.to_owned() + &with(2),
                r#"refusal_gate_attempts_total{class="refusal",client="b",interface="i",kind="protocol_not_supported"} 1"#.to_owned() + &with(5),
                r#"refusal_gate_attempts_total{class="transient",client="a",interface="i",kind="transient"} 1"#.to_owned(),
                r#"refusal_gate_violations_total{client="a",interface="i",violation="probe_after_refusal"} 1"#.to_owned() + &with(2),
                r#"refusal_gate_violations_total{client="a",interface="i",violation="retry_budget_exhausted"} 1"#.to_owned() + &with(3),
            ],
            "{text}"
        );
        let plain = m.render();
        assert!(
            !plain.contains("trace_id") && !plain.contains("# EOF"),
            "{plain}"
        );
        let pair = m.pair(a).expect("live");
        assert_eq!(
            pair.exemplars.lock().expect("not poisoned").capacity(),
            3,
            "one place for each series that has an exemplar"
        );
    }

    #[test]
    fn a_pairs_series_are_written_as_counters_with_their_labels_in_order() {
        let m = metrics(0);
        let a = m.labels(1, "a", 2, "http://i");
        let b = m.labels(3, "b", 2, "http://i");
        m.record(&[
            counted_as(a, Kind::ProtocolNotSupported, None),
            counted_as(
                a,
                Kind::ProtocolNotSupported,
                Some(Violation::RetryAfterRefusal),
            ),
            counted_as(b, Kind::Ok, None),
            Event::Honored { labels: b },
        ]);
        let text = m.render();
        let family = |name: &str| -> Vec<&str> {
            text.lines()
                .filter(|l| l.starts_with(name) || l.ends_with(&format!(" {name} counter")))
                .collect()
        };
        assert_eq!(
            family("refusal_gate_attempts_total"),
            [
                "# TYPE refusal_gate_attempts_total counter",
                r#"refusal_gate_attempts_total{class="ok",client="b",interface="http://i",kind="ok"} 1"#,
                r#"refusal_gate_attempts_total{class="refusal",client="a",interface="http://i",kind="protocol_not_supported"} 2"#,
            ],
            "{text}"
        );
        assert_eq!(
            family("refusal_gate_violations_total"),
            [
                "# TYPE refusal_gate_violations_total counter",
                r#"refusal_gate_violations_total{client="a",interface="http://i",violation="retry_after_refusal"} 1"#,
            ]
        );
        assert_eq!(
            family("refusal_gate_discovery_reads_total"),
            [
                "# TYPE refusal_gate_discovery_reads_total counter",
                r#"refusal_gate_discovery_reads_total{client="a",interface="http://i"} 1"#,
            ]
        );
        assert_eq!(
            family("refusal_gate_refusals_honored_total"),
            [
                "# TYPE refusal_gate_refusals_honored_total counter",
                r#"refusal_gate_refusals_honored_total{client="b",interface="http://i"} 1"#,
            ]
        );
        assert!(text.contains(
            "# HELP refusal_gate_attempts_total Client attempts, by class and kind of the decision table.\n"
        ));
        let fleet = m.fleet();
        let of = |id| fleet.iter().find(|p| p.labels == id).expect("a live pair");
        assert_eq!(of(a).attempts[Kind::ProtocolNotSupported as usize], 2);
        assert_eq!(of(a).violations[Violation::RetryAfterRefusal as usize], 1);
        assert_eq!((of(a).reads, of(b).honored, of(b).reads), (1, 1, 0));
    }

    #[test]
    fn the_pair_families_hold_their_names_in_the_registry() {
        let r = Registry::new();
        r.register(Box::new(PairFamilies::new(Arc::default())))
            .expect("registered");
        for name in [
            "refusal_gate_attempts_total",
            "refusal_gate_violations_total",
            "refusal_gate_discovery_reads_total",
            "refusal_gate_refusals_honored_total",
        ] {
            let other = IntCounter::new(name, "another").expect("a valid name");
            assert!(r.register(Box::new(other)).is_err(), "{name} is taken");
        }
        assert!(r.gather().is_empty(), "no pair: no family");
    }

    #[test]
    fn pairs_past_max_series_share_the_overflow_pair_of_both_names() {
        let m = Metrics::new(&MetricsConfig {
            max_clients: 100,
            max_interfaces: 100,
            max_series: 50,
            series_ttl: std::time::Duration::ZERO,
            ..MetricsConfig::default()
        });
        let mut ids = std::collections::HashSet::new();
        for client in 1..=10u64 {
            for interface in 1..=10u64 {
                let id = m.labels(client, &format!("c{client}"), 100 + interface, "i");
                ids.insert(id);
                m.record(&[counted(id)]);
            }
        }
        assert_eq!(ids.len(), 51, "50 pairs, then the overflow one");
        let text = m.render();
        assert!(text.contains("client=\"__overflow__\",interface=\"__overflow__\""));
        assert!(text.contains("refusal_gate_label_overflow_total{label=\"series\"} 50"));
        // A pair already made keeps its own series.
        assert_eq!(m.labels(1, "c1", 101, "i"), m.labels(1, "c1", 101, "i"));
        assert!(!text.contains("refusal_gate_label_overflow_total{label=\"client\"}"));
    }

    #[test]
    fn a_flood_of_new_clients_shares_the_overflow_pair_and_costs_no_memory() {
        let m = metrics(0);
        let a = m.labels(1, "a", 9, "i");
        let b = m.labels(2, "b", 9, "i");
        let overflow = m.labels(3, "c", 9, "i");
        assert_ne!(a, b);
        for n in 4..10_000 {
            assert_eq!(m.labels(n, "hostile", 9, "i"), overflow);
        }
        let names = m.names.lock().expect("not poisoned");
        assert_eq!(
            names.pairs.len(),
            3,
            "a, b and the overflow pair; no name one by one"
        );
        assert_eq!(names.clients.len(), 2);
        drop(names);
        let (a, a2) = (
            m.pair(a).expect("live"),
            m.pair(m.labels(1, "a", 8, "j")).expect("live"),
        );
        assert!(
            Arc::ptr_eq(&a.client, &a2.client),
            "a client's pairs share one copy of its name"
        );
        m.record(&[counted(overflow)]);
        assert!(m.render().contains("client=\"__overflow__\""));
    }

    #[test]
    fn a_pair_made_before_the_first_sweep_is_not_taken_as_long_gone() {
        let m = metrics(3600);
        let a = m.labels(1, "a", 9, "i");
        m.record(&[counted(a)]);
        let now = crate::clock::now() / crate::clock::SECOND;
        assert_eq!(m.sweep(now + 1), 0);
        assert!(m.render().contains("client=\"a\""));
    }

    #[test]
    fn vanished_pairs_expire_free_their_place_and_their_stale_ids_find_nothing() {
        let m = metrics(60);
        m.sweep(1_000);
        let a = m.labels(1, "a", 9, "i");
        let b = m.labels(2, "b", 9, "i");
        m.record(&[counted(a), counted(b)]);
        assert!(m.render().contains("client=\"a\""));
        m.sweep(1_030);
        m.record(&[counted(b)]);
        assert_eq!(
            m.sweep(1_061),
            1,
            "a: no attempt for 61 s; b was seen at 1,030"
        );
        let text = m.render();
        assert!(!text.contains("client=\"a\""), "a's series left /metrics");
        assert!(text.contains("client=\"b\""));
        assert!(text.contains("refusal_gate_series_expired_total 1"));
        // a's place under the cap is free again: a new client gets a label of its own,
        // in a's slot, with an id a's stale one is not.
        let c = m.labels(3, "c", 9, "i");
        assert_ne!(c, a);
        assert_eq!(
            c & ((1 << SLOT_BITS) - 1),
            a & ((1 << SLOT_BITS) - 1),
            "the slot is reused"
        );
        m.record(&[counted(a)]);
        assert!(
            !m.render().contains("client=\"a\""),
            "a stale id counts nothing"
        );
        m.record(&[counted(c)]);
        assert!(m.render().contains("client=\"c\""));
    }
}
