//! VM use cases: create, lifecycle actions (start, stop, reboot, delete)
//! and the removal of a VM row with what goes with it; reading VMs (with
//! their placement as the API shows it), their NCCL topology and events.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::net::Ipv4Addr;

use kumo_api_types::{
    GuestNuma, HostState, IngressRule, NetworkRequest, Page, PageParams, PlacedGpu,
    PublicIpAllocate, PublicIpAttach, Role, SegmentIngress, SegmentKind, Vm, VmCreate, VmEvent,
    VmNetwork, VmPlacement, VmSpec, VmState,
};
use kumo_topology::guest_layout::{guest_layout, Placement};
use kumo_topology::sysfs::format_cpulist;
use kumo_topology::HostTopology;
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::admission::{admit, Admission, Member, Rows};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::{self, Action};
use crate::domain::paging::Paging;
use crate::domain::states::StoredText;
use crate::entity::{hosts, tenants, vms};
use crate::error::ApiError;
use crate::store::hosts::{bump_revision, host_state, stored_topology};
use crate::store::segments::{stored_cidr, stored_gateway, stored_kind, PlannedNic};
use crate::store::vms::{
    desired_power, event, find_vm, find_vm_to_change, stored_placement, stored_spec, stored_state,
};

/// A member's lifecycle action on a tenant's VM: access, the budget for a
/// start, the change in one transaction (the VM row locked), and the host
/// woken after the commit. Answers the tenant and the changed VM.
pub async fn act(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    action: Action,
) -> Result<(tenants::Model, vms::Model), ApiError> {
    act_as(st, actor, tenant, vm, action, false).await
}

/// `unshelve`, with `anywhere`: placed on any host with room (the host
/// holding its disks among them), its root disk and volumes then moved
/// there. Refused (409) when a disk cannot move: its host's agent does
/// not know moves, or one of its volumes has snapshots (they stay).
pub async fn unshelve(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    anywhere: bool,
) -> Result<(tenants::Model, vms::Model), ApiError> {
    act_as(st, actor, tenant, vm, Action::Unshelve, anywhere).await
}

async fn act_as(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    action: Action,
    anywhere: bool,
) -> Result<(tenants::Model, vms::Model), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, &format!("{} of a VM", action.as_str()))?;
    // Each action wakes its host's agent for a pass every tenant there
    // shares: a reboot loop is churn like any other. What gives resources
    // back (stop, shelve, delete) is never held back.
    if matches!(action, Action::Start | Action::Reboot | Action::Unshelve) {
        crate::app::churn::take(st, &tenant, &format!("{} of a VM", action.as_str()))?;
    }
    // A VM's row is locked here while its host's agent may hold the host
    // and lock the VM in its status report: PostgreSQL then gives one of
    // the two up, which is tried again rather than answered with an error.
    let mut tries = 0;
    let (vm, updated) = loop {
        match act_once(st, actor, &tenant, vm, action, anywhere).await {
            Err(ApiError::Contention) if tries < 3 => tries += 1,
            r => break r?,
        }
    };
    if let Some(h) = updated.host_id.or(vm.host_id) {
        st.signals.notify(h);
    }
    Ok((tenant, updated))
}

/// One transaction of [`act_as`]: the VM before and after.
async fn act_once(
    st: &AppState,
    actor: &Actor,
    tenant: &tenants::Model,
    vm: &str,
    action: Action,
    anywhere: bool,
) -> Result<(vms::Model, vms::Model), ApiError> {
    let txn = st.db.begin().await?;
    let vm = find_vm_to_change(&txn, tenant, vm).await?;
    if matches!(action, Action::Start | Action::Unshelve) {
        let spec = stored_spec(&vm)?;
        let level = crate::app::metering::level_of(&spec);
        let classes = crate::app::budget::vm_classes(&spec);
        crate::app::budget::check(&txn, tenant, &classes, level, actor.at).await?;
    }
    let mut updated = act_on(&txn, actor, tenant, &vm, action, st.config.clock.now()).await?;
    if anywhere {
        check_movable(&txn, &vm).await?;
        let mut a: vms::ActiveModel = updated.into();
        a.unshelve_anywhere = Set(true);
        a.reason = Set(Some(
            "waiting for room on any host (its disks then move there)".to_owned(),
        ));
        updated = a.update(&txn).await?;
    }
    txn.commit().await?;
    Ok((vm, updated))
}

