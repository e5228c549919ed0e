//! Queries of `idle_policies` and `vm_idle`, and the per-minute use of a
//! VM's GPUs that the idle rules read.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::domain::idle_gpus::MinuteUse;
use crate::entity::{gpu_minutes, idle_policies, vm_idle};
use crate::error::ApiError;

/// A VM's minutes from `from` on, in time order: per minute, how many of
/// its GPUs said how busy they were and the busiest one's mean. One
/// grouped query over the table's primary key (VM, GPU, minute).
pub async fn use_by_minute(
    db: &impl ConnectionTrait,
    vm: Uuid,
    from: DateTime<Utc>,
) -> Result<Vec<MinuteUse>, ApiError> {
    let rows: Vec<(DateTime<Utc>, i64, Option<f64>)> = gpu_minutes::Entity::find()
        .select_only()
        .column(gpu_minutes::Column::Minute)
        .column_as(
            Expr::cust("CAST(SUM(CASE WHEN util_n > 0 THEN 1 ELSE 0 END) AS BIGINT)"),
            "read",
        )
        .column_as(
            Expr::cust("MAX(CASE WHEN util_n > 0 THEN util_sum / util_n END)"),
            "busiest",
        )
        .filter(gpu_minutes::Column::VmId.eq(vm))
        .filter(gpu_minutes::Column::Minute.gte(from))
        .group_by(gpu_minutes::Column::Minute)
        .order_by_asc(gpu_minutes::Column::Minute)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(at, read, busiest)| MinuteUse {
            at,
            read: u32::try_from(read.max(0)).unwrap_or(u32::MAX),
            busiest,
        })
        .collect())
}

pub async fn policy(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Option<idle_policies::Model>, ApiError> {
    Ok(idle_policies::Entity::find_by_id(tenant).one(db).await?)
}

/// Every project's own policy (the idle pass reads them once).
pub async fn policies(db: &impl ConnectionTrait) -> Result<Vec<idle_policies::Model>, ApiError> {
    Ok(idle_policies::Entity::find().all(db).await?)
}

pub async fn put_policy(
    db: &impl ConnectionTrait,
    row: idle_policies::Model,
) -> Result<(), ApiError> {
    let exists = policy(db, row.tenant_id).await?.is_some();
    let a: idle_policies::ActiveModel = row.into();
    let a = a.reset_all();
    if exists {
        a.update(db).await?;
    } else {
        a.insert(db).await?;
    }
    Ok(())
}

pub async fn delete_policy(db: &impl ConnectionTrait, tenant: Uuid) -> Result<bool, ApiError> {
    Ok(idle_policies::Entity::delete_by_id(tenant)
        .exec(db)
        .await?
        .rows_affected
        > 0)
}

/// How a webhook's last delivery went.
pub async fn webhook_result(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    at: DateTime<Utc>,
    result: &str,
) -> Result<(), ApiError> {
    idle_policies::Entity::update_many()
        .col_expr(idle_policies::Column::WebhookLastAt, Expr::value(at))
        .col_expr(
            idle_policies::Column::WebhookLastResult,
            Expr::value(result.chars().take(300).collect::<String>()),
        )
        .filter(idle_policies::Column::TenantId.eq(tenant))
        .exec(db)
        .await?;
    Ok(())
}

pub async fn vm(db: &impl ConnectionTrait, vm: Uuid) -> Result<Option<vm_idle::Model>, ApiError> {
    Ok(vm_idle::Entity::find_by_id(vm).one(db).await?)
}

/// Every VM's idle row (the idle pass reads them once).
pub async fn all_vms(db: &impl ConnectionTrait) -> Result<Vec<vm_idle::Model>, ApiError> {
    Ok(vm_idle::Entity::find().all(db).await?)
}

pub async fn of_tenant(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Vec<vm_idle::Model>, ApiError> {
    Ok(vm_idle::Entity::find()
        .filter(vm_idle::Column::TenantId.eq(tenant))
        .all(db)
        .await?)
}

/// Writes a VM's idle row if it still reads `old` (nothing when another
/// replica's pass changed it meanwhile): answers whether it was written.
pub async fn put_vm(
    db: &impl ConnectionTrait,
    old: Option<&vm_idle::Model>,
    new: &vm_idle::Model,
) -> Result<bool, ApiError> {
    let Some(old) = old else {
        let a: vm_idle::ActiveModel = new.clone().into();
        return match a.reset_all().insert(db).await {
            Ok(_) => Ok(true),
            Err(e) if crate::error::is_unique_violation(&e) => Ok(false),
            // The VM was deleted since the pass read it: nothing to keep.
            Err(e) if crate::error::is_fk_violation(&e) => Ok(false),
            Err(e) => Err(e.into()),
        };
    };
    let mut q = vm_idle::Entity::update_many()
        .col_expr(vm_idle::Column::IdleSince, Expr::value(new.idle_since))
        .col_expr(vm_idle::Column::Notices, Expr::value(new.notices))
        .col_expr(vm_idle::Column::NoticedAt, Expr::value(new.noticed_at))
        .col_expr(vm_idle::Column::ExemptUntil, Expr::value(new.exempt_until))
        .col_expr(
            vm_idle::Column::ExemptReason,
            Expr::value(new.exempt_reason.clone()),
        )
        .col_expr(
            vm_idle::Column::ExemptBy,
            Expr::value(new.exempt_by.clone()),
        )
        .col_expr(vm_idle::Column::ExemptSecs, Expr::value(new.exempt_secs))
        .filter(vm_idle::Column::VmId.eq(old.vm_id))
        .filter(vm_idle::Column::Notices.eq(old.notices));
    q = match old.idle_since {
        Some(s) => q.filter(vm_idle::Column::IdleSince.eq(s)),
        None => q.filter(vm_idle::Column::IdleSince.is_null()),
    };
    q = match old.exempt_until {
        Some(s) => q.filter(vm_idle::Column::ExemptUntil.eq(s)),
        None => q.filter(vm_idle::Column::ExemptUntil.is_null()),
    };
    Ok(q.exec(db).await?.rows_affected > 0)
}

/// Running GPU VMs whose projects were told they are idle (a notice sent
/// in a spell still going on).
pub async fn noticed(db: &impl ConnectionTrait) -> Result<u64, ApiError> {
    let ids: Vec<Uuid> = vm_idle::Entity::find()
        .select_only()
        .column(vm_idle::Column::VmId)
        .filter(vm_idle::Column::IdleSince.is_not_null())
        .filter(vm_idle::Column::Notices.gte(1))
        .into_tuple()
        .all(db)
        .await?;
    let running = crate::entity::vms::Entity::find()
        .filter(crate::entity::vms::Column::Id.is_in(ids))
        .filter(crate::entity::vms::Column::State.eq(kumo_api_types::VmState::Running.as_str()))
        .count(db)
        .await?;
    Ok(running)
}
