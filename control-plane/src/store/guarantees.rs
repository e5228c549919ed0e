//! Queries behind guaranteed shares: who is promised what, and the
//! guaranteed GPU VMs that count against the promises.

use std::collections::BTreeMap;

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::domain::guarantees::{counts, Guarantees, Holding};
use crate::entity::{tenant_gpu_quotas, vms};
use crate::error::ApiError;
use crate::store::vms::{stored_spec, stored_state};

/// Every tenant's guarantees (models with none left out).
pub async fn all(db: &impl ConnectionTrait) -> Result<Guarantees, ApiError> {
    let rows = tenant_gpu_quotas::Entity::find()
        .filter(tenant_gpu_quotas::Column::Guarantee.gt(0))
        .all(db)
        .await?;
    let mut out = Guarantees::new();
    for r in rows {
        out.entry(r.tenant_id)
            .or_default()
            .insert(r.gpu_model, u64::try_from(r.guarantee).unwrap_or(0));
    }
    Ok(out)
}

/// GPUs promised per model, all tenants together.
pub fn promised(g: &Guarantees) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for per in g.values() {
        for (m, n) in per {
            *out.entry(m.clone()).or_default() += n;
        }
    }
    out
}

/// Whether any VM is marked borrowed (so marks may need clearing).
pub async fn any_borrowed(db: &impl ConnectionTrait) -> Result<bool, ApiError> {
    Ok(vms::Entity::find()
        .filter(vms::Column::BorrowedAt.is_not_null())
        .one(db)
        .await?
        .is_some())
}

/// The guaranteed GPU VMs holding their GPUs (of one tenant, or all),
/// reservations' VMs first, then oldest first, with their rows.
pub async fn held(
    db: &impl ConnectionTrait,
    tenant: Option<Uuid>,
) -> Result<Vec<(Holding, vms::Model)>, ApiError> {
    let mut q = vms::Entity::find().filter(vms::Column::HostId.is_not_null());
    if let Some(t) = tenant {
        q = q.filter(vms::Column::TenantId.eq(t));
    }
    let rows = q
        .order_by_asc(vms::Column::CreatedAt)
        .order_by_asc(vms::Column::Id)
        .all(db)
        .await?;
    // A reservation's VMs first: they use the tenant's share before its
    // other VMs do (the owners' reservations are within it), and so are
    // never the ones above it.
    let (mut rows, rest): (Vec<vms::Model>, Vec<vms::Model>) =
        rows.into_iter().partition(|v| v.reservation_id.is_some());
    rows.extend(rest);
    let mut out = Vec::new();
    for v in rows {
        let spec = stored_spec(&v)?;
        if !counts(stored_state(&v)?, &spec) {
            continue;
        }
        out.push((
            Holding {
                vm: v.id,
                tenant: v.tenant_id,
                model: spec.gpu_model.clone().unwrap_or_default(),
                gpus: u64::from(spec.gpus),
            },
            v,
        ));
    }
    Ok(out)
}
