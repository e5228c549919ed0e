//! Reservations: GPUs of one model held for a tenant over a window.
//!
//! A reservation holds whole hosts of its model from shortly before its
//! start ([`lead`]): nothing outside it may start there, and the spot and
//! borrowed VMs there get notice, so that the room is free at the start.
//! From the start its tenant's VMs and clusters that name it are placed
//! there (and only there), and it is charged for the GPUs it holds at the
//! `reserved_gpu:<model>` rate; at its end (or when deleted) the hosts are
//! let go, the charge closes and its VMs go on as ordinary guaranteed VMs
//! or stop, per its end policy.
//!
//! The reaper's pass ([`pass`]) keeps all of this true, level-triggered,
//! on every replica: each state change is conditional on the state read,
//! the hosts a reservation holds change only with its revision, and a
//! host is held by one reservation at a time (its row's key).

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use kumo_api_types::{
    EndPolicy, Page, PageParams, Reservation, ReservationCreate, ReservationState, Role,
    ServiceLevel, VmSpec,
};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait,
    PaginatorTrait, QueryFilter, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::{tenant_access, Access};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::Action;
use crate::domain::paging::Paging;
use crate::domain::reservations::{self as rules, Window};
use crate::entity::{reservation_hosts, reservations, tenants, vms};
use crate::error::{is_unique_violation, ApiError};
use crate::store::reservations as store;
use crate::store::vms::{event, stored_spec};

/// How long before its start a reservation holds its hosts: long enough
/// for the longest notice a VM there may have had.
pub fn lead(st: &AppState) -> Duration {
    let notice = st.config.max_notice.max(st.config.preemption_grace);
    Duration::from_std(notice).unwrap_or_else(|_| Duration::hours(1)) + Duration::minutes(1)
}

fn window(r: &reservations::Model) -> Window {
    Window {
        starts_at: r.starts_at,
        ends_at: r.ends_at,
        gpus: u64::try_from(r.gpus).unwrap_or(0),
    }
}

