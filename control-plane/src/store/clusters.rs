//! Queries over clusters and their members.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use kumo_api_types::{ClusterHealth, DeviceState, VmSpec};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, NotSet,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Set,
};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::entity::{allocations, cluster_events, clusters, device_health, tenants, vms};
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
/// A cluster's hostfile and, when its members have addresses, the
/// `/etc/hosts` lines that name them.
pub async fn cluster_files(
    db: &impl ConnectionTrait,
    c: &clusters::Model,
) -> Result<(String, Option<String>), ApiError> {
    let spec = stored_cluster_spec(c)?;
    let members: Vec<(String, Option<String>)> = members_of(db, c)
        .await?
        .into_iter()
        .map(|(v, a)| (v.name, a))
        .collect();
    Ok((hostfile(&members, spec.gpus), hosts_block(&members)))
}

/// `ADDRESS NAME` lines for the members with an address; `None` when
/// none has one.
pub fn hosts_block(members: &[(String, Option<String>)]) -> Option<String> {
    let lines: String = members
        .iter()
        .filter_map(|(name, addr)| Some(format!("{}\t{name}\n", addr.as_deref()?)))
        .collect();
    (!lines.is_empty()).then_some(lines)
}

pub fn stored_cluster_spec(c: &clusters::Model) -> Result<VmSpec, ApiError> {
    serde_json::from_str(&c.spec)
        .map_err(|e| ApiError::Internal(format!("cluster {} spec: {e}", c.id)))
}

/// Clusters keeping spares.
pub async fn with_spares(db: &impl ConnectionTrait) -> Result<Vec<clusters::Model>, ApiError> {
    Ok(clusters::Entity::find()
        .filter(clusters::Column::Spares.gt(0))
        .all(db)
        .await?)
}

/// A tenant's clusters' spares: each member spec (with the model the
/// spares were kept for) and how many.
pub async fn spares_of(
    db: &impl ConnectionTrait,
    tenant: Uuid,
) -> Result<Vec<(VmSpec, u32)>, ApiError> {
    let rows = clusters::Entity::find()
        .filter(clusters::Column::TenantId.eq(tenant))
        .filter(clusters::Column::Spares.gt(0))
        .all(db)
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for c in rows {
        let mut spec = stored_cluster_spec(&c)?;
        if c.spare_model.is_some() {
            spec.gpu_model = c.spare_model.clone();
        }
        out.push((spec, u32::try_from(c.spares).unwrap_or(0)));
    }
    Ok(out)
}

/// The cluster keeps no spares any more (it is being deleted).
pub async fn drop_spares(txn: &DatabaseTransaction, cluster: Uuid) -> Result<(), ApiError> {
    clusters::Entity::update_many()
        .col_expr(clusters::Column::Spares, sea_orm::sea_query::Expr::value(0))
        .filter(clusters::Column::Id.eq(cluster))
        .exec(txn)
        .await?;
    Ok(())
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
        forget(txn, c).await?;
    }
    Ok(())
}

/// A cluster's row goes, with its events.
pub async fn forget(txn: &DatabaseTransaction, cluster: Uuid) -> Result<(), ApiError> {
    cluster_events::Entity::delete_many()
        .filter(cluster_events::Column::ClusterId.eq(cluster))
        .exec(txn)
        .await?;
    clusters::Entity::delete_by_id(cluster).exec(txn).await?;
    Ok(())
}

