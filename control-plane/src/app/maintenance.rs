//! Maintenance with notice: an admin schedules a host's window; from then
//! the host takes nothing new, and every VM on it is told (its events, the
//! API, the project's webhook, `/run/kumo/events` in the guest) what will
//! happen and when. Tenants may act early (`kumo vm evacuate`, shelve).
//! When the window opens, VMs that can move are evacuated (shelved, then
//! placed elsewhere with their disks), cluster members are replaced on
//! other hosts, the rest stopped, and the host is `maintenance` until the
//! admin is done with it.

use kumo_api_types::{
    Host, HostState, MaintenanceCreate, Power, Role, ScheduledAction, ScheduledEvent, Vm, VmState,
};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};
use serde_json::json;
use uuid::Uuid;

use crate::app::access::{require_admin, tenant_access};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::Action;
use crate::domain::maintenance::{action_for, acts_at, event_for, Window};
use crate::domain::states::StoredText;
use crate::entity::{hosts, vms};
use crate::error::ApiError;
use crate::store::hosts::{find, host_state, reachable_state, stored_topology};
use crate::store::vms::{event, stored_state};

/// The host's maintenance window, if it has one.
fn window(h: &hosts::Model) -> Option<Window<'_>> {
    Some(Window {
        host: &h.name,
        at: h.maintenance_at?,
        told_at: h.maintenance_told_at,
        reason: h.maintenance_reason.as_deref(),
    })
}

/// The notice a VM asked for (its spec's `notice_seconds`).
fn notice_of(v: &vms::Model) -> Result<Option<u32>, ApiError> {
    Ok(crate::store::vms::stored_spec(v)?.notice_seconds)
}

/// What a VM on `host` is told (API, portal, `/run/kumo/events`): its
/// host's maintenance, and that it is borrowed.
pub fn events_of(v: &vms::Model, host: &hosts::Model) -> Result<Vec<ScheduledEvent>, ApiError> {
    let mut out: Vec<ScheduledEvent> = scheduled(v, host)?.into_iter().collect();
    if let Some(since) = v.borrowed_at {
        let model = crate::store::vms::stored_spec(v)?.gpu_model;
        out.push(crate::domain::guarantees::borrowed_event(
            since,
            &host.name,
            model.as_deref(),
        ));
    }
    Ok(out)
}

/// The event scheduled for a VM on `host`, if its host has a window: at
/// the window, or later when the VM asked for more notice than it gives.
pub fn scheduled(v: &vms::Model, host: &hosts::Model) -> Result<Option<ScheduledEvent>, ApiError> {
    let Some(w) = window(host) else {
        return Ok(None);
    };
    Ok(event_for(
        stored_state(v)?,
        v.cluster_id.is_some(),
        &w,
        notice_of(v)?,
    ))
}

