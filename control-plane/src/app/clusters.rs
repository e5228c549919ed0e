//! Cluster use cases: a training cluster created whole, listed and shown
//! with its members' hosts, scalable units and rails, and deleted with its
//! members.

use std::collections::HashMap;

use kumo_api_types::{Cluster, ClusterCreate, ClusterMember, Page, PageParams, Role, VmState};
use sea_orm::{ConnectionTrait, TransactionTrait};
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::admission::{admit, Admission, Member, NewCluster, Rows};
use crate::app::vms::{act_on, prepare};
use crate::context::{Actor, AppState};
use crate::domain::lifecycle::Action;
use crate::domain::paging::Paging;
use crate::domain::states::{ClusterState, StoredText};
use crate::entity::{clusters, hosts, tenants};
use crate::error::ApiError;
use crate::store::clusters::{hostfile, members_of, stored_cluster_spec};
use crate::store::vms::{stored_placement, stored_state};

/// Largest cluster one request may create (two full SUs of 8-GPU hosts
/// is 64; this leaves room for CPU-only and small-GPU clusters).
pub const MAX_CLUSTER_SIZE: u32 = 256;

/// A member creates a training cluster: every member admitted together (in
/// one scalable unit where one has room) or none. Answers the tenant and
/// the cluster's row.
pub async fn create(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    body: &ClusterCreate,
) -> Result<(tenants::Model, clusters::Model), ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "creating clusters")?;
    crate::app::churn::take(st, &tenant, "creating clusters")?;
    crate::domain::names::tenant_name("name", &body.name)?;
    if !(1..=MAX_CLUSTER_SIZE).contains(&body.size) {
        return Err(ApiError::field(
            "size",
            format!("between 1 and {MAX_CLUSTER_SIZE}"),
        ));
    }
    // Every member has the same spec; the last has the longest name.
    let last = body.member(body.size - 1);
    if crate::domain::names::tenant_name("name", &last.name).is_err() {
        return Err(ApiError::field(
            "name",
            format!("too long for member names like {:?}", last.name),
        ));
    }
    let prepared = prepare(st, &tenant, &last, "networks", "the members'").await?;
    crate::app::vms::budget_allows(st, &tenant, &prepared.spec, actor.at).await?;
    let names: Vec<String> = (0..body.size).map(|i| body.member(i).name).collect();
    if let Some(v) = crate::store::vms::named(&st.db, tenant.id, &names).await? {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} already has a VM named {:?}",
            tenant.name, v.name
        )));
    }
    let exists = crate::store::clusters::named(&st.db, tenant.id, &body.name).await?;
    if exists.is_some() {
        return Err(ApiError::Conflict(format!(
            "tenant {:?} already has a cluster named {:?}",
            tenant.name, body.name
        )));
    }
    let members: Vec<Member> = names.into_iter().map(|n| prepared.member(n)).collect();
    let repair_delay_seconds = body
        .repair_delay_seconds
        .unwrap_or(kumo_api_types::DEFAULT_REPAIR_DELAY_SECONDS);
    if repair_delay_seconds > kumo_api_types::MAX_REPAIR_DELAY_SECONDS {
        return Err(ApiError::field(
            "repair_delay_seconds",
            format!(
                "at most {} (a day)",
                kumo_api_types::MAX_REPAIR_DELAY_SECONDS
            ),
        ));
    }
    if body.spares > 0 && body.reservation.is_some() {
        return Err(ApiError::field(
            "spares",
            "a reservation's cluster keeps no spares: its reservation's hosts are its room",
        ));
    }
    if body.queue && body.reservation.is_some() {
        return Err(ApiError::field(
            "queue",
            "a reservation's clusters do not queue: its hosts are the project's own",
        ));
    }
    if body.spares > body.size {
        return Err(ApiError::field(
            "spares",
            format!("at most the cluster's size ({})", body.size),
        ));
    }
    if body.spares > 0 && prepared.spec.gpus == 0 {
        return Err(ApiError::field(
            "spares",
            "only for clusters of GPU members (CPU room is not kept)",
        ));
    }
    if body.spares > 0 && prepared.spec.service_level == kumo_api_types::ServiceLevel::Spot {
        return Err(ApiError::field(
            "spares",
            "only for guaranteed clusters (a spot cluster's members may be reclaimed themselves)",
        ));
    }
    let new = NewCluster {
        id: Uuid::now_v7(),
        name: &body.name,
        auto_repair: body.auto_repair,
        repair_delay_seconds,
        spec: &prepared.spec,
        spares: body.spares,
        single_su: body.single_su,
    };
    let job = Admission {
        tenant: &tenant,
        members: &members,
        rows: Rows::New {
            actor,
            cluster: Some(&new),
        },
        near: None,
        one_unit: body.single_su == kumo_api_types::SingleSu::Required,
        queue: body.queue,
    };
    match admit(st, job).await {
        Ok(_) => {}
        Err(ApiError::InsufficientCapacity(why)) if job.one_unit => {
            return Err(ApiError::InsufficientCapacity(format!(
                "{why}; with single_su required the members must share one scalable unit (preferred spans units when none has room)"
            )))
        }
        Err(ApiError::Conflict(_)) => {
            return Err(ApiError::Conflict(format!(
                "a cluster or VM of tenant {:?} with one of these names was created concurrently",
                tenant.name
            )))
        }
        Err(e) => return Err(e),
    }
    let row = crate::store::clusters::by_id(&st.db, new.id)
        .await?
        .ok_or_else(|| ApiError::Internal("the cluster vanished after its commit".into()))?;
    Ok((tenant, row))
}

