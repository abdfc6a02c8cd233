//! The Prometheus registry (DESIGN §6) and the cached label handles the hot path uses.
//!
//! Edge. Every (client, interface) pair gets a small integer id the first time it is seen;
//! its counters are created lazily, once, and then only incremented — `with_label_values`
//! (a lock and a hash) runs once per series, never per span. Label values are capped:
//! past `max_clients` client names or `max_interfaces` interface names the value is
//! `__overflow__`, counted in `refusal_gate_label_overflow_total`.

use crate::classify::Kind;
use crate::config::MetricsConfig;
use crate::receiver::Transport;
use crate::tracker::{Event, Violation};
use foldhash::{HashMap, HashSet};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

/// The label value that stands for every value past a cap.
pub const OVERFLOW: &str = "__overflow__";

/// The counters of one (client, interface) pair, created on first use.
struct Pair {
    client: Arc<str>,
    interface: Arc<str>,
    attempts: [OnceLock<IntCounter>; Kind::ALL.len()],
    violations: [OnceLock<IntCounter>; Violation::ALL.len()],
    discovery_reads: OnceLock<IntCounter>,
    honored: OnceLock<IntCounter>,
}

/// Which pair each (client, interface) hash has, and which names were admitted under the caps.
#[derive(Default)]
struct Names {
    pairs: HashMap<(u64, u64), u32>,
    clients: HashSet<u64>,
    interfaces: HashSet<u64>,
}

/// All of refusal-gate's metrics.
pub struct Metrics {
    registry: Registry,
    config: MetricsConfig,
    names: Mutex<Names>,
    // Read on every recorded event, written once per new pair: a RwLock keeps readers apart.
    pairs: RwLock<Vec<Arc<Pair>>>,
    attempts: IntCounterVec,
    violations: IntCounterVec,
    discovery_reads: IntCounterVec,
    honored: IntCounterVec,
    accepted_spans: [IntCounter; 2],
    /// Cached handles: `not_client`, `no_protocol`, `duplicate`.
    skipped_by: [IntCounter; 3],
    /// Cached handles, by transport.
    batch_duration_by: [prometheus::Histogram; 2],
    refused_spans: IntCounterVec,
    refused_requests: IntCounterVec,
    skipped: IntCounterVec,
    tracker_keys: IntGauge,
    evictions: IntCounterVec,
    label_overflow: IntCounterVec,
    document_loads: IntCounterVec,
    alerts: IntCounterVec,
    alert_deliveries: IntCounterVec,
    exporter_sent: IntCounter,
    exporter_failed: IntCounterVec,
    exporter_queue: IntGauge,
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric names are valid");
    registry
        .register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

impl Metrics {
    /// Registers every metric.
    pub fn new(config: &MetricsConfig) -> Metrics {
        let r = Registry::new();
        let attempts = counter_vec(
            &r,
            "refusal_gate_attempts_total",
            "Client attempts, by class and kind of the decision table.",
            &["client", "interface", "class", "kind"],
        );
        let violations = counter_vec(
            &r,
            "refusal_gate_violations_total",
            "Attempts a client following the decision boundary would not have sent, and probes.",
            &["client", "interface", "violation"],
        );
        let discovery_reads = counter_vec(
            &r,
            "refusal_gate_discovery_reads_total",
            "Successful reads of an interface's discovery document.",
            &["client", "interface"],
        );
        let honored = counter_vec(
            &r,
            "refusal_gate_refusals_honored_total",
            "Refusals not retried within probe_window.",
            &["client", "interface"],
        );
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
        let skipped = counter_vec(
            &r,
            "refusal_gate_spans_skipped_total",
            "Spans that are not attempts (not CLIENT, no known protocol, duplicate, malformed).",
            &["reason"],
        );
        let tracker_keys = IntGauge::new("refusal_gate_tracker_keys", "Keys the tracker holds.")
            .expect("metric names are valid");
        r.register(Box::new(tracker_keys.clone()))
            .expect("each metric is registered once");
        let evictions = counter_vec(
            &r,
            "refusal_gate_tracker_evictions_total",
            "Keys the tracker forgot, by reason.",
            &["reason"],
        );
        let label_overflow = counter_vec(
            &r,
            "refusal_gate_label_overflow_total",
            "Attempts whose client or interface label was replaced by __overflow__.",
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
            "Spans not forwarded (queue_full, refused, partial_success, shutdown), and spans of each failed try that is retried (retried).",
            &["reason"],
        );
        let exporter_queue = IntGauge::new(
            "refusal_gate_exporter_queue_spans",
            "Spans waiting to be forwarded.",
        )
        .expect("metric names are valid");
        r.register(Box::new(exporter_queue.clone()))
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
        let skipped_by =
            ["not_client", "no_protocol", "duplicate"].map(|r| skipped.with_label_values(&[r]));
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
            pairs: RwLock::new(Vec::new()),
            attempts,
            violations,
            discovery_reads,
            honored,
            accepted_spans,
            refused_spans,
            refused_requests,
            skipped,
            tracker_keys,
            evictions,
            label_overflow,
            document_loads,
            alerts,
            alert_deliveries,
            exporter_sent,
            exporter_failed,
            exporter_queue,
        }
    }

