//! The receivers: OTLP/gRPC ([`grpc`]) and OTLP/HTTP ([`http`]), each an edge that turns its
//! transport's request into bytes for [`crate::pipeline::Pipeline::handle`] and the
//! pipeline's answer (or [`crate::pipeline::IngestError`]) into its transport's response.
//!
//! Edges only: sockets, codecs, limits and auth; no span is read here.

pub mod grpc;
pub mod http;
