//! What a host's agent says and is told: heartbeats (with a fresh
//! inventory), the desired state of its VMs and networks, and its status
//! reports, applied VM by VM. Registration is in [`super::hosts`].

use kumo_api_types::{
    ActualState, AgentHeartbeat, DesiredDisk, DesiredExport, DesiredImport, DesiredState,
    DesiredVm, DesiredVolume, HostState, PreemptionNotice, StatusReport, VmState, VmStatus,
    VolumeState,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, QuerySelect, Set,
    TransactionTrait, TryIntoModel,
};
use uuid::Uuid;

use crate::app::auth;
use crate::context::AppState;
use crate::domain::lifecycle;
use crate::entity::{clusters, hosts, vms};
use crate::error::ApiError;
use crate::store::vms::{desired_power, event, stored_placement, stored_spec, stored_state};

/// A heartbeat: the host is alive (and reachable again if it was not);
/// a fresh topology, fabric or underlay address replaces the stored one.
pub async fn heartbeat(
    st: &AppState,
    host: hosts::Model,
    body: &AgentHeartbeat,
    origin: &crate::context::Origin,
) -> Result<(), ApiError> {
    // The row may be kept from an earlier request (`HostRows`); after a
    // silence it is read afresh, for another replica may have found the
    // host lost meanwhile.
    let host = if st
        .capacity
        .host_rows
        .beat(host.id, st.config.heartbeat_timeout / 2)
    {
        host
    } else {
        crate::store::hosts::by_id_without_topology(&st.reads, host.id)
            .await?
            .ok_or_else(|| ApiError::Unauthenticated("host no longer exists".into()))?
    };
    let back = host.state == HostState::Unreachable.as_str();
    let name = host.name.clone();
    let id = host.id;
    let underlay = host.underlay_ip.clone();
    let host_url = host.transfer_url.clone();
    let drained = host.drained;
    let disk_before = (host.disk_capacity_gib, host.root_disk_capacity_gib);
    let shares_before = host.shares_storage.clone();
    let free_before = host.disk_free_gib;
    let faults_before = host.segment_faults.clone();
    let mut a: hosts::ActiveModel = host.into();
    if back {
        a.state = Set(crate::store::hosts::reachable_state(drained)
            .as_str()
            .into());
        a.unreachable_since = Set(None);
    }
    if let Some(t) = &body.topology {
        crate::app::hosts::validate_topology(t)?;
        let text = serde_json::to_string(t).map_err(|e| ApiError::Internal(e.to_string()))?;
        a.topology_digest = Set(Some(auth::hash_secret(&text)));
        a.topology = Set(text);
    }
    if let Some(f) = &body.fabric {
        if f.len() > 64 || f.iter().any(|p| p.vfs.len() > 256) {
            return Err(ApiError::field("fabric", "at most 64 ports of 256 VFs"));
        }
        a.fabric = Set(Some(
            serde_json::to_string(f).map_err(|e| ApiError::Internal(e.to_string()))?,
        ));
    }
    // What the agent repeats every beat is written only when it differs.
    if let Some(f) = &body.segment_faults {
        let stored = crate::domain::faults::stored(f);
        if stored != faults_before {
            a.segment_faults = Set(stored);
        }
    }
    let new_url = body
        .transfer_url
        .as_ref()
        .filter(|u| host_url.as_ref() != Some(*u));
    if let Some(url) = new_url {
        crate::domain::names::transfer_url("transfer_url", url)?;
        a.transfer_url = Set(Some(url.clone()));
    }
    // The host's storage: what it may hold is what disks are placed by;
    // a change of it is re-read into the capacity index.
    let mut disk_changed = false;
    if let Some(d) = &body.storage {
        let gib = |g: u64| i64::try_from(g).unwrap_or(i64::MAX);
        let now = (Some(gib(d.capacity_gib)), d.root_disks_gib.map(gib));
        disk_changed = now != disk_before;
        if disk_changed {
            a.disk_capacity_gib = Set(now.0);
            a.root_disk_capacity_gib = Set(now.1);
        }
        if Some(gib(d.free_gib)) != free_before {
            a.disk_free_gib = Set(Some(gib(d.free_gib)));
        }
    }
    // The shared filesystem: which hosts may keep shares and take VMs
    // that mount them (the capacity index re-reads the host).
    if let Some(s) = &body.shares {
        let text = crate::domain::shares::stored_storage(s)?;
        if Some(&text) != shares_before.as_ref() {
            a.shares_storage = Set(Some(text));
            disk_changed = true;
        }
    }
    let moved = body.underlay_ip.is_some() && body.underlay_ip.map(|u| u.to_string()) != underlay;
    if moved {
        crate::app::hosts::check_underlay(body.underlay_ip)?;
        a.underlay_ip = Set(body.underlay_ip.map(|u| u.to_string()));
    }
    // Liveness is on the wall clock, as the lost-host detector measures it
    // (a test's manual clock moves in jumps).
    let now = chrono::Utc::now(); // wall clock: liveness
                                  // A beat that says only "alive" renews the host's lease in memory;
                                  // the lease keeper writes it with others (see `crate::leases`).
    let updated = if a.is_changed() {
        a.last_heartbeat_at = Set(now);
        let written = a
            .update(&st.db)
            .await
            .map_err(|e| crate::app::hosts::underlay_taken(e, body.underlay_ip));
        // The next request reads the row as written (or as it stayed).
        st.capacity.host_rows.forget([&id]);
        written?
    } else {
        st.leases.renew(id, now);
        a.try_into_model()
            .map_err(|e| ApiError::Internal(e.to_string()))?
    };
    if let Some(h) = &body.health {
        crate::app::device_health::report(st, &updated, h, origin).await?;
    }
    if moved {
        crate::app::hosts::underlay_moved(&st.db).await?;
        st.capacity.refresh_host(&st.db, id).await?;
        tracing::info!(host = %name, underlay = ?body.underlay_ip, "underlay address changed");
    } else if disk_changed {
        st.capacity.refresh_host(&st.db, id).await?;
        tracing::info!(host = %name, storage = ?body.storage, "storage capacity changed");
    }
    if new_url.is_some() {
        // Hosts fetching volumes from here fetch from the new address.
        for h in crate::store::volumes::fetching_from(&st.db, id).await? {
            let txn = st.db.begin().await?;
            crate::store::hosts::bump_revision(&txn, h).await?;
            txn.commit().await?;
            st.signals.notify(h);
        }
    }
    if back {
        tracing::info!(host = %name, "host reachable again");
    }
    Ok(())
}