    /// The id of the (client, interface) pair, by the hashes of their names; the names are
    /// copied only the first time. Applies the label caps.
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
        let admit = |set: &mut HashSet<u64>, hash: u64, cap: usize, label: &str| {
            if set.contains(&hash) || set.len() < cap {
                set.insert(hash);
                true
            } else {
                self.label_overflow.with_label_values(&[label]).inc();
                false
            }
        };
        let client_ok = admit(
            &mut names.clients,
            client_hash,
            self.config.max_clients,
            "client",
        );
        let interface_ok = admit(
            &mut names.interfaces,
            interface_hash,
            self.config.max_interfaces,
            "interface",
        );
        let client = if client_ok { client } else { OVERFLOW };
        let interface = if interface_ok { interface } else { OVERFLOW };
        // Overflowed names share the pair of their overflow value, so the table stays bounded.
        let key = (
            if client_ok { client_hash } else { 0 },
            if interface_ok { interface_hash } else { 0 },
        );
        if let Some(id) = names.pairs.get(&key) {
            return *id;
        }
        let mut pairs = self.pairs.write().unwrap_or_else(PoisonError::into_inner);
        let id = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        pairs.push(Arc::new(Pair {
            client: Arc::from(client),
            interface: Arc::from(interface),
            attempts: Default::default(),
            violations: Default::default(),
            discovery_reads: OnceLock::new(),
            honored: OnceLock::new(),
        }));
        names.pairs.insert(key, id);
        if key != (client_hash, interface_hash) {
            // Count every later attempt of this overflowed name as overflow too.
            names.pairs.insert((client_hash, interface_hash), id);
        }
        id
    }

    fn pair(&self, id: u32) -> Option<Arc<Pair>> {
        self.pairs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id as usize)
            .cloned()
    }

    /// Records what the tracker reported.
    pub fn record(&self, events: &[Event]) {
        for event in events {
            match *event {
                Event::Counted {
                    labels,
                    kind,
                    violation,
                    discovery_read,
                    ..
                } => {
                    let Some(p) = self.pair(labels) else { continue };
                    let (c, i) = (&p.client, &p.interface);
                    p.attempts[kind as usize]
                        .get_or_init(|| {
                            self.attempts.with_label_values(&[
                                c,
                                i,
                                kind.class().as_str(),
                                kind.as_str(),
                            ])
                        })
                        .inc();
                    if let Some(v) = violation {
                        p.violations[v as usize]
                            .get_or_init(|| self.violations.with_label_values(&[c, i, v.as_str()]))
                            .inc();
                    }
                    if discovery_read {
                        p.discovery_reads
                            .get_or_init(|| self.discovery_reads.with_label_values(&[c, i]))
                            .inc();
                    }
                }
                Event::Honored { labels } => {
                    let Some(p) = self.pair(labels) else { continue };
                    p.honored
                        .get_or_init(|| self.honored.with_label_values(&[&p.client, &p.interface]))
                        .inc();
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
            other => self.skipped.with_label_values(&[other]).inc_by(n),
        }
    }

    /// Sets the tracker's key gauge.
    pub fn set_tracker_keys(&self, keys: usize) {
        self.tracker_keys
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// The alert counters, for the alerter: (`refusal_gate_alerts_total`,
    /// `refusal_gate_alert_deliveries_total`).
    pub fn alert_counters(&self) -> (IntCounterVec, IntCounterVec) {
        (self.alerts.clone(), self.alert_deliveries.clone())
    }

    /// The exporter's counters.
    pub fn export_metrics(&self) -> crate::export::ExportMetrics {
        crate::export::ExportMetrics {
            sent: self.exporter_sent.clone(),
            failed: self.exporter_failed.clone(),
            queued: self.exporter_queue.clone(),
        }
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
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for the text format.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
