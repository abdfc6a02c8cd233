//! The admin endpoint: `/metrics` (Prometheus text exposition), `/healthz`, `/readyz`,
//! `/api/v1/alerts`, and the console — its page on `/` and `/clients/{client}`, and the JSON
//! it reads, `/api/v1/status` and `/api/v1/clients/{client}`. With `admin.auth` tokens,
//! everything but the two probes and the page's own HTML, CSS and script (which hold no
//! data, and ask for the token) requires one (401 otherwise: Prometheus sends it with
//! `authorization: { credentials: … }`).
//!
//! Edge. A read of `/metrics` (or of `/api/v1/alerts`, the firing alerts) first settles every
//! pending verdict, so it shows every attempt received before it, each counted once, and
//! counters never go down.

use crate::access::Tokens;
use crate::console;
use crate::pipeline::Pipeline;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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
    trace_url: Option<Arc<str>>,
}

/// The admin router. `ready` is true while the receivers accept data; `tokens` guard
/// everything but the probes and the console's page; `stop` ends the Gate API's event
/// streams; `trace_url` links alerts and attempts to their traces.
pub fn router(
    pipeline: Arc<Pipeline>,
    ready: Arc<AtomicBool>,
    tokens: Arc<Tokens>,
    stop: tokio::sync::watch::Receiver<bool>,
    trace_url: Option<String>,
) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/alerts", get(alerts))
        .route("/api/v1/status", get(status))
        .route("/api/v1/clients/{client}", get(client))
        .merge(crate::gate::http::routes(Arc::clone(&pipeline), stop).with_state(()))
        .route_layer(middleware::from_fn(
            move |mut request: Request, next: Next| {
                let tokens = Arc::clone(&tokens);
                async move {
                    let authorization = request.headers().get(header::AUTHORIZATION);
                    // The token's grant goes with the request: the Gate's mirror reads it.
                    if let Some(grant) = tokens.grant(authorization.map(HeaderValue::as_bytes)) {
                        request.extensions_mut().insert(grant);
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
            },
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/", get(page))
        .route("/clients/{client}", get(page))
        .route("/console.css", get(|| asset("text/css", console::CSS)))
        .route("/console.js", get(|| asset("text/javascript", console::JS)))
        .merge(guarded)
        .with_state(Admin {
            pipeline,
            ready,
            trace_url: trace_url.map(Arc::from),
        })
        .layer(middleware::map_response(no_sniffing))
}

/// Every admin answer, the 404 of a path it does not serve included, is read as the type it
/// says it is (`nosniff`): a browser never runs a JSON body or a label value as a script.
async fn no_sniffing(mut response: axum::response::Response) -> axum::response::Response {
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The console's page: the same HTML for every view, which its script chooses by path.
async fn page() -> impl IntoResponse {
    asset("text/html; charset=utf-8", console::PAGE).await
}

async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Everything the page uses is its own: nothing from elsewhere may run in it, and
            // no other site may frame it (to lure a click on it).
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// Settles every pending verdict before an answer that shows them, on the blocking pool: it
/// waits for the held calls' lock, which a large request's join may hold, and an async worker
/// must not wait there (`/readyz` and the receivers need it).
async fn settle(pipeline: &Arc<Pipeline>) {
    let pipeline = Arc::clone(pipeline);
    let now = crate::clock::now();
    let _ = tokio::task::spawn_blocking(move || pipeline.settle(true, now)).await;
}

/// `GET /api/v1/status`: the console's fleet (one page of it), alerts, interfaces and health.
async fn status(
    State(admin): State<Admin>,
    Query(mut q): Query<console::FleetQuery>,
) -> impl IntoResponse {
    let now = crate::clock::now();
    settle(&admin.pipeline).await;
    admin
        .pipeline
        .metrics()
        .set_tracker_keys(admin.pipeline.tracker().keys());
    q.limit = Some(q.limit.unwrap_or(50).min(console::MAX_LIMIT));
    let body = console::status(&admin.pipeline, &q, now, admin.trace_url.as_deref());
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

/// `GET /api/v1/clients/{client}`: one client's figures and story, found by its name as its
/// label is (a name longer than `metrics.max_label_bytes` is cut as the label was); 404 for a
/// client not known, whose body does not repeat the name.
async fn client(State(admin): State<Admin>, Path(name): Path<String>) -> axum::response::Response {
    settle(&admin.pipeline).await;
    let name = crate::label::shorten(&name, admin.pipeline.metrics().max_label_bytes());
    match console::client(&admin.pipeline, &name, admin.trace_url.as_deref()) {
        Some(story) => (
            [(header::CONTENT_TYPE, "application/json")],
            story.to_string(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such client\n").into_response(),
    }
}

/// `/metrics`: OpenMetrics text (with exemplars) when the scraper's `Accept` asks for it, as
/// Prometheus does; the 0.0.4 text format otherwise.
async fn metrics(State(admin): State<Admin>, headers: HeaderMap) -> impl IntoResponse {
    settle(&admin.pipeline).await;
    admin
        .pipeline
        .metrics()
        .set_tracker_keys(admin.pipeline.tracker().keys());
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = crate::openmetrics::negotiate(accept);
    (
        [
            (header::CONTENT_TYPE, format.content_type()),
            (header::VARY, "Accept".to_owned()),
        ],
        admin.pipeline.metrics().render_as(format),
    )
}

/// The firing alerts, in the shape of Prometheus's `/api/v1/alerts`.
async fn alerts(State(admin): State<Admin>) -> impl IntoResponse {
    settle(&admin.pipeline).await;
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
