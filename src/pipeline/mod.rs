//! The processor: one export request's bytes in, everything refusal-gate does with them out —
//! framing checked, spans read in place, extract → classify → track inline, counters, alerts,
//! and (when forwarding) the request re-framed with each span's tags and queued.
//!
//! Thin state around the pure stages: no sockets, no tasks, no clock reads. [`Pipeline::handle`]
//! is the one entry point for both receivers and both encodings (OTLP/JSON becomes protobuf
//! first); every method that needs the time takes `now` from its caller — the wall clock when
//! serving, span time when replaying.

mod assemble;
pub mod calls;
pub mod error;
mod join;
mod outbox;
pub mod place;

pub use crate::otlp::Transport;
pub use error::{Encoding, IngestError};
pub use place::{ClientIds, Placed};

use crate::access::Grant;
use crate::alert::delivery::Alerter;
use crate::config::{AlertingConfig, OtlpExporterConfig};
use crate::discovery::loader::Catalog;
use crate::discovery::Interfaces;
use crate::export::{Exporter, Reservation};
use crate::extract::SpanView;
use crate::extract::{self, Attempt};
use crate::metrics::Metrics;
use crate::otlp::tags::SpanTags;
use crate::otlp::{frame, json, route, wire};
use crate::tracker::{EachShard, Event, Judgement, Nanos, Observation, Tracker};
use assemble::{Joins, Memory, Node, Root};
use bytes::Bytes;
use calls::{At, Owner};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What one request amounted to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Spans accepted (everything that decoded).
    pub accepted: u64,
    /// Spans that could not be decoded: OTLP's `rejected_spans`.
    pub rejected: u64,
    /// Attempts counted: its spans' (a call's spans make one), and those of calls kept from
    /// earlier requests that its spans completed.
    pub attempts: u64,
    /// Spans with more attributes than are read (`max_attributes_per_span`).
    pub truncated: u64,
    /// Spans about a client the request's token may not speak for: refused, never judged
    /// (DESIGN §7). OTLP's `rejected_spans` too.
    pub not_permitted: u64,
}

/// Everything a request needs, shared by the receivers, the admin endpoint and the sweeper.
pub struct Pipeline {
    catalog: Arc<Catalog>,
    tracker: Tracker,
    metrics: Metrics,
    alerter: Arc<Alerter>,
    exporter: Option<Arc<Exporter>>,
    /// foldhash: a fast keyed hash, seeded at random so ids cannot be aimed at (the seed is
    /// kept in the state file, so ids survive a restart).
    hasher: foldhash::fast::FixedState,
    seed: u64,
    /// Attributes read per span and per resource.
    max_attributes: usize,
    /// The calls kept for spans still to come (DESIGN §9, §11). One std `Mutex`, taken once
    /// per request that has spans to join (a span naming a parent, a server span of an
    /// observed interface) or while calls are kept, and by the sweep; never across an
    /// `.await`. A request of spans that name no parent, while nothing is kept, never takes it.
    calls: Mutex<calls::Calls>,
    /// How many spans `calls` keeps, read without its lock.
    held: AtomicUsize,
    /// The spans withheld from forwarding until their call's verdict is final (DESIGN §11.5).
    /// One std `Mutex`, taken only when forwarding and a request withholds a span or may
    /// count a call one was withheld for (`withheld` > 0), and by the sweep; inside `calls`'
    /// lock when both are taken, never the other way round, never across an `.await`.
    outbox: Mutex<outbox::Outbox>,
    /// How many spans `outbox` has, withheld or ready to leave, read without its lock.
    withheld: AtomicUsize,
    /// Held while verdicts are settled and until they are counted ([`Pipeline::settle`],
    /// [`Pipeline::sweep`], [`Pipeline::finish`]): a scrape that settles during a sweep waits
    /// for the sweep's verdicts to be counted rather than reading the counters without them.
    /// Never taken on the ingest path.
    settling: Mutex<()>,
    /// `tracker.role: join`: every forwarded span is stamped with its call's client instead of
    /// tagged, and nothing is counted ([`join`]).
    join: bool,
}

