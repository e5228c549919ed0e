//! VMs of a tenant: create (placed at once, first fit), read, act, delete,
//! and their lifecycle events.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use kumo_api_types::{
    GuestNuma, HostState, Page, PageParams, PlacedGpu, Role, SegmentKind, Vm, VmCreate, VmEvent,
    VmPlacement, VmSpec, VmState,
};
use kumo_topology::guest_layout::{guest_layout, Placement};
use kumo_topology::sysfs::format_cpulist;
use kumo_topology::HostTopology;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use uuid::Uuid;

use super::Problems;
use crate::app::access::tenant_access;
use crate::app::admission::{admit, Member};
use crate::app::vms::act;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::domain::names;
use crate::domain::paging::Paging;
use crate::entity::{clusters, hosts, vm_events, vms};
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};
use crate::store::hosts::{host_state, stored_topology};
use crate::store::vms::{find_vm, stored_placement, stored_spec, stored_state};

pub const MAX_GPUS: u32 = 64;
pub const MAX_VCPUS: u32 = 1024;
pub const MAX_MEMORY_GIB: u32 = 16_384;
pub const MAX_DISK_GIB: u32 = 65_536;
pub const MAX_SSH_KEYS: usize = 32;

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
    let mut state = stored_state(v);
    if host.is_some_and(|(h, _)| host_state(h) == HostState::Unreachable)
        && state != VmState::Deleting
    {
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

fn validate(body: &VmCreate) -> Result<VmSpec, ApiError> {
    names::tenant_name("name", &body.name)?;
    if body.gpus > MAX_GPUS {
        return Err(ApiError::field("gpus", format!("at most {MAX_GPUS}")));
    }
    if let Some(m) = &body.gpu_model {
        names::gpu_model("gpu_model", m)?;
    }
    let vcpus = body.vcpus_or_default();
    let memory_gib = body.memory_gib_or_default();
    let disk_gib = body.disk_gib.unwrap_or(50);
    for (field, v, max) in [
        ("vcpus", vcpus, MAX_VCPUS),
        ("memory_gib", memory_gib, MAX_MEMORY_GIB),
        ("disk_gib", disk_gib, MAX_DISK_GIB),
    ] {
        if !(1..=max).contains(&v) {
            return Err(ApiError::field(field, format!("between 1 and {max}")));
        }
    }
    if body.ssh_keys.len() > MAX_SSH_KEYS {
        return Err(ApiError::field(
            "ssh_keys",
            format!("at most {MAX_SSH_KEYS}"),
        ));
    }
    for k in &body.ssh_keys {
        let kind = k.split_whitespace().next().unwrap_or("");
        if !(kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-"))
            || k.len() > 8192
            || k.contains('\n')
        {
            return Err(ApiError::field(
                "ssh_keys",
                "each key is one OpenSSH public key line",
            ));
        }
    }
    Ok(VmSpec {
        gpus: body.gpus,
        gpu_model: body.gpu_model.clone(),
        vcpus,
        memory_gib,
        disk_gib,
        template: body.template.clone(),
        image_path: None,
        kernel: None,
        service_level: body.service_level,
        ssh_keys: body.ssh_keys.clone(),
    })
}

/// The stored spec of a VM request: validated, defaults filled in, its
/// template's image and kernel resolved.
pub async fn resolve_spec(st: &AppState, body: &VmCreate) -> Result<VmSpec, ApiError> {
    let mut spec = validate(body)?;
    if let Some(t) = &body.template {
        let tpl = super::templates::find(st, t)
            .await?
            .ok_or_else(|| ApiError::field("template", format!("no template named {t:?}")))?;
        spec.image_path = Some(tpl.image_path);
        spec.kernel = tpl.kernel_path.map(|kernel| kumo_api_types::KernelBoot {
            kernel,
            initrd: tpl.initrd_path,
            cmdline: tpl.kernel_cmdline.unwrap_or_default(),
        });
    }
    Ok(spec)
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
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "creating VMs")?;
    crate::app::budget::check(&st, &tenant).await?;
    let spec = resolve_spec(&st, &body).await?;
    let name_taken = || {
        ApiError::Conflict(format!(
            "tenant {:?} already has a VM named {:?}",
            tenant.name, body.name
        ))
    };
    let exists = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant.id))
        .filter(vms::Column::Name.eq(body.name.clone()))
        .one(&st.db)
        .await?;
    if exists.is_some() {
        return Err(name_taken());
    }
    let nics = super::segments::resolve(&st.db, &tenant, &body.networks).await?;
    let roce = nics
        .iter()
        .any(|n| crate::store::segments::stored_kind(&n.segment) == SegmentKind::Roce);
    if roce && spec.gpus == 0 {
        return Err(ApiError::field(
            "networks.segment",
            "RoCE segments are reached through the NICs paired with the VM's GPUs; ask for GPUs",
        ));
    }
    let member = Member {
        id: Uuid::now_v7(),
        name: body.name.clone(),
        spec,
        networked: !nics.is_empty(),
        roce,
        nics,
    };
    match admit(
        &st,
        Some(&ctx),
        &tenant,
        std::slice::from_ref(&member),
        false,
        None,
    )
    .await
    {
        Ok(_) => {}
        Err(ApiError::Conflict(_)) => return Err(name_taken()),
        Err(e) => return Err(e),
    }
    let vm = vms::Entity::find_by_id(member.id)
        .one(&st.db)
        .await?
        .ok_or_else(name_taken)?;
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
