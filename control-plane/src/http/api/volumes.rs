//! Volumes: block devices that outlive VMs, on one host's storage, the
//! disk of at most one VM on that host at a time.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{
    Page, PageParams, Volume, VolumeAttach, VolumeCreate, VolumeMove, VolumeResize, VolumeSnapshot,
    VolumeSnapshotCreate,
};

use super::Problems;
use crate::app::volumes as app;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Make a volume (members), within the tenant's `volume_gib` quota; on
/// the named VM's host, or where Kumo puts it. Charged per GiB-hour while
/// it exists (rate card class `volume_gib`).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VolumeCreate,
    responses((status = 201, description = "Created (its host makes it: state `creating`, then `available`)", body = Volume), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<VolumeCreate>,
) -> Result<(StatusCode, axum::Json<Volume>), ApiError> {
    let v = app::create(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(v)))
}

/// The tenant's volumes (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/volumes", tag = "volumes",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Volume>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Volume>>, ApiError> {
    Ok(axum::Json(app::list(&st, &ctx, &tenant, &q).await?))
}

/// One volume (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/volumes/{volume}", tag = "volumes",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("volume" = String, Path, description = "Volume name or id")),
    responses((status = 200, description = "The volume", body = Volume), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
) -> Result<axum::Json<Volume>, ApiError> {
    Ok(axum::Json(app::show(&st, &ctx, &tenant, &volume).await?))
}

/// Delete a detached volume and its data (members); 409 while attached.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/volumes/{volume}", tag = "volumes",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("volume" = String, Path, description = "Volume name or id")),
    responses((status = 202, description = "Deleting (its host removes it)"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    app::delete(&st, &ctx, &tenant, &volume).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Grow a detached volume (members); it never shrinks.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes/{volume}/resize", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VolumeResize,
    responses((status = 200, description = "Growing", body = Volume), Problems)
)]
pub async fn resize(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
    Json(body): Json<VolumeResize>,
) -> Result<axum::Json<Volume>, ApiError> {
    Ok(axum::Json(
        app::resize(&st, &ctx, &tenant, &volume, &body).await?,
    ))
}

/// Attach a volume to a VM on its host (members): hot-plugged into the
/// running VM and kept in its definition; the guest finds it at
/// `/dev/disk/by-id/virtio-<serial>`.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes/{volume}/attach", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VolumeAttach,
    responses((status = 200, description = "Attached", body = Volume), Problems)
)]
pub async fn attach(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
    Json(body): Json<VolumeAttach>,
) -> Result<axum::Json<Volume>, ApiError> {
    Ok(axum::Json(
        app::attach(&st, &ctx, &tenant, &volume, &body).await?,
    ))
}

/// Move a detached volume to another host (members): its host's agent
/// sends it to that host's agent, which keeps it once the copy is whole
/// and its checksum matches; `moving` until then. Naming the host it is
/// on cancels a move under way. 409 while attached, with snapshots, or
/// towards a host that is not ready.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes/{volume}/move", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VolumeMove,
    responses((status = 200, description = "Moving (or, to its own host, no longer)", body = Volume), Problems)
)]
pub async fn move_to(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
    Json(body): Json<VolumeMove>,
) -> Result<axum::Json<Volume>, ApiError> {
    Ok(axum::Json(
        app::move_to(&st, &ctx, &tenant, &volume, &body).await?,
    ))
}

/// Detach a volume from its VM (members); the volume and its data stay.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes/{volume}/detach", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "Detached", body = Volume), Problems)
)]
pub async fn detach(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
) -> Result<axum::Json<Volume>, ApiError> {
    Ok(axum::Json(app::detach(&st, &ctx, &tenant, &volume).await?))
}

/// Snapshot a detached volume (members), within the `volume_gib` quota;
/// charged per GiB-hour (rate card class `snapshot_gib`).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VolumeSnapshotCreate,
    responses((status = 201, description = "Created (its host makes it)", body = VolumeSnapshot), Problems)
)]
pub async fn create_snapshot(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
    Json(body): Json<VolumeSnapshotCreate>,
) -> Result<(StatusCode, axum::Json<VolumeSnapshot>), ApiError> {
    let s = app::create_snapshot(&st, &ctx, &tenant, &volume, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(s)))
}

/// A volume's snapshots (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots", tag = "volumes",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("volume" = String, Path, description = "Volume name or id")),
    responses((status = 200, description = "Its snapshots, oldest first", body = Vec<VolumeSnapshot>), Problems)
)]
pub async fn list_snapshots(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume)): Path<(String, String)>,
) -> Result<axum::Json<Vec<VolumeSnapshot>>, ApiError> {
    Ok(axum::Json(
        app::list_snapshots(&st, &ctx, &tenant, &volume).await?,
    ))
}

/// Delete a snapshot no volume was made from (members); 409 otherwise.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots/{snapshot}", tag = "volumes",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("volume" = String, Path, description = "Volume name or id"),
        ("snapshot" = String, Path, description = "Snapshot name or id"),
    ),
    responses((status = 202, description = "Deleting (its host removes it)"), Problems)
)]
pub async fn delete_snapshot(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, volume, snapshot)): Path<(String, String, String)>,
) -> Result<StatusCode, ApiError> {
    app::delete_snapshot(&st, &ctx, &tenant, &volume, &snapshot).await?;
    Ok(StatusCode::ACCEPTED)
}
