//! Volume use cases: a tenant's block volumes within its `volume_gib`
//! quota, each on one host's storage, attached to at most one VM on that
//! host. Rows are the desired state: the host's agent makes, grows,
//! attaches (hot-plugged into a running VM) and deletes what they say, and
//! reports back (`apply_status`).

use kumo_api_types::{
    HostState, Page, PageParams, Role, VmState, Volume, VolumeActual, VolumeAttach, VolumeCreate,
    VolumeMove, VolumeResize, VolumeSnapshot, VolumeSnapshotCreate, VolumeState, VolumeStatus,
};
use kumo_billing::rates::{SNAPSHOT_GIB, VOLUME_GIB};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{hosts, tenants, volume_snapshots, volumes};
use crate::error::{conflict_if_unique, ApiError};
use crate::store::hosts::bump_revision;
use crate::store::volumes as store;

/// The largest volume: 64 TiB.
pub const MAX_GIB: u32 = 65_536;

async fn view(
    db: &impl ConnectionTrait,
    v: &volumes::Model,
    tenant: &str,
) -> Result<Volume, ApiError> {
    let host = crate::store::hosts::by_id(db, v.host_id)
        .await?
        .map(|h| h.name);
    let moving_to = match v.move_to_host_id {
        Some(h) => crate::store::hosts::by_id(db, h).await?.map(|h| h.name),
        None => None,
    };
    let vm = match v.vm_id {
        Some(id) => crate::entity::vms::Entity::find_by_id(id)
            .one(db)
            .await?
            .map(|vm| vm.name),
        None => None,
    };
    Ok(Volume {
        id: v.id,
        name: v.name.clone(),
        tenant: tenant.to_owned(),
        size_gib: u32::try_from(v.size_gib).unwrap_or(u32::MAX),
        state: store::stored_state(v)?,
        reason: v.reason.clone(),
        host,
        vm,
        moving_to,
        serial: v.serial.clone(),
        created_at: v.created_at,
        updated_at: v.updated_at,
    })
}

fn size(field: &str, gib: u32) -> Result<i64, ApiError> {
    if gib == 0 || gib > MAX_GIB {
        return Err(ApiError::field(
            field,
            format!("a volume is 1 to {MAX_GIB} GiB"),
        ));
    }
    Ok(i64::from(gib))
}

/// The tenant would hold `more` GiB beyond what its volumes hold now.
async fn check_quota(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    more: u64,
) -> Result<(), ApiError> {
    crate::store::tenancy::lock_for_quota(txn, tenant.id).await?;
    let limit = crate::store::tenancy::load(txn, tenant.id)
        .await?
        .volume_gib;
    let used = store::gib_of_tenant(txn, tenant.id).await?
        + store::snapshot_gib_of_tenant(txn, tenant.id).await?
        + more;
    if used > u64::from(limit) {
        return Err(ApiError::QuotaExceeded {
            resource: "volume_gib".into(),
            detail: format!(
                "tenant {:?} would hold {used} GiB of volumes and snapshots with this request; its quota is {limit}",
                tenant.name
            ),
        });
    }
    Ok(())
}

/// Refuses `gib` more GiB of volumes on `host` (a volume, a snapshot, a
/// volume's growth, a copy moving in) where its storage has no room for
/// them: 409 naming the host, what is needed and what is free. Counted
/// at provisioned sizes (`[storage] overcommit` times what the host may
/// hold), in the caller's transaction, after the host's row is taken
/// (its revision moves: on PostgreSQL two requests wait for each other
/// instead of both taking the same room, and placements the capacity
/// index made against the old figures lose their commit). A host whose
/// agent does not report its storage is not counted.
async fn check_room(
    st: &AppState,
    txn: &DatabaseTransaction,
    host: Uuid,
    gib: u64,
    what: &str,
) -> Result<(), ApiError> {
    bump_revision(txn, host).await?;
    let h = crate::store::hosts::by_id(txn, host)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("volume on a missing host {host}")))?;
    let used = crate::store::capacity::disk_use(txn, host).await?;
    let overcommit = st.capacity.overcommit();
    let Some(free) =
        crate::store::capacity::disk_free(&h, &used, kumo_scheduler::Pool::Volumes, overcommit)
    else {
        return Ok(());
    };
    if i64::try_from(gib).map_or(true, |g| g > free) {
        return Err(no_room(&h, gib, free, what));
    }
    Ok(())
}