/// What one request carries through the ingest path.
struct RequestState<'t> {
    now: Nanos,
    events: Vec<Event>,
    summary: Summary,
    tags: Option<&'t mut SpanTags>,
    /// When tagging: the staged attempts' tags that do not depend on the verdict, and a rule
    /// written out before it is tagged. Grown once, reused for every span.
    placed: Vec<u8>,
    reason: String,
}

/// Bytes of `refusal_gate.*` attributes a span takes, about: what a request's tag buffer
/// reserves per span, so that filling it in does not grow it.
const TAG_BYTES: usize = 384;

/// Attempts staged before the tracker takes them together ([`Tracker::observe_all`]):
/// enough for the cache misses of looking up their keys to overlap, few enough to stay in
/// the cache.
const STAGED: usize = 64;

/// One attempt, extracted and placed, waiting for the tracker.
struct Staged<'a> {
    obs: Observation,
    operation: extract::Operation<'a>,
    /// When tagging: its span's index among the tags, and where its tags that do not depend
    /// on the verdict stand in [`RequestState::placed`].
    tag: Option<(usize, std::ops::Range<usize>)>,
    /// Its call may still change (its server's span may come): withheld once tagged.
    withhold: bool,
}

impl Pipeline {
    /// Wires the pure stages to their state.
    pub fn new(
        catalog: Arc<Catalog>,
        tracker: Tracker,
        metrics: Metrics,
        alerting: &AlertingConfig,
    ) -> Pipeline {
        let (alerts, deliveries, watchers_refused) = metrics.alert_counters();
        let calls = calls::Calls::new(
            tracker.reorder_window(),
            tracker.max_held_spans(),
            tracker.max_held_bytes(),
        );
        let outbox = outbox::Outbox::new(
            tracker.reorder_window(),
            tracker.max_held_spans(),
            tracker.max_held_bytes(),
        );
        // A random seed: the standard library's per-process random keys.
        let seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            "refusal-gate",
        );
        Pipeline {
            catalog,
            tracker,
            metrics,
            alerter: Arc::new(Alerter::new(alerting, alerts, deliveries, watchers_refused)),
            exporter: None,
            hasher: foldhash::fast::FixedState::with_seed(seed),
            seed,
            max_attributes: extract::DEFAULT_MAX_ATTRIBUTES,
            calls: Mutex::new(calls),
            held: AtomicUsize::new(0),
            outbox: Mutex::new(outbox),
            withheld: AtomicUsize::new(0),
            settling: Mutex::new(()),
            join: false,
        }
    }

    /// A pipeline on `config` alone: its interfaces (no discovery document loaded), tracker,
    /// metrics, alerting and attribute limit, no exporter. What the benchmarks and the fuzz
    /// targets build on.
    pub fn from_config(config: &crate::config::Config) -> Pipeline {
        Pipeline::new(
            Arc::new(Catalog::new(config.interfaces.clone(), Default::default())),
            Tracker::new(&config.tracker),
            Metrics::new(&config.metrics),
            &config.alerting,
        )
        .with_max_attributes(config.receivers.otlp.max_attributes_per_span)
        .with_role(config.tracker.role)
    }

    /// Plays `role` (`tracker.role`).
    #[must_use]
    pub fn with_role(mut self, role: crate::config::Role) -> Pipeline {
        self.join = role == crate::config::Role::Join;
        self
    }

    /// Hashes with `seed` (the one a state file was written with).
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Pipeline {
        self.hasher = foldhash::fast::FixedState::with_seed(seed);
        self.seed = seed;
        self
    }

    /// Reads at most `n` attributes of each span and resource; the rest are skipped unread
    /// and the span counted in `refusal_gate_receiver_truncated_spans_total`.
    #[must_use]
    pub fn with_max_attributes(mut self, n: usize) -> Pipeline {
        self.max_attributes = n;
        self
    }

    /// Forwards what it ingests through `exporter` (built from this pipeline's metrics).
    #[must_use]
    pub fn with_exporter(mut self, config: &OtlpExporterConfig) -> Pipeline {
        self.exporter = Some(Arc::new(Exporter::new(
            config.clone(),
            self.metrics.export_metrics(),
        )));
        self
    }

    /// The seed of [`Pipeline::id`], for the state file.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The pipeline's keyed hash: the ids of clients, interfaces and operations.
    pub fn id(&self, value: impl Hash) -> u64 {
        self.hasher.hash_one(value)
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The exporter, when forwarding is on.
    pub fn exporter(&self) -> Option<&Arc<Exporter>> {
        self.exporter.as_ref()
    }

    /// The alerter.
    pub fn alerter(&self) -> &Arc<Alerter> {
        &self.alerter
    }

    /// The interfaces and their documents.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The tracker.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    fn calls(&self) -> MutexGuard<'_, calls::Calls> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The outbox, locked, when forwarding and it holds spans (or `always`): what counting a
    /// call gives the verdicts of its withheld spans to.
    fn outbox(&self, always: bool) -> Option<MutexGuard<'_, outbox::Outbox>> {
        (self.exporter.is_some() && (always || self.withheld.load(Ordering::Relaxed) > 0))
            .then(|| self.outbox.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn settling(&self) -> MutexGuard<'_, ()> {
        self.settling.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One export request, from either receiver, at `now`: framing checked (OTLP/JSON made
    /// protobuf first), room reserved to forward it, its spans run through extract → classify
    /// → track inline, tagged and queued. Counts what it refuses.
    ///
    /// # Errors
    /// An [`IngestError`] that the receiver turns into its transport's answer.
    pub fn handle(
        &self,
        transport: Transport,
        body: &[u8],
        encoding: Encoding,
        now: Nanos,
    ) -> Result<Summary, IngestError> {
        self.handle_with((transport, &Grant::default()), (body, None), encoding, now)
    }

    /// [`Pipeline::handle`] of a body held in [`Bytes`]: the calls kept for a late part keep
    /// a reference to it rather than a copy (DESIGN §11), and count against
    /// `tracker.max_held_mib` what the buffer it is a view of keeps `allocated` (its
    /// capacity: at least its length). Spans about a client `grant` may not speak for are
    /// refused (counted, never judged, not forwarded).
    ///
    /// # Errors
    /// As [`Pipeline::handle`].
    pub fn handle_bytes(
        &self,
        sender: (Transport, &Grant),
        (body, allocated): (&Bytes, usize),
        encoding: Encoding,
        now: Nanos,
    ) -> Result<Summary, IngestError> {
        let owner = Owner {
            bytes: body,
            allocated,
        };
        self.handle_with(sender, (body, Some(owner)), encoding, now)
    }

    fn handle_with(
        &self,
        sender: (Transport, &Grant),
        body: (&[u8], Option<Owner<'_>>),
        encoding: Encoding,
        now: Nanos,
    ) -> Result<Summary, IngestError> {
        let started = std::time::Instant::now();
        let transport = sender.0;
        let result = self.handle_inner(sender, body, encoding, now);
        match &result {
            Ok(_) => self
                .metrics
                .batch_duration(transport, started.elapsed().as_secs_f64()),
            Err(IngestError::Overloaded { spans, .. }) => {
                self.metrics.refused_spans(transport, "queue_full", *spans);
            }
            Err(e) => self.metrics.refused_request(transport, e.reason()),
        }
        result
    }

    fn handle_inner(
        &self,
        sender: (Transport, &Grant),
        (body, owner): (&[u8], Option<Owner<'_>>),
        encoding: Encoding,
        now: Nanos,
    ) -> Result<Summary, IngestError> {
        let converted;
        let (body, owner, left_out) = match encoding {
            Encoding::Protobuf => (body, owner, 0),
            Encoding::Json => {
                let (protobuf, left_out) = json::to_protobuf(body)?;
                converted = protobuf;
                (&converted[..], None, left_out)
            }
        };
        let spans = frame::check(body)?;
        let Some(exporter) = &self.exporter else {
            // The hot path: spans are read in place, nothing is materialised.
            return Ok(self.ingest_in(sender, (body, owner), left_out, now, None).0);
        };
        let reservation = exporter.reserve(spans, body.len());
        match reservation {
            Reservation::Refused => {
                return Err(IngestError::Overloaded {
                    retry_after: crate::export::RETRY_HINT,
                    spans: spans as u64,
                })
            }
            Reservation::NeverFits { capacity, unit } => {
                let size = if unit == "bytes" { body.len() } else { spans };
                return Err(IngestError::ExceedsQueue {
                    size: size as u64,
                    capacity,
                    unit,
                });
            }
            Reservation::Dropped => {
                // Nothing of it is forwarded: nothing to tag.
                let summary = self.ingest_in(sender, (body, owner), left_out, now, None).0;
                self.forward_ready(None, now);
                return Ok(summary);
            }
            Reservation::Granted => {}
        }
        let mut tags = SpanTags::with_capacity(spans, TAG_BYTES);
        let body = (body, owner);
        let (summary, malformed_at) = self.ingest_in(sender, body, left_out, now, Some(&mut tags));
        let (body, _) = body;
        // The withheld spans (in the outbox now) keep their room in the queue until they leave.
        let forwarded = spans - malformed_at.len() - tags.withheld();
        exporter.release(malformed_at.len(), 0);
        if self.join {
            self.forward_stamped(exporter, (body, &malformed_at), &mut tags, forwarded);
            self.forward_ready(None, now);
            return Ok(summary);
        }
        match frame::retag(body, &malformed_at, &tags) {
            Ok(tagged) => exporter.push(tagged, forwarded, body.len()),
            Err(e) => {
                // The framing was checked first, on the same reader: this cannot happen.
                exporter.release(forwarded, body.len());
                tracing::error!(error = %e, "Could not re-frame a request for forwarding.");
            }
        }
        self.forward_ready(None, now);
        Ok(summary)
    }

    /// Moves the spans `tags` withholds into `outbox`, each with its tags so far; one that
    /// does not fit is forwarded with the request, untagged, and counted (DESIGN §11.5). Done
    /// under the calls' lock, so that a request that counts their call finds them.
    fn withhold(
        &self,
        outbox: &mut outbox::Outbox,
        (body, malformed_at): (&[u8], &[u32]),
        tags: &mut SpanTags,
        now: Nanos,
    ) {
        if tags.withheld() == 0 {
            return;
        }
        let parcels = match frame::withheld(body, malformed_at, tags) {
            Ok(parcels) => parcels,
            Err(e) => {
                // The framing was checked first, on the same reader: this cannot happen.
                tracing::error!(error = %e, "Could not read out the spans withheld from forwarding.");
                Vec::new()
            }
        };
        let mut full = 0;
        for w in parcels {
            let held = wire::SpanRef::parse(w.span).is_ok_and(|span| {
                let parcel = outbox::Parcel {
                    envelope: w.envelope,
                    span: w.span.into(),
                    tags: tags.get(w.tag).to_vec(),
                    since: now,
                };
                outbox.hold(calls::key(span.trace_id(), span.span_id()), parcel)
            });
            if !held {
                tags.write(w.tag, |_| {});
                full += 1;
            }
        }
        if full > 0 {
            self.metrics.untagged("held_full", full);
        }
    }

    fn outbox_gauges(&self, outbox: &outbox::Outbox) {
        self.withheld.store(outbox.pending(), Ordering::Relaxed);
        self.metrics.set_withheld(outbox.len(), outbox.bytes());
    }

    /// Queues the withheld spans whose call's verdict is final at `now`: those `outbox` (locked
    /// by the caller) or the outbox has ready.
    fn forward_ready(&self, outbox: Option<&mut outbox::Outbox>, now: Nanos) {
        let Some(exporter) = &self.exporter else {
            return;
        };
        let take = |outbox: &mut outbox::Outbox| {
            let ready = outbox.take_ready();
            self.outbox_gauges(outbox);
            ready
        };
        let ready = match outbox {
            Some(outbox) => take(outbox),
            None => match self.outbox(false) {
                Some(mut outbox) if outbox.has_ready() => take(&mut outbox),
                _ => return,
            },
        };
        self.forward(exporter, &ready, now);
    }

    /// Queues `parcels`, withheld until `now`, as one request.
    fn forward(&self, exporter: &Exporter, parcels: &[outbox::Parcel], now: Nanos) {
        if parcels.is_empty() {
            return;
        }
        for p in parcels {
            let waited = now.saturating_sub(p.since);
            self.metrics
                .withheld_for(waited as f64 / crate::clock::SECOND as f64);
        }
        if self.join {
            self.forward_parcels_stamped(exporter, parcels);
            return;
        }
        exporter.push(outbox::frame(parcels), parcels.len(), 0);
    }

    /// At shutdown (`now`), once the last verdicts are counted: every withheld span leaves,
    /// those whose call's verdict is not final untagged (counted).
    pub fn forward_withheld(&self, now: Nanos) {
        let (Some(exporter), Some(mut outbox)) = (&self.exporter, self.outbox(true)) else {
            return;
        };
        let (all, untagged) = outbox.take_all();
        self.outbox_gauges(&outbox);
        drop(outbox);
        if untagged > 0 {
            self.metrics.untagged("shutdown", untagged);
        }
        self.forward(exporter, &all, now);
    }

    /// Runs a protobuf request whose framing [`frame::check`] accepted through extract →
    /// classify → track, reading every span in place, and records it; `left_out` spans were
    /// rejected before (OTLP/JSON's that did not deserialize). With `tags`, adds every span
    /// that decoded, in order, with the encoded `refusal_gate.*` attributes to append to it
    /// (none for spans that are not attempts, were tagged upstream, or were already seen).
    /// Returns the summary and where the spans that could not be read stood (for
    /// [`frame::retag`]).
    pub fn ingest(
        &self,
        transport: Transport,
        body: &[u8],
        left_out: u64,
        now: Nanos,
        tags: Option<&mut SpanTags>,
    ) -> (Summary, Vec<u32>) {
        let sender = (transport, &Grant::default());
        self.ingest_in(sender, (body, None), left_out, now, tags)
    }

    /// [`Pipeline::ingest`], `body` held in `owner` when it is given.
    fn ingest_in(
        &self,
        (transport, grant): (Transport, &Grant),
        (body, owner): (&[u8], Option<Owner<'_>>),
        left_out: u64,
        now: Nanos,
        tags: Option<&mut SpanTags>,
    ) -> (Summary, Vec<u32>) {
        let interfaces = self.catalog.current();
        let mut request = RequestState {
            now,
            events: Vec::new(),
            summary: Summary {
                rejected: left_out,
                ..Summary::default()
            },
            tags,
            placed: Vec::new(),
            reason: String::new(),
        };
        let mut staged = Vec::with_capacity(STAGED);
        let mut malformed_at = Vec::new();
        let mut joins = Joins {
            recording: self.held.load(Ordering::Relaxed) > 0,
            body,
            ..Joins::default()
        };
        let mut seen = 0u32;
        for resource_spans in wire::each(body, 1).map_while(Result::ok) {
            let client = match wire::ResourceRef::of(resource_spans) {
                Ok(resource) => extract::client(|f| resource.attributes(self.max_attributes, f)),
                Err(_) => extract::client(|_| {}),
            };
            if !grant.speaks_for(client.name) {
                let refused = refuse_resource(resource_spans, &mut seen, &mut malformed_at);
                request.summary.not_permitted += refused;
                continue;
            }
            let observed = interfaces.observed_by(client.name);
            let mut client = self.client_ids(client);
            let server_nodes = joins.nodes.len();
            for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
                for bytes in wire::each(scope_spans, 2).map_while(Result::ok) {
                    let at = seen;
                    seen = seen.saturating_add(1);
                    let Ok(span) = wire::SpanRef::parse(bytes) else {
                        malformed_at.push(at);
                        request.summary.rejected += 1;
                        continue;
                    };
                    match observed {
                        Some(index) if span.kind() == SpanKind::Server as i32 => {
                            let slot = self.read(&mut request, &span);
                            match self.server_node(&interfaces, index, &span, slot) {
                                Some(node) => joins.node(node),
                                None => {
                                    joins.seen(calls::key(span.trace_id(), span.span_id()), None)
                                }
                            }
                        }
                        _ => {
                            let span = (&span, bytes, At::of(body, resource_spans, bytes));
                            self.stage(
                                &mut request,
                                &interfaces,
                                &mut client,
                                span,
                                &mut staged,
                                &mut joins,
                            );
                        }
                    }
                }
            }
            self.flush(&mut request, &mut staged);
            if observed.is_some() {
                assemble::carriers(
                    &joins.members[server_nodes..],
                    &mut joins.nodes[server_nodes..],
                );
            }
        }
        if joins.wrapping {
            assemble::wrappers(&joins.members, &mut joins.nodes);
        }
        if !joins.is_empty() {
            let body = (body, owner, &malformed_at[..]);
            self.assemble(&mut request, &interfaces, joins, body);
        } else if let Some(tags) = request.tags.as_deref_mut().filter(|t| t.withheld() > 0) {
            // A span is withheld only when it has a call to join, which assemble withholds:
            // this cannot happen. Should it, the span is still forwarded once, not lost.
            if let Some(mut outbox) = self.outbox(true) {
                self.withhold(&mut outbox, (body, &malformed_at), tags, now);
                self.outbox_gauges(&outbox);
            }
        }
        self.finish_request(transport, &request.summary, &request.events, now);
        (request.summary, malformed_at)
    }

    /// Tracks and counts one attempt as its span would be (the Gate API's observed
    /// questions), at `now`; `None` when the same span was seen before.
    pub fn observe(
        &self,
        attempt: &Attempt<'_>,
        placed: &Placed<'_>,
        client: &mut ClientIds<'_>,
        now: Nanos,
    ) -> Option<Judgement> {
        let mut events = Vec::new();
        let labels = self.labels(client, placed.group.interface, placed.interface_name);
        let obs = place::observation(placed, attempt, labels);
        let judged = self
            .tracker
            .observe(now, &obs, &attempt.operation, &mut events);
        if judged.is_none() {
            self.metrics.span_skipped("duplicate");
        }
        self.record(&events, now);
        judged
    }

    /// Records what the tracker reported at `now`: counters, and an alert for every
    /// violation.
    fn record(&self, events: &[Event], now: Nanos) {
        if self.join {
            // A first tier's replica sees a client's calls scattered by trace: it counts none.
            return;
        }
        self.metrics.record(events);
        for event in events {
            if let Some(alert) =
                crate::alert::of_event(event, now, |labels| self.metrics.label_names(labels))
            {
                self.alerter.raise(now, alert);
            }
        }
    }

    /// Extracts one span and, when it is an attempt that names no parent, places it and
    /// stages it for the tracker (which takes the staged attempts when there are [`STAGED`]
    /// of them, or the resource ends); an attempt that names a parent, or that a span of the
    /// request named as its parent, is left to be joined with its call ([`Joins`]). Reserves
    /// the span's place among the tags when asked for them.
    fn stage<'a>(
        &self,
        r: &mut RequestState<'_>,
        interfaces: &'a Interfaces,
        client: &mut ClientIds<'a>,
        (span, bytes, at): (&wire::SpanRef<'a>, &'a [u8], calls::At),
        staged: &mut Vec<Staged<'a>>,
        joins: &mut Joins<'a>,
    ) {
        let slot = self.read(r, span);
        // The span's key, made only when the calls of the request need it.
        let key = || calls::key(span.trace_id(), span.span_id());
        // Borrowed where it was built: an attempt is a few hundred bytes.
        let extracted = extract::extract(client.client, span, self.max_attributes);
        let attempt = match &extracted {
            Ok(attempt) => attempt,
            Err(skip) => {
                self.metrics.span_skipped(skip.label());
                if joins.recording {
                    joins.seen(key(), None);
                }
                return;
            }
        };
        let parent = attempt.parent_span_id;
        // An INTERNAL protocol span may wrap a CLIENT span of its call with spans in between
        // (DESIGN §12.5): a node, to be joined by time ([`assemble::wrappers`]).
        let internal = span.kind() == SpanKind::Internal as i32;
        joins.wrapping |= internal;
        if internal || !parent.is_empty() || (!joins.awaited.is_empty() && joins.awaits(&key())) {
            let parent = (!parent.is_empty()).then(|| calls::key(attempt.trace_id, parent));
            joins.node(Node {
                member: extract::call::Member {
                    attempt: attempt.clone(),
                    side: extract::call::Side::Client,
                    named: false,
                },
                key: key(),
                parent,
                carrier: None,
                slot,
                at,
            });
            return;
        }
        r.summary.attempts += 1;
        let p = self.place(interfaces, attempt, client.id);
        let labels = self.labels(client, p.group.interface, p.interface_name);
        // Its call may still be joined: one on an observed interface by its server's spans, one
        // that names no server by a request under it or a server span that places it, and any
        // that can have a part under it by that part, should it come late (SDKs end children
        // first, but exports can come out of order). Until its server's span comes, its
        // verdict is not the call's: it is withheld from forwarding (DESIGN §11.5).
        let awaits_server = interfaces.any_observed()
            && (interfaces.client_from(p.interface).is_some() || attempt.origin.is_none());
        let awaited = awaits_server || attempt.origin.is_none();
        let memory = Memory::of(awaited, attempt.family != extract::Family::Http);
        // Spans tagged upstream are forwarded as they came.
        let tag = slot
            .filter(|_| !attempt.tagged)
            .map(|at| (at, self.write_placed(r, attempt, &p)));
        let obs = place::observation(&p, attempt, labels);
        match memory {
            Some(Memory::Remembered) => {
                let facts = extract::Owned::of(attempt);
                joins.remember.push((key(), facts, obs));
            }
            Some(Memory::Recent) => {
                joins.keep_recent(key(), at, || self.calls().recent_batch());
            }
            None => {}
        }
        if joins.recording {
            let root = Root {
                bytes,
                client: client.client,
                slot,
                at,
            };
            joins.seen(key(), Some(root));
        } else {
            joins.unrecorded += 1;
        }
        staged.push(Staged {
            obs,
            operation: attempt.operation,
            tag,
            withhold: awaits_server,
        });
        if staged.len() == STAGED {
            self.flush(r, staged);
        }
    }

    /// Writes a staged attempt's tags that do not depend on the verdict (a joiner's: its
    /// client's stamp) to `r.placed`; returns where they stand.
    fn write_placed(
        &self,
        r: &mut RequestState<'_>,
        attempt: &Attempt<'_>,
        p: &Placed<'_>,
    ) -> std::ops::Range<usize> {
        use std::fmt::Write;
        let start = r.placed.len();
        if self.join {
            route::stamp(&mut r.placed, attempt.client.name, attempt.client.instance);
            return start..r.placed.len();
        }
        r.reason.clear();
        let _ = write!(r.reason, "{}", p.reason);
        let max = self.metrics.max_label_bytes();
        place::write_place_tags(&mut r.placed, &r.reason, p.interface_name, max);
        start..r.placed.len()
    }

    /// Counts a span read, and reserves its place among the tags when asked for them.
    fn read(&self, r: &mut RequestState<'_>, span: &wire::SpanRef<'_>) -> Option<usize> {
        r.summary.accepted += 1;
        if span.attribute_count() > self.max_attributes {
            r.summary.truncated += 1;
        }
        r.tags.as_deref_mut().map(SpanTags::push_span)
    }

    /// Runs the staged attempts through the tracker and fills in their tags.
    fn flush(&self, r: &mut RequestState<'_>, staged: &mut Vec<Staged<'_>>) {
        // About one event an attempt: grown a batch at a time rather than doubled from 4.
        r.events.reserve(staged.len());
        let (tags, placed, join) = (&mut r.tags, &r.placed, self.join);
        self.tracker.observe_all(
            r.now,
            staged,
            |s| (&s.obs, &s.operation),
            &mut r.events,
            |i, verdict| {
                let Some(judgement) = verdict else {
                    self.metrics.span_skipped("duplicate");
                    return;
                };
                if let (Some(tags), Some((at, range))) = (tags.as_deref_mut(), &staged[i].tag) {
                    tags.write(*at, |out| {
                        out.extend_from_slice(&placed[range.clone()]);
                        if !join {
                            place::write_verdict_tags(out, &judgement);
                        }
                    });
                    if staged[i].withhold {
                        tags.withhold(*at);
                    }
                }
            },
        );
        staged.clear();
        r.placed.clear();
    }

    /// Records what one request amounted to.
    fn finish_request(
        &self,
        transport: Transport,
        summary: &Summary,
        events: &[Event],
        now: Nanos,
    ) {
        if summary.rejected > 0 {
            self.metrics
                .refused_spans(transport, "malformed_span", summary.rejected);
        }
        if summary.not_permitted > 0 {
            self.metrics
                .refused_spans(transport, "not_permitted", summary.not_permitted);
        }
        if summary.truncated > 0 {
            self.metrics.truncated_spans(transport, summary.truncated);
        }
        self.record(events, now);
        self.metrics.accepted(transport, summary.accepted);
    }

    /// Settles pending verdicts at `now` (all of them when `force`) and records them.
    pub fn settle(&self, force: bool, now: Nanos) {
        let _settling = self.settling();
        let mut events = Vec::new();
        // Held server spans wait out their window even then: a scrape must not take a span
        // whose parent is on its way for one of its own.
        self.release_held(now, false, &mut events);
        self.record(&events, now);
        let mut record = EachShard(|events: &[Event]| self.record(events, now));
        // A client with a span held for its call keeps its pending attempts pending: that
        // span, when it is counted, may come before them (DESIGN §11: whatever the order).
        let waiting: foldhash::HashSet<u64> = if force {
            let calls = self.calls();
            calls.held_clients().map(|c| self.id(c)).collect()
        } else {
            foldhash::HashSet::default()
        };
        let waits = |client: u64| !waiting.is_empty() && waiting.contains(&client);
        self.tracker.settle_but(now, force, waits, &mut record);
        if force {
            // Nothing recently counted can be counted again now.
            self.calls().recent_settled();
        }
    }

    /// Ends a replay at `now` (its last span time): settles every verdict and judges every
    /// refusal as if the clock had run past all their windows.
    pub fn finish(&self, now: Nanos) {
        let settling = self.settling();
        let mut events = Vec::new();
        self.release_held(now, true, &mut events);
        self.record(&events, now);
        self.tracker
            .finish(&mut EachShard(|events: &[Event]| self.record(events, now)));
        drop(settling);
        self.metrics.set_tracker_keys(self.tracker.keys());
    }

    /// The periodic sweep at `now`: settles, counts honored refusals, expires keys and series.
    pub fn sweep(&self, now: Nanos) {
        let settling = self.settling();
        let mut events = Vec::new();
        self.release_held(now, false, &mut events);
        self.record(&events, now);
        self.tracker.sweep(
            now,
            &mut EachShard(|events: &[Event]| self.record(events, now)),
        );
        drop(settling);
        self.metrics.set_tracker_keys(self.tracker.keys());
        self.metrics.sweep(now / crate::clock::SECOND);
    }
}

#[cfg(test)]
mod tests;

/// Marks every span of a resource its sender may not speak for as left out of the request
/// (numbered from `seen`, as [`frame::retag`] numbers them); how many.
fn refuse_resource(resource_spans: &[u8], seen: &mut u32, left_out: &mut Vec<u32>) -> u64 {
    let mut refused = 0;
    for scope_spans in wire::each(resource_spans, 2).map_while(Result::ok) {
        for _ in wire::each(scope_spans, 2).map_while(Result::ok) {
            left_out.push(*seen);
            *seen = seen.saturating_add(1);
            refused += 1;
        }
    }
    refused
}
