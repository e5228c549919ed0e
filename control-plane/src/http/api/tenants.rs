use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, Tenant, TenantCreate, TenantUpdate};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create a tenant (platform admins).
#[utoipa::path(
    post, path = "/api/v1/tenants", tag = "tenants",
    request_body = TenantCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = Tenant), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<TenantCreate>,
) -> Result<(StatusCode, axum::Json<Tenant>), ApiError> {
    let t = crate::app::tenants::create(&st, &ctx, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(t)))
}

/// List the tenants the caller can see (admins: all), by name.
#[utoipa::path(
    get, path = "/api/v1/tenants", tag = "tenants",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Tenant>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Tenant>>, ApiError> {
    Ok(axum::Json(crate::app::tenants::list(&st, &ctx, &q).await?))
}

/// Show a tenant (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The tenant", body = Tenant), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Tenant>, ApiError> {
    Ok(axum::Json(
        crate::app::tenants::show(&st, &ctx, &tenant).await?,
    ))
}

/// Change a tenant's display name or description (owners).
#[utoipa::path(
    patch, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = TenantUpdate,
    responses((status = 200, description = "The updated tenant", body = Tenant), Problems)
)]
pub async fn update(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<TenantUpdate>,
) -> Result<axum::Json<Tenant>, ApiError> {
    Ok(axum::Json(
        crate::app::tenants::update(&st, &ctx, &tenant, body).await?,
    ))
}

/// Delete a tenant with its memberships and quota (platform admins).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::tenants::delete(&st, &ctx, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}
