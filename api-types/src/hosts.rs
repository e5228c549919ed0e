//! GPU hosts, for platform admins: the join tokens that register them, a
//! host's state and maintenance windows (with the events those schedule for
//! its VMs), the passed-through devices and their health, and a host's
//! detail view with its allocations.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenCreate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Lifetime in seconds (default one day, at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// How many hosts it may register (default 1, at most 10,000). A join
    /// token never takes the name of a registered host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenCreated {
    pub id: Uuid,
    /// `kumoj_<id>_<secret>`, shown once.
    pub token: String,
    pub expires_at: DateTime<Utc>,
    /// How many hosts it may register.
    pub uses: u32,
}

/// A join token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenInfo {
    pub id: Uuid,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Registrations it may make, and has made.
    pub uses: u32,
    pub used: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    Ready,
    Draining,
    Unreachable,
    Retired,
    /// In its maintenance window: its VMs moved off or stopped; it takes
    /// nothing new until an admin is done with it.
    Maintenance,
}

impl HostState {
    pub const ALL: [HostState; 5] = [
        HostState::Ready,
        HostState::Draining,
        HostState::Unreachable,
        HostState::Retired,
        HostState::Maintenance,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            HostState::Ready => "ready",
            HostState::Draining => "draining",
            HostState::Unreachable => "unreachable",
            HostState::Retired => "retired",
            HostState::Maintenance => "maintenance",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        HostState::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// A host's scheduled maintenance window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MaintenanceWindow {
    /// When its VMs are moved off (or stopped) and it goes to
    /// `maintenance`.
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Schedules (or moves) a host's maintenance window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceCreate {
    pub at: DateTime<Utc>,
    /// Told to the tenants whose VMs it moves (at most 200 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a scheduled event does to a VM when its time comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ScheduledAction {
    /// Shelved and placed on another host, its disks moving with it (as
    /// `unshelve --anywhere` does); `kumo vm evacuate` does it early.
    Evacuate,
    /// A cluster member: replaced on another host (same name and
    /// addresses, a fresh root disk), as `kumo cluster repair` does.
    Replace,
    /// Stopped where it is (it cannot move: suspended, being reclaimed).
    Stop,
    /// Nothing yet: a borrowed VM (above its project's guaranteed share)
    /// may be reclaimed, with its notice, for a project within its own.
    Reclaimable,
}

/// An event scheduled for a VM, as the API shows it and as the guest
/// reads it in `/run/kumo/events` (a JSON array of these, `[]` when none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScheduledEvent {
    /// `maintenance`, or `borrowed` (since `at`).
    pub kind: String,
    /// When it happens.
    pub at: DateTime<Utc>,
    pub action: ScheduledAction,
    /// The host being maintained.
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Host {
    pub id: Uuid,
    pub name: String,
    pub state: HostState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_unit: Option<String>,
    pub virt_type: String,
    pub gpu_models: Vec<String>,
    pub gpus: u32,
    /// Neither held by a VM nor out of service.
    pub gpus_free: u32,
    /// Quarantined, in repair or being validated (see `/api/v1/devices`).
    #[serde(default)]
    pub gpus_out_of_service: u32,
    pub rdma_nics: u32,
    pub cpus: u32,
    /// Whether the host may pass its GPUs and NICs through: an IOMMU on,
    /// IOMMU groups holding only what goes with each device, ACS on the
    /// ports above them, hugepages on KVM hosts. One that is not takes
    /// CPU-only VMs only.
    #[serde(default = "ready")]
    pub passthrough_ready: bool,
    /// Why not, one problem per entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough_problems: Vec<String>,
    /// Hugepage memory free for guests.
    #[serde(default)]
    pub hugepages_free_bytes: u64,
    /// On an NVSwitch host in shared NVSwitch mode, the partitions its
    /// Fabric Manager supports: a multi-GPU VM gets exactly one of these
    /// GPU sets, activated before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<NvSwitchPartition>,
    /// Why the host takes 1-GPU VMs only (its Fabric Manager does not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager_problem: Option<String>,
    /// The host's VXLAN tunnel endpoint; without one it takes no VMs
    /// with networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub underlay_ip: Option<Ipv4Addr>,
    /// Its scheduled maintenance window, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenanceWindow>,
    /// An edge host's interface towards the provider network: segments'
    /// gateways and public addresses may be placed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_uplink: Option<String>,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: DateTime<Utc>,
}

fn ready() -> bool {
    true
}

/// An NVSwitch partition: Fabric Manager's id and its GPUs' host addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NvSwitchPartition {
    pub id: u32,
    pub gpus: Vec<String>,
}

