//! Rate cards (platform admins set them; everyone reads them), a tenant's
//! points (admins grant; members read balance, grants and ledger) and
//! monthly statements (JSON, or CSV with `Accept: text/csv`). Amounts are
//! decimal strings, never floats.

use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kumo_api_types::{
    GraceExtend, GrantCreate, PointGrant, Points, RateCardPut, Rates, Statement, Usage, UsageParams,
};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Add a rate card (platform admins): in force from `effective_from`
/// (default now; never in the past, so nothing charged is re-rated).
#[utoipa::path(
    put, path = "/api/v1/rates", tag = "billing",
    request_body = RateCardPut,
    responses((status = 200, description = "Every card", body = Rates), Problems)
)]
pub async fn put_rates(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<RateCardPut>,
) -> Result<axum::Json<Rates>, ApiError> {
    Ok(axum::Json(
        crate::app::billing::put_rates(&st, &ctx, &body).await?,
    ))
}

/// The rate cards (anyone signed in).
#[utoipa::path(
    get, path = "/api/v1/rates", tag = "billing",
    responses((status = 200, description = "Every card and the one in force", body = Rates), Problems)
)]
pub async fn get_rates(
    State(st): State<AppState>,
    ctx: Actor,
) -> Result<axum::Json<Rates>, ApiError> {
    Ok(axum::Json(crate::app::billing::rates(&st, &ctx).await?))
}

/// Grant points to a tenant (platform admins).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/points/grants", tag = "billing",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = GrantCreate,
    responses((status = 201, description = "Granted", body = PointGrant), Problems)
)]
pub async fn grant(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<GrantCreate>,
) -> Result<(StatusCode, axum::Json<PointGrant>), ApiError> {
    let g = crate::app::billing::grant(&st, &ctx, &tenant, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(g)))
}

/// A tenant's points: balance, grants, the latest charges (members).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/points", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "Balance, grants and ledger", body = Points), Problems)
)]
pub async fn points(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Points>, ApiError> {
    Ok(axum::Json(
        crate::app::billing::points(&st, &ctx, &tenant).await?,
    ))
}

/// Keep a tenant's guaranteed VMs running while it is out of points until
/// `until` (platform admins).
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/points/grace", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = GraceExtend,
    responses((status = 200, description = "The tenant's points", body = Points), Problems)
)]
pub async fn extend_grace(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<GraceExtend>,
) -> Result<axum::Json<Points>, ApiError> {
    Ok(axum::Json(
        crate::app::billing::extend_grace(&st, &ctx, &tenant, &body).await?,
    ))
}

/// A tenant's usage over a period, by VM, resource or day (members).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/usage", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name or id"), UsageParams),
    responses((status = 200, description = "Usage", body = Usage), Problems)
)]
pub async fn usage(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<UsageParams>,
) -> Result<axum::Json<Usage>, ApiError> {
    Ok(axum::Json(
        crate::app::billing::usage(&st, &ctx, &tenant, &q).await?,
    ))
}

/// A month's statement (members): JSON, or CSV for `Accept: text/csv`.
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/statements/{month}", tag = "billing",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("month" = String, Path, description = "`YYYY-MM`"),
    ),
    responses(
        (status = 200, description = "The statement", body = Statement),
        (status = 200, description = "The statement as CSV", body = String, content_type = "text/csv"),
        Problems
    )
)]
pub async fn statement(
    State(st): State<AppState>,
    ctx: Actor,
    headers: HeaderMap,
    Path((tenant, month)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let s = crate::app::billing::statement(&st, &ctx, &tenant, &month).await?;
    let wants_csv = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"));
    if wants_csv {
        return Ok((
            [(CONTENT_TYPE, "text/csv; charset=utf-8")],
            kumo_billing::statement::to_csv(&s),
        )
            .into_response());
    }
    Ok(axum::Json(crate::app::billing::statement_view(s)).into_response())
}
