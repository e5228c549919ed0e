use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Member, MemberPut, Page, PageParams};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// List a tenant's members (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/members", tag = "members",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Member>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Member>>, ApiError> {
    Ok(axum::Json(
        crate::app::members::list(&st, &ctx, &tenant, &q).await?,
    ))
}

/// Add a member or change their role (owners).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/members/{user}", tag = "members",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("user" = String, Path, description = "User name or id"),
    ),
    request_body = MemberPut,
    responses(
        (status = 201, description = "Added", body = Member),
        (status = 200, description = "Role changed", body = Member),
        Problems
    )
)]
pub async fn put(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, user)): Path<(String, String)>,
    Json(body): Json<MemberPut>,
) -> Result<(StatusCode, axum::Json<Member>), ApiError> {
    let (created, member) = crate::app::members::put(&st, &ctx, &tenant, &user, &body).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(member)))
}

/// Remove a member (owners).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/members/{user}", tag = "members",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("user" = String, Path, description = "User name or id"),
    ),
    responses((status = 204, description = "Removed"), Problems)
)]
pub async fn remove(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, user)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    crate::app::members::remove(&st, &ctx, &tenant, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}
