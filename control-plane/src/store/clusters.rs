//! Queries over clusters and their members.

use kumo_api_types::VmSpec;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::entity::{clusters, tenants, vms};
use crate::error::ApiError;

/// The MPI hostfile of a cluster: its members by name, one per line, with
/// one slot per GPU (one for CPU-only members). It depends only on the
/// cluster's definition, so every member's copy is the same and never
/// changes under it.
/// One line per member in member order: its address on the cluster's
/// first segment when it has one (MPI needs no DNS then), else its name.
pub fn hostfile(members: &[(String, Option<String>)], gpus: u32) -> String {
    members
        .iter()
        .map(|(name, addr)| {
            format!(
                "{} slots={}\n",
                addr.as_deref().unwrap_or(name),
                gpus.max(1)
            )
        })
        .collect()
}

/// A cluster's members in member order, each with its first address.
pub async fn members_of(
    db: &impl ConnectionTrait,
    c: &clusters::Model,
) -> Result<Vec<(vms::Model, Option<String>)>, ApiError> {
    let mut rows = vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(c.id))
        .all(db)
        .await?;
    rows.sort_by_key(|v| member_index(&c.name, &v.name));
    let ids: Vec<Uuid> = rows.iter().map(|v| v.id).collect();
    let nets = crate::store::segments::networks_of(db, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|v| {
            let addr = nets
                .get(&v.id)
                .and_then(|n| n.first())
                .map(|n| n.ip.clone());
            (v, addr)
        })
        .collect())
}

/// The MPI hostfile of a cluster as it is now.
pub async fn cluster_hostfile(
    db: &impl ConnectionTrait,
    c: &clusters::Model,
) -> Result<String, ApiError> {
    let spec = stored_cluster_spec(c)?;
    let members: Vec<(String, Option<String>)> = members_of(db, c)
        .await?
        .into_iter()
        .map(|(v, a)| (v.name, a))
        .collect();
    Ok(hostfile(&members, spec.gpus))
}

pub fn stored_cluster_spec(c: &clusters::Model) -> Result<VmSpec, ApiError> {
    serde_json::from_str(&c.spec)
        .map_err(|e| ApiError::Internal(format!("cluster {} spec: {e}", c.id)))
}

/// Forgets the cluster once its last member VM is gone (same transaction).
pub async fn member_gone(txn: &DatabaseTransaction, vm: &vms::Model) -> Result<(), ApiError> {
    let Some(c) = vm.cluster_id else {
        return Ok(());
    };
    let left = vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(c))
        .count(txn)
        .await?;
    if left == 0 {
        clusters::Entity::delete_by_id(c).exec(txn).await?;
    }
    Ok(())
}

/// Members ordered by their index (`NAME-2` before `NAME-10`).
pub fn member_index(cluster: &str, vm: &str) -> u64 {
    vm.strip_prefix(cluster)
        .and_then(|s| s.strip_prefix('-'))
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

pub async fn find(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    cluster: &str,
) -> Result<clusters::Model, ApiError> {
    crate::store::name_or_id(
        clusters::Entity::find().filter(clusters::Column::TenantId.eq(tenant.id)),
        clusters::Column::Id,
        clusters::Column::Name,
        cluster,
    )
    .one(db)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("cluster {cluster:?}")))
}

pub async fn by_id(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<clusters::Model>, ApiError> {
    Ok(clusters::Entity::find_by_id(id).one(db).await?)
}

/// A tenant's cluster by exact name.
pub async fn named(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    name: &str,
) -> Result<Option<clusters::Model>, ApiError> {
    Ok(clusters::Entity::find()
        .filter(clusters::Column::TenantId.eq(tenant))
        .filter(clusters::Column::Name.eq(name))
        .one(db)
        .await?)
}

/// Clusters' names by id.
pub async fn names_by_id(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<std::collections::HashMap<Uuid, String>, ApiError> {
    Ok(clusters::Entity::find()
        .filter(clusters::Column::Id.is_in(ids))
        .all(db)
        .await?
        .into_iter()
        .map(|c| (c.id, c.name))
        .collect())
}

/// One page of a tenant's clusters, by name.
pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<clusters::Model>, ApiError> {
    let mut query = clusters::Entity::find()
        .filter(clusters::Column::TenantId.eq(tenant))
        .order_by_asc(clusters::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(clusters::Column::Name.gt(after.as_str()));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

/// A cluster's member VMs for a change, locked until the transaction ends.
pub async fn members_to_change(
    txn: &DatabaseTransaction,
    cluster: Uuid,
) -> Result<Vec<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(cluster))
        .order_by_asc(vms::Column::Id)
        .lock_exclusive()
        .all(txn)
        .await?)
}

/// Sets a cluster's state, inside the caller's transaction.
pub async fn set_state(
    txn: &DatabaseTransaction,
    cluster: Uuid,
    state: crate::domain::states::ClusterState,
) -> Result<(), ApiError> {
    use crate::domain::states::StoredText;
    use sea_orm::sea_query::Expr;
    clusters::Entity::update_many()
        .col_expr(clusters::Column::State, Expr::value(state.to_text()))
        .filter(clusters::Column::Id.eq(cluster))
        .exec(txn)
        .await?;
    Ok(())
}
