//! The reclamation loop (after CERN's Aardvark reaper), level-triggered
//! and safe on every replica at once: each pass looks at what the database
//! says and moves it one step.
//!
//! - a `preempting` spot VM past its deadline is shut down for good
//!   (`preempted`, removed from its host) when it has GPUs — VFIO devices
//!   cannot be saved — or suspended with libvirt's managed save when it
//!   has none;
//! - `pending` guaranteed VMs and clusters are placed once the spot VMs
//!   they wait for are gone (or reclaim more if someone took the room);
//! - `queued` requests are admitted in fair order ([`crate::app::queue`]);
//! - a `suspended` VM resumes when exactly what it had is free again
//!   (after pending VMs had their turn).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use kumo_api_types::{Power, ReclaimAction, VmState};
use kumo_scheduler::index::VmInput;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, TransactionTrait};
use uuid::Uuid;

use crate::context::AppState;
use crate::domain::states::StoredText;
use crate::entity::{allocations, vms};
use crate::error::{is_unique_violation, ApiError};
use crate::store::capacity::REFRESH;
use crate::store::hosts::bump_revision;
use crate::store::vms::{event, stored_placement, stored_spec};

pub const PASS: Duration = Duration::from_secs(1);

pub async fn run(st: AppState) {
    let mut tick = tokio::time::interval(PASS);
    let mut last_refresh = tokio::time::Instant::now();
    let mut last_post = tokio::time::Instant::now();
    let mut last_idle = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        if last_idle.elapsed() >= st.config.idle.check_every {
            last_idle = tokio::time::Instant::now();
            if let Err(e) = crate::app::idle_gpus::pass(&st).await {
                tracing::warn!(error = %e, "idle GPU pass failed; retrying");
            }
        }
        if last_post.elapsed() >= st.config.billing.post_interval {
            last_post = tokio::time::Instant::now();
            if let Err(e) = crate::app::metering::post_due(&st).await {
                tracing::warn!(error = %e, "posting charges failed; retrying");
            }
            if let Err(e) = crate::app::budget::enforce(&st).await {
                tracing::warn!(error = %e, "budget pass failed; retrying");
            }
            if let Err(e) = crate::store::idempotency::purge(&st.db, st.config.clock.now()).await {
                tracing::warn!(error = %e, "purging expired idempotency keys failed; retrying");
            }
        }
        if last_refresh.elapsed() >= REFRESH {
            last_refresh = tokio::time::Instant::now();
            if let Err(e) = st.capacity.refresh_all(&st.db).await {
                tracing::warn!(error = %e, "capacity refresh failed");
            }
        }
        if let Err(e) = pass(&st).await {
            tracing::warn!(error = %e, "reclamation pass failed; retrying");
        }
    }
}

/// One pass over everything the reaper looks after.
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    // Reservations' hosts before anything is placed: nothing else may
    // start on them. Their failure stops nothing else.
    if let Err(e) = crate::app::reservations::pass(st).await {
        tracing::warn!(error = %e, "reservations pass failed; retrying");
    }
    expire(st).await?;
    // Marks first: who may lend to a pending request depends on them.
    crate::app::guarantees::pass(st).await?;
    // Guaranteed VMs waiting for reclaimed room come before the spot VMs
    // that gave it up: resuming first would take the room straight back.
    place_pending(st).await?;
    // The fair queue after pending requests (they have reclaimed their
    // room already) and before suspended spot VMs resume.
    crate::app::queue::pass(st).await?;
    resume(st).await
}

