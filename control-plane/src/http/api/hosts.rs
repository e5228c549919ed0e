use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::StatusCode;
use kumo_api_types::{
    Allocation, Host, HostDetail, HostState, JoinTokenCreate, JoinTokenCreated, JoinTokenInfo,
    Page, PageParams, ServiceLevel,
};
use kumo_topology::HostTopology;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use uuid::Uuid;

use super::Problems;
use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::paging::Paging;
use crate::domain::states::{AllocationKind, StoredText};
use crate::entity::{allocations, hosts, vms};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};
use crate::store::hosts::{find, held, held_by_host, host_state, reachable_state, stored_topology};
use crate::store::vms::stored_spec;

fn to_api(
    h: &hosts::Model,
    topo: &HostTopology,
    held: &[allocations::Model],
) -> Result<Host, ApiError> {
    let state = host_state(h)?;
    let used: BTreeSet<&str> = held
        .iter()
        .filter(|a| a.kind == AllocationKind::Gpu.to_text())
        .map(|a| a.key.as_str())
        .collect();
    let mut models: Vec<String> = topo.gpus.iter().map(|g| g.model.clone()).collect();
    models.sort();
    models.dedup();
    Ok(Host {
        id: h.id,
        name: h.name.clone(),
        state,
        scalable_unit: h.scalable_unit.clone(),
        virt_type: h.virt_type.clone(),
        gpu_models: models,
        gpus: topo.gpus.len() as u32,
        gpus_free: topo
            .gpus
            .iter()
            .filter(|g| !used.contains(g.location.bdf.to_string().as_str()))
            .count() as u32,
        rdma_nics: topo.nics.len() as u32,
        underlay_ip: crate::app::host_network::underlay_of(h),
        cpus: topo.numa_nodes.iter().map(|n| n.cpus.len() as u32).sum(),
        registered_at: h.registered_at,
        last_heartbeat_at: h.last_heartbeat_at,
    })
}

/// Create a join token for registering hosts (platform admins). It is
/// good for `uses` registrations (default one).
#[utoipa::path(
    post, path = "/api/v1/hosts/join-tokens", tag = "hosts",
    request_body = JoinTokenCreate,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 201, description = "Created", body = JoinTokenCreated), Problems)
)]
pub async fn create_join_token(
    State(st): State<AppState>,
    ctx: Actor,
    Json(body): Json<JoinTokenCreate>,
) -> Result<(StatusCode, axum::Json<JoinTokenCreated>), ApiError> {
    let made = crate::app::hosts::create_join_token(&st, &ctx, &body).await?;
    Ok((StatusCode::CREATED, axum::Json(made)))
}

