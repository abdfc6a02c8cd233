//! Writes a generated recording of the realistic agent workload (`refusal_gate::workload`)
//! as OTLP JSON lines, 100 spans a line, for measuring `replay`.
//!
//!     cargo run --release --example recording -- SPANS CLIENTS > big.jsonl
//!     time cargo run --release -- replay big.jsonl

use refusal_gate::workload;
use std::io::Write;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let spans: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    for n in 0..spans.div_ceil(100) {
        let request = workload::request(n, clients, 100);
        serde_json::to_writer(&mut out, &request)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
