//! A shelved VM unshelved `--anywhere` and placed on another host than
//! the one holding its disks: its root disk and its volumes move there,
//! agent to agent (the protocol of volume moves, see
//! `kumo_agent::transfer`), and only then is it defined there.
//!
//! While they move the VM is `scheduled` (its devices held on the new
//! host) with a reason saying so; the new host's desired state lists the
//! root disk under `imports` and leaves the VM out (its agent would make
//! it a fresh disk); the old host serves it once the new host's agent
//! told the hash of its token. The copy whole, the VM's disk is the new
//! host's and the old host removes its copy (`stale_root_disks`, which
//! also keeps the copy of a VM deleted while its disk moved).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use kumo_api_types::{
    DesiredExport, DesiredImport, TransferKind, VmState, VolumeActual, VolumeStatus,
};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, QuerySelect, Set,
};
use uuid::Uuid;

use crate::entity::{hosts, vms};
use crate::error::ApiError;
use crate::store::hosts::bump_revision;
use crate::store::vms::{event, stored_spec, stored_state};

/// Sends a VM just placed on `host` its disks that are elsewhere (none for
/// a VM placed where they are): the root disk of a shelved VM, and its
/// volumes. Answers whether anything moves.
pub async fn begin(
    txn: &DatabaseTransaction,
    vm: &vms::Model,
    host: Uuid,
    host_name: &str,
    now: DateTime<Utc>,
) -> Result<bool, ApiError> {
    let volumes = crate::store::volumes::move_with_vm(txn, vm.id, host, now).await?;
    let root = vm.disk_host_id.filter(|d| *d != host);
    if volumes == 0 && root.is_none() {
        return Ok(false);
    }
    let from = match root {
        Some(d) => crate::store::hosts::by_id(txn, d)
            .await?
            .map(|h| format!(" from host {}", h.name))
            .unwrap_or_default(),
        None => String::new(),
    };
    let what = match (root.is_some(), volumes) {
        (true, 0) => "its root disk".to_owned(),
        (true, n) => format!("its root disk and {n} volume(s)"),
        (false, n) => format!("{n} volume(s)"),
    };
    let why = format!("moving {what}{from} to host {host_name}");
    let mut a: vms::ActiveModel = vm.clone().into();
    a.reason = Set(Some(why.clone()));
    a.disk_move_token_sha256 = Set(None);
    a.update(txn).await?;
    event(txn, vm, now, "moving-disks", why).await?;
    Ok(true)
}

/// What a host's desired state says of root disk moves.
#[derive(Default)]
pub struct HostMoves {
    pub imports: Vec<DesiredImport>,
    pub exports: Vec<DesiredExport>,
    /// Root disks it keeps of VMs that run elsewhere now, or are gone.
    pub drop_disks: Vec<Uuid>,
    /// Its VMs whose disks are not all here yet: left out of its VMs.
    pub waiting: BTreeSet<Uuid>,
}

/// The root disk moves of `host`, for its VMs `rows`.
pub async fn of_host(
    db: &impl ConnectionTrait,
    host: &hosts::Model,
    rows: &[vms::Model],
) -> Result<HostMoves, ApiError> {
    let ids: Vec<Uuid> = rows.iter().map(|v| v.id).collect();
    let mut out = HostMoves {
        waiting: crate::store::volumes::vms_waiting_on_volumes(db, host.id, &ids).await?,
        drop_disks: crate::store::vms::stale_disks(db, host.id).await?,
        ..Default::default()
    };
    let arriving = crate::store::vms::disks_arriving(db, host.id).await?;
    let sources =
        crate::store::hosts::by_ids(db, arriving.iter().filter_map(|v| v.disk_host_id)).await?;
    for v in arriving {
        out.waiting.insert(v.id);
        // A VM being deleted meanwhile fetches nothing.
        if matches!(
            stored_state(&v)?,
            VmState::Deleting | VmState::Deleted | VmState::Preempted | VmState::Shelving
        ) {
            continue;
        }
        let Some(from) = sources
            .iter()
            .find(|h| Some(h.id) == v.disk_host_id)
            .and_then(|h| h.transfer_url.clone())
        else {
            continue;
        };
        out.imports.push(DesiredImport {
            volume: v.id,
            size_gib: stored_spec(&v)?.disk_gib,
            from,
            kind: TransferKind::RootDisk,
            tenant: Some(v.tenant_id),
        });
    }
    for v in crate::store::vms::disks_leaving(db, host.id).await? {
        if let Some(token) = v.disk_move_token_sha256 {
            out.exports.push(DesiredExport {
                volume: v.id,
                token_sha256: token,
                kind: TransferKind::RootDisk,
                tenant: Some(v.tenant_id),
            });
        }
    }
    Ok(out)
}

