//! The life of every connection on the three listeners (OTLP/gRPC, OTLP/HTTP, admin): the
//! accept loop, TLS, HTTP/1 or HTTP/2, and the limits that keep slow, idle and too many
//! clients from taking the server down.
//!
//! Edge. One accept loop per listener. Past `max_connections` a new connection is accepted
//! and closed at once (counted), so that descriptors never run out and the loop never spins
//! on them; an accept error (out of descriptors, say) backs off from 5 ms to 1 s instead.
//! Each connection runs in a task of its own — its TLS handshake too — with a watchdog that
//! knows how many requests are in flight on it:
//! - HTTP/1: a request's headers must all arrive within `read_header_timeout` of their first
//!   byte (of the connection's opening, for the first request), or the connection is closed;
//! - a connection with no request in flight for `idle_timeout` is shut down gracefully
//!   (HTTP/2: GOAWAY first), as the Collector's `idle_timeout` and gRPC's
//!   `max_connection_idle` do;
//! - a request's body must arrive within `read_timeout` of its headers: past it, reading the
//!   body fails, and the handler answers (408, `DEADLINE_EXCEEDED`) and frees its
//!   concurrency slot. [`ReadDeadline`], in every request's extensions, tells a handler that
//!   this is why.
//!
//! Each firing is counted in `refusal_gate_listener_limits_total{listener, limit}` under the
//! setting's own name. On stop the listener closes and every connection is shut down
//! gracefully. [`raise_descriptor_limit`] and [`fit_connection_caps`] keep the caps below
//! the process's descriptor limit.

use crate::metrics::ListenerMetrics;
use crate::tls::Tls;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a listener's connections are limited; each field is the configuration key of the
/// same name. A zero duration turns that timeout off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// HTTP/1: from a request's first byte to its last header.
    pub read_header_timeout: Duration,
    /// From a request's headers to the end of its body.
    pub read_timeout: Duration,
    /// With no request in flight, before the connection is shut down.
    pub idle_timeout: Duration,
}

/// The protocol a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 (OTLP/HTTP, admin).
    Http1,
    /// HTTP/2 only (gRPC).
    Http2 {
        /// Streams a client may open at once on one connection.
        max_concurrent_streams: u32,
        /// How often the connection is pinged (zero: never).
        keepalive_time: Duration,
        /// How long a ping may go unanswered.
        keepalive_timeout: Duration,
    },
}

/// One bound listener and how to serve it.
pub struct Listener {
    /// `grpc`, `http` or `admin`: the `listener` label of its metrics, and in its logs.
    pub name: &'static str,
    /// The bound socket.
    pub tcp: TcpListener,
    /// Serve TLS (and mTLS) when given.
    pub tls: Option<Arc<Tls>>,
    /// What it speaks.
    pub protocol: Protocol,
    /// Its limits.
    pub limits: Limits,
}

/// When a request's body must have arrived by, in the extensions of every request of a
/// listener with a `read_timeout`: a handler whose body failed asks it whether the deadline
/// is why.
#[derive(Debug, Clone, Copy)]
pub struct ReadDeadline {
    at: Instant,
    after: Duration,
}

impl ReadDeadline {
    /// The deadline has passed.
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The listener's `read_timeout`.
    pub fn timeout(&self) -> Duration {
        self.after
    }
}

/// The error a request body fails with when its `read_timeout` passes.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request's body did not arrive within {0:?} of its headers")]
pub struct ReadTimeout(pub Duration);

/// Descriptors left to everything but the listeners' connections (files, the exporter's and
/// discovery's connections, the runtime's own) when the caps are fitted under the limit.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Raises the soft limit on open descriptors to the hard one, as Go's runtime does for the
/// Collector; returns the soft limit in force afterwards (`None`: unlimited).
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    match (limit.current, limit.maximum) {
        (Some(soft), Some(hard)) if soft < hard => {
            let raised = Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => {
                    tracing::debug!(from = soft, to = hard, "Raised the open files limit.");
                    Some(hard)
                }
                Err(e) => {
                    tracing::warn!(soft, hard, error = %e, "Cannot raise the open files limit.");
                    Some(soft)
                }
            }
        }
        (soft, _) => soft,
    }
}

