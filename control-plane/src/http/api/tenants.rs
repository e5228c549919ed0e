use axum::extract::State;
use axum::http::StatusCode;
use chrono::Utc;
use kumo_api_types::{Page, PageParams, Role, Tenant, TenantCreate, TenantUpdate};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::{require_admin, tenant_access, tenant_ids_with_role};
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::{tenant_quotas, tenants};
use crate::error::{conflict_if_unique, ApiError};
use crate::http::extract::{Json, Path, Query};

pub fn to_api(t: tenants::Model) -> Tenant {
    Tenant {
        id: t.id,
        name: t.name,
        display_name: t.display_name,
        description: t.description,
        created_at: t.created_at,
        updated_at: t.updated_at,
    }
}

fn validate_texts(display_name: Option<&str>, description: Option<&str>) -> Result<(), ApiError> {
    if let Some(d) = display_name {
        names::text("display_name", d, 255)?;
        if d.trim().is_empty() {
            return Err(ApiError::field("display_name", "must not be blank"));
        }
    }
    if let Some(d) = description {
        names::text("description", d, 4000)?;
    }
    Ok(())
}

/// Create a tenant (platform admins).
#[utoipa::path(
    post, path = "/api/v1/tenants", tag = "tenants",
    request_body = TenantCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = Tenant), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<TenantCreate>,
) -> Result<(StatusCode, axum::Json<Tenant>), ApiError> {
    require_admin(&ctx.caller, "creating tenants")?;
    names::tenant_name("name", &body.name)?;
    validate_texts(body.display_name.as_deref(), body.description.as_deref())?;
    let now = Utc::now();
    let txn = st.db.begin().await?;
    let tenant = tenants::ActiveModel {
        id: Set(Uuid::now_v7()),
        name: Set(body.name.clone()),
        display_name: Set(body
            .display_name
            .clone()
            .unwrap_or_else(|| body.name.clone())),
        description: Set(body.description.clone().unwrap_or_default()),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(&txn)
    .await
    .map_err(|e| {
        conflict_if_unique(e, || {
            format!("a tenant named {:?} already exists", body.name)
        })
    })?;
    tenant_quotas::ActiveModel {
        tenant_id: Set(tenant.id),
        vcpus: Set(0),
        memory_gib: Set(0),
        vms: Set(0),
        segments: Set(0),
        public_ips: Set(0),
        updated_at: Set(now),
    }
    .insert(&txn)
    .await?;
    audit::record(&txn, &ctx, "tenant.create", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(to_api(tenant))))
}

/// List the tenants the caller can see (admins: all), by name.
#[utoipa::path(
    get, path = "/api/v1/tenants", tag = "tenants",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Tenant>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Tenant>>, ApiError> {
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = tenants::Entity::find().order_by_asc(tenants::Column::Name);
    if !ctx.caller.is_admin() {
        let ids = tenant_ids_with_role(&st.db, ctx.caller.user.id, Role::Viewer).await?;
        query = query.filter(tenants::Column::Id.is_in(ids));
    }
    if let Some(after) = &paging.after {
        query = query.filter(tenants::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |t| t.name.clone());
    Ok(axum::Json(Page {
        items: rows.into_iter().map(to_api).collect(),
        next_page_token: next,
    }))
}

/// Show a tenant (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 200, description = "The tenant", body = Tenant), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<axum::Json<Tenant>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    Ok(axum::Json(to_api(tenant)))
}

/// Change a tenant's display name or description (owners).
#[utoipa::path(
    patch, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    request_body = TenantUpdate,
    responses((status = 200, description = "The updated tenant", body = Tenant), Problems)
)]
pub async fn update(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<TenantUpdate>,
) -> Result<axum::Json<Tenant>, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Owner, "changing a tenant")?;
    validate_texts(body.display_name.as_deref(), body.description.as_deref())?;
    let txn = st.db.begin().await?;
    let mut active: tenants::ActiveModel = tenant.clone().into();
    if let Some(d) = body.display_name {
        active.display_name = Set(d);
    }
    if let Some(d) = body.description {
        active.description = Set(d);
    }
    active.updated_at = Set(Utc::now());
    let updated = active.update(&txn).await?;
    audit::record(&txn, &ctx, "tenant.update", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    Ok(axum::Json(to_api(updated)))
}

/// Delete a tenant with its memberships and quota (platform admins).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}", tag = "tenants",
    params(("tenant" = String, Path, description = "Tenant name or id")),
    responses((status = 204, description = "Deleted"), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
) -> Result<StatusCode, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require_admin("deleting a tenant")?;
    let txn = st.db.begin().await?;
    // The foreign key refuses it too; asking first gives the clear answer
    // on every database.
    let vms = crate::entity::vms::Entity::find()
        .filter(crate::entity::vms::Column::TenantId.eq(tenant.id))
        .count(&txn)
        .await?;
    if vms > 0 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} still has {vms} VM(s); delete them first",
            tenant.name
        )));
    }
    let segments = crate::entity::segments::Entity::find()
        .filter(crate::entity::segments::Column::TenantId.eq(tenant.id))
        .count(&txn)
        .await?;
    if segments > 0 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} still has {segments} segment(s); delete them first",
            tenant.name
        )));
    }
    tenants::Entity::delete_by_id(tenant.id)
        .exec(&txn)
        .await
        .map_err(|e| {
            if crate::error::is_fk_violation(&e) {
                ApiError::Conflict(format!(
                    "tenant {:?} still has VMs, clusters or segments; delete them first",
                    tenant.name
                ))
            } else {
                e.into()
            }
        })?;
    audit::record(&txn, &ctx, "tenant.delete", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