/// What a host's agent said of root disks, in the report's transaction:
/// one it fetches (its token's hash kept, the source told), failed (the
/// reason, retried by the agent), whole (the VM's disk is here from now
/// on; the old host removes its copy), or removed (a stale copy gone).
/// Entries on VMs the host has nothing to do with are ignored. Answers
/// the hosts to wake.
pub async fn apply_status(
    txn: &DatabaseTransaction,
    host: &hosts::Model,
    report: &[VolumeStatus],
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    if report.len() > 10_000 {
        return Err(ApiError::field("root_disks", "too many entries"));
    }
    let mut entries: Vec<&VolumeStatus> = report.iter().collect();
    entries.sort_by_key(|s| s.id);
    let mut wake = Vec::new();
    for s in entries {
        if s.state == VolumeActual::Absent {
            crate::store::vms::stale_disk_removed(txn, s.id, host.id).await?;
            continue;
        }
        let Some(vm) = vms::Entity::find_by_id(s.id)
            .lock_exclusive()
            .one(txn)
            .await?
        else {
            continue;
        };
        let Some(source) = vm
            .disk_host_id
            .filter(|d| vm.host_id == Some(host.id) && *d != host.id)
        else {
            tracing::warn!(host = %host.name, vm = %s.id, "a root disk report on a VM whose disk is not moving here; ignored");
            continue;
        };
        wake.extend(settle(txn, host, source, vm, s, now).await?);
    }
    Ok(wake)
}

async fn settle(
    txn: &DatabaseTransaction,
    host: &hosts::Model,
    source: Uuid,
    vm: vms::Model,
    s: &VolumeStatus,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, ApiError> {
    let mut a: vms::ActiveModel = vm.clone().into();
    let wake = match s.state {
        VolumeActual::Ready => {
            a.disk_host_id = Set(Some(host.id));
            a.disk_move_token_sha256 = Set(None);
            let still = crate::store::volumes::vms_waiting_on_volumes(txn, host.id, &[vm.id])
                .await?
                .contains(&vm.id);
            a.reason = Set(still.then(|| "moving its volumes to this host".to_owned()));
            crate::store::vms::mark_stale_disk(txn, vm.id, source, now).await?;
            event(
                txn,
                &vm,
                now,
                "disk-moved",
                format!("root disk now on {}", host.name),
            )
            .await?;
            vec![source, host.id]
        }
        VolumeActual::Importing | VolumeActual::Failed => {
            // While the copy goes on, the reason stays what it was.
            let Some(p) = crate::domain::imports::progress(
                s,
                vm.disk_move_token_sha256.as_deref(),
                vm.reason.as_deref(),
                "moving its root disk",
                vm.reason.as_deref(),
            ) else {
                return Ok(Vec::new());
            };
            a.reason = Set(p.reason);
            match p.token {
                Some(t) => {
                    a.disk_move_token_sha256 = Set(Some(t));
                    vec![source]
                }
                None => Vec::new(),
            }
        }
        VolumeActual::Absent => return Ok(Vec::new()),
    };
    a.updated_at = Set(now);
    a.update(txn).await?;
    for h in &wake {
        bump_revision(txn, *h).await?;
    }
    Ok(wake)
}
