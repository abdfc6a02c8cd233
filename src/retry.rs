//! The product's own rule, applied to refusal-gate's own outbound calls (discovery
//! documents, Alertmanager pushes): a refusal is final, a transient failure is retried with
//! backoff. 5xx, 408 and 429 (and timeouts and connection errors, which have no status) are
//! retried, honouring `Retry-After`; any other 4xx is not.
//!
//! Core: pure. The callers own the clock and the sleeping.

use std::time::Duration;

/// What an HTTP answer means for the call that got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx (and 3xx that reached us): done.
    Success,
    /// Transient: try again, after the server's `Retry-After` when it gave one.
    Retry(Option<Duration>),
    /// A refusal: do not try again.
    Final,
}

/// Judges an HTTP status and its `Retry-After` header (in seconds; an HTTP date is ignored
/// and the caller's backoff used instead).
pub fn judge(status: u16, retry_after: Option<&str>) -> Answer {
    match status {
        500..=599 | 408 | 429 => Answer::Retry(
            retry_after
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        ),
        400..=499 => Answer::Final,
        _ => Answer::Success,
    }
}

/// Exponential backoff: `first`, doubling, never more than `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`; `max` caps every wait, a server's `Retry-After` included.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let first = first.min(max);
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// How long to wait before the next try, given what the server asked; doubles the
    /// backoff for the try after.
    pub fn wait(&mut self, retry_after: Option<Duration>) -> Duration {
        let wait = retry_after.unwrap_or(self.next).min(self.max);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Back to `first`, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_final_and_failures_are_retried() {
        assert_eq!(judge(200, None), Answer::Success);
        assert_eq!(judge(204, None), Answer::Success);
        for status in [400, 401, 403, 404, 405, 410, 422] {
            assert_eq!(judge(status, None), Answer::Final, "{status}");
        }
        for status in [408, 429, 500, 502, 503, 504] {
            assert_eq!(judge(status, None), Answer::Retry(None), "{status}");
        }
        assert_eq!(
            judge(503, Some(" 7 ")),
            Answer::Retry(Some(Duration::from_secs(7)))
        );
        assert_eq!(
            judge(429, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Answer::Retry(None)
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let s = Duration::from_millis(500);
        let mut b = Backoff::new(s, s * 4);
        assert_eq!(
            [b.wait(None), b.wait(None), b.wait(None), b.wait(None)],
            [s, s * 2, s * 4, s * 4]
        );
        assert_eq!(
            b.wait(Some(Duration::from_secs(60))),
            s * 4,
            "Retry-After is capped too"
        );
        assert_eq!(
            b.wait(Some(Duration::from_millis(100))),
            Duration::from_millis(100)
        );
        b.reset();
        assert_eq!(b.wait(None), s);
    }
}