/// A passed-through device's health (see the operator guide's "Device health" page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    Healthy,
    /// Degraded (a narrowed link, correctable errors, a flapping port):
    /// still placeable; clears after a clean period.
    Suspect,
    /// Broken: takes no new VMs until an operator repairs and validates it.
    Quarantined,
    Repairing,
    /// Repaired: the next clean reading makes it healthy.
    Validating,
}

impl DeviceState {
    pub const ALL: [DeviceState; 5] = [
        DeviceState::Healthy,
        DeviceState::Suspect,
        DeviceState::Quarantined,
        DeviceState::Repairing,
        DeviceState::Validating,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceState::Healthy => "healthy",
            DeviceState::Suspect => "suspect",
            DeviceState::Quarantined => "quarantined",
            DeviceState::Repairing => "repairing",
            DeviceState::Validating => "validating",
        }
    }

    pub fn parse(s: &str) -> Option<DeviceState> {
        DeviceState::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// Whether new VMs may be placed on the device.
    pub fn placeable(self) -> bool {
        matches!(self, DeviceState::Healthy | DeviceState::Suspect)
    }
}

/// A passed-through device as its host last reported it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Device {
    pub host: String,
    pub bdf: String,
    /// `gpu` or `nic`.
    pub kind: String,
    pub state: DeviceState,
    /// Why it is in its state (the findings, or the operator's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub since: DateTime<Utc>,
    /// When its host last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<DateTime<Utc>>,
    /// The VMs holding it.
    pub vms: Vec<Uuid>,
    /// The last reading: `device` (presence, AER totals, PCIe link) and
    /// `ports` (RDMA ports' state, carrier changes, RoCE counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub signals: Option<serde_json::Value>,
}

/// The fleet's devices by state, and whether automatic quarantine has
/// reached its limit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeviceList {
    pub items: Vec<Device>,
    /// Devices per state, over the whole fleet.
    pub counts: BTreeMap<String, u64>,
    /// How many devices may be quarantined automatically.
    pub quarantine_cap: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeviceQuery {
    /// Only this host's devices (name or id).
    #[serde(default)]
    pub host: Option<String>,
    /// Only devices in this state.
    #[serde(default)]
    pub state: Option<DeviceState>,
}

/// An operator's step on a device: `quarantine`, `repair` (it is being
/// worked on) or `validate` (repaired; the next clean reading clears it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DeviceAction {
    /// Why, for the device's record and the audit log.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Allocation {
    /// `gpu`, `nic` or `cpu`.
    pub kind: String,
    pub key: String,
    pub vm_id: Uuid,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HostDetail {
    #[serde(flatten)]
    pub host: Host,
    /// The topology the agent reported (`HostTopology`).
    #[schema(value_type = Object)]
    pub topology: serde_json::Value,
    /// `nvidia-smi topo -m`-style matrix of the GPUs and RDMA NICs.
    pub matrix: String,
    pub allocations: Vec<Allocation>,
    /// Each RoCE port as the agent last found it: lossless QoS and the VFs
    /// of VMs on RoCE segments (applied, unchanged, unsupported or failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub fabric: Vec<vxlan_manager::roce::PortReport>,
}
