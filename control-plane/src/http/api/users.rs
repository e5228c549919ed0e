use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Me, Page, PageParams, User, UserCreate};

use super::Problems;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create a local or service account (platform admins).
#[utoipa::path(
    post, path = "/api/v1/users", tag = "users",
    request_body = UserCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = User), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<UserCreate>,
) -> Result<(StatusCode, axum::Json<User>), ApiError> {
    let user = crate::app::users::create(&st, &ctx, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(user)))
}

/// List users by name (platform admins).
#[utoipa::path(
    get, path = "/api/v1/users", tag = "users",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<User>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<User>>, ApiError> {
    Ok(axum::Json(crate::app::users::list(&st, &ctx, &q).await?))
}

/// The caller and the tenants they belong to.
#[utoipa::path(
    get, path = "/api/v1/users/me", tag = "users",
    responses((status = 200, description = "The caller", body = Me), Problems)
)]
pub async fn me(State(st): State<AppState>, ctx: Actor) -> Result<axum::Json<Me>, ApiError> {
    Ok(axum::Json(crate::app::users::me(&st, &ctx).await?))
}

/// Disable a user (platform admins): their tokens fail at once and their
/// portal sessions end; nothing of theirs is deleted.
#[utoipa::path(
    post, path = "/api/v1/users/{user}/disable", tag = "users",
    params(("user" = String, Path, description = "User name or id"), ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 200, description = "Disabled", body = User), Problems)
)]
pub async fn disable(
    State(st): State<AppState>,
    ctx: Actor,
    Path(user): Path<String>,
) -> Result<axum::Json<User>, ApiError> {
    let u = crate::app::users::set_disabled(&st, &ctx, &user, true).await?;
    Ok(axum::Json(crate::app::users::to_api(u)?))
}

/// Enable a disabled user again (platform admins). Tokens that were not
/// revoked or expired meanwhile work again; sessions must be opened anew.
#[utoipa::path(
    post, path = "/api/v1/users/{user}/enable", tag = "users",
    params(("user" = String, Path, description = "User name or id"), ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 200, description = "Enabled", body = User), Problems)
)]
pub async fn enable(
    State(st): State<AppState>,
    ctx: Actor,
    Path(user): Path<String>,
) -> Result<axum::Json<User>, ApiError> {
    let u = crate::app::users::set_disabled(&st, &ctx, &user, false).await?;
    Ok(axum::Json(crate::app::users::to_api(u)?))
}

/// End a user's portal sessions (platform admins, or the user for their
/// own): every browser signed in as them is signed out.
#[utoipa::path(
    delete, path = "/api/v1/users/{user}/sessions", tag = "users",
    params(("user" = String, Path, description = "User name or id")),
    responses((status = 204, description = "Ended"), Problems)
)]
pub async fn end_sessions(
    State(st): State<AppState>,
    ctx: Actor,
    Path(user): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::users::end_sessions(&st, &ctx, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}
