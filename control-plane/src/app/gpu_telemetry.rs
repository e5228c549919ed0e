//! What GPU guests say of their GPUs, through their hosts' agents:
//! readings rolled up by minute, each VM's last word (figures, or unknown
//! and why), XIDs told to the VM and judged as device health findings;
//! and the series a project reads back. Guest data is advisory: nothing
//! here bills.

use std::collections::BTreeMap;

use kumo_api_types::{GpuSeries, MetricsQuery, TelemetryReport, VmMetrics};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};

use crate::app::access::tenant_access;
use crate::context::{Actor, AppState, Origin};
use crate::domain::gpu_telemetry::{hour_of, minute_of, points, window, Minute, RETENTION_DAYS};
use crate::entity::{hosts, vms};
use crate::error::ApiError;
use crate::store::gpu_telemetry as store;
use crate::store::vms::{find_vm, stored_placement};

const MAX_VMS: usize = 256;
const MAX_GPUS: usize = 64;
const MAX_XIDS: usize = 64;

/// The host addresses of a VM's GPUs.
fn held(vm: &vms::Model) -> Result<Vec<String>, ApiError> {
    Ok(stored_placement(vm)?
        .map(|p| p.gpus.iter().map(ToString::to_string).collect())
        .unwrap_or_default())
}

/// A host's report. VMs not on the host and GPUs not of the VM are
/// ignored: a host speaks only for its own.
pub async fn ingest(
    st: &AppState,
    host: &hosts::Model,
    report: &TelemetryReport,
    origin: &Origin,
) -> Result<(), ApiError> {
    if report.vms.len() > MAX_VMS
        || report
            .vms
            .iter()
            .any(|v| v.gpus.len() > MAX_GPUS || v.xids.len() > MAX_XIDS)
    {
        return Err(ApiError::field(
            "vms",
            format!("at most {MAX_VMS} VMs of {MAX_GPUS} GPUs and {MAX_XIDS} XIDs"),
        ));
    }
    let now = st.config.clock.now();
    let at = minute_of(now);
    let ids: Vec<_> = report.vms.iter().map(|v| v.vm).collect();
    let rows: BTreeMap<_, _> = vms::Entity::find()
        .filter(vms::Column::Id.is_in(ids))
        .filter(vms::Column::HostId.eq(host.id))
        .all(&st.reads)
        .await?
        .into_iter()
        .map(|v| (v.id, v))
        .collect();
    let mut findings = Vec::new();
    // A report's figures are written in two statements whatever its size:
    // every VM's last word, and every GPU's minute (readings of one GPU
    // folded first: one statement may touch a row once).
    let mut statuses = BTreeMap::new();
    let mut minutes: BTreeMap<store::MinuteKey, Minute> = BTreeMap::new();
    let mut xids = Vec::new();
    for t in &report.vms {
        let Some(vm) = rows.get(&t.vm) else {
            continue;
        };
        let gpus = held(vm)?;
        let unknown = t.unknown.clone().or_else(|| {
            t.gpus
                .is_empty()
                .then(|| "the guest reported no GPU".into())
        });
        statuses.insert(vm.id, (vm.tenant_id, unknown));
        for r in t.gpus.iter().filter(|r| gpus.contains(&r.host_bdf)) {
            let m = minutes
                .entry((vm.id, vm.tenant_id, r.host_bdf.clone(), at))
                .or_default();
            // What a guest prints is bounded before it is summed, stored or
            // exported.
            *m = m.with(&r.sample.bounded());
        }
        xids.extend(
            t.xids
                .iter()
                .filter(|x| gpus.contains(&x.host_bdf))
                .map(|x| (vm, x)),
        );
    }
    let txn = st.db.begin().await?;
    let statuses: Vec<_> = statuses
        .into_iter()
        .map(|(vm, (tenant, reason))| (vm, tenant, reason))
        .collect();
    store::set_statuses(&txn, &statuses, now).await?;
    store::fold_minutes(&txn, &minutes.into_iter().collect::<Vec<_>>()).await?;
    for (vm, x) in xids {
        let finding = crate::domain::device_health::xid(x.code);
        let said = match &finding {
            Some(f) => f.words(),
            None => format!(
                "XID {} in the guest's kernel log (usually the program's own fault)",
                x.code
            ),
        };
        crate::store::vms::event(
            &txn,
            vm,
            now,
            "gpu.xid",
            format!("GPU {}: {said}", x.host_bdf),
        )
        .await?;
        if let Some(f) = finding {
            findings.push((x.host_bdf.clone(), f, vm.tenant_id));
        }
    }
    txn.commit().await?;
    for (bdf, f, tenant) in findings {
        crate::app::device_health::guest_finding(st, host, &bdf, f, tenant, origin).await?;
    }
    Ok(())
}

/// Where minutes end and hours begin: the minutes' window back from now,
/// down to a whole hour.
pub fn minutes_begin(st: &AppState) -> chrono::DateTime<chrono::Utc> {
    hour_of(
        st.config.clock.now() - chrono::Duration::days(i64::from(st.config.telemetry.minutes_days)),
    )
}

/// Minutes past their window fold into hours; hours past the retention
/// go (run by the server's housekeeping). Answers the minutes folded.
pub async fn roll_up(st: &AppState) -> Result<u64, ApiError> {
    let oldest = st.config.clock.now() - chrono::Duration::days(RETENTION_DAYS);
    store::roll_up(&st.db, minutes_begin(st), oldest).await
}

/// A VM's GPU series (any member of its tenant).
pub async fn metrics(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    q: &MetricsQuery,
) -> Result<VmMetrics, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let vm = find_vm(&st.db, &tenant, vm).await?;
    let (from, to, step) = window(st.config.clock.now(), q.from, q.to, q.step_minutes)
        .map_err(|e| ApiError::field("from", e))?;
    let mut by_gpu: BTreeMap<String, Vec<_>> = BTreeMap::new();
    // Before the minutes' window the figures are hours: each lands in the
    // step its hour begins in.
    let cut = minutes_begin(st).clamp(from, to);
    let older = if from < cut {
        store::hours(&st.db, vm.id, hour_of(from), cut)
            .await?
            .into_iter()
            .map(|(bdf, at, m)| (bdf, at.max(from), m))
            .collect()
    } else {
        Vec::new()
    };
    for (bdf, at, m) in older
        .into_iter()
        .chain(store::minutes(&st.db, vm.id, cut, to).await?)
    {
        by_gpu.entry(bdf).or_default().push((at, m));
    }
    // Every GPU of the VM has a series, empty when nothing was read.
    if let Some(p) = stored_placement(&vm)? {
        for g in &p.gpus {
            by_gpu.entry(g.to_string()).or_default();
        }
    }
    let status = store::status(&st.db, vm.id).await?;
    Ok(VmMetrics {
        vm: vm.id,
        from,
        to,
        step_minutes: step,
        telemetry: status.as_ref().map_or("none".into(), |s| s.state.clone()),
        telemetry_reason: status.as_ref().and_then(|s| s.reason.clone()),
        read_at: status.map(|s| s.read_at),
        gpus: by_gpu
            .into_iter()
            .map(|(host_bdf, minutes)| GpuSeries {
                points: points(&minutes, from, step),
                host_bdf,
            })
            .collect(),
    })
}
