//! Tenants' quotas: shown to their members, replaced by administrators.

use kumo_api_types::Quota;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::entity::{tenant_gpu_quotas, tenant_quotas};
use crate::error::ApiError;
use crate::store::tenancy::load;

/// A tenant's quota (any member).
pub async fn show(st: &AppState, actor: &Actor, tenant: &str) -> Result<Quota, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    load(&st.db, tenant.id).await
}

/// Replaces a tenant's quota (platform admins). GPU models left out get
/// zero. Guarantees are each within their cap, and never raised beyond
/// the GPUs in service (all tenants' guarantees of a model together);
/// VMs' borrowed marks follow at once.
pub async fn set(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &Quota,
) -> Result<Quota, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require_admin("setting a quota (ask a platform administrator for more)")?;
    crate::domain::quota::validate(body)?;
    crate::domain::guarantees::validate(body)?;
    let txn = st.db.begin().await?;
    crate::app::guarantees::check_promise(st, &txn, tenant.id, &body.guarantee).await?;
    let row = tenant_quotas::ActiveModel {
        tenant_id: Set(tenant.id),
        vcpus: Set(i64::from(body.vcpus)),
        memory_gib: Set(i64::from(body.memory_gib)),
        vms: Set(i64::from(body.vms)),
        segments: Set(i64::from(body.segments)),
        disk_gib: Set(i64::from(body.disk_gib)),
        roce_segments: Set(i64::from(body.roce_segments)),
        public_ips: Set(i64::from(body.public_ips)),
        volume_gib: Set(i64::from(body.volume_gib)),
        share_gib: Set(i64::from(body.share_gib)),
        updated_at: Set(actor.at),
    };
    if tenant_quotas::Entity::find_by_id(tenant.id)
        .one(&txn)
        .await?
        .is_some()
    {
        row.update(&txn).await?;
    } else {
        row.insert(&txn).await?;
    }
    tenant_gpu_quotas::Entity::delete_many()
        .filter(tenant_gpu_quotas::Column::TenantId.eq(tenant.id))
        .exec(&txn)
        .await?;
    for (model, n) in &body.gpus {
        tenant_gpu_quotas::ActiveModel {
            tenant_id: Set(tenant.id),
            gpu_model: Set(model.clone()),
            gpus: Set(i64::from(*n)),
            guarantee: Set(i64::from(body.guarantee.get(model).copied().unwrap_or(0))),
        }
        .insert(&txn)
        .await?;
    }
    audit::record(&txn, actor, "quota.set", Some(&tenant), &tenant.name).await?;
    // A model newly promised (or no longer) changes everyone's marks.
    let woken = crate::app::guarantees::remark(&txn, None, actor.at).await?;
    let stored = load(&txn, tenant.id).await?;
    txn.commit().await?;
    for h in woken {
        st.capacity.refresh_host(&st.db, h).await?;
        st.signals.notify(h);
    }
    Ok(stored)
}
