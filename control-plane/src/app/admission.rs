//! Admitting VMs and clusters: placement on the capacity index, the quota,
//! and the one transaction that makes it true: VM rows, allocation rows
//! (a device has one holder), and each host's revision checked and bumped
//! (the capacity the placement saw is still the host's). A lost race
//! re-reads the host and tries again. A guaranteed request that does not
//! fit reclaims spot VMs and waits as `pending`; the reaper
//! ([`crate::app::jobs::reclaimer`]) places it once they are gone.

use chrono::{DateTime, Utc};
use kumo_api_types::{HostState, Power, ServiceLevel, VmSpec, VmState};
use kumo_scheduler::reclaim::{self, Plan};
use kumo_scheduler::{place_cluster, ClusterRequest, Index, Request, Strategy};
use kumo_topology::guest_layout::Placement;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, Set,
    TransactionTrait,
};
use uuid::Uuid;

use crate::app::audit;
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::states::{ClusterState, StoredText};
use crate::entity::{allocations, clusters, hosts, tenants, vms};
use crate::error::{is_unique_violation, ApiError};
use crate::store::allocations as allocation_rows;
use crate::store::capacity::holds;
use crate::store::vms::{event, stored_state};

/// Rounds of place → commit before giving up under heavy contention.
const ROUNDS: usize = 4;

/// A VM to admit (new) or to place (pending, already a row).
#[derive(Debug, Clone)]
pub struct Member {
    pub id: Uuid,
    pub name: String,
    pub spec: VmSpec,
    /// NICs to attach when the VM row is created.
    pub nics: Vec<crate::store::segments::PlannedNic>,
    /// It has NICs on segments (new ones in `nics`, or attached already):
    /// only hosts with an underlay address take it.
    pub networked: bool,
    /// On a RoCE segment: its GPUs' NICs are passed through as VFs.
    pub roce: bool,
}

/// What admission did.
pub enum Admitted {
    /// Placed on hosts now.
    Placed,
    /// Waiting for these spot VMs to be reclaimed.
    Pending { reclaiming: usize },
}

/// A reserved placement, applied to the index until committed or undone.
struct Reserved {
    host: Uuid,
    revision: i64,
    host_name: String,
    placement: Placement,
    model: Option<String>,
}

pub fn request(index: &Index, member: &Member) -> Result<Request, ApiError> {
    let spec = &member.spec;
    let model = match (&spec.gpu_model, spec.gpus) {
        (Some(m), g) if g > 0 => Some(
            index
                .model_id(m)
                .ok_or_else(|| ApiError::InsufficientCapacity(format!("no host has {m} GPUs")))?,
        ),
        _ => None,
    };
    Ok(Request {
        gpus: spec.gpus,
        model,
        vcpus: spec.vcpus,
        memory_mib: u64::from(spec.memory_gib) * 1024,
        unit: None,
        rails: None,
        networked: member.networked,
        roce: member.roce,
    })
}

/// Places every member (all or nothing) and applies them to the index.
fn reserve(
    st: &AppState,
    tenant: Uuid,
    members: &[Member],
) -> Result<Option<Vec<Reserved>>, ApiError> {
    let Some(first) = members.first() else {
        return Ok(Some(Vec::new()));
    };
    let mut index = st.capacity.lock();
    let req = request(&index, first)?;
    let spot = first.spec.service_level == ServiceLevel::Spot;
    let roce = first.roce;
    let ids: Vec<Uuid> = members.iter().map(|m| m.id).collect();
    let choices = if members.len() == 1 {
        match kumo_scheduler::place::place(&index, &req, Strategy::BestFit) {
            Some(mut c) => {
                c.hold.vm = ids[0];
                index.apply(c.host, c.hold.clone());
                vec![c]
            }
            None => return Ok(None),
        }
    } else {
        let cluster = ClusterRequest {
            size: members.len() as u32,
            member: req,
        };
        match place_cluster(&mut index, &cluster, &ids, Strategy::BestFit) {
            Some(c) => c,
            None => return Ok(None),
        }
    };
    let now = st.config.clock.now().timestamp();
    let mut out = Vec::with_capacity(choices.len());
    for c in choices {
        let h = &mut index.hosts[c.host];
        if let Some(x) = h.holds.iter_mut().find(|x| x.vm == c.hold.vm) {
            x.tenant = tenant;
            x.spot = spot;
            x.since = now;
        }
        let model = kumo_scheduler::profile::bits(c.hold.gpus)
            .next()
            .map(|i| h.profile.gpus[i].model);
        out.push(Reserved {
            host: h.id,
            revision: h.revision,
            host_name: h.name.clone(),
            placement: h.placement(&c.hold, roce),
            model: model.and_then(|m| index.model_name(m)).map(str::to_owned),
        });
    }
    Ok(Some(out))
}

