//! Alert rules: which alert each violation raises, and the set of active alerts,
//! deduplicated by (alertname, client, interface), each resolving by itself
//! `resolve_after` after its last violation (DESIGN §6).
//!
//! Core: pure. Time is passed in; nothing here logs, locks or sends. [`delivery`] is the
//! edge that wraps [`ActiveAlerts`] in a lock and pushes what changed to Alertmanager.

pub mod delivery;

use crate::tracker::{Event, Nanos, Violation};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::collections::hash_map::Entry;
use std::sync::Arc;

pub use crate::config::Severity;

impl Severity {
    /// The severity of the alert a violation raises.
    pub fn of(violation: Violation) -> Severity {
        match violation {
            Violation::RetryAfterRefusal => Severity::Critical,
            _ => Severity::Warning,
        }
    }
}

/// The identity of an alert: Alertmanager's deduplication key. The names are shared with
/// the metric labels, so raising an alert that is already firing copies no string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AlertKey {
    /// One of the six alert names.
    pub alertname: &'static str,
    /// The `client` label.
    pub client: Arc<str>,
    /// The `interface` label.
    pub interface: Arc<str>,
}

/// One alert as Alertmanager's v2 API takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// Its identity.
    pub key: AlertKey,
    /// `critical` or `warning`.
    pub severity: Severity,
    /// The violation that raised it.
    pub violation: Violation,
    /// The latest violating operation.
    pub operation: Arc<str>,
    /// The latest violating span's trace id.
    pub trace_id: [u8; 16],
    /// The latest violating span's id.
    pub span_id: [u8; 8],
    /// When it started firing (the first violation).
    pub starts_at: Nanos,
    /// When it resolves unless another violation comes: last violation + `resolve_after`.
    pub ends_at: Nanos,
}

impl Alert {
    /// The one-line summary annotation.
    pub fn summary(&self) -> String {
        let what = match self.violation {
            Violation::RetryAfterRefusal => "retried after an authoritative refusal",
            Violation::RetryWithoutDiscovery => {
                "retried a refusal without reading the discovery document"
            }
            Violation::RetryAfterAmbiguous => "retried after an ambiguous response",
            Violation::RetryBudgetExhausted => "retried past its retry budget",
            Violation::RetryBeforeRetryAfter => "came back before the server's Retry-After",
            Violation::ProbeAfterRefusal => "probed undeclared paths after a refusal",
        };
        format!(
            "{} {what} from {} ({})",
            self.key.client, self.key.interface, self.operation
        )
    }

    /// The trace id, as OTLP/JSON and trace UIs write it: lower-case hex.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id, lower-case hex.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// Its labels, as DESIGN §6 names them.
    pub fn labels(&self) -> [(&'static str, &str); 5] {
        [
            ("alertname", self.key.alertname),
            ("severity", self.severity.as_str()),
            ("client", &self.key.client),
            ("interface", &self.key.interface),
            ("violation", self.violation.as_str()),
        ]
    }
}

/// The alert a tracker event raises at `now`: one for every counted violation whose
/// (client, interface) labels `names` knows (by the event's labels handle).
pub fn of_event(
    event: &Event,
    now: Nanos,
    names: impl FnOnce(u32) -> Option<(Arc<str>, Arc<str>)>,
) -> Option<Alert> {
    let Event::Counted {
        labels,
        violation: Some(violation),
        operation,
        trace_id,
        span_id,
        ..
    } = event
    else {
        return None;
    };
    let (client, interface) = names(*labels)?;
    Some(Alert {
        key: AlertKey {
            alertname: violation.alert_name(),
            client,
            interface,
        },
        severity: Severity::of(*violation),
        violation: *violation,
        operation: operation.clone().unwrap_or_else(|| Arc::from("")),
        trace_id: *trace_id,
        span_id: *span_id,
        starts_at: now,
        ends_at: now,
    })
}

/// What raising an alert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Raised<'a> {
    /// It was not firing: it starts now (here it is, as stored).
    New(&'a Alert),
    /// It was firing: its end moves on.
    Extended,
    /// Below the minimum severity: ignored.
    Ignored,
    /// The set is full of firing alerts: dropped.
    Dropped,
}

/// The active alerts and which of them changed since the last delivery.
#[derive(Debug)]
pub struct ActiveAlerts {
    alerts: HashMap<AlertKey, Alert>,
    changed: HashSet<AlertKey>,
    capacity: usize,
    resolve_after: Nanos,
    min_severity: Severity,
}

impl ActiveAlerts {
    /// An empty set holding at most `capacity` alerts.
    pub fn new(capacity: usize, resolve_after: Nanos, min_severity: Severity) -> ActiveAlerts {
        ActiveAlerts {
            alerts: HashMap::new(),
            changed: HashSet::new(),
            capacity: capacity.max(1),
            resolve_after,
            min_severity,
        }
    }

