//! The audit log: who did what, when, from where, with which request id.
//! Entries are written in the same transaction as the change they record,
//! so a change without its entry (or the reverse) cannot be committed.

use sea_orm::{ActiveModelTrait, ConnectionTrait, NotSet, Set};

use crate::context::Actor;
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
    }
    .insert(db)
    .await?;
    tracing::info!(
        actor = %ctx.caller.user.name,
        action,
        tenant = tenant.map(|t| t.name.as_str()),
        target,
        request_id = %ctx.request_id,
        "audit"
    );
    Ok(())
}
