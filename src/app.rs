//! The one place that wires the program: it binds every port, spawns the receivers, the
//! admin endpoint and the background tasks, supervises them, and shuts them down in stages.
//!
//! Edge. Every listener is bound before anything is spawned, so a port conflict exits
//! non-zero at once. Each stage's tasks are a `JoinSet`, stopped by one helper (`stop`).
//! Every task is meant to run until shutdown: one that ends by itself (a receiver's serve
//! loop failing, say) turns `/readyz` to 503 at once, is logged, and makes [`run`] shut down
//! in stages and return an error, so the process exits non-zero and its orchestrator
//! restarts it. Shutdown, within `service.shutdown_timeout` in all (each stage its share):
//! readiness goes false, the receivers stop accepting and finish what is in flight, the
//! tracker settles what is pending, the alerts it raised are pushed once more, the export
//! queue drains, the state file is written (one writer at a time), and the admin endpoint
//! stops last so a final scrape can still see the counts.

use crate::access::{places, Tokens};
use crate::admin;
use crate::alert;
use crate::config::Config;
use crate::config::TlsConfig;
use crate::discovery::loader::{self, Catalog, LoadOutcome, LoadReport};
use crate::export;
use crate::gate::grpc::Gate;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::receiver::{grpc, http};
use crate::serve;
use crate::tls::Tls;
use crate::tracker::Tracker;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

/// How long in-flight requests get to finish at shutdown.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// How often the sweeper settles verdicts, counts honored refusals and expires keys.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The addresses a running server listens on (useful when the configuration says port 0).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// OTLP/gRPC.
    pub grpc: SocketAddr,
    /// OTLP/HTTP.
    pub http: SocketAddr,
    /// Admin.
    pub admin: SocketAddr,
}

/// A server whose ports are bound and whose tasks run until [`Server::shutdown`].
pub struct Server {
    /// Where it listens.
    pub bound: Bound,
    pipeline: Arc<Pipeline>,
    supervisor: Supervisor,
    stop_receivers: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    /// The OTLP/gRPC and OTLP/HTTP receivers: told to stop, then drained.
    receivers: JoinSet<()>,
    /// The sweeper, the certificate reloader and the state writer: aborted.
    workers: JoinSet<()>,
    /// One task per URL document; replaced on reload.
    watchers: Mutex<JoinSet<()>>,
    /// The admin endpoint: stopped last.
    admin: JoinSet<()>,
    http_client: reqwest::Client,
    /// Pushes alerts to Alertmanager, when one is configured.
    delivery: Option<(Arc<alert::delivery::Delivery>, JoinHandle<()>)>,
    /// Forwards the tagged spans, when an exporter is configured.
    sender: Option<JoinHandle<()>>,
    /// Pushes the counters over OTLP, when `exporters.otlp_metrics` is set: its stop signal
    /// (a last push follows) and its task.
    push: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    drain_timeout: Duration,
    /// The receivers' and the admin endpoint's bearer tokens: token files are re-read on
    /// reload.
    tokens: [Arc<Tokens>; 2],
    /// The listeners' TLS settings: certificates are re-read on reload.
    tls: Vec<Arc<Tls>>,
    /// Where the tracker's state is kept, and the lock its writers take in turn.
    state_file: Option<PathBuf>,
    state_writing: Arc<Mutex<()>>,
    /// `service.shutdown_timeout`.
    shutdown_timeout: Duration,
    /// The name of every task that ended by itself, for [`run`].
    ended: Option<mpsc::UnboundedReceiver<&'static str>>,
}

/// Watches the tasks that must run until shutdown. A task that ends by itself before
/// shutdown began turns readiness false at once and is reported on `ended`.
#[derive(Clone)]
struct Supervisor {
    ready: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    ended: mpsc::UnboundedSender<&'static str>,
}

impl Supervisor {
    /// A supervisor of a process that is ready, and where the ends of its tasks are reported.
    fn new() -> (Supervisor, mpsc::UnboundedReceiver<&'static str>) {
        let (ended, ends) = mpsc::unbounded_channel();
        let supervisor = Supervisor {
            ready: Arc::new(AtomicBool::new(true)),
            stopping: Arc::new(AtomicBool::new(false)),
            ended,
        };
        (supervisor, ends)
    }

