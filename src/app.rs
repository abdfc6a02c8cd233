//! The one place that wires the program: it binds every port, spawns the receivers, the
//! admin endpoint and the sweeper, and shuts them down in stages.
//!
//! Edge. Every listener is bound before anything is spawned, so a port conflict exits
//! non-zero at once. Shutdown: readiness goes false, the receivers stop accepting and finish
//! what is in flight (deadline [`DRAIN_DEADLINE`]), the tracker settles what is pending, and
//! the admin endpoint stops last so a final scrape can still see the counts.

use crate::admin;
use crate::config::Config;
use crate::discovery::Interfaces;
use crate::metrics::Metrics;
use crate::receiver::{grpc, http, Pipeline};
use crate::tracker::Tracker;
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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
    ready: Arc<AtomicBool>,
    stop_receivers: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    receivers: Vec<JoinHandle<()>>,
    admin: JoinHandle<()>,
    sweeper: JoinHandle<()>,
}

async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for {what}"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone: stop as well.
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Server {
    /// Binds every port, then starts serving.
    ///
    /// # Errors
    /// When a port cannot be bound; nothing has been spawned then.
    pub async fn start(config: &Config) -> anyhow::Result<Server> {
        let grpc_listener = bind(config.receivers.otlp.grpc.endpoint, "OTLP/gRPC").await?;
        let http_listener = bind(config.receivers.otlp.http.endpoint, "OTLP/HTTP").await?;
        let admin_listener = bind(config.admin.endpoint, "admin").await?;
        let bound = Bound {
            grpc: grpc_listener.local_addr()?,
            http: http_listener.local_addr()?,
            admin: admin_listener.local_addr()?,
        };

        let pipeline = Arc::new(Pipeline::new(
            Interfaces::new(&config.interfaces),
            Tracker::new(&config.tracker),
            Metrics::new(&config.metrics),
        ));
        let ready = Arc::new(AtomicBool::new(true));
        let (stop_receivers, rx_stop) = watch::channel(false);
        let (stop_admin, admin_stop) = watch::channel(false);
        let mib = |n: u64| usize::try_from(n.saturating_mul(1 << 20)).unwrap_or(usize::MAX);

        let trace_service = grpc::TraceService::new(
            Arc::clone(&pipeline),
            mib(config.receivers.otlp.grpc.max_recv_msg_size_mib),
        );
        let grpc_stop = stopped(rx_stop.clone());
        let grpc_task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(grpc_listener);
            let result = tonic::transport::Server::builder()
                .add_service(trace_service)
                .serve_with_incoming_shutdown(incoming, grpc_stop)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "OTLP/gRPC receiver failed.");
            }
        });

        let http_router = http::router(
            Arc::clone(&pipeline),
            mib(config.receivers.otlp.http.max_request_body_size_mib),
        );
        let http_stop = stopped(rx_stop);
        let http_task = tokio::spawn(async move {
            let result = axum::serve(http_listener, http_router)
                .with_graceful_shutdown(http_stop)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "OTLP/HTTP receiver failed.");
            }
        });

        let admin_router = admin::router(Arc::clone(&pipeline), Arc::clone(&ready));
        let admin_task = tokio::spawn(async move {
            let result = axum::serve(admin_listener, admin_router)
                .with_graceful_shutdown(stopped(admin_stop))
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "Admin endpoint failed.");
            }
        });

        let sweep_pipeline = Arc::clone(&pipeline);
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                sweep_pipeline.sweep();
            }
        });

        tracing::info!(
            grpc = %bound.grpc, http = %bound.http, admin = %bound.admin,
            interfaces = config.interfaces.len(),
            "refusal-gate is serving."
        );
        Ok(Server {
            bound,
            pipeline,
            ready,
            stop_receivers,
            stop_admin,
            receivers: vec![grpc_task, http_task],
            admin: admin_task,
            sweeper,
        })
    }

    /// Stops in stages: receivers (drained within [`DRAIN_DEADLINE`]), then the tracker's
    /// last settlement, then the admin endpoint.
    pub async fn shutdown(self) {
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.stop_receivers.send(true);
        for task in self.receivers {
            let abort = task.abort_handle();
            if tokio::time::timeout(DRAIN_DEADLINE, task).await.is_err() {
                tracing::warn!("A receiver did not drain in time; its connections were closed.");
                abort.abort();
            }
        }
        self.sweeper.abort();
        self.pipeline.settle(true);
        let _ = self.stop_admin.send(true);
        let abort = self.admin.abort_handle();
        if tokio::time::timeout(DRAIN_DEADLINE, self.admin)
            .await
            .is_err()
        {
            abort.abort();
        }
        tracing::info!("refusal-gate stopped.");
    }
}

/// Serves until SIGTERM or SIGINT, then shuts down.
///
/// # Errors
/// When a port cannot be bound or the signal handlers cannot be installed.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let server = Server::start(&config).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "Shutting down."),
        _ = tokio::signal::ctrl_c() => tracing::info!(signal = "SIGINT", "Shutting down."),
    }
    server.shutdown().await;
    Ok(())
}
