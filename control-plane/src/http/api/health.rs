use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use kumo_api_types::Health;

use crate::context::AppState;
use crate::error::ApiError;

/// Liveness: the process serves HTTP.
#[utoipa::path(
    get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "Alive", body = Health))
)]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".into(),
    })
}

/// Readiness: the database answers.
#[utoipa::path(
    get, path = "/readyz", tag = "health", security(()),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Database unreachable", body = kumo_api_types::Problem, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(st): State<AppState>) -> Result<axum::Json<Health>, ApiError> {
    st.db.ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness check failed");
        ApiError::Unavailable
    })?;
    Ok(axum::Json(Health {
        status: "ok".into(),
    }))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(
    get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "Metrics", body = String, content_type = "application/openmetrics-text"))
)]
pub async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    let (size, idle) = crate::db::pool_stats(&st.db);
    st.metrics.set_pool(size, idle);
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        st.metrics.encode(),
    )
}

/// The fleet's series for Prometheus: hosts, devices' health, AER and
/// links, RDMA ports' congestion, GPUs' figures from guests, idle GPU VMs
/// (platform admins; labels are hosts, device addresses and fixed words).
#[utoipa::path(
    get, path = "/metrics/fleet", tag = "health",
    responses((status = 200, description = "Metrics", body = String, content_type = "application/openmetrics-text"), super::Problems)
)]
pub async fn fleet_metrics(
    State(st): State<AppState>,
    ctx: crate::context::Actor,
) -> Result<impl IntoResponse, crate::error::ApiError> {
    let text = crate::app::fleet_metrics::render(&st, &ctx).await?;
    Ok((
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    ))
}