    /// `task`, named `name`, reporting its end unless shutdown began. An unbounded channel:
    /// it carries at most one message per task.
    fn watch(
        &self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let supervisor = self.clone();
        async move {
            #[cfg(debug_assertions)]
            let task = async move {
                tokio::select! {
                    () = task => {}
                    () = injected_failure(name) => {}
                }
            };
            // A task of its own, so that a panic is seen here as an end like any other;
            // aborting this one aborts it too.
            let inner = tokio::spawn(task);
            let _abort = AbortOnDrop(inner.abort_handle());
            let ended = inner.await;
            if !supervisor.stopping.load(Ordering::Acquire) {
                supervisor.ready.store(false, Ordering::Release);
                match ended {
                    Err(e) if e.is_panic() => {
                        tracing::error!(task = name, "A task panicked; not ready.")
                    }
                    _ => tracing::error!(task = name, "A task ended unexpectedly; not ready."),
                }
                let _ = supervisor.ended.send(name);
            }
        }
    }
}

/// Aborts a task when dropped: a supervised task goes with its supervisor.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Test-only fault injection, in debug builds alone: with `REFUSAL_GATE_FAIL=NAME` in the
/// environment, the task `NAME` (e.g. `OTLP/HTTP receiver`) ends half a second after it
/// started, as a failing serve loop would, so that tests can watch supervision act. Otherwise
/// it never completes.
#[cfg(debug_assertions)]
async fn injected_failure(name: &str) {
    if std::env::var("REFUSAL_GATE_FAIL").is_ok_and(|n| n == name) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// Stops a stage: its tasks (told to stop, or not) get `deadline` to end by themselves, then
/// the rest are aborted; returns how many were.
async fn stop(set: &mut JoinSet<()>, deadline: Duration) -> usize {
    let drained =
        tokio::time::timeout(deadline, async { while set.join_next().await.is_some() {} }).await;
    let aborted = if drained.is_err() { set.len() } else { 0 };
    set.abort_all();
    while set.join_next().await.is_some() {}
    aborted
}

/// Logs and counts one document load.
fn record_load(pipeline: &Pipeline, r: &LoadReport) {
    pipeline
        .metrics()
        .document_load(&r.interface, r.outcome.as_str());
    pipeline
        .catalog()
        .record_load(r, crate::clock::now() / crate::clock::SECOND);
    match (r.outcome, &r.error) {
        (LoadOutcome::Loaded, _) => {
            tracing::info!(interface = %r.interface, source = %r.source, "Discovery document loaded.")
        }
        (LoadOutcome::NotModified, _) => {}
        (LoadOutcome::Refused | LoadOutcome::RedirectRefused, Some(e)) => tracing::error!(
            interface = %r.interface, source = %r.source, error = %e,
            "Discovery document refused: a configuration error; not retried."
        ),
        (LoadOutcome::TooLarge, Some(e)) => tracing::warn!(
            interface = %r.interface, source = %r.source, error = %e,
            "Discovery document too large; the last good one stays in force."
        ),
        (LoadOutcome::Failed, Some(e)) => tracing::warn!(
            interface = %r.interface, source = %r.source, error = %e,
            "Discovery document fetch failed; retrying with backoff."
        ),
        (_, e) => tracing::error!(
            interface = %r.interface, source = %r.source, error = ?e,
            "Discovery document invalid; the last good one stays in force."
        ),
    }
}

/// The three listeners (gRPC, HTTP, admin) as configured, their connection caps fitted
/// under the descriptor limit (raised to the hard one first); TLS is added by the caller.
fn listeners(config: &Config, [grpc, http, admin]: [TcpListener; 3]) -> [serve::Listener; 3] {
    let (g, h, a) = (
        &config.receivers.otlp.grpc,
        &config.receivers.otlp.http,
        &config.admin,
    );
    let mut caps = [g.max_connections, h.max_connections, a.max_connections];
    let descriptors = serve::raise_descriptor_limit();
    if serve::fit_connection_caps(&mut caps, descriptors) {
        tracing::warn!(
            open_files_limit = descriptors,
            grpc = caps[0],
            http = caps[1],
            admin = caps[2],
            "The listeners' max_connections do not fit under the open files limit; lowered."
        );
    }
    let http1 = |name, tcp, max_connections, header: Duration, read, idle| serve::Listener {
        name,
        tcp,
        tls: None,
        protocol: serve::Protocol::Http1,
        limits: serve::Limits {
            max_connections,
            read_header_timeout: header,
            read_timeout: read,
            idle_timeout: idle,
        },
    };
    [
        serve::Listener {
            name: "grpc",
            tcp: grpc,
            tls: None,
            protocol: serve::Protocol::Http2 {
                max_concurrent_streams: g.max_concurrent_streams,
                keepalive_time: g.keepalive_time,
                keepalive_timeout: g.keepalive_timeout,
            },
            limits: serve::Limits {
                max_connections: caps[0],
                read_header_timeout: Duration::ZERO,
                read_timeout: g.read_timeout,
                idle_timeout: g.idle_timeout,
            },
        },
        http1(
            "http",
            http,
            caps[1],
            h.read_header_timeout,
            h.read_timeout,
            h.idle_timeout,
        ),
        http1(
            "admin",
            admin,
            caps[2],
            a.read_header_timeout,
            a.read_timeout,
            a.idle_timeout,
        ),
    ]
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for {what}"))
}

/// Reads the state file at `path`; a missing file is a first start, an unusable one is
/// reported and ignored.
fn read_state(path: &std::path::Path) -> Option<crate::state::State> {
    let stale = crate::state::remove_stale_temporaries(path);
    if stale > 0 {
        tracing::info!(
            stale,
            "Removed the temporary files of unfinished state writes."
        );
    }
    if !path.exists() {
        tracing::info!(path = %path.display(), "No state file yet; the tracker starts empty.");
        return None;
    }
    match crate::state::read(path) {
        Ok(state) => Some(state),
        Err(e @ crate::state::StateError::Io { .. }) => {
            tracing::warn!(path = %path.display(), error = %e, "State file ignored; the tracker starts empty.");
            None
        }
        Err(e) => {
            // Set aside, never overwritten by the next write: another version's file is a
            // newer release's state, which a rollback must not lose.
            let aside = crate::state::aside_path(path, crate::clock::now() / crate::clock::SECOND);
            match std::fs::rename(path, &aside) {
                Ok(()) => tracing::warn!(
                    path = %path.display(), error = %e, aside = %aside.display(),
                    "State file unusable; set aside, and the tracker starts empty."
                ),
                Err(rename) => tracing::warn!(
                    path = %path.display(), error = %e, %rename,
                    "State file unusable and could not be set aside; the tracker starts empty."
                ),
            }
            None
        }
    }
}

/// Writes the tracker's state to `path`; a failure is logged (the next write may succeed).
/// One write at a time, whoever asks (`writing`): the last one at shutdown waits for a
/// periodic one still running (its blocking thread is not cancelled with its task).
fn write_state(pipeline: &Pipeline, path: &std::path::Path, writing: &Mutex<()>) {
    let _one = writing.lock().unwrap_or_else(PoisonError::into_inner);
    let started = std::time::Instant::now();
    let state = crate::state::snapshot(pipeline, crate::clock::now());
    let groups = state.groups.len();
    match crate::state::write(path, &state) {
        Ok(()) => tracing::debug!(
            path = %path.display(), groups, took_ms = started.elapsed().as_millis() as u64,
            "State file written."
        ),
        Err(e) => tracing::error!(error = %e, "Could not write the state file."),
    }
}

/// Writes the state file every `every`, off the async workers.
async fn write_state_every(
    pipeline: Arc<Pipeline>,
    path: PathBuf,
    every: Duration,
    writing: Arc<Mutex<()>>,
) {
    loop {
        tokio::time::sleep(every).await;
        let (pipeline, path, writing) = (Arc::clone(&pipeline), path.clone(), Arc::clone(&writing));
        let _ = tokio::task::spawn_blocking(move || write_state(&pipeline, &path, &writing)).await;
    }
}

/// What each stage of a stop may take of `service.shutdown_timeout`, in the order they run:
/// the receivers' drain, the last alerts, the export queue's drain; the state file gets what
/// is left (at least three eighths), and the admin endpoint a second after it.
struct Shares {
    receivers: Duration,
    alerts: Duration,
    export: Duration,
}

impl Shares {
    fn of(total: Duration, export_drain: Duration) -> Shares {
        Shares {
            receivers: DRAIN_DEADLINE.min(total / 4),
            alerts: DRAIN_DEADLINE.min(total / 8),
            export: export_drain.min(total / 4),
        }
    }
}

/// Checks the certificate files every `reload_interval` (the shortest configured) and
/// reloads those that changed.
async fn reload_tls_files(tls: Vec<Arc<Tls>>) {
    let Some(every) = tls
        .iter()
        .map(|t| t.reload_interval())
        .filter(|d| !d.is_zero())
        .min()
    else {
        // Nothing to reload on a timer (SIGHUP still does): wait for shutdown.
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(every).await;
        for t in tls.iter().filter(|t| !t.reload_interval().is_zero()) {
            match t.reload_if_changed() {
                Ok(true) => tracing::info!("TLS certificate files changed; reloaded."),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificates not reloaded; the previous ones stay in force.")
                }
            }
        }
    }
}

