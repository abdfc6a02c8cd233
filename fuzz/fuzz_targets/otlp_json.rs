//! Fuzz target: arbitrary bytes as an OTLP/JSON export request, through the whole ingest
//! path. The property: no panic, and an answer for every input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use refusal_gate::config::Config;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use std::sync::LazyLock;

/// One pipeline on the default configuration for the whole run, so that state built by
/// earlier inputs (keys, pending verdicts, alerts) meets later ones.
static PIPELINE: LazyLock<Pipeline> = LazyLock::new(|| Pipeline::from_config(&Config::default()));

fuzz_target!(|data: &[u8]| {
    let _ = PIPELINE.handle(Transport::Http, data, Encoding::Json, 1);
});
