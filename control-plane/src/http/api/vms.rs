//! VMs of a tenant: create (placed at once, first fit), read, act, delete,
//! and their lifecycle events.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use kumo_api_types::{
    GuestNuma, HostState, Page, PageParams, PlacedGpu, Vm, VmCreate, VmEvent, VmPlacement, VmState,
};
use kumo_topology::guest_layout::{guest_layout, Placement};
use kumo_topology::sysfs::format_cpulist;
use kumo_topology::HostTopology;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use super::Problems;
use crate::app::access::tenant_access;
use crate::app::vms::act;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::domain::paging::Paging;
use crate::entity::{clusters, hosts, vm_events, vms};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};
use crate::store::hosts::{host_state, stored_topology};
use crate::store::vms::{find_vm, stored_placement, stored_spec, stored_state};

/// The placement as the API shows it: host↔guest addresses, NICs, NUMA map.
pub fn api_placement(topo: &HostTopology, p: &Placement) -> Option<VmPlacement> {
    let layout = guest_layout(topo, p).ok()?;
    let pins: std::collections::BTreeMap<u32, u32> = layout.vcpu_pins.iter().copied().collect();
    let gpus = p
        .gpus
        .iter()
        .map(|g| {
            let nic = p.nics.iter().find(|n| n.for_gpus.contains(g));
            PlacedGpu {
                host_bdf: g.to_string(),
                guest_bdf: layout
                    .guest_bdf(*g)
                    .map(|b| b.to_string())
                    .unwrap_or_default(),
                model: topo.gpu(*g).map(|x| x.model.clone()).unwrap_or_default(),
                nic: nic.map(|n| n.rdma_device.clone()),
                nic_guest_bdf: nic
                    .and_then(|n| layout.guest_bdf(n.host_bdf))
                    .map(|b| b.to_string()),
                nic_vf: nic
                    .filter(|n| n.pf.is_some())
                    .map(|n| n.host_bdf.to_string()),
                guest_numa: layout.expander_of(*g).map(|e| e.guest_node).unwrap_or(0),
            }
        })
        .collect();
    let numa = layout
        .cells
        .iter()
        .map(|c| GuestNuma {
            guest_node: c.id,
            host_node: c.host_node,
            vcpus: format_cpulist(&c.vcpus),
            host_cpus: format_cpulist(
                &c.vcpus
                    .iter()
                    .filter_map(|v| pins.get(v).copied())
                    .collect::<Vec<_>>(),
            ),
            memory_mib: c.memory_mib,
        })
        .collect();
    Some(VmPlacement { gpus, numa })
}

/// The VM as the API shows it, given its host and the host's topology. A
/// VM on an unreachable host is `unknown`: it may be running; nobody can tell.
fn to_api_on(
    v: &vms::Model,
    tenant: &str,
    host: Option<(&hosts::Model, &HostTopology)>,
    cluster: Option<&str>,
    networks: Vec<kumo_api_types::VmNetwork>,
) -> Result<Vm, ApiError> {
    let mut state = stored_state(v)?;
    let unreachable = match host {
        Some((h, _)) => host_state(h)? == HostState::Unreachable,
        None => false,
    };
    if unreachable && state != VmState::Deleting {
        state = VmState::Unknown;
    }
    let placement = match (host, stored_placement(v)?) {
        (Some((_, topo)), Some(p)) => api_placement(topo, &p),
        _ => None,
    };
    Ok(Vm {
        id: v.id,
        name: v.name.clone(),
        tenant: tenant.to_owned(),
        state,
        reason: v.reason.clone(),
        host: host.map(|(h, _)| h.name.clone()),
        spec: stored_spec(v)?,
        placement,
        guest_condition: v.guest_condition.clone(),
        preempt_deadline: v.preempt_deadline,
        cluster: cluster.map(str::to_owned),
        networks,
        created_at: v.created_at,
        updated_at: v.updated_at,
    })
}

async fn to_api(db: &impl ConnectionTrait, v: &vms::Model, tenant: &str) -> Result<Vm, ApiError> {
    let host = match v.host_id {
        Some(h) => hosts::Entity::find_by_id(h).one(db).await?,
        None => None,
    };
    let topo = host.as_ref().map(stored_topology).transpose()?;
    let cluster = match v.cluster_id {
        Some(c) => clusters::Entity::find_by_id(c)
            .one(db)
            .await?
            .map(|c| c.name),
        None => None,
    };
    let networks = crate::store::segments::networks_of(db, &[v.id])
        .await?
        .remove(&v.id)
        .unwrap_or_default();
    to_api_on(
        v,
        tenant,
        host.as_ref().zip(topo.as_ref()),
        cluster.as_deref(),
        networks,
    )
}

/// Create a VM (members). It is placed at once (best fit, topology-aware)
/// and the host's agent brings it up; a guaranteed VM that does not fit
/// reclaims spot VMs and is `pending` until they are gone.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms", tag = "vms",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VmCreate,
    responses((status = 201, description = "Created and placed", body = Vm), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<VmCreate>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, vm) = crate::app::vms::create(&st, &ctx, &tenant, &body).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(to_api(&st.db, &vm, &tenant.name).await?),
    ))
}