/// Every port bound, with its TLS and the tokens its requests must carry.
struct Ports {
    /// OTLP/gRPC, OTLP/HTTP, admin.
    listeners: [serve::Listener; 3],
    tls: [Option<Arc<Tls>>; 3],
    receiver_tokens: Arc<Tokens>,
    admin_tokens: Arc<Tokens>,
    bound: Bound,
}

impl Ports {
    /// Reads the TLS files and tokens, then binds the three ports.
    async fn open(config: &Config) -> anyhow::Result<Ports> {
        let load_tls = |c: &Option<TlsConfig>, what: &str, alpn: &[&[u8]]| {
            c.as_ref()
                .map(|c| {
                    Tls::load(c, &config.base_dir, alpn)
                        .map(Arc::new)
                        .map_err(|e| anyhow::anyhow!("{what}.tls: {e}"))
                })
                .transpose()
        };
        // gRPC needs HTTP/2; the HTTP receiver and the admin endpoint speak HTTP/1.1.
        let tls = [
            load_tls(
                &config.receivers.otlp.grpc.tls,
                "receivers.otlp.grpc",
                &[b"h2"],
            )?,
            load_tls(
                &config.receivers.otlp.http.tls,
                "receivers.otlp.http",
                &[b"http/1.1"],
            )?,
            load_tls(&config.admin.tls, "admin", &[b"http/1.1"])?,
        ];
        let receiver_tokens = Arc::new(
            Tokens::load(&config.receivers.otlp.auth, &config.base_dir)
                .map_err(|e| anyhow::anyhow!("receivers.otlp.auth: {e}"))?,
        );
        let admin_tokens = Arc::new(
            Tokens::load(&config.admin.auth, &config.base_dir)
                .map_err(|e| anyhow::anyhow!("admin.auth: {e}"))?,
        );
        let grpc_listener = bind(config.receivers.otlp.grpc.endpoint, "OTLP/gRPC").await?;
        let http_listener = bind(config.receivers.otlp.http.endpoint, "OTLP/HTTP").await?;
        let admin_listener = bind(config.admin.endpoint, "admin").await?;
        let mut listeners = listeners(config, [grpc_listener, http_listener, admin_listener]);
        for (l, tls) in listeners.iter_mut().zip(&tls) {
            l.tls = tls.clone();
        }
        let bound = Bound {
            grpc: listeners[0].tcp.local_addr()?,
            http: listeners[1].tcp.local_addr()?,
            admin: listeners[2].tcp.local_addr()?,
        };
        Ok(Ports {
            listeners,
            tls,
            receiver_tokens,
            admin_tokens,
            bound,
        })
    }
}

