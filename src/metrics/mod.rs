//! The Prometheus registry (DESIGN §6) and the cached label handles the hot path uses.
//!
//! Edge. Every (client, interface) pair gets a small integer id the first time it is seen;
//! its counters are atomics in the pair, only incremented, and its series are made from them
//! when `/metrics` is written (`pairs.rs`): no lock or hash per span, and no object per
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
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

mod families;
mod pairs;

use pairs::{Names, Pair, PairFamilies, Series, Slot};

/// The label value that stands for every value past a cap.
pub const OVERFLOW: &str = "__overflow__";

/// Why a span was forwarded without its call's verdict (DESIGN §11.5): the
/// `refusal_gate_exporter_untagged_spans_total` label values.
pub const UNTAGGED: [&str; 2] = ["held_full", "shutdown"];

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

/// A contradiction of an interface as the console lists it (DESIGN §13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenContradiction {
    /// The interface.
    pub interface: Arc<str>,
    /// How it contradicted itself or its document.
    pub kind: crate::tracker::honesty::Contradiction,
    /// The operation.
    pub operation: Arc<str>,
    /// When it was counted, Unix seconds (coarse).
    pub at: u64,
    /// The trace of the attempt that showed it.
    pub trace_id: [u8; 16],
    /// For a refusal contradicted, the trace of the other call of the pair.
    pub other_trace: Option<[u8; 16]>,
}

/// The contradictions the console lists: the latest this many.
const SEEN_CONTRADICTIONS: usize = 100;

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
    settled_early: IntCounter,
    cycles_cut: IntCounter,
    accepted_spans: [IntCounter; 2],
    /// Cached handles: `not_client`, `no_protocol`, `duplicate`, `same_call`.
    skipped_by: [IntCounter; 4],
    /// Cached handles, by transport.
    batch_duration_by: [prometheus::Histogram; 2],
    refused_spans: IntCounterVec,
    refused_requests: IntCounterVec,
    abandoned_requests: IntCounterVec,
    gate_refused: IntCounterVec,
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
    contradictions: IntCounterVec,
    /// The latest contradictions, newest last: what the console lists. A lock taken once a
    /// contradiction is counted (once a window per operation) and once a page load.
    seen_contradictions: Mutex<std::collections::VecDeque<SeenContradiction>>,
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
    exporter_untagged: IntCounterVec,
    exporter_withheld: IntGauge,
    exporter_withheld_bytes: IntGauge,
    exporter_withheld_seconds: prometheus::Histogram,
    /// `refusal_gate_witness_left_out_total`, by [`crate::tracker::honesty::LeftOut`].
    unwitnessed: [IntCounter; 3],
}

