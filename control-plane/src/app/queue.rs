//! The fair queue (issue 42): requests made with `queue` wait as `queued`
//! when there is no room, instead of being refused. Each pass of the
//! reaper (every replica, level-triggered, once a second):
//!
//! - drops requests past their expiry (deleted, saying why);
//! - orders the rest fairly ([`crate::domain::queue::fair_order`]: the
//!   project furthest below its guaranteed share first, first come first
//!   served within a project) and plans when each would start if every VM
//!   ran the assumed run time ([`crate::domain::queue::plan`], conservative
//!   backfill);
//! - admits, in that order, what fits now: the first in line anywhere,
//!   the rest only off the room the first in line's plan holds for it — so
//!   a request further back backfills only where it does not delay the
//!   head (EASY backfill); a cluster is admitted whole or not at all;
//! - writes each request's position, reason and estimate, and tells new
//!   requests which hosts the queue is waiting for (they keep off them).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeZone, Utc};
use kumo_api_types::VmState;
use kumo_scheduler::HostUse;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
use uuid::Uuid;

use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::domain::queue::{fair_order, plan, Host, Plan, Standing, Waiting, PLANNED};
use crate::entity::{vm_queue, vms};
use crate::error::ApiError;
use crate::store::vms::{stored_spec, stored_state};

/// One queued request: a VM, or a cluster's members together.
struct Request {
    cluster: Option<Uuid>,
    rows: Vec<vms::Model>,
    waiting: Waiting,
    expires_at: DateTime<Utc>,
    /// Its standing as the last pass wrote it.
    standing: vm_queue::Model,
}

/// One pass: expire, order, admit what may start, write the standings.
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    run(st, true).await
}

/// The standings written anew without admitting anything (a request just
/// queued answers with its place).
pub async fn order(st: &AppState) -> Result<(), ApiError> {
    run(st, false).await
}

async fn run(st: &AppState, admit: bool) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let mut requests = queued(st).await?;
    if requests.is_empty() {
        st.capacity.hold_for_queue(Vec::new());
        return Ok(());
    }
    if admit {
        let (expired, left): (Vec<Request>, Vec<Request>) =
            requests.into_iter().partition(|r| r.expires_at <= now);
        for r in expired {
            expire(st, &r).await?;
        }
        requests = left;
    }
    let waiting: Vec<Waiting> = requests.iter().map(|r| r.waiting.clone()).collect();
    let order = fair_order(&waiting, &standings(st).await?);
    let runtime = i64::try_from(st.config.queue.assumed_runtime.as_secs()).unwrap_or(86_400);
    let ordered: Vec<&Waiting> = order.iter().take(PLANNED).map(|i| &waiting[*i]).collect();
    let hosts = gpu_hosts(st, now.timestamp(), runtime);
    let mut plans = plan(&hosts, &ordered, now.timestamp(), runtime);
    // Those further back are not planned this pass: no estimate, no start.
    plans.resize(
        order.len(),
        Plan {
            start: None,
            hosts: Vec::new(),
        },
    );
    // The first request that can start at all holds the room its plan
    // names (its reservation); those behind it start whenever they fit
    // off that room, so none of them delays it (EASY backfill: a
    // reservation for every request made the fleet idle waiting for
    // estimates, since VMs have no end time and run shorter than assumed).
    let mut keep_off: Option<Vec<Uuid>> = None;
    let mut position = 0u32;
    for (n, (i, p)) in order.iter().zip(&plans).enumerate() {
        let r = &requests[*i];
        let off = keep_off.as_deref().unwrap_or_default();
        // Tried only where GPU counts say it fits now (an admission reads
        // and writes the database; most of the queue does not fit).
        if admit && n < PLANNED && fits_now(&hosts, off, &r.waiting, now.timestamp()) {
            // One request's failure is its own: the rest of the queue,
            // and the reaper's other work, go on.
            match crate::app::admission::admit_queued(st, r.cluster, &r.rows, off).await {
                Ok(true) => {
                    tracing::info!(vms = r.rows.len(), tenant = %r.waiting.tenant, "queued request admitted");
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, vm = %r.waiting.key, "admitting a queued request failed");
                }
            }
        }
        position += 1;
        let head = keep_off.is_none() && p.start.is_some();
        if head {
            keep_off = Some(p.hosts.clone());
        }
        let reason = reason(r, p, n, position, head, now.timestamp());
        let estimate = p.start.and_then(|t| Utc.timestamp_opt(t, 0).single());
        let was = &r.standing;
        let moved = i64::from(was.position) != i64::from(position)
            || was.reason != reason
            || was.estimate != estimate;
        if moved {
            let ids: Vec<Uuid> = r.rows.iter().map(|v| v.id).collect();
            crate::store::queue::set_standing(&st.db, &ids, position, &reason, estimate).await?;
        }
    }
    let mut keep_off = keep_off.unwrap_or_default();
    keep_off.sort();
    keep_off.dedup();
    st.capacity.hold_for_queue(keep_off);
    Ok(())
}