/// The pipeline made from the configuration (its state restored), and the clients its
/// tasks send with.
struct Made {
    pipeline: Arc<Pipeline>,
    downstream: Option<export::Downstream>,
    pusher: Option<crate::push::Pusher>,
    state_file: Option<std::path::PathBuf>,
    /// For discovery documents and alert delivery.
    http_client: reqwest::Client,
}

impl Made {
    /// Loads the local documents, makes the pipeline and its exporters, and restores the
    /// state file.
    fn new(config: &Config) -> anyhow::Result<Made> {
        let (interfaces, documents, reports) = loader::load_local(config);
        let mut pipeline = Pipeline::new(
            Arc::new(Catalog::new(interfaces, documents)),
            Tracker::new(&config.tracker),
            Metrics::new(&config.metrics),
            &config.alerting,
        )
        .with_max_attributes(config.receivers.otlp.max_attributes_per_span)
        .with_role(config.tracker.role);
        let downstream = match &config.exporters.otlp {
            Some(otlp) => {
                pipeline = pipeline.with_exporter(otlp);
                Some(
                    export::Downstream::new(otlp, &config.base_dir).with_context(|| {
                        format!("cannot set up the exporter to {}", otlp.endpoint)
                    })?,
                )
            }
            None => None,
        };
        let pusher = match &config.exporters.otlp_metrics {
            Some(push) => Some(
                crate::push::Pusher::new(push, &config.base_dir).with_context(|| {
                    format!(
                        "cannot set up the OTLP metrics exporter to {}",
                        push.endpoint
                    )
                })?,
            ),
            None => None,
        };
        let state_file = config
            .tracker
            .state_file
            .as_ref()
            .map(|f| config.base_dir.join(f));
        let reading = std::time::Instant::now();
        let restored = state_file.as_deref().and_then(read_state);
        if let Some(state) = &restored {
            pipeline = pipeline.with_seed(state.seed);
        }
        let pipeline = Arc::new(pipeline);
        if let Some(state) = restored {
            let keys = crate::state::restore(&pipeline, state);
            let took_ms = reading.elapsed().as_millis() as u64;
            tracing::info!(keys, took_ms, "Tracker state restored from the state file.");
        }
        for report in &reports {
            record_load(&pipeline, report);
        }
        let http_client = loader::http_client()
            .context("cannot build the HTTP client for discovery documents")?;
        Ok(Made {
            pipeline,
            downstream,
            pusher,
            state_file,
            http_client,
        })
    }
}

