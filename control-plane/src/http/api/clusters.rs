//! Training clusters (placement groups): N identical VMs placed all or
//! nothing, in one scalable unit when one has room, rail-aligned; their
//! hostfile; deleting one deletes its members.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Cluster, ClusterCreate, ClusterMember, Page, PageParams, Role, VmState};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::tenant_access;
use crate::app::vms::act_on;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::domain::paging::Paging;
use crate::entity::{clusters, hosts, vms};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};
use crate::store::clusters::{hostfile, members_of, stored_cluster_spec};
use crate::store::vms::{stored_placement, stored_state};

async fn to_api(
    st: &AppState,
    db: &impl ConnectionTrait,
    c: &clusters::Model,
    tenant: &str,
) -> Result<Cluster, ApiError> {
    let rows = members_of(db, c).await?;
    let host_ids: Vec<Uuid> = rows.iter().filter_map(|(v, _)| v.host_id).collect();
    let hosts_by_id: HashMap<Uuid, hosts::Model> = hosts::Entity::find()
        .filter(hosts::Column::Id.is_in(host_ids))
        .all(db)
        .await?
        .into_iter()
        .map(|h| (h.id, h))
        .collect();
    // The hosts' profiles (with their rails), copied out under one lock.
    let profiles: HashMap<Uuid, _> = {
        let index = st.capacity.lock();
        hosts_by_id
            .keys()
            .filter_map(|id| Some((*id, index.hosts[index.position(*id)?].profile.clone())))
            .collect()
    };
    let mut members = Vec::with_capacity(rows.len());
    for (v, address) in &rows {
        let host = v.host_id.and_then(|h| hosts_by_id.get(&h));
        let rails = match (host, stored_placement(v)?) {
            (Some(h), Some(p)) => {
                let profile = profiles.get(&h.id);
                p.gpus
                    .iter()
                    .map(|g| {
                        let nic = p.nics.iter().find(|n| n.for_gpus.contains(g))?;
                        let profile = profile?;
                        profile.nics[profile.nic_index(&nic.physical())?].rail
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        members.push(ClusterMember {
            name: v.name.clone(),
            state: stored_state(v)?,
            host: host.map(|h| h.name.clone()),
            scalable_unit: host.and_then(|h| h.scalable_unit.clone()),
            rails,
            address: address.clone(),
        });
    }
    let spec = stored_cluster_spec(c)?;
    let size = u32::try_from(c.size).unwrap_or(0);
    let lines: Vec<(String, Option<String>)> = rows
        .iter()
        .map(|(v, a)| (v.name.clone(), a.clone()))
        .collect();
    Ok(Cluster {
        id: c.id,
        name: c.name.clone(),
        tenant: tenant.to_owned(),
        size,
        state: c.state.clone(),
        hostfile: hostfile(&lines, spec.gpus),
        spec,
        members,
        created_at: c.created_at,
    })
}

/// Create a training cluster (members): `size` identical VMs named
/// `NAME-0` … placed all or nothing, in one scalable unit when one has
/// room (else the fewest), GPU *i* of every member on rail *i*. A
/// guaranteed cluster that does not fit reclaims spot VMs and is `pending`
/// until they are gone.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/clusters", tag = "clusters",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = ClusterCreate,
    responses((status = 201, description = "Created: placed, or pending while spot VMs are reclaimed", body = Cluster), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<ClusterCreate>,
) -> Result<(StatusCode, axum::Json<Cluster>), ApiError> {
    let (tenant, row) = crate::app::clusters::create(&st, &ctx, &tenant, &body).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(to_api(&st, &st.db, &row, &tenant.name).await?),
    ))
}

/// List a tenant's clusters by name (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/clusters", tag = "clusters",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Cluster>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Cluster>>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = clusters::Entity::find()
        .filter(clusters::Column::TenantId.eq(tenant.id))
        .order_by_asc(clusters::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(clusters::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |c| c.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for c in &rows {
        items.push(to_api(&st, &st.db, c, &tenant.name).await?);
    }
    Ok(axum::Json(Page {
        items,
        next_page_token: next,
    }))
}

/// Show a cluster: members, their hosts, scalable units and rails, and
/// the hostfile (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/clusters/{cluster}", tag = "clusters",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("cluster" = String, Path, description = "Cluster name or id")),
    responses((status = 200, description = "The cluster", body = Cluster), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, cluster)): Path<(String, String)>,
) -> Result<axum::Json<Cluster>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let c = crate::store::clusters::find(&st.db, &tenant, &cluster).await?;
    Ok(axum::Json(to_api(&st, &st.db, &c, &tenant.name).await?))
}

/// Delete a cluster: every member VM is deleted; the cluster is gone with
/// its last member (members).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/clusters/{cluster}", tag = "clusters",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("cluster" = String, Path, description = "Cluster name or id")),
    responses((status = 202, description = "Deleting its members", body = Cluster), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, cluster)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Cluster>), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "deleting clusters")?;
    let txn = st.db.begin().await?;
    let c = crate::store::clusters::find(&txn, &tenant, &cluster).await?;
    let before = to_api(&st, &txn, &c, &tenant.name).await?;
    let members = vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(c.id))
        .order_by_asc(vms::Column::Id)
        .lock_exclusive()
        .all(&txn)
        .await?;
    let mut hosts = Vec::new();
    for vm in &members {
        // Members already on their way out are left to finish.
        if matches!(stored_state(vm)?, VmState::Deleting | VmState::Deleted) {
            continue;
        }
        act_on(
            &txn,
            &ctx,
            &tenant,
            vm,
            Action::Delete,
            st.config.clock.now(),
        )
        .await?;
        hosts.extend(vm.host_id);
    }
    if members.is_empty() {
        clusters::Entity::delete_by_id(c.id).exec(&txn).await?;
    }
    crate::app::audit::record(&txn, &ctx, "cluster.delete", Some(&tenant), &c.name).await?;
    txn.commit().await?;
    hosts.dedup();
    for h in hosts {
        st.signals.notify(h);
    }
    let after = match clusters::Entity::find_by_id(c.id).one(&st.db).await? {
        Some(row) => to_api(&st, &st.db, &row, &tenant.name).await?,
        // Every member was pending or preempted: nothing left to wait for.
        None => Cluster {
            members: Vec::new(),
            ..before
        },
    };
    Ok((StatusCode::ACCEPTED, axum::Json(after)))
}
