//! refusal-gate: an OpenTelemetry-collector-style processor that reads client spans as
//! attempts, tags each as refusal, transient, throttled or ambiguous, remembers per client
//! what each interface refused, and counts the retries that should not have happened.
//!
//! The contract is DESIGN.md. A request's bytes reach [`pipeline::Pipeline::handle`] from a
//! [`receiver`]; spans are read in place ([`otlp`]), then [`extract`] (pure) → [`classify`]
//! (pure) → [`tracker`] (state) → [`metrics`], [`alert`] and, when forwarding, [`export`].
//! `docs/layout.md` draws the layers of the modules; `tests/layers.rs` keeps them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod admin;
pub mod alert;
pub mod app;
pub mod classify;
pub mod clock;
pub mod config;
pub mod console;
pub mod discovery;
pub mod export;
pub mod extract;
pub mod gate;
pub mod label;
pub mod metrics;
pub mod openmetrics;
pub mod otlp;
pub mod pipeline;
pub mod push;
pub mod receiver;
pub mod replay;
pub mod retry;
pub mod serve;
pub mod state;
pub mod tls;
pub mod tracker;
pub mod url;
#[cfg(feature = "workload")]
pub mod workload;