/// Spawns the OTLP/gRPC receiver (with the Gate API beside it) and the OTLP/HTTP receiver on
/// their listeners, each stopped by `stop`.
fn spawn_receivers(
    config: &Config,
    (pipeline, tokens, supervisor): (&Arc<Pipeline>, &Arc<Tokens>, &Supervisor),
    [(grpc_listener, grpc_metrics), (http_listener, http_metrics)]: [(serve::Listener, crate::metrics::ListenerMetrics);
        2],
    rx_stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    let mib = |n: u64| usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let receiver_tokens = tokens;
    let otlp = &config.receivers.otlp;
    let mut receivers = JoinSet::new();
    let trace_service = grpc::TraceService::new(
        Arc::clone(pipeline),
        mib(config.receivers.otlp.grpc.max_recv_msg_size_mib),
        Arc::clone(receiver_tokens),
        places(otlp.grpc.max_concurrent_requests, otlp.grpc.max_reading_mib),
    );
    let grpc_routes = tonic::service::Routes::new(trace_service)
        .add_service(Gate::server(
            Arc::clone(pipeline),
            Arc::clone(receiver_tokens),
            rx_stop.clone(),
            mib(config.receivers.otlp.grpc.max_recv_msg_size_mib),
        ))
        .prepare();
    receivers.spawn(supervisor.watch(
        "OTLP/gRPC receiver",
        serve::serve(grpc_listener, grpc_routes, grpc_metrics, rx_stop.clone()),
    ));

    let http_router = http::router(
        Arc::clone(pipeline),
        mib(config.receivers.otlp.http.max_request_body_size_mib),
        Arc::clone(receiver_tokens),
        places(otlp.http.max_concurrent_requests, otlp.http.max_reading_mib),
    );
    receivers.spawn(supervisor.watch(
        "OTLP/HTTP receiver",
        serve::serve(http_listener, http_router, http_metrics, rx_stop),
    ));
    receivers
}

