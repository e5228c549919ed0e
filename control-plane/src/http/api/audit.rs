use axum::extract::State;
use kumo_api_types::{AuditEntry, AuditParams, Page, Role};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::Problems;
use crate::app::access::{tenant_access, tenant_ids_with_role};
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::paging::Paging;
use crate::entity::audit_log;
use crate::error::ApiError;
use crate::http::extract::Query;

fn to_api(e: audit_log::Model) -> AuditEntry {
    AuditEntry {
        id: e.id,
        at: e.at,
        actor: e.actor_name,
        action: e.action,
        tenant: e.tenant_name,
        target: e.target,
        source_ip: e.source_ip,
        request_id: e.request_id,
    }
}

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
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = audit_log::Entity::find().order_by_desc(audit_log::Column::Id);
    match &q.tenant {
        Some(t) => {
            let (tenant, access) = tenant_access(&st.db, &ctx.caller, t).await?;
            access.require(Role::Owner, "reading the audit log")?;
            query = query.filter(audit_log::Column::TenantId.eq(tenant.id));
        }
        None if ctx.caller.is_admin() => {}
        None => {
            let owned = tenant_ids_with_role(&st.db, ctx.caller.user.id, Role::Owner).await?;
            if owned.is_empty() {
                return Err(ApiError::Forbidden(
                    "the audit log is for platform administrators and tenant owners".into(),
                ));
            }
            query = query.filter(audit_log::Column::TenantId.is_in(owned));
        }
    }
    if let Some(after) = &paging.after {
        let after: i64 = after
            .parse()
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        query = query.filter(audit_log::Column::Id.lt(after));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |e| e.id.to_string());
    Ok(axum::Json(Page {
        items: rows.into_iter().map(to_api).collect(),
        next_page_token: next,
    }))
}
