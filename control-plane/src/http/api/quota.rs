use axum::extract::State;
use kumo_api_types::{GuaranteeStanding, Quota};

use super::Problems;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path};

/// Show a tenant's quota (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/quota", tag = "quota",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The quota", body = Quota), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Quota>, ApiError> {
    Ok(axum::Json(
        crate::app::quotas::show(&st, &ctx, &tenant).await?,
    ))
}

/// Replace a tenant's quota (platform admins). GPU models left out get zero.
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/quota", tag = "quota",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = Quota,
    responses((status = 200, description = "The new quota", body = Quota), Problems)
)]
pub async fn set(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<Quota>,
) -> Result<axum::Json<Quota>, ApiError> {
    Ok(axum::Json(
        crate::app::quotas::set(&st, &ctx, &tenant, &body).await?,
    ))
}

/// Every GPU model's guaranteed shares against its GPUs in service
/// (platform admins): what each tenant is promised, and whether the fleet
/// can keep it.
#[utoipa::path(
    get, path = "/api/v1/guarantees", tag = "quota",
    responses((status = 200, description = "Per GPU model", body = Vec<GuaranteeStanding>), Problems)
)]
pub async fn guarantees(
    State(st): State<AppState>,
    ctx: Actor,
) -> Result<axum::Json<Vec<GuaranteeStanding>>, ApiError> {
    Ok(axum::Json(
        crate::app::guarantees::standing(&st, &ctx).await?,
    ))
}
