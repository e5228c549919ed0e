//! Public addressing: pools (platform admins), tenants' public IPs with
//! their 1:1 floating attachment, and port forwards.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{
    Page, PageParams, PortForward, PortForwardCreate, PublicIp, PublicIpAllocate, PublicIpAttach,
    PublicIpPool, PublicIpPoolCreate,
};

use super::Problems;
use crate::app::public_net as app;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Add a pool of provider-network addresses (platform admins). It may
/// not overlap another pool or the tenant ranges.
#[utoipa::path(
    post, path = "/api/v1/public-ip-pools", tag = "public-ips",
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    request_body = PublicIpPoolCreate,
    responses((status = 201, description = "Created", body = PublicIpPool), Problems)
)]
pub async fn create_pool(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<PublicIpPoolCreate>,
) -> Result<(StatusCode, axum::Json<PublicIpPool>), ApiError> {
    let p = app::create_pool(&st, &ctx, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(p)))
}

/// The pools with how many addresses are in use (platform admins).
#[utoipa::path(
    get, path = "/api/v1/public-ip-pools", tag = "public-ips",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<PublicIpPool>)), Problems)
)]
pub async fn list_pools(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<PublicIpPool>>, ApiError> {
    Ok(axum::Json(app::list_pools(&st, &ctx, &q).await?))
}

/// Delete a pool with no address in use (platform admins).
#[utoipa::path(
    delete, path = "/api/v1/public-ip-pools/{pool}", tag = "public-ips",
    params(("pool" = String, Path, description = "Pool name or id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete_pool(
    State(st): State<AppState>,
    ctx: Actor,
    Path(pool): Path<String>,
) -> Result<StatusCode, ApiError> {
    app::delete_pool(&st, &ctx, &pool).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Allocate a public IP to the tenant (members), within its `public_ips`
/// quota; charged per hour while held (rate card class `public_ip`).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/public-ips", tag = "public-ips",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = PublicIpAllocate,
    responses((status = 201, description = "Allocated", body = PublicIp), Problems)
)]
pub async fn allocate(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<PublicIpAllocate>,
) -> Result<(StatusCode, axum::Json<PublicIp>), ApiError> {
    let ip = app::allocate(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(ip)))
}

/// The tenant's public IPs (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/public-ips", tag = "public-ips",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<PublicIp>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<PublicIp>>, ApiError> {
    Ok(axum::Json(app::list(&st, &ctx, &tenant, &q).await?))
}

/// One of the tenant's public IPs (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/public-ips/{address}", tag = "public-ips",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("address" = String, Path, description = "The address")),
    responses((status = 200, description = "The address", body = PublicIp), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, address)): Path<(String, String)>,
) -> Result<axum::Json<PublicIp>, ApiError> {
    Ok(axum::Json(app::show(&st, &ctx, &tenant, &address).await?))
}

/// Release a public IP (members): its floating mapping and forwards go
/// with it.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/public-ips/{address}", tag = "public-ips",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("address" = String, Path, description = "The address")),
    responses((status = 204, description = "Released"), Problems)
)]
pub async fn release(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, address)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    app::release(&st, &ctx, &tenant, &address).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Make the address a VM NIC's 1:1 floating address (members). Traffic
/// from outside reaches the VM as its segment's ingress rules allow; the
/// VM's own outbound traffic leaves from this address.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/public-ips/{address}/attach", tag = "public-ips",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("address" = String, Path, description = "The address"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = PublicIpAttach,
    responses((status = 200, description = "Attached", body = PublicIp), Problems)
)]
pub async fn attach(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, address)): Path<(String, String)>,
    Json(body): Json<PublicIpAttach>,
) -> Result<axum::Json<PublicIp>, ApiError> {
    Ok(axum::Json(
        app::attach(&st, &ctx, &tenant, &address, &body).await?,
    ))
}

/// Take the address off its NIC (members); the tenant keeps it.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/public-ips/{address}/detach", tag = "public-ips",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("address" = String, Path, description = "The address"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "Detached", body = PublicIp), Problems)
)]
pub async fn detach(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, address)): Path<(String, String)>,
) -> Result<axum::Json<PublicIp>, ApiError> {
    Ok(axum::Json(app::detach(&st, &ctx, &tenant, &address).await?))
}

/// Forward a port of one of the tenant's (unattached) public IPs to a
/// VM's port (members).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/port-forwards", tag = "public-ips",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = PortForwardCreate,
    responses((status = 201, description = "Created", body = PortForward), Problems)
)]
pub async fn create_forward(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<PortForwardCreate>,
) -> Result<(StatusCode, axum::Json<PortForward>), ApiError> {
    let f = app::create_forward(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(f)))
}

/// The tenant's port forwards (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/port-forwards", tag = "public-ips",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<PortForward>)), Problems)
)]
pub async fn list_forwards(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<PortForward>>, ApiError> {
    Ok(axum::Json(
        app::list_forwards(&st, &ctx, &tenant, &q).await?,
    ))
}

/// Delete a port forward (members).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/port-forwards/{id}", tag = "public-ips",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("id" = String, Path, description = "The forward's id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete_forward(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    app::delete_forward(&st, &ctx, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
