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

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use kumo_api_types::{ServiceLevel, VmSpec, VmState};
use kumo_billing::ledger::{self, Entry};
use kumo_billing::meter::{self, Run};
use kumo_billing::rates::{
    gpu_class, Price, RateBook, RateCard, DISK_GIB, MEMORY_GIB, PUBLIC_IP, SHARE_GIB, SNAPSHOT_GIB,
    VCPU, VOLUME_GIB,
};
use kumo_billing::{Decimal, Level};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::context::AppState;
use crate::entity::{
    charges, meter_runs, point_grants, public_ips, rate_cards, tenants, vms, volume_snapshots,
    volumes,
};
use crate::error::{is_unique_violation, ApiError};
use crate::store::billing::stored_decimal;
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

/// What a running VM is charged for: `(class, quantity)`. Its GPUs at
/// the borrow rate while it is borrowed.
pub fn compute_resources(
    spec: &VmSpec,
    gpu_model: Option<&str>,
    borrowed: bool,
) -> Vec<(String, Decimal)> {
    let mut out = Vec::new();
    if let Some(g) = gpu_resource(spec, gpu_model, borrowed) {
        out.push(g);
    }
    out.push((VCPU.to_owned(), Decimal::from(spec.vcpus)));
    out.push((MEMORY_GIB.to_owned(), Decimal::from(spec.memory_gib)));
    out
}

fn gpu_resource(
    spec: &VmSpec,
    gpu_model: Option<&str>,
    borrowed: bool,
) -> Option<(String, Decimal)> {
    if spec.gpus == 0 {
        return None;
    }
    let model = gpu_model.or(spec.gpu_model.as_deref()).unwrap_or("unknown");
    let class = if borrowed {
        kumo_billing::rates::borrowed_gpu_class(model)
    } else {
        gpu_class(model)
    };
    Some((class, Decimal::from(spec.gpus)))
}

/// A running VM became borrowed or stopped being: its GPUs' run ends and
/// one at the other rate begins.
pub async fn borrowing_changed(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    borrowed: bool,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let spec = stored_spec(vm)?;
    let open_runs = meter_runs::Entity::find()
        .filter(meter_runs::Column::VmId.eq(vm.id))
        .filter(meter_runs::Column::EndedAt.is_null())
        .all(txn)
        .await?;
    // Not running: the next start opens the right run.
    let Some(run) = open_runs
        .iter()
        .find(|r| kumo_billing::rates::is_vm_gpu_class(&r.class))
    else {
        return Ok(());
    };
    // The model the run was opened for (its host's), kept.
    let model = run.class.split_once(':').map(|(_, m)| m.to_owned());
    let Some(gpus) = gpu_resource(&spec, model.as_deref(), borrowed) else {
        return Ok(());
    };
    if gpus.0 == run.class {
        return Ok(());
    }
    meter_runs::Entity::update_many()
        .col_expr(meter_runs::Column::EndedAt, Expr::value(Some(at)))
        .filter(meter_runs::Column::Id.eq(run.id))
        .exec(txn)
        .await?;
    open(txn, vm, level_of(&spec), vec![gpus], at).await
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
        // The same transition replayed: the run exists. (Skipped in the
        // statement: a unique violation caught after the fact would leave a
        // PostgreSQL transaction aborted for everything after it.)
        meter_runs::Entity::insert(row)
            .on_conflict(
                sea_orm::sea_query::OnConflict::columns([
                    meter_runs::Column::VmId,
                    meter_runs::Column::Class,
                    meter_runs::Column::StartedAt,
                ])
                .do_nothing()
                .to_owned(),
            )
            .do_nothing()
            .exec(txn)
            .await?;
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
            let resources =
                compute_resources(&spec, gpu_model.as_deref(), vm.borrowed_at.is_some());
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

/// A new cluster's spares: `spares × GPUs per member` of its model are
/// charged at the `spare_gpu:<model>` rate from now on, under the
/// cluster's id and name.
pub async fn spares_held(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    c: &crate::entity::clusters::Model,
    gpus: u32,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let (Some(model), true) = (&c.spare_model, c.spares > 0 && gpus > 0) else {
        return Ok(());
    };
    let quantity = Decimal::from(c.spares) * Decimal::from(gpus);
    let class = kumo_billing::rates::spare_gpu_class(model);
    hold(txn, tenant, (c.id, &c.name), &class, quantity, at).await
}

/// The cluster's spares are given up (it is being deleted).
pub async fn spares_released(
    txn: &DatabaseTransaction,
    cluster: Uuid,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, cluster, true, at).await
}