/// An admin schedules (or moves) a host's maintenance window. Every VM on
/// it is told at once; the host takes nothing new from now on.
pub async fn schedule(
    st: &AppState,
    actor: &Actor,
    host: &str,
    body: &MaintenanceCreate,
) -> Result<Host, ApiError> {
    require_admin(&actor.caller, "scheduling maintenance")?;
    let reason = body
        .reason
        .as_deref()
        .map(crate::domain::maintenance::reason)
        .transpose()
        .map_err(|e| ApiError::field("reason", e))?
        .filter(|r| !r.is_empty());
    let txn = st.db.begin().await?;
    let h = find(&txn, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    if matches!(host_state(&h)?, HostState::Retired | HostState::Maintenance) {
        return Err(ApiError::Conflict(format!(
            "host {:?} is {}",
            h.name, h.state
        )));
    }
    let moved = h.maintenance_at.is_some();
    let mut a: hosts::ActiveModel = h.clone().into();
    a.maintenance_at = Set(Some(body.at));
    // VMs' notice runs from the first announcement: moving the window
    // does not start it again.
    a.maintenance_told_at = Set(h.maintenance_told_at.or(Some(actor.at)));
    a.maintenance_reason = Set(reason.clone());
    let updated = a.update(&txn).await?;
    let on_host = crate::store::vms::on_host(&txn, h.id).await?;
    let mut told = Vec::new();
    for v in &on_host {
        let Some(e) = scheduled(v, &updated)? else {
            continue;
        };
        let what = format!(
            "host {} maintenance at {}: this VM will be {}{}",
            h.name,
            e.at.to_rfc3339(),
            match e.action {
                ScheduledAction::Evacuate => "moved to another host with its disks (kumo vm evacuate does it now)",
                ScheduledAction::Replace => "replaced on another host (a cluster member: same name and address, fresh root disk)",
                ScheduledAction::Stop | ScheduledAction::Reclaimable => "stopped",
            },
            reason.as_deref().map(|r| format!("; {r}")).unwrap_or_default(),
        );
        let kind = if moved {
            "maintenance-moved"
        } else {
            "maintenance-scheduled"
        };
        event(&txn, v, actor.at, kind, what.clone()).await?;
        told.push((v.clone(), e, what));
    }
    crate::store::hosts::bump_revision(&txn, h.id).await?;
    audit::record(&txn, actor, "host.maintenance", None, &h.name).await?;
    txn.commit().await?;
    st.capacity.refresh_host(&st.db, h.id).await?;
    st.signals.notify(h.id);
    for (v, e, what) in told {
        crate::app::webhooks::notify(
            st,
            v.tenant_id,
            "vm.scheduled_event",
            json!({
                "text": format!("Kumo: VM {}: {what}", v.name),
                "event": "vm.scheduled_event",
                "vm": v.name,
                "vm_id": v.id,
                "scheduled": e,
            }),
        );
    }
    host_view(st, &updated).await
}

/// An admin is done with a host's maintenance (or calls a window off
/// before it opens): it takes VMs again.
pub async fn done(st: &AppState, actor: &Actor, host: &str) -> Result<Host, ApiError> {
    require_admin(&actor.caller, "ending maintenance")?;
    let txn = st.db.begin().await?;
    let h = find(&txn, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    if h.maintenance_at.is_none() && host_state(&h)? != HostState::Maintenance {
        return Err(ApiError::Conflict(format!(
            "host {:?} has no maintenance window",
            h.name
        )));
    }
    let state = host_state(&h)?;
    let drained = h.drained;
    let id = h.id;
    let name = h.name.clone();
    let mut a: hosts::ActiveModel = h.into();
    a.maintenance_at = Set(None);
    a.maintenance_told_at = Set(None);
    a.maintenance_reason = Set(None);
    if state == HostState::Maintenance {
        a.state = Set(reachable_state(drained).to_text().into());
    }
    let updated = a.update(&txn).await?;
    crate::store::hosts::bump_revision(&txn, id).await?;
    audit::record(&txn, actor, "host.maintenance_done", None, &name).await?;
    txn.commit().await?;
    st.capacity.refresh_host(&st.db, id).await?;
    st.signals.notify(id);
    host_view(st, &updated).await
}

async fn host_view(st: &AppState, h: &hosts::Model) -> Result<Host, ApiError> {
    let whole = crate::store::hosts::with_topology(&st.db, h).await?;
    let held = crate::store::hosts::held(&st.db, h.id).await?;
    let blocked = crate::app::fleet::blocked_on(&st.db, h.id).await?;
    crate::app::fleet::to_api(&whole, &*stored_topology(&whole)?, &held, &blocked)
}

/// A member moves a VM off a host with a maintenance window now rather
/// than at the window: shelved, then placed on another host with its
/// disks.
pub async fn evacuate(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
) -> Result<Vm, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "evacuating a VM")?;
    let txn = st.db.begin().await?;
    let v = crate::store::vms::find_vm_to_change(&txn, &tenant, vm).await?;
    let host = match v.host_id {
        Some(h) => crate::store::hosts::by_id(&txn, h).await?,
        None => None,
    };
    let event = match &host {
        Some(h) => scheduled(&v, h)?,
        None => None,
    };
    match event.map(|e| e.action) {
        Some(ScheduledAction::Evacuate) => {}
        Some(_) => {
            return Err(ApiError::Conflict(format!(
                "VM {:?} cannot move with its disks (a cluster member is replaced, a suspended or reclaimed VM stopped)",
                v.name
            )))
        }
        None => {
            return Err(ApiError::Conflict(format!(
                "VM {:?} is on no host with a maintenance window: shelve it and unshelve it --anywhere to move it",
                v.name
            )))
        }
    }
    let updated = start_evacuation(&txn, &v, &actor.caller.user.name, actor.at).await?;
    audit::record(&txn, actor, "vm.evacuate", Some(&tenant), &v.name).await?;
    txn.commit().await?;
    if let Some(h) = v.host_id {
        st.signals.notify(h);
    }
    crate::app::vms::view(&st.db, &updated, &tenant.name).await
}