fn unreserve(st: &AppState, members: &[Member], reserved: &[Reserved]) {
    let mut index = st.capacity.lock();
    for (m, r) in members.iter().zip(reserved) {
        if let Some(h) = index.position(r.host) {
            index.release(h, m.id);
        }
    }
}

enum CommitError {
    /// A device, a name or a host's revision was taken by someone else.
    Lost,
    Api(ApiError),
}

impl From<sea_orm::DbErr> for CommitError {
    fn from(e: sea_orm::DbErr) -> Self {
        if is_unique_violation(&e) {
            tracing::debug!(error = %e, "placement lost a race");
            CommitError::Lost
        } else {
            CommitError::Api(e.into())
        }
    }
}

impl From<ApiError> for CommitError {
    fn from(e: ApiError) -> Self {
        CommitError::Api(e)
    }
}

/// Holds the tenant's row for the rest of the transaction (PostgreSQL
/// `FOR UPDATE`; SQLite's single writer serialises anyway) and checks
/// that the tenant's VMs plus `adding` stay within its quota.
pub async fn check_quota(
    txn: &DatabaseTransaction,
    tenant: &tenants::Model,
    adding: &[&VmSpec],
) -> Result<(), ApiError> {
    crate::store::tenancy::lock_for_quota(txn, tenant.id).await?;
    let quota = crate::store::tenancy::load(txn, tenant.id).await?;
    let mut usage = crate::store::vms::usage(txn, tenant.id).await?;
    for s in adding {
        usage.add(s);
    }
    usage.check(&quota, &tenant.name)
}

/// The host's revision moves from what the placement saw, or the commit
/// is lost. Also refuses hosts that stopped taking VMs meanwhile.
pub async fn claim_host(
    txn: &DatabaseTransaction,
    host: Uuid,
    seen: i64,
) -> Result<bool, sea_orm::DbErr> {
    let r = hosts::Entity::update_many()
        .col_expr(
            hosts::Column::Revision,
            Expr::col(hosts::Column::Revision).add(1),
        )
        .filter(hosts::Column::Id.eq(host))
        .filter(hosts::Column::Revision.eq(seen))
        .filter(hosts::Column::State.eq(HostState::Ready.to_text()))
        .exec(txn)
        .await?;
    Ok(r.rows_affected == 1)
}

pub struct NewCluster<'a> {
    pub id: Uuid,
    pub name: &'a str,
    pub spec: &'a VmSpec,
}

