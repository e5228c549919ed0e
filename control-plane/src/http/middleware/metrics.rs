use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::context::AppState;

/// Records every request under its route template, so that ids in paths do
/// not explode the label space.
pub async fn layer(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    state.metrics.observe(
        &method,
        &route,
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}