fn no_room(h: &hosts::Model, gib: u64, free: i64, what: &str) -> ApiError {
    ApiError::InsufficientCapacity(format!(
        "host {:?} has no room for {what}: it needs {gib} GiB and the host's storage has {} GiB free",
        h.name,
        free.max(0)
    ))
}

/// Where a volume goes when nothing ties it to a host: the ready host
/// with the fewest volumes among those with room for it; refused (naming
/// the roomiest) when none has.
async fn host_with_room(
    st: &AppState,
    txn: &DatabaseTransaction,
    gib: u64,
) -> Result<hosts::Model, ApiError> {
    let hosts = crate::store::capacity::ready_hosts_by_volumes(txn).await?;
    let used = crate::store::capacity::disk_use_all(txn).await?;
    let overcommit = st.capacity.overcommit();
    let free = |h: &hosts::Model| {
        let u = used.get(&h.id).copied().unwrap_or_default();
        crate::store::capacity::disk_free(h, &u, kumo_scheduler::Pool::Volumes, overcommit)
            .unwrap_or(i64::MAX)
    };
    let need = i64::try_from(gib).unwrap_or(i64::MAX);
    if let Some(h) = hosts.iter().find(|h| free(h) >= need) {
        return Ok(h.clone());
    }
    match hosts.iter().max_by_key(|h| free(h)) {
        Some(h) => Err(no_room(h, gib, free(h), &format!("a volume of {gib} GiB"))),
        None => Err(ApiError::InsufficientCapacity(
            "no ready host to keep a volume".into(),
        )),
    }
}

/// A disk serial (virtio-blk carries at most 20 bytes): random, so it
/// says nothing about the tenant, and unique (the database checks).
fn new_serial() -> String {
    let hex = Uuid::new_v4().simple().to_string();
    format!("kumo{}", &hex[..16])
}

/// A member makes a volume: on the named VM's host, or on the ready host
/// with the fewest volumes.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &VolumeCreate,
) -> Result<Volume, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating volumes")?;
    names::tenant_name("name", &body.name)?;
    let txn = st.db.begin().await?;
    // A copy of a snapshot: on its volume's host, at least its size.
    let source = match &body.from_snapshot {
        Some(r) => Some(source_snapshot(&txn, &tenant, r, body.vm.is_some()).await?),
        None => None,
    };
    let gib = match &source {
        Some((_, snap)) if body.size_gib == 0 => snap.size_gib,
        Some((_, snap)) if i64::from(body.size_gib) < snap.size_gib => {
            return Err(ApiError::field(
                "size_gib",
                format!("at least the snapshot's {} GiB", snap.size_gib),
            ));
        }
        _ => size("size_gib", body.size_gib)?,
    };
    check_quota(&txn, &tenant, u64::try_from(gib).unwrap_or(0)).await?;
    crate::app::budget::check_held(&txn, &tenant, VOLUME_GIB, actor.at).await?;
    let host = match (&body.vm, &source) {
        (_, Some((from, _))) => crate::store::hosts::by_id(&txn, from.host_id)
            .await?
            .ok_or_else(|| ApiError::Internal(format!("volume {} on a missing host", from.id)))?,
        (Some(vm), None) => {
            let vm = crate::store::vms::find_vm(&txn, &tenant, vm).await?;
            let Some(h) = vm.host_id else {
                return Err(ApiError::Conflict(format!(
                    "VM {:?} is not on a host yet: its volume would have nowhere to go",
                    vm.name
                )));
            };
            crate::store::hosts::by_id(&txn, h)
                .await?
                .ok_or_else(|| ApiError::Internal(format!("VM {} on a missing host", vm.id)))?
        }
        (None, None) => host_with_room(st, &txn, u64::try_from(gib).unwrap_or(0)).await?,
    };
    let what = match &source {
        Some((from, snap)) => format!(
            "a copy of {:?}'s snapshot {:?} ({gib} GiB)",
            from.name, snap.name
        ),
        None => format!("a volume of {gib} GiB"),
    };
    check_room(st, &txn, host.id, u64::try_from(gib).unwrap_or(0), &what).await?;
    let row = volumes::ActiveModel {
        id: Set(Uuid::now_v7()),
        tenant_id: Set(tenant.id),
        name: Set(body.name.clone()),
        size_gib: Set(gib),
        state: Set(VolumeState::Creating.to_text().to_owned()),
        reason: Set(None),
        host_id: Set(host.id),
        vm_id: Set(None),
        serial: Set(new_serial()),
        source_snapshot_id: Set(source.as_ref().map(|(_, s)| s.id)),
        move_to_host_id: Set(None),
        move_token_sha256: Set(None),
        moved_from_host_id: Set(None),
        created_at: Set(actor.at),
        updated_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| conflict_if_unique(e, || format!("volume {:?} already exists", body.name)))?;
    crate::app::metering::volume_held(&txn, &tenant, &row, actor.at).await?;
    bump_revision(&txn, host.id).await?;
    audit::record(&txn, actor, "volume.create", Some(&tenant), &row.name).await?;
    txn.commit().await?;
    st.signals.notify(host.id);
    view(&st.db, &row, &tenant.name).await
}

