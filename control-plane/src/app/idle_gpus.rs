//! Idle GPUs: the pass that tells projects of GPU VMs idle under their
//! policy (half the window, near its end) and then takes the policy's
//! action (a last notice, or shelving); projects' own policies and
//! webhooks; owners' exemptions. Every step is a VM event, an audit entry
//! and, where the project set one, a webhook post. The figures are the
//! guests' own (advisory): an idle spell only starts from minutes in
//! which every GPU said it was below the threshold.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use kumo_api_types::{
    IdleAction, IdleExemptionRequest, IdlePolicy, IdlePolicyUpdate, IdlePolicyView, IdleReport,
    IdleVm, Role, VmState, WebhookView,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
use serde_json::json;
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::idle_gpus::{
    action_at, counted_from, due, exempt_total, exemption, idle_since, no_laxer, validate,
    webhook_target, webhook_url, Step, MAX_GAP_MINUTES,
};
use crate::domain::lifecycle::Action;
use crate::entity::{idle_policies, tenants, vm_idle, vms};
use crate::error::ApiError;
use crate::store::idle_gpus as store;
use crate::store::vms::{event, find_vm, stored_spec};

/// A project's policy: its own fields over the platform's.
fn effective(platform: &IdlePolicy, own: Option<&idle_policies::Model>) -> IdlePolicy {
    let Some(o) = own else {
        return *platform;
    };
    IdlePolicy {
        utilization_pct: o.utilization_pct.unwrap_or(platform.utilization_pct),
        hours: o
            .hours
            .and_then(|h| u32::try_from(h).ok())
            .unwrap_or(platform.hours),
        action: match o.action.as_deref() {
            Some("shelve") => IdleAction::Shelve,
            Some("notice") => IdleAction::Notice,
            _ => platform.action,
        },
    }
}

/// The policy a project is under.
async fn policy_of(st: &AppState, tenant: Uuid) -> Result<IdlePolicy, ApiError> {
    let own = store::policy(&st.db, tenant).await?;
    Ok(effective(&st.config.idle.policy, own.as_ref()))
}

fn blank(vm: &vms::Model) -> vm_idle::Model {
    vm_idle::Model {
        vm_id: vm.id,
        tenant_id: vm.tenant_id,
        idle_since: None,
        notices: 0,
        noticed_at: None,
        exempt_until: None,
        exempt_reason: None,
        exempt_by: None,
        exempt_secs: 0,
    }
}

fn hours_text(d: Duration) -> String {
    let m = d.num_minutes();
    if m < 120 {
        format!("{m} min")
    } else {
        format!("{:.1} h", m as f64 / 60.0)
    }
}

/// One pass over every running GPU VM. Per-VM errors are logged and the
/// pass goes on: one VM's trouble never stops the others' notices.
/// Answers how many steps (notices and actions) it took.
pub async fn pass(st: &AppState) -> Result<usize, ApiError> {
    let running = vms::Entity::find()
        .filter(vms::Column::State.eq(VmState::Running.as_str()))
        .all(&st.db)
        .await?;
    let own: BTreeMap<Uuid, idle_policies::Model> = store::policies(&st.db)
        .await?
        .into_iter()
        .map(|p| (p.tenant_id, p))
        .collect();
    // Every VM's idle row in one read, not one per VM each minute.
    let mut rows: BTreeMap<Uuid, vm_idle::Model> = store::all_vms(&st.db)
        .await?
        .into_iter()
        .map(|r| (r.vm_id, r))
        .collect();
    st.idle_checked
        .keep(&running.iter().map(|v| v.id).collect());
    let mut steps = 0;
    for vm in running {
        let policy = effective(&st.config.idle.policy, own.get(&vm.tenant_id));
        // Judged up to here: the next pass reads from about here on.
        let judged = st.config.clock.now();
        match one(st, &vm, rows.remove(&vm.id), &policy).await {
            Ok(step) => {
                st.idle_checked.set(vm.id, judged);
                steps += usize::from(step);
            }
            Err(e) => tracing::warn!(vm = %vm.id, error = %e, "idle check failed"),
        }
    }
    Ok(steps)
}

