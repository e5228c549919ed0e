//! Volume use cases: a tenant's block volumes within its `volume_gib`
//! quota, each on one host's storage, attached to at most one VM on that
//! host. Rows are the desired state: the host's agent makes, grows,
//! attaches (hot-plugged into a running VM) and deletes what they say, and
//! reports back (`apply_status`).

use kumo_api_types::{
    Page, PageParams, Role, VmState, Volume, VolumeActual, VolumeAttach, VolumeCreate,
    VolumeResize, VolumeState, VolumeStatus,
};
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
use crate::entity::{hosts, tenants, volumes};
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
    let used = store::gib_of_tenant(txn, tenant.id).await? + more;
    if used > u64::from(limit) {
        return Err(ApiError::QuotaExceeded {
            resource: "volume_gib".into(),
            detail: format!(
                "tenant {:?} would hold {used} GiB of volumes with this request; its quota is {limit}",
                tenant.name
            ),
        });
    }
    Ok(())
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
    let gib = size("size_gib", body.size_gib)?;
    let txn = st.db.begin().await?;
    check_quota(&txn, &tenant, u64::from(body.size_gib)).await?;
    let host = match &body.vm {
        Some(vm) => {
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
        None => store::roomiest_host(&txn).await?.ok_or_else(|| {
            ApiError::InsufficientCapacity("no ready host to keep a volume".into())
        })?,
    };
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
            if store::stored_state(&v)? == VolumeState::Deleting {
                return Err(ApiError::Conflict(format!(
                    "volume {:?} is being deleted already",
                    v.name
                )));
            }
            crate::app::metering::volume_released(txn, v.id, actor.at).await?;
            let mut a: volumes::ActiveModel = v.into();
            a.state = Set(VolumeState::Deleting.to_text().to_owned());
            Ok(a)
        },
    )
    .await
    .map(|_| ())
}

/// What a host's agent said of its volumes, applied row by row: made
/// (`creating` or `error` → available, or attached), failed (`error`
/// with the reason), gone (a volume being deleted: its row goes). A
/// report about another host's volume, or an unknown one, changes nothing.
pub async fn apply_status(
    txn: &DatabaseTransaction,
    host: Uuid,
    report: &[VolumeStatus],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    for s in report {
        let Some(v) = volumes::Entity::find_by_id(s.id).one(txn).await? else {
            continue;
        };
        if v.host_id != host {
            continue;
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
    Ok(())
}