/// Spawns the delivery of alerts to Alertmanager, when one is configured; the alerts'
/// `generatorURL` is the admin endpoint's alert list.
#[allow(clippy::type_complexity)]
fn spawn_delivery(
    config: &Config,
    (pipeline, supervisor): (&Arc<Pipeline>, &Supervisor),
    http_client: &reqwest::Client,
    bound: &Bound,
) -> Option<(Arc<alert::delivery::Delivery>, tokio::task::JoinHandle<()>)> {
    config.alerting.alertmanager.as_ref().map(|am| {
        let delivery = Arc::new(alert::delivery::Delivery::new(
            Arc::clone(pipeline.alerter()),
            http_client.clone(),
            am,
            format!("http://{}/api/v1/alerts", bound.admin),
        ));
        let task = tokio::spawn(supervisor.watch("alert delivery", Arc::clone(&delivery).run()));
        (delivery, task)
    })
}

/// A set of one task, `what`, watched by the supervisor.
fn spawn_one(
    supervisor: &Supervisor,
    what: &'static str,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    set.spawn(supervisor.watch(what, task));
    set
}

/// Spawns the background workers: the certificate reloader, the state writer (when a state
/// file is kept, every `state_interval`) and the sweeper.
fn spawn_workers(
    config: &Config,
    (pipeline, supervisor): (&Arc<Pipeline>, &Supervisor),
    tls: Vec<Arc<Tls>>,
    (state_file, state_writing): (Option<std::path::PathBuf>, Arc<Mutex<()>>),
) -> JoinSet<()> {
    let mut workers = JoinSet::new();
    workers.spawn(supervisor.watch("certificate reloader", reload_tls_files(tls.clone())));
    if let Some(path) = state_file {
        let every = config.tracker.state_interval;
        if !every.is_zero() {
            let pipeline = Arc::clone(pipeline);
            workers.spawn(supervisor.watch(
                "state writer",
                write_state_every(pipeline, path, every, Arc::clone(&state_writing)),
            ));
        }
    }
    let sweep_pipeline = Arc::clone(pipeline);
    workers.spawn(supervisor.watch("sweeper", async move {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // On the blocking pool: the sweep waits for the held calls' lock, which a large
            // request's join may hold, and an async worker must not wait there.
            let pipeline = Arc::clone(&sweep_pipeline);
            let _ = tokio::task::spawn_blocking(move || pipeline.sweep(crate::clock::now())).await;
        }
    }));
    workers
}

impl Server {
    /// Binds every port, then starts serving.
    ///
    /// # Errors
    /// When a port cannot be bound; nothing has been spawned then.
    pub async fn start(config: &Config) -> anyhow::Result<Server> {
        let Ports {
            listeners: [grpc_listener, http_listener, admin_listener],
            tls,
            receiver_tokens,
            admin_tokens,
            bound,
        } = Ports::open(config).await?;
        let Made {
            pipeline,
            downstream,
            pusher,
            state_file,
            http_client,
        } = Made::new(config)?;
        let (supervisor, ended) = Supervisor::new();
        let ready = Arc::clone(&supervisor.ready);
        let (stop_receivers, rx_stop) = watch::channel(false);
        let (stop_admin, admin_stop) = watch::channel(false);
        let [grpc_metrics, http_metrics, admin_metrics] =
            [&grpc_listener, &http_listener, &admin_listener]
                .map(|l| pipeline.metrics().listener(l.name, l.tls.is_some()));
        let receivers = spawn_receivers(
            config,
            (&pipeline, &receiver_tokens, &supervisor),
            [(grpc_listener, grpc_metrics), (http_listener, http_metrics)],
            rx_stop,
        );
        let admin_router = admin::router(
            Arc::clone(&pipeline),
            Arc::clone(&ready),
            Arc::clone(&admin_tokens),
            admin_stop.clone(),
            config.admin.ui.trace_url.clone(),
        );
        let admin = spawn_one(
            &supervisor,
            "admin endpoint",
            serve::serve(admin_listener, admin_router, admin_metrics, admin_stop),
        );
        let tls: Vec<Arc<Tls>> = tls.into_iter().flatten().collect();
        let state_writing = Arc::new(Mutex::new(()));
        let workers = spawn_workers(
            config,
            (&pipeline, &supervisor),
            tls.clone(),
            (state_file.clone(), Arc::clone(&state_writing)),
        );

        tracing::info!(
            grpc = %bound.grpc, http = %bound.http, admin = %bound.admin,
            interfaces = pipeline.catalog().current().len(),
            "refusal-gate is serving."
        );
        let sender =
            pipeline
                .exporter()
                .map(Arc::clone)
                .zip(downstream)
                .map(|(exporter, downstream)| {
                    tokio::spawn(
                        supervisor.watch("exporter", async move { exporter.run(downstream).await }),
                    )
                });
        let (stop_push, push_stop) = watch::channel(false);
        let push = pusher.map(|pusher| {
            let task = pusher.run(Arc::clone(&pipeline), push_stop);
            tokio::spawn(supervisor.watch("metrics push", task))
        });
        let delivery = spawn_delivery(config, (&pipeline, &supervisor), &http_client, &bound);
        let server = Server {
            bound,
            pipeline,
            supervisor,
            stop_receivers,
            stop_admin,
            receivers,
            workers,
            watchers: Mutex::new(JoinSet::new()),
            admin,
            http_client,
            delivery,
            sender,
            push: push.map(|task| (stop_push, task)),
            drain_timeout: config
                .exporters
                .otlp
                .as_ref()
                .map_or(DRAIN_DEADLINE, |o| o.drain_timeout),
            tokens: [receiver_tokens, admin_tokens],
            tls,
            state_file,
            state_writing,
            shutdown_timeout: config.service.shutdown_timeout,
            ended: Some(ended),
        };
        server.start_watchers();
        Ok(server)
    }