    /// Raises the alert of a violation at `now`. The alert carries the latest violation's
    /// operation and span; it ends `resolve_after` after it.
    pub fn raise(&mut self, now: Nanos, mut alert: Alert) -> Raised<'_> {
        if alert.severity < self.min_severity {
            return Raised::Ignored;
        }
        alert.ends_at = now.saturating_add(self.resolve_after);
        if let Some(firing) = self.alerts.get_mut(&alert.key) {
            if firing.ends_at > now {
                // The hot case under a retry storm: no allocation, the names stay shared.
                firing.operation = alert.operation;
                firing.trace_id = alert.trace_id;
                firing.span_id = alert.span_id;
                firing.ends_at = alert.ends_at;
                self.changed.insert(alert.key);
                return Raised::Extended;
            }
        }
        if self.alerts.len() >= self.capacity && !self.alerts.contains_key(&alert.key) {
            self.expire(now);
            if self.alerts.len() >= self.capacity {
                return Raised::Dropped;
            }
        }
        alert.starts_at = now;
        self.changed.insert(alert.key.clone());
        let stored = match self.alerts.entry(alert.key.clone()) {
            Entry::Occupied(mut resolved) => {
                resolved.insert(alert);
                resolved.into_mut()
            }
            Entry::Vacant(slot) => slot.insert(alert),
        };
        Raised::New(stored)
    }

    /// Forgets the alerts that have resolved by `now`.
    pub fn expire(&mut self, now: Nanos) {
        self.alerts.retain(|_, a| a.ends_at > now);
        let alerts = &self.alerts;
        self.changed.retain(|k| alerts.contains_key(k));
    }

    /// The alerts that changed since the last call, for delivery.
    pub fn take_changed(&mut self) -> Vec<Alert> {
        let keys: Vec<AlertKey> = self.changed.drain().collect();
        keys.into_iter()
            .filter_map(|k| self.alerts.get(&k).cloned())
            .collect()
    }

    /// Marks alerts as changed again, after a delivery that should be retried.
    pub fn mark_changed(&mut self, alerts: &[Alert]) {
        for a in alerts {
            if self.alerts.contains_key(&a.key) {
                self.changed.insert(a.key.clone());
            }
        }
    }

    /// The alerts firing at `now`.
    pub fn firing(&self, now: Nanos) -> Vec<Alert> {
        let mut out: Vec<Alert> = self
            .alerts
            .values()
            .filter(|a| a.ends_at > now)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.starts_at, &a.key.client).cmp(&(b.starts_at, &b.key.client)));
        out
    }
}

/// Lower-case hex of some bytes.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn alert(violation: Violation, client: &str) -> Alert {
        Alert {
            key: AlertKey {
                alertname: violation.alert_name(),
                client: client.into(),
                interface: "i".into(),
            },
            severity: Severity::of(violation),
            violation,
            operation: "POST /x".into(),
            trace_id: [0; 16],
            span_id: [0; 8],
            starts_at: 0,
            ends_at: 0,
        }
    }

    #[test]
    fn severities_follow_the_contract() {
        assert_eq!(
            Severity::of(Violation::RetryAfterRefusal),
            Severity::Critical
        );
        for v in &Violation::ALL[1..] {
            assert_eq!(Severity::of(*v), Severity::Warning, "{v:?}");
        }
    }

    #[test]
    fn alerts_are_deduplicated_and_resolve_by_themselves() {
        let mut set = ActiveAlerts::new(10, 300 * S, Severity::Warning);
        assert!(matches!(
            set.raise(10 * S, alert(Violation::RetryAfterRefusal, "a")),
            Raised::New(_)
        ));
        assert_eq!(
            set.raise(20 * S, alert(Violation::RetryAfterRefusal, "a")),
            Raised::Extended
        );
        let changed = set.take_changed();
        assert_eq!(
            changed.len(),
            1,
            "one alert per (alertname, client, interface)"
        );
        assert_eq!(changed[0].starts_at, 10 * S);
        assert_eq!(
            changed[0].ends_at,
            320 * S,
            "last violation + resolve_after"
        );
        assert!(set.take_changed().is_empty(), "nothing changed since");
        assert_eq!(set.firing(319 * S).len(), 1);
        assert!(set.firing(320 * S).is_empty(), "resolved by itself");
        // After it resolved, the next violation starts a new alert.
        assert!(matches!(
            set.raise(400 * S, alert(Violation::RetryAfterRefusal, "a")),
            Raised::New(_)
        ));
        assert_eq!(set.take_changed()[0].starts_at, 400 * S);
    }

    #[test]
    fn minimum_severity_and_capacity() {
        let mut set = ActiveAlerts::new(2, 300 * S, Severity::Critical);
        assert_eq!(
            set.raise(S, alert(Violation::ProbeAfterRefusal, "a")),
            Raised::Ignored
        );
        assert!(matches!(
            set.raise(S, alert(Violation::RetryAfterRefusal, "a")),
            Raised::New(_)
        ));
        assert!(matches!(
            set.raise(S, alert(Violation::RetryAfterRefusal, "b")),
            Raised::New(_)
        ));
        assert_eq!(
            set.raise(S, alert(Violation::RetryAfterRefusal, "c")),
            Raised::Dropped
        );
        // Once the others resolve there is room again.
        assert!(matches!(
            set.raise(302 * S, alert(Violation::RetryAfterRefusal, "c")),
            Raised::New(_)
        ));
    }

    #[test]
    fn a_failed_delivery_is_marked_for_the_next_one() {
        let mut set = ActiveAlerts::new(10, 300 * S, Severity::Warning);
        set.raise(S, alert(Violation::RetryAfterAmbiguous, "a"));
        let sent = set.take_changed();
        set.mark_changed(&sent);
        assert_eq!(set.take_changed(), sent);
        let a = &sent[0];
        assert!(a.summary().contains("retried after an ambiguous response"));
        assert_eq!(a.labels()[0], ("alertname", "RetryAfterAmbiguousResponse"));
        assert_eq!(a.span_id_hex(), "0000000000000000");
    }
}