/// A reservation's held GPUs are charged at the `reserved_gpu:<model>`
/// rate from `at` (its start), under its id and name.
pub async fn reservation_held(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    r: &crate::entity::reservations::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let class = kumo_billing::rates::reserved_gpu_class(&r.gpu_model);
    hold(
        txn,
        tenant,
        (r.id, &r.name),
        &class,
        Decimal::from(r.gpus),
        at,
    )
    .await
}

/// The reservation ended (or was cancelled) at `at`.
pub async fn reservation_released(
    txn: &DatabaseTransaction,
    reservation: Uuid,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, reservation, true, at).await
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

/// A project share's size is charged from now on.
pub async fn share_held(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    s: &crate::entity::shares::Model,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    let gib = Decimal::from(s.size_gib);
    hold(txn, tenant, (s.id, &s.name), SHARE_GIB, gib, at).await
}

/// A share's charge ends (deleted, or about to be charged at a new size).
pub async fn share_released(
    txn: &DatabaseTransaction,
    share: Uuid,
    at: DateTime<Utc>,
) -> Result<(), ApiError> {
    close(txn, share, true, at).await
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

/// Runs posted per transaction on SQLite: a commit per run made the
/// poster hold the one connection for seconds a minute at a few hundred
/// VMs. On PostgreSQL one run per transaction: a batch holding many runs'
/// rows would deadlock with a status report ending several VMs' runs in
/// another order.
fn runs_per_transaction(db: &sea_orm::DatabaseConnection) -> usize {
    match db.get_database_backend() {
        sea_orm::DatabaseBackend::Sqlite => 250,
        _ => 1,
    }
}

/// Charge rows per INSERT: 14 columns each, well under any database's
/// limit of bound variables.
const CHARGES_PER_STATEMENT: usize = 500;

/// The times at which each tenant's grants in force change: what cuts a
/// ledger entry between two postings (`kumo_billing::ledger`).
async fn grant_changes(
    db: &impl ConnectionTrait,
) -> Result<HashMap<Uuid, Vec<DateTime<Utc>>>, ApiError> {
    let mut out: HashMap<Uuid, Vec<DateTime<Utc>>> = HashMap::new();
    for g in point_grants::Entity::find().all(db).await? {
        out.entry(g.tenant_id)
            .or_default()
            .extend([g.granted_at, g.expires_at]);
    }
    Ok(out)
}

/// A stored charge row as a ledger entry.
fn entry_of(c: &charges::Model) -> Result<Entry, ApiError> {
    Ok(Entry {
        from: c.period_from,
        to: c.period_to,
        seconds: c.seconds,
        per_hour: stored_decimal("charge", c.id, &c.per_hour)?,
        amount: stored_decimal("charge", c.id, &c.amount)?,
        posted_at: c.posted_at,
    })
}

/// The charge row of a run's ledger entry.
pub fn charge_row(r: &meter_runs::Model, e: &Entry) -> charges::ActiveModel {
    charges::ActiveModel {
        id: Set(Uuid::now_v7()),
        run_id: Set(r.id),
        tenant_id: Set(r.tenant_id),
        vm_id: Set(r.vm_id),
        vm_name: Set(r.vm_name.clone()),
        class: Set(r.class.clone()),
        level: Set(r.level.clone()),
        period_from: Set(e.from),
        period_to: Set(e.to),
        seconds: Set(e.seconds),
        per_hour: Set(e.per_hour.normalize().to_string()),
        amount: Set(e.amount.normalize().to_string()),
        amount_micro: Set(kumo_billing::to_micro(e.amount)),
        posted_at: Set(e.posted_at),
    }
}

/// Writes a grown entry over the row `id` that ended at `was_to`:
/// answers whether that row was still as read.
async fn grow(
    txn: &DatabaseTransaction,
    id: Uuid,
    was_to: DateTime<Utc>,
    e: &Entry,
) -> Result<bool, ApiError> {
    let moved = charges::Entity::update_many()
        .col_expr(charges::Column::PeriodTo, Expr::value(e.to))
        .col_expr(charges::Column::Seconds, Expr::value(e.seconds))
        .col_expr(
            charges::Column::Amount,
            Expr::value(e.amount.normalize().to_string()),
        )
        .col_expr(
            charges::Column::AmountMicro,
            Expr::value(kumo_billing::to_micro(e.amount)),
        )
        .col_expr(charges::Column::PostedAt, Expr::value(e.posted_at))
        .filter(charges::Column::Id.eq(id))
        .filter(charges::Column::PeriodTo.eq(was_to))
        .exec(txn)
        .await?;
    Ok(moved.rows_affected == 1)
}

/// Posts every complete piece of every run not yet charged in full, into
/// the run's ledger entries (`kumo_billing::ledger`: the last entry grows
/// while nothing tells its pieces apart), many runs per transaction.
/// Safe on any number of replicas at once: a run's `posted_until` moves
/// only from the value read (runs are taken in id order, so two replicas
/// wait on each other's runs without deadlocking), and a piece posted
/// twice is a key conflict that rolls the loser's batch back. Answers the
/// pieces posted.
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
        .order_by_asc(meter_runs::Column::Id)
        .all(&st.db)
        .await?;
    let mut due = Vec::new();
    for r in open {
        let pieces = meter::due(&run_of(&r)?, r.posted_until, now, &book);
        if !pieces.is_empty() {
            due.push((r, pieces));
        }
    }
    if due.is_empty() {
        return Ok(0);
    }
    let changes = grant_changes(&st.db).await?;
    let mut posted = 0;
    for batch in due.chunks(runs_per_transaction(&st.db)) {
        // Each run's last entry: the row ending where the run is posted.
        // Read before the transaction, which then writes first: a SQLite
        // transaction that reads and then writes fails at once when
        // another server wrote in between. Every write below is
        // conditional on what was read.
        let ends: HashMap<Uuid, DateTime<Utc>> = batch
            .iter()
            .filter_map(|(r, _)| r.posted_until.map(|p| (r.id, p)))
            .collect();
        let mut last: HashMap<Uuid, charges::Model> = HashMap::new();
        if !ends.is_empty() {
            for c in charges::Entity::find()
                .filter(charges::Column::RunId.is_in(ends.keys().copied()))
                .filter(charges::Column::PeriodTo.is_in(ends.values().copied()))
                .all(&st.db)
                .await?
            {
                if ends.get(&c.run_id) == Some(&c.period_to) {
                    last.insert(c.run_id, c);
                }
            }
        }
        let txn = st.db.begin().await?;
        let mut rows = Vec::new();
        let mut pieces_here = 0;
        let mut lost = false;
        for (r, pieces) in batch {
            let Some(to) = pieces.last().map(|p| p.to) else {
                continue;
            };
            let mut moved = meter_runs::Entity::update_many()
                .col_expr(meter_runs::Column::PostedUntil, Expr::value(Some(to)))
                .filter(meter_runs::Column::Id.eq(r.id));
            moved = match r.posted_until {
                Some(p) => moved.filter(meter_runs::Column::PostedUntil.eq(p)),
                None => moved.filter(meter_runs::Column::PostedUntil.is_null()),
            };
            if moved.exec(&txn).await?.rows_affected != 1 {
                continue; // another replica posted these
            }
            let open = last.get(&r.id).map(entry_of).transpose()?;
            let none = Vec::new();
            let step = ledger::post(
                open.as_ref(),
                pieces,
                now,
                changes.get(&r.tenant_id).unwrap_or(&none),
            );
            if let (Some(grown), Some(row)) = (&step.grown, last.get(&r.id)) {
                if !grow(&txn, row.id, row.period_to, grown).await? {
                    lost = true;
                    break;
                }
            }
            rows.extend(step.new.iter().map(|e| charge_row(r, e)));
            pieces_here += pieces.len();
        }
        // In statements of a bounded size (SQLite binds at most 32,766
        // variables).
        for chunk in rows.chunks(CHARGES_PER_STATEMENT) {
            if lost {
                break;
            }
            match charges::Entity::insert_many(chunk.to_vec())
                .exec(&txn)
                .await
            {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => lost = true,
                Err(e) => return Err(e.into()),
            }
        }
        if lost {
            // Another writer posted some of these (one that does not take
            // the runs' `posted_until` first): ours roll back, and the next
            // pass posts what is left.
            continue;
        }
        txn.commit().await?;
        posted += pieces_here;
    }
    Ok(posted)
}

