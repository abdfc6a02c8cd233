//! Alert rules: which alert each violation raises — and each contradiction of an interface
//! (DESIGN §13) — and the set of active alerts, deduplicated by (alertname, client,
//! interface), each resolving by itself `resolve_after` after its last violation (DESIGN §6).
//!
//! Core: pure. Time is passed in; nothing here logs, locks or sends. [`delivery`] is the
//! edge that wraps [`ActiveAlerts`] in a lock and pushes what changed to Alertmanager.

pub mod delivery;

use crate::tracker::honesty::Contradiction;
use crate::tracker::{Event, Nanos, Violation};
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::BinaryHeap;
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

/// What raised an alert: a client's violation, or an interface's contradiction (DESIGN §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A client's avoidable request.
    Violation(Violation),
    /// An interface that contradicted itself or its document.
    Contradiction(Contradiction),
}

impl Cause {
    /// Every cause, in the order of their alert counters.
    pub const ALL: [Cause; 9] = [
        Cause::Violation(Violation::ALL[0]),
        Cause::Violation(Violation::ALL[1]),
        Cause::Violation(Violation::ALL[2]),
        Cause::Violation(Violation::ALL[3]),
        Cause::Violation(Violation::ALL[4]),
        Cause::Violation(Violation::ALL[5]),
        Cause::Contradiction(Contradiction::ALL[0]),
        Cause::Contradiction(Contradiction::ALL[1]),
        Cause::Contradiction(Contradiction::ALL[2]),
    ];

    /// Its place in [`Cause::ALL`].
    pub fn index(self) -> usize {
        match self {
            Cause::Violation(v) => v as usize,
            Cause::Contradiction(c) => Violation::ALL.len() + c as usize,
        }
    }

    /// The alert it raises: a violation's, `InterfaceContradictsItself` for a refusal
    /// contradicted, `DiscoveryDocumentDrift` for an interface at odds with its document.
    pub fn alert_name(self) -> &'static str {
        match self {
            Cause::Violation(v) => v.alert_name(),
            Cause::Contradiction(Contradiction::RefusalContradicted) => {
                "InterfaceContradictsItself"
            }
            Cause::Contradiction(_) => "DiscoveryDocumentDrift",
        }
    }

    /// The alert's severity: `InterfaceContradictsItself` warns, `DiscoveryDocumentDrift`
    /// informs.
    pub fn severity(self) -> Severity {
        match self {
            Cause::Violation(v) => Severity::of(v),
            Cause::Contradiction(Contradiction::RefusalContradicted) => Severity::Warning,
            Cause::Contradiction(_) => Severity::Info,
        }
    }

    /// The label that names it (`violation` or `kind`) and its value.
    pub fn label(self) -> (&'static str, &'static str) {
        match self {
            Cause::Violation(v) => ("violation", v.as_str()),
            Cause::Contradiction(c) => ("kind", c.as_str()),
        }
    }

    /// The violation, when it is one.
    pub fn violation(self) -> Option<Violation> {
        match self {
            Cause::Violation(v) => Some(v),
            Cause::Contradiction(_) => None,
        }
    }
}

/// The identity of an alert: Alertmanager's deduplication key. The names are shared with
/// the metric labels, so raising an alert that is already firing copies no string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AlertKey {
    /// One of the eight alert names.
    pub alertname: &'static str,
    /// The `client` label; empty for an interface's alert.
    pub client: Arc<str>,
    /// The `interface` label.
    pub interface: Arc<str>,
}

/// One alert as Alertmanager's v2 API takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// Its identity.
    pub key: AlertKey,
    /// `critical`, `warning` or `info`.
    pub severity: Severity,
    /// The violation or contradiction that raised it.
    pub cause: Cause,
    /// The latest violating (or contradicting) operation.
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
        let violation = match self.cause {
            Cause::Violation(v) => v,
            Cause::Contradiction(c) => {
                let what = match c {
                    Contradiction::RefusalContradicted => "refused and served",
                    Contradiction::UndeclaredServed => {
                        "served, though its document does not declare"
                    }
                    Contradiction::DeclaredRefused => "refused, though its document declares",
                };
                return format!("{} {what} {}", self.key.interface, self.operation);
            }
        };
        let what = match violation {
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

    /// Its labels, as DESIGN §6 names them (§13: an interface's alert names no client, and
    /// its `kind` where a client's names its `violation`).
    pub fn labels(&self) -> Vec<(&'static str, &str)> {
        let mut labels = vec![
            ("alertname", self.key.alertname),
            ("severity", self.severity.as_str()),
        ];
        if self.cause.violation().is_some() {
            labels.push(("client", &self.key.client));
        }
        labels.push(("interface", &self.key.interface));
        labels.push(self.cause.label());
        labels
    }
}

