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

/// Judges an HTTP status and its `Retry-After` header (delay-seconds or an HTTP-date, counted
/// from `now`, Unix nanoseconds; anything else leaves the caller's backoff to decide).
pub fn judge(status: u16, retry_after: Option<&str>, now: u64) -> Answer {
    match status {
        500..=599 | 408 | 429 => Answer::Retry(
            retry_after
                .and_then(|v| self::retry_after(v, now))
                .map(Duration::from_nanos),
        ),
        200..=299 => Answer::Success,
        // Other 4xx, and what is no answer to the request itself: a redirect (never
        // followed), 1xx.
        _ => Answer::Final,
    }
}

/// The delay a `Retry-After` value asks for, in nanoseconds after `at` (the response's
/// time, Unix nanoseconds): delay-seconds, or an HTTP-date in any of the three formats RFC 9110
/// (§5.6.7) has recipients accept, counted from `at`. `None` for anything else, and for a zero
/// delay or a date not after `at` (nothing to wait for).
pub fn retry_after(value: &str, at: u64) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than fit is a very long delay, not an error.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(seconds.saturating_mul(1_000_000_000)).filter(|d| *d > 0);
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let when = date.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(u64::try_from(when).unwrap_or(u64::MAX).saturating_sub(at)).filter(|d| *d > 0)
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
        // 2015-10-21T07:28:00Z, the HTTP-date below.
        let then = 1_445_412_480 * 1_000_000_000;
        assert_eq!(judge(200, None, then), Answer::Success);
        assert_eq!(judge(204, None, then), Answer::Success);
        assert_eq!(judge(299, None, then), Answer::Success);
        for status in [100, 199, 300, 301, 302, 304, 307, 308, 399] {
            assert_eq!(judge(status, None, then), Answer::Final, "{status}");
        }
        for status in [400, 401, 403, 404, 405, 410, 422] {
            assert_eq!(judge(status, None, then), Answer::Final, "{status}");
        }
        for status in [408, 429, 500, 502, 503, 504] {
            assert_eq!(judge(status, None, then), Answer::Retry(None), "{status}");
        }
        assert_eq!(
            judge(503, Some(" 7 "), then),
            Answer::Retry(Some(Duration::from_secs(7)))
        );
        let date = Some("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(
            judge(429, date, then - 3_000_000_000),
            Answer::Retry(Some(Duration::from_secs(3))),
            "a date is a wait until then"
        );
        assert_eq!(
            judge(429, date, then),
            Answer::Retry(None),
            "a date past is none"
        );
        assert_eq!(judge(503, Some("soon"), then), Answer::Retry(None));
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

    #[test]
    fn retry_after_is_delay_seconds_or_an_http_date_after_the_end() {
        const S: u64 = 1_000_000_000;
        // 2026-11-30T12:00:00.250Z: the response's end.
        let end = 1_796_040_000 * S + S / 4;
        let cases = [
            ("2", Some(2 * S)),
            (" 120 ", Some(120 * S)),
            ("0", None),
            ("99999999999999999999999", Some(u64::MAX)),
            ("1.5", None),
            ("-1", None),
            ("soon", None),
            ("", None),
            // IMF-fixdate, RFC 850 and asctime: RFC 9110 has recipients take all three.
            ("Mon, 30 Nov 2026 12:00:02 GMT", Some(2 * S - S / 4)),
            ("Monday, 30-Nov-26 12:00:02 GMT", Some(2 * S - S / 4)),
            ("Mon Nov 30 12:00:02 2026", Some(2 * S - S / 4)),
            // A date already past: nothing to wait for.
            ("Mon, 30 Nov 2026 11:59:00 GMT", None),
        ];
        for (value, want) in cases {
            assert_eq!(retry_after(value, end), want, "{value:?}");
        }
    }
}