/// One VM: its spell brought up to date, and the step due taken.
async fn one(
    st: &AppState,
    vm: &vms::Model,
    old: Option<vm_idle::Model>,
    policy: &IdlePolicy,
) -> Result<bool, ApiError> {
    let gpus = stored_spec(vm)?.gpus;
    if gpus == 0 {
        return Ok(false);
    }
    let now = st.config.clock.now();
    let gap = Duration::minutes(MAX_GAP_MINUTES + 1);
    // From the last judgement on (a gap before it, so a spell's start is
    // seen whole), or the policy's whole window when this replica has not
    // judged the VM yet: the idle row carries a longer spell.
    let window = now - Duration::hours(i64::from(policy.hours)) - gap;
    let from = st
        .idle_checked
        .get(vm.id)
        .map_or(window, |at| (at - gap).max(window));
    let minutes = store::use_by_minute(&st.db, vm.id, from).await?;
    let mut row = old.clone().unwrap_or_else(|| blank(vm));
    let mut since = idle_since(&minutes, gpus, policy.utilization_pct, now);
    // A spell longer than the minutes read goes on from where it began
    // (minutes older than the telemetry's minutes window are hours: a
    // spell reaching back to that window's start goes on too).
    let floor = from.max(crate::app::gpu_telemetry::minutes_begin(st));
    if let (Some(s), Some(began)) = (since, row.idle_since) {
        if began < s && s - floor <= gap {
            since = Some(began);
        }
    }
    let ended = since.is_none() && row.notices > 0 && row.notices < 3;
    if since != row.idle_since {
        row.idle_since = since;
        row.notices = 0;
        row.noticed_at = None;
    }
    let exempt = row.exempt_until.is_some_and(|u| u > now);
    let step = match since {
        Some(s) if !exempt => {
            let start = counted_from(s, row.exempt_until);
            due(
                policy,
                now - start,
                u8::try_from(row.notices).unwrap_or(3),
                row.noticed_at,
                now,
            )
        }
        _ => None,
    };
    if old.as_ref() == Some(&row) && step.is_none() {
        return Ok(false);
    }
    if let Some(s) = step {
        row.notices = i16::from(s.notices());
        row.noticed_at = Some(now);
    }
    let txn = st.db.begin().await?;
    if !store::put_vm(&txn, old.as_ref(), &row).await? {
        return Ok(false); // another replica's pass did it
    }
    if ended {
        event(
            &txn,
            vm,
            now,
            "idle.ended",
            "its GPUs are busy again (or cannot say): the idle notices no longer apply",
        )
        .await?;
    }
    let Some(step) = step else {
        txn.commit().await?;
        return Ok(false);
    };
    let start = counted_from(row.idle_since.unwrap_or(now), row.exempt_until);
    let idle_for = hours_text(now - start);
    let threshold = policy.utilization_pct;
    let what = match policy.action {
        IdleAction::Shelve => {
            "it will be shelved (its GPUs go back to the pool; its disk and volumes are kept)"
        }
        IdleAction::Notice => "its project will be told again",
    };
    let (kind, message, action) = match step {
        Step::Half | Step::Final => {
            let at = action_at(policy, start, row.notices as u8, row.noticed_at)
                .unwrap_or(now)
                .format("%Y-%m-%d %H:%M UTC");
            let kind = if step == Step::Half {
                "idle.notice"
            } else {
                "idle.warning"
            };
            (
                kind,
                format!(
                    "every GPU below {threshold} % for {idle_for}; at {at} {what} unless they are used or an owner exempts it"
                ),
                "vm.idle_notice",
            )
        }
        Step::Act => match policy.action {
            IdleAction::Shelve => {
                let reason = format!(
                    "idle policy: every GPU below {threshold} % for {idle_for}"
                );
                match crate::app::vms::apply_action(&txn, vm, Action::Shelve, &reason, now).await
                {
                    Ok(_) => {}
                    // It changed meanwhile (stopped, deleted): nothing to do.
                    Err(ApiError::Conflict(_)) => return Ok(false),
                    Err(e) => return Err(e),
                }
                (
                    "idle.shelved",
                    format!("every GPU below {threshold} % for {idle_for}: shelved; unshelve it to go on"),
                    "vm.idle_shelve",
                )
            }
            IdleAction::Notice => (
                "idle.noticed",
                format!(
                    "every GPU below {threshold} % for {idle_for}, the whole window: please shelve or delete it if it is not needed"
                ),
                "vm.idle_notice",
            ),
        },
    };
    event(&txn, vm, now, kind, message.clone()).await?;
    let tenant = tenants::Entity::find_by_id(vm.tenant_id).one(&txn).await?;
    let who = audit::Who {
        name: "idle-policy".into(),
        source_ip: "",
        request_id: "",
        client_request_id: None,
        at: now,
        tenant: tenant.as_ref(),
    };
    audit::record_by(&txn, &who, action, &format!("{}: {kind}", vm.name)).await?;
    if let Some(h) = vm.host_id.filter(|_| step == Step::Act) {
        crate::store::hosts::bump_revision(&txn, h).await?;
    }
    txn.commit().await?;
    if step == Step::Act {
        if let Some(h) = vm.host_id {
            st.signals.notify(h);
        }
    }
    let project = tenant.map(|t| t.name).unwrap_or_default();
    crate::app::webhooks::notify(
        st,
        vm.tenant_id,
        "vm.idle",
        json!({
            "text": format!("Kumo: VM {} of project {project}: {message}", vm.name),
            "event": kind,
            "project": project,
            "vm": vm.name,
            "vm_id": vm.id,
            "idle_since": row.idle_since,
            "at": now,
        }),
    );
    Ok(true)
}

