use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{
    Device, DeviceAction, DeviceList, DeviceQuery, Host, HostDetail, JoinTokenCreate,
    JoinTokenCreated, JoinTokenInfo, Page, PageParams,
};

use super::Problems;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create a join token for registering hosts (platform admins). It is
/// good for `uses` registrations (default one).
#[utoipa::path(
    post, path = "/api/v1/hosts/join-tokens", tag = "hosts",
    request_body = JoinTokenCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = JoinTokenCreated), Problems)
)]
pub async fn create_join_token(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<JoinTokenCreate>,
) -> Result<(StatusCode, axum::Json<JoinTokenCreated>), ApiError> {
    let made = crate::app::hosts::create_join_token(&st, &ctx, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(made)))
}

/// List join tokens with their uses, never their secrets (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts/join-tokens", tag = "hosts",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<JoinTokenInfo>)), Problems)
)]
pub async fn list_join_tokens(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<JoinTokenInfo>>, ApiError> {
    Ok(axum::Json(
        crate::app::hosts::list_join_tokens(&st, &ctx, &q).await?,
    ))
}

/// Revoke a join token: it registers no more hosts (platform admins).
#[utoipa::path(
    delete, path = "/api/v1/hosts/join-tokens/{id}", tag = "hosts",
    params(("id" = Uuid, Path, description = "Join token id")),
    responses((status = 204, description = "Revoked"), Problems)
)]
pub async fn revoke_join_token(
    State(st): State<AppState>,
    ctx: Actor,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::hosts::revoke_join_token(&st, &ctx, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Let a registered host join again with a join token (platform admins):
/// its current credential is revoked at once.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/rejoin", tag = "hosts",
    params(("host" = String, Path, description = "Host name or id"), ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 204, description = "Its next registration is let in"), Problems)
)]
pub async fn rejoin(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::hosts::allow_rejoin(&st, &ctx, &host).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List hosts by name (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts", tag = "hosts",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Host>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Host>>, ApiError> {
    Ok(axum::Json(crate::app::fleet::list(&st, &ctx, &q).await?))
}

/// Show a host with its topology, GPU/NIC matrix and allocations (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts/{host}", tag = "hosts",
    params(("host" = String, Path, description = "Host name or id")),
    responses((status = 200, description = "The host", body = HostDetail), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<HostDetail>, ApiError> {
    Ok(axum::Json(crate::app::fleet::show(&st, &ctx, &host).await?))
}

/// Drain a host (platform admins): no new placements on it; its spot VMs
/// are reclaimed with the usual notice and grace period; guaranteed VMs
/// keep running. Idempotent.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/drain", tag = "hosts",
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "The host, draining", body = Host), Problems)
)]
pub async fn drain(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<Host>, ApiError> {
    Ok(axum::Json(
        crate::app::fleet::set_drained(&st, &ctx, &host, true).await?,
    ))
}

/// Take a host back into service (platform admins). Idempotent.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/undrain", tag = "hosts",
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "The host, ready", body = Host), Problems)
)]
pub async fn undrain(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<Host>, ApiError> {
    Ok(axum::Json(
        crate::app::fleet::set_drained(&st, &ctx, &host, false).await?,
    ))
}

/// The fleet's passed-through devices with their health (platform
/// admins): state, why, since when, the VMs holding each, and its last
/// reading (AER totals, PCIe link, RDMA ports and RoCE counters).
#[utoipa::path(
    get, path = "/api/v1/devices", tag = "hosts",
    params(DeviceQuery),
    responses((status = 200, description = "The devices", body = DeviceList), Problems)
)]
pub async fn devices(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<DeviceQuery>,
) -> Result<axum::Json<DeviceList>, ApiError> {
    Ok(axum::Json(
        crate::app::device_health::list(&st, &ctx, &q).await?,
    ))
}

/// An operator's step on a device (platform admins): `quarantine` (no new
/// VMs on it; its spot VMs are reclaimed), `repair` (it is being worked
/// on), `validate` (repaired: the next clean reading makes it healthy, a
/// finding quarantines it again).
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/devices/{bdf}/{action}", tag = "hosts",
    request_body = DeviceAction,
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("bdf" = String, Path, description = "The device's PCI address, e.g. 0000:18:00.0"),
        ("action" = String, Path, description = "quarantine, repair or validate"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "The device", body = Device), Problems)
)]
pub async fn device_action(
    State(st): State<AppState>,
    ctx: Actor,
    Path((host, bdf, action)): Path<(String, String, String)>,
    Json(body): Json<DeviceAction>,
) -> Result<axum::Json<Device>, ApiError> {
    Ok(axum::Json(
        crate::app::device_health::act(&st, &ctx, &host, &bdf, &action, &body).await?,
    ))
}

/// Schedule (or move) a host's maintenance window (platform admins): from
/// now the host takes nothing new, and every VM on it is told what will
/// happen at `at` (its events, `scheduled_events`, the project's webhook,
/// `/run/kumo/events` in the guest); at `at` VMs that can move are moved to
/// other hosts with their disks, cluster members replaced elsewhere, the
/// rest stopped, and the host is `maintenance` until it is done.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/maintenance", tag = "hosts",
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = kumo_api_types::MaintenanceCreate,
    responses((status = 200, description = "The host with its window", body = Host), Problems)
)]
pub async fn maintenance(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
    Json(body): Json<kumo_api_types::MaintenanceCreate>,
) -> Result<axum::Json<Host>, ApiError> {
    Ok(axum::Json(
        crate::app::maintenance::schedule(&st, &ctx, &host, &body).await?,
    ))
}

/// End a host's maintenance, or call off a window not yet open (platform
/// admins): it takes VMs again.
#[utoipa::path(
    delete, path = "/api/v1/hosts/{host}/maintenance", tag = "hosts",
    params(("host" = String, Path, description = "Host name or id")),
    responses((status = 200, description = "The host, back in service", body = Host), Problems)
)]
pub async fn maintenance_done(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<Host>, ApiError> {
    Ok(axum::Json(
        crate::app::maintenance::done(&st, &ctx, &host).await?,
    ))
}
