//! The Gate API's HTTP mirror on the admin port: `POST /v1/decide` (JSON, the gRPC messages'
//! lowerCamelCase names) and `GET /v1/alerts/stream` (server-sent events, one `alert` event
//! per violation, filtered by the `client`, `interface` and `minSeverity` query parameters).
//!
//! Edge: parses, calls [`super::decide`], serialises.

use super::{Filter, Question};
use crate::clock;
use crate::pipeline::Pipeline;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::StreamExt;

#[derive(Clone)]
struct Mirror {
    pipeline: Arc<Pipeline>,
    ids: Arc<AtomicU64>,
    stop: tokio::sync::watch::Receiver<bool>,
}

/// The mirror's routes, to merge into the admin router (behind its tokens); its event
/// streams end when `stop` turns true.
pub fn routes(pipeline: Arc<Pipeline>, stop: tokio::sync::watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/v1/decide", post(decide))
        .route("/v1/alerts/stream", get(stream))
        .with_state(Mirror {
            pipeline,
            // Apart from the gRPC service's ids: the high bit marks the mirror's.
            ids: Arc::new(AtomicU64::new(1 << 63)),
            stop,
        })
}

async fn decide(
    State(m): State<Mirror>,
    grant: Option<axum::Extension<crate::access::Grant>>,
    body: Result<Json<Question>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let q = match body {
        Ok(Json(q)) => q,
        // A body past the limit (axum's 2 MB) is too large, not malformed.
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, &e.body_text())
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    // The admin endpoint's guard puts the token's grant here; without it, the asker may do
    // everything (no tokens).
    let grant = grant.map(|g| g.0).unwrap_or_default();
    if let Err(e) = super::permitted(&grant, &q) {
        m.pipeline.metrics().gate_refused("http", "not_permitted");
        return error(StatusCode::FORBIDDEN, &e.to_string());
    }
    let id = m.ids.fetch_add(1, Ordering::Relaxed);
    match super::decide(&m.pipeline, &q, clock::now(), id) {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// How often a quiet alert stream sends a comment. Besides keeping proxies from closing it,
/// the comment is how a watcher's hang-up is noticed where the connection cannot see it (a
/// request pipelined behind the stream, or a request body never finished, leaves the
/// connection unread): the write after the peer has gone fails, and the watcher's place under
/// `alerting.max_watchers` is given back within two of these.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

async fn stream(State(m): State<Mirror>, Query(filter): Query<Filter>) -> Response {
    let filter = filter.as_labels(m.pipeline.metrics().max_label_bytes());
    let Some(alerts) = super::alerts_until(m.pipeline.alerter(), filter, m.stop.clone(), "sse")
    else {
        let mut refused = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "alerting.max_watchers watchers are already open; try again later",
        );
        refused.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
        return refused;
    };
    let alerts = alerts.filter_map(|a| {
        let json = serde_json::to_string(&super::grpc::alert(&a)).ok()?;
        Some(Ok::<_, std::convert::Infallible>(
            Event::default().event("alert").data(json),
        ))
    });
    Sse::new(alerts)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
