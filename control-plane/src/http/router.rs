//! Assembling the HTTP stack: the API with its middleware, docs, SSO, the
//! device login and the portal.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::context::AppState;
use crate::http::{api, middleware};

/// The whole HTTP application: API, docs, health, metrics.
pub fn router(state: AppState) -> Router {
    let (api_routes, openapi) = api::router().split_for_parts();
    let api_routes = api_routes
        .merge(api::consoles::sockets())
        .layer(from_fn_with_state(
            state.clone(),
            middleware::idempotency::layer,
        ))
        .layer(from_fn_with_state(state.clone(), middleware::authn::layer));
    let timeout = state.config.request_timeout;
    let body_limit = state.config.body_limit_bytes;
    Router::new()
        .merge(api_routes)
        .merge(api::consoles::internal())
        .merge(api::docs::router(Arc::new(openapi)))
        .merge(crate::http::sso::routes())
        .merge(crate::http::device_login::routes())
        .merge(crate::http::portal::routes())
        // An empty 404 becomes a problem in the normaliser below.
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(from_fn_with_state(state.clone(), middleware::metrics::layer))
        .with_state(state)
        .layer(
            ServiceBuilder::new()
                .layer(from_fn(middleware::request_ids::layer))
                .layer(TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                    let header = |name| {
                        req.headers()
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                    };
                    let request_id = header(crate::http::extract::REQUEST_ID_HEADER);
                    let client_request_id =
                        header(middleware::request_ids::CLIENT_REQUEST_ID_HEADER);
                    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id, client_request_id)
                })
                // One access-log line per request, with status and latency.
                .on_response(DefaultOnResponse::new().level(Level::INFO))
                .on_failure(DefaultOnFailure::new().level(Level::WARN)))
                // Outside the normaliser, which must read bodies uncompressed.
                .layer(CompressionLayer::new())
                .layer(from_fn(middleware::problems::layer))
                .layer(from_fn(middleware::headers::layer))
                .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
                .layer(DefaultBodyLimit::max(body_limit)),
        )
}
