//! Passed-through devices' health: each reading a host reports is judged
//! by the rules in `domain::device_health`; a device leaving service
//! takes no new placements (the host's revision moves, so a placement
//! racing the change fails at commit), the VMs holding it are told, and
//! spot ones are reclaimed. Operators quarantine, repair and validate.

use std::collections::HashMap;

use kumo_api_types::{Device, DeviceAction, DeviceList, DeviceQuery, DeviceState, ServiceLevel};
use kumo_topology::health::{DeviceSignals, HostSignals};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::{Actor, AppState, Origin};
use crate::domain::device_health::{
    findings, next, quarantine_cap, Finding, OperatorAction, PortFacts, Record,
};
use crate::entity::{device_health, hosts, vms};
use crate::error::ApiError;
use crate::store::device_health as store;
use crate::store::hosts::stored_topology;

/// The most devices and ports one reading may carry (a host has at most
/// 64 of each the scheduler can use).
const MAX_DEVICES: usize = 128;
const MAX_PORTS: usize = 256;

/// A device's state change, to act on after the rows are written.
struct Change {
    bdf: String,
    from: DeviceState,
    to: DeviceState,
    reason: String,
}

/// Judges a host's reading. Devices the host's inventory does not list
/// are ignored (a host speaks only for its own devices); the kind comes
/// from the inventory, not the report.
pub async fn report(
    st: &AppState,
    host: &hosts::Model,
    signals: &HostSignals,
    origin: &Origin,
) -> Result<(), ApiError> {
    let too_long = |t: &str| t.len() > 64;
    if signals.devices.len() > MAX_DEVICES
        || signals.ports.len() > MAX_PORTS
        || signals.ports.iter().any(|p| {
            too_long(&p.device)
                || too_long(&p.state)
                || too_long(&p.bdf)
                || p.counters.len() > 16
                || p.counters.keys().any(|k| too_long(k))
        })
    {
        return Err(ApiError::field(
            "health",
            format!(
                "at most {MAX_DEVICES} devices and {MAX_PORTS} ports of 16 counters, names of 64 bytes"
            ),
        ));
    }
    let topo = stored_topology(host)?;
    let kinds: HashMap<String, &str> = topo
        .gpus
        .iter()
        .map(|g| (g.location.bdf.to_string(), "gpu"))
        .chain(
            topo.nics
                .iter()
                .map(|n| (n.location.bdf.to_string(), "nic")),
        )
        .collect();
    let now = st.config.clock.now();
    let policy = st.config.device_health;
    let txn = st.db.begin().await?;
    let rows = store::of_host(&txn, host.id).await?;
    let (total, mut out) = fleet_load(&txn, 0).await?;
    let total = total + kinds.len().saturating_sub(rows.len()) as u64;
    let cap = quarantine_cap(total as usize, &policy) as u64;
    let mut changes = Vec::new();
    for d in &signals.devices {
        let Some(kind) = kinds.get(&d.bdf) else {
            continue;
        };
        let row = rows.get(&d.bdf);
        let rec = row.map(store::record).transpose()?.unwrap_or_default();
        let ports = port_facts(signals, &d.bdf);
        let found = findings(&rec, d, ports, false, now, &policy);
        let t = next(&rec, &found, now, &policy, out < cap);
        if let Some(t) = &t {
            if t.to.placeable() != rec.state.placeable() {
                if t.to.placeable() {
                    out = out.saturating_sub(1);
                } else {
                    out += 1;
                }
            }
            if t.withheld {
                tracing::warn!(host = %host.name, bdf = %d.bdf, reason = %t.reason,
                    "a broken device is not quarantined: the automatic quarantine limit ({cap} devices) is reached");
            }
            changes.push(Change {
                bdf: d.bdf.clone(),
                from: rec.state,
                to: t.to,
                reason: t.reason.clone(),
            });
        }
        let reading = serde_json::to_string(&Reading {
            device: d,
            ports: signals.ports.iter().filter(|p| p.bdf == d.bdf).collect(),
        })
        .map_err(|e| ApiError::Internal(e.to_string()))?;
        let moved = row.is_none_or(|r| {
            r.signals.as_deref() != Some(reading.as_str())
                || counters_differ(&rec, d, ports.carrier_changes)
        });
        if t.is_none() && found.is_empty() && !moved {
            continue;
        }
        write(
            &txn,
            host.id,
            kind,
            d,
            &rec,
            row.is_none(),
            t.as_ref().map(|t| (t.to, &t.reason)),
            !found.is_empty(),
            ports.carrier_changes,
            reading,
            now,
        )
        .await?;
    }
    settle(st, txn, host, &changes, origin, now).await
}