/// The snapshot `VOLUME@SNAPSHOT` of the tenant names, made: what a new
/// volume is copied from.
async fn source_snapshot(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    reference: &str,
    with_vm: bool,
) -> Result<(volumes::Model, volume_snapshots::Model), ApiError> {
    if with_vm {
        return Err(ApiError::field(
            "vm",
            "a copy of a snapshot is made on the snapshot's host; leave out vm",
        ));
    }
    let Some((volume, snapshot)) = reference.split_once('@') else {
        return Err(ApiError::field("from_snapshot", "VOLUME@SNAPSHOT"));
    };
    let from = store::find(txn, tenant, volume).await?;
    let snap = store::snapshot(txn, &from, snapshot).await?;
    if snap.state != SNAPSHOT_AVAILABLE {
        return Err(ApiError::Conflict(format!(
            "snapshot {reference:?} is {}: a copy is made of an available snapshot",
            snap.state
        )));
    }
    Ok((from, snap))
}

pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Volume>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = store::page(&st.db, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |v| v.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        items.push(view(&st.db, r, &tenant.name).await?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// The volumes attached to one of the tenant's VMs.
pub async fn of_vm(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: Uuid,
) -> Result<Vec<Volume>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let mut out = Vec::new();
    for v in store::of_vm(&st.db, vm).await? {
        if v.tenant_id == tenant.id {
            out.push(view(&st.db, &v, &tenant.name).await?);
        }
    }
    Ok(out)
}

pub async fn show(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
) -> Result<Volume, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let v = store::find(&st.db, &tenant, volume).await?;
    view(&st.db, &v, &tenant.name).await
}

/// A change of one volume, in one transaction: its row locked, the host
/// woken after the commit.
async fn change(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    what: &str,
    action: &str,
    f: impl AsyncFnOnce(
        &DatabaseTransaction,
        &tenants::Model,
        volumes::Model,
    ) -> Result<volumes::ActiveModel, ApiError>,
) -> Result<Volume, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, what)?;
    let txn = st.db.begin().await?;
    let v = store::find_to_change(&txn, &tenant, volume).await?;
    let host = v.host_id;
    let mut a = f(&txn, &tenant, v).await?;
    a.updated_at = Set(actor.at);
    let row = a.update(&txn).await?;
    bump_revision(&txn, host).await?;
    audit::record(&txn, actor, action, Some(&tenant), &row.name).await?;
    txn.commit().await?;
    st.signals.notify(host);
    view(&st.db, &row, &tenant.name).await
}

fn detached_only(v: &volumes::Model, doing: &str) -> Result<(), ApiError> {
    match store::stored_state(v)? {
        VolumeState::Available => Ok(()),
        VolumeState::Attached => Err(ApiError::Conflict(format!(
            "volume {:?} is attached to a VM: detach it before {doing} it",
            v.name
        ))),
        s => Err(ApiError::Conflict(format!(
            "volume {:?} is {}: it can be changed once it is available",
            v.name,
            s.as_str()
        ))),
    }
}

