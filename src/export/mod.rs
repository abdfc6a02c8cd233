//! Forwarding the tagged spans to a downstream OTLP endpoint (another Collector, Tempo,
//! Jaeger) without losing them and without becoming a retry storm.
//!
//! Edge. The receivers reserve room in the queue before they ingest a request; when the
//! queue is full they answer OTLP's retryable `503`/`UNAVAILABLE` with a retry hint, so the
//! senders' SDKs retry (`on_full: backpressure`, the default), or they accept it and the
//! forward is dropped and counted (`on_full: drop`). The queue holds encoded requests
//! (a `std::sync::Mutex<VecDeque>`, held only to push or pop, never across an `.await`); one
//! task sends them in order, concatenating requests up to `batch_size` spans (concatenated
//! protobuf messages merge, so nothing is re-encoded). It follows the product's own rule:
//! `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `ABORTED`, `RESOURCE_EXHAUSTED` with `RetryInfo`, HTTP
//! 429, 502, 503, 504 and timeouts are retried with exponential backoff and jitter,
//! honouring `RetryInfo` and `Retry-After`; anything else is final and counted; a
//! `partial_success` is logged and not retried. The gRPC message is framed by the gRPC sender
//! (`grpc.rs`) rather than by tonic's client, so that both senders (`grpc.rs`, `http.rs`)
//! compress with the one kept [`Packer`]. An `https://` next hop is reached over TLS, with
//! `exporters.otlp.tls`'s CA and client certificate when set (read and checked at start),
//! else the built-in roots (`client.rs`, with the [`Downstream`] and the compressor).
//!
//! Here: the queue and its batches, and the task that sends them.

use crate::config::{OnFull, OtlpExporterConfig};
use crate::retry::Backoff;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The first wait after a failed send; it doubles (with jitter) up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest wait between retries of one batch.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// What the receivers tell senders to wait when the queue is full.
pub const RETRY_HINT: Duration = Duration::from_secs(1);

pub use crate::metrics::ExportMetrics;
use crate::otlp::route::TraceId;

/// Room in the queue, asked for before a request is ingested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Room for the spans: push them once tagged.
    Granted,
    /// Full, and `on_full: drop`: ingest the request, forward nothing (counted).
    Dropped,
    /// Full, and `on_full: backpressure`: refuse the request with a retry hint.
    Refused,
    /// More than the whole queue holds (spans or bytes), and `on_full: backpressure`: it can
    /// never fit, so it is refused for good (a retry would be refused the same way).
    NeverFits {
        /// What the queue holds at most, in the unit it does not fit in.
        capacity: usize,
        /// `spans` or `bytes`.
        unit: &'static str,
    },
}

/// One tagged request waiting: its bytes (what the queue's byte bound counts), spans, and,
/// from a first tier's replica, its route and traces: requests of different routes are sent
/// as one only when they share no trace ([`crate::otlp::route`]).
struct Item {
    body: Bytes,
    spans: usize,
    route: u64,
    traces: Box<[TraceId]>,
}

/// The route of each trace of a batch being made, for the requests of a first tier's replica.
#[derive(Default)]
struct Routes(foldhash::HashMap<TraceId, u64>);

impl Routes {
    /// Whether `item` may join the batch: none of its traces is in it under another route.
    fn admits(&self, item: &Item) -> bool {
        item.traces
            .iter()
            .all(|t| self.0.get(t).is_none_or(|r| *r == item.route))
    }

    fn add(&mut self, item: &Item) {
        self.0.extend(item.traces.iter().map(|t| (*t, item.route)));
    }
}

/// The queue and its sender.
pub struct Exporter {
    config: OtlpExporterConfig,
    queue: Mutex<VecDeque<Item>>,
    /// Spans reserved or queued; never more than `queue_size`.
    reserved: AtomicUsize,
    /// Bytes reserved or queued; never more than `queue_size_mib`.
    reserved_bytes: AtomicUsize,
    wake: Notify,
    stopping: AtomicBool,
    metrics: ExportMetrics,
}

