//! Queries of reservations: a tenant's by name, those not ended, the hosts
//! they hold, and the VMs that run on them.

use std::collections::HashMap;

use kumo_api_types::{EndPolicy, ReservationState, VmState};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use crate::domain::paging::Paging;
use crate::entity::{reservation_hosts, reservations, tenants, vms};
use crate::error::ApiError;
use crate::store::vms::stored_spec;

pub fn stored_state(r: &reservations::Model) -> Result<ReservationState, ApiError> {
    crate::domain::states::decode("reservations", r.id, &r.state)
}

pub fn stored_policy(r: &reservations::Model) -> Result<EndPolicy, ApiError> {
    crate::domain::states::decode("reservations", r.id, &r.end_policy)
}

fn query(tenant: &tenants::Model, reference: &str) -> sea_orm::Select<reservations::Entity> {
    super::name_or_id(
        reservations::Entity::find().filter(reservations::Column::TenantId.eq(tenant.id)),
        reservations::Column::Id,
        reservations::Column::Name,
        reference,
    )
}

/// A tenant's reservation by name or id; another tenant's is "not found".
pub async fn find(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    reference: &str,
) -> Result<reservations::Model, ApiError> {
    query(tenant, reference)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("reservation {reference:?}")))
}

pub async fn page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    paging: &Paging,
) -> Result<Vec<reservations::Model>, ApiError> {
    let mut q = reservations::Entity::find()
        .filter(reservations::Column::TenantId.eq(tenant))
        .order_by_asc(reservations::Column::Name);
    if let Some(after) = &paging.after {
        q = q.filter(reservations::Column::Name.gt(after.as_str()));
    }
    Ok(q.limit(paging.fetch()).all(db).await?)
}

/// Reservations not ended (of one tenant, or everyone's), oldest start
/// first.
pub async fn live(
    db: &impl ConnectionTrait,
    tenant: Option<Uuid>,
) -> Result<Vec<reservations::Model>, ApiError> {
    let mut q = reservations::Entity::find()
        .filter(reservations::Column::State.ne(ReservationState::Ended.as_str()));
    if let Some(t) = tenant {
        q = q.filter(reservations::Column::TenantId.eq(t));
    }
    Ok(q.order_by_asc(reservations::Column::StartsAt)
        .order_by_asc(reservations::Column::Id)
        .all(db)
        .await?)
}

/// Every held host: host → reservation.
pub async fn held_hosts(db: &impl ConnectionTrait) -> Result<HashMap<Uuid, Uuid>, ApiError> {
    Ok(reservation_hosts::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|r| (r.host_id, r.reservation_id))
        .collect())
}

/// Which of `hosts` reservations hold: host → reservation.
pub async fn holding(
    db: &impl ConnectionTrait,
    hosts: &[Uuid],
) -> Result<HashMap<Uuid, Uuid>, ApiError> {
    Ok(reservation_hosts::Entity::find()
        .filter(reservation_hosts::Column::HostId.is_in(hosts.iter().copied()))
        .all(db)
        .await?
        .into_iter()
        .map(|r| (r.host_id, r.reservation_id))
        .collect())
}

/// The VMs that run on reservation `id` (not deleted).
pub async fn vms_of(db: &impl ConnectionTrait, id: Uuid) -> Result<Vec<vms::Model>, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::ReservationId.eq(id))
        .filter(vms::Column::State.ne(VmState::Deleted.as_str()))
        .all(db)
        .await?)
}

/// GPUs the VMs of reservation `id` take (pending ones too: they will).
pub async fn used_gpus(db: &impl ConnectionTrait, id: Uuid) -> Result<u64, ApiError> {
    let mut n = 0;
    for v in vms_of(db, id).await? {
        n += u64::from(stored_spec(&v)?.gpus);
    }
    Ok(n)
}

/// The hosts reservation `id` holds.
pub async fn hosts_of(db: &impl ConnectionTrait, id: Uuid) -> Result<Vec<Uuid>, ApiError> {
    Ok(reservation_hosts::Entity::find()
        .select_only()
        .column(reservation_hosts::Column::HostId)
        .filter(reservation_hosts::Column::ReservationId.eq(id))
        .into_tuple()
        .all(db)
        .await?)
}