/// A member grows a detached volume (never shrinks it).
pub async fn resize(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    body: &VolumeResize,
) -> Result<Volume, ApiError> {
    let gib = size("size_gib", body.size_gib)?;
    change(
        st,
        actor,
        tenant,
        volume,
        "resizing volumes",
        "volume.resize",
        async |txn, tenant, v| {
            detached_only(&v, "growing")?;
            if gib <= v.size_gib {
                return Err(ApiError::field(
                    "size_gib",
                    format!("a volume only grows: {:?} has {} GiB", v.name, v.size_gib),
                ));
            }
            check_quota(txn, tenant, u64::try_from(gib - v.size_gib).unwrap_or(0)).await?;
            let more = u64::try_from(gib - v.size_gib).unwrap_or(0);
            let what = format!("{:?} to grow by {more} GiB", v.name);
            check_room(st, txn, v.host_id, more, &what).await?;
            crate::app::budget::check_held(txn, tenant, VOLUME_GIB, actor.at).await?;
            let mut grown = v.clone();
            grown.size_gib = gib;
            crate::app::metering::volume_released(txn, v.id, actor.at).await?;
            crate::app::metering::volume_held(txn, tenant, &grown, actor.at).await?;
            let mut a: volumes::ActiveModel = v.into();
            a.size_gib = Set(gib);
            Ok(a)
        },
    )
    .await
}

/// A member attaches a volume to a VM on the same host: it is hot-plugged
/// into the VM when it runs, and stays in its definition.
pub async fn attach(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    body: &VolumeAttach,
) -> Result<Volume, ApiError> {
    change(
        st,
        actor,
        tenant,
        volume,
        "attaching volumes",
        "volume.attach",
        async |txn, tenant, v| {
            // One still being made is attached as soon as it is.
            let creating = store::stored_state(&v)? == VolumeState::Creating;
            if !creating || v.vm_id.is_some() {
                detached_only(&v, "attaching")?;
            }
            let vm = crate::store::vms::find_vm_to_change(txn, tenant, &body.vm).await?;
            let state = crate::store::vms::stored_state(&vm)?;
            if matches!(
                state,
                VmState::Deleting | VmState::Deleted | VmState::Preempted
            ) {
                return Err(ApiError::Conflict(format!(
                    "VM {:?} is {}: nothing can be attached to it",
                    vm.name,
                    state.as_str()
                )));
            }
            if vm.host_id != Some(v.host_id) {
                let host = crate::store::hosts::by_id(txn, v.host_id)
                    .await?
                    .map(|h: hosts::Model| h.name)
                    .unwrap_or_default();
                return Err(ApiError::Conflict(format!(
                    "volume {:?} is on host {host:?} and VM {:?} is not: a volume attaches to VMs on its own host (create the VM with --volume {})",
                    v.name, vm.name, v.name
                )));
            }
            let mut a: volumes::ActiveModel = v.into();
            a.vm_id = Set(Some(vm.id));
            if !creating {
                a.state = Set(VolumeState::Attached.to_text().to_owned());
            }
            Ok(a)
        },
    )
    .await
}

/// A member detaches a volume: unplugged from the VM, kept.
pub async fn detach(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
) -> Result<Volume, ApiError> {
    change(
        st,
        actor,
        tenant,
        volume,
        "detaching volumes",
        "volume.detach",
        async |_, _, v| {
            if v.vm_id.is_none() {
                return Err(ApiError::Conflict(format!(
                    "volume {:?} is not attached",
                    v.name
                )));
            }
            let back = match store::stored_state(&v)? {
                VolumeState::Attached => VolumeState::Available,
                other => other,
            };
            let mut a: volumes::ActiveModel = v.into();
            a.vm_id = Set(None);
            a.state = Set(back.to_text().to_owned());
            Ok(a)
        },
    )
    .await
}

