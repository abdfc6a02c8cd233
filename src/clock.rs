//! The one wall-clock read of the program. Span times and the tracker's clock are Unix
//! nanoseconds ([`Nanos`]); everything below the edges takes `now` as a parameter, so a replay
//! can run the same code on span time.
//!
//! Edge: the only place that asks the operating system what time it is.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in nanoseconds: span times and the tracker's clock alike.
pub type Nanos = u64;

/// One second in [`Nanos`].
pub const SECOND: Nanos = 1_000_000_000;

/// Unix nanoseconds now (0 before 1970, the largest value past 2554).
pub fn now() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
