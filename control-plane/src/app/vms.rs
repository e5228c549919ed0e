//! VM use cases: lifecycle actions (start, stop, reboot, delete) and the
//! removal of a VM row with what goes with it.

use chrono::{DateTime, Utc};
use std::net::Ipv4Addr;

use kumo_api_types::{NetworkRequest, Role, SegmentKind, VmCreate, VmSpec, VmState};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::admission::{admit, Member};
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::{self, Action};
use crate::domain::states::StoredText;
use crate::entity::{tenants, vms};
use crate::error::ApiError;
use crate::store::hosts::bump_revision;
use crate::store::segments::{stored_cidr, stored_gateway, stored_kind, PlannedNic};
use crate::store::vms::{desired_power, event, find_vm_to_change, stored_state};

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
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, &format!("{} of a VM", action.as_str()))?;
    if matches!(action, Action::Start) {
        crate::app::budget::check(st, &tenant).await?;
    }
    let txn = st.db.begin().await?;
    let vm = find_vm_to_change(&txn, &tenant, vm).await?;
    let updated = act_on(&txn, actor, &tenant, &vm, action, st.config.clock.now()).await?;
    txn.commit().await?;
    if let Some(h) = vm.host_id {
        st.signals.notify(h);
    }
    Ok((tenant, updated))
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
    let mut active: vms::ActiveModel = vm.clone().into();
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
    if effect.state == VmState::Deleted {
        event(txn, vm, now, "deleted", "never placed").await?;
        delete_row(txn, vm, now).await?;
    }
    if let Some(h) = vm.host_id {
        bump_revision(txn, h).await?;
    }
    Ok(updated)
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
    let peers = crate::app::host_network::touch_peers(txn, vm.id).await?;
    vms::Entity::delete_by_id(vm.id).exec(txn).await?;
    crate::store::segments::detach_all(txn, vm.id).await?;
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
    let spec = resolve_spec(st, body).await?;
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
    Ok(Prepared { spec, nics, roce })
}

/// A member ready for admission, less its name and id.
pub struct Prepared {
    pub spec: VmSpec,
    pub nics: Vec<PlannedNic>,
    pub roce: bool,
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
        }
    }
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
    crate::app::budget::check(st, &tenant).await?;
    let prepared = prepare(st, &tenant, body, "networks.segment", "the VM's").await?;
    let name_taken = || {
        ApiError::Conflict(format!(
            "tenant {:?} already has a VM named {:?}",
            tenant.name, body.name
        ))
    };
    if crate::store::vms::named(&st.db, tenant.id, &[body.name.clone()])
        .await?
        .is_some()
    {
        return Err(name_taken());
    }
    let member = prepared.member(body.name.clone());
    match admit(
        st,
        Some(actor),
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
    Ok((tenant, vm))
}