/// List join tokens with their uses, never their secrets (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts/join-tokens", tag = "hosts",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<JoinTokenInfo>)), Problems)
)]
pub async fn list_join_tokens(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<JoinTokenInfo>>, ApiError> {
    Ok(axum::Json(
        crate::app::hosts::list_join_tokens(&st, &ctx, &q).await?,
    ))
}

/// Revoke a join token: it registers no more hosts (platform admins).
#[utoipa::path(
    delete, path = "/api/v1/hosts/join-tokens/{id}", tag = "hosts",
    params(("id" = Uuid, Path, description = "Join token id")),
    responses((status = 204, description = "Revoked"), Problems)
)]
pub async fn revoke_join_token(
    State(st): State<AppState>,
    ctx: Actor,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::hosts::revoke_join_token(&st, &ctx, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Let a registered host join again with a join token (platform admins):
/// its current credential is revoked at once.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/rejoin", tag = "hosts",
    params(("host" = String, Path, description = "Host name or id"), ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries")),
    responses((status = 204, description = "Its next registration is let in"), Problems)
)]
pub async fn rejoin(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::app::hosts::allow_rejoin(&st, &ctx, &host).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List hosts by name (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts", tag = "hosts",
    params(PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Host>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Host>>, ApiError> {
    require_admin(&ctx.caller, "listing hosts")?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = hosts::Entity::find().order_by_asc(hosts::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(hosts::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |h| h.name.clone());
    let held = held_by_host(&st.db, &rows.iter().map(|h| h.id).collect::<Vec<_>>()).await?;
    let mut items = Vec::with_capacity(rows.len());
    for h in &rows {
        items.push(to_api(
            h,
            &stored_topology(h)?,
            held.get(&h.id).map(Vec::as_slice).unwrap_or_default(),
        )?);
    }
    Ok(axum::Json(Page {
        items,
        next_page_token: next,
    }))
}

/// Show a host with its topology, GPU/NIC matrix and allocations (platform admins).
#[utoipa::path(
    get, path = "/api/v1/hosts/{host}", tag = "hosts",
    params(("host" = String, Path, description = "Host name or id")),
    responses((status = 200, description = "The host", body = HostDetail), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<HostDetail>, ApiError> {
    require_admin(&ctx.caller, "showing hosts")?;
    let h = find(&st.db, &host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    let topo = stored_topology(&h)?;
    let held = held(&st.db, h.id).await?;
    let fabric = h
        .fabric
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    Ok(axum::Json(HostDetail {
        fabric,
        host: to_api(&h, &topo, &held)?,
        matrix: kumo_topology::matrix::render(&topo),
        topology: serde_json::to_value(&topo).map_err(|e| ApiError::Internal(e.to_string()))?,
        allocations: held
            .into_iter()
            .map(|a| Allocation {
                kind: a.kind,
                key: a.key,
                vm_id: a.vm_id,
            })
            .collect(),
    }))
}

async fn set_drained(
    st: &AppState,
    ctx: &Actor,
    host: &str,
    drained: bool,
) -> Result<axum::Json<Host>, ApiError> {
    let verb = if drained { "draining" } else { "undraining" };
    require_admin(&ctx.caller, &format!("{verb} hosts"))?;
    let txn = st.db.begin().await?;
    let h = find(&txn, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    if host_state(&h)? == HostState::Retired {
        return Err(ApiError::Conflict(format!("host {:?} is retired", h.name)));
    }
    let id = h.id;
    let name = h.name.clone();
    let mut a: hosts::ActiveModel = h.clone().into();
    a.drained = Set(drained);
    // An unreachable host stays so until it answers; then it takes this.
    if host_state(&h)? != HostState::Unreachable {
        a.state = Set(reachable_state(drained).as_str().into());
    }
    let updated = a.update(&txn).await?;
    let mut reclaimed = 0;
    if drained && !h.drained {
        // Spot VMs leave (with the usual notice and grace); guaranteed
        // VMs stay until their owners or the operator move them.
        let spot: Vec<Uuid> = vms::Entity::find()
            .filter(vms::Column::HostId.eq(id))
            .all(&txn)
            .await?
            .into_iter()
            .filter(|v| stored_spec(v).is_ok_and(|s| s.service_level == ServiceLevel::Spot))
            .map(|v| v.id)
            .collect();
        reclaimed = crate::app::admission::preempt(
            &txn,
            &spot,
            st.config.preemption_grace,
            "its host is being drained",
            st.config.clock.now(),
        )
        .await?
        .len();
    }
    crate::store::hosts::bump_revision(&txn, id).await?;
    audit::record(
        &txn,
        ctx,
        if drained {
            "host.drain"
        } else {
            "host.undrain"
        },
        None,
        &name,
    )
    .await?;
    txn.commit().await?;
    tracing::info!(host = %name, drained, reclaimed, "host {verb}");
    st.capacity.refresh_host(&st.db, id).await?;
    st.signals.notify(id);
    let held = held(&st.db, id).await?;
    Ok(axum::Json(to_api(
        &updated,
        &stored_topology(&updated)?,
        &held,
    )?))
}

/// Drain a host (platform admins): no new placements on it; its spot VMs
/// are reclaimed with the usual notice and grace period; guaranteed VMs
/// keep running. Idempotent.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/drain", tag = "hosts",
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "The host, draining", body = Host), Problems)
)]
pub async fn drain(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<Host>, ApiError> {
    set_drained(&st, &ctx, &host, true).await
}

/// Take a host back into service (platform admins). Idempotent.
#[utoipa::path(
    post, path = "/api/v1/hosts/{host}/undrain", tag = "hosts",
    params(
        ("host" = String, Path, description = "Host name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 200, description = "The host, ready", body = Host), Problems)
)]
pub async fn undrain(
    State(st): State<AppState>,
    ctx: Actor,
    Path(host): Path<String>,
) -> Result<axum::Json<Host>, ApiError> {
    set_drained(&st, &ctx, &host, false).await
}
