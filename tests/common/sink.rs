//! The next hop of a forwarding refusal-gate in the black-box tests: an OTLP/gRPC receiver
//! that keeps every request it is sent, and reads the spans back.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// An OTLP/gRPC receiver that keeps every request it is sent.
#[derive(Clone, Default)]
pub struct Sink {
    pub requests: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.requests
            .lock()
            .expect("not poisoned")
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Sink {
    /// Every span received, by span id, with its resource and scope.
    pub fn spans(&self) -> HashMap<Vec<u8>, (Resource, InstrumentationScope, Span)> {
        let mut out = HashMap::new();
        for request in self.requests.lock().expect("not poisoned").iter() {
            for rs in &request.resource_spans {
                for ss in &rs.scope_spans {
                    for span in &ss.spans {
                        out.insert(
                            span.span_id.clone(),
                            (
                                rs.resource.clone().unwrap_or_default(),
                                ss.scope.clone().unwrap_or_default(),
                                span.clone(),
                            ),
                        );
                    }
                }
            }
        }
        out
    }

    /// Every span received, each time it was received, with its resource.
    pub fn every(&self) -> Vec<(Resource, Span)> {
        let requests = self.requests.lock().expect("not poisoned");
        let resource_spans = requests.iter().flat_map(|r| &r.resource_spans);
        resource_spans
            .flat_map(|rs| {
                let resource = rs.resource.clone().unwrap_or_default();
                rs.scope_spans
                    .iter()
                    .flat_map(|ss| &ss.spans)
                    .map(move |span| (resource.clone(), span.clone()))
            })
            .collect()
    }
}

/// Serves a `TraceService` on a free port. Like a Collector, it accepts gzip
/// (refusal-gate's default compression) and zstd.
pub async fn serve<S: TraceService>(service: S) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    let service = TraceServiceServer::new(service)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Zstd);
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });
    addr
}

pub async fn start_sink() -> (SocketAddr, Sink) {
    let sink = Sink::default();
    (serve(sink.clone()).await, sink)
}

/// A string attribute of a span, or of a resource's attributes.
pub fn string(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<String> {
    match attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}
