//! Guaranteed shares at work: which VMs are borrowed (kept true, level-
//! triggered, by the reaper's pass and by every admission), whose borrowed
//! VMs a request within its share may reclaim, and the promise checked
//! against the GPUs in service.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kumo_scheduler::reclaim::Lenders;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, TransactionTrait,
};
use uuid::Uuid;

use crate::context::AppState;
use crate::domain::guarantees::{self as rules, Overpromised};
use crate::entity::vms;
use crate::error::ApiError;
use crate::store::guarantees as rows;
use crate::store::vms::{event, stored_state};

/// A VM whose mark is wrong, and what it should be.
struct Remark {
    vm: vms::Model,
    borrowed: bool,
}

/// The marks that differ from what `guarantees` say, of one tenant's VMs
/// or everyone's. Nothing when nobody is promised anything and nothing is
/// marked (the common case: one more cheap read).
async fn wrong_marks(
    db: &impl ConnectionTrait,
    guarantees: &rules::Guarantees,
    tenant: Option<Uuid>,
) -> Result<Vec<Remark>, ApiError> {
    if guarantees.is_empty() && !rows::any_borrowed(db).await? {
        return Ok(Vec::new());
    }
    let held = rows::held(db, tenant).await?;
    let holdings: Vec<rules::Holding> = held.iter().map(|(h, _)| h.clone()).collect();
    let borrowed = rules::borrowed(&holdings, guarantees);
    Ok(held
        .into_iter()
        .filter_map(|(h, vm)| {
            // A reservation's VM runs on hosts held for it: never taken
            // for anyone else's share.
            let want = borrowed.contains(&h.vm) && vm.reservation_id.is_none();
            (want != vm.borrowed_at.is_some()).then_some(Remark { vm, borrowed: want })
        })
        .collect())
}

/// Puts the marks of one tenant's VMs (or everyone's) right in `txn`:
/// each change is an event, moves the VM's GPUs to the other rate while it
/// runs, and tells its host (the guest's `/run/kumo/events`). Returns the
/// hosts to wake after the commit.
pub async fn remark(
    txn: &DatabaseTransaction,
    tenant: Option<Uuid>,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let mut hosts = Vec::new();
    let guarantees = rows::all(txn).await?;
    for Remark { vm, borrowed } in wrong_marks(txn, &guarantees, tenant).await? {
        let at = borrowed.then_some(now);
        vms::Entity::update_many()
            .col_expr(vms::Column::BorrowedAt, Expr::value(at))
            .filter(vms::Column::Id.eq(vm.id))
            .exec(txn)
            .await?;
        let model = crate::store::vms::stored_spec(&vm)?
            .gpu_model
            .unwrap_or_default();
        let (kind, message) = if borrowed {
            (
                "borrowed",
                format!("above its project's guaranteed share of {model}: it may be reclaimed, with notice, for a project within its own share"),
            )
        } else {
            (
                "within-share",
                format!("within its project's guaranteed share of {model} again"),
            )
        };
        event(txn, &vm, now, kind, message).await?;
        if crate::app::metering::billable(stored_state(&vm)?) {
            crate::app::metering::borrowing_changed(txn, &vm, borrowed, now).await?;
        }
        if let Some(h) = vm.host_id {
            crate::store::hosts::bump_revision(txn, h).await?;
            hosts.push(h);
        }
    }
    hosts.sort_unstable();
    hosts.dedup();
    Ok(hosts)
}

/// The reaper's pass: the promise checked against the GPUs in service
/// (a metric per model, and a warning when it breaks), every VM's mark
/// put right (read first, so a quiet pass takes no write transaction),
/// and the index told.
pub async fn pass(st: &AppState) -> Result<usize, ApiError> {
    let guarantees = rows::all(&st.reads).await?;
    let promised = rows::promised(&guarantees);
    let over = rules::overpromised(&promised, &in_service(st));
    let broken: Vec<String> = over.iter().map(|o| o.model.clone()).collect();
    {
        let mut last = st.overpromised.lock().unwrap_or_else(|e| e.into_inner());
        if *last != broken {
            for o in &over {
                tracing::warn!(model = %o.model, promised = o.promised, in_service = o.in_service,
                    "GPUs guaranteed beyond those in service: lower guarantees or bring hosts back");
            }
            *last = broken;
        }
    }
    st.metrics.set_overpromised(promised.keys().map(|m| {
        let n = over
            .iter()
            .find(|o| &o.model == m)
            .map_or(0, |o| o.promised - o.in_service);
        (m.clone(), n)
    }));
    if wrong_marks(&st.reads, &guarantees, None).await?.is_empty() {
        return Ok(0);
    }
    let txn = st.db.begin().await?;
    let hosts = remark(&txn, None, st.config.clock.now()).await?;
    txn.commit().await?;
    for h in &hosts {
        st.capacity.refresh_host(&st.db, *h).await?;
        st.signals.notify(*h);
    }
    Ok(hosts.len())
}

