//! Measures the tracker's memory per key: RSS before and after tracking N keys, each with
//! a full settled history (the steady state of a key that keeps being retried) and a
//! realistic operation name (`POST /api/v2/orders/42`, kept for alerts).
//!
//!     cargo run --release --example key_memory [KEYS] [ATTEMPTS_PER_KEY] [long|short] [OPS]
//!
//! OPS is the operations per (client, interface) group, 100 by default; the load
//! generator's fleet has about 5 (45 keys of a client over 10 interfaces).
//!
//! WITNESS=1: every key also a distinct operation its interface served (DESIGN §13), so that
//! the witness remembers as many operations as there are keys — its worst case.
//!
//! Prints bytes per key, then what the periodic sweep (once a second when serving) costs
//! over them when nothing is due: the share of a core it takes. Linux only (reads
//! /proc/self/statm).

use refusal_gate::classify::Outcome;
use refusal_gate::config::TrackerConfig;
use refusal_gate::discovery::Declared;
use refusal_gate::extract::Discovery;
use refusal_gate::tracker::{GroupId, Observation, Tracker};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}

fn main() {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let per_key: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    // Pass `long` to name every operation with the longest name a key keeps (64 bytes).
    let long = args.next().is_some_and(|a| a == "long");
    let ops: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let witness = std::env::var_os("WITNESS").is_some();
    // Room beyond the keys: `max_keys` is split evenly over the shards, and clients do not
    // hash evenly to them.
    let config = TrackerConfig {
        max_keys: keys as usize * 11 / 10,
        ..TrackerConfig::default()
    };
    let tracker = Tracker::new(&config);
    let mut events = Vec::new();
    let before = rss_bytes();
    let t0 = 1_700_000_000_000_000_000u64;
    for k in 0..keys {
        for a in 0..per_key {
            let start = t0 + a * 1_000_000_000;
            let obs = Observation {
                group: GroupId {
                    client: k / ops,
                    interface: 1,
                },
                operation: k % ops,
                labels: 0,
                start,
                end: start + 20_000_000,
                outcome: if a % 2 == 0 {
                    Outcome::Transient
                } else {
                    Outcome::Other
                },
                declared: Declared::Unknown,
                discovery: Discovery::None,
                retry_after: None,
                anonymous: false,
                asked: Default::default(),
                testimony: refusal_gate::tracker::honesty::Testimony {
                    about: if witness { k + 1 } else { 0 },
                    served: witness,
                    ..Default::default()
                },
                trace_id: [1; 16],
                span_id: (k * per_key + a).to_be_bytes(),
            };
            let operation = format!("POST /api/v2/orders/{}", k % ops);
            let operation = if long {
                format!("{operation:/<64}")
            } else {
                operation
            };
            tracker.observe(start, &obs, &operation, &mut events);
        }
        if k % 100 == 99 {
            // Settle as the sweeper would, so the histories reach their steady state.
            tracker.settle(0, true, &mut events);
            events.clear();
        }
    }
    tracker.settle(0, true, &mut events);
    events.clear();
    events.shrink_to_fit();
    let after = rss_bytes();
    assert_eq!(tracker.keys() as u64, keys);
    println!(
        "{keys} keys, {per_key} attempts each: RSS {:.1} MiB -> {:.1} MiB, {:.0} bytes per key",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        (after - before) as f64 / keys as f64
    );
    // The sweep a minute after the last attempt: nothing expires, nothing is due.
    let now = t0 + (per_key + 60) * 1_000_000_000;
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            tracker.sweep(now, &mut events);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    assert_eq!(tracker.keys() as u64, keys);
    println!(
        "a sweep of {keys} keys: {:.1} ms (median of 5), {:.1}% of a core at one a second",
        times[2],
        times[2] / 10.0
    );
}
