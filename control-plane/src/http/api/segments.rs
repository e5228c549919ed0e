//! Tenant segments (Ethernet or RoCE over VXLAN): a VNI leased atomically
//! from the configured ranges, a CIDR with its gateway and MTU, and the
//! VMs' attachments (address and MAC) made in the VM's own transaction.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, Segment, SegmentCreate, SegmentIngress, SegmentUpdate};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create a segment (members). Its VNI is leased atomically: no two live
/// segments share one, and a freed VNI rests before reuse.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/segments", tag = "segments",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = SegmentCreate,
    responses((status = 201, description = "Created", body = Segment), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<SegmentCreate>,
) -> Result<(StatusCode, axum::Json<Segment>), ApiError> {
    let s = crate::app::segments::create(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(s)))
}

/// List a tenant's segments by name (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/segments", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Segment>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Segment>>, ApiError> {
    Ok(axum::Json(
        crate::app::segments::list(&st, &ctx, &tenant, &q).await?,
    ))
}

/// Show a segment (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/segments/{segment}", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    responses((status = 200, description = "The segment", body = Segment), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
) -> Result<axum::Json<Segment>, ApiError> {
    Ok(axum::Json(
        crate::app::segments::show(&st, &ctx, &tenant, &segment).await?,
    ))
}

/// Change a segment (members): switch its egress. Its edge follows.
#[utoipa::path(
    patch, path = "/api/v1/tenants/{tenant}/segments/{segment}", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    request_body = SegmentUpdate,
    responses((status = 200, description = "The segment", body = Segment), Problems)
)]
pub async fn update(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
    Json(body): Json<SegmentUpdate>,
) -> Result<axum::Json<Segment>, ApiError> {
    Ok(axum::Json(
        crate::app::segments::update(&st, &ctx, &tenant, &segment, &body).await?,
    ))
}

/// Replace a segment's ingress rules (members). Hosts with its VMs apply
/// them on their next pass (within a second or so).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/segments/{segment}/ingress", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    request_body = SegmentIngress,
    responses((status = 200, description = "The segment with its new rules", body = Segment), Problems)
)]
pub async fn set_ingress(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
    Json(body): Json<SegmentIngress>,
) -> Result<axum::Json<Segment>, ApiError> {
    Ok(axum::Json(
        crate::app::segments::set_ingress(&st, &ctx, &tenant, &segment, &body).await?,
    ))
}

/// Delete a segment without attachments (members); its VNI rests for the
/// configured quarantine before another segment gets it.
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/segments/{segment}", tag = "segments",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("segment" = String, Path, description = "Segment name or id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, segment)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    crate::app::segments::delete(&st, &ctx, &tenant, &segment).await?;
    Ok(StatusCode::NO_CONTENT)
}