/// Whether a shelved VM's disks can move: its disk host's agent serves
/// moves, and none of its volumes has snapshots (they stay on the host).
pub async fn check_movable(txn: &DatabaseTransaction, vm: &vms::Model) -> Result<(), ApiError> {
    let host = match vm.disk_host_id {
        Some(h) => crate::store::hosts::by_id(txn, h).await?,
        None => None,
    };
    if let Some(h) = host.filter(|h| h.transfer_url.is_none()) {
        return Err(ApiError::Conflict(format!(
            "host {:?}'s agent does not move disks (it is from before moves): unshelve the VM in place, or upgrade the agent",
            h.name
        )));
    }
    for v in crate::store::volumes::of_vm(txn, vm.id).await? {
        if !crate::store::volumes::snapshots_of(txn, v.id)
            .await?
            .is_empty()
        {
            return Err(ApiError::Conflict(format!(
                "volume {:?} has snapshots, which stay on its host: delete them, or unshelve the VM in place",
                v.name
            )));
        }
    }
    Ok(())
}

/// One lifecycle action on a VM, inside the caller's transaction: the new
/// state, events, audit, and the host's revision. The caller notifies the
/// host after committing.
pub async fn act_on(
    txn: &DatabaseTransaction,
    ctx: &Actor,
    tenant: &tenants::Model,
    vm: &vms::Model,
    action: Action,
    now: DateTime<Utc>,
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
    now: DateTime<Utc>,
) -> Result<vms::Model, ApiError> {
    let effect = lifecycle::apply(
        stored_state(vm)?,
        desired_power(vm)?,
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
    crate::app::metering::transition(txn, vm, stored_state(vm)?, effect.state, None, now).await?;
    if let (Action::Delete, Some(c)) = (action, vm.cluster_id) {
        // Spares are kept for the whole cluster: a member deleted (or the
        // cluster) gives them up, with their charge.
        crate::app::clusters::give_up_spares(txn, c, now).await?;
    }
    let mut active: vms::ActiveModel = vm.clone().into();
    let mut host = vm.host_id;
    if stored_state(vm)? == VmState::Shelved {
        // Deleted: the host holding its disk removes it. Unshelved: it
        // waits to be placed there (the reclaimer's pass places it).
        host = match action {
            Action::Delete => vm.disk_host_id,
            _ => None,
        };
        active.host_id = Set(host);
        active.reason = Set((action == Action::Unshelve)
            .then(|| "waiting for room on the host holding its disks".to_owned()));
    }
    if action == Action::Start {
        replan_without_physical_functions(txn, vm, &mut active, now).await?;
    }
    active.state = Set(effect.state.as_str().to_owned());
    active.desired_power = Set(effect.desired_power.to_text().to_owned());
    if effect.bump_generation {
        active.power_generation = Set(vm.power_generation + 1);
    }
    active.updated_at = Set(now);
    let updated = active.update(txn).await?;
    event(
        txn,
        vm,
        now,
        &format!("{}-requested", action.as_str()),
        format!("by {by}"),
    )
    .await?;
    if effect.state == VmState::Deleted && stored_state(vm)? == VmState::Lost {
        // Its host is gone: its devices there are let go, and should it
        // return it drops the disk (the domain goes as no longer its own).
        crate::store::allocations::release_all(txn, vm.id).await?;
        if let Some(h) = vm.host_id {
            crate::store::vms::mark_stale_disk(txn, vm.id, h, now).await?;
        }
        event(txn, vm, now, "deleted", "its host was lost").await?;
        delete_row(txn, vm, now).await?;
    } else if effect.state == VmState::Deleted {
        event(txn, vm, now, "deleted", "never placed").await?;
        delete_row(txn, vm, now).await?;
    }
    if let Some(h) = host {
        bump_revision(txn, h).await?;
    }
    Ok(updated)
}

/// A VM placed before tenants got VFs only holds its NICs' physical
/// functions: it keeps them while it runs, and lets them go when it next
/// starts (a guest owning a PF can tag any VLAN on the leaf, make its own
/// VFs and change the NIC's persistent firmware). The NICs' allocations
/// go with them.
async fn replan_without_physical_functions(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    active: &mut vms::ActiveModel,
    now: DateTime<Utc>,
) -> Result<(), ApiError> {
    let Some((kept, pfs)) = stored_placement(vm)?.and_then(|p| p.without_physical_functions())
    else {
        return Ok(());
    };
    let json = serde_json::to_string(&kept).map_err(|e| ApiError::Internal(e.to_string()))?;
    active.placement = Set(Some(json));
    let keys: Vec<String> = pfs.iter().map(ToString::to_string).collect();
    crate::store::allocations::release_some(
        txn,
        vm.id,
        crate::domain::states::AllocationKind::Nic,
        &keys,
    )
    .await?;
    event(
        txn,
        vm,
        now,
        "re-planned",
        format!(
            "its NICs' physical functions ({}) are no longer given to tenants; RDMA NICs come as VFs on RoCE segments",
            keys.join(", ")
        ),
    )
    .await
}

/// Deletes a VM row with what goes with it, in the caller's transaction:
/// its NICs, and its cluster once it was the last member.
/// Answers the hosts whose networks changed, to wake after the commit.
pub async fn delete_row(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    crate::app::metering::gone(txn, vm.id, now).await?;
    // A queued VM deleted is a request cancelled.
    crate::store::queue::remove(txn, &[vm.id]).await?;
    if let Some(d) = vm.disk_host_id.filter(|d| Some(*d) != vm.host_id) {
        // Deleted while its root disk moved: the old copy goes too.
        crate::store::vms::mark_stale_disk(txn, vm.id, d, now).await?;
    }
    let peers = crate::app::host_network::touch_peers(txn, vm.id).await?;
    vms::Entity::delete_by_id(vm.id).exec(txn).await?;
    // Its guests' last word goes with it (its idle row by foreign key; its
    // GPU minutes age out with the retention).
    crate::store::gpu_telemetry::forget(txn, vm.id).await?;
    // Its floating addresses return to the tenant and its forwards go,
    // with the NICs they name.
    crate::store::public_net::release_nics_of(txn, vm.id).await?;
    crate::store::segments::detach_all(txn, vm.id).await?;
    // Its volumes outlive it, detached; its shares' mounts go.
    crate::store::volumes::detach_all(txn, vm.id).await?;
    crate::store::shares::unmount_all(txn, vm.id).await?;
    crate::store::clusters::member_gone(txn, vm).await?;
    Ok(peers)
}

/// The stored spec of a VM request: validated, defaults filled in, its
/// template's image and kernel resolved.
pub async fn resolve_spec(st: &AppState, body: &VmCreate) -> Result<VmSpec, ApiError> {
    let mut spec = crate::domain::specs::validate(body)?;
    if let Some(t) = &body.template {
        let tpl = crate::store::templates::find(&st.db, t)
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

/// Resolves a VM request's networks against the tenant's segments.
pub async fn plan_nics(
    db: &impl ConnectionTrait,
    tenant: &tenants::Model,
    requests: &[NetworkRequest],
) -> Result<Vec<PlannedNic>, ApiError> {
    if requests.len() > 8 {
        return Err(ApiError::field("networks", "at most 8"));
    }
    let mut out: Vec<PlannedNic> = Vec::with_capacity(requests.len());
    for r in requests {
        let segment = crate::store::segments::find(db, tenant, &r.segment)
            .await
            .map_err(|_| {
                ApiError::field(
                    "networks.segment",
                    format!("no segment {:?} in this tenant", r.segment),
                )
            })?;
        if out.iter().any(|p| p.segment.id == segment.id) {
            return Err(ApiError::field(
                "networks.segment",
                format!("{:?} is named twice", r.segment),
            ));
        }
        let ip = match &r.ip {
            None => None,
            Some(s) => {
                let ip: Ipv4Addr = s.parse().map_err(|_| {
                    ApiError::field("networks.ip", format!("{s:?} is not an IPv4 address"))
                })?;
                let cidr = stored_cidr(&segment)?;
                if !cidr.is_host(ip) || ip == stored_gateway(&segment)? {
                    return Err(ApiError::field(
                        "networks.ip",
                        format!(
                            "{ip} is not a VM address of {cidr} (gateway {})",
                            segment.gateway
                        ),
                    ));
                }
                Some(ip)
            }
        };
        let kind = stored_kind(&segment)?;
        if kind == SegmentKind::Roce && out.iter().any(|p| p.kind == SegmentKind::Roce) {
            return Err(ApiError::field(
                "networks.segment",
                "one RoCE segment per VM: its GPUs' NICs carry one VLAN",
            ));
        }
        out.push(PlannedNic { segment, kind, ip });
    }
    Ok(out)
}

/// What creating a VM and creating a cluster share: the member's spec
/// (template resolved), its NICs on the tenant's segments, and whether one
/// is on a RoCE segment (reached through the GPUs' NICs, so GPUs are
/// needed). `field` and `whose` name the request's parts in errors.
pub async fn prepare(
    st: &AppState,
    tenant: &tenants::Model,
    body: &VmCreate,
    field: &str,
    whose: &str,
) -> Result<Prepared, ApiError> {
    let mut spec = resolve_spec(st, body).await?;
    if let Some(name) = &body.reservation {
        crate::app::reservations::assign(st, tenant, name, &mut spec, body.queue).await?;
    }
    let max = st.config.max_notice.as_secs();
    if body.notice_seconds.is_some_and(|n| u64::from(n) > max) {
        return Err(ApiError::field(
            "notice_seconds",
            format!("at most {max} (the platform's [scheduler] max_notice_secs)"),
        ));
    }
    let nics = plan_nics(&st.db, tenant, &body.networks).await?;
    let roce = nics.iter().any(|n| n.kind == SegmentKind::Roce);
    if roce && spec.gpus == 0 {
        return Err(ApiError::field(
            field,
            format!(
                "RoCE segments are reached through the NICs paired with {whose} GPUs; ask for GPUs"
            ),
        ));
    }
    let (volumes, on_host) = plan_volumes(&st.db, tenant, &body.volumes).await?;
    let shares = crate::app::shares::plan_mounts(&st.db, tenant, &body.shares).await?;
    Ok(Prepared {
        spec,
        nics,
        roce,
        volumes,
        on_host,
        shares,
    })
}

/// The volumes a new VM asks for: the tenant's, available, on one host
/// (the VM's host to be).
async fn plan_volumes(
    db: &impl sea_orm::ConnectionTrait,
    tenant: &tenants::Model,
    names: &[String],
) -> Result<(Vec<Uuid>, Option<Uuid>), ApiError> {
    if names.len() > 16 {
        return Err(ApiError::field("volumes", "at most 16 volumes"));
    }
    let mut ids = Vec::new();
    let mut host: Option<(Uuid, String)> = None;
    for name in names {
        let v = crate::store::volumes::find(db, tenant, name).await?;
        if ids.contains(&v.id) {
            return Err(ApiError::field(
                "volumes",
                format!("{name:?} is named twice"),
            ));
        }
        let state = crate::store::volumes::stored_state(&v)?;
        if v.vm_id.is_some()
            || !matches!(
                state,
                kumo_api_types::VolumeState::Available | kumo_api_types::VolumeState::Creating
            )
        {
            return Err(ApiError::Conflict(format!(
                "volume {name:?} is {}: a new VM takes volumes that are not attached",
                state.as_str()
            )));
        }
        match &host {
            Some((h, first)) if *h != v.host_id => {
                return Err(ApiError::field(
                    "volumes",
                    format!("volumes {first:?} and {name:?} are on different hosts; one VM takes volumes of one host"),
                ));
            }
            Some(_) => {}
            None => host = Some((v.host_id, name.clone())),
        }
        ids.push(v.id);
    }
    Ok((ids, host.map(|h| h.0)))
}

/// A member ready for admission, less its name and id.
pub struct Prepared {
    pub spec: VmSpec,
    pub nics: Vec<PlannedNic>,
    pub roce: bool,
    /// Volumes to attach, and the host they tie the VM to.
    pub volumes: Vec<Uuid>,
    pub on_host: Option<Uuid>,
    /// Project shares to mount.
    pub shares: Vec<crate::app::shares::PlannedMount>,
}

impl Prepared {
    pub fn member(&self, name: String) -> Member {
        Member {
            id: Uuid::now_v7(),
            name,
            spec: self.spec.clone(),
            networked: !self.nics.is_empty(),
            roce: self.roce,
            nics: self.nics.clone(),
            on_host: self.on_host,
            avoid: Vec::new(),
            volumes: self.volumes.clone(),
            shares: self.shares.clone(),
            shared: !self.shares.is_empty(),
        }
    }
}

/// Refuses a VM of `spec` to a tenant without points, where the rate card
/// prices what it runs on.
pub async fn budget_allows(
    st: &AppState,
    tenant: &tenants::Model,
    spec: &VmSpec,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let classes = crate::app::budget::vm_classes(spec);
    let level = crate::app::metering::level_of(spec);
    crate::app::budget::check(&st.db, tenant, &classes, level, now).await
}

/// A member creates a VM: access, budget, the spec and NICs, a free name,
/// then admission (placement, quota, the rows, the wake-ups). Answers the
/// tenant and the new VM.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &VmCreate,
) -> Result<(tenants::Model, vms::Model), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating VMs")?;
    if body.queue && body.public_ip {
        // The address would be held (and charged) while the VM waits.
        return Err(ApiError::field(
            "queue",
            "a queued VM gets no public address in the same request: attach one once it runs",
        ));
    }
    crate::app::churn::take(st, &tenant, "creating VMs")?;
    let prepared = prepare(st, &tenant, body, "networks.segment", "the VM's").await?;
    let reachable_on =
        match (body.public_ip, first_ethernet(&prepared)) {
            (false, _) => None,
            (true, Some(segment)) => Some(segment),
            (true, None) => return Err(ApiError::field(
                "public_ip",
                "a public address needs a network: put the VM on an Ethernet segment (networks)",
            )),
        };
    budget_allows(st, &tenant, &prepared.spec, actor.at).await?;
    let name_taken = || {
        ApiError::Conflict(format!(
            "tenant {:?} already has a VM named {:?}",
            tenant.name, body.name
        ))
    };
    if crate::store::vms::named(&st.db, tenant.id, std::slice::from_ref(&body.name))
        .await?
        .is_some()
    {
        return Err(name_taken());
    }
    let member = prepared.member(body.name.clone());
    let job = Admission {
        tenant: &tenant,
        members: std::slice::from_ref(&member),
        rows: Rows::New {
            actor,
            cluster: None,
        },
        near: None,
        one_unit: false,
        queue: body.queue,
    };
    // The address before the VM: a pool or quota without one refuses the
    // request before anything is made.
    let address = match reachable_on {
        Some(_) => Some(
            crate::app::public_net::allocate(
                st,
                actor,
                &tenant.name,
                &PublicIpAllocate { pool: None },
            )
            .await?
            .address,
        ),
        None => None,
    };
    let admitted = match admit(st, job).await {
        Ok(_) => Ok(()),
        Err(ApiError::Conflict(_)) => Err(name_taken()),
        Err(e) => Err(e),
    };
    if let Err(e) = admitted {
        // Not made: the address goes back (a failure to is only logged:
        // the caller's error is the VM's).
        if let Some(a) = &address {
            if let Err(r) = crate::app::public_net::release(st, actor, &tenant.name, a).await {
                tracing::warn!(address = %a, error = %r, "an address allocated for a VM not made was not released");
            }
        }
        return Err(e);
    }
    let vm = vms::Entity::find_by_id(member.id)
        .one(&st.db)
        .await?
        .ok_or_else(name_taken)?;
    if let (Some(a), Some(segment)) = (address, reachable_on) {
        open_to_ssh(st, actor, &tenant, &vm, &a, &segment).await?;
    }
    Ok((tenant, vm))
}

/// The first Ethernet segment a prepared VM is on.
fn first_ethernet(p: &Prepared) -> Option<String> {
    p.nics
        .iter()
        .find(|n| n.kind == SegmentKind::Ethernet)
        .map(|n| n.segment.name.clone())
}

/// `--public-ip`: the allocated address attached to the VM's NIC on
/// `segment`, and TCP 22 opened in that segment's ingress rules unless a
/// rule from anywhere opens it already. Should either fail, the VM stands
/// and says so in its events, and the address goes back.
async fn open_to_ssh(
    st: &AppState,
    actor: &Actor,
    tenant: &tenants::Model,
    vm: &vms::Model,
    address: &str,
    segment: &str,
) -> Result<(), ApiError> {
    let attach = PublicIpAttach {
        vm: vm.name.clone(),
        segment: Some(segment.to_owned()),
    };
    let done = async {
        crate::app::public_net::attach(st, actor, &tenant.name, address, &attach).await?;
        let seg = crate::app::segments::show(st, actor, &tenant.name, segment).await?;
        if !crate::domain::ingress::opens_to_all(&seg.ingress, 22) {
            let ssh: IngressRule = "tcp:22:0.0.0.0/0".parse().map_err(ApiError::Internal)?;
            let mut rules = seg.ingress.clone();
            rules.push(ssh);
            crate::app::segments::set_ingress(
                st,
                actor,
                &tenant.name,
                segment,
                &SegmentIngress { rules },
            )
            .await?;
        }
        Ok::<(), ApiError>(())
    }
    .await;
    if let Err(e) = done {
        let _ = crate::app::public_net::release(st, actor, &tenant.name, address).await;
        let message = format!("public address {address} not attached, released: {e}");
        crate::store::vms::event(&st.db, vm, actor.at, "public-ip", message).await?;
    }
    Ok(())
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
    let space = &layout.address_space;
    Some(VmPlacement {
        gpus,
        numa,
        firmware: match space.firmware {
            kumo_topology::guest_layout::Firmware::Efi => "efi",
            kumo_topology::guest_layout::Firmware::Bios => "bios",
        }
        .into(),
        mmio64_bytes: space.mmio64_bytes,
        phys_bits: space.phys_bits,
    })
}

/// The VM as the API shows it, given its host and the host's topology. A
/// VM on an unreachable host is `unknown`: it may be running; nobody can tell.
fn view_on(
    v: &vms::Model,
    tenant: &str,
    host: Option<(&hosts::Model, &HostTopology)>,
    cluster: Option<&str>,
    networks: Vec<VmNetwork>,
    shares: Vec<kumo_api_types::ShareMount>,
    queue: Option<kumo_api_types::QueueStanding>,
) -> Result<Vm, ApiError> {
    let mut state = stored_state(v)?;
    let unreachable = match host {
        Some((h, _)) => host_state(h)? == HostState::Unreachable,
        None => false,
    };
    if unreachable && !matches!(state, VmState::Deleting | VmState::Lost) {
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
        spec: crate::domain::specs::as_shown(stored_spec(v)?),
        placement,
        guest_condition: v.guest_condition.clone(),
        preempt_deadline: v.preempt_deadline,
        scheduled_events: match host {
            Some((h, _)) => crate::app::maintenance::events_of(v, h)?,
            None => Vec::new(),
        },
        cluster: cluster.map(str::to_owned),
        borrowed_since: v.borrowed_at,
        queue,
        networks,
        shares,
        created_at: v.created_at,
        updated_at: v.updated_at,
    })
}

