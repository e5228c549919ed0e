//! Reads the bearer token once per request and records the outcome for the
//! extractors and for the idempotency layer.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use chrono::Utc;

use crate::error::ApiError;
use crate::extract::AuthOutcome;
use crate::server::AppState;

pub async fn layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(AUTHORIZATION)
        .map(|v| v.to_str().map(str::to_owned));
    let outcome = match header {
        None => None,
        Some(Err(_)) => Some(AuthOutcome::Rejected(
            "Authorization header is not ASCII".into(),
        )),
        // The scheme is case-insensitive (RFC 9110 §11.1).
        Some(Ok(value)) => match value
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
        {
            None => Some(AuthOutcome::Rejected("use the Bearer scheme".into())),
            Some(token) => match crate::auth::authenticate(&state.db, token, Utc::now()).await {
                Ok(caller) => Some(AuthOutcome::Caller(caller)),
                Err(ApiError::Unauthenticated(msg)) => Some(AuthOutcome::Rejected(msg)),
                // The database being down is not the client's fault.
                Err(other) => return axum::response::IntoResponse::into_response(other),
            },
        },
    };
    if let Some(outcome) = outcome {
        req.extensions_mut().insert(outcome);
    }
    next.run(req).await
}
