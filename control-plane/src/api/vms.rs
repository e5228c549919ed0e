//! VMs of a tenant: create (placed at once, first fit), read, act, delete,
//! and their lifecycle events.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::Utc;
use kumo_api_types::{
    GuestNuma, HostState, Page, PageParams, PlacedGpu, Power, Role, SegmentKind, Vm, VmCreate,
    VmEvent, VmPlacement, VmSpec, VmState,
};
use kumo_topology::guest_layout::{guest_layout, Placement};
use kumo_topology::sysfs::format_cpulist;
use kumo_topology::HostTopology;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, NotSet,
    QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};
use uuid::Uuid;

use super::hosts::{host_state, stored_topology};
use super::Problems;
use crate::access::tenant_access;
use crate::admission::{admit, Member};
use crate::entity::{clusters, hosts, tenants, vm_events, vms};
use crate::error::ApiError;
use crate::extract::{Ctx, Json, Path, Query};
use crate::lifecycle::{self, Action};
use crate::paging::Paging;
use crate::server::AppState;
use crate::{audit, names};

pub const MAX_GPUS: u32 = 64;
pub const MAX_VCPUS: u32 = 1024;
pub const MAX_MEMORY_GIB: u32 = 16_384;
pub const MAX_DISK_GIB: u32 = 65_536;
pub const MAX_SSH_KEYS: usize = 32;

pub fn stored_spec(v: &vms::Model) -> Result<VmSpec, ApiError> {
    serde_json::from_str(&v.spec).map_err(|e| ApiError::Internal(format!("vm {} spec: {e}", v.id)))
}

pub fn stored_placement(v: &vms::Model) -> Result<Option<Placement>, ApiError> {
    v.placement
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| ApiError::Internal(format!("vm {} placement: {e}", v.id)))
}

pub fn stored_state(v: &vms::Model) -> VmState {
    VmState::parse(&v.state).unwrap_or(VmState::Error)
}

pub fn desired_power(v: &vms::Model) -> Power {
    match v.desired_power.as_str() {
        "stopped" => Power::Stopped,
        "saved" => Power::Suspended,
        _ => Power::Running,
    }
}

pub fn power_str(p: Power) -> &'static str {
    match p {
        Power::Running => "running",
        Power::Stopped => "stopped",
        Power::Suspended => "saved",
    }
}

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
    let networks = super::segments::networks_of(db, &[v.id])
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

pub async fn event(
    db: &impl ConnectionTrait,
    vm: &vms::Model,
    kind: &str,
    message: impl Into<String>,
) -> Result<(), ApiError> {
    vm_events::ActiveModel {
        id: NotSet,
        vm_id: Set(vm.id),
        tenant_id: Set(vm.tenant_id),
        at: Set(Utc::now()),
        kind: Set(kind.to_owned()),
        message: Set(message.into()),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// Marks a host's desired state as changed, inside the caller's transaction.
pub async fn bump_revision(txn: &DatabaseTransaction, host: Uuid) -> Result<(), ApiError> {
    use sea_orm::sea_query::Expr;
    hosts::Entity::update_many()
        .col_expr(
            hosts::Column::Revision,
            Expr::col(hosts::Column::Revision).add(1),
        )
        .filter(hosts::Column::Id.eq(host))
        .exec(txn)
        .await?;
    Ok(())
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
    ctx: Ctx,
    Path(tenant): Path<String>,
    Json(body): Json<VmCreate>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, &tenant).await?;
    access.require(Role::Member, "creating VMs")?;
    crate::budget::check(&st, &tenant).await?;
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
        .any(|n| super::segments::stored_kind(&n.segment) == SegmentKind::Roce);
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
    ctx: Ctx,
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
        super::segments::networks_of(&st.db, &rows.iter().map(|v| v.id).collect::<Vec<_>>())
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

/// A tenant's VM by name or id.
fn vm_query(tenant: &tenants::Model, vm_ref: &str) -> sea_orm::Select<vms::Entity> {
    let q = vms::Entity::find().filter(vms::Column::TenantId.eq(tenant.id));
    match Uuid::try_parse(vm_ref) {
        Ok(id) => q.filter(vms::Column::Id.eq(id)),
        Err(_) => q.filter(vms::Column::Name.eq(vm_ref)),
    }
}

async fn find_vm(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    vm_ref: &str,
) -> Result<vms::Model, ApiError> {
    vm_query(tenant, vm_ref)
        .one(db)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("VM {vm_ref:?}")))
}

