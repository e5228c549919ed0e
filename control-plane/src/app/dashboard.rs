//! The actor's overview: each tenant they belong to, with its VMs, GPUs in
//! use against its GPU quota and its balance, and what was charged to all
//! of them since a given time.

use chrono::{DateTime, Utc};
use kumo_billing::Decimal;

use crate::context::{Actor, AppState};
use crate::error::ApiError;

/// One of the actor's tenants at a glance.
#[derive(Debug, Clone)]
pub struct TenantSummary {
    pub name: String,
    pub display_name: String,
    /// The actor's role in it, as stored.
    pub role: String,
    pub vms: u64,
    pub gpus_used: u64,
    /// GPUs the tenant may hold, all models together.
    pub gpus_quota: i64,
    /// `None` for a tenant never granted points.
    pub balance: Option<Decimal>,
}

/// The actor's tenants (in membership order) and their charges.
#[derive(Debug, Clone)]
pub struct Dashboard {
    pub tenants: Vec<TenantSummary>,
    /// Every charge of those tenants for periods from `since` on: when its
    /// period starts and its amount, tenant after tenant.
    pub charges: Vec<(DateTime<Utc>, Decimal)>,
    /// Their GPU VMs idle an hour or more (or already told so), with the
    /// policy they are under.
    pub idle: Vec<(String, kumo_api_types::IdlePolicy, kumo_api_types::IdleVm)>,
}

/// The dashboard of the actor's tenants (only those they are a member of,
/// admins included), with charges for periods starting at `since` or later.
pub async fn dashboard(
    st: &AppState,
    actor: &Actor,
    since: DateTime<Utc>,
) -> Result<Dashboard, ApiError> {
    let mut tenants = Vec::new();
    let mut tenant_ids = Vec::new();
    let mut idle = Vec::new();
    for m in crate::store::tenancy::memberships_of(&st.db, actor.caller.user.id).await? {
        let Some(t) = crate::store::tenancy::tenant_by_id(&st.db, m.tenant_id).await? else {
            continue;
        };
        tenant_ids.push(t.id);
        let vms = crate::store::vms::count_of(&st.db, t.id).await?;
        let gpus_used = crate::store::vms::usage(&st.db, t.id).await?.gpus_total();
        let gpus_quota = crate::store::tenancy::gpu_quota_total(&st.db, t.id).await?;
        let (grants, charged) = crate::store::billing::ledger_of(&st.db, &t).await?;
        let balance = if grants.is_empty() {
            None
        } else {
            Some(
                crate::store::billing::balance_of(&grants, &charged, st.config.clock.now())?
                    .balance,
            )
        };
        let r = crate::app::idle_gpus::report_of(st, &t).await?;
        for v in r.vms {
            if v.idle_since.is_some() && (v.notices > 0 || v.idle_minutes >= 60) {
                idle.push((t.name.clone(), r.policy, v));
            }
        }
        tenants.push(TenantSummary {
            name: t.name,
            display_name: t.display_name,
            role: m.role,
            vms,
            gpus_used,
            gpus_quota,
            balance,
        });
    }
    let mut charges = Vec::new();
    for id in tenant_ids {
        for c in crate::store::billing::charges_since(&st.db, id, since).await? {
            charges.push((c.period_from, kumo_billing::from_micro(c.amount_micro)));
        }
    }
    Ok(Dashboard {
        tenants,
        charges,
        idle,
    })
}