/// Runs compacted per transaction: an old ledger holds ~43,200 rows per
/// run and month, all read and rewritten in one go.
const RUNS_PER_COMPACTION: u64 = 20;

/// Folds a ledger kept a row per piece (before entries) into entries,
/// run by run, with the rules the poster follows; idempotent, and safe
/// beside posters and other replicas: a run's last row (the one a poster
/// may grow) is never touched, each merged row is rewritten only if it is
/// as read, and a batch that finds a row gone rolls back. Answers the rows
/// removed.
pub async fn compact_ledger(st: &AppState) -> Result<u64, ApiError> {
    let changes = grant_changes(&st.db).await?;
    let mut after: Option<Uuid> = None;
    let mut removed = 0;
    loop {
        let mut q = meter_runs::Entity::find()
            .order_by_asc(meter_runs::Column::Id)
            .limit(RUNS_PER_COMPACTION);
        if let Some(a) = after {
            q = q.filter(meter_runs::Column::Id.gt(a));
        }
        let runs = q.all(&st.db).await?;
        let Some(tail) = runs.last() else {
            return Ok(removed);
        };
        after = Some(tail.id);
        // Read before the transaction (see `post_due`); every write is
        // conditional on what was read.
        let mut by_run: HashMap<Uuid, Vec<charges::Model>> = HashMap::new();
        for c in charges::Entity::find()
            .filter(charges::Column::RunId.is_in(runs.iter().map(|r| r.id)))
            .order_by_asc(charges::Column::PeriodFrom)
            .all(&st.db)
            .await?
        {
            by_run.entry(c.run_id).or_default().push(c);
        }
        let txn = st.db.begin().await?;
        let mut gone = 0;
        let mut stale = false;
        'runs: for r in &runs {
            let Some(rows) = by_run.get_mut(&r.id) else {
                continue;
            };
            rows.pop(); // the run's last row: a poster may be growing it
            let entries = rows.iter().map(entry_of).collect::<Result<Vec<_>, _>>()?;
            let none = Vec::new();
            for (members, merged) in
                ledger::compact(&entries, changes.get(&r.tenant_id).unwrap_or(&none))
            {
                let Some((first, rest)) = members.split_first() else {
                    continue;
                };
                let head = &rows[*first];
                if !grow(&txn, head.id, head.period_to, &merged).await? {
                    stale = true;
                    break 'runs;
                }
                let ids: Vec<Uuid> = rest.iter().map(|i| rows[*i].id).collect();
                let deleted = charges::Entity::delete_many()
                    .filter(charges::Column::Id.is_in(ids.iter().copied()))
                    .exec(&txn)
                    .await?;
                if deleted.rows_affected != ids.len() as u64 {
                    stale = true;
                    break 'runs;
                }
                gone += deleted.rows_affected;
            }
        }
        if stale {
            continue; // another replica compacted these; ours rolls back
        }
        txn.commit().await?;
        removed += gone;
    }
}