/// A member deletes a detached volume: its host removes it, and its row
/// goes when the host says it is gone. Its charge ends now.
pub async fn delete(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
) -> Result<(), ApiError> {
    change(
        st,
        actor,
        tenant,
        volume,
        "deleting volumes",
        "volume.delete",
        async |txn, _, v| {
            if let Some(vm) = v.vm_id {
                let name = crate::entity::vms::Entity::find_by_id(vm)
                    .one(txn)
                    .await?
                    .map(|vm| vm.name)
                    .unwrap_or_default();
                return Err(ApiError::Conflict(format!(
                    "volume {:?} is attached to VM {name:?}: detach it first",
                    v.name
                )));
            }
            match store::stored_state(&v)? {
                VolumeState::Deleting => {
                    return Err(ApiError::Conflict(format!(
                        "volume {:?} is being deleted already",
                        v.name
                    )));
                }
                VolumeState::Moving => {
                    return Err(ApiError::Conflict(format!(
                        "volume {:?} is being moved: cancel the move first (move it to the host it is on)",
                        v.name
                    )));
                }
                _ => {}
            }
            let snaps = store::snapshots_of(txn, v.id).await?;
            let ids: Vec<Uuid> = snaps.iter().map(|s| s.id).collect();
            if let Some(copy) = store::made_from(txn, &ids).await?.first() {
                return Err(ApiError::Conflict(format!(
                    "volume {:?} was made from a snapshot of {:?}: delete it first",
                    copy.name, v.name
                )));
            }
            crate::app::metering::volume_released(txn, v.id, actor.at).await?;
            for s in &snaps {
                crate::app::metering::snapshot_released(txn, s.id, actor.at).await?;
            }
            let mut a: volumes::ActiveModel = v.into();
            a.state = Set(VolumeState::Deleting.to_text().to_owned());
            Ok(a)
        },
    )
    .await
    .map(|_| ())
}

/// A member moves a detached volume to another ready host: the volume's
/// agent serves it to the destination's agent, which keeps it once the
/// copy is whole and its checksum matches; until then the volume stays
/// where it is, `moving`, and cannot be attached or changed. Naming the
/// host it is on cancels a move under way (and is otherwise nothing).
pub async fn move_to(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    body: &VolumeMove,
) -> Result<Volume, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "moving volumes")?;
    let txn = st.db.begin().await?;
    let v = store::find_to_change(&txn, &tenant, volume).await?;
    let target = crate::store::hosts::find(&txn, &body.host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {:?}", body.host)))?;
    let moving = store::stored_state(&v)? == VolumeState::Moving;
    let mut wake = vec![v.host_id];
    wake.extend(v.move_to_host_id);
    if moving && v.vm_id.is_some() {
        return Err(ApiError::Conflict(format!(
            "volume {:?} moves with its VM, which was placed on another host: it cannot be moved or called back on its own",
            v.name
        )));
    }
    let mut a: volumes::ActiveModel = v.clone().into();
    if target.id == v.host_id {
        if !moving {
            return view(&txn, &v, &tenant.name).await;
        }
        a.state = Set(VolumeState::Available.to_text().to_owned());
    } else {
        if !moving {
            detached_only(&v, "moving")?;
        }
        check_move(&txn, &v, &target).await?;
        // The copy takes room there until the move is over (and the
        // original here until its host removes it). Both hosts' rows are
        // taken in id order first: two moves in opposite directions must
        // not each hold one and wait for the other.
        let mut both = [v.host_id, target.id];
        both.sort();
        for h in both {
            bump_revision(&txn, h).await?;
        }
        let gib = u64::try_from(v.size_gib).unwrap_or(0);
        let what = format!("a copy of {:?} ({gib} GiB)", v.name);
        check_room(st, &txn, target.id, gib, &what).await?;
        a.state = Set(VolumeState::Moving.to_text().to_owned());
        wake.push(target.id);
    }
    let to = (target.id != v.host_id).then_some(target.id);
    a.move_to_host_id = Set(to);
    a.move_token_sha256 = Set(None);
    a.reason = Set(None);
    a.updated_at = Set(actor.at);
    let row = a.update(&txn).await?;
    wake.sort();
    wake.dedup();
    for h in &wake {
        bump_revision(&txn, *h).await?;
    }
    let what = format!("{} → {}", row.name, target.name);
    audit::record(&txn, actor, "volume.move", Some(&tenant), &what).await?;
    txn.commit().await?;
    for h in wake {
        st.signals.notify(h);
    }
    view(&st.db, &row, &tenant.name).await
}

