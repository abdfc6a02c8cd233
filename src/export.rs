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
//! `partial_success` is logged and not retried. The gRPC message is framed here rather than
//! by tonic's client, so that both protocols compress with the one kept [`Packer`]. An
//! `https://` next hop is reached over TLS, with `exporters.otlp.tls`'s CA and client
//! certificate when set (read and checked at start), else the built-in roots.

use crate::config::{Compression, ExportProtocol, ExporterTlsConfig, OnFull, OtlpExporterConfig};
use crate::retry::Backoff;
use anyhow::Context as _;
use bytes::{Buf, BufMut, Bytes};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
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
/// The zstd level of OTLP/HTTP batches: 1, the fastest, as gzip's is (`Compression::fast`):
/// most of a batch passes through as it came, and CPU is what forwarding costs.
const ZSTD_LEVEL: i32 = 1;

pub use crate::metrics::ExportMetrics;

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

/// One tagged request waiting: its bytes (what the queue's byte bound counts) and spans.
struct Item {
    body: Bytes,
    spans: usize,
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
        self.adjust_bytes(reserved_bytes, body.len());
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Item {
                body: Bytes::from(body),
                spans,
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
    /// bytes (at least one request).
    fn next_batch(&self) -> Option<Vec<Item>> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let first = queue.pop_front()?;
        let (mut spans, mut bytes) = (first.spans, first.body.len());
        let mut batch = vec![first];
        while let Some(next) = queue.front() {
            if spans + next.spans > self.config.batch_size
                || bytes + next.body.len() > self.config.batch_bytes()
            {
                break;
            }
            spans += next.spans;
            bytes += next.body.len();
            batch.push(queue.pop_front().expect("front was just seen"));
        }
        Some(batch)
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
            }],
            vec![Item {
                body: Bytes::from(b),
                spans: spans_b,
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

/// The downstream endpoint, over gRPC or HTTP.
pub enum Downstream {
    /// OTLP/gRPC over this channel, the message compressed by the packer.
    Grpc(tonic::transport::Channel, Packer),
    /// OTLP/HTTP protobuf, to this URL, compressed by the packer.
    Http(reqwest::Client, String, Packer),
}

/// Reads and checks the TLS files `config` names (for an `https://` endpoint), as
/// [`Downstream::new`] does at start: what `refusal-gate validate` runs.
///
/// # Errors
/// Naming the setting and the file that cannot be read or holds no certificate or key.
pub fn check_tls(config: &OtlpExporterConfig, base_dir: &Path) -> anyhow::Result<()> {
    check_next_hop_tls(
        &config.endpoint,
        config.tls.as_ref(),
        "exporters.otlp",
        base_dir,
    )
}

/// [`check_tls`] for any exporter: the TLS files of `section` towards `endpoint`.
///
/// # Errors
/// As [`check_tls`].
pub fn check_next_hop_tls(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<()> {
    tls_files(endpoint, tls, section, base_dir).map(drop)
}

/// The TLS files of an `https://` endpoint, read and checked (none named: the built-in
/// roots alone); `None` for a plain `http://` one. `section` names the exporter in errors.
fn tls_files(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<Option<TlsFiles>> {
    if !endpoint.starts_with("https://") {
        return Ok(None);
    }
    let none = ExporterTlsConfig::default();
    TlsFiles::read(tls.unwrap_or(&none), section, base_dir).map(Some)
}

/// A lazily connecting gRPC channel to `endpoint`, with TLS for `https://` (files of
/// `section`'s `tls`, read from `base_dir`).
///
/// # Errors
/// When the endpoint is not a valid URI, or a TLS file cannot be read or used.
pub fn grpc_channel(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    timeout: std::time::Duration,
    base_dir: &Path,
) -> anyhow::Result<tonic::transport::Channel> {
    let files = tls_files(endpoint, tls, section, base_dir)?;
    let mut channel =
        tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect_timeout(timeout);
    if let Some(files) = files {
        channel = channel
            .tls_config(files.grpc())
            .with_context(|| format!("cannot use {section}.tls"))?;
    }
    Ok(channel.connect_lazy())
}

/// An HTTP client for `endpoint`, with TLS for `https://` as [`grpc_channel`].
///
/// # Errors
/// When a TLS file cannot be read or used, or the client cannot be built.
pub fn http_client(
    endpoint: &str,
    tls: Option<&ExporterTlsConfig>,
    section: &str,
    base_dir: &Path,
) -> anyhow::Result<reqwest::Client> {
    // OTLP requests are never redirected: a redirect is an answer like any other non-2xx
    // (following one would send the body elsewhere, or as a bodiless GET).
    let mut client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(files) = tls_files(endpoint, tls, section, base_dir)? {
        client = files
            .http(client)
            .with_context(|| format!("cannot use {section}.tls"))?;
    }
    Ok(client.build()?)
}

/// An error with every cause under it, `: `-separated: what a failed send says (a refused
/// connection, a certificate not trusted, a timeout), not only that it failed.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// The PEM files of `exporters.otlp.tls`, read: what either client is built with.
struct TlsFiles {
    /// The CA certificates to trust instead of the built-in roots.
    ca: Option<Vec<u8>>,
    /// The client certificate chain and its key (mTLS).
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Reads the files `tls` names, relative to `base_dir`, and checks that each holds what
    /// it should: neither client would say so before its first send.
    fn read(tls: &ExporterTlsConfig, section: &str, base_dir: &Path) -> anyhow::Result<TlsFiles> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>();
            match certs.map_err(|e| e.to_string())? {
                certs if certs.is_empty() => Err("no PEM certificate in it".to_owned()),
                _ => Ok(()),
            }
        };
        let key = |pem: &[u8]| {
            PrivateKeyDer::from_pem_slice(pem)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        let read =
            |setting: &str, file: &Option<PathBuf>, check: &dyn Fn(&[u8]) -> Result<(), String>| {
                let Some(file) = file else { return Ok(None) };
                let path = base_dir.join(file);
                let bytes = std::fs::read(&path).map_err(|e| e.to_string());
                match bytes.and_then(|b| check(&b).map(|()| b)) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(problem) => Err(anyhow::anyhow!(
                        "{section}.tls.{setting} {}: {problem}",
                        path.display()
                    )),
                }
            };
        let (cert, key) = (
            read("cert_file", &tls.cert_file, &certificates)?,
            read("key_file", &tls.key_file, &key)?,
        );
        Ok(TlsFiles {
            ca: read("ca_file", &tls.ca_file, &certificates)?,
            identity: cert.zip(key),
        })
    }

    /// tonic's TLS settings: the CA file or else the built-in roots, and the identity.
    fn grpc(self) -> tonic::transport::ClientTlsConfig {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let tls = match self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_webpki_roots(),
        };
        match self.identity {
            Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
            None => tls,
        }
    }

    /// The same for reqwest, whose built-in roots are the same (webpki) ones.
    fn http(self, mut client: reqwest::ClientBuilder) -> anyhow::Result<reqwest::ClientBuilder> {
        if let Some(ca) = self.ca {
            client = client
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(&ca)?);
        }
        if let Some((mut pem, key)) = self.identity {
            pem.push(b'\n');
            pem.extend_from_slice(&key);
            client = client.identity(reqwest::Identity::from_pem(&pem)?);
        }
        Ok(client)
    }
}