/// One transaction for the whole placement.
#[allow(clippy::too_many_arguments)]
async fn commit(
    st: &AppState,
    ctx: Option<&Actor>,
    tenant: &tenants::Model,
    members: &[Member],
    reserved: Option<&[Reserved]>,
    existing: bool,
    cluster: Option<&NewCluster<'_>>,
    plan: Option<&Plan>,
) -> Result<(), CommitError> {
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let specs: Vec<VmSpec> = members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut s = m.spec.clone();
            if let Some(model) = reserved
                .and_then(|r| r.get(i))
                .and_then(|r| r.model.clone())
            {
                s.gpu_model = Some(model);
            }
            s
        })
        .collect();
    if !existing {
        check_quota(&txn, tenant, &specs.iter().collect::<Vec<_>>()).await?;
    }
    if let Some(c) = cluster.filter(|_| !existing) {
        clusters::ActiveModel {
            id: Set(c.id),
            tenant_id: Set(tenant.id),
            name: Set(c.name.to_owned()),
            size: Set(members.len() as i32),
            spec: Set(serde_json::to_string(c.spec).map_err(|e| ApiError::Internal(e.to_string()))?),
            state: Set(if reserved.is_some() {
                ClusterState::Placed
            } else {
                ClusterState::Pending
            }
            .to_text()
            .into()),
            created_at: Set(now),
        }
        .insert(&txn)
        .await?;
        if let Some(ctx) = ctx {
            audit::record(&txn, ctx, "cluster.create", Some(tenant), c.name).await?;
        }
    }
    if let (Some(c), true, Some(_)) = (cluster, existing, reserved) {
        clusters::Entity::update_many()
            .col_expr(
                clusters::Column::State,
                Expr::value(ClusterState::Placed.to_text()),
            )
            .filter(clusters::Column::Id.eq(c.id))
            .exec(&txn)
            .await?;
    }
    let mut claimed: Vec<Uuid> = Vec::new();
    let mut peers: Vec<Uuid> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let r = reserved.and_then(|r| r.get(i));
        let spec_json =
            serde_json::to_string(&specs[i]).map_err(|e| ApiError::Internal(e.to_string()))?;
        let placement_json = r
            .map(|r| serde_json::to_string(&r.placement))
            .transpose()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let state = if r.is_some() {
            VmState::Scheduled
        } else {
            VmState::Pending
        };
        let vm = if existing {
            let res = vms::Entity::update_many()
                .col_expr(vms::Column::State, Expr::value(state.as_str()))
                .col_expr(vms::Column::HostId, Expr::value(r.map(|r| r.host)))
                .col_expr(vms::Column::Placement, Expr::value(placement_json))
                .col_expr(vms::Column::Spec, Expr::value(spec_json))
                .col_expr(vms::Column::UpdatedAt, Expr::value(now))
                .filter(vms::Column::Id.eq(m.id))
                .filter(vms::Column::State.eq(VmState::Pending.as_str()))
                .exec(&txn)
                .await?;
            if res.rows_affected != 1 {
                // Deleted or placed by another replica meanwhile.
                return Err(CommitError::Lost);
            }
            vms::Entity::find_by_id(m.id)
                .one(&txn)
                .await?
                .ok_or(CommitError::Lost)?
        } else {
            vms::ActiveModel {
                id: Set(m.id),
                tenant_id: Set(tenant.id),
                name: Set(m.name.clone()),
                state: Set(state.as_str().to_owned()),
                reason: Set(None),
                host_id: Set(r.map(|r| r.host)),
                spec: Set(spec_json),
                placement: Set(placement_json),
                desired_power: Set(Power::Running.to_text().into()),
                power_generation: Set(0),
                guest_condition: Set(None),
                preempt_deadline: Set(None),
                cluster_id: Set(cluster.map(|c| c.id)),
                created_at: Set(now),
                updated_at: Set(now),
            }
            .insert(&txn)
            .await?
        };
        if !existing {
            crate::app::metering::created(&txn, &vm, st.config.clock.now()).await?;
            crate::store::segments::attach(&txn, vm.id, &m.nics, now).await??;
            let s = &specs[i];
            event(
                &txn,
                &vm,
                now,
                "created",
                format!("{} GPU(s), {} vCPUs, {} GiB", s.gpus, s.vcpus, s.memory_gib),
            )
            .await?;
            if let Some(ctx) = ctx {
                audit::record(&txn, ctx, "vm.create", Some(tenant), &m.name).await?;
            }
        }
        match r {
            Some(r) => {
                let rows = allocation_rows::rows(r.host, vm.id, &r.placement);
                if !rows.is_empty() {
                    allocations::Entity::insert_many(rows).exec(&txn).await?;
                }
                if !claimed.contains(&r.host) {
                    if !claim_host(&txn, r.host, r.revision).await? {
                        return Err(CommitError::Lost);
                    }
                    claimed.push(r.host);
                }
                if m.roce {
                    crate::store::segments::ensure_rails(&txn, vm.id, r.placement.nics.len(), now)
                        .await??;
                }
                if m.networked {
                    peers.extend(crate::app::host_network::touch_peers(&txn, vm.id).await?);
                }
                event(
                    &txn,
                    &vm,
                    now,
                    "scheduled",
                    format!("placed on {}", r.host_name),
                )
                .await?;
            }
            None => {
                let n = plan
                    .map(|p| p.victims.len() + p.waiting_on.len())
                    .unwrap_or(0);
                event(
                    &txn,
                    &vm,
                    now,
                    "pending",
                    format!("waiting for {n} spot VM(s) to be reclaimed"),
                )
                .await?;
            }
        }
    }
    if let Some(p) = plan {
        preempt(
            &txn,
            &p.victims.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            st.config.preemption_grace,
            "reclaimed for a guaranteed request",
            now,
        )
        .await?;
    }
    txn.commit().await?;
    for h in peers {
        st.signals.notify(h);
    }
    Ok(())
}