/// The project's policy as it stands (any member).
pub async fn policy(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
) -> Result<IdlePolicyView, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    view(st, &tenant).await
}

async fn view(st: &AppState, tenant: &tenants::Model) -> Result<IdlePolicyView, ApiError> {
    let platform = st.config.idle.policy;
    let own = store::policy(&st.db, tenant.id).await?;
    Ok(IdlePolicyView {
        tenant: tenant.name.clone(),
        effective: effective(&platform, own.as_ref()),
        platform,
        own: own.as_ref().map(|o| effective(&platform, Some(o))),
        webhook: own.as_ref().and_then(|o| {
            o.webhook_target.clone().map(|target| WebhookView {
                target,
                last_delivery_at: o.webhook_last_at,
                last_result: o.webhook_last_result.clone(),
            })
        }),
        max_exemption_days: st.config.idle.max_exemption_days,
        set_by: own.as_ref().map(|o| o.set_by.clone()),
        set_at: own.map(|o| o.set_at),
    })
}

/// Sets the project's own policy and webhook (owners, only stricter than
/// the platform's; administrators, any).
pub async fn set_policy(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    u: &IdlePolicyUpdate,
) -> Result<IdlePolicyView, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "setting the project's idle policy")?;
    let platform = st.config.idle.policy;
    let wanted = IdlePolicy {
        utilization_pct: u.utilization_pct.unwrap_or(platform.utilization_pct),
        hours: u.hours.unwrap_or(platform.hours),
        action: u.action.unwrap_or(platform.action),
    };
    validate(&wanted).map_err(|(field, e)| ApiError::field(field, e))?;
    if !actor.caller.is_admin() {
        no_laxer(&wanted, &platform).map_err(|e| ApiError::field("utilization_pct", e))?;
    }
    let (sealed, target) = match &u.webhook_url {
        Some(raw) => {
            let url = webhook_url(raw, st.config.idle.allow_loopback_webhooks)
                .map_err(|e| ApiError::field("webhook_url", e))?;
            (
                Some(crate::app::webhooks::seal(st, tenant.id, url.as_str())?),
                Some(webhook_target(&url)),
            )
        }
        None => (None, None),
    };
    let now = actor.at;
    let row = idle_policies::Model {
        tenant_id: tenant.id,
        utilization_pct: u.utilization_pct,
        hours: u.hours.map(|h| h as i32),
        action: u.action.map(|a| a.as_str().to_owned()),
        webhook_sealed: sealed,
        webhook_target: target.clone(),
        webhook_last_at: None,
        webhook_last_result: None,
        set_by: actor.caller.user.name.clone(),
        set_at: now,
    };
    let txn = st.db.begin().await?;
    store::put_policy(&txn, row).await?;
    audit::record(
        &txn,
        actor,
        "tenant.idle_policy",
        Some(&tenant),
        &format!(
            "below {} % for {} h: {}{}",
            wanted.utilization_pct,
            wanted.hours,
            wanted.action.as_str(),
            target.map(|t| format!("; webhook {t}")).unwrap_or_default()
        ),
    )
    .await?;
    txn.commit().await?;
    view(st, &tenant).await
}