/// A gRPC client codec for `TraceService/Export` that sends an already-encoded request as
/// it is and decodes the response: what the exporter forwards with, and what the load
/// generator and the tests put arbitrary bytes on the wire with.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;
/// [`RawCodec`]'s encoder: the bytes as they are.
pub struct RawEncoder;
/// [`RawCodec`]'s decoder: an `ExportTraceServiceResponse`.
pub struct ResponseDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Bytes,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl tonic::codec::Decoder for ResponseDecoder {
    type Item = ExportTraceServiceResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        ExportTraceServiceResponse::decode(bytes)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

/// The requests of one batch, sent one after another as they are: concatenated protobuf
/// messages merge, so the next hop reads one request.
pub type Batch = Vec<Bytes>;

/// The compressor of the exporter's batches, OTLP/HTTP bodies and gRPC messages alike, kept
/// from one batch to the next: gzip's window and hash tables, or zstd's context, are reset
/// rather than allocated and built again. Each request of a batch is fed to it as it is,
/// never concatenated first.
pub enum Packer {
    /// `compression: none`.
    None,
    /// gzip at level 1 (`Compression::fast`).
    Gzip(Box<flate2::Compress>),
    /// zstd at [`ZSTD_LEVEL`].
    Zstd(Box<zstd::stream::raw::Encoder<'static>>),
}

/// How much room the compressed body gains at a time while it grows.
const PACK_GROWTH: usize = 64 << 10;

impl Packer {
    /// A compressor for `compression`.
    ///
    /// # Errors
    /// When zstd cannot set up its context (out of memory).
    pub fn new(compression: Compression) -> std::io::Result<Packer> {
        Ok(match compression {
            Compression::None => Packer::None,
            Compression::Gzip => Packer::Gzip(Box::new(flate2::Compress::new_gzip(
                flate2::Compression::fast(),
                15,
            ))),
            Compression::Zstd => {
                Packer::Zstd(Box::new(zstd::stream::raw::Encoder::new(ZSTD_LEVEL)?))
            }
        })
    }

