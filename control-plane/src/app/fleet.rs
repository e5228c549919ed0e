//! The fleet as administrators see it: hosts listed and shown with what
//! they hold, drained and taken back into service. Registration and join
//! tokens are in [`super::hosts`].

use std::collections::BTreeSet;

use kumo_api_types::{
    Allocation, Host, HostDetail, HostState, NvSwitchPartition, Page, PageParams, ServiceLevel,
};
use kumo_topology::{FabricManager, HostTopology};
use sea_orm::{ActiveModelTrait, Set, TransactionTrait};

use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::paging::Paging;
use crate::domain::states::{AllocationKind, StoredText};
use crate::entity::{allocations, hosts};
use crate::error::ApiError;
use crate::store::hosts::{find, held, held_by_host, host_state, reachable_state, stored_topology};

pub fn to_api(
    h: &hosts::Model,
    topo: &HostTopology,
    held: &[allocations::Model],
    blocked: &[String],
) -> Result<Host, ApiError> {
    let state = host_state(h)?;
    // Held or out of service (device health): not free.
    let used: BTreeSet<&str> = held
        .iter()
        .filter(|a| a.kind == AllocationKind::Gpu.to_text())
        .map(|a| a.key.as_str())
        .chain(blocked.iter().map(String::as_str))
        .collect();
    let gpu_bdfs: BTreeSet<String> = topo
        .gpus
        .iter()
        .map(|g| g.location.bdf.to_string())
        .collect();
    let problems = crate::store::hosts::passthrough_problems(h, topo);
    let mut models: Vec<String> = topo.gpus.iter().map(|g| g.model.clone()).collect();
    models.sort();
    models.dedup();
    Ok(Host {
        id: h.id,
        name: h.name.clone(),
        state,
        scalable_unit: h.scalable_unit.clone(),
        virt_type: h.virt_type.clone(),
        gpu_models: models,
        gpus: topo.gpus.len() as u32,
        // A host not ready for passthrough gives no GPU to anyone.
        gpus_free: topo
            .gpus
            .iter()
            .filter(|g| problems.is_empty() && !used.contains(g.location.bdf.to_string().as_str()))
            .count() as u32,
        gpus_out_of_service: blocked.iter().filter(|b| gpu_bdfs.contains(*b)).count() as u32,
        rdma_nics: topo.nics.len() as u32,
        underlay_ip: crate::app::host_network::underlay_of(h),
        maintenance: h
            .maintenance_at
            .map(|at| kumo_api_types::MaintenanceWindow {
                at,
                reason: h.maintenance_reason.clone(),
            }),
        edge_uplink: h.edge_uplink.clone(),
        cpus: topo.numa_nodes.iter().map(|n| n.cpus.len() as u32).sum(),
        passthrough_ready: problems.is_empty(),
        passthrough_problems: problems,
        hugepages_free_bytes: kumo_topology::readiness::hugepages_free_bytes(topo),
        partitions: match &topo.fabric_manager {
            Some(FabricManager::Partitions(ps)) => ps
                .iter()
                .map(|p| NvSwitchPartition {
                    id: p.id,
                    gpus: p.gpus.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            _ => Vec::new(),
        },
        fabric_manager_problem: match &topo.fabric_manager {
            Some(FabricManager::Unreachable(why)) => {
                Some(format!("{why}; 1-GPU VMs only until it answers"))
            }
            _ => None,
        },
        registered_at: h.registered_at,
        last_heartbeat_at: h.last_heartbeat_at,
    })
}

/// Hosts by name, with their free GPUs (platform admins).
pub async fn list(st: &AppState, actor: &Actor, q: &PageParams) -> Result<Page<Host>, ApiError> {
    require_admin(&actor.caller, "listing hosts")?;
    let paging = Paging::new(q.limit, q.page_token.as_deref())?;
    let rows =
        crate::store::hosts::page(&st.reads, paging.after.as_deref(), paging.fetch()).await?;
    let (rows, next) = paging.finish(rows, |h| h.name.clone());
    let held = held_by_host(&st.reads, &rows.iter().map(|h| h.id).collect::<Vec<_>>()).await?;
    let blocked = crate::store::device_health::blocked(&st.reads, None).await?;
    let mut items = Vec::with_capacity(rows.len());
    for h in &rows {
        items.push(to_api(
            h,
            &*stored_topology(h)?,
            held.get(&h.id).map(Vec::as_slice).unwrap_or_default(),
            blocked.get(&h.id).map(Vec::as_slice).unwrap_or_default(),
        )?);
    }
    Ok(Page {
        items,
        next_page_token: next,
    })
}

/// One host with its topology, GPU/NIC matrix, fabric and allocations
/// (platform admins).
pub async fn show(st: &AppState, actor: &Actor, host: &str) -> Result<HostDetail, ApiError> {
    require_admin(&actor.caller, "showing hosts")?;
    let h = find(&st.db, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    let topo = stored_topology(&h)?;
    let held = held(&st.db, h.id).await?;
    // The fabric report is the agent's word, kept as it came: one that
    // does not parse shows as none rather than failing the page.
    let fabric = h
        .fabric
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    Ok(HostDetail {
        fabric,
        host: to_api(&h, &topo, &held, &blocked_on(&st.db, h.id).await?)?,
        matrix: kumo_topology::matrix::render(&topo),
        topology: serde_json::to_value(&topo).map_err(|e| ApiError::Internal(e.to_string()))?,
        allocations: held
            .into_iter()
            .map(|a| Allocation {
                kind: a.kind,
                key: a.key,
                vm_id: a.vm_id,
            })
            .collect(),
    })
}

/// Drain a host (no new placements; its spot VMs are reclaimed with the
/// usual notice and grace, guaranteed VMs stay until their owners or the
/// operator move them) or take it back into service. Idempotent.
pub async fn set_drained(
    st: &AppState,
    actor: &Actor,
    host: &str,
    drained: bool,
) -> Result<Host, ApiError> {
    let verb = if drained { "draining" } else { "undraining" };
    require_admin(&actor.caller, &format!("{verb} hosts"))?;
    let txn = st.db.begin().await?;
    let h = find(&txn, host)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {host:?}")))?;
    let state = host_state(&h)?;
    if state == HostState::Retired {
        return Err(ApiError::Conflict(format!("host {:?} is retired", h.name)));
    }
    let (id, name, was_drained) = (h.id, h.name.clone(), h.drained);
    let mut a: hosts::ActiveModel = h.into();
    a.drained = Set(drained);
    // An unreachable host stays so until it answers; then it takes this.
    // One in maintenance stays there until an admin is done with it.
    if !matches!(state, HostState::Unreachable | HostState::Maintenance) {
        a.state = Set(reachable_state(drained).as_str().into());
    }
    let updated = a.update(&txn).await?;
    let mut reclaimed = 0;
    if drained && !was_drained {
        let spot: Vec<_> = crate::store::vms::on_host(&txn, id)
            .await?
            .into_iter()
            .filter(|v| {
                crate::store::vms::stored_spec(v)
                    .is_ok_and(|s| s.service_level == ServiceLevel::Spot)
            })
            .map(|v| v.id)
            .collect();
        reclaimed = crate::app::admission::preempt(
            &txn,
            &spot,
            st.config.preemption_grace,
            "its host is being drained",
            st.config.clock.now(),
        )
        .await?
        .len();
    }
    crate::store::hosts::bump_revision(&txn, id).await?;
    let action = if drained {
        "host.drain"
    } else {
        "host.undrain"
    };
    audit::record(&txn, actor, action, None, &name).await?;
    txn.commit().await?;
    tracing::info!(host = %name, drained, reclaimed, "host {verb}");
    st.capacity.refresh_host(&st.db, id).await?;
    st.signals.notify(id);
    let held = held(&st.db, id).await?;
    to_api(
        &updated,
        &*stored_topology(&updated)?,
        &held,
        &blocked_on(&st.db, id).await?,
    )
}

/// A host's devices out of service.
pub async fn blocked_on(
    db: &impl sea_orm::ConnectionTrait,
    host: uuid::Uuid,
) -> Result<Vec<String>, ApiError> {
    Ok(crate::store::device_health::blocked(db, Some(host))
        .await?
        .remove(&host)
        .unwrap_or_default())
}