/// Marks spot VMs `preempting` with a deadline and tells their hosts.
/// Already preempting (or gone) VMs are left as they are.
pub async fn preempt(
    txn: &DatabaseTransaction,
    victims: &[Uuid],
    grace: std::time::Duration,
    why: &str,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let deadline: DateTime<Utc> =
        now + chrono::Duration::from_std(grace).unwrap_or_else(|_| chrono::Duration::seconds(30));
    let mut hosts_touched = Vec::new();
    for id in victims {
        let Some(vm) = vms::Entity::find_by_id(*id).one(txn).await? else {
            continue;
        };
        let state = stored_state(&vm)?;
        if !holds(state)
            || matches!(
                state,
                VmState::Preempting | VmState::Preempted | VmState::Deleting
            )
        {
            continue;
        }
        let mut a: vms::ActiveModel = vm.clone().into();
        a.state = Set(VmState::Preempting.as_str().into());
        a.preempt_deadline = Set(Some(deadline));
        a.updated_at = Set(now);
        a.update(txn).await?;
        event(
            txn,
            &vm,
            now,
            "preempting",
            format!(
                "{why}; notice sent to the guest, deadline {}",
                deadline.to_rfc3339()
            ),
        )
        .await?;
        if let Some(h) = vm.host_id {
            crate::store::hosts::bump_revision(txn, h).await?;
            hosts_touched.push(h);
        }
    }
    Ok(hosts_touched)
}

/// Places `members` (new VMs, or pending rows when `existing`), or for a
/// guaranteed request that does not fit, reclaims spot VMs and records the
/// members as pending. `Err(InsufficientCapacity)` when neither is possible.
pub async fn admit(
    st: &AppState,
    ctx: Option<&Actor>,
    tenant: &tenants::Model,
    members: &[Member],
    existing: bool,
    cluster: Option<&NewCluster<'_>>,
) -> Result<Admitted, ApiError> {
    let Some(first) = members.first() else {
        return Ok(Admitted::Placed);
    };
    for round in 0..ROUNDS {
        let Some(reserved) = reserve(st, tenant.id, members)? else {
            if round == 0 {
                // The index may lag other replicas' frees: look again.
                st.capacity.refresh_all(&st.db).await?;
                continue;
            }
            break;
        };
        match commit(
            st,
            ctx,
            tenant,
            members,
            Some(&reserved),
            existing,
            cluster,
            None,
        )
        .await
        {
            Ok(()) => {
                // The reservation is now the truth; the commit moved each
                // host's revision exactly one past what the index saw.
                let mut hosts: Vec<(Uuid, i64)> =
                    reserved.iter().map(|r| (r.host, r.revision)).collect();
                hosts.dedup();
                {
                    let mut index = st.capacity.lock();
                    for (h, seen) in &hosts {
                        if let Some(pos) = index.position(*h) {
                            index.set_revision(pos, seen + 1);
                        }
                    }
                }
                for (h, _) in hosts {
                    st.signals.notify(h);
                }
                return Ok(Admitted::Placed);
            }
            Err(e) => {
                unreserve(st, members, &reserved);
                for r in &reserved {
                    st.capacity.refresh_host(&st.db, r.host).await?;
                }
                match e {
                    CommitError::Lost => continue,
                    CommitError::Api(e) => return Err(e),
                }
            }
        }
    }
    let no_room = || {
        ApiError::InsufficientCapacity(format!(
            "no ready host{} has room for {} VM(s) of {} {}GPU(s), {} vCPUs and {} GiB near them",
            if first.networked {
                " with an underlay address (the VM has networks)"
            } else {
                ""
            },
            members.len(),
            first.spec.gpus,
            first
                .spec
                .gpu_model
                .as_deref()
                .map(|m| format!("{m} "))
                .unwrap_or_default(),
            first.spec.vcpus,
            first.spec.memory_gib
        ))
    };
    if first.spec.service_level == ServiceLevel::Spot {
        return Err(no_room());
    }
    let plan = {
        let index = st.capacity.lock();
        let req = request(&index, first)?;
        let now = st.config.clock.now().timestamp();
        if members.len() == 1 {
            reclaim::plan(&index, &req, now)
        } else {
            reclaim::plan_cluster(
                &index,
                &ClusterRequest {
                    size: members.len() as u32,
                    member: req,
                },
                now,
            )
        }
    };
    let Some(plan) = plan else {
        return Err(no_room());
    };
    let reclaiming = plan.victims.len();
    if existing && reclaiming == 0 {
        return Ok(Admitted::Pending { reclaiming });
    }
    match commit(
        st,
        ctx,
        tenant,
        members,
        None,
        existing,
        cluster,
        Some(&plan),
    )
    .await
    {
        Ok(()) => {}
        Err(CommitError::Lost) => {
            return Err(ApiError::Conflict(
                "a VM or cluster of that name was created concurrently".into(),
            ))
        }
        Err(CommitError::Api(e)) => return Err(e),
    }
    let mut hosts: Vec<Uuid> = Vec::new();
    {
        let mut index = st.capacity.lock();
        for (h, vm) in &plan.victims {
            index.mark_reclaiming(*h, *vm);
            hosts.push(index.hosts[*h].id);
        }
    }
    for h in hosts {
        st.signals.notify(h);
    }
    Ok(Admitted::Pending { reclaiming })
}
