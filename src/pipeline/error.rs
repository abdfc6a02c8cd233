//! Why a whole request was refused, and what each transport answers for it: the one place
//! that maps ingest errors to OTLP/HTTP statuses and OTLP/gRPC codes, as OTLP specifies them.
//!
//! Core: plain data.

/// Why a whole request was refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The body is not an OTLP traces request.
    #[error("malformed {encoding} request: {detail}")]
    Malformed {
        /// `protobuf` or `json`.
        encoding: &'static str,
        /// What the decoder said.
        detail: String,
    },
    /// The body, as sent or inflated, is larger than allowed.
    #[error("request body larger than {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The content type is neither protobuf nor JSON.
    #[error("unsupported content type {0:?}: use application/x-protobuf or application/json")]
    UnsupportedMediaType(String),
    /// The content encoding is neither identity nor gzip.
    #[error("unsupported content encoding {0:?}: use gzip or none")]
    UnsupportedEncoding(String),
    /// The gzip stream is corrupt.
    #[error("invalid gzip body: {0}")]
    BadGzip(String),
    /// The zstd stream is corrupt.
    #[error("invalid zstd body: {0}")]
    BadZstd(String),
    /// No valid bearer token.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// The receiver has `max_concurrent_requests` in flight: retry after the hint.
    #[error("too many requests in flight; retry after {}s", retry_after.as_secs())]
    Busy {
        /// How long the sender should wait.
        retry_after: std::time::Duration,
    },
    /// The receiver holds `max_reading_mib` of bodies still arriving: retry after the hint.
    #[error("too many request bytes arriving at once; retry after {}s", retry_after.as_secs())]
    ReadingFull {
        /// How long the sender should wait.
        retry_after: std::time::Duration,
    },
    /// The request holds more spans (or bytes) than the whole export queue: it can never be
    /// forwarded, so it is refused for good (not retryable).
    #[error("the request holds {size} {unit}, more than the export queue ever holds ({capacity}): send it in smaller requests")]
    ExceedsQueue {
        /// The spans (or bytes) of the request.
        size: u64,
        /// `exporters.otlp.queue_size` (or `queue_size_mib` in bytes).
        capacity: usize,
        /// `spans` or `bytes`.
        unit: &'static str,
    },
    /// The body broke off before its end: its client closed the connection (or reset the
    /// stream). Counted abandoned, not refused: no one reads the answer.
    #[error("the request's body broke off before its end")]
    BrokenOff,
    /// The body did not arrive within the listener's `read_timeout`.
    #[error("the request's body did not arrive within {}s of its headers", after.as_secs_f64())]
    ReadTimeout {
        /// The `read_timeout`.
        after: std::time::Duration,
    },
    /// The export queue is full: retry after the hint (OTLP's retryable answer).
    #[error("the export queue is full; retry after {}s", retry_after.as_secs())]
    Overloaded {
        /// How long the sender should wait.
        retry_after: std::time::Duration,
        /// The spans refused.
        spans: u64,
    },
}

impl IngestError {
    /// How long the sender should wait before retrying, when it should.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            IngestError::Overloaded { retry_after, .. }
            | IngestError::Busy { retry_after }
            | IngestError::ReadingFull { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// The `reason` label for refused requests.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::Malformed { .. } => "malformed",
            IngestError::TooLarge { .. } => "too_large",
            IngestError::UnsupportedMediaType(_) => "unsupported_media_type",
            IngestError::UnsupportedEncoding(_) => "unsupported_encoding",
            IngestError::BadGzip(_) => "bad_gzip",
            IngestError::BadZstd(_) => "bad_zstd",
            IngestError::Overloaded { .. } => "queue_full",
            IngestError::ExceedsQueue { .. } => "exceeds_queue",
            IngestError::Unauthenticated => "unauthenticated",
            IngestError::Busy { .. } => "concurrency_limit",
            IngestError::ReadingFull { .. } => "reading_limit",
            IngestError::ReadTimeout { .. } => "read_timeout",
            IngestError::BrokenOff => "abandoned",
        }
    }

    /// The OTLP/HTTP status.
    pub fn http_status(&self) -> u16 {
        match self {
            IngestError::Malformed { .. }
            | IngestError::BrokenOff
            | IngestError::BadGzip(_)
            | IngestError::BadZstd(_)
            | IngestError::ExceedsQueue { .. } => 400,
            IngestError::TooLarge { .. } => 413,
            IngestError::UnsupportedMediaType(_) | IngestError::UnsupportedEncoding(_) => 415,
            IngestError::Overloaded { .. }
            | IngestError::Busy { .. }
            | IngestError::ReadingFull { .. } => 503,
            IngestError::Unauthenticated => 401,
            IngestError::ReadTimeout { .. } => 408,
        }
    }

    /// The OTLP/gRPC status code.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            IngestError::TooLarge { .. } => tonic::Code::ResourceExhausted,
            IngestError::UnsupportedEncoding(_) => tonic::Code::Unimplemented,
            IngestError::Overloaded { .. }
            | IngestError::Busy { .. }
            | IngestError::ReadingFull { .. } => tonic::Code::Unavailable,
            IngestError::Unauthenticated => tonic::Code::Unauthenticated,
            IngestError::ReadTimeout { .. } => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::InvalidArgument,
        }
    }
}

/// The encoding of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `application/x-protobuf`, and gRPC.
    Protobuf,
    /// `application/json`: OTLP's JSON mapping.
    Json,
}

impl From<crate::otlp::frame::FrameError> for IngestError {
    fn from(e: crate::otlp::frame::FrameError) -> IngestError {
        IngestError::Malformed {
            encoding: "protobuf",
            detail: e.to_string(),
        }
    }
}

impl From<crate::otlp::json::JsonError> for IngestError {
    fn from(e: crate::otlp::json::JsonError) -> IngestError {
        IngestError::Malformed {
            encoding: "json",
            detail: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_otlp_answers() {
        let cases = [
            (
                IngestError::Malformed {
                    encoding: "json",
                    detail: String::new(),
                },
                400,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::BadGzip(String::new()),
                400,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::TooLarge { limit: 1 },
                413,
                tonic::Code::ResourceExhausted,
            ),
            (
                IngestError::UnsupportedMediaType(String::new()),
                415,
                tonic::Code::InvalidArgument,
            ),
            (
                IngestError::ReadTimeout {
                    after: std::time::Duration::from_secs(10),
                },
                408,
                tonic::Code::DeadlineExceeded,
            ),
            (
                IngestError::UnsupportedEncoding(String::new()),
                415,
                tonic::Code::Unimplemented,
            ),
            (IngestError::BrokenOff, 400, tonic::Code::InvalidArgument),
            (
                IngestError::ReadingFull {
                    retry_after: std::time::Duration::from_secs(1),
                },
                503,
                tonic::Code::Unavailable,
            ),
        ];
        for (e, http, grpc) in cases {
            assert_eq!(e.http_status(), http, "{e}");
            assert_eq!(e.grpc_code(), grpc, "{e}");
        }
    }

    #[test]
    fn a_full_reading_budget_is_retried_under_its_own_reason() {
        let after = std::time::Duration::from_secs(2);
        let e = IngestError::ReadingFull { retry_after: after };
        assert_eq!(e.retry_after(), Some(after));
        assert_eq!(e.reason(), "reading_limit");
    }
}
