//! Project shares: directories on the filesystem every host mounts,
//! mounted into the tenant's VMs (and whole clusters) with virtiofs.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, Share, ShareCreate, ShareGrow, ShareMountRequest};

use super::Problems;
use crate::app::shares as app;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Make a share (members), within the tenant's `share_gib` quota and its
/// points. Charged per GiB-hour of its size while it exists (rate card
/// class `share_gib`).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/shares", tag = "shares",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = ShareCreate,
    responses((status = 201, description = "Created (a host makes its directory: state `creating`, then `available`)", body = Share), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<ShareCreate>,
) -> Result<(StatusCode, axum::Json<Share>), ApiError> {
    let s = app::create(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(s)))
}

/// The tenant's shares (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/shares", tag = "shares",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Share>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Share>>, ApiError> {
    Ok(axum::Json(app::list(&st, &ctx, &tenant, &q).await?))
}

/// One share with its usage and mounts (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/shares/{share}", tag = "shares",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("share" = String, Path, description = "Share name or id")),
    responses((status = 200, description = "The share", body = Share), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, share)): Path<(String, String)>,
) -> Result<axum::Json<Share>, ApiError> {
    Ok(axum::Json(app::show(&st, &ctx, &tenant, &share).await?))
}

/// Delete a share no VM mounts, and its data (members); 409 while mounted.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/shares/{share}", tag = "shares",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("share" = String, Path, description = "Share name or id")),
    responses((status = 202, description = "Deleting (a host removes its directory)"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, share)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    app::delete(&st, &ctx, &tenant, &share).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Grow a share (members); it never shrinks.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/shares/{share}/grow", tag = "shares",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("share" = String, Path, description = "Share name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = ShareGrow,
    responses((status = 200, description = "Grown (its limit follows on the filesystem)", body = Share), Problems)
)]
pub async fn grow(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, share)): Path<(String, String)>,
    Json(body): Json<ShareGrow>,
) -> Result<axum::Json<Share>, ApiError> {
    Ok(axum::Json(
        app::grow(&st, &ctx, &tenant, &share, &body).await?,
    ))
}

/// Mount a share in a VM (members). libvirt cannot add a virtiofs
/// filesystem to a running guest: a running VM gets it at its next start,
/// and its mount's condition says so.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms/{vm}/shares", tag = "shares",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("vm" = String, Path, description = "VM name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = ShareMountRequest,
    responses((status = 200, description = "Mounted (the share, with its mounts)", body = Share), Problems)
)]
pub async fn mount(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
    Json(body): Json<ShareMountRequest>,
) -> Result<axum::Json<Share>, ApiError> {
    Ok(axum::Json(
        app::mount(&st, &ctx, &tenant, &vm, &body).await?,
    ))
}

/// Take a share out of a VM (members), from its next start; the data
/// stays.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/vms/{vm}/shares/{share}", tag = "shares",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("vm" = String, Path, description = "VM name or id"),
        ("share" = String, Path, description = "Share name or id"),
    ),
    responses((status = 204, description = "Unmounted"), Problems)
)]
pub async fn unmount(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm, share)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    app::unmount(&st, &ctx, &tenant, &vm, &share).await?;
    Ok(StatusCode::NO_CONTENT)
}