    /// The `Content-Encoding` of what [`Packer::pack`] makes; `None` when it does not compress.
    pub fn encoding(&self) -> Option<&'static str> {
        match self {
            Packer::None => None,
            Packer::Gzip(_) => Some("gzip"),
            Packer::Zstd(_) => Some("zstd"),
        }
    }

    /// The batch compressed, one stream (a gzip member, a zstd frame) for the whole of it;
    /// for [`Packer::None`] the requests one after another.
    ///
    /// # Errors
    /// When the compressor fails (it does not on a `Vec`, short of memory).
    pub fn pack(&mut self, batch: &Batch) -> std::io::Result<Vec<u8>> {
        let size: usize = batch.iter().map(Bytes::len).sum();
        match self {
            Packer::None => Ok(batch.concat()),
            Packer::Gzip(gz) => {
                use flate2::{FlushCompress, Status};
                gz.reset();
                let mut out = Vec::with_capacity(size / 8 + PACK_GROWTH);
                for part in batch {
                    let mut input: &[u8] = part;
                    while !input.is_empty() {
                        out.reserve(PACK_GROWTH);
                        let before = gz.total_in();
                        gz.compress_vec(input, &mut out, FlushCompress::None)?;
                        let taken = usize::try_from(gz.total_in() - before).unwrap_or(usize::MAX);
                        input = &input[taken.min(input.len())..];
                    }
                }
                loop {
                    out.reserve(PACK_GROWTH);
                    if gz.compress_vec(&[], &mut out, FlushCompress::Finish)? == Status::StreamEnd {
                        return Ok(out);
                    }
                }
            }
            Packer::Zstd(z) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                z.reinit()?;
                // The size up front lets zstd fit its tables to the batch, as a one-shot
                // compression does.
                z.set_pledged_src_size(Some(size as u64))?;
                let mut out = Vec::with_capacity(size / 8 + PACK_GROWTH);
                for part in batch {
                    let mut input = InBuffer::around(part);
                    while input.pos < part.len() {
                        out.reserve(PACK_GROWTH);
                        let at = out.len();
                        z.run(&mut input, &mut OutBuffer::around_pos(&mut out, at))?;
                    }
                }
                loop {
                    out.reserve(PACK_GROWTH);
                    let at = out.len();
                    if z.finish(&mut OutBuffer::around_pos(&mut out, at), true)? == 0 {
                        return Ok(out);
                    }
                }
            }
        }
    }
}

/// The gRPC path of `TraceService/Export`.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

impl Downstream {
    /// A client for `config` (connects lazily), its TLS files read from `base_dir`.
    ///
    /// # Errors
    /// When the endpoint is not a valid URI, a TLS file cannot be read or used, or the HTTP
    /// client cannot be built.
    pub fn new(config: &OtlpExporterConfig, base_dir: &Path) -> anyhow::Result<Downstream> {
        let (endpoint, tls, section) = (&config.endpoint, config.tls.as_ref(), "exporters.otlp");
        match config.protocol {
            ExportProtocol::Grpc => Ok(Downstream::Grpc(
                grpc_channel(endpoint, tls, section, config.timeout, base_dir)?,
                Packer::new(config.compression)?,
            )),
            ExportProtocol::HttpProtobuf => Ok(Downstream::Http(
                http_client(endpoint, tls, section, base_dir)?,
                signal_url(endpoint, "/v1/traces"),
                Packer::new(config.compression)?,
            )),
        }
    }

