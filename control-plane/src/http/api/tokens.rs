use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, TokenCreate, TokenCreated, TokenInfo};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create an API token for the caller. The secret is in this answer only.
#[utoipa::path(
    post, path = "/api/v1/tokens", tag = "tokens",
    request_body = TokenCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = TokenCreated), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<TokenCreate>,
) -> Result<(StatusCode, axum::Json<TokenCreated>), ApiError> {
    let user = ctx.caller.user.clone();
    let created = crate::app::tokens::mint_for(&st, &ctx, &user, body).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// Mint a token for another user, e.g. a service account (platform admins).
#[utoipa::path(
    post, path = "/api/v1/users/{user}/tokens", tag = "tokens",
    params(
        ("user" = String, Path, description = "User name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = TokenCreate,
    responses((status = 201, description = "Created", body = TokenCreated), Problems)
)]
pub async fn create_for_user(
    State(st): State<AppState>,
    ctx: Actor,
    Path(user): Path<String>,
    Json(body): Json<TokenCreate>,
) -> Result<(StatusCode, axum::Json<TokenCreated>), ApiError> {
    let created = crate::app::tokens::mint_for_named(&st, &ctx, &user, body).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// List the caller's tokens that are not revoked, oldest first.
#[utoipa::path(
    get, path = "/api/v1/tokens", tag = "tokens",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<TokenInfo>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<TokenInfo>>, ApiError> {
    Ok(axum::Json(crate::app::tokens::list(&st, &ctx, &q).await?))
}

/// Revoke a token: the caller's own, or any token for platform admins.
#[utoipa::path(
    delete, path = "/api/v1/tokens/{id}", tag = "tokens",
    params(("id" = Uuid, Path, description = "Token id")),
    responses((status = 204, description = "Revoked"), Problems)
)]
pub async fn revoke(
    State(st): State<AppState>,
    ctx: Actor,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::tokens::revoke(&st, &ctx, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