/// Fits the listeners' connection caps under a descriptor `limit`, keeping
/// [`RESERVED_DESCRIPTORS`] (at most half the limit) for the rest: caps that do not fit are
/// scaled down in proportion. Returns whether any was.
pub fn fit_connection_caps(caps: &mut [usize], limit: Option<u64>) -> bool {
    let Some(limit) = limit else { return false };
    let budget = limit - RESERVED_DESCRIPTORS.min(limit / 2);
    let total: u64 = caps.iter().map(|&c| c as u64).sum();
    if total <= budget {
        return false;
    }
    for cap in caps.iter_mut() {
        let share = (*cap as u64).saturating_mul(budget) / total;
        *cap = usize::try_from(share).unwrap_or(usize::MAX).max(1);
    }
    true
}

/// How long an accept error backs off, first and at most.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));
/// How often a limit that keeps firing is logged, per listener.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How long a connection shut down for being idle has to finish closing.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The largest HTTP/2 frame a client may send (`SETTINGS_MAX_FRAME_SIZE`; HTTP/2's default is
/// 16 KiB, its least). An export of a few hundred spans comes in one or two DATA frames rather
/// than one each 16 KiB: fewer frames read, buffered and copied a request, 2.5 to 6 % less CPU
/// a span over OTLP/gRPC (benches/e2e.sh, two runs). What a client may send unread stays bounded by the
/// flow-control windows (hyper's 1 MiB), not by the frame.
pub const MAX_FRAME_BYTES: u32 = 64 * 1024;

/// hyper's connection builder for a listener's protocol: HTTP/1.1, or HTTP/2.
fn builders(
    protocol: Protocol,
) -> (
    Option<http1::Builder>,
    Option<http2::Builder<TokioExecutor>>,
) {
    match protocol {
        Protocol::Http1 => {
            let mut builder = http1::Builder::new();
            // The watchdog times headers, from their first byte rather than from the end
            // of the previous response as hyper's own timer would.
            builder.keep_alive(true).header_read_timeout(None);
            (Some(builder), None)
        }
        Protocol::Http2 {
            max_concurrent_streams,
            keepalive_time,
            keepalive_timeout,
        } => {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .max_frame_size(MAX_FRAME_BYTES)
                .max_concurrent_streams(max_concurrent_streams)
                .keep_alive_interval((!keepalive_time.is_zero()).then_some(keepalive_time))
                .keep_alive_timeout(keepalive_timeout);
            (None, Some(builder))
        }
    }
}

/// What every connection of a listener shares.
struct Shared<S> {
    name: &'static str,
    service: S,
    tls: Option<Arc<Tls>>,
    limits: Limits,
    metrics: ListenerMetrics,
    http1: Option<http1::Builder>,
    http2: Option<http2::Builder<TokioExecutor>>,
}

/// Serves `listener` with `service` until `stop` turns true, then shuts every connection
/// down gracefully and returns when the last has closed.
pub async fn serve<S, B>(
    listener: Listener,
    service: S,
    metrics: ListenerMetrics,
    mut stop: watch::Receiver<bool>,
) where
    S: tower_service::Service<Request<TimedBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Listener {
        name,
        tcp,
        tls,
        protocol,
        limits,
    } = listener;
    let (h1, h2) = builders(protocol);
    let shared = Arc::new(Shared {
        name,
        service,
        tls,
        limits,
        metrics,
        http1: h1,
        http2: h2,
    });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut backoff = Duration::ZERO;
    let mut warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => break,
            accepted = tcp.accept() => accepted,
        };
        while connections.try_join_next().is_some() {}
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(e) => {
                if backoff.is_zero() {
                    tracing::warn!(listener = name, error = %e, "Accepting a connection failed; backing off.");
                }
                backoff = (backoff * 2).clamp(ACCEPT_BACKOFF.0, ACCEPT_BACKOFF.1);
                tokio::select! {
                    _ = stop.wait_for(|stop| *stop) => break,
                    () = tokio::time::sleep(backoff) => continue,
                }
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            shared.metrics.max_connections.inc();
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                warned = Some(Instant::now());
                tracing::warn!(
                    listener = name,
                    max_connections = limits.max_connections,
                    "Too many connections open: new ones are closed at once."
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(connection(stream, Arc::clone(&shared), stop.clone(), slot));
    }
    drop(tcp);
    while connections.join_next().await.is_some() {}
}

