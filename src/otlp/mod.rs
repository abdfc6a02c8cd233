//! OTLP, the protocol: reading spans from the protobuf bytes ([`wire`]) and the views of a
//! span and its values that extraction reads ([`span`]); a request's framing, checked and
//! re-framed with tags ([`frame`], [`tags`]), or split by client for a second tier ([`route`]); OTLP/JSON turned into protobuf ([`json`]).
//!
//! Core: pure protocol code. It knows nothing of the pipeline, the tracker or the sockets.

#[cfg(test)]
pub(crate) mod fixtures;
pub mod frame;
pub mod json;
pub mod route;
pub mod span;
pub mod tags;
pub mod wire;

pub use span::{Array, SpanView, Val};

/// Which OTLP transport a request came in on: the `transport` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP.
    Http,
}

impl Transport {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Http => "http",
        }
    }
}