/// Whether GPU counts let `w` start now off `keep_off`: a host of its
/// model with the GPUs free for each member.
fn fits_now(hosts: &[Host], keep_off: &[Uuid], w: &Waiting, now: i64) -> bool {
    if w.gpus == 0 {
        return true;
    }
    let mut ids: Vec<Uuid> = hosts
        .iter()
        .filter(|h| !keep_off.contains(&h.id))
        .filter(|h| w.model.as_ref().is_none_or(|m| *m == h.model))
        .filter(|h| {
            let held: u32 = h
                .held
                .iter()
                .filter(|(_, end)| *end > now)
                .map(|(g, _)| g)
                .sum();
            h.gpus.saturating_sub(held) >= w.gpus
        })
        .map(|h| h.id)
        .collect();
    ids.dedup();
    ids.len() >= w.members as usize
}

/// Why a request waits, in a researcher's words (`n`: its place in fair
/// order before this pass's admissions).
fn reason(r: &Request, p: &Plan, n: usize, position: u32, head: bool, now: i64) -> String {
    let w = &r.waiting;
    let what = format!(
        "{}{} GPU(s){}",
        if w.members > 1 {
            format!("{} × ", w.members)
        } else {
            String::new()
        },
        w.gpus,
        w.model
            .as_deref()
            .map(|m| format!(" of {m}"))
            .unwrap_or_default()
    );
    match p.start {
        None if n >= PLANNED => format!(
            "{} request(s) ahead in fair order; planned once among the first {PLANNED}; needs {what}",
            position - 1
        ),
        None => format!("no host could take {what} even when empty: it will not start as asked"),
        Some(t) if head && t <= now => format!(
            "first in line: {what} fit by GPU count, but no host has room for its CPUs, memory, NICs or disk"
        ),
        Some(t) if head => format!(
            "first in line: the room it needs is held for it until {what} free (in about {})",
            in_words(t - now)
        ),
        Some(_) => format!(
            "{} request(s) ahead in fair order (the project furthest below its guaranteed share first); needs {what}, and starts sooner if that frees off the room held for the first in line",
            position - 1
        ),
    }
}

fn in_words(secs: i64) -> String {
    let up = |s: i64, unit: i64| (s + unit - 1) / unit;
    match secs.max(0) {
        s if s < 3600 => format!("{} min", up(s, 60).max(1)),
        s if s < 172_800 => format!("{} h", up(s, 3600)),
        s => format!("{} days", up(s, 86_400)),
    }
}

/// The queued requests, each VM's rows with its cluster's; rows whose VM
/// left the queue (deleted: cancelled) are dropped on the way.
async fn queued(st: &AppState) -> Result<Vec<Request>, ApiError> {
    let rows = crate::store::queue::all(&st.db).await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.vm_id).collect();
    let vms_by_id: HashMap<Uuid, vms::Model> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(ids))
        .all(&st.db)
        .await?
        .into_iter()
        .map(|v| (v.id, v))
        .collect();
    let mut gone = Vec::new();
    let mut groups: BTreeMap<Uuid, (vm_queue::Model, Vec<vms::Model>)> = BTreeMap::new();
    for r in rows {
        let Some(v) = vms_by_id.get(&r.vm_id) else {
            gone.push(r.vm_id);
            continue;
        };
        if stored_state(v)? != VmState::Queued {
            gone.push(r.vm_id);
            continue;
        }
        let key = r.cluster_id.unwrap_or(r.vm_id);
        groups
            .entry(key)
            .or_insert_with(|| (r.clone(), Vec::new()))
            .1
            .push(v.clone());
    }
    crate::store::queue::remove(&st.db, &gone).await?;
    let mut out = Vec::with_capacity(groups.len());
    for (key, (first, rows)) in groups {
        let Some(v) = rows.first() else {
            continue;
        };
        let spec = stored_spec(v)?;
        let one_unit = crate::store::clusters::keeps_to_one_unit(&st.db, first.cluster_id).await?;
        out.push(Request {
            cluster: first.cluster_id,
            waiting: Waiting {
                key,
                tenant: first.tenant_id,
                since: first.queued_at.timestamp(),
                model: spec.gpu_model.clone(),
                members: u32::try_from(rows.len()).unwrap_or(u32::MAX),
                gpus: spec.gpus,
                one_unit,
            },
            expires_at: first.expires_at,
            standing: first,
            rows,
        });
    }
    Ok(out)
}