/// List a tenant's VMs by name (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Vm>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Vm>>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant.id))
        .order_by_asc(vms::Column::Name);
    if let Some(after) = &paging.after {
        query = query.filter(vms::Column::Name.gt(after.as_str()));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |v| v.name.clone());
    // Each host is read (and its topology parsed) once for the whole page.
    let host_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.host_id).collect();
    let mut hosts_by_id = std::collections::HashMap::new();
    for h in hosts::Entity::find()
        .filter(hosts::Column::Id.is_in(host_ids))
        .all(&st.db)
        .await?
    {
        let topo = stored_topology(&h)?;
        hosts_by_id.insert(h.id, (h, topo));
    }
    let cluster_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.cluster_id).collect();
    let clusters_by_id: std::collections::HashMap<Uuid, String> = clusters::Entity::find()
        .filter(clusters::Column::Id.is_in(cluster_ids))
        .all(&st.db)
        .await?
        .into_iter()
        .map(|c| (c.id, c.name))
        .collect();
    let mut networks =
        crate::store::segments::networks_of(&st.db, &rows.iter().map(|v| v.id).collect::<Vec<_>>())
            .await?;
    let mut items = Vec::with_capacity(rows.len());
    for v in &rows {
        let host = v
            .host_id
            .and_then(|id| hosts_by_id.get(&id))
            .map(|(h, t)| (h, t));
        let cluster = v
            .cluster_id
            .and_then(|c| clusters_by_id.get(&c))
            .map(String::as_str);
        items.push(to_api_on(
            v,
            &tenant.name,
            host,
            cluster,
            networks.remove(&v.id).unwrap_or_default(),
        )?);
    }
    Ok(axum::Json(Page {
        items,
        next_page_token: next,
    }))
}

/// Show a VM with its placement (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "The VM", body = Vm), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<axum::Json<Vm>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let vm = find_vm(&st.db, &tenant, &vm).await?;
    Ok(axum::Json(to_api(&st.db, &vm, &tenant.name).await?))
}

/// The NCCL topology file the guest gets (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}/nccl-topology", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "NCCL topology XML", body = String, content_type = "application/xml"), Problems)
)]
pub async fn nccl_topology(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let vm = find_vm(&st.db, &tenant, &vm).await?;
    let not_placed = || ApiError::Conflict("the VM is not placed on a host".into());
    let host = match vm.host_id {
        Some(h) => hosts::Entity::find_by_id(h)
            .one(&st.db)
            .await?
            .ok_or_else(not_placed)?,
        None => return Err(not_placed()),
    };
    let placed = stored_placement(&vm)?.ok_or_else(not_placed)?;
    let topo = stored_topology(&host)?;
    let xml = nccl_xml(&topo, &placed)?;
    Ok(([(CONTENT_TYPE, "application/xml")], xml))
}

pub fn nccl_xml(topo: &HostTopology, placed: &Placement) -> Result<String, ApiError> {
    let layout = guest_layout(topo, placed).map_err(|e| ApiError::Internal(e.to_string()))?;
    kumo_topology::nccl_xml::nccl_topology_xml(topo, &layout)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// A lifecycle action and the VM as it is after it.
async fn acted(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    action: Action,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, vm) = act(st, actor, tenant, vm, action).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(to_api(&st.db, &vm, &tenant.name).await?),
    ))
}

macro_rules! action_handler {
    ($fn:ident, $action:expr, $path:literal, $doc:literal) => {
        #[doc = $doc]
        #[utoipa::path(
            post, path = $path, tag = "vms",
            params(
                ("tenant" = String, Path, description = "Tenant name or id"),
                ("vm" = String, Path, description = "VM name or id"),
                ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
            ),
            responses((status = 202, description = "Accepted; the agent carries it out", body = Vm), Problems)
        )]
        pub async fn $fn(
            State(st): State<AppState>,
            ctx: Actor,
            Path((tenant, vm)): Path<(String, String)>,
        ) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
            acted(&st, &ctx, &tenant, &vm, $action).await
        }
    };
}

action_handler!(
    start,
    Action::Start,
    "/api/v1/tenants/{tenant}/vms/{vm}/start",
    "Start a stopped VM (members)."
);
action_handler!(
    stop,
    Action::Stop,
    "/api/v1/tenants/{tenant}/vms/{vm}/stop",
    "Shut a VM down (members)."
);
action_handler!(
    reboot,
    Action::Reboot,
    "/api/v1/tenants/{tenant}/vms/{vm}/reboot",
    "Reboot a running VM (members)."
);

/// Delete a VM; its devices are freed once the host confirms (members).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/vms/{vm}", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 202, description = "Deleting", body = Vm), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    acted(&st, &ctx, &tenant, &vm, Action::Delete).await
}

/// Lifecycle events of a tenant's VMs, newest first (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/events", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<VmEvent>)), Problems)
)]
pub async fn events(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<VmEvent>>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let mut query = vm_events::Entity::find()
        .filter(vm_events::Column::TenantId.eq(tenant.id))
        .order_by_desc(vm_events::Column::Id);
    if let Some(after) = &paging.after {
        let after: i64 = after
            .parse()
            .map_err(|_| ApiError::field("page_token", "not a page token returned by this API"))?;
        query = query.filter(vm_events::Column::Id.lt(after));
    }
    let rows = query.limit(paging.fetch()).all(&st.db).await?;
    let (rows, next) = paging.finish(rows, |e| e.id.to_string());
    Ok(axum::Json(Page {
        items: rows
            .into_iter()
            .map(|e| VmEvent {
                id: e.id,
                vm_id: e.vm_id,
                at: e.at,
                kind: e.kind,
                message: e.message,
            })
            .collect(),
        next_page_token: next,
    }))
}
