use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{Me, Membership, Page, PageParams, User, UserCreate, UserKind};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::{require_admin, stored_role};
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::{memberships, tenants, users};
use crate::error::{conflict_if_unique, ApiError};
use crate::http::extract::{Json, Path, Query};

pub fn to_api(u: users::Model) -> Result<User, ApiError> {
    let kind = UserKind::parse(&u.kind)
        .ok_or_else(|| ApiError::Internal(format!("stored user kind {:?} is unknown", u.kind)))?;
    Ok(User {
        id: u.id,
        name: u.name,
        display_name: u.display_name,
        email: u.email,
        kind,
        is_admin: u.is_admin,
        created_at: u.created_at,
        disabled: u.disabled,
    })
}

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
    require_admin(&ctx.caller, "creating users")?;
    names::user_name("name", &body.name)?;
    if let Some(d) = &body.display_name {
        names::text("display_name", d, 255)?;
    }
    if let Some(e) = &body.email {
        names::email("email", e)?;
    }
    let kind = body.kind.unwrap_or(UserKind::Local);
    if kind == UserKind::Service && body.is_admin {
        return Err(ApiError::field(
            "is_admin",
            "service accounts cannot be platform administrators",
        ));
    }
    let txn = st.db.begin().await?;
    let user = users::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(body.name.clone()),
        display_name: Set(body
            .display_name
            .clone()
            .unwrap_or_else(|| body.name.clone())),
        email: Set(body.email.clone()),
        kind: Set(kind.as_str().to_owned()),
        is_admin: Set(body.is_admin),
        disabled: Set(false),
        created_at: Set(Utc::now()),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || format!("a user named {:?} already exists", body.name))
    })?;
    audit::record(&txn, &ctx, "user.create", None, &user.name).await?;
    txn.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(to_api(user)?)))
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
    require_admin(&ctx.caller, "listing users")?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = users::Entity::find().order_by_asc(users::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(users::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |u| u.name.clone());
    Ok(axum::Json(Page {
        items: rows.into_iter().map(to_api).collect::<Result<_, _>>()?,
        next_page_token: next,
    }))
}

/// The caller and the tenants they belong to.
#[utoipa::path(
    get, path = "/api/v1/users/me", tag = "users",
    responses((status = 200, description = "The caller", body = Me), Problems)
)]
pub async fn me(State(st): State<AppState>, ctx: Actor) -> Result<axum::Json<Me>, ApiError> {
    let rows = memberships::Entity::find()
        .filter(memberships::Column::UserId.eq(ctx.caller.user.id))
        .find_also_related(tenants::Entity)
        .all(&st.db)
        .await?;
    let mut memberships = Vec::with_capacity(rows.len());
    for (m, t) in rows {
        let Some(t) = t else { continue };
        memberships.push(Membership {
            tenant: t.name,
            tenant_id: t.id,
            role: stored_role(&m.role)?,
        });
    }
    memberships.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    Ok(axum::Json(Me {
        user: to_api(ctx.caller.user)?,
        memberships,
    }))
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
    Ok(axum::Json(to_api(u)?))
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
    Ok(axum::Json(to_api(u)?))
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