/// Whether a detached volume can go to `target`.
async fn check_move(
    txn: &DatabaseTransaction,
    v: &volumes::Model,
    target: &hosts::Model,
) -> Result<(), ApiError> {
    if target.state != HostState::Ready.as_str() {
        return Err(ApiError::Conflict(format!(
            "host {:?} is {}: volumes move to ready hosts",
            target.name, target.state
        )));
    }
    if v.moved_from_host_id == Some(target.id) {
        return Err(ApiError::Conflict(format!(
            "host {:?} is still removing the volume's old copy; try again in a moment",
            target.name
        )));
    }
    // Both agents must know moves: an agent from before them reports no
    // transfer address (and would neither serve nor fetch).
    let source = crate::store::hosts::by_id(txn, v.host_id).await?;
    for h in source.iter().chain([target]) {
        if h.transfer_url.is_none() {
            return Err(ApiError::Conflict(format!(
                "host {:?}'s agent does not move volumes (it is from before volume moves): upgrade it first",
                h.name
            )));
        }
    }
    if !store::snapshots_of(txn, v.id).await?.is_empty() {
        return Err(ApiError::Conflict(format!(
            "volume {:?} has snapshots, which stay on its host: delete them before moving it",
            v.name
        )));
    }
    Ok(())
}

/// What a host's agent said of its volumes, applied row by row: made
/// (`creating` or `error` → available, or attached), failed (`error`
/// with the reason), gone (a volume being deleted: its row goes); of a
/// volume moving to it, its import (see [`settle_import`]); of an old copy
/// after a move, gone. A report about another host's volume, or an
/// unknown one, changes nothing. Answers the hosts whose revision it
/// bumped, to wake after the commit.
pub async fn apply_status(
    txn: &DatabaseTransaction,
    host: Uuid,
    report: &[VolumeStatus],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    // Every pass reports every volume: two queries for the whole report.
    let ids: Vec<Uuid> = report.iter().map(|s| s.id).collect();
    let rows = store::reported_by(txn, host, &ids).await?;
    let snaps = store::snapshots_on(txn, &ids).await?;
    let mut wake = Vec::new();
    for s in report {
        let Some(v) = rows.iter().find(|v| v.id == s.id).cloned() else {
            continue;
        };
        if v.move_to_host_id == Some(host) {
            wake.extend(settle_import(txn, host, v, s, now).await?);
            continue;
        }
        if v.host_id != host {
            // The old copy of a moved volume.
            if s.state == VolumeActual::Absent {
                let mut a: volumes::ActiveModel = v.into();
                a.moved_from_host_id = Set(None);
                a.update(txn).await?;
            }
            continue;
        }
        if s.state == VolumeActual::Ready {
            let of_it = snaps.iter().filter(|x| x.volume_id == v.id);
            settle_snapshots(txn, of_it, &s.snapshots).await?;
        }
        let state = store::stored_state(&v)?;
        let next = match (s.state, state) {
            (VolumeActual::Absent, VolumeState::Deleting) => {
                volumes::Entity::delete_by_id(v.id).exec(txn).await?;
                continue;
            }
            (_, VolumeState::Deleting) => continue,
            (VolumeActual::Ready, VolumeState::Creating | VolumeState::Error) => {
                let settled = if v.vm_id.is_some() {
                    VolumeState::Attached
                } else {
                    VolumeState::Available
                };
                (settled, None)
            }
            (VolumeActual::Failed, VolumeState::Moving) => (
                VolumeState::Moving,
                Some(s.reason.clone().unwrap_or_else(|| "failed".into())),
            ),
            (VolumeActual::Failed, _) => (
                VolumeState::Error,
                Some(s.reason.clone().unwrap_or_else(|| "failed".into())),
            ),
            _ => continue,
        };
        if (next.0, next.1.as_deref()) == (state, v.reason.as_deref()) {
            continue;
        }
        let mut a: volumes::ActiveModel = v.into();
        a.state = Set(next.0.to_text().to_owned());
        a.reason = Set(next.1.map(|r| names::cleaned(&r, 500)));
        a.updated_at = Set(now);
        a.update(txn).await?;
    }
    Ok(wake)
}

