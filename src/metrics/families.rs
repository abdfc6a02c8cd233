//! Every family of the registry but the pairs' ([`super::pairs`]), declared as data: its
//! name, help and labels (DESIGN §6), and how a family of each type is registered.
//!
//! Core: data, and the registration calls of the `prometheus` crate.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};
use prometheus::{Opts, Registry};

/// One family: its name, help and label names.
pub(super) struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
}

impl Family {
    fn opts(&self) -> Opts {
        Opts::new(self.name, self.help)
    }

    /// Registers it as a counter with labels.
    pub(super) fn counter_vec(&self, r: &Registry) -> IntCounterVec {
        register(r, IntCounterVec::new(self.opts(), self.labels))
    }

    /// Registers it as a counter without labels.
    pub(super) fn counter(&self, r: &Registry) -> IntCounter {
        register(r, IntCounter::with_opts(self.opts()))
    }

    /// Registers it as a gauge with labels.
    pub(super) fn gauge_vec(&self, r: &Registry) -> IntGaugeVec {
        register(r, IntGaugeVec::new(self.opts(), self.labels))
    }

    /// Registers it as a gauge without labels.
    pub(super) fn gauge(&self, r: &Registry) -> IntGauge {
        register(r, IntGauge::with_opts(self.opts()))
    }

    /// Registers it as a histogram with labels, of these buckets.
    pub(super) fn histogram_vec(&self, r: &Registry, buckets: &[f64]) -> HistogramVec {
        let opts = HistogramOpts::new(self.name, self.help).buckets(buckets.to_vec());
        register(r, HistogramVec::new(opts, self.labels))
    }
}

/// Registers a collector made from a family (its name and labels valid, each once).
fn register<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    made: prometheus::Result<C>,
) -> C {
    let c = made.expect("metric names are valid");
    r.register(Box::new(c.clone()))
        .expect("each metric is registered once");
    c
}

/// `refusal_gate_receiver_accepted_spans_total`.
pub(super) const ACCEPTED_SPANS: Family = Family {
    name: "refusal_gate_receiver_accepted_spans_total",
    help: "Spans accepted by the receivers.",
    labels: &["transport"],
};

/// `refusal_gate_receiver_refused_spans_total`.
pub(super) const REFUSED_SPANS: Family = Family {
    name: "refusal_gate_receiver_refused_spans_total",
    help: "Spans the receivers could not decode and rejected.",
    labels: &["transport", "reason"],
};

/// `refusal_gate_receiver_refused_requests_total`.
pub(super) const REFUSED_REQUESTS: Family = Family {
    name: "refusal_gate_receiver_refused_requests_total",
    help: "Whole requests refused (malformed, too large, wrong type or encoding), whose spans cannot be counted.",
    labels: &["transport", "reason"],
};

/// `refusal_gate_receiver_abandoned_requests_total`.
pub(super) const ABANDONED_REQUESTS: Family = Family {
    name: "refusal_gate_receiver_abandoned_requests_total",
    help: "Requests whose client reset the stream or closed the connection before their answer.",
    labels: &["transport"],
};

/// `refusal_gate_gate_refused_total`.
pub(super) const GATE_REFUSED: Family = Family {
    name: "refusal_gate_gate_refused_total",
    help: "Gate API questions refused before they were answered: not_permitted, a question observing a call as a client its token may not speak for, or with a read-only token.",
    labels: &["api", "reason"],
};

/// `refusal_gate_receiver_truncated_spans_total`.
pub(super) const TRUNCATED_SPANS: Family = Family {
    name: "refusal_gate_receiver_truncated_spans_total",
    help: "Spans with more attributes than max_attributes_per_span; the rest were not read.",
    labels: &["transport"],
};

/// `refusal_gate_tls_handshake_failures_total`.
pub(super) const TLS_FAILURES: Family = Family {
    name: "refusal_gate_tls_handshake_failures_total",
    help: "TLS handshakes that failed or timed out (no or a wrong client certificate, plain text on a TLS port), by listener.",
    labels: &["listener"],
};

/// `refusal_gate_listener_limits_total`.
pub(super) const LISTENER_LIMITS: Family = Family {
    name: "refusal_gate_listener_limits_total",
    help: "Times a listener's connection limit fired: max_connections (a connection accepted and closed), read_header_timeout and idle_timeout (a connection closed), read_timeout (a request's body not received in time).",
    labels: &["listener", "limit"],
};