/// The revision an agent sees: its VMs' and its networks' changes.
/// Both only grow, so their sum does.
pub fn seen_revision(h: &hosts::Model) -> i64 {
    h.revision.saturating_add(h.network_revision)
}

/// Everything that should exist on the host: its VMs with their NICs
/// and hostfiles, the VMs to remove, and its networks.
pub async fn desired(st: &AppState, host: &hosts::Model) -> Result<DesiredState, ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::HostId.eq(host.id))
        .all(&st.reads)
        .await?;
    let cluster_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.cluster_id).collect();
    let mut hostfiles = std::collections::HashMap::new();
    for c in clusters::Entity::find()
        .filter(clusters::Column::Id.is_in(cluster_ids))
        .all(&st.reads)
        .await?
    {
        hostfiles.insert(
            c.id,
            crate::store::clusters::cluster_files(&st.reads, &c).await?,
        );
    }
    let mut net = crate::app::host_network::load(&st.reads, host, &rows).await?;
    let (kept, delete_volumes, mut disks, exports) = volumes_of(st, host).await?;
    let vm_ids: Vec<Uuid> = rows.iter().map(|v| v.id).collect();
    let mut shares = crate::app::shares::of_host(&st.reads, host.id, &vm_ids).await?;
    let mut imports = imports_of(st, host).await?;
    let moves = crate::app::disk_moves::of_host(&st.reads, host, &rows).await?;
    imports.extend(moves.imports);
    let mut exports = exports;
    exports.extend(moves.exports);
    let mut out = Vec::new();
    let mut remove = Vec::new();
    let mut shelve = Vec::new();
    for v in rows {
        let state = stored_state(&v)?;
        if state == VmState::Shelving {
            shelve.push(v.id);
            continue;
        }
        if matches!(
            state,
            VmState::Deleting | VmState::Deleted | VmState::Preempted
        ) {
            remove.push(v.id);
            continue;
        }
        let Some(placement) = stored_placement(&v)? else {
            continue;
        };
        if moves.waiting.contains(&v.id) {
            // Defined once its disks are here (the agent would make it
            // a fresh root disk meanwhile).
            continue;
        }
        let spec = stored_spec(&v)?;
        let preemption = match (state, v.preempt_deadline) {
            (VmState::Preempting, Some(deadline)) => Some(PreemptionNotice {
                vm: v.id,
                deadline,
                action: if spec.gpus == 0 {
                    "suspend"
                } else {
                    "shutdown"
                }
                .into(),
            }),
            _ => None,
        };
        // A member's hostfile and `/etc/hosts` lines, read once per cluster.
        let cluster_files = v.cluster_id.and_then(|c| hostfiles.get(&c));
        out.push(DesiredVm {
            id: v.id,
            name: v.name.clone(),
            power: desired_power(&v)?,
            power_generation: v.power_generation,
            spec,
            placement,
            preemption,
            events: crate::app::maintenance::events_of(&v, host)?,
            hostfile: cluster_files.map(|(f, _)| f.clone()),
            members: cluster_files.and_then(|(_, m)| m.clone()),
            nics: net.nics.remove(&v.id).unwrap_or_default(),
            volumes: disks.remove(&v.id).unwrap_or_default(),
            shares: shares.mounts.remove(&v.id).unwrap_or_default(),
        });
    }
    Ok(DesiredState {
        revision: seen_revision(host),
        vms: out,
        remove,
        shelve,
        network: net.network,
        volumes: kept,
        delete_volumes,
        exports,
        imports,
        drop_disks: moves.drop_disks,
        consoles: crate::app::consoles::dials_for(st, host.id)
            .await?
            .into_iter()
            .map(|(session, vm)| kumo_api_types::DesiredConsole { session, vm })
            .collect(),
        shares: shares.kept,
        delete_shares: shares.delete,
    })
}