    /// The pipeline (for tests and tools that want to look inside).
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// Starts one task per URL document, stopping those that ran before.
    fn start_watchers(&self) {
        let catalog = Arc::clone(self.pipeline.catalog());
        let pipeline = Arc::clone(&self.pipeline);
        let report: Arc<dyn Fn(&LoadReport) + Send + Sync> =
            Arc::new(move |r: &LoadReport| record_load(&pipeline, r));
        let mut fresh = JoinSet::new();
        for (name, source) in catalog.url_documents() {
            fresh.spawn(self.supervisor.watch(
                "discovery document watcher",
                loader::watch(
                    Arc::clone(&catalog),
                    self.http_client.clone(),
                    name,
                    source,
                    Arc::clone(&report),
                ),
            ));
        }
        let mut old = std::mem::replace(
            &mut *self.watchers.lock().unwrap_or_else(PoisonError::into_inner),
            fresh,
        );
        // Aborted, they report nothing: the supervisor sees only tasks that end by themselves.
        old.abort_all();
    }

    /// The name of the first task that ended by itself (its end turned readiness false):
    /// what [`run`] waits for beside the signals. Once only; later calls wait forever.
    pub async fn ended(&mut self) -> &'static str {
        match self.ended.as_mut() {
            Some(ended) => match ended.recv().await {
                Some(name) => name,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Reloads the interfaces and their documents from `config` (what SIGHUP does), and
    /// re-reads the token files and TLS certificate files of the running configuration. The
    /// tracker's state is kept: earlier refusals are still remembered. Other keys (ports,
    /// limits) need a restart.
    pub fn reload(&self, config: &Config) {
        for (tokens, what) in self
            .tokens
            .iter()
            .zip(["receivers.otlp.auth", "admin.auth"])
        {
            if let Err(e) = tokens.reload() {
                tracing::error!(error = %e, "{what}: token files not reloaded; the previous tokens stay in force.");
            }
        }
        for tls in &self.tls {
            match tls.reload() {
                Ok(()) => tracing::info!("TLS certificates reloaded."),
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificates not reloaded; the previous ones stay in force.")
                }
            }
        }
        let (interfaces, documents, reports) = loader::load_local(config);
        for report in &reports {
            record_load(&self.pipeline, report);
        }
        let count = interfaces.len();
        self.pipeline.catalog().replace(interfaces, documents);
        self.start_watchers();
        tracing::info!(interfaces = count, "Interfaces reloaded.");
    }

    /// Stops in stages, within `service.shutdown_timeout` in all: the receivers (drained
    /// within their share), the tracker's last settlement, the last alerts and the export
    /// queue (each within its share), then the state file (within what is left: a write
    /// still running then is abandoned, and the previous file stays whole; `main` ends the
    /// runtime without waiting for it), then the last OTLP metrics push (within its own
    /// `timeout` and what is left), then the admin endpoint.
    pub async fn shutdown(mut self) {
        let started = tokio::time::Instant::now();
        let deadline = started + self.shutdown_timeout;
        let shares = Shares::of(self.shutdown_timeout, self.drain_timeout);
        self.supervisor.stopping.store(true, Ordering::Release);
        self.supervisor.ready.store(false, Ordering::Release);
        let _ = self.stop_receivers.send(true);
        if stop(&mut self.receivers, shares.receivers).await > 0 {
            tracing::warn!("A receiver did not drain in time; its connections were closed.");
        }
        stop(&mut self.workers, Duration::ZERO).await;
        let mut watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(PoisonError::into_inner));
        stop(&mut watchers, Duration::ZERO).await;
        self.pipeline.settle(true, crate::clock::now());
        // The spans withheld for their call's verdict leave now, those without one untagged.
        self.pipeline.forward_withheld(crate::clock::now());
        if let Some((delivery, task)) = self.delivery.take() {
            if !delivery.drain(task, shares.alerts).await {
                tracing::warn!("The last alerts could not be delivered in time.");
            }
        }
        if let (Some(task), Some(exporter)) = (self.sender.take(), self.pipeline.exporter()) {
            let undelivered = exporter.drain(task, shares.export).await;
            if undelivered > 0 {
                tracing::warn!(
                    undelivered,
                    "Spans could not be forwarded before the drain deadline."
                );
            }
        }
        if let Some(path) = self.state_file.clone() {
            let (pipeline, writing) = (Arc::clone(&self.pipeline), Arc::clone(&self.state_writing));
            let write =
                tokio::task::spawn_blocking(move || write_state(&pipeline, &path, &writing));
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if tokio::time::timeout(left, write).await.is_err() {
                tracing::error!(
                    "The state file could not be written before service.shutdown_timeout; the previous one stays."
                );
            }
        }
        if let Some((stop, task)) = self.push.take() {
            // One last push, within what is left (its own timeout bounds it too), once the
            // state is safe: a receiver that does not answer costs the last counts, never the
            // state file.
            let _ = stop.send(true);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if tokio::time::timeout(left, task).await.is_err() {
                tracing::warn!("The last OTLP metrics push did not finish in time.");
            }
        }
        let _ = self.stop_admin.send(true);
        stop(&mut self.admin, Duration::from_secs(1)).await;
        tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "refusal-gate stopped."
        );
    }
}