/// Make a reservation: platform admins for any tenant, a tenant's owners
/// within its guaranteed share of the model. Never more than the model's
/// GPUs in service at any moment of the window, counting every other
/// reservation.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &ReservationCreate,
) -> Result<Reservation, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "reserving capacity")?;
    crate::domain::names::tenant_name("name", &body.name)?;
    rules::check_gpus(body.gpus)?;
    let now = st.config.clock.now();
    rules::check_window(body.starts_at, body.ends_at, now)?;
    let (in_service, per_host) = {
        let index = st.capacity.lock();
        let in_service = index
            .gpus_in_service()
            .get(&body.gpu_model)
            .copied()
            .unwrap_or(0);
        let per_host = index.model_id(&body.gpu_model).and_then(|m| {
            index
                .hosts
                .iter()
                .flat_map(|h| h.profile.model_masks.iter())
                .filter(|(x, _)| *x == m)
                .map(|(_, mask)| mask.count_ones())
                .max()
        });
        (in_service, per_host.unwrap_or(0))
    };
    if in_service == 0 || per_host == 0 {
        return Err(ApiError::field(
            "gpu_model",
            format!("no host in service has {} GPUs", body.gpu_model),
        ));
    }
    // Whole hosts are held: what is reserved (and charged) is what is
    // taken from everyone else.
    if body.gpus % per_host != 0 {
        return Err(ApiError::field(
            "gpus",
            format!(
                "a reservation holds whole hosts: a multiple of {per_host} ({} hosts have {per_host})",
                body.gpu_model
            ),
        ));
    }
    crate::app::churn::take(st, &tenant, "reserving capacity")?;
    let asked = Window {
        starts_at: body.starts_at,
        ends_at: body.ends_at,
        gpus: u64::from(body.gpus),
    };
    let txn = st.db.begin().await?;
    // One reservation of the tenant at a time is weighed against its
    // others (SQLite's one writer serialises the rest).
    crate::store::tenancy::lock_for_quota(&txn, tenant.id).await?;
    let live = store::live(&txn, None).await?;
    let same_model = |r: &&reservations::Model| r.gpu_model == body.gpu_model;
    let mine: Vec<Window> = live
        .iter()
        .filter(|r| r.tenant_id == tenant.id)
        .filter(same_model)
        .map(window)
        .collect();
    let kept = reservations::Entity::find()
        .filter(reservations::Column::TenantId.eq(tenant.id))
        .count(&txn)
        .await?;
    if kept >= rules::MAX_KEPT as u64 {
        return Err(ApiError::QuotaExceeded {
            resource: "reservations".into(),
            detail: format!(
                "tenant {:?} keeps {kept} reservations, ended ones included: delete ended ones first",
                tenant.name
            ),
        });
    }
    if live.iter().filter(|r| r.tenant_id == tenant.id).count() >= rules::MAX_PER_TENANT {
        return Err(ApiError::QuotaExceeded {
            resource: "reservations".into(),
            detail: format!(
                "tenant {:?} holds {} reservations, the most allowed: delete one that has ended or is no longer needed",
                tenant.name,
                rules::MAX_PER_TENANT
            ),
        });
    }
    if access != Access::Admin {
        let share = crate::store::guarantees::all(&txn)
            .await?
            .get(&tenant.id)
            .and_then(|g| g.get(&body.gpu_model).copied())
            .unwrap_or(0);
        let peak = rules::peak_during(&asked, &mine);
        if peak + asked.gpus > share {
            return Err(ApiError::QuotaExceeded {
                resource: format!("guarantee.{}", body.gpu_model),
                detail: format!(
                    "owners reserve within their project's guaranteed share: {share} {} GPUs, {peak} of them reserved already in that window (a platform administrator may reserve more)",
                    body.gpu_model
                ),
            });
        }
    }
    let all: Vec<Window> = live.iter().filter(same_model).map(window).collect();
    let peak = rules::peak_during(&asked, &all);
    if peak + asked.gpus > in_service {
        return Err(ApiError::InsufficientCapacity(format!(
            "{} {} GPUs are in service and {peak} are reserved at some moment of that window: {} more cannot be promised",
            in_service, body.gpu_model, body.gpus
        )));
    }
    let class = kumo_billing::rates::reserved_gpu_class(&body.gpu_model);
    crate::app::budget::check_held(&txn, &tenant, &class, now).await?;
    let row = reservations::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        name: Set(body.name.clone()),
        gpu_model: Set(body.gpu_model.clone()),
        gpus: Set(i64::from(body.gpus)),
        starts_at: Set(body.starts_at),
        ends_at: Set(body.ends_at),
        end_policy: Set(body.end_policy.as_str().to_owned()),
        state: Set(ReservationState::Scheduled.as_str().to_owned()),
        revision: Set(0),
        held_gpus: Set(0),
        short: Set(None),
        created_at: Set(now),
        ended_at: Set(None),
    };
    let row = match row.insert(&txn).await {
        Ok(r) => r,
        Err(e) if is_unique_violation(&e) => {
            return Err(ApiError::Conflict(format!(
            "tenant {:?} already has a reservation named {:?} (delete it first if it has ended)",
            tenant.name, body.name
        )))
        }
        Err(e) => return Err(e.into()),
    };
    audit::record(&txn, actor, "reservation.create", Some(&tenant), &body.name).await?;
    txn.commit().await?;
    view(&st.db, &row, &tenant.name).await
}

pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Reservation>, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::page(&st.reads, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |r| r.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        items.push(view(&st.reads, r, &tenant.name).await?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

pub async fn show(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    reservation: &str,
) -> Result<Reservation, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let r = store::find(&st.reads, &tenant, reservation).await?;
    view(&st.reads, &r, &tenant.name).await
}

/// Delete a reservation (owners; admins): one not ended is cancelled (it
/// ends now, per its end policy), an ended one is forgotten.
pub async fn delete(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    reservation: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "cancelling a reservation")?;
    let now = st.config.clock.now();
    // A pass may move it meanwhile (preparing → active): read again and
    // end what it is now.
    for _ in 0..3 {
        let r = store::find(&st.db, &tenant, reservation).await?;
        if store::stored_state(&r)? == ReservationState::Ended {
            return forget(st, actor, &tenant, &r).await;
        }
        if let Some(hosts) = end(st, &r, now, "cancelled").await? {
            audit::record(&st.db, actor, "reservation.cancel", Some(&tenant), &r.name).await?;
            return refresh(st, &hosts).await;
        }
    }
    Err(ApiError::Conflict(format!(
        "reservation {reservation:?} kept changing while being cancelled: try again"
    )))
}