/// The volumes moving to the host, and where to fetch each from.
async fn imports_of(st: &AppState, host: &hosts::Model) -> Result<Vec<DesiredImport>, ApiError> {
    let moving = crate::store::volumes::moving_to(&st.reads, host.id).await?;
    if moving.is_empty() {
        return Ok(Vec::new());
    }
    let sources: Vec<Uuid> = moving.iter().map(|v| v.host_id).collect();
    let sources = crate::store::hosts::by_ids(&st.reads, sources).await?;
    Ok(moving
        .iter()
        .filter_map(|v| {
            let from = sources.iter().find(|h| h.id == v.host_id)?;
            Some(DesiredImport {
                volume: v.id,
                size_gib: u32::try_from(v.size_gib).unwrap_or(u32::MAX),
                from: from.transfer_url.clone()?,
                kind: Default::default(),
                tenant: Some(v.tenant_id),
            })
        })
        .collect())
}

/// The volumes the host keeps, those it deletes (old copies of moved ones
/// among them), each VM's disks, and the volumes it serves to others.
async fn volumes_of(
    st: &AppState,
    host: &hosts::Model,
) -> Result<
    (
        Vec<DesiredVolume>,
        Vec<Uuid>,
        std::collections::HashMap<Uuid, Vec<DesiredDisk>>,
        Vec<DesiredExport>,
    ),
    ApiError,
