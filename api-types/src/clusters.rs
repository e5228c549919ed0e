//! Training clusters: the create request (size, auto-repair, spares, one
//! scalable unit or not), and a cluster's health, members, problems, events
//! and repairs.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::storage::ShareMountRequest;
use crate::vms::{NetworkRequest, ServiceLevel, VmCreate, VmSpec, VmState};

/// A training cluster: `size` identical VMs placed all or nothing, in one
/// scalable unit when one has room, rail-aligned.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterCreate {
    /// Also the members' name prefix: `NAME-0`, `NAME-1`, …
    pub name: String,
    pub size: u32,
    /// GPUs per member.
    #[serde(default)]
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default)]
    pub service_level: ServiceLevel,
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// Segments every member joins (names or ids); the hostfile then names
    /// members by their address on the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Project shares every member mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareMountRequest>,
    /// Replace failed members without being asked, `repair_delay_seconds`
    /// after the cluster became degraded (`kumo cluster repair` does it by
    /// hand).
    #[serde(default)]
    pub auto_repair: bool,
    /// How long a degraded cluster waits before it repairs itself (a host
    /// that is only rebooting comes back within it). At most a day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_delay_seconds: Option<u32>,
    /// Members' worth of the cluster's shape kept free in its scalable
    /// unit for repairs (at most the cluster's size; guaranteed clusters
    /// only). No other tenant's guaranteed VM is placed on them; spot VMs
    /// may run there and are reclaimed, with notice, when a repair needs
    /// the room. Charged at the `spare_gpu:<model>` rate while the cluster
    /// lives.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spares: u32,
    /// Whether the members must share one scalable unit: `preferred` (the
    /// default: one unit when one has room, else the fewest units) or
    /// `required` (refused when no unit has room; repairs wait for room in
    /// the unit rather than leave it).
    #[serde(default)]
    pub single_su: SingleSu,
    /// Wait in the fair queue as `queued` when there is no room for all
    /// its members, instead of being refused; admitted whole (see
    /// `VmCreate::queue`). Not with spares.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queue: bool,
    /// Its members run on the project's reservation of this name (see
    /// `VmCreate::reservation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
}

/// How strictly a cluster keeps to one scalable unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SingleSu {
    #[default]
    Preferred,
    Required,
}

impl SingleSu {
    pub fn as_str(self) -> &'static str {
        match self {
            SingleSu::Preferred => "preferred",
            SingleSu::Required => "required",
        }
    }

    pub fn parse(s: &str) -> Option<SingleSu> {
        match s {
            "preferred" => Some(SingleSu::Preferred),
            "required" => Some(SingleSu::Required),
            _ => None,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The longest an auto-repairing cluster may wait before it repairs.
pub const MAX_REPAIR_DELAY_SECONDS: u32 = 86_400;
/// What `auto_repair` waits for unless told otherwise.
pub const DEFAULT_REPAIR_DELAY_SECONDS: u32 = 120;

/// Whether a cluster's members are all well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterHealth {
    /// Every member running on a reachable host with healthy devices.
    Healthy,
    /// A member is not (see `problems`).
    Degraded,
    /// Failed members were replaced and the new ones are not all running
    /// yet.
    Repairing,
}

impl ClusterHealth {
    pub const ALL: [ClusterHealth; 3] = [
        ClusterHealth::Healthy,
        ClusterHealth::Degraded,
        ClusterHealth::Repairing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ClusterHealth::Healthy => "healthy",
            ClusterHealth::Degraded => "degraded",
            ClusterHealth::Repairing => "repairing",
        }
    }
}

/// Why a member is not well.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemberFault {
    /// Its host stopped answering (its VM may be running; nobody can tell).
    HostLost,
    /// Its host is retired or being drained.
    HostLeaving,
    /// The VM is in `error`.
    VmError,
    /// A GPU or NIC it holds is quarantined.
    DeviceQuarantined,
    /// A GPU or NIC it holds is suspect (degraded; still usable).
    DeviceSuspect,
    /// The member is stopped, suspended, shelved or preempted.
    NotRunning,
    /// Being replaced: waiting for room or booting.
    Replacing,
}

impl MemberFault {
    /// Whether `kumo cluster repair` replaces a member for it: the member
    /// cannot come back by itself or by its owner's hand. A suspect device
    /// still works, and a stopped member is its owner's to start.
    pub fn replaceable(self) -> bool {
        matches!(
            self,
            MemberFault::HostLost | MemberFault::VmError | MemberFault::DeviceQuarantined
        )
    }
}

/// One member's trouble.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterProblem {
    pub member: String,
    pub fault: MemberFault,
    /// What, in words (the host, the device, the VM's reason).
    pub detail: String,
}

/// An event of a cluster's life: its health changing, repairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `healthy`, `degraded`, `repairing`, `repair`, `repair-placed`, …
    pub kind: String,
    pub message: String,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterRepair {
    /// The members replaced (placed anew, or waiting for room).
    pub replaced: Vec<String>,
    /// Members with trouble a repair does not mend (suspect devices,
    /// stopped members), each with why.
    pub left: Vec<ClusterProblem>,
    pub cluster: Cluster,
}

impl ClusterCreate {
    /// Member `i` as a VM request.
    pub fn member(&self, i: u32) -> VmCreate {
        VmCreate {
            name: format!("{}-{i}", self.name),
            gpus: self.gpus,
            gpu_model: self.gpu_model.clone(),
            vcpus: self.vcpus,
            memory_gib: self.memory_gib,
            disk_gib: self.disk_gib,
            template: self.template.clone(),
            service_level: self.service_level,
            ssh_keys: self.ssh_keys.clone(),
            networks: self
                .networks
                .iter()
                .map(|s| NetworkRequest {
                    segment: s.clone(),
                    ip: None,
                })
                .collect(),
            volumes: Vec::new(),
            shares: self.shares.clone(),
            on_reclaim: None,
            on_host_loss: None,
            notice_seconds: None,
            // Members are reached through the cluster's own addresses.
            public_ip: false,
            // The cluster waits whole, not its members one by one.
            queue: false,
            reservation: self.reservation.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMember {
    pub name: String,
    pub state: VmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_unit: Option<String>,
    /// The rail of each GPU's NIC, in guest GPU order.
    pub rails: Vec<Option<u32>>,
    /// Its address on the cluster's first segment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub size: u32,
    /// `placed`, `pending` while spot VMs are reclaimed for it, or
    /// `queued` in the fair queue (see `queue`).
    pub state: String,
    pub spec: VmSpec,
    pub members: Vec<ClusterMember>,
    /// An MPI hostfile: one member per line with its GPUs as slots.
    pub hostfile: String,
    pub health: ClusterHealth,
    /// What keeps it from `healthy`, per member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ClusterProblem>,
    /// When its health or what is wrong last changed (an auto-repair
    /// waits its delay from then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_since: Option<DateTime<Utc>>,
    pub auto_repair: bool,
    /// How long it stays degraded before it repairs itself.
    pub repair_delay_seconds: u32,
    #[serde(default)]
    pub single_su: SingleSu,
    /// Members' worth of spare capacity kept in `spare_unit`.
    #[serde(default)]
    pub spares: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_unit: Option<String>,
    /// How many of the spares the unit has room for now (spot VMs on them
    /// counted as gone): fewer than `spares` after a repair used one, or
    /// a host of the unit left service.
    #[serde(default)]
    pub spares_ready: u32,
    /// A `queued` cluster's place in the fair queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<crate::vms::QueueStanding>,
    pub created_at: DateTime<Utc>,
}