/// Serves until SIGTERM or SIGINT, then shuts down. SIGHUP reloads the interfaces from
/// `path` (when serving from a file); an invalid file is reported and the old one kept.
///
/// # Errors
/// When a port cannot be bound or the signal handlers cannot be installed.
pub async fn run(config: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // The handlers first: a signal that arrives once the admin port answers (an orchestrator
    // may send one as soon as the process looks healthy) must not find the default action.
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    let mut server = Server::start(&config).await?;
    let mut ended = server.ended.take();
    let failed = loop {
        tokio::select! {
            _ = term.recv() => {
                tracing::info!(signal = "SIGTERM", "Shutting down.");
                break None;
            }
            _ = int.recv() => {
                tracing::info!(signal = "SIGINT", "Shutting down.");
                break None;
            }
            Some(task) = async { ended.as_mut()?.recv().await } => {
                tracing::error!(task, "Shutting down: a task ended unexpectedly.");
                break Some(task);
            }
            _ = hup.recv() => match &path {
                None => tracing::warn!(signal = "SIGHUP", "No configuration file to reload."),
                Some(p) => match Config::load(p) {
                    Ok(fresh) => server.reload(&fresh),
                    Err(e) => tracing::error!(error = %e, "Reload refused; the running configuration stays."),
                },
            },
        }
    };
    server.shutdown().await;
    match failed {
        None => Ok(()),
        Some(task) => Err(anyhow::anyhow!("the {task} ended unexpectedly")),
    }
}