/// Back to the platform's policy, without a webhook (owners).
pub async fn reset_policy(st: &AppState, actor: &Actor, tenant: &str) -> Result<(), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "resetting the project's idle policy")?;
    let txn = st.db.begin().await?;
    if store::delete_policy(&txn, tenant.id).await? {
        audit::record(
            &txn,
            actor,
            "tenant.idle_policy_reset",
            Some(&tenant),
            "platform's",
        )
        .await?;
    }
    txn.commit().await?;
    Ok(())
}

/// The project's running GPU VMs as the policy sees them (any member).
pub async fn report(st: &AppState, actor: &Actor, tenant: &str) -> Result<IdleReport, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    report_of(st, &tenant).await
}

/// What [`report`] answers, for a tenant already authorised (the portal).
pub async fn report_of(st: &AppState, tenant: &tenants::Model) -> Result<IdleReport, ApiError> {
    let policy = policy_of(st, tenant.id).await?;
    let rows: BTreeMap<Uuid, vm_idle::Model> = store::of_tenant(&st.db, tenant.id)
        .await?
        .into_iter()
        .map(|r| (r.vm_id, r))
        .collect();
    let now = st.config.clock.now();
    let running = vms::Entity::find()
        .filter(vms::Column::TenantId.eq(tenant.id))
        .filter(vms::Column::State.eq(VmState::Running.as_str()))
        .all(&st.db)
        .await?;
    let mut out = Vec::new();
    for vm in running {
        let gpus = stored_spec(&vm)?.gpus;
        if gpus == 0 {
            continue;
        }
        out.push(idle_vm(&vm, gpus, rows.get(&vm.id), &policy, now));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(IdleReport { policy, vms: out })
}

fn idle_vm(
    vm: &vms::Model,
    gpus: u32,
    row: Option<&vm_idle::Model>,
    policy: &IdlePolicy,
    now: DateTime<Utc>,
) -> IdleVm {
    let since = row.and_then(|r| r.idle_since);
    let exempt_until = row.and_then(|r| r.exempt_until);
    let start = since.map(|s| counted_from(s, exempt_until));
    let notices = row.map_or(0, |r| u8::try_from(r.notices).unwrap_or(3));
    let exempt = exempt_until.filter(|u| *u > now);
    IdleVm {
        vm: vm.id,
        name: vm.name.clone(),
        gpus,
        idle_since: since,
        idle_minutes: start.map_or(0, |s| (now - s).num_minutes().max(0)),
        notices,
        action_at: start
            .filter(|_| exempt.is_none())
            .and_then(|s| action_at(policy, s, notices, row.and_then(|r| r.noticed_at))),
        exempt_until: exempt,
        exempt_reason: exempt.and(row.and_then(|r| r.exempt_reason.clone())),
        exempt_by: exempt.and(row.and_then(|r| r.exempt_by.clone())),
    }
}

/// An owner exempts a VM until a date, with a reason (administrators past
/// the platform's longest exemption). Notices start over when it ends.
/// A VM's exemptions, renewals included, add up to at most `[idle]
/// max_exempt_days_total` (administrators may go past it; theirs count
/// too), so an owner cannot keep idle GPUs from the pool by renewing.
pub async fn exempt(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    req: &IdleExemptionRequest,
) -> Result<IdleVm, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "exempting a VM from the idle policy")?;
    let vm = find_vm(&st.db, &tenant, vm).await?;
    let now = actor.at;
    let max = (!actor.caller.is_admin()).then_some(st.config.idle.max_exemption_days);
    exemption(&req.reason, req.until, now, max).map_err(|(field, e)| ApiError::field(field, e))?;
    let reason = req.reason.trim().to_owned();
    let cap = (!actor.caller.is_admin())
        .then(|| Duration::days(i64::from(st.config.idle.max_exempt_days_total)));
    exemption_change(st, actor, &tenant, &vm, |row| {
        let total = exempt_total(
            Duration::try_seconds(row.exempt_secs).unwrap_or(Duration::MAX),
            row.exempt_until,
            Some(req.until),
            now,
            cap,
        )
        .map_err(|e| ApiError::field("until", e))?;
        row.exempt_secs = total.num_seconds();
        row.exempt_until = Some(req.until);
        row.exempt_reason = Some(reason.clone());
        row.exempt_by = Some(actor.caller.user.name.clone());
        Ok((
            "idle.exempted",
            format!(
                "exempted from the idle policy until {} by {}: {reason}",
                req.until.format("%Y-%m-%d %H:%M UTC"),
                actor.caller.user.name
            ),
            "vm.idle_exempt",
        ))
    })
    .await
}