/// Each project's guaranteed GPUs in use and its shares, per model.
async fn standings(st: &AppState) -> Result<Vec<Standing>, ApiError> {
    let guarantees = crate::store::guarantees::all(&st.db).await?;
    let mut used: BTreeMap<(Uuid, String), u64> = BTreeMap::new();
    for (h, _) in crate::store::guarantees::held(&st.db, None).await? {
        *used.entry((h.tenant, h.model)).or_default() += h.gpus;
    }
    for (tenant, per) in &guarantees {
        for model in per.keys() {
            used.entry((*tenant, model.clone())).or_default();
        }
    }
    Ok(used
        .into_iter()
        .map(|((tenant, model), used)| Standing {
            guarantee: guarantees
                .get(&tenant)
                .and_then(|g| g.get(&model))
                .copied()
                .unwrap_or(0),
            tenant,
            model,
            used,
        })
        .collect())
}

/// The ready hosts' GPUs per model, as the index holds them: each VM's
/// GPUs are expected back `runtime` after it started (a VM being reclaimed
/// gives them back now). Hosts reservations hold are no room for the
/// queue (it never names a reservation).
fn gpu_hosts(st: &AppState, now: i64, runtime: i64) -> Vec<Host> {
    let index = st.capacity.lock();
    let mut out = Vec::new();
    let ready =
        |h: &&kumo_scheduler::index::HostCap| h.state == HostUse::Ready && h.reserved_for.is_none();
    for h in index.hosts.iter().filter(ready) {
        for (m, mask) in &h.profile.model_masks {
            let Some(model) = index.model_name(*m) else {
                continue;
            };
            let held = h
                .holds
                .iter()
                .filter(|x| x.gpus & mask != 0)
                .map(|x| {
                    let end = if x.reclaiming {
                        now
                    } else {
                        (x.since + runtime).max(now)
                    };
                    ((x.gpus & mask).count_ones(), end)
                })
                .collect();
            out.push(Host {
                id: h.id,
                unit: h
                    .scalable_unit
                    .and_then(|u| index.unit_name(u))
                    .map(str::to_owned),
                model: model.to_owned(),
                gpus: (mask & !h.gpu_blocked).count_ones(),
                held,
            });
        }
    }
    out
}

/// A request past its expiry leaves the queue: its VMs are deleted (never
/// placed, nothing charged), saying why.
async fn expire(st: &AppState, r: &Request) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let by = format!(
        "the fair queue: unplaced after {} (queue.expire_after_seconds)",
        in_words(i64::try_from(st.config.queue.expire_after.as_secs()).unwrap_or(i64::MAX))
    );
    // Claimed first, over the state read: a pass on another replica that
    // expires (or admits) the same request meanwhile waits for this one
    // and then finds nothing to do, and a cancel committed before stands.
    let ids: Vec<Uuid> = r.rows.iter().map(|v| v.id).collect();
    let claimed = vms::Entity::update_many()
        .col_expr(vms::Column::UpdatedAt, Expr::value(now))
        .filter(vms::Column::Id.is_in(ids.iter().copied()))
        .filter(vms::Column::State.eq(VmState::Queued.as_str()))
        .exec(&txn)
        .await?;
    if claimed.rows_affected != ids.len() as u64 {
        return Ok(()); // rolled back: someone else moved it
    }
    for v in &r.rows {
        let Some(row) = vms::Entity::find_by_id(v.id).one(&txn).await? else {
            continue;
        };
        crate::store::vms::event(&txn, &row, now, "expired", by.clone()).await?;
        crate::app::vms::apply_action(&txn, &row, Action::Delete, &by, now).await?;
    }
    txn.commit().await?;
    Ok(())
}
