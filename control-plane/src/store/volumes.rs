//! Queries of volumes: a tenant's, a host's, a VM's, and the tenant's
//! total against its `volume_gib` quota.

use kumo_api_types::VolumeState;
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{tenants, volume_snapshots, volumes};
use crate::error::ApiError;

pub fn stored_state(v: &volumes::Model) -> Result<VolumeState, ApiError> {
    crate::domain::states::decode("volumes", v.id, &v.state)
}

fn query(tenant: &tenants::Model, reference: &str) -> sea_orm::Select<volumes::Entity> {
    super::name_or_id(
        volumes::Entity::find().filter(volumes::Column::TenantId.eq(tenant.id)),
        volumes::Column::Id,
        volumes::Column::Name,
        reference,
    )
}

/// A tenant's volume by name or id; another tenant's is "not found".
pub async fn find(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    reference: &str,
) -> Result<volumes::Model, ApiError> {
    query(tenant, reference)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("volume {reference:?}")))
}

/// [`find`] for a change: the row stays locked until the transaction ends.
pub async fn find_to_change(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    reference: &str,
) -> Result<volumes::Model, ApiError> {
    query(tenant, reference)
        .lock_exclusive()
        .one(txn)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("volume {reference:?}")))
}

pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<volumes::Model>, ApiError> {
    let mut q = volumes::Entity::find()
        .filter(volumes::Column::TenantId.eq(tenant))
        .order_by_asc(volumes::Column::Name);
    if let Some(after) = &paging.after {
        q = q.filter(volumes::Column::Name.gt(after.as_str()));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

/// GiB over all the tenant's volumes (those being deleted still count:
/// their host still holds them).
pub async fn gib_of_tenant(db: &impl ConnectionTrait, tenant: Uuid) -> Result<u64, ApiError> {
    Ok(volumes::Entity::find()
        .filter(volumes::Column::TenantId.eq(tenant))
        .all(db)
        .await?
        .iter()
        .map(|v| u64::try_from(v.size_gib).unwrap_or(0))
        .sum())
}

/// The volumes a host's storage holds, oldest first.
pub async fn on_host(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<volumes::Model>, ApiError> {
    Ok(volumes::Entity::find()
        .filter(volumes::Column::HostId.eq(host))
        .order_by_asc(volumes::Column::CreatedAt)
        .order_by_asc(volumes::Column::Id)
        .all(db)
        .await?)
}

/// Those of `ids` that this host may report on: its own, those being
/// moved to it, and those whose old copy it still holds.
pub async fn reported_by(
    db: &impl ConnectionTrait,
    host: Uuid,
    ids: &[Uuid],
) -> Result<Vec<volumes::Model>, ApiError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(volumes::Entity::find()
        .filter(
            Condition::any()
                .add(volumes::Column::HostId.eq(host))
                .add(volumes::Column::MoveToHostId.eq(host))
                .add(volumes::Column::MovedFromHostId.eq(host)),
        )
        .filter(volumes::Column::Id.is_in(ids.iter().copied()))
        .all(db)
        .await?)
}

/// The volumes being moved to a host.
pub async fn moving_to(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<volumes::Model>, ApiError> {
    Ok(volumes::Entity::find()
        .filter(volumes::Column::MoveToHostId.eq(host))
        .order_by_asc(volumes::Column::Id)
        .all(db)
        .await?)
}

/// The volumes moved off a host whose old copy it still holds.
pub async fn moved_from(db: &impl ConnectionTrait, host: Uuid) -> Result<Vec<Uuid>, ApiError> {
    Ok(volumes::Entity::find()
        .select_only()
        .column(volumes::Column::Id)
        .filter(volumes::Column::MovedFromHostId.eq(host))
        .into_tuple::<Uuid>()
        .all(db)
        .await?)
}

/// The hosts fetching volumes from this one.
pub async fn fetching_from(db: &impl ConnectionTrait, host: Uuid) -> Result<Vec<Uuid>, ApiError> {
    Ok(volumes::Entity::find()
        .select_only()
        .column(volumes::Column::MoveToHostId)
        .filter(volumes::Column::HostId.eq(host))
        .filter(volumes::Column::MoveToHostId.is_not_null())
        .into_tuple::<Uuid>()
        .all(db)
        .await?)
}

/// The volumes attached to a VM.
pub async fn of_vm(db: &impl ConnectionTrait, vm: Uuid) -> Result<Vec<volumes::Model>, ApiError> {
    Ok(volumes::Entity::find()
        .filter(volumes::Column::VmId.eq(vm))
        .order_by_asc(volumes::Column::CreatedAt)
        .all(db)
        .await?)
}

/// A new VM's volumes, attached in its transaction; false when one of
/// them is no longer available (taken meanwhile).
pub async fn attach_new(
    txn: &DatabaseTransaction,
    vm: Uuid,
    ids: &[Uuid],
) -> Result<bool, ApiError> {
    if ids.is_empty() {
        return Ok(true);
    }
    let done = volumes::Entity::update_many()
        .set(volumes::ActiveModel {
            vm_id: Set(Some(vm)),
            state: Set(VolumeState::Attached.to_text().to_owned()),
            ..Default::default()
        })
        .filter(volumes::Column::Id.is_in(ids.iter().copied()))
        .filter(volumes::Column::VmId.is_null())
        .filter(volumes::Column::State.eq(VolumeState::Available.to_text()))
        .exec(txn)
        .await?;
    // One still being made stays `creating` (its host's report settles it).
    let made = volumes::Entity::update_many()
        .set(volumes::ActiveModel {
            vm_id: Set(Some(vm)),
            ..Default::default()
        })
        .filter(volumes::Column::Id.is_in(ids.iter().copied()))
        .filter(volumes::Column::VmId.is_null())
        .filter(volumes::Column::State.eq(VolumeState::Creating.to_text()))
        .exec(txn)
        .await?;
    Ok(done.rows_affected + made.rows_affected == ids.len() as u64)
}

/// The VM's row goes: its volumes stay, detached.
pub async fn detach_all(txn: &DatabaseTransaction, vm: Uuid) -> Result<(), ApiError> {
    volumes::Entity::update_many()
        .set(volumes::ActiveModel {
            vm_id: Set(None),
            state: Set(VolumeState::Available.to_text().to_owned()),
            ..Default::default()
        })
        .filter(volumes::Column::VmId.eq(vm))
        .filter(volumes::Column::State.eq(VolumeState::Attached.to_text()))
        .exec(txn)
        .await?;
    // One in error keeps its state (and reason) but is no VM's any more.
    volumes::Entity::update_many()
        .set(volumes::ActiveModel {
            vm_id: Set(None),
            ..Default::default()
        })
        .filter(volumes::Column::VmId.eq(vm))
        .exec(txn)
        .await?;
    Ok(())
}

/// Of `vms`, those with a volume on another host than `host` (on its
/// way to it).
pub async fn vms_waiting_on_volumes(
    db: &impl ConnectionTrait,
    host: Uuid,
    vms: &[Uuid],
) -> Result<std::collections::BTreeSet<Uuid>, ApiError> {
    if vms.is_empty() {
        return Ok(Default::default());
    }
    Ok(volumes::Entity::find()
        .select_only()
        .column(volumes::Column::VmId)
        .filter(volumes::Column::VmId.is_in(vms.iter().copied()))
        .filter(volumes::Column::HostId.ne(host))
        .into_tuple::<Option<Uuid>>()
        .all(db)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// Sends a VM's volumes that are on other hosts to `host`, where it was
/// placed: each `moving` there (see [`moving_to`]). Answers how many.
pub async fn move_with_vm(
    txn: &DatabaseTransaction,
    vm: Uuid,
    host: Uuid,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<u64, ApiError> {
    let r = volumes::Entity::update_many()
        .set(volumes::ActiveModel {
            state: Set(VolumeState::Moving.to_text().to_owned()),
            move_to_host_id: Set(Some(host)),
            move_token_sha256: Set(None),
            reason: Set(None),
            updated_at: Set(now),
            ..Default::default()
        })
        .filter(volumes::Column::VmId.eq(vm))
        .filter(volumes::Column::HostId.ne(host))
        .exec(txn)
        .await?;
    Ok(r.rows_affected)
}

/// A volume's snapshots, oldest first.
pub async fn snapshots_of(
    db: &impl ConnectionTrait,
    volume: Uuid,
) -> Result<Vec<volume_snapshots::Model>, ApiError> {
    Ok(volume_snapshots::Entity::find()
        .filter(volume_snapshots::Column::VolumeId.eq(volume))
        .order_by_asc(volume_snapshots::Column::CreatedAt)
        .order_by_asc(volume_snapshots::Column::Id)
        .all(db)
        .await?)
}

/// The snapshots of any of these volumes.
pub async fn snapshots_on(
    db: &impl ConnectionTrait,
    volumes: &[Uuid],
) -> Result<Vec<volume_snapshots::Model>, ApiError> {
    if volumes.is_empty() {
        return Ok(Vec::new());
    }
    Ok(volume_snapshots::Entity::find()
        .filter(volume_snapshots::Column::VolumeId.is_in(volumes.iter().copied()))
        .all(db)
        .await?)
}

/// A volume's snapshot by name or id.
pub async fn snapshot(
    db: &impl ConnectionTrait,
    volume: &volumes::Model,
    reference: &str,
) -> Result<volume_snapshots::Model, ApiError> {
    super::name_or_id(
        volume_snapshots::Entity::find().filter(volume_snapshots::Column::VolumeId.eq(volume.id)),
        volume_snapshots::Column::Id,
        volume_snapshots::Column::Name,
        reference,
    )
    .one(db)
    .await?
    .ok_or_else(|| {
        ApiError::not_found(format!(
            "snapshot {reference:?} of volume {:?}",
            volume.name
        ))
    })
}

/// GiB over all the tenant's snapshots.
pub async fn snapshot_gib_of_tenant(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<u64, ApiError> {
    Ok(volume_snapshots::Entity::find()
        .filter(volume_snapshots::Column::TenantId.eq(tenant))
        .all(db)
        .await?
        .iter()
        .map(|s| u64::try_from(s.size_gib).unwrap_or(0))
        .sum())
}

/// The volumes made from any of these snapshots.
pub async fn made_from(
    db: &impl ConnectionTrait,
    snapshots: &[Uuid],
) -> Result<Vec<volumes::Model>, ApiError> {
    if snapshots.is_empty() {
        return Ok(Vec::new());
    }
    Ok(volumes::Entity::find()
        .filter(volumes::Column::SourceSnapshotId.is_in(snapshots.iter().copied()))
        .all(db)
        .await?)
}
