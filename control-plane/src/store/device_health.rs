//! Queries of `device_health`: each passed-through device's state and the
//! reading its next one is compared with.

use std::collections::{BTreeMap, HashMap};

use kumo_api_types::DeviceState;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};
use uuid::Uuid;

use crate::domain::device_health::Record;
use crate::entity::{allocations, device_health};
use crate::error::ApiError;

/// The states that take no new placements.
fn out_of_service_states() -> Vec<&'static str> {
    DeviceState::ALL
        .into_iter()
        .filter(|s| !s.placeable())
        .map(DeviceState::as_str)
        .collect()
}

pub fn stored_state(row: &device_health::Model) -> Result<DeviceState, ApiError> {
    DeviceState::parse(&row.state).ok_or_else(|| {
        ApiError::Internal(format!(
            "device_health {} {}: unknown state {:?}",
            row.host_id, row.bdf, row.state
        ))
    })
}

/// What the rules need of a row.
pub fn record(row: &device_health::Model) -> Result<Record, ApiError> {
    let n = |v: i64| v.max(0) as u64;
    Ok(Record {
        state: stored_state(row)?,
        reason: row.reason.clone(),
        last_finding_at: row.last_finding_at,
        aer: match (row.aer_correctable, row.aer_nonfatal, row.aer_fatal) {
            (Some(c), Some(nf), Some(f)) => Some(kumo_topology::health::AerCounts {
                correctable: n(c),
                nonfatal: n(nf),
                fatal: n(f),
            }),
            _ => None,
        },
        carrier_changes: row.carrier_changes.map(n),
        read_at: row.read_at,
        guest_reported: row.reported_by.is_some(),
    })
}

/// A host's devices, by PCI address.
pub async fn of_host(
    db: &impl ConnectionTrait,
    host: Uuid,
) -> Result<HashMap<String, device_health::Model>, ApiError> {
    Ok(device_health::Entity::find()
        .filter(device_health::Column::HostId.eq(host))
        .all(db)
        .await?
        .into_iter()
        .map(|r| (r.bdf.clone(), r))
        .collect())
}

pub async fn find(
    db: &impl ConnectionTrait,
    host: Uuid,
    bdf: &str,
) -> Result<Option<device_health::Model>, ApiError> {
    Ok(device_health::Entity::find_by_id((host, bdf.to_owned()))
        .one(db)
        .await?)
}

/// The devices out of service, by host (for the scheduler).
pub async fn blocked(
    db: &impl ConnectionTrait,
    host: Option<Uuid>,
) -> Result<HashMap<Uuid, Vec<String>>, ApiError> {
    let mut q = device_health::Entity::find()
        .select_only()
        .column(device_health::Column::HostId)
        .column(device_health::Column::Bdf)
        .filter(device_health::Column::State.is_in(out_of_service_states()));
    if let Some(h) = host {
        q = q.filter(device_health::Column::HostId.eq(h));
    }
    let mut out: HashMap<Uuid, Vec<String>> = HashMap::new();
    for (h, bdf) in q.into_tuple::<(Uuid, String)>().all(db).await? {
        out.entry(h).or_default().push(bdf);
    }
    Ok(out)
}

/// Devices out of service over the fleet, whoever put them there.
pub async fn out_of_service(db: &impl ConnectionTrait) -> Result<u64, ApiError> {
    Ok(device_health::Entity::find()
        .filter(device_health::Column::State.is_in(out_of_service_states()))
        .count(db)
        .await?)
}

/// Devices per state over the fleet.
pub async fn counts(db: &impl ConnectionTrait) -> Result<BTreeMap<String, u64>, ApiError> {
    let rows: Vec<(String, i64)> = device_health::Entity::find()
        .select_only()
        .column(device_health::Column::State)
        .column_as(Expr::col(device_health::Column::Bdf).count(), "n")
        .group_by(device_health::Column::State)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(s, n)| (s, n.max(0) as u64))
        .collect())
}

/// The devices, optionally of one host and in one state, by host and
/// address.
pub async fn list(
    db: &impl ConnectionTrait,
    host: Option<Uuid>,
    state: Option<DeviceState>,
) -> Result<Vec<device_health::Model>, ApiError> {
    let mut q = device_health::Entity::find()
        .order_by_asc(device_health::Column::HostId)
        .order_by_asc(device_health::Column::Bdf);
    if let Some(h) = host {
        q = q.filter(device_health::Column::HostId.eq(h));
    }
    if let Some(s) = state {
        q = q.filter(device_health::Column::State.eq(s.as_str()));
    }
    Ok(q.all(db).await?)
}

/// The VMs holding a device (a NIC's RoCE VF counts as the NIC: its
/// allocation row is keyed by the physical function).
/// The devices (GPUs, NICs) a VM holds on a host, by address.
pub async fn held_by(
    db: &impl ConnectionTrait,
    host: Uuid,
    vm: Uuid,
) -> Result<Vec<String>, ApiError> {
    Ok(allocations::Entity::find()
        .select_only()
        .column(allocations::Column::Key)
        .filter(allocations::Column::HostId.eq(host))
        .filter(allocations::Column::VmId.eq(vm))
        .filter(allocations::Column::Kind.is_in(["gpu", "nic"]))
        .into_tuple::<String>()
        .all(db)
        .await?)
}

pub async fn holders(
    db: &impl ConnectionTrait,
    host: Uuid,
    bdf: &str,
) -> Result<Vec<Uuid>, ApiError> {
    Ok(allocations::Entity::find()
        .select_only()
        .column(allocations::Column::VmId)
        .filter(allocations::Column::HostId.eq(host))
        .filter(allocations::Column::Kind.is_in(["gpu", "nic"]))
        .filter(allocations::Column::Key.eq(bdf))
        .into_tuple::<Uuid>()
        .all(db)
        .await?)
}
