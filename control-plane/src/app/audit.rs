//! The audit log: who did what, when, from where, with which request id
//! (the server's own, and the client's beside it).
//! Entries are written in the same transaction as the change they record,
//! so a change without its entry (or the reverse) cannot be committed.

use kumo_api_types::{AuditEntry, AuditParams, Page, Role};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, NotSet, QueryFilter, QueryOrder,
    QuerySelect, Set,
};

use crate::app::access::{tenant_access, tenant_ids_with_role};
use crate::context::{Actor, AppState};
use crate::domain::paging::Paging;
use crate::entity::{audit_log, tenants};
use crate::error::ApiError;

pub async fn record(
    db: &impl ConnectionTrait,
    ctx: &Actor,
    action: &str,
    tenant: Option<&tenants::Model>,
    target: &str,
) -> Result<(), ApiError> {
    audit_log::ActiveModel {
        id: NotSet,
        at: Set(ctx.at),
        actor_id: Set(Some(ctx.caller.user.id)),
        actor_name: Set(ctx.caller.user.name.clone()),
        action: Set(action.to_owned()),
        tenant_id: Set(tenant.map(|t| t.id)),
        tenant_name: Set(tenant.map(|t| t.name.clone())),
        target: Set(target.chars().take(255).collect()),
        source_ip: Set(ctx.source_ip.chars().take(64).collect()),
        request_id: Set(ctx.request_id.chars().take(64).collect()),
        client_request_id: Set(ctx.client_request_id.clone()),
    }
    .insert(db)
    .await?;
    // One line per user action: a sentence for people (`dev`'s terminal),
    // the fields for machines.
    tracing::info!(
        actor = %ctx.caller.user.name,
        action,
        tenant = tenant.map(|t| t.name.as_str()),
        target,
        request_id = %ctx.request_id,
        "{} {action} {target}",
        ctx.caller.user.name
    );
    Ok(())
}

/// Who did something when no user did: a host registering with a join
/// token, say.
pub struct Who<'a> {
    pub name: String,
    pub source_ip: &'a str,
    pub request_id: &'a str,
    pub client_request_id: Option<&'a str>,
    pub at: chrono::DateTime<chrono::Utc>,
    /// The project the entry concerns, so that its owners read it.
    pub tenant: Option<&'a tenants::Model>,
}

/// An audit entry for an actor that is not a user.
pub async fn record_by(
    db: &impl ConnectionTrait,
    who: &Who<'_>,
    action: &str,
    target: &str,
) -> Result<(), ApiError> {
    audit_log::ActiveModel {
        id: NotSet,
        at: Set(who.at),
        actor_id: Set(None),
        actor_name: Set(who.name.chars().take(255).collect()),
        action: Set(action.to_owned()),
        tenant_id: Set(who.tenant.map(|t| t.id)),
        tenant_name: Set(who.tenant.map(|t| t.name.clone())),
        target: Set(target.chars().take(255).collect()),
        source_ip: Set(who.source_ip.chars().take(64).collect()),
        request_id: Set(who.request_id.chars().take(64).collect()),
        client_request_id: Set(who.client_request_id.map(str::to_owned)),
    }
    .insert(db)
    .await?;
    tracing::info!(actor = %who.name, action, target, request_id = %who.request_id, "{} {action} {target}", who.name);
    Ok(())
}

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
        client_request_id: e.client_request_id,
    }
}

/// The audit log, newest first. Admins see everything; tenant owners see
/// their tenants' entries.
pub async fn list(
    st: &AppState,
    actor: &Actor,
    q: &AuditParams,
) -> Result<Page<AuditEntry>, ApiError> {
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = audit_log::Entity::find().order_by_desc(audit_log::Column::Id);
    match &q.tenant {
        Some(t) => {
            let (tenant, access) = tenant_access(&st.db, &actor.caller, t).await?;
            access.require(Role::Owner, "reading the audit log")?;
            query = query.filter(audit_log::Column::TenantId.eq(tenant.id));
        }
        None if actor.caller.is_admin() => {}
        None => {
            let owned = tenant_ids_with_role(&st.db, actor.caller.user.id, Role::Owner).await?;
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
    Ok(Page {
        items: rows.into_iter().map(to_api).collect(),
        next_page_token: next,
    })
}
