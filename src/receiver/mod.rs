//! The receivers: OTLP/gRPC ([`grpc`]) and OTLP/HTTP ([`http`]), each an edge that turns its
//! transport's request into bytes for [`crate::pipeline::Pipeline::handle`] and the
//! pipeline's answer (or [`crate::pipeline::IngestError`]) into its transport's response.
//!
//! Edges only: sockets, codecs, limits and auth; no span is read here.

pub mod grpc;
pub mod http;

use crate::access::{Grant, Reading, Share};
use crate::pipeline::{Encoding, IngestError, Pipeline, Summary, Transport};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// Bodies this large or larger are handled on the blocking pool: decoding a large one (JSON
/// above all) must not hold an async worker that `/healthz` and other requests need.
pub const OFF_WORKER_BYTES: usize = 1 << 20;

/// Runs one request's body, sent with `grant`, through the pipeline at the clock's now:
/// inline when it is small, on the blocking pool when it is [`OFF_WORKER_BYTES`] or more.
/// `allocated` is what the buffer `body` is a view of keeps allocated
/// ([`Pipeline::handle_bytes`]).
///
/// # Errors
/// What [`Pipeline::handle`] refused.
pub async fn handle(
    pipeline: &Arc<Pipeline>,
    (transport, grant): (Transport, Grant),
    (body, allocated): (Bytes, usize),
    encoding: Encoding,
) -> Result<Summary, IngestError> {
    if body.len() < OFF_WORKER_BYTES {
        let now = crate::clock::now();
        let sender = (transport, &grant);
        return pipeline.handle_bytes(sender, (&body, allocated), encoding, now);
    }
    let pipeline = Arc::clone(pipeline);
    tokio::task::spawn_blocking(move || {
        let sender = (transport, &grant);
        pipeline.handle_bytes(sender, (&body, allocated), encoding, crate::clock::now())
    })
    .await
    .unwrap_or_else(|e| {
        // A panic in the pipeline: the request is refused as malformed, the process goes on.
        Err(IngestError::Malformed {
            encoding: "protobuf",
            detail: format!("the request could not be handled: {e}"),
        })
    })
}

/// A request on its way to an answer: counted in
/// `refusal_gate_receiver_abandoned_requests_total` when dropped before [`Pending::answered`]
/// — hyper drops a request's handler when its client resets the stream or closes the
/// connection.
pub struct Pending {
    pipeline: Arc<Pipeline>,
    transport: Transport,
    answered: bool,
}

impl Pending {
    /// A request of `transport` that has not been answered yet.
    pub fn new(pipeline: &Arc<Pipeline>, transport: Transport) -> Pending {
        Pending {
            pipeline: Arc::clone(pipeline),
            transport,
            answered: false,
        }
    }

    /// The request has its answer.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.pipeline.metrics().abandoned_request(self.transport);
        }
    }
}

/// The error a [`Metered`] body fails with when the receiver's `max_reading_mib` is full.
#[derive(Debug, thiserror::Error)]
#[error("the receiver holds max_reading_mib of bodies still arriving")]
pub struct ReadingFull;

/// How a [`Metered`] body ended, readable after it is gone.
#[derive(Debug, Clone, Default)]
pub struct Ending(Arc<AtomicU8>);

impl Ending {
    const FULL: u8 = 1;
    const BROKEN: u8 = 2;

    /// The body failed for want of room in the budget.
    pub fn full(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Ending::FULL
    }

    /// The body broke off before its end: the client reset the stream or closed the
    /// connection (or its read timed out: the caller tells that apart by the deadline).
    pub fn broken(&self) -> bool {
        self.0.load(Ordering::Relaxed) == Ending::BROKEN
    }
}

/// A request body whose bytes are charged to the receiver's [`Reading`] budget as they
/// arrive, and given back when it is dropped; it fails with [`ReadingFull`] when a frame
/// does not fit. Its [`Ending`] says why it failed.
pub struct Metered<B> {
    body: B,
    share: Share,
    ending: Ending,
}

impl<B> Metered<B> {
    /// `body`, charged to `reading`.
    pub fn new(body: B, reading: &Reading) -> Metered<B> {
        Metered {
            body,
            share: reading.share(),
            ending: Ending::default(),
        }
    }

    /// How the body ended, readable after it is gone.
    pub fn ending(&self) -> Ending {
        self.ending.clone()
    }
}

impl<B> Body for Metered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                if this.share.take(len) {
                    Poll::Ready(Some(Ok(frame)))
                } else {
                    this.ending.0.store(Ending::FULL, Ordering::Relaxed);
                    Poll::Ready(Some(Err(ReadingFull.into())))
                }
            }
            Poll::Ready(Some(Err(e))) => {
                this.ending.0.store(Ending::BROKEN, Ordering::Relaxed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The `partial_success.error_message` for the spans a request's answer reports rejected:
/// those that could not be decoded, and those its token may not speak for.
pub fn rejected_message(summary: &Summary) -> String {
    match (summary.rejected, summary.not_permitted) {
        (decoded, 0) => format!("{decoded} spans could not be decoded"),
        (0, refused) => format!("{refused} spans name a client this token may not speak for"),
        (decoded, refused) => format!(
            "{decoded} spans could not be decoded; {refused} name a client this token may not speak for"
        ),
    }
}