/// `refusal_gate_listener_connections`.
pub(super) const LISTENER_CONNECTIONS: Family = Family {
    name: "refusal_gate_listener_connections",
    help: "Connections open now, by listener.",
    labels: &["listener"],
};

/// `refusal_gate_spans_skipped_total`.
pub(super) const SKIPPED: Family = Family {
    name: "refusal_gate_spans_skipped_total",
    help: "Spans that are not attempts (not CLIENT, no known protocol, duplicate, the same call as another span).",
    labels: &["reason"],
};

/// `refusal_gate_tracker_keys`.
pub(super) const TRACKER_KEYS: Family = Family {
    name: "refusal_gate_tracker_keys",
    help: "Keys the tracker holds.",
    labels: &[],
};

/// `refusal_gate_held_spans`.
pub(super) const HELD_SPANS: Family = Family {
    name: "refusal_gate_held_spans",
    help: "Spans of calls kept for the rest of their call (tracker.max_held_spans).",
    labels: &[],
};

/// `refusal_gate_held_bytes`.
pub(super) const HELD_BYTES: Family = Family {
    name: "refusal_gate_held_bytes",
    help: "Bytes those spans' facts take (tracker.max_held_mib).",
    labels: &[],
};

/// `refusal_gate_held_calls_forced_total`.
pub(super) const HELD_FORCED: Family = Family {
    name: "refusal_gate_held_calls_forced_total",
    help: "Held calls counted before the rest of their call arrived, because a bound was reached.",
    labels: &["bound"],
};

/// `refusal_gate_tracker_evictions_total`.
pub(super) const EVICTIONS: Family = Family {
    name: "refusal_gate_tracker_evictions_total",
    help: "Keys the tracker forgot, by reason.",
    labels: &["reason"],
};

/// `refusal_gate_tracker_settled_early_total`.
pub(super) const SETTLED_EARLY: Family = Family {
    name: "refusal_gate_tracker_settled_early_total",
    help: "Attempts counted before they had waited reorder_window, because the tracker's windows held more than tracker.max_pending.",
    labels: &[],
};

/// `refusal_gate_interface_contradictions_total` (DESIGN §13).
pub(super) const CONTRADICTIONS: Family = Family {
    name: "refusal_gate_interface_contradictions_total",
    help: "Times an interface contradicted itself or its discovery document, by kind: each operation counted once, and again only after a whole honesty_window without it.",
    labels: &["interface", "kind"],
};

/// `refusal_gate_series_expired_total`.
pub(super) const SERIES_EXPIRED: Family = Family {
    name: "refusal_gate_series_expired_total",
    help:
        "(client, interface) pairs whose series were removed after series_ttl without an attempt.",
    labels: &[],
};

/// `refusal_gate_call_cycles_cut_total`.
pub(super) const CYCLES_CUT: Family = Family {
    name: "refusal_gate_call_cycles_cut_total",
    help: "Cycles of parent span ids cut to join a call (a span naming its own descendant as its parent).",
    labels: &[],
};

/// `refusal_gate_label_overflow_total`.
pub(super) const LABEL_OVERFLOW: Family = Family {
    name: "refusal_gate_label_overflow_total",
    help: "Attempts whose client or interface label was replaced by __overflow__.",
    labels: &["label"],
};

/// `refusal_gate_exporter_metric_pushes_total`.
pub(super) const METRIC_PUSHES: Family = Family {
    name: "refusal_gate_exporter_metric_pushes_total",
    help: "Pushes of the OTLP metrics exporter: sent, retried (a try that failed and is tried again) or failed (given up).",
    labels: &["outcome"],
};

/// `refusal_gate_label_truncated_total`.
pub(super) const LABEL_TRUNCATED: Family = Family {
    name: "refusal_gate_label_truncated_total",
    help: "Label values cut to metrics.max_label_bytes and given a hash suffix, counted once per request and series that used one.",
    labels: &["label"],
};

/// `refusal_gate_discovery_document_loads_total`.
pub(super) const DOCUMENT_LOADS: Family = Family {
    name: "refusal_gate_discovery_document_loads_total",
    help: "Loads of interfaces' discovery documents, by outcome (loaded, not_modified, invalid, refused, failed).",
    labels: &["interface", "outcome"],
};

/// `refusal_gate_alerts_total`.
pub(super) const ALERTS: Family = Family {
    name: "refusal_gate_alerts_total",
    help: "Alerts raised, one per violation at or above the minimum severity.",
    labels: &["alertname", "severity"],
};

