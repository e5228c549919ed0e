//! Queries behind the fair queue: queued VMs' standings.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use kumo_api_types::QueueStanding;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set};
use uuid::Uuid;

use crate::entity::vm_queue;
use crate::error::ApiError;

pub fn standing(r: &vm_queue::Model) -> QueueStanding {
    QueueStanding {
        position: u32::try_from(r.position).unwrap_or(0),
        reason: r.reason.clone(),
        estimate: r.estimate,
        queued_at: r.queued_at,
        expires_at: r.expires_at,
    }
}

/// The standings of those of `vms` that are queued.
pub async fn standings(
    db: &impl ConnectionTrait,
    vms: &[Uuid],
) -> Result<HashMap<Uuid, QueueStanding>, ApiError> {
    if vms.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(vm_queue::Entity::find()
        .filter(vm_queue::Column::VmId.is_in(vms.iter().copied()))
        .all(db)
        .await?
        .iter()
        .map(|r| (r.vm_id, standing(r)))
        .collect())
}

/// Every queued VM's row, oldest first.
pub async fn all(db: &impl ConnectionTrait) -> Result<Vec<vm_queue::Model>, ApiError> {
    Ok(vm_queue::Entity::find()
        .order_by_asc(vm_queue::Column::QueuedAt)
        .order_by_asc(vm_queue::Column::VmId)
        .all(db)
        .await?)
}

/// Whether anything waits in the queue.
pub async fn any(db: &impl ConnectionTrait) -> Result<bool, ApiError> {
    Ok(vm_queue::Entity::find().one(db).await?.is_some())
}

/// How many requests (a VM, or a cluster's members together) are queued:
/// the tenant's, or everyone's.
pub async fn requests(db: &impl ConnectionTrait, tenant: Option<Uuid>) -> Result<usize, ApiError> {
    let mut q = vm_queue::Entity::find();
    if let Some(t) = tenant {
        q = q.filter(vm_queue::Column::TenantId.eq(t));
    }
    let rows = q.all(db).await?;
    let mut keys: Vec<Uuid> = rows
        .iter()
        .map(|r| r.cluster_id.unwrap_or(r.vm_id))
        .collect();
    keys.sort();
    keys.dedup();
    Ok(keys.len())
}

/// Queues `vms` (one request) at the tail until the queue's next pass
/// orders it.
pub async fn insert(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    cluster: Option<Uuid>,
    vms: &[Uuid],
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    position: u32,
) -> Result<(), ApiError> {
    let rows: Vec<vm_queue::ActiveModel> = vms
        .iter()
        .map(|vm| vm_queue::ActiveModel {
            vm_id: Set(*vm),
            tenant_id: Set(tenant),
            cluster_id: Set(cluster),
            queued_at: Set(now),
            expires_at: Set(expires_at),
            position: Set(i32::try_from(position).unwrap_or(i32::MAX)),
            reason: Set("just queued; placed in fair order at the queue's next pass".into()),
            estimate: Set(None),
        })
        .collect();
    if !rows.is_empty() {
        vm_queue::Entity::insert_many(rows).exec(db).await?;
    }
    Ok(())
}

/// The VMs leave the queue (placed, cancelled, expired).
pub async fn remove(db: &impl ConnectionTrait, vms: &[Uuid]) -> Result<(), ApiError> {
    if vms.is_empty() {
        return Ok(());
    }
    vm_queue::Entity::delete_many()
        .filter(vm_queue::Column::VmId.is_in(vms.iter().copied()))
        .exec(db)
        .await?;
    Ok(())
}

/// A request's standing as of this pass (written only when it moved).
pub async fn set_standing(
    db: &impl ConnectionTrait,
    vms: &[Uuid],
    position: u32,
    reason: &str,
    estimate: Option<DateTime<Utc>>,
) -> Result<(), ApiError> {
    vm_queue::Entity::update_many()
        .col_expr(
            vm_queue::Column::Position,
            Expr::value(i32::try_from(position).unwrap_or(i32::MAX)),
        )
        .col_expr(vm_queue::Column::Reason, Expr::value(reason.to_owned()))
        .col_expr(vm_queue::Column::Estimate, Expr::value(estimate))
        .filter(vm_queue::Column::VmId.is_in(vms.iter().copied()))
        .exec(db)
        .await?;
    Ok(())
}
