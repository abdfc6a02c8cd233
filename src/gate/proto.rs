//! The Gate API's messages and service, generated from `proto/refusal_gate/v1/gate.proto`
//! by `build.rs`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("refusal_gate.v1");
