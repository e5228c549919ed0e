//! Queries over VMs and their events: the stored spec, placement, state
//! and power of a row, a tenant's VM by name or id, and event rows.

use chrono::{DateTime, Utc};
use kumo_api_types::{Power, VmSpec, VmState};
use kumo_topology::guest_layout::Placement;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, NotSet,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::domain::quota::Usage;
use crate::domain::states::decode;
use crate::entity::{tenants, vm_events, vms};
use crate::error::ApiError;

pub fn stored_spec(v: &vms::Model) -> Result<VmSpec, ApiError> {
    serde_json::from_str(&v.spec).map_err(|e| ApiError::Internal(format!("vm {} spec: {e}", v.id)))
}

pub fn stored_placement(v: &vms::Model) -> Result<Option<Placement>, ApiError> {
    v.placement
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| ApiError::Internal(format!("vm {} placement: {e}", v.id)))
}

pub fn stored_state(v: &vms::Model) -> Result<VmState, ApiError> {
    decode("vms", v.id, &v.state)
}

pub fn desired_power(v: &vms::Model) -> Result<Power, ApiError> {
    decode("vms", v.id, &v.desired_power)
}

pub async fn event(
    db: &impl ConnectionTrait,
    vm: &vms::Model,
    at: DateTime<Utc>,
    kind: &str,
    message: impl Into<String>,
) -> Result<(), ApiError> {
    vm_events::ActiveModel {
        id: NotSet,
        vm_id: Set(vm.id),
        tenant_id: Set(vm.tenant_id),
        at: Set(at),
        kind: Set(kind.to_owned()),
        message: Set(message.into()),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// A tenant's VM by name or id.
pub fn vm_query(tenant: &tenants::Model, vm_ref: &str) -> sea_orm::Select<vms::Entity> {
    super::name_or_id(
        vms::Entity::find().filter(vms::Column::TenantId.eq(tenant.id)),
        vms::Column::Id,
        vms::Column::Name,
        vm_ref,
    )
}

pub async fn find_vm(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    vm_ref: &str,
) -> Result<vms::Model, ApiError> {
    vm_query(tenant, vm_ref)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("VM {vm_ref:?}")))
}

/// [`find_vm`] for a change: the row stays locked until the transaction
/// ends (PostgreSQL; SQLite's one connection serialises anyway), so a
/// concurrent agent report cannot write over the change with what it read
/// before it.
pub async fn find_vm_to_change(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    vm_ref: &str,
) -> Result<vms::Model, ApiError> {
    vm_query(tenant, vm_ref)
        .lock_exclusive()
        .one(txn)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("VM {vm_ref:?}")))
}

/// A VM by id for a change, locked until the transaction ends.
pub async fn locked(txn: &DatabaseTransaction, id: Uuid) -> Result<Option<vms::Model>, ApiError> {
    Ok(vms::Entity::find_by_id(id)
        .lock_exclusive()
        .one(txn)
        .await?)
}

/// The first of a tenant's VMs that has one of `names`.
pub async fn named(
    db: &impl ConnectionTrait,
    tenant: uuid::Uuid,
    names: &[String],
) -> Result<Option<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant))
        .filter(vms::Column::Name.is_in(names.iter().cloned()))
        .one(db)
        .await?)
}

/// What a tenant's VMs hold against its quota.
pub async fn usage(db: &impl ConnectionTrait, tenant: uuid::Uuid) -> Result<Usage, ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant))
        .all(db)
        .await?;
    let mut held = Vec::with_capacity(rows.len());
    for v in &rows {
        held.push((stored_state(v)?, stored_spec(v)?));
    }
    let mut usage = Usage::of(held.iter().map(|(s, spec)| (*s, spec)));
    // Clusters' spares keep compute of the tenant's as their members do.
    for (spec, n) in crate::store::clusters::spares_of(db, tenant).await? {
        for _ in 0..n {
            usage.keep(&spec);
        }
    }
    Ok(usage)
}

/// One page of a tenant's VMs, by name.
pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<vms::Model>, ApiError> {
    let mut query = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant))
        .order_by_asc(vms::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(vms::Column::Name.gt(after.as_str()));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

/// The VMs placed on a host.
pub async fn on_host(db: &impl ConnectionTrait, host: Uuid) -> Result<Vec<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::HostId.eq(host))
        .all(db)
        .await?)
}