/// Records, tells and (where a device left or rejoined service) makes
/// the scheduler see each change, then commits.
async fn settle(
    st: &AppState,
    txn: DatabaseTransaction,
    host: &hosts::Model,
    changes: &[Change],
    origin: &Origin,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let placeability = changes
        .iter()
        .any(|c| c.from.placeable() != c.to.placeable());
    for c in changes {
        let who = audit::Who {
            name: format!("device-health:{}", host.name),
            source_ip: &origin.source_ip,
            request_id: &origin.request_id,
            client_request_id: None,
            at: now,
        };
        let action = format!("device.{}", c.to.as_str());
        audit::record_by(
            &txn,
            &who,
            &action,
            &format!("{} {}: {}", host.name, c.bdf, c.reason),
        )
        .await?;
        tracing::info!(host = %host.name, bdf = %c.bdf, from = c.from.as_str(), to = c.to.as_str(), reason = %c.reason, "device health");
        tell_holders(st, &txn, host, &c.bdf, c.to, &c.reason).await?;
    }
    if placeability {
        crate::store::hosts::bump_revision(&txn, host.id).await?;
    }
    txn.commit().await?;
    if placeability {
        st.capacity.refresh_host(&st.db, host.id).await?;
        st.signals.notify(host.id);
    }
    Ok(())
}

/// A finding about a GPU from inside its guest (an XID): judged like a
/// host reading's, against the same quarantine limit.
pub async fn guest_finding(
    st: &AppState,
    host: &hosts::Model,
    bdf: &str,
    finding: Finding,
    origin: &Origin,
) -> Result<(), ApiError> {
    let topo = stored_topology(host)?;
    if !topo.gpus.iter().any(|g| g.location.bdf.to_string() == bdf) {
        return Ok(());
    }
    let now = st.config.clock.now();
    let policy = st.config.device_health;
    let txn = st.db.begin().await?;
    let row = store::find(&txn, host.id, bdf).await?;
    let rec = row
        .as_ref()
        .map(store::record)
        .transpose()?
        .unwrap_or_default();
    let (total, out) = fleet_load(&txn, topo.gpus.len() + topo.nics.len()).await?;
    let room = out < quarantine_cap(total as usize, &policy) as u64;
    let found = [finding];
    let t = next(&rec, &found, now, &policy, room);
    let mut a = device_health::ActiveModel {
        host_id: Set(host.id),
        bdf: Set(bdf.to_owned()),
        ..Default::default()
    };
    a.last_finding_at = Set(Some(now));
    if let Some(t) = &t {
        a.state = Set(t.to.as_str().to_owned());
        a.reason = Set(Some(t.reason.clone()));
        a.since = Set(now);
    }
    match row {
        Some(_) => a.update(&txn).await?,
        None => {
            a.kind = Set("gpu".into());
            if t.is_none() {
                a.state = Set(rec.state.as_str().to_owned());
                a.since = Set(now);
            }
            a.insert(&txn).await?
        }
    };
    let changes: Vec<Change> = t
        .into_iter()
        .map(|t| Change {
            bdf: bdf.to_owned(),
            from: rec.state,
            to: t.to,
            reason: t.reason,
        })
        .collect();
    settle(st, txn, host, &changes, origin, now).await
}

/// Devices known fleet-wide (at least `at_least`) and how many of them
/// are out of service.
async fn fleet_load(db: &impl ConnectionTrait, at_least: usize) -> Result<(u64, u64), ApiError> {
    let counts = store::counts(db).await?;
    let out = counts
        .iter()
        .filter(|(s, _)| DeviceState::parse(s).is_some_and(|s| !s.placeable()))
        .map(|(_, n)| n)
        .sum();
    Ok((counts.values().sum::<u64>().max(at_least as u64), out))
}

/// What is kept of a device's last reading, for operators.
#[derive(serde::Serialize)]
struct Reading<'a> {
    device: &'a DeviceSignals,
    ports: Vec<&'a kumo_topology::health::PortSignals>,
}