/// Preempting VMs past their deadline: CPU-only ones are saved to disk,
/// those whose owner chose to keep them shelved, the rest shut down for
/// good.
async fn expire(st: &AppState) -> Result<(), ApiError> {
    let due = vms::Entity::find()
        .filter(vms::Column::State.eq(VmState::Preempting.as_str()))
        .filter(vms::Column::PreemptDeadline.lte(st.config.clock.now()))
        .all(&st.db)
        .await?;
    for vm in due {
        let spec = stored_spec(&vm)?;
        let now = st.config.clock.now();
        // What the grace period's end does: the state it leads to (none:
        // it stays preempting until saved), the power wanted, the event.
        let (next, power, kind, message) = if spec.on_reclaim == ReclaimAction::Shelve {
            (
                Some(VmState::Shelving),
                Some(Power::Stopped),
                "shelving",
                "grace period over; shelved, its disk and volumes kept",
            )
        } else if spec.gpus == 0 {
            (
                None,
                Some(Power::Suspended),
                "suspending",
                "grace period over; saving to disk",
            )
        } else {
            (
                Some(VmState::Preempted),
                None,
                "preempted",
                "grace period over; shut down",
            )
        };
        let txn = st.db.begin().await?;
        // Conditional, so two replicas do it once.
        let mut update = vms::Entity::update_many()
            .col_expr(
                vms::Column::PreemptDeadline,
                Expr::value(None::<chrono::DateTime<Utc>>),
            )
            .col_expr(vms::Column::UpdatedAt, Expr::value(now))
            // Reclaimed: it borrows nothing any more.
            .col_expr(
                vms::Column::BorrowedAt,
                Expr::value(None::<chrono::DateTime<Utc>>),
            )
            .filter(vms::Column::Id.eq(vm.id))
            .filter(vms::Column::State.eq(VmState::Preempting.as_str()));
        if let Some(p) = power {
            update = update.col_expr(vms::Column::DesiredPower, Expr::value(p.to_text()));
        }
        if let Some(n) = next {
            update = update.col_expr(vms::Column::State, Expr::value(n.as_str()));
        }
        if update.exec(&txn).await?.rows_affected == 0 {
            continue;
        }
        event(&txn, &vm, now, kind, message).await?;
        if let Some(n) = next {
            crate::app::metering::transition(&txn, &vm, VmState::Preempting, n, None, now).await?;
        }
        if let Some(h) = vm.host_id {
            bump_revision(&txn, h).await?;
        }
        txn.commit().await?;
        if let Some(h) = vm.host_id {
            st.signals.notify(h);
        }
    }
    Ok(())
}

/// Suspended VMs whose CPUs and memory are free again.
async fn resume(st: &AppState) -> Result<(), ApiError> {
    let suspended = vms::Entity::find()
        .filter(vms::Column::State.eq(VmState::Suspended.as_str()))
        .order_by_asc(vms::Column::CreatedAt)
        .all(&st.db)
        .await?;
    for vm in suspended {
        let (Some(host), Some(placement)) = (vm.host_id, stored_placement(&vm)?) else {
            continue;
        };
        let revision = {
            let index = st.capacity.lock();
            let Some(pos) = index.position(host) else {
                continue;
            };
            let h = &index.hosts[pos];
            // A reserved host takes back none of the VMs that left it.
            if h.reserved_for.is_some() {
                continue;
            }
            let hold = h.hold_of(&VmInput {
                vm: vm.id,
                tenant: vm.tenant_id,
                spot: true,
                borrowed: false,
                reclaiming: false,
                since: vm.created_at.timestamp(),
                placement: &placement,
                // Its disk never left the host: counted there already.
                disk_gib: 0,
            });
            if !index.is_free(pos, &hold) {
                continue;
            }
            h.revision
        };
        let txn = st.db.begin().await?;
        let claimed = crate::app::admission::claim_host(&txn, host, revision).await?;
        if !claimed {
            continue;
        }
        let rows = crate::store::allocations::rows(host, vm.id, &placement);
        if !rows.is_empty() {
            match allocations::Entity::insert_many(rows).exec(&txn).await {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        vms::Entity::update_many()
            .col_expr(
                vms::Column::State,
                Expr::value(VmState::Provisioning.as_str()),
            )
            .col_expr(
                vms::Column::DesiredPower,
                Expr::value(Power::Running.to_text()),
            )
            .col_expr(vms::Column::UpdatedAt, Expr::value(st.config.clock.now()))
            .filter(vms::Column::Id.eq(vm.id))
            .exec(&txn)
            .await?;
        event(
            &txn,
            &vm,
            st.config.clock.now(),
            "resuming",
            "room returned on its host",
        )
        .await?;
        txn.commit().await?;
        st.capacity.refresh_host(&st.db, host).await?;
        st.signals.notify(host);
    }
    Ok(())
}

/// Pending guaranteed VMs and clusters, oldest first.
async fn place_pending(st: &AppState) -> Result<(), ApiError> {
    let pending = vms::Entity::find()
        .filter(vms::Column::State.eq(VmState::Pending.as_str()))
        .order_by_asc(vms::Column::CreatedAt)
        .all(&st.db)
        .await?;
    // A cluster is placed whole: its members together.
    let mut groups: BTreeMap<(Option<Uuid>, Uuid), Vec<vms::Model>> = BTreeMap::new();
    for v in pending {
        let key = match v.cluster_id {
            Some(c) => (Some(c), c),
            None => (None, v.id),
        };
        groups.entry(key).or_default().push(v);
    }
    for ((cluster_id, _), rows) in groups {
        if let Err(e) = crate::app::admission::admit_pending(st, cluster_id, &rows).await {
            tracing::warn!(error = %e, vm = ?rows.first().map(|v| v.id), "pending VM not placed");
        }
    }
    Ok(())
}
