//! Reservations: GPUs of one model held for a project over a window.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Page, PageParams, Reservation, ReservationCreate};

use super::Problems;
use crate::app::reservations as app;
use crate::context::{Actor, AppState};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Reserve GPUs of one model from `starts_at` to `ends_at` (platform
/// admins; owners within the project's guaranteed share). Whole hosts are
/// held from shortly before the start (their spot and borrowed VMs get
/// notice); VMs and clusters naming it are placed there from the start; it
/// is charged per GPU-hour held (rate card class `reserved_gpu:<model>`).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/reservations", tag = "reservations",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = ReservationCreate,
    responses((status = 201, description = "Created (state `scheduled`)", body = Reservation), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<ReservationCreate>,
) -> Result<(StatusCode, axum::Json<Reservation>), ApiError> {
    let r = app::create(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(r)))
}

/// The tenant's reservations (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/reservations", tag = "reservations",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Reservation>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Reservation>>, ApiError> {
    Ok(axum::Json(app::list(&st, &ctx, &tenant, &q).await?))
}

/// One reservation with the GPUs it holds and its VMs use (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/reservations/{reservation}", tag = "reservations",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("reservation" = String, Path, description = "Reservation name or id")),
    responses((status = 200, description = "The reservation", body = Reservation), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, reservation)): Path<(String, String)>,
) -> Result<axum::Json<Reservation>, ApiError> {
    Ok(axum::Json(
        app::show(&st, &ctx, &tenant, &reservation).await?,
    ))
}

/// Cancel a reservation (owners): it ends now, its hosts are let go, its
/// charge closes and its VMs go on or stop per its end policy. An ended
/// reservation is forgotten (its name may be used again).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/reservations/{reservation}", tag = "reservations",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("reservation" = String, Path, description = "Reservation name or id")),
    responses((status = 204, description = "Cancelled or forgotten"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, reservation)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    app::delete(&st, &ctx, &tenant, &reservation).await?;
    Ok(StatusCode::NO_CONTENT)
}