/// The alert a tracker event raises at `now`: one for every counted violation, and every
/// contradiction of an interface, whose (client, interface) labels `names` knows (by the
/// event's labels handle).
pub fn of_event(
    event: &Event,
    now: Nanos,
    names: impl FnOnce(u32) -> Option<(Arc<str>, Arc<str>)>,
) -> Option<Alert> {
    let (labels, cause, operation, trace_id, span_id) = match event {
        Event::Counted {
            labels,
            violation: Some(violation),
            operation,
            trace_id,
            span_id,
            ..
        } => (
            labels,
            Cause::Violation(*violation),
            operation.clone().unwrap_or_else(|| Arc::from("")),
            trace_id,
            span_id,
        ),
        Event::Contradicted {
            labels,
            kind,
            operation,
            trace_id,
            span_id,
            ..
        } => (
            labels,
            Cause::Contradiction(*kind),
            operation.clone(),
            trace_id,
            span_id,
        ),
        _ => return None,
    };
    let (client, interface) = names(*labels)?;
    Some(Alert {
        key: AlertKey {
            alertname: cause.alert_name(),
            // An interface's alert is the interface's, whoever's attempt showed it.
            client: if cause.violation().is_some() {
                client
            } else {
                Arc::from("")
            },
            interface,
        },
        severity: cause.severity(),
        cause,
        operation,
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
///
/// Every operation is O(1) or O(log n) in the number of alerts, never a pass over them: an
/// alert is forgotten through `expiry`, the times they may have resolved, earliest first —
/// one entry an alert, written when it is stored and again when the entry comes due while
/// the alert was extended past it (an extension itself writes nothing). Past `capacity`, a
/// new alert forgets the ones due and is dropped when none was.
#[derive(Debug)]
pub struct ActiveAlerts {
    alerts: HashMap<AlertKey, Alert>,
    changed: HashSet<AlertKey>,
    expiry: BinaryHeap<Reverse<(Nanos, AlertKey)>>,
    capacity: usize,
    resolve_after: Nanos,
    min_severity: Severity,
    /// Entries of `expiry` taken out so far: what forgetting alerts has cost (for tests).
    examined: u64,
}

impl ActiveAlerts {
    /// An empty set holding at most `capacity` alerts.
    pub fn new(capacity: usize, resolve_after: Nanos, min_severity: Severity) -> ActiveAlerts {
        ActiveAlerts {
            alerts: HashMap::new(),
            changed: HashSet::new(),
            expiry: BinaryHeap::new(),
            capacity: capacity.max(1),
            resolve_after,
            min_severity,
            examined: 0,
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
            // Resolved but not yet forgotten: its entry in `expiry` is still there.
            Entry::Occupied(mut resolved) => {
                resolved.insert(alert);
                resolved.into_mut()
            }
            Entry::Vacant(slot) => {
                self.expiry
                    .push(Reverse((alert.ends_at, alert.key.clone())));
                slot.insert(alert)
            }
        };
        Raised::New(stored)
    }

    /// Forgets the alerts that have resolved by `now`: takes the due entries of `expiry`, and
    /// puts back those of alerts extended since.
    pub fn expire(&mut self, now: Nanos) {
        while self
            .expiry
            .peek()
            .is_some_and(|Reverse((due, _))| *due <= now)
        {
            let Some(Reverse((_, key))) = self.expiry.pop() else {
                break;
            };
            self.examined += 1;
            match self.alerts.get(&key) {
                Some(alert) if alert.ends_at > now => {
                    self.expiry.push(Reverse((alert.ends_at, key)));
                }
                _ => {
                    self.alerts.remove(&key);
                    self.changed.remove(&key);
                }
            }
        }
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

/// Lower-case hex of some bytes, as OTLP/JSON and trace UIs write ids.
pub fn hex(bytes: &[u8]) -> String {
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
            cause: Cause::Violation(violation),
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
    fn an_interface_that_contradicts_itself_raises_the_interfaces_alert() {
        // DESIGN §13: labels interface and kind (no client), annotations of the later attempt.
        let names = |_| Some((Arc::from("agent"), Arc::from("weather-mcp")));
        let event = |kind| Event::Contradicted {
            labels: 1,
            kind,
            operation: Arc::from("tools/call export"),
            trace_id: [7; 16],
            span_id: [9; 8],
            other_trace: None,
        };
        let a =
            of_event(&event(Contradiction::RefusalContradicted), 5 * S, names).expect("an alert");
        assert_eq!(a.key.alertname, "InterfaceContradictsItself");
        assert_eq!(a.severity, Severity::Warning);
        assert_eq!(
            a.labels(),
            [
                ("alertname", "InterfaceContradictsItself"),
                ("severity", "warning"),
                ("interface", "weather-mcp"),
                ("kind", "refusal_contradicted"),
            ]
        );
        assert_eq!(
            a.summary(),
            "weather-mcp refused and served tools/call export"
        );
        assert_eq!(
            (&*a.operation, a.trace_id, a.span_id),
            ("tools/call export", [7; 16], [9; 8])
        );
        for kind in [
            Contradiction::UndeclaredServed,
            Contradiction::DeclaredRefused,
        ] {
            let a = of_event(&event(kind), 5 * S, names).expect("an alert");
            assert_eq!(
                (a.key.alertname, a.severity),
                ("DiscoveryDocumentDrift", Severity::Info)
            );
            assert_eq!(a.labels()[3], ("kind", kind.as_str()));
            assert_eq!(&*a.key.client, "", "the interface's, whoever showed it");
        }
        // Below warning by default; let in when the minimum is info.
        let drift = of_event(&event(Contradiction::DeclaredRefused), 5 * S, names).expect("alert");
        let mut set = ActiveAlerts::new(10, 300 * S, Severity::Warning);
        assert_eq!(set.raise(5 * S, drift.clone()), Raised::Ignored);
        let mut set = ActiveAlerts::new(10, 300 * S, Severity::Info);
        assert!(matches!(set.raise(5 * S, drift), Raised::New(_)));
        // Every cause has its own counter.
        let places: Vec<usize> = Cause::ALL.iter().map(|c| c.index()).collect();
        assert_eq!(places, (0..Cause::ALL.len()).collect::<Vec<_>>());
        let violation = of_event(
            &Event::Counted {
                operation: None,
                labels: 1,
                kind: crate::classify::Kind::Ok,
                violation: Some(Violation::ProbeAfterRefusal),
                discovery_read: false,
                trace_id: [0; 16],
                span_id: [0; 8],
                end: 0,
            },
            S,
            names,
        )
        .expect("an alert");
        assert_eq!(violation.labels()[2], ("client", "agent"));
        assert_eq!(violation.labels()[4], ("violation", "probe_after_refusal"));
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
    fn past_capacity_a_new_alert_is_dropped_without_a_pass_over_the_others() {
        let mut set = ActiveAlerts::new(10_000, 300 * S, Severity::Warning);
        let mut dropped = 0;
        for n in 0..30_000 {
            if set.raise(S, alert(Violation::RetryAfterRefusal, &n.to_string())) == Raised::Dropped
            {
                dropped += 1;
            }
        }
        assert_eq!((set.alerts.len(), dropped), (10_000, 20_000));
        assert_eq!(set.examined, 0, "nothing due: no entry looked at");
        // As time goes on, each alert's entry is looked at about once a resolve_after.
        let mut raises = 0;
        for n in 0..30_000u64 {
            set.raise(
                S + n * S / 10,
                alert(Violation::RetryAfterRefusal, &format!("t{n}")),
            );
            raises += 1;
        }
        assert!(
            set.examined <= 2 * raises,
            "{} entries for {raises} raises",
            set.examined
        );
        assert!(set.expiry.len() <= set.alerts.len());
    }

    #[test]
    fn an_extended_alert_outlives_its_first_end_and_a_resolved_one_is_forgotten() {
        let mut set = ActiveAlerts::new(1, 300 * S, Severity::Warning);
        set.raise(0, alert(Violation::RetryAfterRefusal, "a"));
        set.raise(200 * S, alert(Violation::RetryAfterRefusal, "a"));
        // Past its first end (300 s), within its second (500 s): still firing, no room.
        assert_eq!(
            set.raise(400 * S, alert(Violation::RetryAfterRefusal, "b")),
            Raised::Dropped
        );
        assert_eq!(set.firing(400 * S).len(), 1);
        assert_eq!(set.expiry.len(), 1, "one entry an alert");
        // Past its second: forgotten, and its change with it.
        set.take_changed();
        set.raise(450 * S, alert(Violation::RetryAfterRefusal, "a"));
        set.expire(750 * S);
        assert!(set.alerts.is_empty() && set.changed.is_empty() && set.expiry.is_empty());
        assert!(matches!(
            set.raise(750 * S, alert(Violation::RetryAfterRefusal, "b")),
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