/// A NIC's ports, summed: the first one down, and carrier changes.
fn port_facts(s: &HostSignals, bdf: &str) -> PortFacts {
    let ports: Vec<_> = s.ports.iter().filter(|p| p.bdf == bdf).collect();
    PortFacts {
        down: ports.iter().find(|p| !p.active()).map(|p| p.port),
        carrier_changes: ports
            .iter()
            .filter_map(|p| p.carrier_changes)
            .reduce(u64::saturating_add),
    }
}

fn counters_differ(rec: &Record, d: &DeviceSignals, carrier: Option<u64>) -> bool {
    rec.aer != d.aer || rec.carrier_changes != carrier
}

fn db_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[allow(clippy::too_many_arguments)]
async fn write(
    txn: &DatabaseTransaction,
    host: Uuid,
    kind: &str,
    d: &DeviceSignals,
    rec: &Record,
    new: bool,
    to: Option<(DeviceState, &String)>,
    found: bool,
    carrier: Option<u64>,
    reading: String,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let mut a = device_health::ActiveModel {
        host_id: Set(host),
        bdf: Set(d.bdf.clone()),
        ..Default::default()
    };
    if new {
        a.kind = Set(kind.to_owned());
        a.state = Set(rec.state.as_str().to_owned());
        a.reason = Set(None);
        a.since = Set(now);
        a.last_finding_at = Set(None);
    }
    if let Some((state, reason)) = to {
        a.state = Set(state.as_str().to_owned());
        a.reason = Set(Some(reason.chars().take(1000).collect()));
        a.since = Set(now);
    }
    if found {
        a.last_finding_at = Set(Some(now));
    }
    // The counters the next reading is compared with move only when they
    // change: a rate is then taken over the time since the last change.
    if new || counters_differ(rec, d, carrier) {
        a.aer_correctable = Set(d.aer.map(|x| db_int(x.correctable)));
        a.aer_nonfatal = Set(d.aer.map(|x| db_int(x.nonfatal)));
        a.aer_fatal = Set(d.aer.map(|x| db_int(x.fatal)));
        a.carrier_changes = Set(carrier.map(db_int));
        a.read_at = Set(Some(now));
    }
    a.signals = Set(Some(reading));
    if new {
        a.insert(txn).await?;
    } else {
        a.update(txn).await?;
    }
    Ok(())
}

/// Tells the VMs holding a device of its new state; reclaims the spot
/// ones from a device that left service.
async fn tell_holders(
    st: &AppState,
    txn: &DatabaseTransaction,
    host: &hosts::Model,
    bdf: &str,
    to: DeviceState,
    reason: &str,
) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let holders = store::holders(txn, host.id, bdf).await?;
    let mut spot = Vec::new();
    for id in holders {
        let Some(vm) = vms::Entity::find_by_id(id).one(txn).await? else {
            continue;
        };
        let message = match to {
            DeviceState::Quarantined => format!(
                "device {bdf} of this VM is quarantined ({reason}); save your work: a VM on it may fail, and it will not be placed there again"
            ),
            DeviceState::Suspect => format!("device {bdf} of this VM is suspect: {reason}"),
            s => format!("device {bdf} of this VM is {}: {reason}", s.as_str()),
        };
        crate::store::vms::event(txn, &vm, now, &format!("device.{}", to.as_str()), message)
            .await?;
        if !to.placeable()
            && crate::store::vms::stored_spec(&vm)?.service_level == ServiceLevel::Spot
        {
            spot.push(vm.id);
        }
    }
    if !spot.is_empty() {
        crate::app::admission::preempt(
            txn,
            &spot,
            st.config.preemption_grace,
            &format!("device {bdf} of its host is out of service"),
            now,
        )
        .await?;
    }
    Ok(())
}

fn to_api(row: device_health::Model, host: &str, vms: Vec<Uuid>) -> Result<Device, ApiError> {
    Ok(Device {
        host: host.to_owned(),
        state: store::stored_state(&row)?,
        signals: row
            .signals
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
        bdf: row.bdf,
        kind: row.kind,
        reason: row.reason,
        since: row.since,
        read_at: row.read_at,
        vms,
    })
}

