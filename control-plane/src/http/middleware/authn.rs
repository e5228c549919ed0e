//! Reads the bearer token once per request and records the outcome for the
//! extractors and for the idempotency layer.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use chrono::Utc;

use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::AuthOutcome;

pub async fn layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let outcome =
        match crate::http::extract::bearer_token(req.headers()).map(|t| t.map(str::to_owned)) {
            None => None,
            Some(Err(why)) => Some(AuthOutcome::Rejected(why.into())),
            Some(Ok(token)) => {
                match crate::app::auth::authenticate(&state.db, &token, Utc::now()).await {
                    Ok(caller) => Some(AuthOutcome::Caller(caller)),
                    Err(ApiError::Unauthenticated(msg)) => Some(AuthOutcome::Rejected(msg)),
                    // The database being down is not the client's fault.
                    Err(other) => return axum::response::IntoResponse::into_response(other),
                }
            }
        };
    if let Some(outcome) = outcome {
        req.extensions_mut().insert(outcome);
    }
    next.run(req).await
}
