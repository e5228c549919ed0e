use axum::extract::State;
use chrono::Utc;
use kumo_api_types::Quota;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};

use super::Problems;
use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::names;
use crate::entity::{tenant_gpu_quotas, tenant_quotas};
use crate::error::ApiError;
use crate::http::extract::{Json, Path};
use crate::store::tenancy::load;

/// No single limit may exceed this: larger numbers are typos, and they must
/// fit every database's integer.
pub const MAX_LIMIT: u32 = 1_000_000;
pub const MAX_GPU_MODELS: usize = 64;

pub fn validate(q: &Quota) -> Result<(), ApiError> {
    if q.gpus.len() > MAX_GPU_MODELS {
        return Err(ApiError::field(
            "gpus",
            format!("at most {MAX_GPU_MODELS} GPU models"),
        ));
    }
    for (model, n) in &q.gpus {
        names::gpu_model(&format!("gpus.{model}"), model)?;
        if *n > MAX_LIMIT {
            return Err(ApiError::field(
                &format!("gpus.{model}"),
                format!("at most {MAX_LIMIT}"),
            ));
        }
    }
    for (field, v) in [
        ("vcpus", q.vcpus),
        ("memory_gib", q.memory_gib),
        ("vms", q.vms),
        ("segments", q.segments),
        ("public_ips", q.public_ips),
    ] {
        if v > MAX_LIMIT {
            return Err(ApiError::field(field, format!("at most {MAX_LIMIT}")));
        }
    }
    Ok(())
}

/// Show a tenant's quota (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/quota", tag = "quota",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The quota", body = Quota), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Quota>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    Ok(axum::Json(load(&st.db, tenant.id).await?))
}

/// Replace a tenant's quota (platform admins). GPU models left out get zero.
#[utoipa::path(
    put, path = "/api/v1/tenants/{tenant}/quota", tag = "quota",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = Quota,
    responses((status = 200, description = "The new quota", body = Quota), Problems)
)]
pub async fn set(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<Quota>,
) -> Result<axum::Json<Quota>, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require_admin("setting a quota (ask a platform administrator for more)")?;
    validate(&body)?;
    let txn = st.db.begin().await?;
    let row = tenant_quotas::ActiveModel {
        tenant_id: Set(tenant.id),
        vcpus: Set(i64::from(body.vcpus)),
        memory_gib: Set(i64::from(body.memory_gib)),
        vms: Set(i64::from(body.vms)),
        segments: Set(i64::from(body.segments)),
        public_ips: Set(i64::from(body.public_ips)),
        updated_at: Set(Utc::now()),
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
        }
        .insert(&txn)
        .await?;
    }
    audit::record(&txn, &ctx, "quota.set", Some(&tenant), &tenant.name).await?;
    let stored = load(&txn, tenant.id).await?;
    txn.commit().await?;
    Ok(axum::Json(stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded_and_models_named() {
        let mut q = Quota::default();
        q.gpus.insert("H100-SXM5-80GB".into(), 16);
        assert!(validate(&q).is_ok());
        q.vcpus = MAX_LIMIT + 1;
        assert!(validate(&q).is_err());
        let mut q = Quota::default();
        q.gpus.insert("bad model".into(), 1);
        assert!(validate(&q).is_err());
    }
}
