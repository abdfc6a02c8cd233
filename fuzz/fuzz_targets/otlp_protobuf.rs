//! Fuzz target: arbitrary bytes as an OTLP/protobuf export request, through the whole
//! ingest path (frame check, in-place span reads, extract, classify, track, count), and for
//! a request whose framing holds, the forwarding path too (tags, re-framing). The
//! properties: no panic, an answer for every input, and a re-framed request whose framing
//! holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use refusal_gate::config::Config;
use refusal_gate::otlp::frame;
use refusal_gate::otlp::tags::SpanTags;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use std::sync::LazyLock;

/// One pipeline on the default configuration for the whole run, so that state built by
/// earlier inputs (keys, pending verdicts, alerts) meets later ones.
static PIPELINE: LazyLock<Pipeline> = LazyLock::new(|| Pipeline::from_config(&Config::default()));

fuzz_target!(|data: &[u8]| {
    let _ = PIPELINE.handle(Transport::Grpc, data, Encoding::Protobuf, 1);
    if frame::check(data).is_ok() {
        let mut tags = SpanTags::default();
        let (_, malformed_at) = PIPELINE.ingest(Transport::Grpc, data, 0, 1, Some(&mut tags));
        let forwarded = frame::retag(data, &malformed_at, &tags)
            .expect("a request whose framing holds is re-framed");
        assert!(
            frame::check(&forwarded).is_ok(),
            "the re-framed request's framing holds"
        );
    }
});