/// Ends a VM's exemption now (owners); the idle count starts over.
pub async fn unexempt(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
) -> Result<IdleVm, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Owner, "ending a VM's idle exemption")?;
    let vm = find_vm(&st.db, &tenant, vm).await?;
    let now = actor.at;
    exemption_change(st, actor, &tenant, &vm, |row| {
        // What was left of it no longer counts against the VM's total.
        let total = exempt_total(
            Duration::try_seconds(row.exempt_secs).unwrap_or(Duration::MAX),
            row.exempt_until,
            None,
            now,
            None,
        )
        .map_err(ApiError::validation)?;
        row.exempt_secs = total.num_seconds();
        row.exempt_until = Some(now);
        row.exempt_reason = None;
        row.exempt_by = None;
        Ok((
            "idle.exemption_ended",
            format!("exemption ended by {}", actor.caller.user.name),
            "vm.idle_unexempt",
        ))
    })
    .await
}

async fn exemption_change(
    st: &AppState,
    actor: &Actor,
    tenant: &tenants::Model,
    vm: &vms::Model,
    change: impl Fn(&mut vm_idle::Model) -> Result<(&'static str, String, &'static str), ApiError>,
) -> Result<IdleVm, ApiError> {
    let gpus = stored_spec(vm)?.gpus;
    if gpus == 0 {
        return Err(ApiError::Conflict(format!(
            "VM {:?} has no GPU: the idle policy does not apply",
            vm.name
        )));
    }
    let policy = policy_of(st, tenant.id).await?;
    // A concurrent pass may change the row: read, change, write while it
    // still reads the same, a few times.
    for _ in 0..3 {
        let old = store::vm(&st.db, vm.id).await?;
        let mut row = old.clone().unwrap_or_else(|| blank(vm));
        let (kind, message, action) = change(&mut row)?;
        row.notices = 0;
        row.noticed_at = None;
        let txn = st.db.begin().await?;
        if !store::put_vm(&txn, old.as_ref(), &row).await? {
            continue;
        }
        event(&txn, vm, actor.at, kind, message.clone()).await?;
        audit::record(
            &txn,
            actor,
            action,
            Some(tenant),
            &format!("{}: {message}", vm.name),
        )
        .await?;
        txn.commit().await?;
        return Ok(idle_vm(
            vm,
            gpus,
            Some(&row),
            &policy,
            st.config.clock.now(),
        ));
    }
    Err(ApiError::Contention)
}
