//! The admin endpoint: `/metrics` (Prometheus text exposition), `/healthz`, `/readyz`,
//! `/api/v1/alerts`. With `admin.auth` tokens, everything but the two probes requires one
//! (401 otherwise: Prometheus sends it with `authorization: { credentials: … }`).
//!
//! Edge. A read of `/metrics` (or of `/api/v1/alerts`, the firing alerts) first settles every
//! pending verdict, so it shows every attempt received before it, each counted once, and
//! counters never go down.

use crate::access::Tokens;
use crate::pipeline::Pipeline;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone)]
struct Admin {
    pipeline: Arc<Pipeline>,
    ready: Arc<AtomicBool>,
}

/// The admin router. `ready` is true while the receivers accept data; `tokens` guard
/// everything but the probes; `stop` ends the Gate API's event streams.
pub fn router(
    pipeline: Arc<Pipeline>,
    ready: Arc<AtomicBool>,
    tokens: Arc<Tokens>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/alerts", get(alerts))
        .merge(crate::gate::http::routes(Arc::clone(&pipeline), stop).with_state(()))
        .route_layer(middleware::from_fn(move |request: Request, next: Next| {
            let tokens = Arc::clone(&tokens);
            async move {
                let authorization = request.headers().get(header::AUTHORIZATION);
                if tokens.admit(authorization.map(HeaderValue::as_bytes)) {
                    next.run(request).await
                } else {
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "a bearer token is required\n",
                    )
                        .into_response()
                }
            }
        }));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(guarded)
        .with_state(Admin { pipeline, ready })
}

async fn metrics(State(admin): State<Admin>) -> impl IntoResponse {
    admin.pipeline.settle(true, crate::clock::now());
    admin
        .pipeline
        .metrics()
        .set_tracker_keys(admin.pipeline.tracker().keys());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        admin.pipeline.metrics().render(),
    )
}

/// The firing alerts, in the shape of Prometheus's `/api/v1/alerts`.
async fn alerts(State(admin): State<Admin>) -> impl IntoResponse {
    admin.pipeline.settle(true, crate::clock::now());
    let firing = admin.pipeline.alerter().firing(crate::clock::now());
    let alerts: Vec<serde_json::Value> = crate::alert::delivery::to_json(&firing, "")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut a| {
            if let Some(o) = a.as_object_mut() {
                o.remove("generatorURL");
                o.insert("state".into(), "firing".into());
            }
            a
        })
        .collect();
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "status": "success", "data": { "alerts": alerts } }).to_string(),
    )
}

async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    if admin.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    }
}
