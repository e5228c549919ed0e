//! Queries of `gpu_minutes` and `vm_telemetry`.

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set,
};
use uuid::Uuid;

use crate::domain::gpu_telemetry::Minute;
use crate::entity::{gpu_minutes, vm_telemetry};
use crate::error::ApiError;

fn to_db(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn from_db(v: Option<i64>) -> Option<u64> {
    v.map(|v| v.max(0) as u64)
}

fn minute(r: &gpu_minutes::Model) -> Minute {
    Minute {
        samples: r.samples.max(0) as u32,
        util_n: r.util_n.max(0) as u32,
        util_sum: r.util_sum,
        util_max: r.util_max,
        mem_used_max: from_db(r.mem_used_max),
        mem_total: from_db(r.mem_total),
        temp_max: r.temp_max,
        power_n: r.power_n.max(0) as u32,
        power_sum: r.power_sum,
        ecc_max: from_db(r.ecc_max),
        throttle: from_db(r.throttle),
    }
}

/// The minute's row of a VM's GPU, as it stands.
pub async fn minute_of(
    db: &impl ConnectionTrait,
    vm: Uuid,
    bdf: &str,
    at: DateTime<Utc>,
) -> Result<Option<Minute>, ApiError> {
    Ok(gpu_minutes::Entity::find_by_id((vm, bdf.to_owned(), at))
        .one(db)
        .await?
        .as_ref()
        .map(minute))
}

/// Writes a minute (`new`: insert, else update).
pub async fn put_minute(
    db: &impl ConnectionTrait,
    (vm, tenant, bdf, at): (Uuid, Uuid, &str, DateTime<Utc>),
    m: &Minute,
    new: bool,
) -> Result<(), ApiError> {
    let a = gpu_minutes::ActiveModel {
        vm_id: Set(vm),
        host_bdf: Set(bdf.to_owned()),
        minute: Set(at),
        tenant_id: Set(tenant),
        samples: Set(i32::try_from(m.samples).unwrap_or(i32::MAX)),
        util_n: Set(i32::try_from(m.util_n).unwrap_or(i32::MAX)),
        util_sum: Set(m.util_sum),
        util_max: Set(m.util_max),
        mem_used_max: Set(to_db(m.mem_used_max)),
        mem_total: Set(to_db(m.mem_total)),
        temp_max: Set(m.temp_max),
        power_n: Set(i32::try_from(m.power_n).unwrap_or(i32::MAX)),
        power_sum: Set(m.power_sum),
        ecc_max: Set(to_db(m.ecc_max)),
        throttle: Set(to_db(m.throttle)),
    };
    if new {
        a.insert(db).await?;
    } else {
        a.update(db).await?;
    }
    Ok(())
}

/// A VM's minutes in `[from, to)`, by GPU and time.
pub async fn minutes(
    db: &impl ConnectionTrait,
    vm: Uuid,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<(String, DateTime<Utc>, Minute)>, ApiError> {
    Ok(gpu_minutes::Entity::find()
        .filter(gpu_minutes::Column::VmId.eq(vm))
        .filter(gpu_minutes::Column::Minute.gte(from))
        .filter(gpu_minutes::Column::Minute.lt(to))
        .order_by_asc(gpu_minutes::Column::HostBdf)
        .order_by_asc(gpu_minutes::Column::Minute)
        .all(db)
        .await?
        .iter()
        .map(|r| (r.host_bdf.clone(), r.minute, minute(r)))
        .collect())
}

/// Minutes older than `before` go.
pub async fn purge(db: &impl ConnectionTrait, before: DateTime<Utc>) -> Result<u64, ApiError> {
    Ok(gpu_minutes::Entity::delete_many()
        .filter(gpu_minutes::Column::Minute.lt(before))
        .exec(db)
        .await?
        .rows_affected)
}

pub async fn status(
    db: &impl ConnectionTrait,
    vm: Uuid,
) -> Result<Option<vm_telemetry::Model>, ApiError> {
    Ok(vm_telemetry::Entity::find_by_id(vm).one(db).await?)
}

/// A VM's last word: `ok`, or `unknown` and why.
pub async fn set_status(
    db: &impl ConnectionTrait,
    vm: Uuid,
    tenant: Uuid,
    reason: Option<&str>,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let exists = status(db, vm).await?.is_some();
    let a = vm_telemetry::ActiveModel {
        vm_id: Set(vm),
        tenant_id: Set(tenant),
        state: Set(if reason.is_some() { "unknown" } else { "ok" }.to_owned()),
        reason: Set(reason.map(|r| r.chars().take(500).collect())),
        read_at: Set(at),
    };
    if exists {
        a.update(db).await?;
    } else {
        a.insert(db).await?;
    }
    Ok(())
}

/// A deleted VM's last word goes.
pub async fn forget(db: &impl ConnectionTrait, vm: Uuid) -> Result<(), ApiError> {
    vm_telemetry::Entity::delete_by_id(vm).exec(db).await?;
    Ok(())
}