/// One connection, from its TLS handshake to its close; `_slot` is its place under
/// `max_connections`.
async fn connection<S, B>(
    tcp: TcpStream,
    shared: Arc<Shared<S>>,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) where
    S: tower_service::Service<Request<TimedBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let open = &shared.metrics.connections;
    open.inc();
    let _open = scopeguard(|| open.dec());
    match &shared.tls {
        None => run(tcp, &shared, &mut stop).await,
        Some(tls) => {
            let handshake = tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return,
                handshake = tls.accept(tcp) => handshake,
            };
            match handshake {
                Ok(stream) => run(stream, &shared, &mut stop).await,
                Err(e) => {
                    if let Some(failures) = &shared.metrics.tls_failures {
                        failures.inc();
                    }
                    tracing::debug!(listener = shared.name, error = %e, "TLS handshake failed.");
                }
            }
        }
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Serves HTTP on an established (and decrypted) connection.
async fn run<IO, S, B>(io: IO, shared: &Shared<S>, stop: &mut watch::Receiver<bool>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower_service::Service<Request<TimedBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let http1 = shared.http1.is_some();
    let activity = Arc::new(Activity::new(http1));
    let io = TokioIo::new(Watched {
        io,
        activity: Arc::clone(&activity),
        http1,
    });
    let service = ConnService {
        inner: shared.service.clone(),
        activity: Arc::clone(&activity),
        read_timeout: shared.limits.read_timeout,
        timed_out: shared.metrics.read_timeout.clone(),
    };
    let watch = Watchdog {
        name: shared.name,
        activity: &activity,
        limits: &shared.limits,
        metrics: &shared.metrics,
    };
    if let Some(builder) = &shared.http1 {
        let conn = pin!(builder.serve_connection(io, service));
        watch.drive(conn, |c| c.graceful_shutdown(), stop).await;
    } else if let Some(builder) = &shared.http2 {
        let conn = pin!(builder.serve_connection(io, service));
        watch.drive(conn, |c| c.graceful_shutdown(), stop).await;
    }
}

/// What the watchdog knows of a connection: requests in flight, since when none is, and
/// since when the next request's headers have been arriving (HTTP/1). Times are
/// milliseconds since the connection opened. Requests only write it: the watchdog reads it
/// when its timer fires, so a request costs a few atomic operations and no wake-up.
struct Activity {
    opened: Instant,
    http1: bool,
    in_flight: AtomicUsize,
    idle_since: AtomicU64,
    head_since: AtomicU64,
}

/// No headers arriving.
const NO_HEAD: u64 = u64::MAX;

/// What the watchdog should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Close the connection: the headers took too long.
    HeaderTimeout,
    /// Shut the connection down gracefully: idle too long.
    Idle,
    /// Look again at this many milliseconds since the connection opened.
    At(u64),
    /// Nothing is timed.
    Never,
}

impl Activity {
    /// An HTTP/1 connection's first request's headers are timed from its opening.
    fn new(http1: bool) -> Activity {
        Activity {
            opened: Instant::now(),
            http1,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(if http1 { 0 } else { NO_HEAD }),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A request's headers arrived: it is in flight until its response is dropped.
    fn enter(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NO_HEAD, Ordering::Release);
        Busy(Arc::clone(self))
    }

    /// Bytes were read (HTTP/1): with nothing in flight, they begin a request's headers.
    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Acquire) == NO_HEAD
        {
            self.head_since.store(self.now(), Ordering::Release);
        }
    }

    /// What is due at `now` under `limits`. Nothing tells the watchdog when a request
    /// starts or ends, so it looks again at least once per timeout: whatever happened since
    /// `now` cannot fall due before that.
    fn due(&self, limits: &Limits, now: u64) -> Due {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let header = (self.http1 && !limits.read_header_timeout.is_zero())
            .then(|| millis(limits.read_header_timeout));
        let idle = (!limits.idle_timeout.is_zero()).then(|| millis(limits.idle_timeout));
        let Some(period) = header.into_iter().chain(idle).min() else {
            return Due::Never;
        };
        let mut next = now.saturating_add(period);
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Due::At(next);
        }
        if let Some(header) = header {
            let head = self.head_since.load(Ordering::Acquire);
            if head != NO_HEAD {
                let at = head.saturating_add(header);
                if now >= at {
                    return Due::HeaderTimeout;
                }
                next = next.min(at);
            }
        }
        if let Some(idle) = idle {
            let at = self.idle_since.load(Ordering::Acquire).saturating_add(idle);
            if now >= at {
                return Due::Idle;
            }
            next = next.min(at);
        }
        Due::At(next)
    }
}