/// What the destination of a move said: fetching with a token (its hash
/// is kept, and the source told), failed (the reason, retried by the
/// agent), or whole (the volume is the destination's from now on; the
/// source removes its copy). The hosts to wake.
async fn settle_import(
    txn: &DatabaseTransaction,
    host: Uuid,
    v: volumes::Model,
    s: &VolumeStatus,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let source = v.host_id;
    let mut a: volumes::ActiveModel = v.clone().into();
    let wake = match s.state {
        VolumeActual::Ready => {
            a.host_id = Set(host);
            a.moved_from_host_id = Set(Some(source));
            a.move_to_host_id = Set(None);
            a.move_token_sha256 = Set(None);
            // One that moved with its VM (unshelved elsewhere) is its disk.
            let settled = if v.vm_id.is_some() {
                VolumeState::Attached
            } else {
                VolumeState::Available
            };
            a.state = Set(settled.to_text().to_owned());
            a.reason = Set(None);
            // The copy is whole on its own: no snapshot holds it.
            a.source_snapshot_id = Set(None);
            vec![source, host]
        }
        VolumeActual::Importing | VolumeActual::Failed => {
            let Some(p) = crate::domain::imports::progress(
                s,
                v.move_token_sha256.as_deref(),
                v.reason.as_deref(),
                "copying to the new host",
                None,
            ) else {
                return Ok(Vec::new());
            };
            a.reason = Set(p.reason);
            match p.token {
                Some(t) => {
                    a.move_token_sha256 = Set(Some(t));
                    vec![source]
                }
                None => Vec::new(),
            }
        }
        VolumeActual::Absent => return Ok(Vec::new()),
    };
    a.updated_at = Set(now);
    a.update(txn).await?;
    for h in &wake {
        bump_revision(txn, *h).await?;
    }
    Ok(wake)
}

// ------------------------------------------------------------ snapshots

const SNAPSHOT_CREATING: &str = "creating";
const SNAPSHOT_AVAILABLE: &str = "available";
const SNAPSHOT_DELETING: &str = "deleting";

fn snapshot_view(s: &volume_snapshots::Model, volume: &str) -> VolumeSnapshot {
    VolumeSnapshot {
        id: s.id,
        name: s.name.clone(),
        volume: volume.to_owned(),
        size_gib: u32::try_from(s.size_gib).unwrap_or(u32::MAX),
        state: s.state.clone(),
        created_at: s.created_at,
    }
}

/// A member snapshots a detached volume (consistent: nothing writes to
/// it), within the `volume_gib` quota; charged per GiB-hour
/// (`snapshot_gib`).
pub async fn create_snapshot(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    body: &VolumeSnapshotCreate,
) -> Result<VolumeSnapshot, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "snapshotting volumes")?;
    names::tenant_name("name", &body.name)?;
    let txn = st.db.begin().await?;
    let v = store::find_to_change(&txn, &tenant, volume).await?;
    detached_only(&v, "snapshotting")?;
    check_quota(&txn, &tenant, u64::try_from(v.size_gib).unwrap_or(0)).await?;
    // A snapshot may come to hold all of its volume's blocks.
    let snap_gib = u64::try_from(v.size_gib).unwrap_or(0);
    let what = format!("a snapshot of {:?} ({snap_gib} GiB)", v.name);
    check_room(st, &txn, v.host_id, snap_gib, &what).await?;
    crate::app::budget::check_held(&txn, &tenant, SNAPSHOT_GIB, actor.at).await?;
    let row = volume_snapshots::ActiveModel {
        id: Set(Uuid::now_v7()),
        volume_id: Set(v.id),
        tenant_id: Set(tenant.id),
        name: Set(body.name.clone()),
        size_gib: Set(v.size_gib),
        state: Set(SNAPSHOT_CREATING.into()),
        created_at: Set(actor.at),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || {
            format!("volume {:?} has a snapshot {:?} already", v.name, body.name)
        })
    })?;
    crate::app::metering::snapshot_held(&txn, &tenant, &row, actor.at).await?;
    bump_revision(&txn, v.host_id).await?;
    let target = format!("{}@{}", v.name, row.name);
    audit::record(&txn, actor, "volume.snapshot", Some(&tenant), &target).await?;
    txn.commit().await?;
    st.signals.notify(v.host_id);
    Ok(snapshot_view(&row, &v.name))
}

