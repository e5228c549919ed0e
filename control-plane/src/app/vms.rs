//! VM use cases: lifecycle actions (start, stop, reboot, delete) and the
//! removal of a VM row with what goes with it.

use chrono::{DateTime, Utc};
use kumo_api_types::{Role, VmState};
use sea_orm::{ActiveModelTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::{self, Action};
use crate::entity::{tenants, vms};
use crate::error::ApiError;
use crate::store::hosts::bump_revision;
use crate::store::vms::{desired_power, event, find_vm_to_change, power_str, stored_state};

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
    crate::app::metering::transition(txn, vm, stored_state(vm), effect.state, None, now).await?;
    let mut active: vms::ActiveModel = vm.clone().into();
    active.state = Set(effect.state.as_str().to_owned());
    active.desired_power = Set(power_str(effect.desired_power).to_owned());
    if effect.bump_generation {
        active.power_generation = Set(vm.power_generation + 1);
    }
    active.updated_at = Set(now);
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