/// [`find_vm`] for a change: the row stays locked until the transaction
/// ends (PostgreSQL; SQLite's one connection serialises anyway), so a
/// concurrent agent report cannot write over the change with what it read
/// before it.
async fn find_vm_to_change(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    vm_ref: &str,
) -> Result<vms::Model, ApiError> {
    vm_query(tenant, vm_ref)
        .lock_exclusive()
        .one(txn)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("VM {vm_ref:?}")))
}

/// Show a VM with its placement (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "The VM", body = Vm), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Ctx,
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
    ctx: Ctx,
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

async fn act(
    st: &AppState,
    ctx: &Ctx,
    tenant: &str,
    vm: &str,
    action: Action,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &ctx.caller, tenant).await?;
    access.require(Role::Member, &format!("{} of a VM", action.as_str()))?;
    if matches!(action, Action::Start) {
        crate::budget::check(st, &tenant).await?;
    }
    let txn = st.db.begin().await?;
    let vm = find_vm_to_change(&txn, &tenant, vm).await?;
    let updated = act_on(&txn, ctx, &tenant, &vm, action, st.config.clock.now()).await?;
    txn.commit().await?;
    if let Some(h) = vm.host_id {
        st.signals.notify(h);
    }
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(to_api(&st.db, &updated, &tenant.name).await?),
    ))
}

/// One lifecycle action on a VM, inside the caller's transaction: the new
/// state, events, audit, and the host's revision. The caller notifies the
/// host after committing.
pub async fn act_on(
    txn: &DatabaseTransaction,
    ctx: &Ctx,
    tenant: &tenants::Model,
    vm: &vms::Model,
    action: Action,
    now: chrono::DateTime<Utc>,
) -> Result<vms::Model, ApiError> {
    let updated = apply_action(txn, vm, action, &ctx.caller.user.name, now).await?;
    audit::record(
        txn,
        ctx,
        &format!("vm.{}", action.as_str()),
        Some(tenant),
        &vm.name,
    )
    .await?;
    Ok(updated)
}

/// An action's state change with its event (`by` names who asked) and
/// its host's wake-up, in the caller's transaction; 409 when the VM's
/// state does not allow it.
pub async fn apply_action(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    action: Action,
    by: &str,
    now: chrono::DateTime<Utc>,
) -> Result<vms::Model, ApiError> {
    let effect = lifecycle::apply(
        stored_state(vm),
        desired_power(vm),
        action,
        vm.host_id.is_some(),
    )
    .map_err(|s| {
        ApiError::Conflict(format!(
            "cannot {} a VM that is {}",
            action.as_str(),
            s.as_str()
        ))
    })?;
    crate::metering::transition(txn, vm, stored_state(vm), effect.state, None, now).await?;
    let mut active: vms::ActiveModel = vm.clone().into();
    active.state = Set(effect.state.as_str().to_owned());
    active.desired_power = Set(power_str(effect.desired_power).to_owned());
    if effect.bump_generation {
        active.power_generation = Set(vm.power_generation + 1);
    }
    active.updated_at = Set(Utc::now());
    let updated = active.update(txn).await?;
    event(
        txn,
        vm,
        &format!("{}-requested", action.as_str()),
        format!("by {by}"),
    )
    .await?;
    if effect.state == VmState::Deleted {
        event(txn, vm, "deleted", "never placed").await?;
        delete_row(txn, vm, now).await?;
    }
    if let Some(h) = vm.host_id {
        bump_revision(txn, h).await?;
    }
    Ok(updated)
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
            ctx: Ctx,
            Path((tenant, vm)): Path<(String, String)>,
        ) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
            act(&st, &ctx, &tenant, &vm, $action).await
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
    ctx: Ctx,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    act(&st, &ctx, &tenant, &vm, Action::Delete).await
}

/// Lifecycle events of a tenant's VMs, newest first (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/events", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<VmEvent>)), Problems)
)]
pub async fn events(
    State(st): State<AppState>,
    ctx: Ctx,
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

/// Deletes a VM row with what goes with it, in the caller's transaction:
/// its NICs, and its cluster once it was the last member.
/// Answers the hosts whose networks changed, to wake after the commit.
pub async fn delete_row(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    now: chrono::DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    crate::metering::gone(txn, vm.id, now).await?;
    let peers = crate::host_network::touch_peers(txn, vm.id).await?;
    vms::Entity::delete_by_id(vm.id).exec(txn).await?;
    super::segments::detach_all(txn, vm.id).await?;
    super::clusters::member_gone(txn, vm).await?;
    Ok(peers)
}
