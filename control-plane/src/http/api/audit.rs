use axum::extract::State;
use kumo_api_types::{AuditEntry, AuditParams, Page};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::Query;

/// The audit log, newest first. Admins see everything; tenant owners see
/// their tenants' entries.
#[utoipa::path(
    get, path = "/api/v1/audit", tag = "audit",
    params(AuditParams),
    responses((status = 200, description = "One page", body = inline(Page<AuditEntry>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<AuditParams>,
) -> Result<axum::Json<Page<AuditEntry>>, ApiError> {
    Ok(axum::Json(crate::app::audit::list(&st, &ctx, &q).await?))
}