/// The fleet's devices (admins).
pub async fn list(st: &AppState, actor: &Actor, q: &DeviceQuery) -> Result<DeviceList, ApiError> {
    require_admin(&actor.caller, "listing devices")?;
    let host = match &q.host {
        Some(h) => Some(find_host(&st.db, h).await?),
        None => None,
    };
    let rows = store::list(&st.db, host.as_ref().map(|h| h.id), q.state).await?;
    let names: HashMap<Uuid, String> = crate::store::hosts::names(&st.db).await?;
    let mut items = Vec::with_capacity(rows.len());
    for r in rows {
        let vms = store::holders(&st.db, r.host_id, &r.bdf).await?;
        let name = names.get(&r.host_id).cloned().unwrap_or_default();
        items.push(to_api(r, &name, vms)?);
    }
    let counts = store::counts(&st.db).await?;
    let total: u64 = counts.values().sum();
    Ok(DeviceList {
        items,
        quarantine_cap: quarantine_cap(total as usize, &st.config.device_health) as u64,
        counts,
    })
}

async fn find_host(db: &impl ConnectionTrait, h: &str) -> Result<hosts::Model, ApiError> {
    crate::store::hosts::find(db, h)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("host {h:?}")))
}

/// An operator's step: quarantine (always allowed, past the automatic
/// limit too), repair, validate.
pub async fn act(
    st: &AppState,
    actor: &Actor,
    host: &str,
    bdf: &str,
    action: &str,
    body: &DeviceAction,
) -> Result<Device, ApiError> {
    require_admin(&actor.caller, "changing a device's health")?;
    let op = OperatorAction::parse(action).ok_or_else(|| {
        ApiError::not_found(format!(
            "device action {action:?} (quarantine, repair or validate)"
        ))
    })?;
    if let Some(r) = &body.reason {
        if r.chars().count() > 500 {
            return Err(ApiError::field("reason", "at most 500 characters"));
        }
    }
    let txn = st.db.begin().await?;
    let h = find_host(&txn, host).await?;
    let topo = stored_topology(&h)?;
    let kind = if topo.gpus.iter().any(|g| g.location.bdf.to_string() == bdf) {
        "gpu"
    } else if topo.nics.iter().any(|n| n.location.bdf.to_string() == bdf) {
        "nic"
    } else {
        return Err(ApiError::not_found(format!(
            "device {bdf:?} on host {:?} (its GPUs and RDMA NICs by PCI address)",
            h.name
        )));
    };
    let row = store::find(&txn, h.id, bdf).await?;
    let from = match &row {
        Some(r) => store::stored_state(r)?,
        None => DeviceState::Healthy,
    };
    let to = op.apply(from).map_err(ApiError::Conflict)?;
    let now = actor.at;
    let reason = body
        .reason
        .clone()
        .unwrap_or_else(|| format!("{} by {}", op_words(op), actor.caller.user.name));
    let mut a = device_health::ActiveModel {
        host_id: Set(h.id),
        bdf: Set(bdf.to_owned()),
        ..Default::default()
    };
    a.state = Set(to.as_str().to_owned());
    a.reason = Set(Some(reason.clone()));
    a.since = Set(now);
    a.last_finding_at = Set(None);
    let row = match row {
        Some(_) => a.update(&txn).await?,
        None => {
            a.kind = Set(kind.to_owned());
            a.insert(&txn).await?
        }
    };
    audit::record(
        &txn,
        actor,
        &format!("device.{action}"),
        None,
        &format!("{} {bdf}: {reason}", h.name),
    )
    .await?;
    if from != to {
        tell_holders(st, &txn, &h, bdf, to, &reason).await?;
    }
    let placeability = from.placeable() != to.placeable();
    if placeability {
        crate::store::hosts::bump_revision(&txn, h.id).await?;
    }
    let vms = store::holders(&txn, h.id, bdf).await?;
    txn.commit().await?;
    if placeability {
        st.capacity.refresh_host(&st.db, h.id).await?;
        st.signals.notify(h.id);
    }
    to_api(row, &h.name, vms)
}

fn op_words(op: OperatorAction) -> &'static str {
    match op {
        OperatorAction::Quarantine => "quarantined",
        OperatorAction::Repair => "sent to repair",
        OperatorAction::Validate => "repaired; validating",
    }
}
