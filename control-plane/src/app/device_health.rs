//! Passed-through devices' health: each reading a host reports is judged
//! by the rules in `domain::device_health`; a device leaving service
//! takes no new placements (the host's revision moves, so a placement
//! racing the change fails at commit), the VMs holding it are told, and
//! spot ones are reclaimed. Operators quarantine, repair and validate.

use std::collections::HashMap;

use kumo_api_types::{
    Device, DeviceAction, DeviceList, DeviceQuery, DeviceState, ServiceLevel, UnfitDevice,
    REPORT_TEXT_MAX,
};
use kumo_topology::health::{AerCounts, DeviceSignals, HostSignals};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, Set, TransactionTrait,
};
use uuid::Uuid;

use crate::app::access::require_admin;
use crate::app::audit;
use crate::context::{Actor, AppState, Origin};
use crate::domain::device_health::{
    findings, guest_says, next, quarantine_cap, released_clean, takes_out, Finding, OperatorAction,
    Policy, PortFacts, Record, Transition, FLEET_FULL, UNFIT,
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

impl Change {
    fn of(bdf: &str, from: DeviceState, t: Transition) -> Change {
        Change {
            bdf: bdf.to_owned(),
            from,
            to: t.to,
            reason: t.reason,
        }
    }
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
    let now = st.config.clock.now();
    let policy = st.config.device_health;
    let txn = st.db.begin().await?;
    let rows = store::of_host(&txn, host.id).await?;
    // Kinds from the rows; the inventory (a parse of the whole topology)
    // only for devices reported the first time.
    let kinds = if signals.devices.iter().all(|d| rows.contains_key(&d.bdf)) {
        rows.iter()
            .map(|(b, r)| (b.clone(), r.kind.clone()))
            .collect()
    } else {
        inventory(&*crate::store::hosts::with_topology(&txn, host).await?)?
    };
    let mut room = Room::host(kinds.len().saturating_sub(rows.len()));
    let mut changes = Vec::new();
    for d in &signals.devices {
        let Some(kind) = kinds.get(&d.bdf) else {
            continue;
        };
        let row = rows.get(&d.bdf);
        let rec = row.map(store::record).transpose()?.unwrap_or_default();
        let ports = port_facts(signals, &d.bdf);
        let found = findings(&rec, d, ports, now, &policy);
        let t = room.judge(&txn, &rec, &found, now, &policy).await?;
        if let Some(t) = t.as_ref().filter(|t| t.withheld) {
            tracing::warn!(host = %host.name, bdf = %d.bdf, reason = %t.reason,
                "a broken device is not quarantined: the automatic quarantine limit is reached");
        }
        let reading = serde_json::to_string(&Reading {
            device: d,
            ports: signals.ports.iter().filter(|p| p.bdf == d.bdf).collect(),
        })
        .map_err(|e| ApiError::Internal(e.to_string()))?;
        // The counters the next reading is compared with move only when
        // they change: a rate is then taken over the time since the last
        // change, and a clean, quiet device costs no write.
        let counters =
            (row.is_none() || rec.aer != d.aer || rec.carrier_changes != ports.carrier_changes)
                .then_some((d.aer, ports.carrier_changes));
        let unchanged = row.is_some_and(|r| r.signals.as_deref() == Some(reading.as_str()));
        if t.is_none() && found.is_empty() && counters.is_none() && unchanged {
            continue;
        }
        put(
            &txn,
            Put {
                host: host.id,
                bdf: &d.bdf,
                kind,
                rec: row.is_some().then_some(&rec),
                to: t.as_ref(),
                found: !found.is_empty(),
                counters,
                reading: Some(reading),
                guest: None,
                now,
            },
        )
        .await?;
        changes.extend(t.map(|t| Change::of(&d.bdf, rec.state, t)));
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
            tenant: None,
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

/// Devices a VM let go that failed their host's check (see
/// `kumo_topology::health::release_check`): quarantined at once, whatever
/// the fleet's automatic limit, since handing a device that did not come
/// back to the next tenant is worse than any number out of service. A
/// VF stands for its NIC (the pool knows NICs by their PF); a function the
/// inventory does not know (a GPU's audio function) is only logged.
pub async fn released_unfit(
    st: &AppState,
    host: &hosts::Model,
    unfit: &[UnfitDevice],
    origin: &Origin,
) -> Result<(), ApiError> {
    if unfit.is_empty() {
        return Ok(());
    }
    if unfit.len() > kumo_api_types::UNFIT_MAX
        || unfit
            .iter()
            .any(|u| u.bdf.len() > 64 || u.problem.chars().count() > REPORT_TEXT_MAX)
    {
        return Err(ApiError::field(
            "unfit",
            format!(
                "at most {} devices, addresses of 64 bytes, problems of {REPORT_TEXT_MAX} characters",
                kumo_api_types::UNFIT_MAX
            ),
        ));
    }
    let whole = crate::store::hosts::with_topology(&st.db, host).await?;
    let host = &*whole;
    let topo = stored_topology(host)?;
    let kinds = inventory(host)?;
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let rows = store::of_host(&txn, host.id).await?;
    let mut changes: Vec<Change> = Vec::new();
    for u in unfit {
        // The device the pool knows: the function itself, or for a VF its
        // NIC (the pool knows NICs by their PF).
        let (bdf, via) = if kinds.contains_key(&u.bdf) {
            (u.bdf.clone(), String::new())
        } else if let Some(n) = topo
            .nics
            .iter()
            .find(|n| n.vfs.iter().any(|v| v.to_string() == u.bdf))
        {
            (n.location.bdf.to_string(), format!("its VF {}: ", u.bdf))
        } else {
            tracing::warn!(host = %host.name, bdf = %u.bdf, problem = %u.problem,
                "a released function the inventory does not know did not come back after reset");
            continue;
        };
        // A host speaks only of what one of its VMs held: the VM's
        // allocations (keyed by that device) are still there, since the
        // report that frees them is applied after this.
        if !store::holders(&txn, host.id, &bdf).await?.contains(&u.vm) {
            tracing::warn!(host = %host.name, bdf = %u.bdf, vm = %u.vm,
                "an unfit device its VM did not hold on this host: ignored");
            continue;
        }
        let Some(kind) = kinds.get(&bdf) else {
            continue;
        };
        let row = rows.get(&bdf);
        let rec = row.map(store::record).transpose()?.unwrap_or_default();
        let done = changes.iter().any(|c| c.bdf == bdf);
        if done || matches!(rec.state, DeviceState::Quarantined | DeviceState::Repairing) {
            continue;
        }
        let t = Transition {
            to: DeviceState::Quarantined,
            reason: format!("{UNFIT}: {via}{}", u.problem),
            withheld: false,
        };
        tracing::warn!(host = %host.name, %bdf, reason = %t.reason, vm = %u.vm, "quarantined on release");
        put(
            &txn,
            Put {
                host: host.id,
                bdf: &bdf,
                kind,
                rec: row.is_some().then_some(&rec),
                to: Some(&t),
                found: true,
                counters: None,
                reading: None,
                guest: None,
                now,
            },
        )
        .await?;
        changes.push(Change::of(&bdf, rec.state, t));
    }
    settle(st, txn, host, &changes, origin, now).await
}

/// The devices `vm` let go on `host` are back in the pool: one suspect on
/// its guest's word alone passed its host's check (a device that failed it
/// was quarantined by [`released_unfit`] before this report is applied),
/// so it is healthy again. Runs in the status report's transaction.
pub async fn released(
    txn: &DatabaseTransaction,
    host: Uuid,
    vm: Uuid,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let held = store::held_by(txn, host, vm).await?;
    if held.is_empty() {
        return Ok(());
    }
    let rows = store::of_host(txn, host).await?;
    for bdf in held {
        let Some(row) = rows.get(&bdf) else { continue };
        let rec = store::record(row)?;
        let Some(t) = released_clean(&rec) else {
            continue;
        };
        tracing::info!(%host, %bdf, reason = %t.reason, "device health");
        put(
            txn,
            Put {
                host,
                bdf: &bdf,
                kind: &row.kind,
                rec: Some(&rec),
                to: Some(&t),
                found: false,
                counters: None,
                reading: None,
                guest: None,
                now,
            },
        )
        .await?;
        let who = audit::Who {
            name: "device-health".into(),
            source_ip: "",
            request_id: "",
            client_request_id: None,
            at: now,
            tenant: None,
        };
        let action = format!("device.{}", t.to.as_str());
        audit::record_by(txn, &who, &action, &format!("{bdf}: {}", t.reason)).await?;
    }
    Ok(())
}

/// A finding about a GPU from inside its guest (an XID): evidence about
/// that guest's VM, so at most it makes the GPU suspect (and its holders
/// are told); its host's signals decide the rest.
pub async fn guest_finding(
    st: &AppState,
    host: &hosts::Model,
    bdf: &str,
    finding: Finding,
    tenant: Uuid,
    origin: &Origin,
) -> Result<(), ApiError> {
    let whole = crate::store::hosts::with_topology(&st.db, host).await?;
    let host = &*whole;
    if inventory(host)?.get(bdf).map(String::as_str) != Some("gpu") {
        return Ok(());
    }
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let row = store::find(&txn, host.id, bdf).await?;
    let rec = row
        .as_ref()
        .map(store::record)
        .transpose()?
        .unwrap_or_default();
    let t = guest_says(&rec, &finding);
    put(
        &txn,
        Put {
            host: host.id,
            bdf,
            kind: "gpu",
            rec: row.is_some().then_some(&rec),
            to: t.as_ref(),
            found: true,
            counters: None,
            reading: None,
            guest: Some(tenant),
            now,
        },
    )
    .await?;
    let changes: Vec<Change> = t
        .map(|t| Change::of(bdf, rec.state, t))
        .into_iter()
        .collect();
    settle(st, txn, host, &changes, origin, now).await
}

/// The room for one more automatic quarantine, counted once per
/// operation and only when a finding would quarantine (a clean reading
/// costs no count): the fleet's share, for every automatic quarantine
/// (a guest's report takes a device out only with its host's signal, so
/// those count here too).
struct Room {
    /// Devices of the host not recorded yet, counted into the fleet.
    unseen: usize,
    /// `(cap, out of service)`, once counted.
    load: Option<(u64, u64)>,
}

impl Room {
    fn host(unseen: usize) -> Room {
        Room { unseen, load: None }
    }

    /// The device's next state under the rules, keeping the count of
    /// devices out of service in step.
    async fn judge(
        &mut self,
        db: &impl ConnectionTrait,
        rec: &Record,
        found: &[Finding],
        now: chrono::DateTime<chrono::Utc>,
        policy: &Policy,
    ) -> Result<Option<Transition>, ApiError> {
        let full = FLEET_FULL;
        let room = match (takes_out(rec, found), self.load) {
            (false, _) => Ok(()), // the room only matters to what breaks
            (true, Some((cap, out))) => (out < cap).then_some(()).ok_or(full),
            (true, None) => {
                let out = store::out_of_service(db).await?;
                let total = store::counts(db).await?.values().sum::<u64>() + self.unseen as u64;
                let cap = quarantine_cap(total as usize, policy) as u64;
                self.load = Some((cap, out));
                (out < cap).then_some(()).ok_or(full)
            }
        };
        let t = next(rec, found, now, policy, room);
        if let (Some(t), Some((_, out))) = (&t, self.load.as_mut()) {
            match (rec.state.placeable(), t.to.placeable()) {
                (true, false) => *out += 1,
                (false, true) => *out = out.saturating_sub(1),
                _ => {}
            }
        }
        Ok(t)
    }
}

/// The host's GPUs and NICs by address, with their kind, from its inventory.
fn inventory(host: &hosts::Model) -> Result<HashMap<String, String>, ApiError> {
    let topo = stored_topology(host)?;
    Ok(topo
        .gpus
        .iter()
        .map(|g| (g.location.bdf.to_string(), "gpu".to_owned()))
        .chain(
            topo.nics
                .iter()
                .map(|n| (n.location.bdf.to_string(), "nic".to_owned())),
        )
        .collect())
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

fn db_int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A device's row as an operation leaves it.
struct Put<'a> {
    host: Uuid,
    bdf: &'a str,
    kind: &'a str,
    /// What the row held; `None`: there was none.
    rec: Option<&'a Record>,
    to: Option<&'a Transition>,
    /// Something was found now (suspect devices clear from the last time).
    found: bool,
    /// New comparison counters (AER totals, carrier changes).
    counters: Option<(Option<AerCounts>, Option<u64>)>,
    /// The reading as reported, for operators.
    reading: Option<String>,
    /// The project whose guest spoke (kept with the state it leads to).
    guest: Option<Uuid>,
    now: chrono::DateTime<chrono::Utc>,
}

async fn put(txn: &DatabaseTransaction, p: Put<'_>) -> Result<(), ApiError> {
    let mut a = device_health::ActiveModel {
        host_id: Set(p.host),
        bdf: Set(p.bdf.to_owned()),
        ..Default::default()
    };
    if p.rec.is_none() {
        a.kind = Set(p.kind.to_owned());
        a.state = Set(DeviceState::Healthy.as_str().to_owned());
        a.reason = Set(None);
        a.since = Set(p.now);
        a.last_finding_at = Set(None);
    }
    if let Some(t) = p.to {
        a.state = Set(t.to.as_str().to_owned());
        a.reason = Set(Some(t.reason.chars().take(1000).collect()));
        a.since = Set(p.now);
        a.reported_by = Set(p.guest);
    }
    if p.found {
        a.last_finding_at = Set(Some(p.now));
    }
    if let Some((aer, carrier)) = p.counters {
        a.aer_correctable = Set(aer.map(|x| db_int(x.correctable)));
        a.aer_nonfatal = Set(aer.map(|x| db_int(x.nonfatal)));
        a.aer_fatal = Set(aer.map(|x| db_int(x.fatal)));
        a.carrier_changes = Set(carrier.map(db_int));
        a.read_at = Set(Some(p.now));
    }
    if let Some(r) = p.reading {
        a.signals = Set(Some(r));
    }
    if p.rec.is_none() {
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
    let kind = inventory(&h)?.remove(bdf).ok_or_else(|| {
        ApiError::not_found(format!(
            "device {bdf:?} on host {:?} (its GPUs and RDMA NICs by PCI address)",
            h.name
        ))
    })?;
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
    a.reported_by = Set(None); // an operator's from now on
    let row = match row {
        Some(_) => a.update(&txn).await?,
        None => {
            a.kind = Set(kind);
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
