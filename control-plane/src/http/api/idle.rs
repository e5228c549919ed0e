//! Idle GPUs: a project's policy and webhook, its GPU VMs as the policy
//! sees them, and owners' exemptions.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{IdleExemptionRequest, IdlePolicyUpdate, IdlePolicyView, IdleReport, IdleVm};

use super::Problems;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path};

/// The project's idle policy: the platform's, its own, what is in force,
/// and its webhook (scheme and host only) with the last delivery (any
/// member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/idle-policy", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The policy", body = IdlePolicyView), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<IdlePolicyView>, ApiError> {
    Ok(axum::Json(
        crate::app::idle_gpus::policy(&st, &ctx, &tenant).await?,
    ))
}

/// Set the project's own idle policy and webhook, replacing what it had
/// (owners: only stricter than the platform's; administrators: any).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/idle-policy", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = IdlePolicyUpdate,
    responses((status = 200, description = "The policy", body = IdlePolicyView), Problems)
)]
pub async fn set(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<IdlePolicyUpdate>,
) -> Result<axum::Json<IdlePolicyView>, ApiError> {
    Ok(axum::Json(
        crate::app::idle_gpus::set_policy(&st, &ctx, &tenant, &body).await?,
    ))
}

/// Back to the platform's policy, without a webhook (owners).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/idle-policy", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 204, description = "The platform's policy applies"), Problems)
)]
pub async fn reset(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::idle_gpus::reset_policy(&st, &ctx, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The project's running GPU VMs: idle since when, notices sent, when the
/// action falls due, exemptions (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/idle-vms", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The VMs", body = IdleReport), Problems)
)]
pub async fn report(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<IdleReport>, ApiError> {
    Ok(axum::Json(
        crate::app::idle_gpus::report(&st, &ctx, &tenant).await?,
    ))
}

/// Exempt a VM from the idle policy until a date, with a reason (owners,
/// at most the platform's longest exemption; administrators, any).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/vms/{vm}/idle-exemption", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    request_body = IdleExemptionRequest,
    responses((status = 200, description = "The VM under the policy", body = IdleVm), Problems)
)]
pub async fn exempt(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
    Json(body): Json<IdleExemptionRequest>,
) -> Result<axum::Json<IdleVm>, ApiError> {
    Ok(axum::Json(
        crate::app::idle_gpus::exempt(&st, &ctx, &tenant, &vm, &body).await?,
    ))
}

/// End a VM's exemption now; the idle count starts over (owners).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/vms/{vm}/idle-exemption", tag = "idle",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "The VM under the policy", body = IdleVm), Problems)
)]
pub async fn unexempt(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<axum::Json<IdleVm>, ApiError> {
    Ok(axum::Json(
        crate::app::idle_gpus::unexempt(&st, &ctx, &tenant, &vm).await?,
    ))
}