/// An ended reservation's row removed (its name is free again).
async fn forget(
    st: &AppState,
    actor: &Actor,
    tenant: &tenants::Model,
    r: &reservations::Model,
) -> Result<(), ApiError> {
    {
        let gone = reservations::Entity::delete_many()
            .filter(reservations::Column::Id.eq(r.id))
            .filter(reservations::Column::State.eq(ReservationState::Ended.as_str()))
            .exec(&st.db)
            .await?;
        if gone.rows_affected == 1 {
            audit::record(&st.db, actor, "reservation.delete", Some(tenant), &r.name).await?;
        }
        Ok(())
    }
}

async fn view(
    db: &impl ConnectionTrait,
    r: &reservations::Model,
    tenant: &str,
) -> Result<Reservation, ApiError> {
    let state = store::stored_state(r)?;
    Ok(Reservation {
        id: r.id,
        name: r.name.clone(),
        tenant: tenant.to_owned(),
        gpus: u32::try_from(r.gpus).unwrap_or(0),
        gpu_model: r.gpu_model.clone(),
        starts_at: r.starts_at,
        ends_at: r.ends_at,
        end_policy: store::stored_policy(r)?,
        state,
        held_gpus: u32::try_from(r.held_gpus).unwrap_or(0),
        used_gpus: u32::try_from(store::used_gpus(db, r.id).await?).unwrap_or(u32::MAX),
        short: r.short.clone(),
        created_at: r.created_at,
        ended_at: r.ended_at,
    })
}

/// Points a new VM's spec at the tenant's reservation `name`: active now,
/// for guaranteed GPU VMs of its model, not queued.
pub async fn assign(
    st: &AppState,
    tenant: &tenants::Model,
    name: &str,
    spec: &mut VmSpec,
    queue: bool,
) -> Result<(), ApiError> {
    let r = store::find(&st.db, tenant, name).await.map_err(|_| {
        ApiError::field(
            "reservation",
            format!("tenant {:?} has no reservation {name:?}", tenant.name),
        )
    })?;
    let state = store::stored_state(&r)?;
    if state != ReservationState::Active {
        return Err(ApiError::Conflict(format!(
            "reservation {name:?} is {} (it holds capacity from {} to {})",
            state.as_str(),
            r.starts_at.to_rfc3339(),
            r.ends_at.to_rfc3339()
        )));
    }
    if spec.service_level != ServiceLevel::Guaranteed {
        return Err(ApiError::field(
            "service_level",
            "a reservation's VMs are guaranteed (its capacity is the project's own)",
        ));
    }
    if queue {
        return Err(ApiError::field(
            "queue",
            "a reservation's VMs do not queue: its hosts are the project's own",
        ));
    }
    if spec.gpus == 0 {
        return Err(ApiError::field(
            "gpus",
            "a reservation holds GPUs: ask for some",
        ));
    }
    match &spec.gpu_model {
        Some(m) if *m != r.gpu_model => {
            return Err(ApiError::field(
                "gpu_model",
                format!("reservation {name:?} holds {} GPUs", r.gpu_model),
            ))
        }
        _ => spec.gpu_model = Some(r.gpu_model.clone()),
    }
    spec.reservation = Some(r.id);
    Ok(())
}

