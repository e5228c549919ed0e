//! Cluster use cases: a training cluster created whole.

use kumo_api_types::{ClusterCreate, Role};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::admission::{admit, Member, NewCluster};
use crate::app::vms::prepare;
use crate::context::{Actor, AppState};
use crate::entity::{clusters, tenants};
use crate::error::ApiError;

/// Largest cluster one request may create (two full SUs of 8-GPU hosts
/// is 64; this leaves room for CPU-only and small-GPU clusters).
pub const MAX_CLUSTER_SIZE: u32 = 256;

/// A member creates a training cluster: every member admitted together (in
/// one scalable unit where one has room) or none. Answers the tenant and
/// the cluster's row.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &ClusterCreate,
) -> Result<(tenants::Model, clusters::Model), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating clusters")?;
    crate::app::budget::check(st, &tenant).await?;
    crate::domain::names::tenant_name("name", &body.name)?;
    if !(1..=MAX_CLUSTER_SIZE).contains(&body.size) {
        return Err(ApiError::field(
            "size",
            format!("between 1 and {MAX_CLUSTER_SIZE}"),
        ));
    }
    // Every member has the same spec; the last has the longest name.
    let last = body.member(body.size - 1);
    if crate::domain::names::tenant_name("name", &last.name).is_err() {
        return Err(ApiError::field(
            "name",
            format!("too long for member names like {:?}", last.name),
        ));
    }
    let prepared = prepare(st, &tenant, &last, "networks", "the members'").await?;
    let names: Vec<String> = (0..body.size).map(|i| body.member(i).name).collect();
    if let Some(v) = crate::store::vms::named(&st.db, tenant.id, &names).await? {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} already has a VM named {:?}",
            tenant.name, v.name
        )));
    }
    let exists = clusters::Entity::find()
        .filter(clusters::Column::TenantId.eq(tenant.id))
        .filter(clusters::Column::Name.eq(body.name.clone()))
        .one(&st.db)
        .await?;
    if exists.is_some() {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} already has a cluster named {:?}",
            tenant.name, body.name
        )));
    }
    let members: Vec<Member> = names.into_iter().map(|n| prepared.member(n)).collect();
    let new = NewCluster {
        id: Uuid::now_v7(),
        name: &body.name,
        spec: &prepared.spec,
    };
    match admit(st, Some(actor), &tenant, &members, false, Some(&new)).await {
        Ok(_) => {}
        Err(ApiError::Conflict(_)) => {
            return Err(ApiError::Conflict(format!(
                "a cluster or VM of tenant {:?} with one of these names was created concurrently",
                tenant.name
            )))
        }
        Err(e) => return Err(e),
    }
    let row = clusters::Entity::find_by_id(new.id)
        .one(&st.db)
        .await?
        .ok_or_else(|| ApiError::Internal("the cluster vanished after its commit".into()))?;
    Ok((tenant, row))
}
