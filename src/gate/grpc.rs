//! The Gate API over gRPC: `refusal_gate.v1.RefusalGate`, served beside the OTLP trace
//! service on the OTLP/gRPC port and behind the same bearer tokens.
//!
//! Edge: converts between the generated messages and [`super::Question`] / [`super::Answer`].

use super::proto::refusal_gate_server::{RefusalGate, RefusalGateServer};
use super::proto::{self, Protocol as ProtoProtocol};
use super::{Asker, Filter, LastResponse, Protocol, Question};
use crate::access::{Grant, Tokens};
use crate::alert::Alert;
use crate::alert::Cause;
use crate::clock;
use crate::pipeline::Pipeline;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::{http, Service};
use tonic::{Request, Response, Status};

/// The service.
pub struct Gate {
    pipeline: Arc<Pipeline>,
    tokens: Arc<Tokens>,
    ids: AtomicU64,
    stop: tokio::sync::watch::Receiver<bool>,
}

impl Gate {
    /// The service over `pipeline`, admitting callers with one of `tokens` (none: anyone) and
    /// requests of at most `max_message_bytes` (the OTLP receiver's limit); its alert streams
    /// end when `stop` turns true.
    pub fn server(
        pipeline: Arc<Pipeline>,
        tokens: Arc<Tokens>,
        stop: tokio::sync::watch::Receiver<bool>,
        max_message_bytes: usize,
    ) -> TooLarge<RefusalGateServer<Gate>> {
        let gate = RefusalGateServer::new(Gate {
            pipeline,
            tokens,
            ids: AtomicU64::new(1),
            stop,
        });
        TooLarge(gate.max_decoding_message_size(max_message_bytes))
    }

    fn admit<T>(&self, request: &Request<T>) -> Result<Grant, Status> {
        let authorization = request.metadata().get("authorization");
        self.tokens
            .grant(authorization.map(tonic::metadata::MetadataValue::as_bytes))
            .ok_or_else(|| Status::unauthenticated("missing or invalid bearer token"))
    }
}

/// A gRPC service whose requests too large to read are answered `RESOURCE_EXHAUSTED`, as the
/// OTLP receiver answers them and as gRPC's own limits do, rather than tonic's `OUT_OF_RANGE`
/// (the Gate's methods never answer `OUT_OF_RANGE` themselves: every one is tonic's size
/// check).
#[derive(Debug, Clone)]
pub struct TooLarge<S>(S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for TooLarge<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for TooLarge<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.0.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            let headers = response.headers_mut();
            if headers.get("grpc-status").is_some_and(|s| s == "11") {
                headers.insert("grpc-status", http::HeaderValue::from_static("8"));
            }
            Ok(response)
        })
    }
}

/// A `DecideRequest` as a [`Question`].
///
/// # Errors
/// `INVALID_ARGUMENT` when the protocol is not set.
pub fn question(r: proto::DecideRequest) -> Result<Question, Status> {
    let protocol = match ProtoProtocol::try_from(r.protocol).unwrap_or(ProtoProtocol::Unspecified) {
        ProtoProtocol::Http => Protocol::Http,
        ProtoProtocol::Mcp => Protocol::Mcp,
        ProtoProtocol::A2a => Protocol::A2a,
        ProtoProtocol::Grpc => Protocol::Grpc,
        ProtoProtocol::Jsonrpc => Protocol::Jsonrpc,
        ProtoProtocol::Unspecified => return Err(Status::invalid_argument("protocol is required")),
    };
    let client = r.client.unwrap_or_default();
    Ok(Question {
        client: Asker {
            service_name: client.service_name,
            service_instance_id: client.service_instance_id,
        },
        protocol,
        url: r.url,
        interface: r.interface,
        http_method: r.http_method,
        method: r.method,
        tool: r.tool,
        last_response: r.last_response.map(|l| LastResponse {
            http_status: u16::try_from(l.http_status).unwrap_or(0),
            jsonrpc_code: l.jsonrpc_code,
            grpc_code: l
                .has_grpc_code
                .then(|| i32::try_from(l.grpc_code).unwrap_or(i32::MAX)),
            timed_out: l.timed_out,
            error_type: l.error_type,
            attempt: l.attempt,
            retry_after_ms: l.retry_after_ms,
        }),
        observe: r.observe,
    })
}

fn response(a: super::Answer) -> proto::DecideResponse {
    proto::DecideResponse {
        class: a.class,
        kind: a.kind,
        decision: a.decision,
        rule: a.rule,
        interface: a.interface,
        backoff_ms: a.backoff_ms,
        retries_left: a.retries_left,
        discovery_url: a.discovery_url,
        alternatives: a
            .alternatives
            .into_iter()
            .map(|x| proto::Alternative {
                interface: x.interface,
                url: x.url,
                protocol: x.protocol,
            })
            .collect(),
        observed: a.observed,
        contradicted: a.contradicted,
    }
}

/// An alert as the API sends it.
pub fn alert(a: &Alert) -> proto::Alert {
    proto::Alert {
        alertname: a.key.alertname.to_owned(),
        severity: a.severity.as_str().to_owned(),
        client: a.key.client.to_string(),
        interface: a.key.interface.to_string(),
        violation: a
            .cause
            .violation()
            .map_or(String::new(), |v| v.as_str().to_owned()),
        kind: match a.cause {
            Cause::Contradiction(c) => c.as_str().to_owned(),
            Cause::Violation(_) => String::new(),
        },
        operation: a.operation.to_string(),
        trace_id: a.trace_id_hex(),
        span_id: a.span_id_hex(),
        starts_at_unix_ms: i64::try_from(a.starts_at / 1_000_000).unwrap_or(i64::MAX),
    }
}

type AlertStream = Pin<Box<dyn Stream<Item = Result<proto::Alert, Status>> + Send>>;

#[tonic::async_trait]
impl RefusalGate for Gate {
    async fn decide(
        &self,
        request: Request<proto::DecideRequest>,
    ) -> Result<Response<proto::DecideResponse>, Status> {
        let grant = self.admit(&request)?;
        let q = question(request.into_inner())?;
        if let Err(e) = super::permitted(&grant, &q) {
            self.pipeline
                .metrics()
                .gate_refused("grpc", "not_permitted");
            return Err(Status::permission_denied(e.to_string()));
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        super::decide(&self.pipeline, &q, clock::now(), id)
            .map(|a| Response::new(response(a)))
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    type WatchAlertsStream = AlertStream;

    async fn watch_alerts(
        &self,
        request: Request<proto::WatchAlertsRequest>,
    ) -> Result<Response<AlertStream>, Status> {
        self.admit(&request)?;
        let r = request.into_inner();
        let filter = Filter {
            client: r.client,
            interface: r.interface,
            min_severity: r.min_severity,
        }
        .as_labels(self.pipeline.metrics().max_label_bytes());
        let stream =
            super::alerts_until(self.pipeline.alerter(), filter, self.stop.clone(), "grpc")
                .ok_or_else(|| {
                    Status::resource_exhausted(
                        "alerting.max_watchers watchers are already open; try again later",
                    )
                })?
                .map(|a| Ok(alert(&a)));
        Ok(Response::new(Box::pin(stream)))
    }
}