/// A cluster as the API shows it: its members with their hosts, scalable
/// units and rails (from the capacity index's profiles), and its hostfile.
pub async fn view(
    st: &AppState,
    db: &impl ConnectionTrait,
    c: &clusters::Model,
    tenant: &str,
) -> Result<Cluster, ApiError> {
    let rows = members_of(db, c).await?;
    let host_ids: Vec<Uuid> = rows.iter().filter_map(|(v, _)| v.host_id).collect();
    let hosts_by_id: HashMap<Uuid, hosts::Model> = crate::store::hosts::by_ids(db, host_ids)
        .await?
        .into_iter()
        .map(|h| (h.id, h))
        .collect();
    // The hosts' profiles (with their rails), copied out under one lock.
    let profiles: HashMap<Uuid, _> = {
        let index = st.capacity.lock();
        hosts_by_id
            .keys()
            .filter_map(|id| Some((*id, index.hosts[index.position(*id)?].profile.clone())))
            .collect()
    };
    let mut members = Vec::with_capacity(rows.len());
    for (v, address) in &rows {
        let host = v.host_id.and_then(|h| hosts_by_id.get(&h));
        let rails = match (host, stored_placement(v)?) {
            (Some(h), Some(p)) => {
                let profile = profiles.get(&h.id);
                // The rail of each GPU's paired NIC, as placement aligned
                // them, whether or not the VM is given the NIC (only RoCE
                // VMs are, as VFs).
                p.gpus
                    .iter()
                    .map(|g| {
                        let profile = profile?;
                        let nic = profile.gpus[profile.gpu_index(g)?].nic?;
                        profile.nics[nic].rail
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        members.push(ClusterMember {
            name: v.name.clone(),
            state: stored_state(v)?,
            host: host.map(|h| h.name.clone()),
            scalable_unit: host.and_then(|h| h.scalable_unit.clone()),
            rails,
            address: address.clone(),
        });
    }
    let spec = stored_cluster_spec(c)?;
    let size = u32::try_from(c.size).unwrap_or(0);
    let lines: Vec<(String, Option<String>)> = rows
        .iter()
        .map(|(v, a)| (v.name.clone(), a.clone()))
        .collect();
    Ok(Cluster {
        id: c.id,
        name: c.name.clone(),
        tenant: tenant.to_owned(),
        size,
        state: c.state.clone(),
        hostfile: hostfile(&lines, spec.gpus),
        spec,
        members,
        health: crate::app::cluster_repair::stored_health(c)?,
        problems: crate::app::cluster_repair::stored_problems(c)?,
        health_since: c.health_since,
        auto_repair: c.auto_repair,
        repair_delay_seconds: u32::try_from(c.repair_delay_seconds).unwrap_or(0),
        single_su: kumo_api_types::SingleSu::parse(&c.single_su).unwrap_or_default(),
        spares: u32::try_from(c.spares).unwrap_or(0),
        spare_unit: c.spare_unit.clone(),
        spares_ready: spares_ready(st, c.id),
        // Its members wait together: the first's standing is the cluster's.
        queue: match rows.first() {
            Some((v, _)) if c.state == ClusterState::Queued.to_text() => {
                crate::store::queue::standings(db, &[v.id])
                    .await?
                    .remove(&v.id)
            }
            _ => None,
        },
        created_at: c.created_at,
    })
}

/// The cluster keeps no spares from now on, and their charge ends (its
/// members' capacity indexes drop them at their next catch-up).
pub async fn give_up_spares(
    txn: &sea_orm::DatabaseTransaction,
    cluster: Uuid,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    crate::store::clusters::drop_spares(txn, cluster).await?;
    crate::app::metering::spares_released(txn, cluster, now).await
}

/// How many of the cluster's spares its unit has room for now.
fn spares_ready(st: &AppState, cluster: Uuid) -> u32 {
    let index = st.capacity.lock();
    index
        .spares
        .iter()
        .find(|s| s.cluster == cluster)
        .map(|s| kumo_scheduler::spares::unit_room(&index, s, None).min(s.count))
        .unwrap_or(0)
}

/// One page of a tenant's clusters, by name (any member).
pub async fn list(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    params: &PageParams,
) -> Result<Page<Cluster>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let rows = crate::store::clusters::page(&st.db, tenant.id, &paging).await?;
    let (rows, next) = paging.finish(rows, |c| c.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for c in &rows {
        items.push(view(st, &st.db, c, &tenant.name).await?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// A tenant's cluster (any member).
pub async fn show(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    cluster: &str,
) -> Result<Cluster, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let c = crate::store::clusters::find(&st.db, &tenant, cluster).await?;
    view(st, &st.db, &c, &tenant.name).await
}

/// A member deletes a cluster: every member VM is deleted (one
/// transaction, hosts woken after it); the cluster is gone with its last
/// member. Answers the cluster as it is after.
pub async fn delete(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    cluster: &str,
) -> Result<Cluster, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "deleting clusters")?;
    let txn = st.db.begin().await?;
    let c = crate::store::clusters::find(&txn, &tenant, cluster).await?;
    let before = view(st, &txn, &c, &tenant.name).await?;
    let members = crate::store::clusters::members_to_change(&txn, c.id).await?;
    let mut hosts = Vec::new();
    for vm in &members {
        // Members already on their way out are left to finish.
        if matches!(stored_state(vm)?, VmState::Deleting | VmState::Deleted) {
            continue;
        }
        act_on(
            &txn,
            actor,
            &tenant,
            vm,
            Action::Delete,
            st.config.clock.now(),
        )
        .await?;
        hosts.extend(vm.host_id);
    }
    if members.is_empty() {
        crate::store::clusters::forget(&txn, c.id).await?;
    }
    // Its spares are given up now, not when the last member is gone (a
    // cluster whose members were all on their way out already).
    give_up_spares(&txn, c.id, st.config.clock.now()).await?;
    crate::app::audit::record(&txn, actor, "cluster.delete", Some(&tenant), &c.name).await?;
    txn.commit().await?;
    st.capacity.lock().spares.retain(|s| s.cluster != c.id);
    hosts.dedup();
    for h in hosts {
        st.signals.notify(h);
    }
    Ok(match crate::store::clusters::by_id(&st.db, c.id).await? {
        Some(row) => view(st, &st.db, &row, &tenant.name).await?,
        // Every member was pending or preempted: nothing left to wait for.
        None => Cluster {
            members: Vec::new(),
            ..before
        },
    })
}
