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

/// Who did something when no user did: a host registering with a join
/// token, say.
pub struct Who<'a> {
    pub name: String,
    pub source_ip: &'a str,
    pub request_id: &'a str,
    pub at: chrono::DateTime<chrono::Utc>,
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
        tenant_id: Set(None),
        tenant_name: Set(None),
        target: Set(target.chars().take(255).collect()),
        source_ip: Set(who.source_ip.chars().take(64).collect()),
        request_id: Set(who.request_id.chars().take(64).collect()),
    }
    .insert(db)
    .await?;
    tracing::info!(actor = %who.name, action, target, request_id = %who.request_id, "audit");
    Ok(())
}