> {
    let (mut kept, mut exports) = (Vec::new(), Vec::new());
    let mut gone = crate::store::volumes::moved_from(&st.reads, host.id).await?;
    let mut disks: std::collections::HashMap<Uuid, Vec<DesiredDisk>> = Default::default();
    let vols = crate::store::volumes::on_host(&st.reads, host.id).await?;
    let mut snaps = crate::app::volumes::desired_snapshots(&st.reads, &vols).await?;
    for v in vols {
        if crate::store::volumes::stored_state(&v)? == VolumeState::Deleting {
            gone.push(v.id);
            continue;
        }
        if let Some(token) = &v.move_token_sha256 {
            exports.push(DesiredExport {
                volume: v.id,
                token_sha256: token.clone(),
                kind: Default::default(),
                tenant: Some(v.tenant_id),
            });
        }
        let (snapshots, source) = snaps.remove(&v.id).unwrap_or_default();
        kept.push(DesiredVolume {
            id: v.id,
            size_gib: u32::try_from(v.size_gib).unwrap_or(u32::MAX),
            tenant: Some(v.tenant_id),
            source,
            snapshots,
        });
        if let Some(vm) = v.vm_id {
            disks.entry(vm).or_default().push(DesiredDisk {
                volume: v.id,
                serial: v.serial.clone(),
            });
        }
    }
    Ok((kept, gone, disks, exports))
}

/// What one report entry changed.
#[derive(Default)]
struct Applied {
    /// Devices were released: the capacity index re-reads the host.
    freed: bool,
    /// Hosts sharing a segment with a VM that left: woken after commit.
    peers: Vec<Uuid>,
}

impl Applied {
    fn add(&mut self, other: Applied) {
        self.freed |= other.freed;
        self.peers.extend(other.peers);
    }
}

/// Applies a host's status report in one transaction. Rows are locked in
/// id order (a report never deadlocks another) and held to the commit: an
/// API action on one of these VMs waits for this report, or this report
/// sees the action, never a mix.
pub async fn apply_status(
    st: &AppState,
    host: &hosts::Model,
    report: &StatusReport,
) -> Result<(), ApiError> {
    if report.vms.len() > 10_000 {
        return Err(ApiError::field("vms", "too many entries"));
    }
    if report.volumes.len() > 10_000 {
        return Err(ApiError::field("volumes", "too many entries"));
    }
    if report.shares.len() > 10_000 {
        return Err(ApiError::field("shares", "too many entries"));
    }
    let txn = st.db.begin().await?;
    let mut applied = Applied::default();
    let mut entries: Vec<&VmStatus> = report.vms.iter().collect();
    entries.sort_by_key(|s| s.id);
    for s in entries {
        applied.add(apply_entry(st, &txn, host, s).await?);
    }
    let now = st.config.clock.now();
    let mut moved = crate::app::volumes::apply_status(&txn, host.id, &report.volumes, now).await?;
    moved.extend(crate::app::disk_moves::apply_status(&txn, host, &report.root_disks, now).await?);
    moved.extend(crate::app::shares::apply_status(&txn, host.id, &report.shares, now).await?);
    if applied.freed {
        // Devices came free: the revision moves, so other replicas'
        // indexes re-read the host (see `Capacity::catch_up`).
        crate::store::hosts::bump_revision(&txn, host.id).await?;
    }
    txn.commit().await?;
    for h in applied.peers.into_iter().chain(moved) {
        st.signals.notify(h);
    }
    if applied.freed {
        st.capacity.refresh_host(&st.db, host.id).await?;
    }
    Ok(())
}

