use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, TokenCreate, TokenCreated, TokenInfo};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use super::Problems;
use crate::app::access::require_admin;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::paging::Paging;
use crate::entity::api_tokens;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

pub(crate) use crate::app::tokens::mint_for;

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
    let created = mint_for(&st, &ctx, &user, body).await?;
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
    require_admin(&ctx.caller, "minting tokens for other users")?;
    let user = crate::store::identity::find(&st.db, &user)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("user {user:?}")))?;
    let created = mint_for(&st, &ctx, &user, body).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

fn to_api(rows: Vec<api_tokens::Model>, user: &str) -> Vec<TokenInfo> {
    rows.into_iter()
        .map(|t| TokenInfo {
            id: t.id,
            user: user.to_owned(),
            description: t.description,
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
        })
        .collect()
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
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = api_tokens::Entity::find()
        .filter(api_tokens::Column::UserId.eq(ctx.caller.user.id))
        .filter(api_tokens::Column::RevokedAt.is_null())
        .order_by_asc(api_tokens::Column::Id);
    if let Some(after) = &paging.after {
        let after = Uuid::try_parse(after)
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        query = query.filter(api_tokens::Column::Id.gt(after));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |t| t.id.to_string());
    Ok(axum::Json(Page {
        items: to_api(rows, &ctx.caller.user.name),
        next_page_token: next,
    }))
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
