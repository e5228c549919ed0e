//! Metering at the edge: the runs a VM is charged for are opened and
//! closed in the transaction of the state change that starts or ends
//! them, and the poster turns runs into charges (`kumo-billing` decides
//! the pieces and amounts).
//!
//! Compute (GPUs, vCPUs, memory) is charged while a VM is `running` or
//! `preempting` (it still runs through its grace period); its disk from
//! creation until the row is gone, whatever its state. A public IP is
//! charged while the tenant holds it (a run keyed by the address's id,
//! named by the address, at the guaranteed price).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kumo_api_types::{ServiceLevel, VmSpec, VmState};
use kumo_billing::meter::{self, Run};
use kumo_billing::rates::{
    gpu_class, Price, RateBook, RateCard, DISK_GIB, MEMORY_GIB, PUBLIC_IP, SNAPSHOT_GIB, VCPU,
    VOLUME_GIB,
};
use kumo_billing::{Decimal, Level};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    Set, TransactionTrait,
};
use uuid::Uuid;

use crate::context::AppState;
use crate::entity::{
    charges, meter_runs, public_ips, rate_cards, tenants, vms, volume_snapshots, volumes,
};
use crate::error::{is_unique_violation, ApiError};
use crate::store::vms::{stored_placement, stored_spec};

pub fn billable(s: VmState) -> bool {
    matches!(s, VmState::Running | VmState::Preempting)
}

pub fn level_of(spec: &VmSpec) -> Level {
    match spec.service_level {
        ServiceLevel::Spot => Level::Spot,
        ServiceLevel::Guaranteed => Level::Guaranteed,
    }
}

/// What a running VM is charged for: `(class, quantity)`.
pub fn compute_resources(spec: &VmSpec, gpu_model: Option<&str>) -> Vec<(String, Decimal)> {
    let mut out = Vec::new();
    if spec.gpus > 0 {
        let model = gpu_model.or(spec.gpu_model.as_deref()).unwrap_or("unknown");
        out.push((gpu_class(model), Decimal::from(spec.gpus)));
    }
    out.push((VCPU.to_owned(), Decimal::from(spec.vcpus)));
    out.push((MEMORY_GIB.to_owned(), Decimal::from(spec.memory_gib)));
    out
}

/// The model of the VM's GPUs, from its host's profile.
pub fn gpu_model_of(st: &AppState, vm: &vms::Model) -> Option<String> {
    let host = vm.host_id?;
    let p = stored_placement(vm).ok().flatten()?;
    let g = p.gpus.first()?;
    let index = st.capacity.lock();
    let h = &index.hosts[index.position(host)?];
    let m = h.profile.gpus[h.profile.gpu_index(g)?].model;
    index.model_name(m).map(str::to_owned)
}