pub async fn list_snapshots(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
) -> Result<Vec<VolumeSnapshot>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let v = store::find(&st.db, &tenant, volume).await?;
    Ok(store::snapshots_of(&st.db, v.id)
        .await?
        .iter()
        .map(|s| snapshot_view(s, &v.name))
        .collect())
}

/// A member deletes a snapshot no volume was made from; its host removes
/// it, and its row goes when the host says so. Its charge ends now.
pub async fn delete_snapshot(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    volume: &str,
    snapshot: &str,
) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "deleting snapshots")?;
    let txn = st.db.begin().await?;
    let v = store::find_to_change(&txn, &tenant, volume).await?;
    let snap = store::snapshot(&txn, &v, snapshot).await?;
    if snap.state == SNAPSHOT_DELETING {
        return Err(ApiError::Conflict(format!(
            "snapshot {:?} is being deleted already",
            snap.name
        )));
    }
    if let Some(copy) = store::made_from(&txn, &[snap.id]).await?.first() {
        return Err(ApiError::Conflict(format!(
            "volume {:?} was made from snapshot {:?}: delete it first",
            copy.name, snap.name
        )));
    }
    crate::app::metering::snapshot_released(&txn, snap.id, actor.at).await?;
    let target = format!("{}@{}", v.name, snap.name);
    let mut a: volume_snapshots::ActiveModel = snap.into();
    a.state = Set(SNAPSHOT_DELETING.into());
    a.update(&txn).await?;
    bump_revision(&txn, v.host_id).await?;
    audit::record(
        &txn,
        actor,
        "volume.snapshot.delete",
        Some(&tenant),
        &target,
    )
    .await?;
    txn.commit().await?;
    st.signals.notify(v.host_id);
    Ok(())
}

/// What a volume's host holds of its snapshots: made (`creating` →
/// `available`), gone (`deleting` → the row goes).
async fn settle_snapshots<'a>(
    txn: &DatabaseTransaction,
    stored: impl Iterator<Item = &'a volume_snapshots::Model>,
    held: &[Uuid],
) -> Result<(), ApiError> {
    for s in stored.cloned() {
        let there = held.contains(&s.id);
        match (s.state.as_str(), there) {
            (SNAPSHOT_CREATING, true) => {
                let mut a: volume_snapshots::ActiveModel = s.into();
                a.state = Set(SNAPSHOT_AVAILABLE.into());
                a.update(txn).await?;
            }
            (SNAPSHOT_DELETING, false) => {
                volume_snapshots::Entity::delete_by_id(s.id)
                    .exec(txn)
                    .await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// For a host's desired state, per volume: the snapshots its host keeps,
/// and the snapshot it was copied from. One query for the whole host: a
/// copy is made on its snapshot's host, so every source is among them.
pub async fn desired_snapshots(
    db: &impl ConnectionTrait,
    vols: &[volumes::Model],
) -> Result<std::collections::HashMap<Uuid, (Vec<Uuid>, Option<(Uuid, Uuid)>)>, ApiError> {
    let ids: Vec<Uuid> = vols.iter().map(|v| v.id).collect();
    let snaps = store::snapshots_on(db, &ids).await?;
    Ok(vols
        .iter()
        .map(|v| {
            let keep = snaps
                .iter()
                .filter(|s| s.volume_id == v.id && s.state != SNAPSHOT_DELETING)
                .map(|s| s.id)
                .collect();
            let source = v
                .source_snapshot_id
                .and_then(|id| snaps.iter().find(|s| s.id == id))
                .map(|s| (s.volume_id, s.id));
            (v.id, (keep, source))
        })
        .collect())
}