/// A request in flight; its end, when the last one, starts the idle clock.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.idle_since.store(activity.now(), Ordering::Release);
        }
    }
}

/// Watches one connection's [`Activity`] against its listener's limits.
struct Watchdog<'a> {
    name: &'static str,
    activity: &'a Activity,
    limits: &'a Limits,
    metrics: &'a ListenerMetrics,
}

impl Watchdog<'_> {
    /// Drives `conn` to its end, shutting it down (`graceful`) when idle too long or told to
    /// stop, and dropping it when a request's headers take too long. One timer, re-armed
    /// only when it fires.
    async fn drive<C, E>(
        &self,
        mut conn: Pin<&mut C>,
        graceful: impl Fn(Pin<&mut C>),
        stop: &mut watch::Receiver<bool>,
    ) where
        C: Future<Output = Result<(), E>>,
        E: std::fmt::Display,
    {
        let mut closing = false;
        let timer = tokio::time::sleep(Duration::ZERO);
        let mut timer = pin!(timer);
        let mut timed = true;
        loop {
            tokio::select! {
                biased;
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(listener = self.name, error = %e, "Connection ended with an error.");
                    }
                    return;
                }
                _ = stop.wait_for(|stop| *stop), if !closing => {
                    graceful(conn.as_mut());
                    closing = true;
                    timed = false;
                    continue;
                }
                () = timer.as_mut(), if timed => {
                    if closing {
                        return;
                    }
                }
            }
            match self.activity.due(self.limits, self.activity.now()) {
                Due::HeaderTimeout => {
                    self.metrics.read_header_timeout.inc();
                    tracing::debug!(
                        listener = self.name,
                        "A request's headers did not arrive within read_header_timeout; connection closed."
                    );
                    return;
                }
                Due::Idle => {
                    self.metrics.idle_timeout.inc();
                    graceful(conn.as_mut());
                    closing = true;
                    timer.as_mut().reset(Instant::now() + CLOSE_GRACE);
                }
                Due::At(ms) => {
                    timer
                        .as_mut()
                        .reset(self.activity.opened + Duration::from_millis(ms));
                }
                Due::Never => timed = false,
            }
        }
    }
}

