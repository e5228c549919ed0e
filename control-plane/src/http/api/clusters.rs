//! Training clusters (placement groups): N identical VMs placed all or
//! nothing, in one scalable unit when one has room, rail-aligned; their
//! hostfile; deleting one deletes its members.

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{Cluster, ClusterCreate, ClusterEvent, ClusterRepair, Page, PageParams};

use super::Problems;
use crate::context::Actor;
use crate::context::AppState;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

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
        axum::Json(crate::app::clusters::view(&st, &st.db, &row, &tenant.name).await?),
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
    Ok(axum::Json(
        crate::app::clusters::list(&st, &ctx, &tenant, &q).await?,
    ))
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
    Ok(axum::Json(
        crate::app::clusters::show(&st, &ctx, &tenant, &cluster).await?,
    ))
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
    let after = crate::app::clusters::delete(&st, &ctx, &tenant, &cluster).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(after)))
}

/// Repair a cluster (members): its failed members (host lost, VM in
/// error, a GPU or NIC quarantined) are replaced by new VMs of the same
/// shape with the same names, addresses and segment attachments, on fresh
/// root disks, in the same scalable unit and on the same rails when there
/// is room; the others' trouble (a suspect device, a stopped member) is
/// listed and left alone.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/clusters/{cluster}/repair", tag = "clusters",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("cluster" = String, Path, description = "Cluster name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 202, description = "Replacing its failed members (none when it had none)", body = ClusterRepair), Problems)
)]
pub async fn repair(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, cluster)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<ClusterRepair>), ApiError> {
    let done = crate::app::cluster_repair::repair(&st, &ctx, &tenant, &cluster).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(done)))
}

/// A cluster's events, newest first: its health changing, repairs and
/// where their members went (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/clusters/{cluster}/events", tag = "clusters",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("cluster" = String, Path, description = "Cluster name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<ClusterEvent>)), Problems)
)]
pub async fn events(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, cluster)): Path<(String, String)>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<ClusterEvent>>, ApiError> {
    Ok(axum::Json(
        crate::app::cluster_repair::events(&st, &ctx, &tenant, &cluster, &q).await?,
    ))
}
