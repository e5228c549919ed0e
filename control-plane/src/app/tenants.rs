//! Tenant use cases: platform admins create and delete them, owners change
//! them, members see their own.

use kumo_api_types::{
    Page, PageParams, Role, SegmentCreate, SegmentKind, Tenant, TenantCreate, TenantUpdate,
    DEFAULT_SEGMENT,
};
use sea_orm::{ActiveModelTrait, EntityTrait, Set, TransactionTrait};
use uuid::Uuid;

use crate::app::access::{require_admin, tenant_access, tenant_ids_with_role};
use crate::app::audit;
use crate::config::DefaultSegment;
use crate::context::{Actor, AppState};
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{tenant_quotas, tenants};
use crate::error::{conflict_if_unique, ApiError};

/// A tenant as the API shows it.
pub fn view(t: tenants::Model) -> Tenant {
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

/// A platform admin creates a tenant, with an empty quota, and its
/// default segment where the platform has one (`[network]
/// default_segment`).
pub async fn create(st: &AppState, actor: &Actor, body: &TenantCreate) -> Result<Tenant, ApiError> {
    require_admin(&actor.caller, "creating tenants")?;
    names::tenant_name("name", &body.name)?;
    validate_texts(body.display_name.as_deref(), body.description.as_deref())?;
    let now = st.config.clock.now();
    let default_segment = st.config.network.default_segment.clone();
    // The quota holds the default segment (and its egress address): a
    // tenant is never over its quota from the start.
    let segments = i64::from(default_segment.is_some());
    let public_ips = i64::from(default_segment.as_ref().is_some_and(|d| d.egress));
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
        disk_gib: Set(0),
        segments: Set(segments),
        roce_segments: Set(0),
        public_ips: Set(public_ips),
        volume_gib: Set(0),
        share_gib: Set(0),
        updated_at: Set(now),
    }
    .insert(&txn)
    .await?;
    audit::record(&txn, actor, "tenant.create", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    if let Some(d) = default_segment {
        let (made, egress) = make_default_segment(st, actor, &tenant.name, &d).await;
        // The quota holds what was made, no more.
        if (i64::from(made), i64::from(egress)) != (segments, public_ips) {
            let quota = tenant_quotas::ActiveModel {
                tenant_id: Set(tenant.id),
                segments: Set(i64::from(made)),
                public_ips: Set(i64::from(egress)),
                ..Default::default()
            };
            quota.update(&st.db).await?;
        }
    }
    Ok(view(tenant))
}

/// The new tenant's default segment: with egress when so configured and
/// the tenant can hold the address (points, the pools), else without —
/// the owner turns it on later (`kumo segment update default --egress`).
/// A segment that cannot be made at all leaves the tenant as it is (it
/// is made; the reason is logged): the tenant makes its own segments.
/// Answers whether it was made, and with egress.
async fn make_default_segment(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    d: &DefaultSegment,
) -> (bool, bool) {
    let body = |egress| SegmentCreate {
        name: DEFAULT_SEGMENT.into(),
        kind: SegmentKind::Ethernet,
        cidr: d.cidr.clone(),
        gateway: None,
        mtu: None,
        ingress: Vec::new(),
        egress: Some(egress),
    };
    let mut made = crate::app::segments::create(st, actor, tenant, &body(d.egress)).await;
    if let (Err(e), true) = (&made, d.egress) {
        tracing::info!(tenant, error = %e, "default segment made without egress");
        made = crate::app::segments::create(st, actor, tenant, &body(false)).await;
    }
    match made {
        Ok(s) => (true, s.egress),
        Err(e) => {
            tracing::warn!(tenant, error = %e, "default segment not made");
            (false, false)
        }
    }
}

/// One page of the tenants the actor can see (admins: all), by name.
pub async fn list(
    st: &AppState,
    actor: &Actor,
    params: &PageParams,
) -> Result<Page<Tenant>, ApiError> {
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let only = if actor.caller.is_admin() {
        None
    } else {
        Some(tenant_ids_with_role(&st.db, actor.caller.user.id, Role::Viewer).await?)
    };
    let rows = crate::store::tenancy::page(&st.db, only, &paging).await?;
    let (rows, next) = paging.finish(rows, |t| t.name.clone());
    Ok(Page {
        items: rows.into_iter().map(view).collect(),
        next_page_token: next,
    })
}

/// A tenant the actor is a member of.
pub async fn show(st: &AppState, actor: &Actor, tenant: &str) -> Result<Tenant, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    Ok(view(tenant))
}

/// An owner changes a tenant's display name or description.
pub async fn update(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: TenantUpdate,
) -> Result<Tenant, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
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
    active.updated_at = Set(st.config.clock.now());
    let updated = active.update(&txn).await?;
    audit::record(&txn, actor, "tenant.update", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    Ok(view(updated))
}

/// A platform admin deletes a tenant with its memberships and quota (and
/// its default segment, when that is all it has left); it must have no
/// VMs or other segments left.
pub async fn delete(st: &AppState, actor: &Actor, tenant: &str) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require_admin("deleting a tenant")?;
    let txn = st.db.begin().await?;
    // The foreign key refuses it too; asking first gives the clear answer
    // on every database.
    let vms = crate::store::vms::count_of(&txn, tenant.id).await?;
    if vms > 0 {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} still has {vms} VM(s); delete them first",
            tenant.name
        )));
    }
    // Its default segment goes with it when nothing else is left and no
    // VM is on it; in this transaction, so a refusal below (a volume, a
    // share, an address still held) leaves it as it was.
    let mut edge = None;
    if crate::store::segments::count_of(&txn, tenant.id, None).await? == 1 {
        let default = crate::store::segments::named(&txn, tenant.id, DEFAULT_SEGMENT).await?;
        if let Some(d) = default.filter(|d| d.kind == SegmentKind::Ethernet.to_text()) {
            edge = crate::app::segments::remove(st, &txn, actor, &tenant, d).await?;
        }
    }
    let segments = crate::store::segments::count_of(&txn, tenant.id, None).await?;
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
    audit::record(&txn, actor, "tenant.delete", Some(&tenant), &tenant.name).await?;
    txn.commit().await?;
    if let Some(h) = edge {
        st.signals.notify(h);
    }
    Ok(())
}
