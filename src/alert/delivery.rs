//! Alert delivery: the structured log line, the push to Alertmanager's v2 API, and the
//! list of firing alerts the admin endpoint serves.
//!
//! Edge. Ingestion raises alerts into [`Alerter`], which holds the pure [`ActiveAlerts`]
//! behind a `std::sync::Mutex` (held for one insert; never across an `.await`), so raising
//! never waits on the network. The set is the bounded queue: at most
//! `alerting.queue_size` distinct alerts; past it new ones are dropped and counted. The
//! delivery task wakes every [`FLUSH_INTERVAL`], takes what changed and pushes it in one
//! batch, following the product's own rule: 5xx, 408, 429, timeouts and connection errors
//! are retried with backoff (honouring `Retry-After`); any other 4xx is not.

use super::{ActiveAlerts, Alert, Cause, Raised};
use crate::access::Limit;
use crate::config::{AlertingConfig, AlertmanagerConfig};
use crate::retry::{self, Answer, Backoff};
use crate::tracker::Nanos;
use prometheus::{IntCounter, IntCounterVec};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

/// How often changed alerts are pushed, in one batch.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// The first wait after a failed push; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between retries of a push.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The `receiver` label of Alertmanager deliveries.
pub const ALERTMANAGER: &str = "alertmanager";

/// The alerts raised so far and the counters of their fate.
pub struct Alerter {
    state: Mutex<ActiveAlerts>,
    /// `refusal_gate_alerts_total`, one handle per violation (which fixes the alert name
    /// and severity), so that counting an alert hashes no label.
    alerts_total: [IntCounter; Cause::ALL.len()],
    deliveries: IntCounterVec,
    /// Every violation as it is raised, for `WatchAlerts` and `/v1/alerts/stream`; a
    /// watcher that falls [`WATCH_BUFFER`] behind skips ahead.
    watch: tokio::sync::broadcast::Sender<Alert>,
    /// At most `alerting.max_watchers` watchers at once, each holding a permit.
    watchers: Limit,
    watchers_refused: IntCounterVec,
}