/// Records an event of a cluster's life.
pub async fn event(
    db: &impl ConnectionTrait,
    c: &clusters::Model,
    at: DateTime<Utc>,
    kind: &str,
    message: impl Into<String>,
) -> Result<(), ApiError> {
    cluster_events::ActiveModel {
        id: NotSet,
        cluster_id: Set(c.id),
        tenant_id: Set(c.tenant_id),
        at: Set(at),
        kind: Set(kind.to_owned()),
        message: Set(message.into()),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// One page of a cluster's events, newest first, older than `before`.
pub async fn events_page(
    db: &impl ConnectionTrait,
    cluster: Uuid,
    before: Option<i64>,
    paging: &Paging,
) -> Result<Vec<cluster_events::Model>, ApiError> {
    let mut query = cluster_events::Entity::find()
        .filter(cluster_events::Column::ClusterId.eq(cluster))
        .order_by_desc(cluster_events::Column::Id);
    if let Some(before) = before {
        query = query.filter(cluster_events::Column::Id.lt(before));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

/// Every cluster, for the health pass.
pub async fn all(db: &impl ConnectionTrait) -> Result<Vec<clusters::Model>, ApiError> {
    Ok(clusters::Entity::find()
        .order_by_asc(clusters::Column::Id)
        .all(db)
        .await?)
}

/// Every cluster member VM of these clusters.
pub async fn members_of_all(
    db: &impl ConnectionTrait,
    clusters: &[Uuid],
) -> Result<Vec<vms::Model>, ApiError> {
    let mut out = Vec::new();
    for chunk in clusters.chunks(500) {
        out.extend(
            vms::Entity::find()
                .filter(vms::Column::ClusterId.is_in(chunk.iter().copied()))
                .all(db)
                .await?,
        );
    }
    Ok(out)
}

/// The devices (GPUs and NICs) these VMs hold that are not healthy:
/// `(PCI address, kind, state)` per VM.
pub async fn troubled_devices(
    db: &impl ConnectionTrait,
    vms: &[Uuid],
) -> Result<HashMap<Uuid, Vec<(String, String, DeviceState)>>, ApiError> {
    let unwell: HashMap<(Uuid, String), device_health::Model> = device_health::Entity::find()
        .filter(device_health::Column::State.ne(DeviceState::Healthy.as_str()))
        .all(db)
        .await?
        .into_iter()
        .map(|d| ((d.host_id, d.bdf.clone()), d))
        .collect();
    let mut out: HashMap<Uuid, Vec<(String, String, DeviceState)>> = HashMap::new();
    if unwell.is_empty() {
        return Ok(out);
    }
    for chunk in vms.chunks(500) {
        let held = allocations::Entity::find()
            .filter(allocations::Column::VmId.is_in(chunk.iter().copied()))
            .filter(allocations::Column::Kind.ne("cpu"))
            .all(db)
            .await?;
        for a in held {
            if let Some(d) = unwell.get(&(a.host_id, a.key.clone())) {
                let state = crate::store::device_health::stored_state(d)?;
                out.entry(a.vm_id)
                    .or_default()
                    .push((d.bdf.clone(), d.kind.clone(), state));
            }
        }
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(out)
}

/// A repair placed new members: the cluster is `repairing` until they run.
pub async fn mark_repairing(db: &impl ConnectionTrait, cluster: Uuid) -> Result<(), ApiError> {
    use sea_orm::sea_query::Expr;
    clusters::Entity::update_many()
        .col_expr(clusters::Column::Repairing, Expr::value(true))
        .filter(clusters::Column::Id.eq(cluster))
        .exec(db)
        .await?;
    Ok(())
}

/// A cluster's health moves from what was read to what was assessed;
/// answers whether this call moved it (another replica may have).
pub async fn set_health(
    db: &impl ConnectionTrait,
    c: &clusters::Model,
    health: ClusterHealth,
    problems: &str,
    repairing: bool,
    since: Option<DateTime<Utc>>,
) -> Result<bool, ApiError> {
    use sea_orm::sea_query::Expr;
    let r = clusters::Entity::update_many()
        .col_expr(clusters::Column::Health, Expr::value(health.as_str()))
        .col_expr(clusters::Column::Problems, Expr::value(problems))
        .col_expr(clusters::Column::Repairing, Expr::value(repairing))
        .col_expr(clusters::Column::HealthSince, Expr::value(since))
        .filter(clusters::Column::Id.eq(c.id))
        .filter(clusters::Column::Health.eq(c.health.clone()))
        .filter(clusters::Column::Problems.eq(c.problems.clone()))
        .filter(clusters::Column::Repairing.eq(c.repairing))
        .exec(db)
        .await?;
    Ok(r.rows_affected == 1)
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

/// Whether the VMs of `cluster` (if any) must share one scalable unit
/// (`single_su = required`).
pub async fn keeps_to_one_unit(
    db: &impl ConnectionTrait,
    cluster: Option<Uuid>,
) -> Result<bool, ApiError> {
    Ok(match cluster {
        Some(c) => by_id(db, c)
            .await?
            .is_some_and(|c| c.single_su == kumo_api_types::SingleSu::Required.as_str()),
        None => false,
    })
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