    async fn send(&mut self, config: &OtlpExporterConfig, body: Batch) -> Sent {
        match self {
            Downstream::Grpc(channel, packer) => send_grpc(channel, packer, config, body).await,
            Downstream::Http(client, url, packer) => {
                send_http(client, url, packer, config, body).await
            }
        }
    }
}

fn partial(response: &ExportTraceServiceResponse) -> Sent {
    let (rejected, message) = response
        .partial_success
        .as_ref()
        .map_or((0, String::new()), |p| {
            (
                u64::try_from(p.rejected_spans).unwrap_or(0),
                p.error_message.clone(),
            )
        });
    Sent::Ok { rejected, message }
}

/// Sends a batch as one gRPC message, framed here rather than by tonic's client so that it
/// is compressed by the [`Packer`] (tonic's own compression is gzip at level 6 and zstd at
/// level 3, made afresh for every message: twice the CPU of everything else forwarding does).
async fn send_grpc(
    channel: &tonic::transport::Channel,
    packer: &mut Packer,
    config: &OtlpExporterConfig,
    batch: Batch,
) -> Sent {
    use tonic::codegen::http::{header, HeaderName, HeaderValue, Method, Request};
    use tonic::Code;
    use tonic_types::StatusExt;
    let (compressed, mut parts) = match packer.encoding() {
        None => (false, batch),
        Some(_) => match packer.pack(&batch) {
            Ok(packed) => (true, vec![Bytes::from(packed)]),
            Err(_) => return Sent::Final("compressing the batch failed".to_owned()),
        },
    };
    let length: usize = parts.iter().map(Bytes::len).sum();
    let Ok(length) = u32::try_from(length) else {
        return Sent::TooLarge(format!("a gRPC message of {length} bytes"));
    };
    let mut prefix = [u8::from(compressed), 0, 0, 0, 0];
    prefix[1..].copy_from_slice(&length.to_be_bytes());
    parts.insert(0, Bytes::copy_from_slice(&prefix));
    let mut request = Request::new(tonic::body::Body::new(Parts::new(parts)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = tonic::codegen::http::Uri::from_static(EXPORT_PATH);
    let headers = request.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    if let Ok(timeout) = HeaderValue::try_from(grpc_timeout(config.timeout)) {
        headers.insert("grpc-timeout", timeout);
    }
    if let Some(encoding) = packer.encoding() {
        headers.insert("grpc-encoding", HeaderValue::from_static(encoding));
    }
    for (k, v) in &config.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()),
            HeaderValue::try_from(v.as_str()),
        ) {
            headers.insert(k, v);
        }
    }
    let call = async {
        let mut channel = channel.clone();
        std::future::poll_fn(|cx| tower_service::Service::poll_ready(&mut channel, cx))
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let response = tower_service::Service::call(&mut channel, request)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        grpc_answer(response).await
    };
    let status = match tokio::time::timeout(config.timeout, call).await {
        Err(_) => return Sent::Retry(format!("timed out after {:?}", config.timeout), None),
        Ok(Ok(response)) => return partial(&response),
        Ok(Err(status)) => status,
    };
    let hint = status.get_details_retry_info().and_then(|r| r.retry_delay);
    let why = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::DataLoss
        | Code::Cancelled => Sent::Retry(why, hint),
        Code::ResourceExhausted if hint.is_some() => Sent::Retry(why, hint),
        Code::ResourceExhausted => Sent::TooLarge(why),
        _ => Sent::Final(why),
    }
}

/// The largest answer the exporter reads from the next hop (an `ExportTraceServiceResponse` is
/// a few bytes; tonic's client decodes at most 4 MiB by default): past it the send is final.
const MAX_ANSWER: usize = 4 << 20;

/// What refusal-gate calls itself on its outbound requests.
const USER_AGENT: &str = concat!("refusal-gate/", env!("CARGO_PKG_VERSION"));

/// A `grpc-timeout` header value: milliseconds, or seconds past what eight digits hold.
fn grpc_timeout(timeout: Duration) -> String {
    match timeout.as_millis() {
        ms @ 0..=99_999_999 => format!("{ms}m"),
        _ => format!("{}S", timeout.as_secs().min(99_999_999)),
    }
}