/// What one send came to.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    /// Accepted; `rejected` spans of it were refused by a partial success.
    Ok { rejected: u64, message: String },
    /// Retry, after the hint when the receiver gave one.
    Retry(String, Option<Duration>),
    /// Too large for the receiver (`RESOURCE_EXHAUSTED` without `RetryInfo`, HTTP 413):
    /// split it and send the halves.
    TooLarge(String),
    /// Final: the receiver refused.
    Final(String),
}

impl Exporter {
    /// An exporter for `config`, counting into `metrics`.
    pub fn new(config: OtlpExporterConfig, metrics: ExportMetrics) -> Exporter {
        Exporter {
            config,
            queue: Mutex::new(VecDeque::new()),
            reserved: AtomicUsize::new(0),
            reserved_bytes: AtomicUsize::new(0),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            metrics,
        }
    }

    /// Reserves room for a request of `spans` spans and about `bytes` bytes (its tags are
    /// accounted for when it is pushed).
    pub fn reserve(&self, spans: usize, bytes: usize) -> Reservation {
        let (cap, cap_bytes) = (self.config.queue_size, self.config.queue_bytes());
        if self.config.on_full == OnFull::Backpressure {
            if spans > cap {
                return Reservation::NeverFits {
                    capacity: cap,
                    unit: "spans",
                };
            }
            if bytes > cap_bytes {
                return Reservation::NeverFits {
                    capacity: cap_bytes,
                    unit: "bytes",
                };
            }
        }
        let granted = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r + spans <= cap).then_some(r + spans)
            })
            .is_ok()
            && (self
                .reserved_bytes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    (r + bytes <= cap_bytes).then_some(r + bytes)
                })
                .is_ok()
                || {
                    // Room for the spans, not for the bytes: give the spans back.
                    self.reserved.fetch_sub(spans, Ordering::AcqRel);
                    false
                });
        match (granted, self.config.on_full) {
            (true, _) => Reservation::Granted,
            (false, OnFull::Drop) => {
                self.metrics
                    .failed
                    .with_label_values(&["queue_full"])
                    .inc_by(spans as u64);
                Reservation::Dropped
            }
            (false, OnFull::Backpressure) => Reservation::Refused,
        }
    }

    /// Queues a tagged request whose room was [`Reservation::Granted`] for `reserved_bytes`;
    /// the queue's byte count becomes its real size.
    pub fn push(&self, body: Vec<u8>, spans: usize, reserved_bytes: usize) {
        self.push_routed(body, spans, reserved_bytes, (0, Vec::new()));
    }

    /// [`Exporter::push`] for a request of one `route` whose spans are of `traces`: it is
    /// batched with requests of other routes only when they share no trace.
    pub fn push_routed(
        &self,
        body: Vec<u8>,
        spans: usize,
        reserved_bytes: usize,
        (route, traces): (u64, Vec<TraceId>),
    ) {
        self.adjust_bytes(reserved_bytes, body.len());
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Item {
                body: Bytes::from(body),
                spans,
                route,
                traces: traces.into(),
            });
        self.show();
        self.wake.notify_one();
    }

    /// Whether what is queued fills a batch.
    fn batch_full(&self) -> bool {
        self.queued() >= self.config.batch_size || self.queued_bytes() >= self.config.batch_bytes()
    }

    /// Gives back room reserved for spans and bytes that were not queued after all.
    pub fn release(&self, spans: usize, bytes: usize) {
        self.reserved.fetch_sub(spans, Ordering::AcqRel);
        self.reserved_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.show();
    }

    /// Spans reserved or waiting.
    pub fn queued(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Bytes reserved or waiting.
    pub fn queued_bytes(&self) -> usize {
        self.reserved_bytes.load(Ordering::Acquire)
    }

    fn adjust_bytes(&self, from: usize, to: usize) {
        if to >= from {
            self.reserved_bytes.fetch_add(to - from, Ordering::AcqRel);
        } else {
            self.reserved_bytes.fetch_sub(from - to, Ordering::AcqRel);
        }
    }

    fn show(&self) {
        self.metrics.queued.set(self.queued() as i64);
        self.metrics.queued_bytes.set(self.queued_bytes() as i64);
    }

    /// Takes the next batch: whole requests, up to `batch_size` spans and `batch_size_mib`
    /// bytes (at least one request), no trace in two routes.
    fn next_batch(&self) -> Option<Vec<Item>> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let first = queue.pop_front()?;
        let (mut spans, mut bytes) = (first.spans, first.body.len());
        let mut routes = Routes::default();
        routes.add(&first);
        let mut batch = vec![first];
        while let Some(next) = queue.front() {
            if spans + next.spans > self.config.batch_size
                || bytes + next.body.len() > self.config.batch_bytes()
                || !routes.admits(next)
            {
                break;
            }
            routes.add(next);
            spans += next.spans;
            bytes += next.body.len();
            batch.push(queue.pop_front().expect("front was just seen"));
        }
        Some(batch)
    }

    /// Every request queued, taken as if sent: what the pipeline's tests read of what it
    /// forwards.
    #[cfg(test)]
    pub(crate) fn take_queued(&self) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Some(batch) = self.next_batch() {
            for item in batch {
                self.done(item.spans, item.body.len());
                out.push(item.body);
            }
        }
        out
    }

    fn done(&self, spans: usize, bytes: usize) {
        self.release(spans, bytes);
    }

    /// Sends batches until stopped: waits `batch_interval` for a batch to fill, retries by
    /// the product's own rule.
    pub async fn run(&self, mut client: Downstream) {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        loop {
            if self
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
            {
                if self.stopping.load(Ordering::Acquire) {
                    return;
                }
                let _ =
                    tokio::time::timeout(self.config.batch_interval, self.wake.notified()).await;
                continue;
            }
            if !self.batch_full() && !self.stopping.load(Ordering::Acquire) {
                // Let a batch fill, a little: until the next request comes, or batch_interval.
                // (Waiting for a full batch costs less with compression but more without: a
                // 3 MiB body to a busy next hop wakes the sender again and again.)
                let _ =
                    tokio::time::timeout(self.config.batch_interval, self.wake.notified()).await;
            }
            let Some(batch) = self.next_batch() else {
                continue;
            };
            self.deliver(&mut client, batch, &mut backoff).await;
        }
    }

    /// Sends one batch until it is delivered, refused, or the exporter stops retrying. A
    /// batch too large for the receiver is split in two, down to single spans: a span too
    /// large alone is dropped and counted (`too_large`).
    async fn deliver(&self, client: &mut Downstream, batch: Vec<Item>, backoff: &mut Backoff) {
        let mut pending = vec![batch];
        while let Some(items) = pending.pop() {
            let spans: usize = items.iter().map(|i| i.spans).sum();
            let bytes: usize = items.iter().map(|i| i.body.len()).sum();
            // Concatenated protobuf messages merge: the repeated resource_spans append. The
            // requests are sent one after another as they are, never copied into one.
            let body: Batch = items.iter().map(|i| i.body.clone()).collect();
            loop {
                match client.send(&self.config, body.clone()).await {
                    Sent::Ok { rejected, message } => {
                        if rejected > 0 {
                            tracing::warn!(rejected, error = %message, "Downstream accepted part of a batch; the rest is not retried.");
                            self.metrics
                                .failed
                                .with_label_values(&["partial_success"])
                                .inc_by(rejected);
                        }
                        self.metrics
                            .sent
                            .inc_by((spans as u64).saturating_sub(rejected));
                        backoff.reset();
                        self.done(spans, bytes);
                        break;
                    }
                    Sent::Final(why) => {
                        tracing::error!(spans, error = %why, "Downstream refused the spans; not retried.");
                        self.metrics
                            .failed
                            .with_label_values(&["refused"])
                            .inc_by(spans as u64);
                        self.done(spans, bytes);
                        break;
                    }
                    Sent::TooLarge(why) => {
                        match self.split(items) {
                            Some((first, second)) => {
                                tracing::info!(spans, bytes, error = %why, "Downstream found a batch too large; sending it in halves.");
                                pending.push(second);
                                pending.push(first);
                            }
                            None => {
                                tracing::error!(bytes, error = %why, "Downstream found a single span too large; dropped.");
                                self.metrics
                                    .failed
                                    .with_label_values(&["too_large"])
                                    .inc_by(spans as u64);
                                self.done(spans, bytes);
                            }
                        }
                        break;
                    }
                    Sent::Retry(why, hint) => {
                        // Each failed try counts its spans under `retried`: an outage shows.
                        self.metrics
                            .failed
                            .with_label_values(&["retried"])
                            .inc_by(spans as u64);
                        if self.stopping.load(Ordering::Acquire) {
                            // Draining: the deadline decides, not the backoff.
                            tokio::time::sleep(FIRST_BACKOFF).await;
                            continue;
                        }
                        let wait = jitter(backoff.wait(hint), hint.is_some());
                        tracing::warn!(spans, error = %why, wait_ms = wait.as_millis() as u64, "Forwarding failed; retrying with backoff.");
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }

    /// Two halves of a batch: its requests halved, or a lone request's spans halved (each
    /// half re-framed from the request's own bytes); `None` for a single span. The queue's
    /// byte count follows the halves' sizes.
    fn split(&self, mut items: Vec<Item>) -> Option<(Vec<Item>, Vec<Item>)> {
        if items.len() > 1 {
            let second = items.split_off(items.len() / 2);
            return Some((items, second));
        }
        let item = items.pop()?;
        let total = crate::otlp::frame::check(&item.body).ok()?;
        if total < 2 {
            return None;
        }
        let cut = u32::try_from(total / 2).ok()?;
        let all = u32::try_from(total).ok()?;
        let none = crate::otlp::tags::SpanTags::default();
        let first: Vec<u32> = (cut..all).collect();
        let second: Vec<u32> = (0..cut).collect();
        let a = crate::otlp::frame::retag(&item.body, &first, &none).ok()?;
        let b = crate::otlp::frame::retag(&item.body, &second, &none).ok()?;
        self.adjust_bytes(item.body.len(), a.len() + b.len());
        // Every span of a queued request is forwarded: the halves hold half of them each.
        let (spans_a, spans_b) = (total / 2, total - total / 2);
        Some((
            vec![Item {
                body: Bytes::from(a),
                spans: spans_a,
                route: item.route,
                traces: item.traces.clone(),
            }],
            vec![Item {
                body: Bytes::from(b),
                spans: spans_b,
                route: item.route,
                traces: item.traces,
            }],
        ))
    }

    /// Stops accepting the wait-for-more and sends what is queued within `deadline`;
    /// returns how many spans could not be delivered (counted as failed, `shutdown`).
    pub async fn drain(&self, sender: tokio::task::JoinHandle<()>, deadline: Duration) -> usize {
        self.stopping.store(true, Ordering::Release);
        self.wake.notify_one();
        let abort = sender.abort_handle();
        let started = Instant::now();
        if tokio::time::timeout(deadline, sender).await.is_err() {
            abort.abort();
        }
        let left = self.queued();
        if left > 0 {
            self.metrics
                .failed
                .with_label_values(&["shutdown"])
                .inc_by(left as u64);
        }
        tracing::info!(
            undelivered = left,
            took_ms = started.elapsed().as_millis() as u64,
            "Exporter drained."
        );
        left
    }
}

/// Spreads retries of many senders: ±25 % around the backoff, unless the receiver named
/// the wait itself.
fn jitter(wait: Duration, hinted: bool) -> Duration {
    if hinted {
        return wait;
    }
    // A cheap spread from the clock's low bits: 0.75 .. 1.25.
    let factor = 0.75 + (crate::clock::now() % 1000) as f64 / 2000.0;
    wait.mul_f64(factor)
}

mod client;
mod grpc;
mod http;

pub use client::{
    check_next_hop_tls, check_tls, error_chain, grpc_channel, http_client, Batch, Downstream,
    Packer,
};
pub use grpc::{RawCodec, RawEncoder, ResponseDecoder, EXPORT_PATH};
pub(crate) use grpc::{Refused, Unary};
pub use http::signal_url;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Compression;
    use std::io::Read;

    #[test]
    fn an_error_chain_names_every_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(error_chain(&io), "connection refused");
        #[derive(Debug)]
        struct Outer(std::io::Error, &'static str);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.1)
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let sending = Outer(refused(), "error sending request");
        assert_eq!(error_chain(&sending), "error sending request: refused");
        // A cause the text already says is not said twice.
        let said = Outer(refused(), "error sending request: refused");
        assert_eq!(error_chain(&said), "error sending request: refused");
    }

    #[test]
    fn a_signals_url_is_the_base_with_its_path_added_once() {
        for (endpoint, url) in [
            ("http://h:4318", "http://h:4318/v1/traces"),
            ("http://h:4318/", "http://h:4318/v1/traces"),
            ("http://h:4318/otlp/", "http://h:4318/otlp/v1/traces"),
            ("http://h:4318/v1/traces", "http://h:4318/v1/traces"),
            ("http://h:4318/v1/traces/", "http://h:4318/v1/traces"),
        ] {
            assert_eq!(signal_url(endpoint, "/v1/traces"), url, "{endpoint}");
        }
        assert_eq!(
            signal_url("http://h/", "/v1/metrics"),
            "http://h/v1/metrics"
        );
    }

    fn batch(n: u8) -> Batch {
        (0..3)
            .map(|i| Bytes::from(vec![n.wrapping_add(i); 40_000 + usize::from(i) * 7]))
            .collect()
    }

    #[test]
    fn a_kept_packer_makes_whole_streams_batch_after_batch() {
        for compression in [Compression::Gzip, Compression::Zstd, Compression::None] {
            let mut packer = Packer::new(compression).expect("a packer");
            for n in 0..3 {
                let batch = batch(n);
                let packed = packer.pack(&batch).expect("packed");
                let mut unpacked = Vec::new();
                match packer.encoding() {
                    Some("gzip") => {
                        flate2::read::GzDecoder::new(&packed[..])
                            .read_to_end(&mut unpacked)
                            .expect("one gzip member");
                    }
                    Some("zstd") => unpacked = zstd::decode_all(&packed[..]).expect("one frame"),
                    _ => unpacked = packed.clone(),
                }
                assert_eq!(unpacked, batch.concat(), "{compression:?}, batch {n}");
                if compression != Compression::None {
                    assert!(packed.len() < 5_000, "{compression:?} compresses");
                }
            }
        }
    }

    #[test]
    fn requests_of_different_routes_share_a_batch_only_when_they_share_no_trace() {
        let config = crate::config::Config::parse("exporters: { otlp: { endpoint: http://h:9 } }")
            .expect("valid");
        let otlp = config.exporters.otlp.clone().expect("an exporter");
        let metrics = crate::metrics::Metrics::new(&config.metrics).export_metrics();
        let exporter = Exporter::new(otlp, metrics);
        let t = |n: u8| [n; 16];
        let queued: [(u8, u64, Vec<TraceId>); 6] = [
            (1, 7, vec![t(1)]),
            (2, 8, vec![t(2)]),
            (3, 7, vec![t(2), t(3)]),
            (4, 9, vec![t(3)]),
            (5, 0, vec![]),
            (6, 0, vec![]),
        ];
        for (body, route, traces) in queued {
            exporter.reserve(1, 1);
            exporter.push_routed(vec![body], 1, 1, (route, traces));
        }
        let mut batches = Vec::new();
        while let Some(batch) = exporter.next_batch() {
            batches.push(batch.iter().map(|i| i.body[0]).collect::<Vec<_>>());
        }
        // 3 shares trace 2 with 2 under another route; 4 shares trace 3 with 3.
        assert_eq!(batches, [vec![1, 2], vec![3], vec![4, 5, 6]]);
    }
}
