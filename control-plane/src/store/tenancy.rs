//! Queries over tenants, their quotas and their memberships.

use kumo_api_types::{Quota, Role};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use super::name_or_id;
use crate::domain::paging::Paging;
use crate::entity::{memberships, tenant_gpu_quotas, tenant_quotas, tenants, users};
use crate::error::ApiError;

pub fn to_u32(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

pub async fn load(db: &impl ConnectionTrait, tenant_id: Uuid) -> Result<Quota, ApiError> {
    let base = tenant_quotas::Entity::find_by_id(tenant_id).one(db).await?;
    let gpus = tenant_gpu_quotas::Entity::find()
        .filter(tenant_gpu_quotas::Column::TenantId.eq(tenant_id))
        .all(db)
        .await?;
    let mut q = Quota::default();
    if let Some(b) = base {
        q.vcpus = to_u32(b.vcpus);
        q.memory_gib = to_u32(b.memory_gib);
        q.vms = to_u32(b.vms);
        q.segments = to_u32(b.segments);
        q.disk_gib = to_u32(b.disk_gib);
        q.roce_segments = to_u32(b.roce_segments);
        q.public_ips = to_u32(b.public_ips);
        q.volume_gib = to_u32(b.volume_gib);
        q.share_gib = to_u32(b.share_gib);
    }
    q.guarantee = gpus
        .iter()
        .filter(|g| g.guarantee > 0)
        .map(|g| (g.gpu_model.clone(), to_u32(g.guarantee)))
        .collect();
    q.gpus = gpus
        .into_iter()
        .map(|g| (g.gpu_model, to_u32(g.gpus)))
        .collect();
    Ok(q)
}

/// Finds a tenant by name or id. Lookups by a string that is neither a
/// valid name nor an id find nothing rather than erroring, so that a path
/// never says more than "not found".
pub async fn find_tenant(
    db: &impl ConnectionTrait,
    tenant_ref: &str,
) -> Result<Option<tenants::Model>, ApiError> {
    Ok(name_or_id(
        tenants::Entity::find(),
        tenants::Column::Id,
        tenants::Column::Name,
        tenant_ref,
    )
    .one(db)
    .await?)
}

/// One page of tenants by name: all of them, or only those of `only`.
pub async fn page(
    db: &impl ConnectionTrait,
    only: Option<Vec<Uuid>>,
    paging: &Paging,
) -> Result<Vec<tenants::Model>, ApiError> {
    let mut query = tenants::Entity::find().order_by_asc(tenants::Column::Name);
    if let Some(ids) = only {
        query = query.filter(tenants::Column::Id.is_in(ids));
    }
    if let Some(after) = &paging.after {
        query = query.filter(tenants::Column::Name.gt(after.as_str()));
    }
    Ok(query.limit(paging.fetch()).all(db).await?)
}

pub async fn tenant_by_id(
    db: &impl ConnectionTrait,
    id: Uuid,
) -> Result<Option<tenants::Model>, ApiError> {
    Ok(tenants::Entity::find_by_id(id).one(db).await?)
}

/// The GPUs a tenant may hold, all models together.
pub async fn gpu_quota_total(db: &impl ConnectionTrait, tenant: Uuid) -> Result<i64, ApiError> {
    Ok(tenant_gpu_quotas::Entity::find()
        .filter(tenant_gpu_quotas::Column::TenantId.eq(tenant))
        .all(db)
        .await?
        .iter()
        .map(|q| q.gpus)
        .sum())
}

/// Every membership of a user.
pub async fn memberships_of(
    db: &impl ConnectionTrait,
    user: Uuid,
) -> Result<Vec<memberships::Model>, ApiError> {
    Ok(memberships::Entity::find()
        .filter(memberships::Column::UserId.eq(user))
        .all(db)
        .await?)
}

pub async fn membership(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    user: Uuid,
) -> Result<Option<memberships::Model>, ApiError> {
    Ok(memberships::Entity::find_by_id((tenant, user))
        .one(db)
        .await?)
}

/// One page of a tenant's members with their users, by user id, after
/// the user id `after`.
pub async fn members_page(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    after: Option<Uuid>,
    paging: &Paging,
) -> Result<Vec<(memberships::Model, Option<users::Model>)>, ApiError> {
    let mut query = memberships::Entity::find()
        .filter(memberships::Column::TenantId.eq(tenant))
        .order_by_asc(memberships::Column::UserId);
    if let Some(after) = after {
        query = query.filter(memberships::Column::UserId.gt(after));
    }
    Ok(query
        .find_also_related(users::Entity)
        .limit(paging.fetch())
        .all(db)
        .await?)
}

/// How many owners a tenant has besides `leaving`.
pub async fn other_owners(
    db: &impl ConnectionTrait,
    tenant: Uuid,
    leaving: Uuid,
) -> Result<u64, ApiError> {
    Ok(memberships::Entity::find()
        .filter(memberships::Column::TenantId.eq(tenant))
        .filter(memberships::Column::Role.eq(Role::Owner.as_str()))
        .filter(memberships::Column::UserId.ne(leaving))
        .count(db)
        .await?)
}

/// Holds the tenant's row until the transaction ends (PostgreSQL; SQLite's
/// one connection serialises anyway), so two requests cannot both count
/// the same room in a quota.
pub async fn lock_for_quota(
    txn: &sea_orm::DatabaseTransaction,
    tenant_id: Uuid,
) -> Result<(), ApiError> {
    use sea_orm::QuerySelect;
    let mut q = tenants::Entity::find_by_id(tenant_id);
    if txn.get_database_backend() == sea_orm::DatabaseBackend::Postgres {
        q = q.lock_exclusive();
    }
    q.one(txn).await?;
    Ok(())
}