/// Whose borrowed VMs a request of `tenant` for `gpus` GPUs may reclaim,
/// and the model they are of: the one it names, or else the tenant's only
/// guaranteed model. None unless the request stays within the tenant's
/// guarantee of that model and someone runs above theirs.
pub async fn lenders(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    named: Option<&str>,
    gpus: u64,
) -> Result<Option<(String, Lenders)>, ApiError> {
    let guarantees = rows::all(db).await?;
    let Some(mine) = guarantees.get(&tenant) else {
        return Ok(None);
    };
    let model = match named {
        Some(m) => m.to_owned(),
        None => match mine.keys().collect::<Vec<_>>().as_slice() {
            [only] => (*only).clone(),
            _ => return Ok(None),
        },
    };
    let held: Vec<rules::Holding> = rows::held(db, None)
        .await?
        .into_iter()
        .map(|(h, _)| h)
        .collect();
    if !rules::within(&held, &guarantees, tenant, &model, gpus) {
        return Ok(None);
    }
    let mut above = rules::above(&held, &guarantees, &model);
    above.remove(&tenant);
    Ok((!above.is_empty()).then_some((model, Lenders { above })))
}

/// GPUs per model on hosts in service (not unavailable), less those out
/// of service.
pub fn in_service(st: &AppState) -> BTreeMap<String, u64> {
    st.capacity.lock().gpus_in_service()
}

/// The models whose guarantees together exceed their GPUs in service
/// (hosts lost, retired or in repair since they were promised).
pub async fn overpromised(st: &AppState) -> Result<Vec<Overpromised>, ApiError> {
    let promised = rows::promised(&rows::all(&st.reads).await?);
    Ok(rules::overpromised(&promised, &in_service(st)))
}

/// A quota's new guarantees keep the platform's promise: with them, no
/// model is promised beyond its GPUs in service (a model already
/// overpromised may still have its guarantees lowered).
pub async fn check_promise(
    st: &AppState,
    txn: &DatabaseTransaction,
    tenant: Uuid,
    new: &BTreeMap<String, u32>,
) -> Result<(), ApiError> {
    let mut all = rows::all(txn).await?;
    let old = all.remove(&tenant).unwrap_or_default();
    let others = rows::promised(&all);
    let have = in_service(st);
    for (model, n) in new {
        let n = u64::from(*n);
        if n <= old.get(model).copied().unwrap_or(0) {
            continue; // not raised
        }
        let promised = others.get(model).copied().unwrap_or(0) + n;
        let in_service = have.get(model).copied().unwrap_or(0);
        if promised > in_service {
            return Err(ApiError::Conflict(format!(
                "guaranteeing {n} {model} GPUs would promise {promised} of them, and {in_service} are in service"
            )));
        }
    }
    Ok(())
}

/// Every promised model's standing (platform admins).
pub async fn standing(
    st: &AppState,
    actor: &crate::context::Actor,
) -> Result<Vec<kumo_api_types::GuaranteeStanding>, ApiError> {
    crate::app::access::require_admin(&actor.caller, "reading the fleet's guarantees")?;
    let all = rows::all(&st.reads).await?;
    let names: std::collections::HashMap<Uuid, String> = crate::entity::tenants::Entity::find()
        .filter(crate::entity::tenants::Column::Id.is_in(all.keys().copied()))
        .all(&st.reads)
        .await?
        .into_iter()
        .map(|t| (t.id, t.name))
        .collect();
    let have = in_service(st);
    let mut out: BTreeMap<String, kumo_api_types::GuaranteeStanding> = BTreeMap::new();
    for (tenant, per) in &all {
        for (model, n) in per {
            let s = out
                .entry(model.clone())
                .or_insert_with(|| kumo_api_types::GuaranteeStanding {
                    model: model.clone(),
                    promised: 0,
                    in_service: have.get(model).copied().unwrap_or(0),
                    tenants: BTreeMap::new(),
                });
            s.promised += n;
            let name = names
                .get(tenant)
                .cloned()
                .unwrap_or_else(|| tenant.to_string());
            s.tenants
                .insert(name, u32::try_from(*n).unwrap_or(u32::MAX));
        }
    }
    Ok(out.into_values().collect())
}