/// In an admission's transaction: the reservation `id` is still active
/// and its VMs with `adding` stay within its GPUs.
pub async fn check_room(txn: &DatabaseTransaction, id: Uuid, adding: u64) -> Result<(), ApiError> {
    // Locked (PostgreSQL) against its end: a VM committed on it is one
    // the end sees and releases, or the end comes first and this fails.
    let Some(r) = reservations::Entity::find_by_id(id)
        .lock_exclusive()
        .one(txn)
        .await?
    else {
        return Err(ApiError::Conflict("the reservation was deleted".into()));
    };
    if store::stored_state(&r)? != ReservationState::Active {
        return Err(ApiError::Conflict(format!(
            "reservation {:?} is no longer active",
            r.name
        )));
    }
    let used = store::used_gpus(txn, id).await?;
    let gpus = u64::try_from(r.gpus).unwrap_or(0);
    if used + adding > gpus {
        return Err(ApiError::Conflict(format!(
            "reservation {:?} holds {gpus} GPUs and its VMs take {used}: {adding} more do not fit",
            r.name
        )));
    }
    Ok(())
}

/// The reaper's pass over every reservation not ended, each on its own
/// (one's failure is logged and the others go on), then the index told
/// which hosts are held.
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    let live = store::live(&st.reads, None).await?;
    if live.is_empty() {
        if !st.capacity.lock().reserved().is_empty() {
            st.capacity.lock().set_reserved(Default::default());
        }
        return Ok(());
    }
    let now = st.config.clock.now();
    let lead = lead(st);
    for r in &live {
        if let Err(e) = step(st, r, now, lead).await {
            tracing::warn!(reservation = %r.id, error = %e, "reservation pass failed; retrying");
        }
    }
    let held = store::held_hosts(&st.db).await?;
    let mut index = st.capacity.lock();
    if *index.reserved() != held {
        index.set_reserved(held);
    }
    Ok(())
}

/// One reservation moved one step towards where it should stand at `now`.
async fn step(
    st: &AppState,
    r: &reservations::Model,
    now: DateTime<Utc>,
    lead: Duration,
) -> Result<(), ApiError> {
    let want = rules::state_at(r.starts_at, r.ends_at, lead, now);
    if want == ReservationState::Ended {
        let hosts = end(st, r, r.ends_at, "ended").await?.unwrap_or_default();
        return refresh(st, &hosts).await;
    }
    if want == ReservationState::Scheduled {
        return Ok(());
    }
    keep_hosts(st, r, now).await?;
    // Only forwards: a replica whose clock lags must not take an active
    // reservation back (and open its charge twice).
    if rules::rank(want) <= rules::rank(store::stored_state(r)?) {
        return Ok(());
    }
    let txn = st.db.begin().await?;
    let moved = reservations::Entity::update_many()
        .col_expr(reservations::Column::State, Expr::value(want.as_str()))
        .filter(reservations::Column::Id.eq(r.id))
        .filter(reservations::Column::State.eq(r.state.clone()))
        .exec(&txn)
        .await?;
    if moved.rows_affected != 1 {
        return Ok(());
    }
    if want == ReservationState::Active {
        let tenant = tenants::Entity::find_by_id(r.tenant_id)
            .one(&txn)
            .await?
            .ok_or_else(|| ApiError::Internal(format!("reservation {} has no tenant", r.id)))?;
        // Charged from its start, whenever the pass saw it.
        crate::app::metering::reservation_held(&txn, &tenant, r, r.starts_at).await?;
    }
    txn.commit().await?;
    tracing::info!(reservation = %r.id, name = %r.name, state = want.as_str(), "reservation moved");
    Ok(())
}