/// `refusal_gate_alert_deliveries_total`.
pub(super) const ALERT_DELIVERIES: Family = Family {
    name: "refusal_gate_alert_deliveries_total",
    help: "Alert deliveries by receiver and outcome (sent, failed and retried, rejected, dropped).",
    labels: &["receiver", "outcome"],
};

/// `refusal_gate_alert_watchers_refused_total`.
pub(super) const ALERT_WATCHERS_REFUSED: Family = Family {
    name: "refusal_gate_alert_watchers_refused_total",
    help: "Alert watchers (WatchAlerts streams, /v1/alerts/stream subscribers) refused at alerting.max_watchers.",
    labels: &["endpoint"],
};

/// `refusal_gate_exporter_sent_spans_total`.
pub(super) const EXPORTER_SENT: Family = Family {
    name: "refusal_gate_exporter_sent_spans_total",
    help: "Spans forwarded and accepted downstream.",
    labels: &[],
};

/// `refusal_gate_exporter_failed_spans_total`.
pub(super) const EXPORTER_FAILED: Family = Family {
    name: "refusal_gate_exporter_failed_spans_total",
    help: "Spans not forwarded (queue_full, refused, partial_success, shutdown, too_large), and spans of each failed try that is retried (retried).",
    labels: &["reason"],
};

/// `refusal_gate_witness_left_out_total`.
pub(super) const WITNESS_LEFT_OUT: Family = Family {
    name: "refusal_gate_witness_left_out_total",
    help: "What an attempt said of its interface that could not be remembered (DESIGN §13): a new operation past its interface's share (interface), the unconfigured origins' together (origins), or the whole (total).",
    labels: &["reason"],
};

/// `refusal_gate_exporter_untagged_spans_total`.
pub(super) const EXPORTER_UNTAGGED: Family = Family {
    name: "refusal_gate_exporter_untagged_spans_total",
    help: "Spans forwarded without their call's verdict because they could not be withheld until it was final (held_full: tracker.max_held_spans or max_held_mib reached; shutdown).",
    labels: &["reason"],
};

/// `refusal_gate_exporter_withheld_spans`.
pub(super) const EXPORTER_WITHHELD: Family = Family {
    name: "refusal_gate_exporter_withheld_spans",
    help: "Spans withheld from forwarding until their call's verdict is final (at most tracker.reorder_window).",
    labels: &[],
};

/// `refusal_gate_exporter_withheld_bytes`.
pub(super) const EXPORTER_WITHHELD_BYTES: Family = Family {
    name: "refusal_gate_exporter_withheld_bytes",
    help: "Bytes those withheld spans take (tracker.max_held_mib).",
    labels: &[],
};

/// `refusal_gate_exporter_withheld_seconds`.
pub(super) const EXPORTER_WITHHELD_SECONDS: Family = Family {
    name: "refusal_gate_exporter_withheld_seconds",
    help: "How long each span withheld for its call's verdict waited before it was forwarded (at most tracker.reorder_window and a sweep).",
    labels: &[],
};

/// The buckets of [`EXPORTER_WITHHELD_SECONDS`], in seconds: the server's side of a call comes
/// within one of its exports (a second or so), or the span waits out `reorder_window`.
pub(super) const WITHHELD_BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0,
];

/// `refusal_gate_exporter_queue_spans`.
pub(super) const EXPORTER_QUEUE: Family = Family {
    name: "refusal_gate_exporter_queue_spans",
    help: "Spans waiting to be forwarded.",
    labels: &[],
};

/// `refusal_gate_exporter_queue_bytes`.
pub(super) const EXPORTER_QUEUE_BYTES: Family = Family {
    name: "refusal_gate_exporter_queue_bytes",
    help: "Bytes of tagged requests waiting to be forwarded (or reserved for them).",
    labels: &[],
};

/// `refusal_gate_build_info`.
pub(super) const BUILD_INFO: Family = Family {
    name: "refusal_gate_build_info",
    help: "Always 1; the version is a label.",
    labels: &["version"],
};

/// `refusal_gate_batch_duration_seconds`.
pub(super) const BATCH_DURATION: Family = Family {
    name: "refusal_gate_batch_duration_seconds",
    help: "Time to decode and process one export request.",
    labels: &["transport"],
};

/// The buckets of [`BATCH_DURATION`], in seconds.
pub(super) const BATCH_BUCKETS: [f64; 11] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];
