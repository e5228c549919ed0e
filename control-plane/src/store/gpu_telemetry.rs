//! Queries of `gpu_minutes`, `gpu_hours` and `vm_telemetry`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::domain::gpu_telemetry::{hour_of, Minute};
use crate::entity::{gpu_hours, gpu_minutes, vm_telemetry};
use crate::error::ApiError;

fn to_db(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn from_db(v: Option<i64>) -> Option<u64> {
    v.map(|v| v.max(0) as u64)
}

/// `gpu_minutes` and `gpu_hours` rows hold the same figures: a
/// [`Minute`] from either, and either's row from a key and a [`Minute`].
macro_rules! figures {
    ($r:expr) => {
        Minute {
            samples: $r.samples.max(0) as u32,
            util_n: $r.util_n.max(0) as u32,
            util_sum: $r.util_sum,
            util_max: $r.util_max,
            mem_used_max: from_db($r.mem_used_max),
            mem_total: from_db($r.mem_total),
            temp_max: $r.temp_max,
            power_n: $r.power_n.max(0) as u32,
            power_sum: $r.power_sum,
            ecc_max: from_db($r.ecc_max),
            throttle: from_db($r.throttle),
        }
    };
}

macro_rules! row {
    ($entity:ident, $time:ident, ($vm:expr, $tenant:expr, $bdf:expr, $at:expr), $m:expr) => {
        $entity::ActiveModel {
            vm_id: Set($vm),
            host_bdf: Set($bdf.to_owned()),
            $time: Set($at),
            tenant_id: Set($tenant),
            samples: Set(i32::try_from($m.samples).unwrap_or(i32::MAX)),
            util_n: Set(i32::try_from($m.util_n).unwrap_or(i32::MAX)),
            util_sum: Set($m.util_sum),
            util_max: Set($m.util_max),
            mem_used_max: Set(to_db($m.mem_used_max)),
            mem_total: Set(to_db($m.mem_total)),
            temp_max: Set($m.temp_max),
            power_n: Set(i32::try_from($m.power_n).unwrap_or(i32::MAX)),
            power_sum: Set($m.power_sum),
            ecc_max: Set(to_db($m.ecc_max)),
            throttle: Set(to_db($m.throttle)),
        }
    };
}

fn minute(r: &gpu_minutes::Model) -> Minute {
    figures!(r)
}

fn hour(r: &gpu_hours::Model) -> Minute {
    figures!(r)
}

fn hour_row(
    (vm, tenant, bdf, at): (Uuid, Uuid, &str, DateTime<Utc>),
    m: &Minute,
) -> gpu_hours::ActiveModel {
    row!(gpu_hours, hour, (vm, tenant, bdf, at), m)
}

/// A GPU's minute: VM, tenant, host address, minute.
pub type MinuteKey = (Uuid, Uuid, String, DateTime<Utc>);

/// Folds readings into their minutes' rows, every GPU of a report in one
/// statement: an insert that, where the minute's row exists, merges into
/// it as `Minute::merge` does (sums add, extremes keep the larger, a
/// missing value leaves the other). `rows`: one per (VM, GPU, minute).
pub async fn fold_minutes(
    db: &impl ConnectionTrait,
    rows: &[(MinuteKey, Minute)],
) -> Result<(), ApiError> {
    use gpu_minutes::Column as C;
    use sea_orm::sea_query::{Expr, OnConflict};
    if rows.is_empty() {
        return Ok(());
    }
    // SQL for `Minute::merge` of the stored row and the new one (`excluded`).
    let add = |c: &str| {
        format!("CASE WHEN gpu_minutes.{c} IS NULL THEN excluded.{c} WHEN excluded.{c} IS NULL THEN gpu_minutes.{c} ELSE gpu_minutes.{c} + excluded.{c} END")
    };
    let most = |c: &str| {
        format!("CASE WHEN gpu_minutes.{c} IS NULL OR excluded.{c} > gpu_minutes.{c} THEN excluded.{c} ELSE gpu_minutes.{c} END")
    };
    let merged = [
        (C::Samples, "gpu_minutes.samples + excluded.samples".to_owned()),
        (C::UtilN, "gpu_minutes.util_n + excluded.util_n".to_owned()),
        (C::UtilSum, add("util_sum")),
        (C::UtilMax, most("util_max")),
        (C::MemUsedMax, most("mem_used_max")),
        (C::MemTotal, "COALESCE(excluded.mem_total, gpu_minutes.mem_total)".to_owned()),
        (C::TempMax, most("temp_max")),
        (C::PowerN, "gpu_minutes.power_n + excluded.power_n".to_owned()),
        (C::PowerSum, add("power_sum")),
        (C::EccMax, most("ecc_max")),
        (C::Throttle, "CASE WHEN gpu_minutes.throttle IS NULL THEN excluded.throttle WHEN excluded.throttle IS NULL THEN gpu_minutes.throttle ELSE gpu_minutes.throttle | excluded.throttle END".to_owned()),
    ];
    let mut conflict = OnConflict::columns([C::VmId, C::HostBdf, C::Minute]);
    for (c, sql) in merged {
        conflict.value(c, Expr::cust(sql));
    }
    let models = rows
        .iter()
        .map(|((vm, tenant, bdf, at), m)| row!(gpu_minutes, minute, (*vm, *tenant, bdf, *at), m));
    gpu_minutes::Entity::insert_many(models)
        .on_conflict(conflict.to_owned())
        .exec(db)
        .await?;
    Ok(())
}

/// Every VM's last word of a report, in one statement.
pub async fn set_statuses(
    db: &impl ConnectionTrait,
    rows: &[(Uuid, Uuid, Option<String>)],
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    use sea_orm::sea_query::OnConflict;
    use vm_telemetry::Column as C;
    if rows.is_empty() {
        return Ok(());
    }
    let models = rows
        .iter()
        .map(|(vm, tenant, reason)| vm_telemetry::ActiveModel {
            vm_id: Set(*vm),
            tenant_id: Set(*tenant),
            state: Set(if reason.is_some() { "unknown" } else { "ok" }.to_owned()),
            reason: Set(reason.as_ref().map(|r| r.chars().take(500).collect())),
            read_at: Set(at),
        });
    vm_telemetry::Entity::insert_many(models)
        .on_conflict(
            OnConflict::column(C::VmId)
                .update_columns([C::State, C::Reason, C::ReadAt])
                .to_owned(),
        )
        .exec(db)
        .await?;
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

/// A VM's hours in `[from, to)`, by GPU and time.
pub async fn hours(
    db: &impl ConnectionTrait,
    vm: Uuid,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<(String, DateTime<Utc>, Minute)>, ApiError> {
    Ok(gpu_hours::Entity::find()
        .filter(gpu_hours::Column::VmId.eq(vm))
        .filter(gpu_hours::Column::Hour.gte(from))
        .filter(gpu_hours::Column::Hour.lt(to))
        .order_by_asc(gpu_hours::Column::HostBdf)
        .order_by_asc(gpu_hours::Column::Hour)
        .all(db)
        .await?
        .iter()
        .map(|r| (r.host_bdf.clone(), r.hour, hour(r)))
        .collect())
}

/// A GPU's minutes in a batch: first, last, how many.
type Span = (DateTime<Utc>, DateTime<Utc>, u64);

/// Minutes rolled up per transaction.
const MINUTES_PER_ROLL: u64 = 5_000;

/// Folds the minutes before `before` (a whole hour) into hours, and they
/// go; hours before `oldest` go. Safe on several replicas at once: a
/// batch first deletes the minutes it read and rolls back unless it
/// deleted every one (another replica folded them). Answers the minutes
/// folded.
pub async fn roll_up(
    db: &DatabaseConnection,
    before: DateTime<Utc>,
    oldest: DateTime<Utc>,
) -> Result<u64, ApiError> {
    let mut folded = 0;
    loop {
        // Read before the transaction, which writes first (on SQLite a
        // transaction that reads and then writes fails at once when another
        // server wrote in between); the delete's count guards it.
        let rows = gpu_minutes::Entity::find()
            .filter(gpu_minutes::Column::Minute.lt(before))
            .order_by_asc(gpu_minutes::Column::VmId)
            .order_by_asc(gpu_minutes::Column::HostBdf)
            .order_by_asc(gpu_minutes::Column::Minute)
            .limit(MINUTES_PER_ROLL)
            .all(db)
            .await?;
        if rows.is_empty() {
            break;
        }
        // A GPU's minutes in this batch are one run of its minutes (the
        // batch is in key order): one delete per GPU.
        let mut spans: BTreeMap<(Uuid, String), Span> = BTreeMap::new();
        let mut hours: BTreeMap<(Uuid, String, DateTime<Utc>), (Uuid, Minute)> = BTreeMap::new();
        for r in &rows {
            let span = spans
                .entry((r.vm_id, r.host_bdf.clone()))
                .or_insert((r.minute, r.minute, 0));
            span.0 = span.0.min(r.minute);
            span.1 = span.1.max(r.minute);
            span.2 += 1;
            let h = hours
                .entry((r.vm_id, r.host_bdf.clone(), hour_of(r.minute)))
                .or_insert((r.tenant_id, Minute::default()));
            h.1 = h.1.merge(&minute(r));
        }
        let txn = db.begin().await?;
        let mut stale = false;
        for ((vm, bdf), (lo, hi, n)) in &spans {
            let gone = gpu_minutes::Entity::delete_many()
                .filter(gpu_minutes::Column::VmId.eq(*vm))
                .filter(gpu_minutes::Column::HostBdf.eq(bdf.as_str()))
                .filter(gpu_minutes::Column::Minute.gte(*lo))
                .filter(gpu_minutes::Column::Minute.lte(*hi))
                .exec(&txn)
                .await?;
            if gone.rows_affected != *n {
                stale = true;
                break;
            }
        }
        if stale {
            // Another replica is folding these; ours rolls back.
            return Ok(folded);
        }
        for ((vm, bdf, at), (tenant, m)) in &hours {
            let old = gpu_hours::Entity::find_by_id((*vm, bdf.clone(), *at))
                .one(&txn)
                .await?;
            let row = hour_row(
                (*vm, *tenant, bdf, *at),
                &old.as_ref().map(hour).unwrap_or_default().merge(m),
            );
            if old.is_some() {
                row.update(&txn).await?;
            } else {
                row.insert(&txn).await?;
            }
        }
        txn.commit().await?;
        folded += rows.len() as u64;
    }
    gpu_hours::Entity::delete_many()
        .filter(gpu_hours::Column::Hour.lt(oldest))
        .exec(db)
        .await?;
    Ok(folded)
}

pub async fn status(
    db: &impl ConnectionTrait,
    vm: Uuid,
) -> Result<Option<vm_telemetry::Model>, ApiError> {
    Ok(vm_telemetry::Entity::find_by_id(vm).one(db).await?)
}

/// A deleted VM's last word goes.
pub async fn forget(db: &impl ConnectionTrait, vm: Uuid) -> Result<(), ApiError> {
    vm_telemetry::Entity::delete_by_id(vm).exec(db).await?;
    Ok(())
}
