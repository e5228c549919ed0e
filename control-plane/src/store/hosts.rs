//! Queries over hosts: the stored topology and state of a row, a host by
//! name or id, the devices held on hosts, and revision bumps that wake an
//! agent.

use kumo_api_types::HostState;
use kumo_topology::HostTopology;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use uuid::Uuid;

use crate::domain::states::decode;
use crate::entity::{allocations, hosts};
use crate::error::ApiError;

/// Marks a host's desired state as changed, inside the caller's transaction.
pub async fn bump_revision(txn: &DatabaseTransaction, host: Uuid) -> Result<(), ApiError> {
    use sea_orm::sea_query::Expr;
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::Revision,
            Expr::col(hosts::Column::Revision).add(1),
        )
        .filter(hosts::Column::Id.eq(host))
        .exec(txn)
        .await?;
    Ok(())
}

/// A stored topology; a row that does not parse is a bug, reported as such.
pub fn stored_topology(h: &hosts::Model) -> Result<HostTopology, ApiError> {
    serde_json::from_str(&h.topology)
        .map_err(|e| ApiError::Internal(format!("host {} topology: {e}", h.name)))
}

/// What keeps a host from passing devices through (empty: ready). KVM
/// hosts back guest memory with hugepages; TCG and test hosts do not.
pub fn passthrough_problems(h: &hosts::Model, topo: &HostTopology) -> Vec<String> {
    kumo_topology::readiness::problems(topo, h.virt_type == "kvm")
}

pub fn host_state(h: &hosts::Model) -> Result<HostState, ApiError> {
    decode("hosts", &h.name, &h.state)
}

pub async fn held(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<Vec<allocations::Model>, ApiError> {
    Ok(allocations::Entity::find()
        .filter(allocations::Column::HostId.eq(host))
        .all(db)
        .await?)
}

/// Every allocation of the given hosts, by host, in one query.
pub async fn held_by_host(
    db: &impl ConnectionTrait,
    hosts: &[Uuid],
) -> Result<std::collections::HashMap<Uuid, Vec<allocations::Model>>, ApiError> {
    let mut by_host: std::collections::HashMap<Uuid, Vec<allocations::Model>> =
        std::collections::HashMap::new();
    for a in allocations::Entity::find()
        .filter(allocations::Column::HostId.is_in(hosts.iter().copied()))
        .all(db)
        .await?
    {
        by_host.entry(a.host_id).or_default().push(a);
    }
    Ok(by_host)
}

/// Every host's name, by id.
pub async fn names(
    db: &impl ConnectionTrait,
) -> Result<std::collections::HashMap<Uuid, String>, ApiError> {
    use sea_orm::QuerySelect;
    Ok(hosts::Entity::find()
        .select_only()
        .column(hosts::Column::Id)
        .column(hosts::Column::Name)
        .into_tuple::<(Uuid, String)>()
        .all(db)
        .await?
        .into_iter()
        .collect())
}

pub async fn find(
    db: &impl ConnectionTrait,
    host_ref: &str,
) -> Result<Option<hosts::Model>, ApiError> {
    Ok(super::name_or_id(
        hosts::Entity::find(),
        hosts::Column::Id,
        hosts::Column::Name,
        host_ref,
    )
    .one(db)
    .await?)
}

/// The state of a host that answers: an operator's drain outlives the
/// host going silent and coming back.
pub fn reachable_state(drained: bool) -> HostState {
    if drained {
        HostState::Draining
    } else {
        HostState::Ready
    }
}

pub async fn by_id(db: &impl ConnectionTrait, id: Uuid) -> Result<Option<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find_by_id(id).one(db).await?)
}

/// The hosts with these ids, in one query.
pub async fn by_ids(
    db: &impl ConnectionTrait,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<Vec<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find()
        .filter(hosts::Column::Id.is_in(ids))
        .all(db)
        .await?)
}

/// Up to `limit` hosts by name, after the name `after`.
pub async fn page(
    db: &impl ConnectionTrait,
    after: Option<&str>,
    limit: u64,
) -> Result<Vec<hosts::Model>, ApiError> {
    let mut query = hosts::Entity::find().order_by_asc(hosts::Column::Name);
    if let Some(after) = after {
        query = query.filter(hosts::Column::Name.gt(after));
    }
    Ok(query.limit(limit).all(db).await?)
}

/// The hosts whose agents reported segments they could not set up.
pub async fn with_segment_faults(db: &impl ConnectionTrait) -> Result<Vec<hosts::Model>, ApiError> {
    Ok(hosts::Entity::find()
        .filter(hosts::Column::SegmentFaults.is_not_null())
        .all(db)
        .await?)
}