/// A connection's IO, telling its [`Activity`] when bytes arrive (HTTP/1 only).
struct Watched<IO> {
    io: IO,
    activity: Arc<Activity>,
    http1: bool,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if this.http1 && buf.filled().len() > before {
            this.activity.read_some();
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The request body every service sees: the connection's, failing with [`ReadTimeout`]
/// once the request's `read_timeout` passes (counted once).
pub struct TimedBody {
    inner: Incoming,
    deadline: Option<ReadDeadline>,
    sleep: Option<Pin<Box<Sleep>>>,
    timed_out: Option<prometheus::IntCounter>,
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(deadline) = this.deadline else {
            return Poll::Pending;
        };
        // The timer is armed only when the body is waited for: most bodies never are.
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.at)));
        ready!(sleep.as_mut().poll(cx));
        if let Some(counter) = this.timed_out.take() {
            counter.inc();
        }
        Poll::Ready(Some(Err(ReadTimeout(deadline.after).into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request in flight until it is sent (or dropped).
struct Tracked<B> {
    body: B,
    _busy: Busy,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A listener's service as one connection runs it: requests counted in flight, bodies
/// timed.
struct ConnService<S> {
    inner: S,
    activity: Arc<Activity>,
    read_timeout: Duration,
    timed_out: prometheus::IntCounter,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for ConnService<S>
where
    S: tower_service::Service<Request<TimedBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
{
    type Response = Response<Tracked<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = self.activity.enter();
        let (mut parts, inner) = request.into_parts();
        let deadline = (!self.read_timeout.is_zero()).then(|| ReadDeadline {
            at: Instant::now() + self.read_timeout,
            after: self.read_timeout,
        });
        if let Some(deadline) = deadline {
            parts.extensions.insert(deadline);
        }
        let body = TimedBody {
            inner,
            deadline,
            sleep: None,
            timed_out: Some(self.timed_out.clone()),
        };
        let mut service = self.inner.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            let response = service.call(Request::from_parts(parts, body)).await?;
            Ok(response.map(|body| Tracked { body, _busy: busy }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(header: u64, idle: u64) -> Limits {
        Limits {
            max_connections: 10,
            read_header_timeout: Duration::from_millis(header),
            read_timeout: Duration::ZERO,
            idle_timeout: Duration::from_millis(idle),
        }
    }

    #[test]
    fn a_first_request_is_timed_from_the_opening_and_the_next_from_its_first_byte() {
        let activity = Arc::new(Activity::new(true));
        let l = limits(100, 1_000);
        assert_eq!(activity.due(&l, 50), Due::At(100));
        assert_eq!(activity.due(&l, 100), Due::HeaderTimeout);
        let busy = activity.enter();
        // In flight: the watchdog only looks again later (the body has its own deadline).
        assert_eq!(activity.due(&l, 5_000), Due::At(5_100));
        drop(busy);
        // Kept alive between requests: the idle clock, looked at once per header timeout
        // in case a request's first byte arrives meanwhile.
        let idle_since = activity.idle_since.load(Ordering::Acquire);
        assert_eq!(activity.due(&l, idle_since), Due::At(idle_since + 100));
        assert_eq!(
            activity.due(&l, idle_since + 950),
            Due::At(idle_since + 1_000)
        );
        assert_eq!(activity.due(&l, idle_since + 1_000), Due::Idle);
        activity
            .head_since
            .store(idle_since + 10, Ordering::Release);
        assert_eq!(activity.due(&l, idle_since + 10), Due::At(idle_since + 110));
        assert_eq!(activity.due(&l, idle_since + 110), Due::HeaderTimeout);
    }

    #[test]
    fn whatever_happens_after_a_look_cannot_fall_due_before_the_next() {
        let l = limits(100, 1_000);
        let activity = Arc::new(Activity::new(true));
        let busy = activity.enter();
        let Due::At(next) = activity.due(&l, 200) else {
            panic!("in flight, a look is due")
        };
        // The request ends and the next one starts just after the look.
        drop(busy);
        activity.head_since.store(201, Ordering::Release);
        assert!(next <= 201 + 100, "{next}");
        assert_eq!(activity.due(&l, next), Due::At(301));
    }

    #[test]
    fn http2_connections_are_timed_by_idleness_alone_and_zero_turns_a_timeout_off() {
        let activity = Arc::new(Activity::new(false));
        assert_eq!(activity.due(&limits(100, 1_000), 500), Due::At(1_000));
        assert_eq!(activity.due(&limits(100, 1_000), 1_000), Due::Idle);
        assert_eq!(activity.due(&limits(100, 0), 1_000_000), Due::Never);
        let http1 = Activity::new(true);
        assert_eq!(http1.due(&limits(0, 0), 1_000_000), Due::Never);
    }

    #[test]
    fn caps_that_do_not_fit_the_descriptor_limit_are_scaled_down() {
        let mut caps = [4096, 4096, 1024];
        assert!(!fit_connection_caps(&mut caps, None));
        assert!(!fit_connection_caps(&mut caps, Some(1 << 20)));
        assert_eq!(caps, [4096, 4096, 1024]);
        assert!(fit_connection_caps(&mut caps, Some(1024)));
        assert!(caps.iter().sum::<usize>() <= 1024 - 256, "{caps:?}");
        assert_eq!(caps, [341, 341, 85]);
        let mut tiny = [10, 10, 10];
        assert!(fit_connection_caps(&mut tiny, Some(8)));
        assert!(tiny.iter().all(|&c| c >= 1));
    }
}