async fn open(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    level: Level,
    resources: Vec<(String, Decimal)>,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    for (class, quantity) in resources {
        let row = meter_runs::ActiveModel {
            id: Set(Uuid::now_v7()),
            vm_id: Set(vm.id),
            vm_name: Set(vm.name.clone()),
            tenant_id: Set(vm.tenant_id),
            class: Set(class),
            quantity: Set(quantity.to_string()),
            level: Set(level.as_str().to_owned()),
            started_at: Set(at),
            ended_at: Set(None),
            posted_until: Set(None),
        };
        match row.insert(txn).await {
            Ok(_) => {}
            // The same transition replayed: the run exists.
            Err(e) if is_unique_violation(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn close(
    txn: &DatabaseTransaction,
    vm: Uuid,
    disk_too: bool,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let mut q = meter_runs::Entity::update_many()
        .col_expr(meter_runs::Column::EndedAt, Expr::value(Some(at)))
        .filter(meter_runs::Column::VmId.eq(vm))
        .filter(meter_runs::Column::EndedAt.is_null());
    if !disk_too {
        q = q.filter(meter_runs::Column::Class.ne(DISK_GIB));
    }
    q.exec(txn).await?;
    Ok(())
}

/// A new VM: its disk is charged from now on.
pub async fn created(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let spec = stored_spec(vm)?;
    open(
        txn,
        vm,
        level_of(&spec),
        vec![(DISK_GIB.to_owned(), Decimal::from(spec.disk_gib))],
        at,
    )
    .await
}

/// A VM's state changes from `from` to `to` at `at`.
pub async fn transition(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    from: VmState,
    to: VmState,
    gpu_model: Option<String>,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    match (billable(from), billable(to)) {
        (false, true) => {
            let spec = stored_spec(vm)?;
            let resources = compute_resources(&spec, gpu_model.as_deref());
            open(txn, vm, level_of(&spec), resources, at).await
        }
        (true, false) => close(txn, vm.id, false, at).await,
        _ => Ok(()),
    }
}

/// The VM row goes: every run of it ends.
pub async fn gone(txn: &DatabaseTransaction, vm: Uuid, at: DateTime<Utc>) -> Result<(), ApiError> {
    close(txn, vm, true, at).await
}

/// A tenant's holding of something other than a VM (an address, a
/// volume) is charged from now on, always at the guaranteed rate.
async fn hold(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    (id, name): (Uuid, &str),
    class: &str,
    quantity: Decimal,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    meter_runs::ActiveModel {
        id: Set(Uuid::now_v7()),
        vm_id: Set(id),
        vm_name: Set(name.to_owned()),
        tenant_id: Set(tenant.id),
        class: Set(class.to_owned()),
        quantity: Set(quantity.to_string()),
        level: Set(Level::Guaranteed.as_str().to_owned()),
        started_at: Set(at),
        ended_at: Set(None),
        posted_until: Set(None),
    }
    .insert(txn)
    .await?;
    Ok(())
}

/// A tenant took a public address: charged from now on.
pub async fn public_ip_allocated(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    ip: &public_ips::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    hold(
        txn,
        tenant,
        (ip.id, &ip.address),
        PUBLIC_IP,
        Decimal::ONE,
        at,
    )
    .await
}

/// The tenant gave the address back: its run ends.
pub async fn public_ip_released(
    txn: &DatabaseTransaction,
    ip: &public_ips::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, ip.id, true, at).await
}

/// A volume's size is charged from now on (a new volume, or one that grew:
/// the run of its old size ended first).
pub async fn volume_held(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    v: &volumes::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let gib = Decimal::from(v.size_gib);
    hold(txn, tenant, (v.id, &v.name), VOLUME_GIB, gib, at).await
}

/// A snapshot's size is charged from now on.
pub async fn snapshot_held(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    s: &volume_snapshots::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let gib = Decimal::from(s.size_gib);
    hold(txn, tenant, (s.id, &s.name), SNAPSHOT_GIB, gib, at).await
}

/// A volume's charge ends (deleted, or about to be charged at a new size).
pub async fn volume_released(
    txn: &DatabaseTransaction,
    volume: Uuid,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, volume, true, at).await
}

/// A snapshot's charge ends (it, or its volume, is being deleted).
pub async fn snapshot_released(
    txn: &DatabaseTransaction,
    snapshot: Uuid,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, snapshot, true, at).await
}

/// Every rate card, as the billing core reads them.
pub async fn rate_book(db: &impl ConnectionTrait) -> Result<RateBook, ApiError> {
    let mut cards = Vec::new();
    for c in rate_cards::Entity::find().all(db).await? {
        let prices: BTreeMap<String, Price> = serde_json::from_str(&c.prices)
            .map_err(|e| ApiError::Internal(format!("rate card {}: {e}", c.id)))?;
        cards.push(RateCard {
            effective_from: c.effective_from,
            prices,
        });
    }
    Ok(RateBook::new(cards))
}

/// The service level of a meter run or charge row.
pub fn stored_level(table: &str, row: uuid::Uuid, s: &str) -> Result<Level, ApiError> {
    crate::domain::states::decode(table, row, s)
}

pub fn run_of(r: &meter_runs::Model) -> Result<Run, ApiError> {
    Ok(Run {
        class: r.class.clone(),
        quantity: r
            .quantity
            .parse()
            .map_err(|_| ApiError::Internal(format!("run {}: quantity {:?}", r.id, r.quantity)))?,
        level: stored_level("meter_runs", r.id, &r.level)?,
        start: r.started_at,
        end: r.ended_at,
    })
}

/// Posts every complete piece of every run not yet charged in full, each
/// run in its own transaction. Safe on any number of replicas at once:
/// the run's `posted_until` moves only from the value read, and a piece
/// posted twice is a key conflict — the loser rolls back. Answers the
/// charges posted.
/// Charge rows per INSERT: 14 columns each, well under any database's
/// limit of bound variables.
const CHARGES_PER_STATEMENT: usize = 500;

pub async fn post_due(st: &AppState) -> Result<usize, ApiError> {
    let now = st.config.clock.now();
    let book = rate_book(&st.db).await?;
    let open = meter_runs::Entity::find()
        .filter(
            sea_orm::Condition::any()
                .add(meter_runs::Column::EndedAt.is_null())
                .add(meter_runs::Column::PostedUntil.is_null())
                .add(
                    Expr::col(meter_runs::Column::PostedUntil)
                        .lt(Expr::col(meter_runs::Column::EndedAt)),
                ),
        )
        .all(&st.db)
        .await?;
    let mut posted = 0;
    for r in open {
        let run = run_of(&r)?;
        let pieces = meter::due(&run, r.posted_until, now, &book);
        let Some(last) = pieces.last().map(|p| p.to) else {
            continue;
        };
        let txn = st.db.begin().await?;
        let mut moved = meter_runs::Entity::update_many()
            .col_expr(meter_runs::Column::PostedUntil, Expr::value(Some(last)))
            .filter(meter_runs::Column::Id.eq(r.id));
        moved = match r.posted_until {
            Some(p) => moved.filter(meter_runs::Column::PostedUntil.eq(p)),
            None => moved.filter(meter_runs::Column::PostedUntil.is_null()),
        };
        if moved.exec(&txn).await?.rows_affected != 1 {
            continue; // another replica posted these
        }
        let rows: Vec<charges::ActiveModel> = pieces
            .iter()
            .map(|p| charges::ActiveModel {
                id: Set(Uuid::now_v7()),
                run_id: Set(r.id),
                tenant_id: Set(r.tenant_id),
                vm_id: Set(r.vm_id),
                vm_name: Set(r.vm_name.clone()),
                class: Set(r.class.clone()),
                level: Set(r.level.clone()),
                period_from: Set(p.from),
                period_to: Set(p.to),
                seconds: Set(p.seconds),
                per_hour: Set(p.per_hour.normalize().to_string()),
                amount: Set(p.amount.normalize().to_string()),
                amount_micro: Set(kumo_billing::to_micro(p.amount)),
                posted_at: Set(now),
            })
            .collect();
        // In statements of a bounded size: a run not posted for a long
        // while (a server down over a weekend) has thousands of pieces,
        // more than one statement may bind (SQLite: 32,766 variables).
        let mut lost = false;
        for chunk in rows.chunks(CHARGES_PER_STATEMENT) {
            match charges::Entity::insert_many(chunk.to_vec())
                .exec(&txn)
                .await
            {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => {
                    lost = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if lost {
            continue; // another replica posted these: ours rolls back
        }
        txn.commit().await?;
        posted += pieces.len();
    }
    Ok(posted)
}
