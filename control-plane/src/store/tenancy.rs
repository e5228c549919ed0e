//! Queries over tenants' quotas.

use kumo_api_types::Quota;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::name_or_id;
use crate::entity::{tenant_gpu_quotas, tenant_quotas, tenants};
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
        q.public_ips = to_u32(b.public_ips);
    }
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