impl Metrics {
    /// Registers every metric (the families are declared in `families.rs`).
    pub fn new(config: &MetricsConfig) -> Metrics {
        use families as f;
        let r = Registry::new();
        let pairs = Arc::new(RwLock::new(Vec::new()));
        r.register(Box::new(PairFamilies::new(Arc::clone(&pairs))))
            .expect("each metric is registered once");
        let accepted = f::ACCEPTED_SPANS.counter_vec(&r);
        let refused_spans = f::REFUSED_SPANS.counter_vec(&r);
        let skipped = f::SKIPPED.counter_vec(&r);
        let evictions = f::EVICTIONS.counter_vec(&r);
        let batch_duration = f::BATCH_DURATION.histogram_vec(&r, &f::BATCH_BUCKETS);
        f::BUILD_INFO
            .gauge_vec(&r)
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Series a dashboard plots are created at zero, so they show 0 rather than no data.
        for reason in ["ttl", "capacity"] {
            evictions.with_label_values(&[reason]);
        }
        for transport in [Transport::Grpc, Transport::Http] {
            refused_spans.with_label_values(&[transport.as_str(), "malformed_span"]);
        }
        let exporter_untagged = f::EXPORTER_UNTAGGED.counter_vec(&r);
        for reason in UNTAGGED {
            exporter_untagged.with_label_values(&[reason]);
        }
        let unwitnessed = f::WITNESS_LEFT_OUT.counter_vec(&r);
        let transports = [Transport::Grpc, Transport::Http];
        Metrics {
            unwitnessed: crate::tracker::honesty::LeftOut::ALL
                .map(|reason| unwitnessed.with_label_values(&[reason.as_str()])),
            skipped_by: ["not_client", "no_protocol", "duplicate", "same_call"]
                .map(|r| skipped.with_label_values(&[r])),
            batch_duration_by: transports.map(|t| batch_duration.with_label_values(&[t.as_str()])),
            accepted_spans: transports.map(|t| accepted.with_label_values(&[t.as_str()])),
            config: config.clone(),
            names: Mutex::new(Names::default()),
            pairs,
            // Now, not 0: a pair made before the first sweep is stamped with the time it
            // was made, not with the epoch (which the first sweep would take as long gone).
            clock: AtomicU64::new(crate::clock::now() / crate::clock::SECOND),
            series_expired: f::SERIES_EXPIRED.counter(&r),
            settled_early: f::SETTLED_EARLY.counter(&r),
            cycles_cut: f::CYCLES_CUT.counter(&r),
            refused_spans,
            refused_requests: f::REFUSED_REQUESTS.counter_vec(&r),
            abandoned_requests: f::ABANDONED_REQUESTS.counter_vec(&r),
            gate_refused: f::GATE_REFUSED.counter_vec(&r),
            truncated_spans: f::TRUNCATED_SPANS.counter_vec(&r),
            tls_failures: f::TLS_FAILURES.counter_vec(&r),
            listener_limits: f::LISTENER_LIMITS.counter_vec(&r),
            listener_connections: f::LISTENER_CONNECTIONS.gauge_vec(&r),
            skipped,
            tracker_keys: f::TRACKER_KEYS.gauge(&r),
            held_spans: f::HELD_SPANS.gauge(&r),
            held_bytes: f::HELD_BYTES.gauge(&r),
            held_forced: f::HELD_FORCED.counter_vec(&r),
            evictions,
            contradictions: f::CONTRADICTIONS.counter_vec(&r),
            seen_contradictions: Mutex::default(),
            label_overflow: f::LABEL_OVERFLOW.counter_vec(&r),
            label_truncated: f::LABEL_TRUNCATED.counter_vec(&r),
            metric_pushes: f::METRIC_PUSHES.counter_vec(&r),
            document_loads: f::DOCUMENT_LOADS.counter_vec(&r),
            alerts: f::ALERTS.counter_vec(&r),
            alert_deliveries: f::ALERT_DELIVERIES.counter_vec(&r),
            alert_watchers_refused: f::ALERT_WATCHERS_REFUSED.counter_vec(&r),
            exporter_sent: f::EXPORTER_SENT.counter(&r),
            exporter_failed: f::EXPORTER_FAILED.counter_vec(&r),
            exporter_queue: f::EXPORTER_QUEUE.gauge(&r),
            exporter_queue_bytes: f::EXPORTER_QUEUE_BYTES.gauge(&r),
            exporter_untagged,
            exporter_withheld: f::EXPORTER_WITHHELD.gauge(&r),
            exporter_withheld_bytes: f::EXPORTER_WITHHELD_BYTES.gauge(&r),
            exporter_withheld_seconds: f::EXPORTER_WITHHELD_SECONDS
                .histogram_vec(&r, &f::WITHHELD_BUCKETS)
                .with_label_values(&[] as &[&str]),
            registry: r,
        }
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
                Event::Unwitnessed { reason } => self.unwitnessed[reason as usize].inc(),
                Event::SettledEarly { attempts } => self.settled_early.inc_by(u64::from(attempts)),
                Event::Contradicted {
                    labels,
                    kind,
                    ref operation,
                    trace_id,
                    other_trace,
                    ..
                } => {
                    // Rare: a contradiction is counted once a window per operation.
                    let Some((_, interface)) = self.label_names(labels) else {
                        continue;
                    };
                    self.contradictions
                        .with_label_values(&[&interface, kind.as_str()])
                        .inc();
                    let mut seen = self
                        .seen_contradictions
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if seen.len() == SEEN_CONTRADICTIONS {
                        seen.pop_front();
                    }
                    seen.push_back(SeenContradiction {
                        interface,
                        kind,
                        operation: operation.clone(),
                        at: self.clock.load(Ordering::Relaxed),
                        trace_id,
                        other_trace,
                    });
                }
            }
        }
    }

    /// The latest contradictions of interfaces, newest first (at most 100).
    pub fn contradictions(&self) -> Vec<SeenContradiction> {
        let seen = self
            .seen_contradictions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        seen.iter().rev().cloned().collect()
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

    /// Counts one request its client gave up on before its answer (a reset stream, a
    /// closed connection).
    pub fn abandoned_request(&self, transport: Transport) {
        self.abandoned_requests
            .with_label_values(&[transport.as_str()])
            .inc();
    }

    /// Counts one Gate API question refused before it was answered, by `api` (`grpc` or
    /// `http`) and `reason`.
    pub fn gate_refused(&self, api: &str, reason: &str) {
        self.gate_refused.with_label_values(&[api, reason]).inc();
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

    /// Counts `spans` forwarded untagged because they could not be withheld for their call's
    /// verdict, for `reason` (one of [`UNTAGGED`]).
    pub fn untagged(&self, reason: &str, spans: usize) {
        self.exporter_untagged
            .with_label_values(&[reason])
            .inc_by(spans as u64);
    }

    /// Sets the gauges of the spans withheld from forwarding.
    pub fn set_withheld(&self, spans: usize, bytes: usize) {
        self.exporter_withheld
            .set(i64::try_from(spans).unwrap_or(i64::MAX));
        self.exporter_withheld_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Records how long a withheld span waited before it was forwarded.
    pub fn withheld_for(&self, seconds: f64) {
        self.exporter_withheld_seconds.observe(seconds);
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
    /// exemplar on each series that has one (a pair keeps the latest of each, `pairs.rs`).
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
    use super::pairs::SLOT_BITS;
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
        // Each of its 17 lines counts to one digit here, not 20.
        assert_eq!(pair, Metrics::max_pair_bytes(128) - 17 * 19, "{text}");
        // The figure the documentation gives.
        assert_eq!(Metrics::max_pair_bytes(128), 10_522);
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
    fn a_clients_pairs_are_found_at_once_as_labels_answers_them_but_overflowed_ones() {
        let m = Metrics::new(&MetricsConfig {
            max_clients: 10,
            max_interfaces: 2,
            max_series: 4,
            series_ttl: std::time::Duration::from_secs(60),
            ..MetricsConfig::default()
        });
        m.sweep(1_000);
        let (i, j) = (m.labels(1, "a", 9, "i"), m.labels(1, "a", 8, "j"));
        // Past max_interfaces: the interface overflows, the client does not.
        let k = m.labels(1, "a", 7, "k");
        let mut into = [(0, 0); 16];
        assert_eq!(m.client_pairs(1, &mut into), 2);
        assert_eq!(
            into[..2],
            [(9, i), (8, j)],
            "not (7, {k}): asked for each time"
        );
        let mut one = [(0, 0); 1];
        assert_eq!(
            m.client_pairs(1, &mut one),
            1,
            "as many as there is room for"
        );
        assert_eq!(one, [(9, i)]);
        // The fourth pair is b's own; past max_series b's next shares the overflow pair.
        let b = m.labels(2, "b", 9, "i");
        let shared = m.labels(2, "b", 8, "j");
        assert_eq!(shared, m.labels(3, "c", 6, "l"));
        assert_eq!(m.client_pairs(2, &mut into), 1);
        assert_eq!(into[0], (9, b));
        assert_eq!(m.client_pairs(42, &mut into), 0, "a client never seen");
        // An expired pair is no longer found.
        m.sweep(1_030);
        m.record(&[counted(i)]);
        assert!(m.sweep(1_061) >= 1);
        assert_eq!(m.client_pairs(1, &mut into), 1);
        assert_eq!(into[0], (9, m.labels(1, "a", 9, "i")));
        assert_ne!(m.labels(1, "a", 8, "j"), j, "j expired: a new pair");
        assert_eq!(m.client_pairs(1, &mut into), 2, "and found again");
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