/// The VM shelves, marked to be placed elsewhere once it is off the host.
async fn start_evacuation(
    txn: &sea_orm::DatabaseTransaction,
    v: &vms::Model,
    by: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<vms::Model, ApiError> {
    let power = crate::store::vms::desired_power(v)?;
    let shelving = crate::app::vms::apply_action(txn, v, Action::Shelve, by, now).await?;
    let mut a: vms::ActiveModel = shelving.into();
    a.evacuating = Set(Some(power.to_text().to_owned()));
    a.reason = Set(Some(
        "moving to another host for its host's maintenance".into(),
    ));
    Ok(a.update(txn).await?)
}

/// One pass: every host whose window has opened (and that answers) goes
/// to `maintenance` and has its VMs moved off, replaced or stopped, each
/// at its own time (a VM that asked for more notice than the window gave
/// stays until its notice is up).
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let due = hosts::Entity::find()
        .filter(hosts::Column::MaintenanceAt.lte(now))
        .filter(hosts::Column::State.is_in([
            HostState::Ready.to_text(),
            HostState::Draining.to_text(),
            HostState::Maintenance.to_text(),
        ]))
        .all(&st.reads)
        .await?;
    for h in due {
        if let Err(e) = open_window(st, &h, now).await {
            tracing::warn!(host = %h.name, error = %e, "maintenance window not opened; retrying");
        }
    }
    Ok(())
}