/// One VM's entry of a report.
async fn apply_entry(
    st: &AppState,
    txn: &DatabaseTransaction,
    host: &hosts::Model,
    s: &VmStatus,
) -> Result<Applied, ApiError> {
    let now = st.config.clock.now();
    let Some(vm) = vms::Entity::find_by_id(s.id)
        .lock_exclusive()
        .one(txn)
        .await?
    else {
        return Ok(Applied::default()); // already gone: nothing to apply
    };
    if vm.host_id != Some(host.id) && s.state == ActualState::Absent {
        // Released already (a preempted VM, a repeated report), or no
        // longer this host's (a replaced cluster member whose old host
        // came back and removed it): nothing to apply.
        return Ok(Applied::default());
    }
    // A host speaking for another host's VM is forging: the whole report
    // is refused. What a guest or libvirt wrote is another matter: an
    // entry whose text does not fit is dropped (and logged), and the
    // rest of the host's report still counts.
    if vm.host_id != Some(host.id) && crate::store::vms::left(txn, vm.id, host.id).await? {
        // A VM replaced off this host, reported once more before the host
        // learnt it: no longer its own, so nothing to apply (and no reason
        // to refuse the rest of the report).
        return Ok(Applied::default());
    }
    if vm.host_id != Some(host.id) {
        tracing::warn!(host = %host.name, vm = %s.id, "agent reported a VM of another host; refused");
        return Err(ApiError::validation(format!(
            "VM {} does not belong to host {}",
            s.id, host.name
        )));
    }
    if !s.texts_fit() {
        tracing::warn!(host = %host.name, vm = %s.id, "a status entry's text has control characters or is too long; entry dropped");
        return Ok(Applied::default());
    }
    if let Some(notice) = &s.notice {
        event(txn, &vm, now, "preemption-notice", notice.clone()).await?;
    }
    crate::app::shares::apply_mounts(txn, vm.id, &s.mounts).await?;
    let state = stored_state(&vm)?;
    if state == VmState::Preempted && s.state == ActualState::Absent {
        // Gone from the host: its devices are free; the row stays so
        // the tenant sees what happened.
        release(txn, &vm, now).await?;
        let peers = crate::app::host_network::touch_peers(txn, vm.id).await?;
        let mut a: vms::ActiveModel = vm.into();
        a.host_id = Set(None);
        a.updated_at = Set(now);
        a.update(txn).await?;
        return Ok(Applied { freed: true, peers });
    }
    if s.guest.is_some() && s.guest != vm.guest_condition {
        let mut a: vms::ActiveModel = vm.clone().into();
        a.guest_condition = Set(s.guest.clone());
        a.update(txn).await?;
    }
    let Some(next) = lifecycle::observe(state, desired_power(&vm)?, s.state) else {
        return Ok(Applied::default());
    };
    let message = s
        .reason
        .clone()
        .unwrap_or_else(|| format!("reported by {}", host.name));
    event(txn, &vm, now, next.as_str(), message).await?;
    if next == VmState::Deleted {
        release(txn, &vm, now).await?;
        let peers = crate::app::vms::delete_row(txn, &vm, now).await?;
        return Ok(Applied { freed: true, peers });
    }
    if next == VmState::Shelved {
        // Off its host but for its disk: devices, CPUs and memory go to
        // others; the host keeps its disk for when it is unshelved.
        release(txn, &vm, now).await?;
        let peers = crate::app::host_network::touch_peers(txn, vm.id).await?;
        crate::app::metering::transition(txn, &vm, state, next, None, now).await?;
        let mut a: vms::ActiveModel = vm.clone().into();
        a.state = Set(next.as_str().to_owned());
        a.reason = Set(None);
        a.disk_host_id = Set(vm.host_id);
        a.host_id = Set(None);
        a.placement = Set(None);
        a.updated_at = Set(now);
        let shelved = a.update(txn).await?;
        if shelved.evacuating.is_some() {
            // Off a host under maintenance: on to another one.
            crate::app::maintenance::shelved(txn, &shelved, now).await?;
        }
        return Ok(Applied { freed: true, peers });
    }
    let mut applied = Applied::default();
    if next == VmState::Suspended {
        // Saved to disk: its CPUs and memory go to others meanwhile.
        release(txn, &vm, now).await?;
        applied.freed = true;
    }
    if state == VmState::Lost {
        // Its host came back with it: its disk is charged again (and, as
        // it runs, the rest).
        crate::app::metering::created(txn, &vm, now).await?;
    }
    let model = crate::app::metering::billable(next)
        .then(|| crate::app::metering::gpu_model_of(st, &vm))
        .flatten();
    crate::app::metering::transition(txn, &vm, state, next, model, now).await?;
    let mut a: vms::ActiveModel = vm.into();
    a.state = Set(next.as_str().to_owned());
    a.reason = Set(if next == VmState::Error {
        s.reason.clone()
    } else {
        None
    });
    a.updated_at = Set(now);
    a.update(txn).await?;
    Ok(applied)
}

/// A VM's devices, CPUs and memory go back to the pool (its devices
/// passed their host's check, or were quarantined by the report's `unfit`).
async fn release(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    if let Some(host) = vm.host_id {
        crate::app::device_health::released(txn, host, vm.id, now).await?;
    }
    crate::store::allocations::release_all(txn, vm.id).await
}
