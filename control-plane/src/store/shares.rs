//! Queries of project shares and their mounts: a tenant's shares, the
//! shares a host keeps, the mounts of VMs, the tenant's total against its
//! `share_gib` quota, and the hosts that may keep shares.

use std::collections::HashMap;

use kumo_api_types::{HostState, ShareLimit, ShareState, SharesStorage};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::entity::{hosts, share_mounts, shares, tenants, vms};
use crate::error::ApiError;

pub fn stored_state(s: &shares::Model) -> Result<ShareState, ApiError> {
    crate::domain::states::decode("shares", s.id, &s.state)
}

pub fn stored_limit(s: &shares::Model) -> Result<Option<ShareLimit>, ApiError> {
    s.limit_kind
        .as_deref()
        .map(|l| crate::domain::states::decode("shares", s.id, l))
        .transpose()
}

/// A host's report of the shared filesystem; an unreadable one is none.
pub fn stored_storage(h: &hosts::Model) -> Option<SharesStorage> {
    serde_json::from_str(h.shares_storage.as_deref()?).ok()
}

fn query(tenant: &tenants::Model, reference: &str) -> sea_orm::Select<shares::Entity> {
    super::name_or_id(
        shares::Entity::find().filter(shares::Column::TenantId.eq(tenant.id)),
        shares::Column::Id,
        shares::Column::Name,
        reference,
    )
}

/// A tenant's share by name or id; another tenant's is "not found".
pub async fn find(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    reference: &str,
) -> Result<shares::Model, ApiError> {
    query(tenant, reference)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("share {reference:?}")))
}

/// [`find`] for a change: the row stays locked until the transaction ends.
pub async fn find_to_change(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    reference: &str,
) -> Result<shares::Model, ApiError> {
    query(tenant, reference)
        .lock_exclusive()
        .one(txn)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("share {reference:?}")))
}

pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<shares::Model>, ApiError> {
    let mut q = shares::Entity::find()
        .filter(shares::Column::TenantId.eq(tenant))
        .order_by_asc(shares::Column::Name);
    if let Some(after) = &paging.after {
        q = q.filter(shares::Column::Name.gt(after.as_str()));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

/// GiB over all the tenant's shares (those being deleted still count:
/// their data is still there).
pub async fn gib_of_tenant(db: &impl ConnectionTrait, tenant: Uuid) -> Result<u64, ApiError> {
    Ok(shares::Entity::find()
        .select_only()
        .column(shares::Column::SizeGib)
        .filter(shares::Column::TenantId.eq(tenant))
        .into_tuple::<i64>()
        .all(db)
        .await?
        .into_iter()
        .map(|g| u64::try_from(g).unwrap_or(0))
        .sum())
}

/// The shares whose directories a host keeps.
pub async fn kept_by(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<shares::Model>, ApiError> {
    Ok(shares::Entity::find()
        .filter(shares::Column::KeeperHostId.eq(host))
        .order_by_asc(shares::Column::Id)
        .all(db)
        .await?)
}

/// Every share with its keeper.
pub async fn keepers(db: &impl ConnectionTrait) -> Result<Vec<(Uuid, Option<Uuid>)>, ApiError> {
    Ok(shares::Entity::find()
        .select_only()
        .column(shares::Column::Id)
        .column(shares::Column::KeeperHostId)
        .into_tuple()
        .all(db)
        .await?)
}

/// A share's keeper moved from `from` (as read) to `to`; false when
/// another replica moved it first.
pub async fn move_keeper(
    txn: &DatabaseTransaction,
    share: Uuid,
    from: Option<Uuid>,
    to: Uuid,
) -> Result<bool, ApiError> {
    let q = shares::Entity::update_many()
        .col_expr(
            shares::Column::KeeperHostId,
            sea_orm::sea_query::Expr::value(Some(to)),
        )
        .filter(shares::Column::Id.eq(share));
    let q = match from {
        Some(f) => q.filter(shares::Column::KeeperHostId.eq(f)),
        None => q.filter(shares::Column::KeeperHostId.is_null()),
    };
    Ok(q.exec(txn).await?.rows_affected == 1)
}

/// Ready hosts that may keep shares, fewest kept first (then by name).
pub async fn keeper_candidates(db: &impl ConnectionTrait) -> Result<Vec<Uuid>, ApiError> {
    let hosts: Vec<(Uuid, String, Option<String>)> = hosts::Entity::find()
        .select_only()
        .column(hosts::Column::Id)
        .column(hosts::Column::Name)
        .column(hosts::Column::SharesStorage)
        .filter(hosts::Column::State.eq(HostState::Ready.as_str()))
        .filter(hosts::Column::SharesStorage.is_not_null())
        .order_by_asc(hosts::Column::Name)
        .into_tuple()
        .all(db)
        .await?;
    let mut kept: HashMap<Uuid, usize> = HashMap::new();
    for k in shares::Entity::find()
        .select_only()
        .column(shares::Column::KeeperHostId)
        .filter(shares::Column::KeeperHostId.is_not_null())
        .into_tuple::<Uuid>()
        .all(db)
        .await?
    {
        *kept.entry(k).or_default() += 1;
    }
    let mut ok: Vec<Uuid> = hosts
        .into_iter()
        .filter(|(_, _, s)| {
            let s = s.as_deref().and_then(|s| serde_json::from_str(s).ok());
            crate::domain::shares::keeps(s.as_ref())
        })
        .map(|(id, _, _)| id)
        .collect();
    ok.sort_by_key(|h| kept.get(h).copied().unwrap_or(0));
    Ok(ok)
}

/// Mounts of these VMs, with their shares, by VM (in mount order).
pub async fn mounts_of(
    db: &impl ConnectionTrait,
    vm_ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<(share_mounts::Model, shares::Model)>>, ApiError> {
    let mut out: HashMap<Uuid, Vec<(share_mounts::Model, shares::Model)>> = HashMap::new();
    if vm_ids.is_empty() {
        return Ok(out);
    }
    let mounts = share_mounts::Entity::find()
        .filter(share_mounts::Column::VmId.is_in(vm_ids.iter().copied()))
        .order_by_asc(share_mounts::Column::CreatedAt)
        .order_by_asc(share_mounts::Column::ShareId)
        .all(db)
        .await?;
    if mounts.is_empty() {
        return Ok(out);
    }
    let ids: Vec<Uuid> = mounts.iter().map(|m| m.share_id).collect();
    let by_id: HashMap<Uuid, shares::Model> = shares::Entity::find()
        .filter(shares::Column::Id.is_in(ids))
        .all(db)
        .await?
        .into_iter()
        .map(|s| (s.id, s))
        .collect();
    for m in mounts {
        if let Some(s) = by_id.get(&m.share_id) {
            out.entry(m.vm_id).or_default().push((m, s.clone()));
        }
    }
    Ok(out)
}

/// A share's mounts with their VMs' names, oldest first.
pub async fn mounts_of_share(
    db: &impl ConnectionTrait,
    share: Uuid,
) -> Result<Vec<(share_mounts::Model, Option<vms::Model>)>, ApiError> {
    let mounts = share_mounts::Entity::find()
        .filter(share_mounts::Column::ShareId.eq(share))
        .order_by_asc(share_mounts::Column::CreatedAt)
        .order_by_asc(share_mounts::Column::VmId)
        .all(db)
        .await?;
    let vms: HashMap<Uuid, vms::Model> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(mounts.iter().map(|m| m.vm_id)))
        .all(db)
        .await?
        .into_iter()
        .map(|v| (v.id, v))
        .collect();
    Ok(mounts
        .into_iter()
        .map(|m| {
            let vm = vms.get(&m.vm_id).cloned();
            (m, vm)
        })
        .collect())
}

/// How many VMs mount a share.
pub async fn mount_count(db: &impl ConnectionTrait, share: Uuid) -> Result<u64, ApiError> {
    Ok(share_mounts::Entity::find()
        .filter(share_mounts::Column::ShareId.eq(share))
        .count(db)
        .await?)
}

/// The hosts of the VMs that mount a share (to wake when it changes).
pub async fn hosts_mounting(db: &impl ConnectionTrait, share: Uuid) -> Result<Vec<Uuid>, ApiError> {
    let vm_ids: Vec<Uuid> = share_mounts::Entity::find()
        .select_only()
        .column(share_mounts::Column::VmId)
        .filter(share_mounts::Column::ShareId.eq(share))
        .into_tuple()
        .all(db)
        .await?;
    if vm_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut hosts: Vec<Uuid> = vms::Entity::find()
        .select_only()
        .column(vms::Column::HostId)
        .filter(vms::Column::Id.is_in(vm_ids))
        .filter(vms::Column::HostId.is_not_null())
        .into_tuple::<Uuid>()
        .all(db)
        .await?;
    hosts.sort();
    hosts.dedup();
    Ok(hosts)
}

/// A mount to make with a VM: the share, where, how, and its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    pub share: Uuid,
    pub name: String,
    pub path: String,
    pub read_only: bool,
    pub tag: String,
}

/// Mounts shares in a VM, in the caller's transaction. Each share must
/// still be available: its row is touched first (an `UPDATE … WHERE
/// state = 'available'`), so a deletion deciding meanwhile either waits
/// for this transaction or is seen by it. False when one was not.
pub async fn mount_new(
    txn: &DatabaseTransaction,
    vm: Uuid,
    mounts: &[PlannedMount],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<bool, ApiError> {
    for m in mounts {
        let touched = shares::Entity::update_many()
            .col_expr(
                shares::Column::State,
                sea_orm::sea_query::Expr::col(shares::Column::State).into(),
            )
            .filter(shares::Column::Id.eq(m.share))
            .filter(shares::Column::State.eq(ShareState::Available.as_str()))
            .exec(txn)
            .await?;
        if touched.rows_affected != 1 {
            return Ok(false);
        }
        share_mounts::Entity::insert(share_mounts::ActiveModel {
            share_id: Set(m.share),
            vm_id: Set(vm),
            path: Set(m.path.clone()),
            read_only: Set(m.read_only),
            tag: Set(m.tag.clone()),
            condition: Set(None),
            created_at: Set(now),
        })
        .exec_without_returning(txn)
        .await?;
    }
    Ok(true)
}

/// A VM's mounts go with it.
pub async fn unmount_all(txn: &DatabaseTransaction, vm: Uuid) -> Result<(), ApiError> {
    share_mounts::Entity::delete_many()
        .filter(share_mounts::Column::VmId.eq(vm))
        .exec(txn)
        .await?;
    Ok(())
}

/// A share's mount in a VM goes; false when there was none.
pub async fn unmount(txn: &DatabaseTransaction, share: Uuid, vm: Uuid) -> Result<bool, ApiError> {
    let r = share_mounts::Entity::delete_many()
        .filter(share_mounts::Column::ShareId.eq(share))
        .filter(share_mounts::Column::VmId.eq(vm))
        .exec(txn)
        .await?;
    Ok(r.rows_affected > 0)
}

/// Writes how a VM's mounts stand where the host's word differs.
pub async fn set_conditions(
    txn: &DatabaseTransaction,
    vm: Uuid,
    conditions: &[(Uuid, String)],
) -> Result<(), ApiError> {
    for (share, condition) in conditions {
        share_mounts::Entity::update_many()
            .col_expr(
                share_mounts::Column::Condition,
                sea_orm::sea_query::Expr::value(condition.clone()),
            )
            .filter(share_mounts::Column::ShareId.eq(*share))
            .filter(share_mounts::Column::VmId.eq(vm))
            .filter(
                sea_orm::Condition::any()
                    .add(share_mounts::Column::Condition.is_null())
                    .add(share_mounts::Column::Condition.ne(condition.clone())),
            )
            .exec(txn)
            .await?;
    }
    Ok(())
}