async fn open_window(
    st: &AppState,
    h: &hosts::Model,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let opening = host_state(h)? != HostState::Maintenance;
    let Some(w) = window(h) else {
        return Ok(());
    };
    if !opening {
        // A host in maintenance already: only when a VM's own time has come
        // (read first, so a quiet pass takes no write transaction).
        let mut due = false;
        for v in crate::store::vms::on_host(&st.reads, h.id).await? {
            let acts = matches!(
                action_for(stored_state(&v)?, v.cluster_id.is_some()),
                Some(ScheduledAction::Evacuate | ScheduledAction::Replace)
            );
            due |= acts && acts_at(&w, notice_of(&v)?) <= now;
        }
        if !due {
            return Ok(());
        }
    }
    let txn = st.db.begin().await?;
    if opening {
        // Only once: another replica may have opened it.
        let opened = hosts::Entity::update_many()
            .col_expr(
                hosts::Column::State,
                Expr::value(HostState::Maintenance.to_text()),
            )
            .filter(hosts::Column::Id.eq(h.id))
            .filter(hosts::Column::State.eq(h.state.clone()))
            .exec(&txn)
            .await?;
        if opened.rows_affected != 1 {
            return Ok(());
        }
    }
    let why = format!(
        "host {} maintenance{}",
        h.name,
        h.maintenance_reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    );
    let mut wake = vec![h.id];
    let mut clusters_touched: Vec<Uuid> = Vec::new();
    let mut singles: Vec<Uuid> = Vec::new();
    let mut acted = false;
    for v in crate::store::vms::on_host(&txn, h.id).await? {
        if acts_at(&w, notice_of(&v)?) > now {
            continue; // its own notice is not up yet
        }
        let Some(v) = crate::store::vms::locked(&txn, v.id).await? else {
            continue;
        };
        // Moved off meanwhile (by another replica's pass): not ours now.
        if v.host_id != Some(h.id) {
            continue;
        }
        let action = action_for(stored_state(&v)?, v.cluster_id.is_some());
        acted |= matches!(
            action,
            Some(ScheduledAction::Evacuate | ScheduledAction::Replace)
        );
        match action {
            Some(ScheduledAction::Evacuate) => {
                start_evacuation(&txn, &v, "maintenance", now).await?;
            }
            Some(ScheduledAction::Replace) => {
                wake.extend(
                    crate::app::host_loss::replace_off_host(&txn, &v, &why, "maintenance", now)
                        .await?,
                );
                match v.cluster_id {
                    Some(c) => {
                        crate::store::clusters::mark_repairing(&txn, c).await?;
                        if let Some(row) = crate::store::clusters::by_id(&txn, c).await? {
                            let message = format!("{} moves off host {}: {why}", v.name, h.name);
                            crate::store::clusters::event(&txn, &row, now, "repair", message)
                                .await?;
                        }
                        clusters_touched.push(c);
                    }
                    None => singles.push(v.id),
                }
            }
            // Stopped already (suspended to disk) or being shut down by
            // the reaper (reclaimed): they stay, off, until the host is
            // back.
            Some(ScheduledAction::Stop | ScheduledAction::Reclaimable) | None => {}
        }
    }
    if !opening && !acted {
        return Ok(()); // nothing due on a host already in maintenance
    }
    crate::store::hosts::bump_revision(&txn, h.id).await?;
    txn.commit().await?;
    if opening {
        tracing::info!(host = %h.name, "maintenance window opened");
    }
    st.capacity.refresh_host(&st.db, h.id).await?;
    wake.sort();
    wake.dedup();
    for w in wake {
        st.signals.notify(w);
    }
    clusters_touched.sort();
    clusters_touched.dedup();
    for c in clusters_touched {
        crate::app::cluster_repair::place_now(st, c).await?;
    }
    for id in singles {
        let rows: Vec<vms::Model> = vms::Entity::find_by_id(id).all(&st.db).await?;
        crate::app::admission::admit_pending(st, None, &rows).await?;
    }
    Ok(())
}

/// A shelved VM that was evacuating: placed on another host with its
/// disks (the pending VMs' pass places it), or, when its disks cannot
/// move, left shelved with why. In the agent report's transaction.
pub async fn shelved(
    txn: &sea_orm::DatabaseTransaction,
    vm: &vms::Model,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let mut a: vms::ActiveModel = vm.clone().into();
    a.evacuating = Set(None);
    match crate::app::vms::check_movable(txn, vm).await {
        Ok(()) => {
            // With the power it had: a stopped VM moves and stays stopped.
            let power = vm
                .evacuating
                .as_deref()
                .and_then(Power::from_text)
                .unwrap_or(Power::Running);
            a.desired_power = Set(power.to_text().to_owned());
            a.state = Set(VmState::Pending.as_str().to_owned());
            a.unshelve_anywhere = Set(true);
            a.reason = Set(Some(
                "moving to another host (its disks then move there)".to_owned(),
            ));
            event(
                txn,
                vm,
                now,
                "evacuating",
                "shelved; placed on another host next",
            )
            .await?;
        }
        Err(e) => {
            a.reason = Set(Some(format!(
                "not moved: {e}; unshelve it when the host is back"
            )));
            event(txn, vm, now, "evacuation-failed", e.to_string()).await?;
        }
    }
    a.update(txn).await?;
    Ok(())
}