/// A watcher's place under `alerting.max_watchers`, given back when it is dropped.
#[derive(Debug)]
pub struct WatchPermit(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

/// How many alerts a slow watcher may fall behind before it skips ahead.
pub const WATCH_BUFFER: usize = 1024;

impl Alerter {
    /// An alerter with `config`'s limits, counting into the given counters
    /// (`refusal_gate_alerts_total`, `refusal_gate_alert_deliveries_total`,
    /// `refusal_gate_alert_watchers_refused_total`).
    pub fn new(
        config: &AlertingConfig,
        alerts_total: IntCounterVec,
        deliveries: IntCounterVec,
        watchers_refused: IntCounterVec,
    ) -> Alerter {
        let resolve_after = u64::try_from(config.resolve_after.as_nanos()).unwrap_or(u64::MAX);
        Alerter {
            state: Mutex::new(ActiveAlerts::new(
                config.queue_size,
                resolve_after,
                config.min_severity,
            )),
            alerts_total: Cause::ALL
                .map(|c| alerts_total.with_label_values(&[c.alert_name(), c.severity().as_str()])),
            deliveries,
            watch: tokio::sync::broadcast::channel(WATCH_BUFFER).0,
            watchers: Limit::new(config.max_watchers),
            watchers_refused,
        }
    }

    /// Every violation raised from now on, while the permit is held; `None` (counted by
    /// `endpoint`) when `alerting.max_watchers` watchers already hold one.
    pub fn subscribe(
        &self,
        endpoint: &str,
    ) -> Option<(tokio::sync::broadcast::Receiver<Alert>, WatchPermit)> {
        match self.watchers.try_enter() {
            Some(permit) => Some((self.watch.subscribe(), WatchPermit(permit))),
            None => {
                self.watchers_refused.with_label_values(&[endpoint]).inc();
                None
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ActiveAlerts> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Raises one violation's alert at `now`: counts it, logs it when it starts firing.
    pub fn raise(&self, now: Nanos, alert: Alert) {
        let cause = alert.cause;
        if self.watch.receiver_count() > 0 {
            let _ = self.watch.send(alert.clone());
        }
        match self.state().raise(now, alert) {
            Raised::Ignored => return,
            Raised::Dropped => {
                self.deliveries
                    .with_label_values(&[ALERTMANAGER, "dropped"])
                    .inc();
            }
            // Logged from the stored alert: the hot case, an alert already firing, copies
            // nothing.
            Raised::New(log) => tracing::warn!(
                alertname = log.key.alertname, severity = log.severity.as_str(),
                client = %log.key.client, interface = %log.key.interface,
                cause = log.cause.label().1, operation = %log.operation,
                trace_id = %log.trace_id_hex(), span_id = %log.span_id_hex(),
                "Alert firing."
            ),
            Raised::Extended => {}
        }
        self.alerts_total[cause.index()].inc();
    }

    /// The alerts firing at `now`.
    pub fn firing(&self, now: Nanos) -> Vec<Alert> {
        self.state().firing(now)
    }

    fn count(&self, outcome: &str) {
        self.deliveries
            .with_label_values(&[ALERTMANAGER, outcome])
            .inc();
    }
}

fn rfc3339(nanos: Nanos) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(nanos)).to_string()
}

/// Alerts as Alertmanager's `POST /api/v2/alerts` takes them.
pub fn to_json(alerts: &[Alert], generator_url: &str) -> serde_json::Value {
    alerts
        .iter()
        .map(|a| {
            let labels: serde_json::Map<String, serde_json::Value> = a
                .labels()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
                .collect();
            serde_json::json!({
                "labels": labels,
                "annotations": {
                    "summary": a.summary(),
                    "operation": &*a.operation,
                    "trace_id": a.trace_id_hex(),
                    "span_id": a.span_id_hex(),
                },
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(a.ends_at),
                "generatorURL": generator_url,
            })
        })
        .collect()
}

/// What one push came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Accepted.
    Sent,
    /// A retryable failure, with what the receiver asked us to wait.
    Retry(String, Option<Duration>),
    /// A final refusal: not retried.
    Rejected(String),
}

/// Pushes a batch once.
pub async fn push(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    body: &serde_json::Value,
) -> Pushed {
    let response = match client
        .post(format!("{}/api/v2/alerts", url.trim_end_matches('/')))
        .timeout(timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Pushed::Retry(e.to_string(), None),
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok());
    match retry::judge(status.as_u16(), retry_after, crate::clock::now()) {
        Answer::Success => Pushed::Sent,
        Answer::Retry(after) => Pushed::Retry(format!("HTTP {status}"), after),
        Answer::Final => {
            let text = response.text().await.unwrap_or_default();
            Pushed::Rejected(format!("HTTP {status}: {}", text.trim()))
        }
    }
}

/// The push of changed alerts to one Alertmanager: the loop ([`Delivery::run`]) and the
/// last push at shutdown ([`Delivery::drain`]), as the exporter has its own.
pub struct Delivery {
    alerter: Arc<Alerter>,
    client: reqwest::Client,
    url: String,
    timeout: Duration,
    /// Where the alerts link back to: the admin endpoint's list.
    generator_url: String,
}

impl Delivery {
    /// Pushes `alerter`'s alerts to `config`'s Alertmanager with `client`; each links to
    /// `generator_url`.
    pub fn new(
        alerter: Arc<Alerter>,
        client: reqwest::Client,
        config: &AlertmanagerConfig,
        generator_url: String,
    ) -> Delivery {
        Delivery {
            alerter,
            client,
            url: config.url.clone(),
            timeout: config.timeout,
            generator_url,
        }
    }

    /// Delivers changed alerts every [`FLUSH_INTERVAL`] until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            tokio::time::sleep(FLUSH_INTERVAL).await;
            match self.flush(&mut backoff).await {
                Some(wait) => tokio::time::sleep(wait.saturating_sub(FLUSH_INTERVAL)).await,
                None => backoff.reset(),
            }
        }
    }

    /// Stops the delivery loop `task`, then pushes what changed once more within `deadline`;
    /// returns whether that push finished in time.
    pub async fn drain(&self, task: tokio::task::JoinHandle<()>, deadline: Duration) -> bool {
        task.abort();
        let _ = task.await;
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        tokio::time::timeout(deadline, self.flush(&mut backoff))
            .await
            .is_ok()
    }

    async fn flush(&self, backoff: &mut Backoff) -> Option<Duration> {
        flush(
            &self.alerter,
            &self.client,
            &self.url,
            self.timeout,
            &self.generator_url,
            backoff,
        )
        .await
    }
}

/// Pushes what changed once; returns how long to wait before the next try when it should
/// be retried.
async fn flush(
    alerter: &Alerter,
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    generator_url: &str,
    backoff: &mut Backoff,
) -> Option<Duration> {
    let batch = {
        let mut state = alerter.state();
        state.expire(crate::clock::now());
        state.take_changed()
    };
    if batch.is_empty() {
        return None;
    }
    match push(client, url, timeout, &to_json(&batch, generator_url)).await {
        Pushed::Sent => {
            alerter.count("sent");
            None
        }
        Pushed::Retry(why, after) => {
            alerter.count("failed");
            tracing::warn!(url, error = %why, alerts = batch.len(), "Alert delivery failed; retrying with backoff.");
            alerter.state().mark_changed(&batch);
            Some(backoff.wait(after))
        }
        Pushed::Rejected(why) => {
            alerter.count("rejected");
            tracing::error!(url, error = %why, alerts = batch.len(), "Alertmanager refused the alerts; not retried.");
            None
        }
    }
}
