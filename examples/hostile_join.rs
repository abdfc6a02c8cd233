//! Times the call join (DESIGN §11) on the hostile shapes of issue 44
//! (`refusal_gate::workload::hostile`), each at N spans and at 4N, in one process, one thread:
//! the time of each, and the ratio (4 for a join linear in its spans, 16 for a quadratic one).
//!
//!     cargo run --release --example hostile_join [N] [SHAPE]
//!
//! N is 16,000 by default; SHAPE, one shape's name, times that one alone. Prints a table;
//! asserts nothing.

use refusal_gate::config::Config;
use refusal_gate::pipeline::{Encoding, Pipeline, Transport};
use refusal_gate::workload::hostile;
use std::time::Instant;

/// Seconds of handling `requests` on a fresh pipeline, in this thread.
fn time(requests: &[Vec<u8>]) -> f64 {
    let config = Config::parse(hostile::CONFIG).expect("valid");
    let pipeline = Pipeline::from_config(&config);
    let now = refusal_gate::clock::now();
    let started = Instant::now();
    for body in requests {
        let _ = pipeline.handle(Transport::Http, body, Encoding::Protobuf, now);
    }
    started.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16_000);
    println!(
        "| shape | {n} spans | {} spans | ratio (4: linear, 16: quadratic) |",
        4 * n
    );
    println!("|---|---|---|---|");
    let only = std::env::args().nth(2);
    for name in hostile::SHAPES
        .into_iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == *s))
    {
        let small = hostile::requests(name, n);
        let large = hostile::requests(name, 4 * n);
        let (a, b) = (time(&small), time(&large));
        println!("| {name} | {a:.3} s | {b:.3} s | {:.1} |", b / a.max(1e-6));
    }
}