/// Reads a gRPC answer: the status from the headers (a trailers-only answer) or from the
/// trailers after the message; an HTTP failure mapped to its gRPC code as gRPC's
/// HTTP-to-gRPC mapping says.
async fn grpc_answer(
    response: tonic::codegen::http::Response<tonic::body::Body>,
) -> Result<ExportTraceServiceResponse, tonic::Status> {
    use http_body_util::BodyExt;
    use tonic::{Code, Status};
    let (head, body) = response.into_parts();
    if head.status != tonic::codegen::http::StatusCode::OK {
        let code = match head.status.as_u16() {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        };
        return Err(Status::new(code, format!("HTTP {}", head.status)));
    }
    if let Some(status) = Status::from_header_map(&head.headers) {
        // Trailers-only: no message.
        return match status.code() {
            Code::Ok => Ok(ExportTraceServiceResponse::default()),
            _ => Err(status),
        };
    }
    let whole = http_body_util::Limited::new(body, MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                // The spans were taken; an answer this large is the next hop's fault, and
                // sending them again would not change it.
                Status::internal(format!("the answer is larger than {MAX_ANSWER} bytes"))
            } else {
                Status::unavailable(e.to_string())
            }
        })?;
    match whole.trailers().and_then(Status::from_header_map) {
        Some(status) if status.code() == Code::Ok => {}
        Some(status) => return Err(status),
        None => return Err(Status::internal("the answer carries no grpc-status")),
    }
    // One uncompressed message (no grpc-accept-encoding was offered): flag, length, bytes.
    let message = whole.to_bytes();
    Ok(message
        .get(5..)
        .and_then(|m| ExportTraceServiceResponse::decode(m).ok())
        .unwrap_or_default())
}

/// A request body of parts sent one after another as they are, with its exact length.
struct Parts {
    parts: VecDeque<Bytes>,
    left: u64,
}

impl Parts {
    fn new(parts: Vec<Bytes>) -> Parts {
        let left = parts.iter().map(|p| p.len() as u64).sum();
        Parts {
            parts: parts.into(),
            left,
        }
    }
}

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let next = self.parts.pop_front();
        if let Some(part) = &next {
            self.left -= part.len() as u64;
        }
        std::task::Poll::Ready(next.map(|part| Ok(http_body::Frame::data(part))))
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// The OTLP/HTTP URL of a signal (`/v1/traces`, `/v1/metrics`) at `endpoint`: the base URL
/// with the signal's path added, unless it already ends with it.
pub fn signal_url(endpoint: &str, path: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(path) {
        base.to_owned()
    } else {
        format!("{base}{path}")
    }
}

async fn send_http(
    client: &reqwest::Client,
    url: &str,
    packer: &mut Packer,
    config: &OtlpExporterConfig,
    batch: Batch,
) -> Sent {
    let mut request = client
        .post(url)
        .timeout(config.timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf");
    for (k, v) in &config.headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let body = match packer.encoding() {
        None => reqwest::Body::wrap(Parts::new(batch)),
        encoding => match packer.pack(&batch) {
            Ok(packed) => {
                if let Some(encoding) = encoding {
                    request = request.header(reqwest::header::CONTENT_ENCODING, encoding);
                }
                reqwest::Body::from(packed)
            }
            Err(_) => return Sent::Final("compressing the batch failed".to_owned()),
        },
    };
    let response = match request.body(body).send().await {
        Ok(r) => r,
        Err(e) => return Sent::Retry(error_chain(&e), None),
    };
    let status = response.status();
    let hint = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        // Delay-seconds or an HTTP-date.
        .and_then(|v| crate::retry::retry_after(v, crate::clock::now()))
        .map(Duration::from_nanos);
    if status.is_success() {
        let mut response = response;
        let mut answer = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            if answer.len() + chunk.len() > MAX_ANSWER {
                return Sent::Final(format!("the answer is larger than {MAX_ANSWER} bytes"));
            }
            answer.extend_from_slice(&chunk);
        }
        return partial(&ExportTraceServiceResponse::decode(&answer[..]).unwrap_or_default());
    }
    // OTLP/HTTP: 429, 502, 503 and 504 are retryable; every other failure is final.
    match status.as_u16() {
        429 | 502 | 503 | 504 => Sent::Retry(format!("HTTP {status}"), hint),
        413 => Sent::TooLarge(format!("HTTP {status}")),
        _ => Sent::Final(format!("HTTP {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