/// How many VMs a tenant has.
pub async fn count_of(db: &impl ConnectionTrait, tenant: Uuid) -> Result<u64, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant))
        .count(db)
        .await?)
}

/// VMs' names by id.
pub async fn names_by_id(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<std::collections::HashMap<Uuid, String>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::Id.is_in(ids))
        .all(db)
        .await?
        .into_iter()
        .map(|r| (r.id, r.name))
        .collect())
}

/// One page of a tenant's VM events, newest first, older than the event
/// `before`.
pub async fn events_page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    before: Option<i64>,
    paging: &Paging,
) -> Result<Vec<vm_events::Model>, ApiError> {
    let mut query = vm_events::Entity::find()
        .filter(vm_events::Column::TenantId.eq(tenant))
        .order_by_desc(vm_events::Column::Id);
    if let Some(before) = before {
        query = query.filter(vm_events::Column::Id.lt(before));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

/// VMs placed on `host` whose root disk is still on another host (on its
/// way here).
pub async fn disks_arriving(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::HostId.eq(host))
        .filter(vms::Column::DiskHostId.is_not_null())
        .filter(vms::Column::DiskHostId.ne(host))
        .order_by_asc(vms::Column::Id)
        .all(db)
        .await?)
}

/// VMs placed elsewhere whose root disk `host` holds and serves now (the
/// new host's agent told the hash of its token).
pub async fn disks_leaving(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::DiskHostId.eq(host))
        .filter(vms::Column::HostId.is_not_null())
        .filter(vms::Column::HostId.ne(host))
        .filter(vms::Column::DiskMoveTokenSha256.is_not_null())
        .order_by_asc(vms::Column::Id)
        .all(db)
        .await?)
}

/// The root disks `host` keeps of VMs that run elsewhere now or are gone.
pub async fn stale_disks(db: &impl ConnectionTrait, host: Uuid) -> Result<Vec<Uuid>, ApiError> {
    use crate::entity::stale_root_disks as s;
    Ok(s::Entity::find()
        .select_only()
        .column(s::Column::VmId)
        .filter(s::Column::HostId.eq(host))
        .order_by_asc(s::Column::VmId)
        .into_tuple::<Uuid>()
        .all(db)
        .await?)
}

/// The hosts that keep a root disk of `vm` it no longer needs (hosts it
/// left).
pub async fn stale_disk_hosts(db: &impl ConnectionTrait, vm: Uuid) -> Result<Vec<Uuid>, ApiError> {
    use crate::entity::stale_root_disks as s;
    Ok(s::Entity::find()
        .select_only()
        .column(s::Column::HostId)
        .filter(s::Column::VmId.eq(vm))
        .into_tuple::<Uuid>()
        .all(db)
        .await?)
}

/// Whether `host` keeps a root disk of `vm` it no longer needs.
pub async fn left(db: &impl ConnectionTrait, vm: Uuid, host: Uuid) -> Result<bool, ApiError> {
    Ok(stale_disk_hosts(db, vm).await?.contains(&host))
}

/// Records that `host` keeps a root disk of `vm` it no longer needs.
pub async fn mark_stale_disk(
    txn: &DatabaseTransaction,
    vm: Uuid,
    host: Uuid,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    use crate::entity::stale_root_disks as s;
    let row = s::ActiveModel {
        vm_id: Set(vm),
        host_id: Set(host),
        created_at: Set(now),
    };
    s::Entity::insert(row)
        .on_conflict(
            sea_orm::sea_query::OnConflict::columns([s::Column::VmId, s::Column::HostId])
                .do_nothing()
                .to_owned(),
        )
        .do_nothing()
        .exec(txn)
        .await?;
    Ok(())
}

/// `host` removed what it kept of `vm`; answers whether it was stale.
pub async fn stale_disk_removed(
    txn: &DatabaseTransaction,
    vm: Uuid,
    host: Uuid,
) -> Result<bool, ApiError> {
    use crate::entity::stale_root_disks as s;
    let r = s::Entity::delete_many()
        .filter(s::Column::VmId.eq(vm))
        .filter(s::Column::HostId.eq(host))
        .exec(txn)
        .await?;
    Ok(r.rows_affected > 0)
}