/// Holds enough whole hosts for the reservation (keeping those held),
/// records what they give it, and gives notice to the spot and borrowed
/// VMs on them.
async fn keep_hosts(
    st: &AppState,
    r: &reservations::Model,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let gpus = u32::try_from(r.gpus).unwrap_or(0);
    let held = store::hosts_of(&st.db, r.id).await?;
    let mine: BTreeSet<Uuid> = store::vms_of(&st.db, r.id)
        .await?
        .iter()
        .map(|v| v.id)
        .collect();
    let holding = {
        let index = st.capacity.lock();
        match index.model_id(&r.gpu_model) {
            Some(m) => kumo_scheduler::reservations::hold(&index, r.id, m, gpus, &held, &mine),
            None => kumo_scheduler::reservations::Holding {
                dropped: held.clone(),
                ..Default::default()
            },
        }
    };
    let added: Vec<Uuid> = holding
        .hosts
        .iter()
        .filter(|h| !held.contains(h))
        .copied()
        .collect();
    let short = (holding.usable < gpus).then(|| {
        format!(
            "holds {} of {gpus} GPUs: the other {} hosts run guaranteed VMs, are held by other reservations or are out of service",
            holding.usable, r.gpu_model
        )
    });
    let usable = i64::from(holding.usable);
    if !added.is_empty() || !holding.dropped.is_empty() || r.held_gpus != usable || r.short != short
    {
        let txn = st.db.begin().await?;
        // Over the revision read: another replica's pass changes the
        // hosts once.
        let claimed = reservations::Entity::update_many()
            .col_expr(reservations::Column::Revision, Expr::value(r.revision + 1))
            .col_expr(reservations::Column::HeldGpus, Expr::value(usable))
            .col_expr(reservations::Column::Short, Expr::value(short.clone()))
            .filter(reservations::Column::Id.eq(r.id))
            .filter(reservations::Column::Revision.eq(r.revision))
            .filter(reservations::Column::State.ne(ReservationState::Ended.as_str()))
            .exec(&txn)
            .await?;
        if claimed.rows_affected != 1 {
            return Ok(());
        }
        if !holding.dropped.is_empty() {
            reservation_hosts::Entity::delete_many()
                .filter(reservation_hosts::Column::ReservationId.eq(r.id))
                .filter(reservation_hosts::Column::HostId.is_in(holding.dropped.iter().copied()))
                .exec(&txn)
                .await?;
            for h in &holding.dropped {
                crate::store::hosts::bump_revision(&txn, *h).await?;
            }
        }
        for h in &added {
            let row = reservation_hosts::ActiveModel {
                host_id: Set(*h),
                reservation_id: Set(r.id),
            };
            match row.insert(&txn).await {
                Ok(_) => {}
                // Another reservation took it meanwhile: the next pass
                // chooses again.
                Err(e) if is_unique_violation(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            // A placement made on it from an older reading loses its
            // commit.
            crate::store::hosts::bump_revision(&txn, *h).await?;
        }
        txn.commit().await?;
        {
            let mut index = st.capacity.lock();
            let mut map = index.reserved().clone();
            map.retain(|h, _| !holding.dropped.contains(h));
            map.extend(added.iter().map(|h| (*h, r.id)));
            index.set_reserved(map);
        }
        refresh(st, &added).await?;
        refresh(st, &holding.dropped).await?;
    }
    if !holding.victims.is_empty() {
        let txn = st.db.begin().await?;
        // Not if it ended meanwhile (cancelled on another replica).
        let still = reservations::Entity::find_by_id(r.id)
            .lock_exclusive()
            .one(&txn)
            .await?
            .is_some_and(|x| x.state != ReservationState::Ended.as_str());
        if !still {
            return Ok(());
        }
        let why = format!(
            "its host is held for a reservation from {}",
            r.starts_at.to_rfc3339()
        );
        let hosts = crate::app::admission::preempt(
            &txn,
            &holding.victims,
            st.config.preemption_grace,
            &why,
            now,
        )
        .await?;
        txn.commit().await?;
        refresh(st, &hosts).await?;
    }
    Ok(())
}

/// Ends a reservation at `at` (`why`: "ended" or "cancelled"): its hosts
/// let go, its charge closed, its VMs ordinary again or stopped. One
/// cancelled while its hosts were held before its start pays for that
/// time. Returns the hosts touched; `None` when its state moved since it
/// was read (another replica ended or advanced it).
async fn end(
    st: &AppState,
    r: &reservations::Model,
    at: DateTime<Utc>,
    why: &str,
) -> Result<Option<Vec<Uuid>>, ApiError> {
    let policy = store::stored_policy(r)?;
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let moved = reservations::Entity::update_many()
        .col_expr(
            reservations::Column::State,
            Expr::value(ReservationState::Ended.as_str()),
        )
        .col_expr(reservations::Column::EndedAt, Expr::value(Some(at)))
        .col_expr(reservations::Column::HeldGpus, Expr::value(0i64))
        .col_expr(reservations::Column::Short, Expr::value(None::<String>))
        // A pass that read it before must not hold hosts for it after.
        .col_expr(
            reservations::Column::Revision,
            Expr::col(reservations::Column::Revision).add(1),
        )
        .filter(reservations::Column::Id.eq(r.id))
        .filter(reservations::Column::State.eq(r.state.clone()))
        .exec(&txn)
        .await?;
    if moved.rows_affected != 1 {
        return Ok(None);
    }
    if store::stored_state(r)? == ReservationState::Preparing {
        // Held, not yet started: charged from when its hosts were held.
        let tenant = tenants::Entity::find_by_id(r.tenant_id)
            .one(&txn)
            .await?
            .ok_or_else(|| ApiError::Internal(format!("reservation {} has no tenant", r.id)))?;
        let held_from = (r.starts_at - lead(st)).max(r.created_at).min(at);
        crate::app::metering::reservation_held(&txn, &tenant, r, held_from).await?;
    }
    let hosts = store::hosts_of(&txn, r.id).await?;
    reservation_hosts::Entity::delete_many()
        .filter(reservation_hosts::Column::ReservationId.eq(r.id))
        .exec(&txn)
        .await?;
    for h in &hosts {
        crate::store::hosts::bump_revision(&txn, *h).await?;
    }
    crate::app::metering::reservation_released(&txn, r.id, at).await?;
    let mut touched = hosts.clone();
    for vm in store::vms_of(&txn, r.id).await? {
        let vm = release(&txn, vm, &r.name, why, now).await?;
        if policy == EndPolicy::Stop {
            let reason = format!("reservation {:?} {why}", r.name);
            match crate::app::vms::apply_action(&txn, &vm, Action::Stop, &reason, now).await {
                // Not running: nothing to stop.
                Ok(_) | Err(ApiError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        touched.extend(vm.host_id);
    }
    txn.commit().await?;
    {
        let mut index = st.capacity.lock();
        let mut map = index.reserved().clone();
        map.retain(|_, x| *x != r.id);
        index.set_reserved(map);
    }
    touched.sort_unstable();
    touched.dedup();
    tracing::info!(reservation = %r.id, name = %r.name, why, "reservation ended");
    Ok(Some(touched))
}

/// A VM of an ended reservation, ordinary again: its spec and row name no
/// reservation (its share's marks follow on the next pass).
async fn release(
    txn: &DatabaseTransaction,
    vm: vms::Model,
    name: &str,
    why: &str,
    now: DateTime<Utc>,
) -> Result<vms::Model, ApiError> {
    let mut spec = stored_spec(&vm)?;
    spec.reservation = None;
    let text = serde_json::to_string(&spec).map_err(|e| ApiError::Internal(e.to_string()))?;
    vms::Entity::update_many()
        .col_expr(vms::Column::Spec, Expr::value(text.clone()))
        .col_expr(vms::Column::ReservationId, Expr::value(None::<Uuid>))
        .col_expr(vms::Column::UpdatedAt, Expr::value(now))
        .filter(vms::Column::Id.eq(vm.id))
        .exec(txn)
        .await?;
    event(
        txn,
        &vm,
        now,
        "reservation-ended",
        format!("reservation {name:?} {why}: an ordinary guaranteed VM from now on"),
    )
    .await?;
    Ok(vms::Model {
        spec: text,
        reservation_id: None,
        ..vm
    })
}

/// The index re-reads `hosts` and their agents are told.
async fn refresh(st: &AppState, hosts: &[Uuid]) -> Result<(), ApiError> {
    for h in hosts {
        st.capacity.refresh_host(&st.db, *h).await?;
        st.signals.notify(*h);
    }
    Ok(())
}