/// A VM as the API shows it: its host, placement, cluster and networks.
pub async fn view(db: &impl ConnectionTrait, v: &vms::Model, tenant: &str) -> Result<Vm, ApiError> {
    let host = match v.host_id {
        Some(h) => crate::store::hosts::by_id(db, h).await?,
        None => None,
    };
    let topo = host.as_ref().map(stored_topology).transpose()?;
    let cluster = match v.cluster_id {
        Some(c) => crate::store::clusters::by_id(db, c).await?.map(|c| c.name),
        None => None,
    };
    let networks = crate::store::segments::networks_of(db, &[v.id])
        .await?
        .remove(&v.id)
        .unwrap_or_default();
    let shares = crate::app::shares::mounts_shown(db, &[(v.id, v.name.as_str())])
        .await?
        .remove(&v.id)
        .unwrap_or_default();
    let queue = if v.state == VmState::Queued.as_str() {
        crate::store::queue::standings(db, &[v.id])
            .await?
            .remove(&v.id)
    } else {
        None
    };
    view_on(
        v,
        tenant,
        host.as_ref().zip(topo.as_deref()),
        cluster.as_deref(),
        networks,
        shares,
        queue,
    )
}

/// One page of a tenant's VMs, by name (any member).
pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Vm>, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = crate::store::vms::page(&st.reads, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |v| v.name.clone());
    // Each host is read (and its topology parsed) once for the whole page.
    let host_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.host_id).collect();
    let mut hosts_by_id = HashMap::new();
    for h in crate::store::hosts::by_ids(&st.reads, host_ids).await? {
        let topo = stored_topology(&h)?;
        hosts_by_id.insert(h.id, (h, topo));
    }
    let cluster_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.cluster_id).collect();
    let clusters_by_id = crate::store::clusters::names_by_id(&st.reads, cluster_ids).await?;
    let mut networks = crate::store::segments::networks_of(
        &st.reads,
        &rows.iter().map(|v| v.id).collect::<Vec<_>>(),
    )
    .await?;
    let named: Vec<(Uuid, &str)> = rows.iter().map(|v| (v.id, v.name.as_str())).collect();
    let mut shares = crate::app::shares::mounts_shown(&st.reads, &named).await?;
    let queued: Vec<Uuid> = rows
        .iter()
        .filter(|v| v.state == VmState::Queued.as_str())
        .map(|v| v.id)
        .collect();
    let mut standings = crate::store::queue::standings(&st.reads, &queued).await?;
    let mut items = Vec::with_capacity(rows.len());
    for v in &rows {
        let host = v
            .host_id
            .and_then(|id| hosts_by_id.get(&id))
            .map(|(h, t)| (h, &**t));
        let cluster = v
            .cluster_id
            .and_then(|c| clusters_by_id.get(&c))
            .map(String::as_str);
        items.push(view_on(
            v,
            &tenant.name,
            host,
            cluster,
            networks.remove(&v.id).unwrap_or_default(),
            shares.remove(&v.id).unwrap_or_default(),
            standings.remove(&v.id),
        )?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// A tenant's VM with its placement (any member).
pub async fn show(st: &AppState, actor: &Actor, tenant: &str, vm: &str) -> Result<Vm, ApiError> {
    let (tenant, _) = tenant_access(&st.reads, &actor.caller, tenant).await?;
    let vm = find_vm(&st.reads, &tenant, vm).await?;
    view(&st.reads, &vm, &tenant.name).await
}

/// The NCCL topology file a placed VM's guest gets (any member); 409 for
/// a VM not on a host.
pub async fn nccl_topology(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
) -> Result<String, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let vm = find_vm(&st.db, &tenant, vm).await?;
    let not_placed = || ApiError::Conflict("the VM is not placed on a host".into());
    let host = match vm.host_id {
        Some(h) => crate::store::hosts::by_id(&st.db, h)
            .await?
            .ok_or_else(not_placed)?,
        None => return Err(not_placed()),
    };
    let placed = stored_placement(&vm)?.ok_or_else(not_placed)?;
    let topo = stored_topology(&host)?;
    nccl_xml(&topo, &placed)
}

pub fn nccl_xml(topo: &HostTopology, placed: &Placement) -> Result<String, ApiError> {
    let layout = guest_layout(topo, placed).map_err(|e| ApiError::Internal(e.to_string()))?;
    kumo_topology::nccl_xml::nccl_topology_xml(topo, &layout)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// One page of a tenant's VMs' lifecycle events, newest first (any member).
pub async fn events(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<VmEvent>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let before = paging.before_id()?;
    let rows = crate::store::vms::events_page(&st.db, tenant.id, before, &paging).await?;
    let (rows, next) = paging.finish(rows, |e| e.id.to_string());
    Ok(Page {
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
    })
}
